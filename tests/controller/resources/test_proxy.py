"""resources/proxy.py: the Proxy as the controller sees it and the names derived from it -- the
spec hash (what replaces an instance), the instance name (deterministic, valid on every
provider), tags, replacement counts, and reading a Proxy object that may be malformed."""

from __future__ import annotations

import re
from typing import Any

import pytest

from egress_proxies.resources.proxy import (
    OWNER_TAG,
    PROXY_TAG,
    REPLACEMENTS_ANNOTATION,
    SKIP_CLEANUP_ANNOTATION,
    SPEC_FIELDS,
    SPEC_HASH_TAG,
    UID_TAG,
    Proxy,
    instance_name,
    instance_tags,
    replacement_count,
    spec_hash,
)

SPEC: dict[str, Any] = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
# A valid libvirt domain, GCE instance and Pod name alike (RFC 1035 label).
NAME = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


def proxy(name: str = "eu-1", namespace: str = "crawlers", uid: str = "uid-1", **spec: Any) -> Proxy:
    return Proxy(namespace=namespace, name=name, uid=uid, spec={**SPEC, **spec})


def test_the_spec_hash_is_16_hex_and_stable_across_key_order() -> None:
    reordered = dict(reversed(list({**SPEC, "port": 8080}.items())))
    assert spec_hash({**SPEC, "port": 8080}) == spec_hash(reordered)
    assert re.fullmatch(r"[0-9a-f]{16}", spec_hash(SPEC))


@pytest.mark.parametrize(("field", "default"), [("port", 3128), ("cloudInitEncoding", "plain"), ("auth", "basic")])
def test_a_default_written_out_hashes_like_the_default_left_out(field: str, default: Any) -> None:
    assert spec_hash({**SPEC, field: default}) == spec_hash(SPEC) == spec_hash({**SPEC, field: None})


@pytest.mark.parametrize(("field", "value"), [
    ("provider", "other"), ("location", "h2"), ("machineType", "e2-small"), ("image", "debian-12"), ("port", 8080),
    ("cloudInit", "#cloud-config\npackages: [squid]\n"), ("cloudInitEncoding", "base64"), ("auth", "none"),
    ("allowedSources", ["10.0.0.0/8"]),
])
def test_every_field_that_shapes_the_instance_changes_the_hash(field: str, value: Any) -> None:
    assert field in SPEC_FIELDS
    assert spec_hash({**SPEC, field: value}) != spec_hash(SPEC)


def test_fields_that_do_not_shape_the_instance_leave_the_hash_alone() -> None:
    assert spec_hash({**SPEC, "probe": {"httpUrl": "http://example.test/"}, "unknown": 1}) == spec_hash(SPEC)


def test_the_instance_name_is_deterministic_readable_and_valid() -> None:
    name = instance_name(proxy(), "hash1")
    assert name == instance_name(proxy(), "hash1")
    assert name.startswith("p-crawlers-eu-1-") and NAME.match(name)


@pytest.mark.parametrize(("other", "hash_of_spec", "replacement"), [
    (proxy(), "hash2", 0),  # a new spec: make-before-break needs a second name
    (proxy(), "hash1", 1),  # a replacement of a dead instance
    (proxy(uid="uid-2"), "hash1", 0),  # the same name made again is another Proxy
])
def test_what_needs_a_new_instance_gets_a_new_name(other: Proxy, hash_of_spec: str, replacement: int) -> None:
    assert instance_name(other, hash_of_spec, replacement) != instance_name(proxy(), "hash1")


@pytest.mark.parametrize(("namespace", "name"), [
    ("a" * 63, "b" * 253), ("Crawlers", "EU_1.example"), ("-", "--"), ("9ns", "9-name"), ("x", "y-" * 40),
])
def test_any_proxy_name_gives_a_valid_instance_name_of_at_most_63(namespace: str, name: str) -> None:
    made = instance_name(proxy(name=name, namespace=namespace), "hash1", 3)
    assert len(made) <= 63 and NAME.match(made), made


