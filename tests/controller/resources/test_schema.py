"""What ProxyPools and Proxies share: the parsing of an object's metadata (``resources.proxy.CustomObject``)
and validation against the CRDs' own schemas (schema.py), as the packaged controller reads them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egress_proxies.resources import pool as pools
from egress_proxies.resources import schema
from egress_proxies.resources.pool import Pool, parse_duration, parse_spec
from egress_proxies.resources.proxy import Proxy
from egress_proxies.resources.schema import PATTERN_HINTS, pool_schema, proxy_schema, validation_errors

ROOT = Path(__file__).resolve().parents[3]


def rules(rule: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, schema) below ``rule``."""
    if isinstance(rule, dict):
        yield path, rule
        for name, sub in (rule.get("properties") or {}).items():
            yield from rules(sub, f"{path}.{name}")
        yield from rules(rule.get("items"), f"{path}[]")


# -- the CRDs, as the controller loads them ------------------------------------------------------

def test_the_packaged_crds_are_the_manifests() -> None:
    """The package reads both CRDs through links beside its modules, which the distribution ships
    (package-data), so an installed controller validates against the manifests' own schemas."""
    assert schema.CRD_PATH.resolve() == ROOT / "controller" / "manifests" / "crd.yaml"
    assert schema.POOL_CRD_PATH.resolve() == ROOT / "controller" / "manifests" / "crd-proxypool.yaml"
    package_data = tomllib.loads((ROOT / "controller" / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["egress_proxies.resources"]
    assert {schema.CRD_PATH.name, schema.POOL_CRD_PATH.name} <= set(package_data)


@pytest.mark.parametrize("crd", [proxy_schema, pool_schema], ids=["proxy", "proxypool"])
def test_every_pattern_a_user_writes_has_a_readable_hint(crd: Any) -> None:
    patterns = {path: rule["pattern"] for path, rule in rules(crd()["properties"]["spec"], "spec") if "pattern" in rule}
    assert patterns
    assert {path: p for path, p in patterns.items() if p not in PATTERN_HINTS} == {}


def test_durations_are_what_the_crd_pattern_admits() -> None:
    spec = pool_schema()["properties"]["spec"]["properties"]
    assert spec["failoverAfter"]["pattern"] == spec["rotation"]["properties"]["maxAge"]["pattern"] == \
        schema.DURATION_PATTERN
    # Go's forms, and what the API server refuses (RE2's [0-9] is ASCII: not an Arabic-Indic 5).
    assert [parse_duration(t) for t in ("6h", "1h30m", "90s", "500ms", "1.5m", "1m5s")] == [21600, 5400, 90, 0.5,
                                                                                             90, 65]
    assert [parse_duration(t) for t in ("\u0665s", "1d", "-1s", "1h 30m")] == [None] * 4


def test_the_crd_defaults_are_the_controllers() -> None:
    """The API server fills in the CRD's defaults; the directory source gets parse_spec's."""
    spec = pool_schema()["properties"]["spec"]["properties"]
    rotation = spec["rotation"]["properties"]
    assert spec["replicas"]["default"] == 0
    assert spec["placement"]["items"]["properties"]["weight"]["default"] == 1
    assert parse_duration(spec["failoverAfter"]["default"]) == pools.DEFAULT_FAILOVER_AFTER
    assert (rotation["maxSurge"]["default"], rotation["maxUnavailable"]["default"], rotation["jitter"]["default"]) == (
        pools.DEFAULT_MAX_SURGE, pools.DEFAULT_MAX_UNAVAILABLE, pools.DEFAULT_JITTER)
    parsed, errors = parse_spec({"placement": [{"provider": "a"}]})
    assert errors == [] and parsed is not None
    assert (parsed.replicas, parsed.placements[0].weight, parsed.failover_after_seconds, parsed.max_surge,
            parsed.max_unavailable, parsed.jitter) == (0, 1, 120.0, 1, 0, 0.1)


# -- a Proxy's messages from the same hints ---------------------------------------------------------

@pytest.mark.parametrize(("change", "expected"), [
    ({"allowedSources": ["10.0.0.0"]}, ("spec.allowedSources[0]: must be a network in CIDR notation with no host "
                                       "bits set, such as 10.0.0.0/8 or 2001:db8::/32 (got '10.0.0.0')")),
    # The pattern admits it; the format check (the modules' strictness) does not.
    ({"allowedDestinations": ["192.168.122.1/24"]}, (
        "spec.allowedDestinations[0]: must be a network in CIDR notation with no host bits set, such as "
        "10.0.0.0/8 or 2001:db8::/32 (got '192.168.122.1/24')")),
    ({"probe": {"httpUrl": "https://example.com/"}}, ("spec.probe.httpUrl: must be a plain-HTTP URL (http://host/path) "
                                                      "(got 'https://example.com/')")),
    ({"provider": ""}, "spec.provider: must be a non-empty string (got '')"),
    ({"provider": None}, "spec.provider: must be a non-empty string (quote it in YAML) (got None)"),
    ({"port": 22}, "spec.port: must be an integer 1024-65535 (got 22)"),  # issue 38: 22 is sshd
])
def test_a_proxy_pattern_or_range_violation_says_what_is_allowed(change: dict[str, Any], expected: str) -> None:
    proxy = Proxy("ns", "p", "uid", {"provider": "a", **change})
    assert validation_errors(proxy) == [expected]


def test_a_missing_required_field_says_what_it_must_be() -> None:
    assert validation_errors(Proxy("ns", "p", "uid", {"port": 3128})) == [
        "spec.provider: is required; it must be a non-empty string"]


@pytest.mark.parametrize(("namespace", "name", "fields"), [
    ("crawlers", "eu-1", []),
    ("a" * 63, "eu.west-1." + "b" * 200, []),  # the longest label; a subdomain with dots
    ("../../x", "eu-1", ["metadata.namespace"]),
    ("crawlers", "../evil", ["metadata.name"]),
    ("a" * 64, "eu-1", ["metadata.namespace"]),
    ("Crawlers", "eu-1", ["metadata.namespace"]),
    ("crawl.ers", "eu-1", ["metadata.namespace"]),  # a label has no dots
    ("crawlers-", "eu-1", ["metadata.namespace"]),
    ("crawlers", "x" * 254, ["metadata.name"]),
    ("crawlers", "eu_1", ["metadata.name"]),
    ("crawlers", "eu..1", ["metadata.name"]),
    ("crawlers", "eu-1\n", ["metadata.name"]),
    ("", "", ["metadata.namespace", "metadata.name"]),
])
def test_namespace_and_name_are_validated_as_kubernetes_does(namespace: str, name: str, fields: list[str]) -> None:
    errors = validation_errors(Proxy(namespace, name, "uid", {"provider": "a"}))
    assert [error.split(":")[0] for error in errors] == fields


def test_a_bad_namespace_or_name_says_what_kubernetes_allows() -> None:
    assert validation_errors(Proxy("../../x", "../evil", "uid", {"provider": "a"})) == [
        ("metadata.namespace: must be a DNS-1123 label, as Kubernetes requires of a namespace: at most 63 lowercase "
        "letters, digits and '-', starting and ending with a letter or digit (got '../../x')"),
        ("metadata.name: must be a DNS-1123 subdomain, as Kubernetes requires of a name: at most 253 lowercase "
        "letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit "
        "(got '../evil')")]


# -- the shared metadata parsing -------------------------------------------------------------------

OBJECT: dict[str, Any] = {
    "metadata": {"name": "eu", "namespace": "crawlers", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                 "annotations": {"a": "b"}, "labels": {"team": "crawl"}, "finalizers": ["x/y"],
                 "deletionTimestamp": "2026-01-02T00:00:00Z", "creationTimestamp": "2026-01-01T00:00:00Z",
                 "ownerReferences": [{"kind": "ProxyPool", "uid": "p-1", "controller": True}, "junk"]},
    "spec": {"replicas": 2}, "status": {"phase": "Ready"}}


@pytest.mark.parametrize("kind", [Proxy, Pool])
def test_both_kinds_read_metadata_alike(kind: type[Proxy] | type[Pool]) -> None:
    parsed = kind.from_object(OBJECT)
    assert (parsed.key, parsed.uid, parsed.resource_version, parsed.generation, parsed.finalizers,
            parsed.annotations, parsed.deletion_timestamp, parsed.creation_timestamp, parsed.status, parsed.defect) == (
        "crawlers/eu", "u-1", "42", 3, ["x/y"], {"a": "b"}, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z",
        {"phase": "Ready"}, None)
    assert parsed.deleting and parsed.spec == {"replicas": 2}
    parsed.raw = OBJECT
    assert parsed.labels == {"team": "crawl"}
    assert parsed.owner_references == [{"kind": "ProxyPool", "uid": "p-1", "controller": True}]


@pytest.mark.parametrize(("metadata", "defect"), [
    ({"generation": "three"}, "metadata.generation: must be an integer, not 'three'"),
    ({"finalizers": "x/y"}, "metadata.finalizers: must be a list of strings"),
    ({"annotations": {"replicas": 3}}, "metadata.annotations: every value must be a string (quote it)"),
    ({"annotations": ["a"]}, "metadata.annotations: must be an object, not list"),
])
@pytest.mark.parametrize("kind", [Proxy, Pool])
def test_malformed_metadata_is_a_defect_of_either_kind(kind: type[Proxy] | type[Pool], metadata: dict[str, Any],
                                                       defect: str) -> None:
    parsed = kind.from_object({"metadata": {"name": "eu", **metadata}, "spec": {}})
    assert parsed.defect == defect and parsed.name == "eu"


def test_only_a_proxy_requires_its_spec_to_be_an_object() -> None:
    """A pool's spec is kept as found: parse_spec names each field that is wrong."""
    assert Proxy.from_object({"spec": ["a"]}).defect == "spec: must be an object, not list"
    pool = Pool.from_object({"spec": ["a"]})
    assert (pool.spec, pool.defect) == (["a"], None)
    assert parse_spec(pool.spec)[1][0].startswith("spec: must be an object {")
    assert pool.raw == {"spec": ["a"]}  # a write sends back what it does not change


@pytest.mark.parametrize("crd", [proxy_schema, pool_schema], ids=["Proxy", "ProxyPool"])
def test_no_crd_constrains_metadata_beyond_what_the_memo_digests(crd: Any) -> None:
    """ValidationMemo digests only a Proxy's name and generateName of its metadata: a structural
    schema may constrain nothing else there, and these CRDs constrain nothing at all."""
    metadata = crd()["properties"].get("metadata", {})
    assert set(metadata) <= {"type"} and set(metadata.get("properties", {})) <= {"name", "generateName"}


def proxy_object(spec: dict[str, Any], **metadata: Any) -> Proxy:
    obj = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "spec": spec,
           "metadata": {"name": "eu-1", "namespace": "crawlers", "uid": "u-1", **metadata}}
    proxy = Proxy.from_object(obj)
    proxy.raw = obj
    return proxy


def test_the_memo_validates_again_when_the_spec_changes_not_when_only_metadata_moves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    validated: list[dict[str, Any]] = []
    real = schema.validation_errors

    def counting(proxy: Proxy) -> list[str]:
        validated.append(proxy.spec)
        return real(proxy)

    monkeypatch.setattr(schema, "validation_errors", counting)
    memo = schema.ValidationMemo()
    good = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
    assert memo.errors(proxy_object(good, resourceVersion="1")) == []
    # A status write, a label, managedFields: the resourceVersion and metadata move, the result cannot.
    assert memo.errors(proxy_object(good, resourceVersion="2", labels={"team": "a"},
                                    managedFields=[{"manager": "kubectl"}])) == []
    assert len(validated) == 1
    (error,) = memo.errors(proxy_object({**good, "port": "abc"}, resourceVersion="3"))
    assert error.startswith("spec.port:") and len(validated) == 2