def test_long_names_that_differ_only_at_the_end_still_differ() -> None:
    first = instance_name(proxy(name="a" * 80 + "1", uid="uid-1"), "hash1")
    second = instance_name(proxy(name="a" * 80 + "2", uid="uid-2"), "hash1")
    assert first != second and len(first) == len(second) == 63


def test_instance_tags_name_the_owner_the_proxy_its_uid_and_spec() -> None:
    assert instance_tags("owner-1", proxy(), "hash1") == {OWNER_TAG: "owner-1", PROXY_TAG: "crawlers/eu-1",
                                                          UID_TAG: "uid-1", SPEC_HASH_TAG: "hash1"}


@pytest.mark.parametrize(("recorded", "count"), [
    ("hash1:2", 2), ("hash0:2", 0), ("hash1:x", 0), ("hash1", 0), (None, 0),
])
def test_replacements_count_only_for_the_spec_they_were_recorded_for(recorded: str | None, count: int) -> None:
    annotations = {} if recorded is None else {REPLACEMENTS_ANNOTATION: recorded}
    assert replacement_count(annotations, "hash1") == count


@pytest.mark.parametrize(("value", "skip"), [("true", True), ("True", True), ("false", False), ("yes", False)])
def test_skip_cleanup_is_the_annotation_true_in_any_case(value: str, skip: bool) -> None:
    assert Proxy("ns", "p", "u", {}, annotations={SKIP_CLEANUP_ANNOTATION: value}).skip_cleanup is skip


def test_provider_and_port_read_from_the_spec_with_defaults() -> None:
    assert (proxy().provider, proxy().port) == ("home-kvm", 3128)
    assert Proxy("ns", "p", "u", {"port": "8080"}).port == 8080 and Proxy("ns", "p", "u", {}).provider == ""


def test_a_proxy_object_is_read_with_every_field() -> None:
    obj: dict[str, Any] = {"metadata": {
        "name": "eu-1", "namespace": "crawlers", "uid": "u", "generation": 4, "resourceVersion": "17",
        "finalizers": ["crawl.example.com/cleanup"], "annotations": {"a": "b"}, "labels": {"team": "x"},
        "ownerReferences": [{"kind": "ProxyPool", "name": "eu"}, "junk"],
        "deletionTimestamp": "2026-01-02T00:00:00Z", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": SPEC, "status": {"phase": "Ready"}}
    read = Proxy.from_object(obj)
    read.raw = obj  # as a source that keeps the object sets it
    assert (read.key, read.uid, read.generation, read.resource_version) == ("crawlers/eu-1", "u", 4, "17")
    assert read.deleting and read.finalizers == ["crawl.example.com/cleanup"] and read.defect is None
    assert read.labels == {"team": "x"} and read.owner_references == [{"kind": "ProxyPool", "name": "eu"}]
    assert read.annotations == {"a": "b"} and read.spec == SPEC and read.status == {"phase": "Ready"}


@pytest.mark.parametrize(("obj", "defect"), [
    ("not an object", "the object: must be an object, not str"),
    ({"spec": ["provider"]}, "spec: must be an object, not list"),
    ({"spec": SPEC, "status": "Ready"}, "status: must be an object, not str"),
    ({"metadata": {"generation": True}, "spec": SPEC}, "metadata.generation: must be an integer"),
    ({"metadata": {"finalizers": "x"}, "spec": SPEC}, "metadata.finalizers: must be a list of strings"),
    ({"metadata": {"annotations": {"a": 1}}, "spec": SPEC}, "metadata.annotations: every value must be a string"),
])
def test_a_malformed_object_is_read_with_its_defect_never_raised(obj: Any, defect: str) -> None:
    read = Proxy.from_object(obj)
    assert read.defect is not None and defect in read.defect
