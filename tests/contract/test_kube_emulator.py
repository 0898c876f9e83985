# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Contract tests: each Kubernetes API semantic the controller relies on, proved against the
emulator through the official ``kubernetes`` client, so tests built on the emulator exercise what
a real API server would do.  Every watch carries ``timeout_seconds``; every server is stopped by
its fixture."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from support.kube.emulator import KubeEmulator
from support.kube.resources import ResourceType, proxy_crd
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

GROUP, VERSION, PLURAL, NS = "crawl.example.com", "v1alpha1", "proxies", "crawlers"
FINALIZER = "crawl.example.com/cleanup"
# What controller/manifests/crd.yaml's schema defaults in every Proxy's spec.
SPEC_DEFAULTS = {"port": 3128, "cloudInitEncoding": "plain", "auth": "basic"}
Obj = dict[str, Any]


@pytest.fixture(autouse=True)
def namespace(kube: KubeEmulator) -> None:
    """The namespace every test here works in (objects in a missing one are refused)."""
    kube.create_namespace(NS)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


class Proxies:
    """The CustomObjectsApi calls for ``Proxy`` objects in one namespace, typed as dicts."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = client.CustomObjectsApi(api)

    def create(self, name: str, spec: Obj | None = None, **meta: Any) -> Obj:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                "metadata": {"name": name, **meta}, "spec": spec or {"provider": "home-kvm"}}
        return cast(Obj, self.api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body))

    def get(self, name: str) -> Obj:
        return cast(Obj, self.api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name))

    def replace(self, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        return cast(Obj, self.api.replace_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, name, obj))

    def replace_status(self, obj: Obj) -> Obj:
        name = obj["metadata"]["name"]
        return cast(Obj, self.api.replace_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name, obj))

    def patch(self, name: str, body: Any, content_type: str | None = None) -> Obj:
        return cast(Obj, self.api.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, name, body, _content_type=content_type))

    def patch_status(self, name: str, body: Any, content_type: str | None = None) -> Obj:
        return cast(Obj, self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name, body, _content_type=content_type))

    def delete(self, name: str) -> Obj:
        return cast(Obj, self.api.delete_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, name))

    def list_objects(self, **kwargs: Any) -> Obj:
        return cast(Obj, self.api.list_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, **kwargs))

    def watch(self, timeout: int, **kwargs: Any) -> list[tuple[str, Obj]]:
        """All events of one watch that the server ends after ``timeout`` seconds."""
        stream = watch_stream(new_watch(), self.api.list_namespaced_custom_object, GROUP,
                              VERSION, NS, PLURAL, timeout_seconds=timeout, **kwargs)
        return [(event["type"], event["raw_object"]) for event in stream]


@pytest.fixture
def proxies(api: client.ApiClient) -> Proxies:
    return Proxies(api)


# kubernetes.watch ships without annotations: these two give it types for the tests.
def new_watch() -> watch.Watch:
    return watch.Watch()  # type: ignore[no-untyped-call]


def watch_stream(stream: watch.Watch, func: Any, *args: Any, **kwargs: Any) -> Iterator[Obj]:
    events = stream.stream(func, *args, **kwargs)  # type: ignore[no-untyped-call]
    return cast(Iterator[Obj], events)


def status_of(exc: ApiException) -> Obj:
    """The Status object the server sent, as the client exposes it."""
    return cast(Obj, json.loads(exc.body or "{}"))


def summary(events: list[tuple[str, Obj]]) -> list[tuple[str, str]]:
    return [(etype, obj["metadata"]["name"]) for etype, obj in events]


def rv(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


def pod(name: str, **labels: str) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels=labels or None),
                        spec=client.V1PodSpec(containers=[client.V1Container(name="squid",
                                                                             image="squid")]))


# --- create ----------------------------------------------------------------------------------


def test_create_answers_201_with_server_fields(api: client.ApiClient) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": "eu-1"}, "spec": {"provider": "home-kvm"},
            "status": {"phase": "Ready"}}
    data, code, _ = client.CustomObjectsApi(api).create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, NS, PLURAL, body)
    created = cast(Obj, data)
    meta = created["metadata"]

    assert code == 201
    assert meta["namespace"] == NS
    assert len(meta["uid"]) == 36
    assert meta["resourceVersion"].isdigit()
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    assert "status" not in created  # a status subresource kind drops status on create


def test_pod_create_parses_into_the_client_model(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod(NS, pod("squid-1"))

    assert created.metadata is not None
    assert created.status is not None
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.status.phase == "Pending"


def test_generate_name_appends_a_suffix(proxies: Proxies) -> None:
    first = proxies.create("", generateName="eu-")
    second = proxies.create("", generateName="eu-")

    assert first["metadata"]["name"].startswith("eu-")
    assert len(first["metadata"]["name"]) == len("eu-") + 5
    assert first["metadata"]["name"] != second["metadata"]["name"]


def test_duplicate_create_is_409_already_exists(proxies: Proxies) -> None:
    proxies.create("eu-1")

    with pytest.raises(ApiException) as caught:
        proxies.create("eu-1")

    assert caught.value.status == 409
    status = status_of(caught.value)
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status", "Failure", "AlreadyExists", 409)


def test_invalid_name_is_422(proxies: Proxies) -> None:
    with pytest.raises(ApiException) as caught:
        proxies.create("Crawlers/EU")

    assert caught.value.status == 422
    assert status_of(caught.value)["reason"] == "Invalid"


# --- get, list, replace ----------------------------------------------------------------------


def test_get_missing_is_404_not_found_status(proxies: Proxies) -> None:
    with pytest.raises(ApiException) as caught:
        proxies.get("nope")

    assert caught.value.status == 404
    assert status_of(caught.value)["reason"] == "NotFound"


def test_list_carries_the_current_resource_version(kube: KubeEmulator, proxies: Proxies,
                                                   core: client.CoreV1Api) -> None:
    kube.create_namespace("other")
    proxies.create("a")
    last = proxies.create("b")
    core.create_namespaced_pod("other", pod("p"))

    listed = proxies.list_objects()
    everywhere = core.list_pod_for_all_namespaces()

    assert [item["metadata"]["name"] for item in listed["items"]] == ["a", "b"]
    assert int(listed["metadata"]["resourceVersion"]) > rv(last)  # the pod came later
    assert int(listed["metadata"]["resourceVersion"]) == kube.resource_version
    assert everywhere.metadata is not None
    assert [p.metadata.namespace for p in everywhere.items if p.metadata] == ["other"]


def test_resource_version_increases_and_a_stale_put_is_409_conflict(proxies: Proxies) -> None:
    created = proxies.create("eu-1")
    other = proxies.create("eu-2")
    updated = proxies.replace({**created, "spec": {"provider": "gcp-eu"}})

    assert rv(created) < rv(other) < rv(updated)
    with pytest.raises(ApiException) as caught:
        proxies.replace({**created, "spec": {"provider": "cluster"}})  # still the old rv
    assert caught.value.status == 409
    assert status_of(caught.value)["reason"] == "Conflict"
    assert proxies.get("eu-1")["spec"] == {"provider": "gcp-eu", **SPEC_DEFAULTS}


def test_put_of_a_pod_without_resource_version_is_unconditional(core: client.CoreV1Api) -> None:
    # pkg/registry/core/pod/strategy.go: podStrategy.AllowUnconditionalUpdate() is true.
    created = core.create_namespaced_pod(NS, pod("squid-1", tier="a"))
    assert created.metadata is not None
    created.metadata.resource_version = None
    created.metadata.labels = {"tier": "b"}

    replaced = core.replace_namespaced_pod("squid-1", NS, created)

    assert replaced.metadata is not None
    assert replaced.metadata.labels == {"tier": "b"}
    assert replaced.metadata.uid == created.metadata.uid


@pytest.mark.parametrize("status", [False, True])
def test_put_of_a_custom_resource_without_resource_version_is_422(proxies: Proxies, status: bool) -> None:
    # k8s.io/apiserver/pkg/registry/generic/registry/store.go (Update): a strategy that does not
    # AllowUnconditionalUpdate (customResourceStrategy, main and status) answers
    # NewInvalid(<resource>.<group>, name, metadata.resourceVersion "must be specified for an
    # update") to an update whose resourceVersion is 0, i.e. absent.
    created = proxies.create("eu-1", labels={"tier": "a"})
    meta = {k: v for k, v in created["metadata"].items() if k != "resourceVersion"}
    body = {**created, "metadata": {**meta, "labels": {"tier": "b"}}, "status": {"phase": "Ready"}}

    with pytest.raises(ApiException) as caught:
        (proxies.replace_status if status else proxies.replace)(body)

    assert caught.value.status == 422
    answer = status_of(caught.value)
    assert answer["reason"] == "Invalid"
    assert answer["message"] == ('proxies.crawl.example.com "eu-1" is invalid: metadata.resourceVersion: '
                                 "Invalid value: 0x0: must be specified for an update")
    assert answer["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "metadata.resourceVersion",
                                            "message": "Invalid value: 0x0: must be specified for an update"}]
    assert proxies.get("eu-1") == created


def test_status_subresource_is_isolated_both_ways(proxies: Proxies) -> None:
    created = proxies.create("eu-1")

    with_status = proxies.replace_status({**created, "spec": {"provider": "ignored"},
                                          "metadata": {**created["metadata"],
                                                       "labels": {"ignored": "yes"}},
                                          "status": {"phase": "Ready"}})
    assert with_status["status"] == {"phase": "Ready"}
    assert with_status["spec"] == {"provider": "home-kvm", **SPEC_DEFAULTS}
    assert "labels" not in with_status["metadata"]

    main = proxies.replace({**with_status, "spec": {"provider": "gcp-eu"},
                            "status": {"phase": "Failed"}})
    assert main["spec"] == {"provider": "gcp-eu", **SPEC_DEFAULTS}
    assert main["status"] == {"phase": "Ready"}


def test_generation_counts_spec_changes_only(proxies: Proxies) -> None:
    created = proxies.create("eu-1")

    labelled = proxies.patch("eu-1", {"metadata": {"labels": {"a": "b"}}})
    with_status = proxies.patch_status("eu-1", {"status": {"observedGeneration": 1}})
    respecced = proxies.patch("eu-1", {"spec": {"port": 8080}})
    unchanged = proxies.patch("eu-1", {"spec": {"port": 8080}})

    assert [o["metadata"]["generation"] for o in (created, labelled, with_status, respecced)] == [
        1, 1, 1, 2]
    assert rv(created) < rv(labelled) < rv(with_status)
    assert unchanged == respecced  # a no-op write keeps the resourceVersion


# --- patch -----------------------------------------------------------------------------------


def test_merge_patch_merges_maps_and_null_deletes(proxies: Proxies) -> None:
    proxies.create("eu-1", spec={"provider": "home-kvm", "location": "beelink", "port": 3128},
                   annotations={"keep": "1", "drop": "2"})

    patched = proxies.patch("eu-1", {"metadata": {"annotations": {"drop": None, "new": "3"}},
                                     "spec": {"location": None, "port": 8080}})

    assert patched["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert patched["spec"] == {"provider": "home-kvm", "port": 8080, "cloudInitEncoding": "plain", "auth": "basic"}


def test_strategic_merge_patch_on_a_core_kind_applies_as_merge(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("squid-1", app="squid", tier="edge"))

    # A dict body on a core kind is sent as application/strategic-merge-patch+json.
    patched = core.patch_namespaced_pod("squid-1", NS, {"metadata": {"labels": {"tier": None,
                                                                               "zone": "b"}}})

    assert patched.metadata is not None
    assert patched.metadata.labels == {"app": "squid", "zone": "b"}


def test_json_patch_operations_and_failed_test_is_422(proxies: Proxies) -> None:
    proxies.create("eu-1", spec={"provider": "home-kvm", "port": 3128, "location": "beelink"},
                   finalizers=["a"])
    ops = [{"op": "test", "path": "/spec/port", "value": 3128},
           {"op": "replace", "path": "/spec/port", "value": 8080},
           {"op": "add", "path": "/metadata/finalizers/-", "value": "b"},
           {"op": "add", "path": "/metadata/labels", "value": {"example.com/tier": "x"}},
           {"op": "remove", "path": "/spec/location"}]

    patched = proxies.patch("eu-1", ops, "application/json-patch+json")
    assert patched["spec"] == {"provider": "home-kvm", "port": 8080, "cloudInitEncoding": "plain", "auth": "basic"}
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert patched["metadata"]["labels"] == {"example.com/tier": "x"}

    escaped = proxies.patch("eu-1", [{"op": "remove", "path": "/metadata/labels/example.com~1tier"}],
                            "application/json-patch+json")
    assert escaped["metadata"]["labels"] == {}

    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", [{"op": "test", "path": "/spec/port", "value": 3128},
                               {"op": "replace", "path": "/spec/port", "value": 1}],
                      "application/json-patch+json")
    assert caught.value.status == 422
    assert status_of(caught.value)["reason"] == "Invalid"
    assert proxies.get("eu-1")["spec"]["port"] == 8080


def test_patch_on_status_changes_only_status(proxies: Proxies) -> None:
    proxies.create("eu-1")

    merged = proxies.patch_status("eu-1", {"spec": {"provider": "x"},
                                           "status": {"phase": "Provisioning"}})
    jsoned = proxies.patch_status("eu-1", [{"op": "add", "path": "/status/ip",
                                            "value": "192.0.2.10"}],
                                  "application/json-patch+json")
    main = proxies.patch("eu-1", {"status": {"phase": "Failed"}})

    assert merged["spec"] == {"provider": "home-kvm", **SPEC_DEFAULTS}
    assert jsoned["status"] == {"phase": "Provisioning", "ip": "192.0.2.10"}
    assert main["status"] == jsoned["status"]
    assert main["metadata"]["resourceVersion"] == jsoned["metadata"]["resourceVersion"]


def test_patch_with_stale_resource_version_is_409(proxies: Proxies) -> None:
    created = proxies.create("eu-1")
    proxies.patch("eu-1", {"spec": {"port": 8081}})

    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", {"metadata": {"resourceVersion": created["metadata"][
            "resourceVersion"]}, "spec": {"port": 8082}})

    assert caught.value.status == 409


# --- delete and finalizers -------------------------------------------------------------------


def test_delete_without_finalizers_is_immediate(proxies: Proxies) -> None:
    created = proxies.create("eu-1")

    proxies.delete("eu-1")

    with pytest.raises(ApiException) as caught:
        proxies.get("eu-1")
    assert caught.value.status == 404
    events = proxies.watch(1, resource_version=created["metadata"]["resourceVersion"])
    assert summary(events) == [("DELETED", "eu-1")]
    with pytest.raises(ApiException) as again:
        proxies.delete("eu-1")
    assert again.value.status == 404


def test_finalizers_hold_the_object_until_the_last_is_removed(kube: KubeEmulator,
                                                               proxies: Proxies) -> None:
    created = proxies.create("eu-1", finalizers=[FINALIZER, "other/x"])
    since = created["metadata"]["resourceVersion"]

    marked = proxies.delete("eu-1")
    meta = marked["metadata"]
    assert meta["deletionTimestamp"].endswith("Z")
    assert meta["deletionGracePeriodSeconds"] == 0
    assert meta["generation"] == 2  # the real server bumps it when deletionTimestamp is set
    assert proxies.get("eu-1")["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
    assert proxies.delete("eu-1") == marked  # deleting again changes nothing

    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", {"metadata": {"finalizers": [FINALIZER, "other/x", "late/y"]}})
    assert caught.value.status == 422

    proxies.patch("eu-1", {"metadata": {"finalizers": ["other/x"]}})
    assert proxies.get("eu-1")["metadata"]["finalizers"] == ["other/x"]
    proxies.patch("eu-1", [{"op": "remove", "path": "/metadata/finalizers"}],
                  "application/json-patch+json")

    with pytest.raises(ApiException) as gone:
        proxies.get("eu-1")
    assert gone.value.status == 404
    assert kube.get_object("proxies.crawl.example.com", NS, "eu-1") is None
    events = proxies.watch(1, resource_version=since)
    assert [etype for etype, _ in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert "deletionTimestamp" in events[0][1]["metadata"]


def test_secret_delete_answers_a_success_status(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="key"),
                                                      string_data={"id": "x"}))

    # The client declares ``object`` here: a Status arrives as a dict.
    answer = cast(Obj, core.delete_namespaced_secret("key", NS))

    assert answer["status"] == "Success"
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_secret("key", NS)
    assert caught.value.status == 404


# --- watch -----------------------------------------------------------------------------------


def test_watch_sees_added_modified_deleted_live(kube: KubeEmulator, proxies: Proxies) -> None:
    events: list[tuple[str, Obj]] = []

    def consume() -> None:
        stream = new_watch()
        for event in watch_stream(stream, proxies.api.list_namespaced_custom_object, GROUP,
                                  VERSION, NS, PLURAL, timeout_seconds=5):
            events.append((event["type"], event["raw_object"]))
            if event["type"] == "DELETED":
                stream.stop()  # type: ignore[no-untyped-call]

    watcher = threading.Thread(target=consume)
    watcher.start()
    kube.wait_for_watchers(1)
    proxies.create("eu-1")
    proxies.patch("eu-1", {"spec": {"port": 8081}})
    proxies.delete("eu-1")
    watcher.join(timeout=10)

    assert not watcher.is_alive()
    assert summary(events) == [("ADDED", "eu-1"), ("MODIFIED", "eu-1"), ("DELETED", "eu-1")]
    assert [rv(obj) for _, obj in events] == sorted(rv(obj) for _, obj in events)


def test_watch_without_resource_version_starts_with_current_state(proxies: Proxies) -> None:
    proxies.create("eu-1")
    proxies.create("eu-2")

    assert summary(proxies.watch(1)) == [("ADDED", "eu-1"), ("ADDED", "eu-2")]


def test_watch_resumes_after_a_resource_version(proxies: Proxies) -> None:
    proxies.create("eu-1")
    checkpoint = proxies.list_objects()["metadata"]["resourceVersion"]
    proxies.patch("eu-1", {"spec": {"port": 8081}})
    proxies.create("eu-2")

    events = proxies.watch(1, resource_version=checkpoint)

    assert summary(events) == [("MODIFIED", "eu-1"), ("ADDED", "eu-2")]
    assert all(rv(obj) > int(checkpoint) for _, obj in events)


def test_watch_from_a_compacted_version_is_410_expired(kube: KubeEmulator,
                                                       proxies: Proxies) -> None:
    created = proxies.create("eu-1")
    proxies.patch("eu-1", {"spec": {"port": 8081}})
    kube.compact()

    # The server sends an ERROR event carrying a 410 Status; Watch.stream raises it.
    with pytest.raises(ApiException) as caught:
        proxies.watch(1, resource_version=created["metadata"]["resourceVersion"])
    assert caught.value.status == 410
    assert str(caught.value.reason).startswith("Expired: too old resource version")

    # Resuming from a version the history still covers works after compaction.
    latest = proxies.get("eu-1")["metadata"]["resourceVersion"]
    proxies.patch("eu-1", {"spec": {"port": 8082}})
    assert summary(proxies.watch(1, resource_version=latest)) == [("MODIFIED", "eu-1")]


def test_bounded_history_expires_old_versions() -> None:
    with KubeEmulator(history_limit=2, namespaces=[NS], crds=[proxy_crd()]) as kube, client.ApiClient(
            client.Configuration(host=kube.url)) as api:
        proxies = Proxies(api)
        first = proxies.create("a")
        for name in ("b", "c", "d"):
            proxies.create(name)

        with pytest.raises(ApiException) as caught:
            proxies.watch(1, resource_version=first["metadata"]["resourceVersion"])
        assert caught.value.status == 410
        recent = proxies.get("c")["metadata"]["resourceVersion"]
        assert summary(proxies.watch(1, resource_version=recent)) == [("ADDED", "d")]


def test_watch_ends_after_timeout_seconds(proxies: Proxies) -> None:
    started = time.monotonic()

    events = proxies.watch(1, resource_version=proxies.list_objects()["metadata"]["resourceVersion"])

    elapsed = time.monotonic() - started
    assert events == []
    assert 0.9 <= elapsed < 2.5


def test_stop_ends_open_watches(kube: KubeEmulator, proxies: Proxies) -> None:
    done = threading.Event()

    def consume() -> None:
        try:
            proxies.watch(20)
        except Exception:  # noqa: BLE001 - a closed connection may surface as any client error
            pass
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    kube.wait_for_watchers(1)
    kube.stop()

    assert done.wait(timeout=3)


# --- selectors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=edge", ["a", "b"]),
        ("tier==edge,zone=x", ["a"]),
        ("tier!=edge", ["c", "d"]),
        ("zone in (x, y)", ["a", "c"]),
        ("zone notin (x)", ["b", "c", "d"]),
        ("zone", ["a", "c"]),
        ("!zone", ["b", "d"]),
        ("tier in (edge,core),!zone", ["b"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors_filter_lists(proxies: Proxies, selector: str,
                                      expected: list[str]) -> None:
    proxies.create("a", labels={"tier": "edge", "zone": "x"})
    proxies.create("b", labels={"tier": "edge"})
    proxies.create("c", labels={"tier": "core", "zone": "y"})
    proxies.create("d")

    listed = proxies.list_objects(label_selector=selector)

    assert [item["metadata"]["name"] for item in listed["items"]] == expected


def test_invalid_label_selector_is_400(proxies: Proxies) -> None:
    with pytest.raises(ApiException) as caught:
        proxies.list_objects(label_selector="tier in edge")

    assert caught.value.status == 400


def test_field_selector_by_name(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("a"))
    core.create_namespaced_pod(NS, pod("b"))

    listed = core.list_namespaced_pod(NS, field_selector="metadata.name=b")

    assert [p.metadata.name for p in listed.items if p.metadata] == ["b"]


def test_label_selectors_filter_watches(proxies: Proxies) -> None:
    start = proxies.list_objects()["metadata"]["resourceVersion"]
    proxies.create("a", labels={"owner": "us"})
    proxies.create("b", labels={"owner": "them"})
    proxies.patch("b", {"metadata": {"labels": {"owner": "us"}}})  # enters the selection
    proxies.patch("a", {"metadata": {"labels": {"owner": None}}})  # leaves it
    proxies.patch("a", {"spec": {"port": 8081}})  # outside the selection: not seen

    events = proxies.watch(1, resource_version=start, label_selector="owner=us")

    assert summary(events) == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]


# --- paged lists -----------------------------------------------------------------------------
# "Retrieving large results sets in chunks" (https://kubernetes.io/docs/reference/using-api/
# api-concepts/#retrieving-large-results-sets-in-chunks) and ListOptions' limit/continue: at most
# ``limit`` items and a ``continue`` token while there is more; every chunk of one list shows the
# objects as they were at its first; a token expires after a short time (etcd compaction) and is
# then answered 410 Gone, with a token for the rest of the list as it is now
# (apiserver/pkg/storage/etcd3/errors.go, storage/continue.go).


def pod_list(core: client.CoreV1Api, **options: Any) -> Obj:
    """One list request for Pods in NS, as the JSON the server sent."""
    response: Any = core.list_namespaced_pod(NS, _preload_content=False, **options)  # urllib3's, not a model
    return cast(Obj, json.loads(response.data))


def pod_pages(core: client.CoreV1Api, limit: int, first: str | None = None, **options: Any) -> list[Obj]:
    """Every page of a list with ``limit``, from its first page or from the token ``first``."""
    pages: list[Obj] = []
    token = first
    while True:
        page = pod_list(core, limit=limit, **({"_continue": token} if token else {}), **options)
        pages.append(page)
        token = page["metadata"].get("continue")
        if not token:
            return pages


def names_of(page: Obj) -> list[str]:
    return [item["metadata"]["name"] for item in page["items"]]


def error_status(caught: pytest.ExceptionInfo[ApiException]) -> Obj:
    return cast(Obj, json.loads(caught.value.body or "{}"))


def test_a_limited_list_comes_in_pages_in_key_order(core: client.CoreV1Api) -> None:
    for index in (3, 0, 4, 1, 2):
        core.create_namespaced_pod(NS, pod(f"p-{index}"))

    pages = pod_pages(core, limit=2)

    assert [names_of(page) for page in pages] == [["p-0", "p-1"], ["p-2", "p-3"], ["p-4"]]
    assert [page["metadata"].get("remainingItemCount") for page in pages] == [3, 1, None]
    assert len({page["metadata"]["resourceVersion"] for page in pages}) == 1
    assert names_of(pod_list(core)) == [f"p-{index}" for index in range(5)]  # no limit: all in one


def test_every_page_shows_the_list_as_it_was_at_the_first(core: client.CoreV1Api) -> None:
    for index in range(4):
        core.create_namespaced_pod(NS, pod(f"p-{index}", tier="edge"))
    (first, *_) = pod_pages(core, limit=2)
    token = first["metadata"]["continue"]

    core.create_namespaced_pod(NS, pod("p-2a"))
    core.patch_namespaced_pod("p-2", NS, {"metadata": {"labels": {"tier": "core"}}})
    core.delete_namespaced_pod("p-3", NS)

    rest = pod_pages(core, limit=2, first=token)
    assert [names_of(page) for page in rest] == [["p-2", "p-3"]]
    assert rest[0]["items"][0]["metadata"]["labels"] == {"tier": "edge"}
    assert rest[0]["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert names_of(pod_list(core)) == ["p-0", "p-1", "p-2", "p-2a"]


def test_with_a_selector_a_page_may_be_short_and_the_remaining_count_is_unset(core: client.CoreV1Api) -> None:
    for index in range(6):
        core.create_namespaced_pod(NS, pod(f"p-{index}", owner="us" if index in (0, 4, 5) else "them"))

    pages = pod_pages(core, limit=2, label_selector="owner=us")

    assert [names_of(page) for page in pages] == [["p-0", "p-4"], ["p-5"]]
    assert all("remainingItemCount" not in page["metadata"] for page in pages)
    # Keys are read until the page is full: one that ends on the last key has no token.
    exact = pod_pages(core, limit=3, label_selector="owner=us")
    assert [names_of(page) for page in exact] == [["p-0", "p-4", "p-5"]]


def test_an_expired_continue_token_is_410_with_a_token_for_the_rest(kube: KubeEmulator,
                                                                    core: client.CoreV1Api) -> None:
    for index in range(4):
        core.create_namespaced_pod(NS, pod(f"p-{index}"))
    (first, *_) = pod_pages(core, limit=2)
    core.create_namespaced_pod(NS, pod("p-9"))
    kube.compact()  # etcd's compaction, past the first page's revision

    with pytest.raises(ApiException) as caught:
        pod_list(core, limit=2, _continue=first["metadata"]["continue"])

    assert caught.value.status == 410
    status = error_status(caught)
    assert status["reason"] == "Expired"
    assert status["message"].startswith("The provided continue parameter is too old to display a consistent list")
    # That token lists the rest as it is now: inconsistent with the first page, as the message says.
    rest = pod_pages(core, limit=2, first=status["metadata"]["continue"])
    assert [names_of(page) for page in rest] == [["p-2", "p-3"], ["p-9"]]


def test_a_long_enough_list_expires_when_the_history_moves_past_it() -> None:
    with KubeEmulator(history_limit=3, namespaces=(NS,)) as kube, \
            client.ApiClient(client.Configuration(host=kube.url)) as api:
        core = client.CoreV1Api(api)
        for index in range(3):
            core.create_namespaced_pod(NS, pod(f"p-{index}"))
        (first, *_) = pod_pages(core, limit=1)
        for index in range(3):
            core.patch_namespaced_pod(f"p-{index}", NS, {"metadata": {"labels": {"seen": "yes"}}})
        # The three events since the first page are still in the history: its snapshot is too.
        assert names_of(pod_list(core, limit=1, _continue=first["metadata"]["continue"])) == ["p-1"]
        core.patch_namespaced_pod("p-0", NS, {"metadata": {"labels": {"seen": "twice"}}})
        with pytest.raises(ApiException) as caught:
            pod_list(core, limit=1, _continue=first["metadata"]["continue"])
        assert caught.value.status == 410


@pytest.mark.parametrize("token", ["not-a-token", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MCwic3RhcnQiOiJwIn0"])
def test_a_continue_token_the_server_did_not_make_is_400(core: client.CoreV1Api, token: str) -> None:
    with pytest.raises(ApiException) as caught:
        pod_list(core, limit=1, _continue=token)
    assert caught.value.status == 400
    assert "invalid continue token" in error_status(caught)["message"]


def test_continue_with_a_resource_version_is_400(core: client.CoreV1Api) -> None:
    for index in range(2):
        core.create_namespaced_pod(NS, pod(f"p-{index}"))
    (first, *_) = pod_pages(core, limit=1)
    with pytest.raises(ApiException) as caught:
        pod_list(core, limit=1, _continue=first["metadata"]["continue"], resource_version="5")
    assert caught.value.status == 400


# --- events, leases, discovery ---------------------------------------------------------------


def test_events_create_and_list(core: client.CoreV1Api) -> None:
    ref = client.V1ObjectReference(api_version=f"{GROUP}/{VERSION}", kind="Proxy",
                                   name="eu-1", namespace=NS)
    core.create_namespaced_event(NS, client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="eu-1."), involved_object=ref,
        reason="CleanupSkipped", message="abandoned kvm://hosts/a/domains/b", type="Normal"))

    listed = core.list_namespaced_event(NS)

    assert [(e.reason, e.involved_object.name) for e in listed.items] == [
        ("CleanupSkipped", "eu-1")]


def test_lease_replace_with_stale_version_is_409(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="egress-proxies"),
                           spec=client.V1LeaseSpec(holder_identity="a",
                                                   lease_duration_seconds=15))
    created = leases.create_namespaced_lease(NS, lease)
    assert created.spec is not None
    created.spec.holder_identity = "b"
    renewed = leases.replace_namespaced_lease("egress-proxies", NS, created)

    assert renewed.spec is not None
    assert renewed.spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # built on the resourceVersion "b" replaced
    with pytest.raises(ApiException) as caught:
        leases.replace_namespaced_lease("egress-proxies", NS, created)
    assert caught.value.status == 409
    current = leases.read_namespaced_lease("egress-proxies", NS)
    assert current.spec is not None
    assert current.spec.holder_identity == "b"


def test_discovery_lists_groups_and_resources(api: client.ApiClient) -> None:
    groups = client.ApisApi(api).get_api_versions()
    core_versions = client.CoreApi(api).get_api_versions()
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION)
    core_resources = client.CoreV1Api(api).get_api_resources()

    assert {g.name for g in groups.groups} == {GROUP, "coordination.k8s.io", "apps", "rbac.authorization.k8s.io",
                                               "apiextensions.k8s.io", "networking.k8s.io"}  # Ingress
    assert core_versions.versions == ["v1"]
    assert {(r.name, r.kind, r.namespaced) for r in resources.resources} == {
        ("proxies", "Proxy", True), ("proxies/status", "Proxy", True)}
    assert {"pods", "pods/status", "secrets", "events", "configmaps", "namespaces", "serviceaccounts",
            "services", "services/status"} <= {r.name for r in core_resources.resources}


def test_registered_kinds_are_served_and_discovered(kube: KubeEmulator,
                                                   api: client.ApiClient) -> None:
    kube.register(ResourceType("crawl.example.com", "v1alpha1", "ProxyPool", "proxypools",
                               namespaced=False, status_subresource=False))
    objects = client.CustomObjectsApi(api)

    created = cast(Obj, objects.create_cluster_custom_object(
        GROUP, VERSION, "proxypools", {"metadata": {"name": "pool"}, "spec": {"size": 2}}))
    listed = cast(Obj, objects.list_cluster_custom_object(GROUP, VERSION, "proxypools"))
    resources = objects.get_api_resources(GROUP, VERSION)

    assert created["kind"] == "ProxyPool"
    assert "namespace" not in created["metadata"]
    assert [item["metadata"]["name"] for item in listed["items"]] == ["pool"]
    assert ("proxypools", False) in {(r.name, r.namespaced) for r in resources.resources}


def test_namespaces_are_cluster_scoped(core: client.CoreV1Api) -> None:
    created = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="crawl-b")))

    assert created.status is not None
    assert created.status.phase == "Active"
    assert created.metadata is not None and created.metadata.namespace is None
    # A new cluster has default and the kube-* namespaces (the system namespaces controller).
    assert [n.metadata.name for n in core.list_namespace().items if n.metadata] == [
        "crawl-b", NS, "default", "kube-node-lease", "kube-public", "kube-system"]



def namespace_gone(core: client.CoreV1Api, name: str) -> bool:
    return name not in [n.metadata.name for n in core.list_namespace().items if n.metadata]


def test_a_namespace_has_its_own_uid_and_the_namespace_controllers_finalizer(core: client.CoreV1Api) -> None:
    # pkg/registry/core/namespace/strategy.go PrepareForCreate: spec.finalizers [kubernetes],
    # status.phase Active; the uid is the object's identity (a new one for every create).
    created = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team-a")))
    read = core.read_namespace("team-a")
    assert created.metadata is not None and read.metadata is not None and read.spec is not None
    assert read.metadata.uid and read.metadata.uid == created.metadata.uid
    assert read.spec.finalizers == ["kubernetes"] and read.status is not None and read.status.phase == "Active"
    other = core.read_namespace(NS)
    assert other.metadata is not None and other.metadata.uid != read.metadata.uid


def test_a_deleted_namespace_terminates_until_its_content_is_gone_then_returns_with_a_new_uid(
        core: client.CoreV1Api, proxies: Proxies) -> None:
    # pkg/registry/core/namespace/storage/storage.go Delete (Terminating, answered with the
    # namespace; 409 on a second DELETE while its finalizer stands), the namespace controller
    # (pkg/controller/namespace/deletion: every object deleted, the finalizer removed once none
    # is left) and NamespaceLifecycle admission (no new content while terminating).
    before = core.read_namespace(NS)
    proxies.create("held", finalizers=[FINALIZER])
    proxies.create("free")
    answered = json.loads(cast(Any, core.delete_namespace(NS, _preload_content=False)).data)
    assert (answered["kind"], answered["status"]["phase"]) == ("Namespace", "Terminating")
    terminating = core.read_namespace(NS)
    assert terminating.metadata is not None and terminating.metadata.deletion_timestamp is not None
    assert terminating.status is not None and terminating.status.phase == "Terminating"
    wait_for(lambda: [p["metadata"]["name"] for p in proxies.list_objects()["items"]] == ["held"], 5,
             "only the held Proxy to be left", 0.02)
    assert proxies.get("held")["metadata"]["deletionTimestamp"]  # its finalizer holds it, and the namespace
    with pytest.raises(ApiException) as caught:
        proxies.create("late")
    answer = status_of(caught.value)
    assert caught.value.status == 403 and answer["reason"] == "Forbidden"
    assert answer["message"] == (f'proxies.crawl.example.com "late" is forbidden: unable to create new content in '
                                 f"namespace {NS} because it is being terminated")
    assert answer["details"]["causes"][0]["reason"] == "NamespaceTerminating"
    with pytest.raises(ApiException) as again:
        core.delete_namespace(NS)
    assert again.value.status == 409
    time.sleep(0.3)
    assert not namespace_gone(core, NS)  # held by the Proxy's finalizer
    held = proxies.get("held")
    held["metadata"]["finalizers"] = []  # the controller releases it: updates still pass
    proxies.replace(held)
    wait_for(lambda: namespace_gone(core, NS), 5, f"namespace {NS} to go", 0.02)
    again_created = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    assert again_created.metadata is not None and before.metadata is not None
    assert again_created.metadata.uid != before.metadata.uid
    assert proxies.list_objects()["items"] == []


# --- what deploy_controller.yml installs (kubernetes.core.k8s) ---------------------------------


def deployment(name: str, image: str) -> Obj:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}}


def as_dict(api: client.ApiClient, model: Any) -> Obj:
    """A client model back as the JSON the server sent (camelCase keys)."""
    return cast(Obj, api.sanitize_for_serialization(model))  # type: ignore[no-untyped-call]


def test_deployment_kinds_parse_into_the_client_models(api: client.ApiClient) -> None:
    """Every kind the deploy playbook writes, created through its typed API and parsed back into
    the client's model (which checks required fields), cluster-scoped kinds without a namespace."""
    core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"}
    subjects = [{"kind": "ServiceAccount", "name": "sa", "namespace": NS}]
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    crd_spec = {"group": GROUP, "scope": "Namespaced", "names": {"kind": "ProxyPool", "plural": "proxypools"},
                "versions": [{"name": VERSION, "served": True, "storage": True,
                              "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    creates: list[tuple[Any, tuple[str, ...], Obj]] = [
        (core.create_namespaced_service_account, (NS,), {"metadata": {"name": "sa"}}),
        (core.create_namespaced_service, (NS,), {"metadata": {"name": "svc"}, "spec": {
            "selector": {"app": "x"}, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}}),
        (apps.create_namespaced_deployment, (NS,), deployment("x", "image:1")),
        (rbac.create_cluster_role, (), {"metadata": {"name": "reader"}, "rules": rules}),
        (rbac.create_cluster_role_binding, (), {"metadata": {"name": "reader"}, "roleRef": ref,
                                                "subjects": subjects}),
        (rbac.create_namespaced_role, (NS,), {"metadata": {"name": "r"}, "rules": rules}),
        (rbac.create_namespaced_role_binding, (NS,), {"metadata": {"name": "r"},
                                                      "roleRef": {**ref, "kind": "Role", "name": "r"},
                                                      "subjects": subjects}),
        (client.ApiextensionsV1Api(api).create_custom_resource_definition, (),
         {"metadata": {"name": f"proxypools.{GROUP}"}, "spec": crd_spec}),
    ]

    created = [as_dict(api, create(*args, body)) for create, args, body in creates]

    for (_, args, body), obj in zip(creates, created, strict=True):
        assert obj["metadata"]["name"] == body["metadata"]["name"]
        assert obj["metadata"].get("namespace") == (args[0] if args else None)
        for key, value in body.items():
            if key != "metadata":  # what was sent is stored; the server may fill in more (a Service's clusterIP)
                assert ({k: obj[key][k] for k in value} if isinstance(value, dict) else obj[key]) == value, key
    assert [obj["kind"] for obj in created] == ["ServiceAccount", "Service", "Deployment", "ClusterRole",
                                                "ClusterRoleBinding", "Role", "RoleBinding",
                                                "CustomResourceDefinition"]


def test_deployment_status_is_a_subresource_and_generation_counts_spec(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(NS, cast(Any, deployment("x", "image:1")))
    status = {"status": {"observedGeneration": 1, "replicas": 1, "availableReplicas": 1}}

    with_status = as_dict(api, apps.patch_namespaced_deployment_status("x", NS, status))
    respecced = as_dict(api, apps.patch_namespaced_deployment("x", NS, {
        "spec": {"template": {"metadata": {"annotations": {"restart": "1"}}}}, "status": {"replicas": 5}}))

    assert (with_status["metadata"]["generation"], with_status["status"]["availableReplicas"]) == (1, 1)
    assert respecced["metadata"]["generation"] == 2
    assert respecced["status"]["replicas"] == 1  # a main write ignores status


def test_strategic_merge_patch_on_a_custom_resource_is_415(proxies: Proxies) -> None:
    """Custom resources have no patch strategy; kubernetes.core.k8s then retries as a merge patch."""
    proxies.create("eu-1")
    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", {"spec": {"port": 8080}}, "application/strategic-merge-patch+json")
    assert caught.value.status == 415
    assert proxies.patch("eu-1", {"spec": {"port": 8080}}, "application/merge-patch+json")["spec"]["port"] == 8080


def test_dynamic_client_discovers_and_applies_like_kubernetes_core(api: client.ApiClient, tmp_path: Path) -> None:
    """kubernetes.core.k8s's path: lazy discovery by apiVersion and kind, a GET, a create, then
    merge patches; a patch that changes nothing keeps the resourceVersion (its "no change")."""
    dynamic = DynamicClient(api, cache_file=str(tmp_path / "discovery.json"))  # type: ignore[no-untyped-call]
    resource = dynamic.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole")
    crds = dynamic.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}

    assert (resource.namespaced, crds.namespaced) == (False, False)
    created = resource.create(body=body).to_dict()
    same = resource.patch(body=body, name="reader", content_type="application/merge-patch+json").to_dict()
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    changed = resource.patch(body={"rules": [rule]}, name="reader",
                             content_type="application/merge-patch+json").to_dict()

    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert int(changed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert changed["rules"][0]["verbs"] == ["get", "list"]  # a merge patch replaces lists

# --- fault injection -------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "reason"), [(403, "Forbidden"), (500, "InternalError"),
                                              (503, "ServiceUnavailable")])
def test_fail_next_answers_the_status_then_recovers(kube: KubeEmulator, proxies: Proxies,
                                                    code: int, reason: str) -> None:
    proxies.create("eu-1")
    kube.fail_next("GET", r"/proxies/eu-1$", code)

    with pytest.raises(ApiException) as caught:
        proxies.get("eu-1")

    assert caught.value.status == code
    assert status_of(caught.value)["reason"] == reason
    assert proxies.get("eu-1")["metadata"]["name"] == "eu-1"


def test_429_with_retry_after_is_retried_by_the_client(kube: KubeEmulator,
                                                       proxies: Proxies) -> None:
    # urllib3's default Retry (total=3, respecting Retry-After on 413/429/503) sits under the
    # official client: it hides up to three throttled answers and surfaces the fourth.
    kube.fail_next("GET", r"/proxies$", 429, count=3, retry_after=0)
    assert proxies.list_objects()["items"] == []

    kube.fail_next("GET", r"/proxies$", 429, count=4, retry_after=0)
    with pytest.raises(ApiException) as caught:
        proxies.list_objects()
    assert caught.value.status == 429
    assert status_of(caught.value)["reason"] == "TooManyRequests"
    assert caught.value.headers is not None
    assert caught.value.headers["Retry-After"] == "0"
    assert len([m for m, path in kube.requests() if path.endswith("/proxies")]) == 8


def test_fail_next_matches_method_path_and_count(kube: KubeEmulator, proxies: Proxies) -> None:
    kube.fail_next("POST", r"/proxies$", 503, count=2)
    proxies.list_objects()  # a GET on the same path is not affected

    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            proxies.create("eu-1")
        assert caught.value.status == 503
    created = proxies.create("eu-1")

    assert created["metadata"]["name"] == "eu-1"
    assert [m for m, path in kube.requests() if path.endswith("/proxies")] == [
        "GET", "POST", "POST", "POST"]


def test_fail_next_on_a_watch(kube: KubeEmulator, proxies: Proxies) -> None:
    kube.fail_next("GET", r"watch=true", 500)

    with pytest.raises(ApiException) as caught:
        proxies.watch(1)

    assert caught.value.status == 500


# --- strict like a real API server: custom resources against their CRD ------------------------
# Each test cites the Kubernetes documentation or source whose behaviour it pins down.


def proxy_body(name: str, spec: Any, **extra: Any) -> Obj:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name}, "spec": spec,
            **extra}


def test_a_custom_resource_is_served_only_while_its_crd_exists() -> None:
    # apiextensions-apiserver: a kind is served once its CRD is Established
    # (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/
    # "Create a CustomResourceDefinition"), and deleting the CRD deletes its objects ("Delete a
    # CustomResourceDefinition": "all custom objects of that kind are deleted").
    with KubeEmulator(namespaces=[NS]) as kube, client.ApiClient(client.Configuration(host=kube.url)) as api:
        proxies = Proxies(api)
        with pytest.raises(ApiException) as before:
            proxies.list_objects()
        assert before.value.status == 404

        crds = client.ApiextensionsV1Api(api)
        created = as_dict(api, crds.create_custom_resource_definition(cast(Any, proxy_crd())))
        assert {c["type"]: c["status"] for c in created["status"]["conditions"]} == {
            "NamesAccepted": "True", "Established": "True"}
        assert proxies.create("eu-1")["spec"] == {"provider": "home-kvm", **SPEC_DEFAULTS}

        crds.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
        assert kube.requests()  # the server answered every call above
        with pytest.raises(ApiException) as after:
            proxies.get("eu-1")
        assert after.value.status == 404
    with KubeEmulator(crds=[proxy_crd()]) as again:
        assert again.get_object(f"{PLURAL}.{GROUP}", NS, "eu-1") is None


def test_unknown_fields_are_pruned_and_defaults_applied(api: client.ApiClient) -> None:
    # Structural schemas: "Field pruning" (unknown fields are dropped, metadata/apiVersion/kind
    # kept) and "Defaulting" / "Defaulting and Nullable" (a null for a non-nullable field is
    # dropped, then the default applies) in
    # https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/
    objects = client.CustomObjectsApi(api)
    body = proxy_body("eu-1", {"provider": "home-kvm", "port": None, "unknown": {"x": 1}}, extra="dropped")

    created = cast(Obj, objects.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body))

    assert created["spec"] == {"provider": "home-kvm", **SPEC_DEFAULTS}
    assert "extra" not in created
    patched = cast(Obj, objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "eu-1", {"status": {"phase": "Ready", "made-up": True}}))
    assert patched["status"] == {"phase": "Ready"}


@pytest.mark.parametrize(("spec", "causes"), [
    # apiextensions-apiserver pkg/apiserver/validation kubeOpenAPIResultToFieldErrors: required →
    # field.Required, enum → field.NotSupported, maxLength → field.TooLongMaxLength, a wrong type
    # → field.TypeInvalid, anything else → field.Invalid with kube-openapi's "<path> in body ..."
    # message (k8s.io/kube-openapi/pkg/validation/errors).
    ({"port": 70000, "provider": "p"},
     [("FieldValueInvalid", "spec.port",
       "Invalid value: 70000: spec.port in body should be less than or equal to 65535")]),
    ({"port": 22, "provider": "p"},
     [("FieldValueInvalid", "spec.port",
       "Invalid value: 22: spec.port in body should be greater than or equal to 1024")]),
    ({"port": "abc", "provider": "p"},
     [("FieldValueTypeInvalid", "spec.port",
       'Invalid value: "abc": spec.port in body must be of type integer: "string"')]),
    ({"location": "x"}, [("FieldValueRequired", "spec.provider", "Required value")]),
    ({"provider": ""},
     [("FieldValueInvalid", "spec.provider",
       'Invalid value: "": spec.provider in body should be at least 1 chars long')]),
    ({"provider": "p", "cloudInitEncoding": "gzip"},
     [("FieldValueNotSupported", "spec.cloudInitEncoding",
       'Unsupported value: "gzip": supported values: "plain", "base64"')]),
    ({"provider": "p", "cloudInit": "x" * 90001},
     [("FieldValueTooLong", "spec.cloudInit", "Too long: may not be longer than 90000")]),
    ({"provider": 5, "port": 3128.5},
     [("FieldValueTypeInvalid", "spec.port",
       'Invalid value: 3128.5: spec.port in body must be of type integer: "number"'),
      ("FieldValueTypeInvalid", "spec.provider",
       'Invalid value: 5: spec.provider in body must be of type string: "integer"')]),
])
def test_an_invalid_custom_resource_is_422_with_a_cause_per_field(proxies: Proxies, spec: Obj,
                                                                  causes: list[tuple[str, str, str]]) -> None:
    # apimachinery api/errors NewInvalid: 422, reason Invalid, message
    # '<Kind>.<group> "<name>" is invalid: <errors>', details.kind the Kind, one cause per error.
    with pytest.raises(ApiException) as caught:
        proxies.api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, proxy_body("eu-1", spec))

    assert caught.value.status == 422
    answer = status_of(caught.value)
    assert (answer["reason"], answer["details"]["kind"], answer["details"]["group"]) == ("Invalid", "Proxy", GROUP)
    assert answer["message"].startswith('Proxy.crawl.example.com "eu-1" is invalid: ')
    assert sorted((c["reason"], c["field"], c["message"]) for c in answer["details"]["causes"]) == sorted(causes)
    assert proxies.list_objects()["items"] == []


def test_a_missing_spec_and_an_invalid_status_write_are_refused(proxies: Proxies) -> None:
    # crd.yaml's root "required: [spec]"; the status subresource validates the whole object
    # against the schema too (customResourceStatusStrategy.ValidateUpdate).
    with pytest.raises(ApiException) as no_spec:
        proxies.api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "eu-1"}})
    assert [(c["field"], c["reason"]) for c in status_of(no_spec.value)["details"]["causes"]] == [
        ("spec", "FieldValueRequired")]

    proxies.create("eu-1")
    with pytest.raises(ApiException) as bad_status:
        proxies.patch_status("eu-1", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "Yes", "reason": "x", "message": "", "lastTransitionTime": "now"}]}})
    assert sorted(c["field"] for c in status_of(bad_status.value)["details"]["causes"]) == [
        "status.conditions[0].lastTransitionTime", "status.conditions[0].status", "status.phase"]
    with pytest.raises(ApiException) as bad_patch:
        proxies.patch("eu-1", {"spec": {"port": 99999}})
    assert status_of(bad_patch.value)["details"]["causes"][0]["field"] == "spec.port"
    assert proxies.get("eu-1")["spec"]["port"] == 3128


def test_store_unvalidated_is_a_back_door_and_updates_ratchet(kube: KubeEmulator, proxies: Proxies) -> None:
    # A real server validates writes, not reads: an object stored before the CRD's schema
    # tightened is served as stored. Updates ratchet (KEP-4008 "CRD Validation Ratcheting",
    # on by default since Kubernetes 1.30, GA in 1.33): errors on unchanged values are not
    # reported, new invalid values are.
    stored = kube.store_unvalidated({**proxy_body("eu-1", {"provider": "home-kvm", "port": "abc"}),
                                     "metadata": {"name": "eu-1", "namespace": NS}})

    assert proxies.get("eu-1")["spec"] == {"provider": "home-kvm", "port": "abc"}
    assert stored["metadata"]["uid"] and stored["metadata"]["generation"] == 1
    with_status = proxies.patch_status("eu-1", {"status": {"phase": "Failed"}})
    finalized = proxies.patch("eu-1", {"metadata": {"finalizers": [FINALIZER]}})
    assert (with_status["status"], finalized["metadata"]["finalizers"]) == ({"phase": "Failed"}, [FINALIZER])
    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", {"spec": {"port": "still-not-a-port"}})
    assert caught.value.status == 422


# --- Leases ------------------------------------------------------------------------------------


def send(kube: KubeEmulator, method: str, path: str, body: Obj) -> tuple[int, Obj]:
    """One request with exactly these bytes: the official client re-serializes times through
    its models (e.g. ``datetime.isoformat()``), which would hide what is on the wire."""
    host, port = kube.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, cast(Obj, json.loads(response.read()))
    finally:
        connection.close()


LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


@pytest.mark.parametrize("renew_time", ["2026-12-03T09:00:00Z", "2026-12-03T09:00:00.123Z",
                                        "2026-12-03T09:00:00.123456789Z", "2026-12-03T09:00:00+00:00",
                                        "yesterday", 1764752400])
def test_a_lease_time_that_is_not_a_micro_time_is_400(kube: KubeEmulator, renew_time: Any) -> None:
    # k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go: MicroTime.UnmarshalJSON parses
    # RFC3339Micro "2006-01-02T15:04:05.000000Z07:00" (exactly six fractional digits); a body the
    # decoder refuses is 400 BadRequest 'Lease in version "v1" cannot be handled as a Lease:
    # parsing time "..." as "2006-01-02T15:04:05.000000Z07:00": ...'.
    body = {"metadata": {"name": "egress-proxies"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": renew_time}}

    code, answer = send(kube, "POST", LEASES, body)

    assert code == 400
    assert answer["reason"] == "BadRequest"
    assert answer["message"].startswith('Lease in version "v1" cannot be handled as a Lease: ')
    if isinstance(renew_time, str):
        assert f'parsing time "{renew_time}" as "2006-01-02T15:04:05.000000Z07:00"' in answer["message"]
    assert kube.get_object("leases.coordination.k8s.io", NS, "egress-proxies") is None


def test_a_micro_time_lease_is_accepted_and_checked_on_update(kube: KubeEmulator) -> None:
    body = {"metadata": {"name": "egress-proxies"},
            "spec": {"holderIdentity": "a", "renewTime": "2026-12-03T09:00:00.000000Z",
                     "acquireTime": "2026-12-03T10:00:00.123456+01:00"}}

    code, created = send(kube, "POST", LEASES, body)
    assert code == 201, created
    created["spec"]["renewTime"] = "2026-12-03T09:00:05Z"

    code, answer = send(kube, "PUT", f"{LEASES}/egress-proxies", created)
    assert (code, answer["reason"]) == (400, "BadRequest")
    code, answer = send(kube, "PUT", f"{LEASES}/egress-proxies",
                        {**created, "spec": {**created["spec"], "renewTime": "2026-12-03T09:00:05.000001Z"}})
    assert code == 200, answer


# --- Pods and namespaces -----------------------------------------------------------------------


def bad_pod(**changes: Any) -> Obj:
    body: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "squid-1", "labels": {"app": "squid"}},
                 "spec": {"containers": [{"name": "squid", "image": "squid",
                                          "ports": [{"name": "proxy", "containerPort": 3128}]}]}}
    for path, value in changes.items():
        target: Any = body
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return body


@pytest.mark.parametrize(("changes", "field", "reason", "detail"), [
    # k8s.io/apimachinery/pkg/util/validation/validation.go IsValidLabelValue / IsQualifiedName,
    # reported on metadata.labels by apimachinery/pkg/apis/meta/v1/validation ValidateLabels.
    ({"metadata__labels": {"app": "x" * 64}}, "metadata.labels", "FieldValueInvalid",
     "must be no more than 63 characters"),
    ({"metadata__labels": {"app": "-squid"}}, "metadata.labels", "FieldValueInvalid",
     "a valid label must be an empty string or consist of alphanumeric characters"),
    ({"metadata__labels": {"crawl.example.com/proxy": "ns/name"}}, "metadata.labels", "FieldValueInvalid",
     "a valid label must be an empty string"),
    ({"metadata__labels": {"bad key!": "x"}}, "metadata.labels", "FieldValueInvalid",
     "name part must consist of alphanumeric characters"),
    # metadata.name of a Pod: a DNS-1123 subdomain (ValidatePodName).
    ({"metadata__name": "Squid_1"}, "metadata.name", "FieldValueInvalid",
     "a lowercase RFC 1123 subdomain must consist of"),
    # pkg/apis/core/validation/validation.go: validateContainers, validateContainerPorts,
    # ValidatePortNumOrName (IsValidPortNum, IsValidPortName).
    ({"spec__containers": []}, "spec.containers", "FieldValueRequired", "Required value"),
    ({"spec__containers__0__image": ""}, "spec.containers[0].image", "FieldValueRequired", "Required value"),
    ({"spec__containers__0__name": "Squid"}, "spec.containers[0].name", "FieldValueInvalid",
     "a lowercase RFC 1123 label must consist of"),
    ({"spec__containers__0__ports": [{"containerPort": 0}]}, "spec.containers[0].ports[0].containerPort",
     "FieldValueRequired", "Required value"),
    ({"spec__containers__0__ports": [{"containerPort": 70000}]}, "spec.containers[0].ports[0].containerPort",
     "FieldValueInvalid", "must be between 1 and 65535, inclusive"),
    ({"spec__containers__0__ports": [{"containerPort": 3128, "hostPort": 65536}]},
     "spec.containers[0].ports[0].hostPort", "FieldValueInvalid", "must be between 1 and 65535, inclusive"),
    ({"spec__containers__0__ports": [{"name": "proxy-port-number-1", "containerPort": 3128}]},
     "spec.containers[0].ports[0].name", "FieldValueInvalid", "must be no more than 15 characters"),
    ({"spec__containers__0__ports": [{"name": "Proxy", "containerPort": 3128}]},
     "spec.containers[0].ports[0].name", "FieldValueInvalid",
     "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"),
    ({"spec__containers__0__ports": [{"name": "3128", "containerPort": 3128}]},
     "spec.containers[0].ports[0].name", "FieldValueInvalid", "must contain at least one letter (a-z)"),
    ({"spec__containers__0__ports": [{"containerPort": 3128, "protocol": "HTTP"}]},
     "spec.containers[0].ports[0].protocol", "FieldValueNotSupported", 'supported values: "SCTP", "TCP", "UDP"'),
    # validateEnvVarValueFrom: a fieldRef names one of validEnvDownwardAPIFieldPathExpressions.
    ({"spec__containers__0__env": [{"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPS"}}}]},
     "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath", "FieldValueNotSupported", '"status.podIPs"'),
])
def test_an_invalid_pod_is_422_naming_the_field(core: client.CoreV1Api, changes: Obj, field: str, reason: str,
                                               detail: str) -> None:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, cast(Any, bad_pod(**changes)))

    assert caught.value.status == 422
    answer = status_of(caught.value)
    assert (answer["reason"], answer["details"]["kind"], answer["details"]["group"]) == ("Invalid", "Pod", "")
    assert answer["message"].startswith('Pod "')
    assert [(c["field"], c["reason"]) for c in answer["details"]["causes"]] == [(field, reason)]
    assert detail in answer["details"]["causes"][0]["message"]
    assert core.list_namespaced_pod(NS).items == []


def test_a_valid_label_of_63_characters_is_accepted_and_checked_on_update(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod(NS, cast(Any, bad_pod(metadata__labels={"app": "x" * 63})))
    assert created.metadata is not None and created.metadata.labels == {"app": "x" * 63}

    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("squid-1", NS, {"metadata": {"labels": {"app": "x" * 64}}})
    assert caught.value.status == 422


@pytest.mark.parametrize("kind", ["pod", "lease", "event", "proxy"])
def test_an_object_in_a_namespace_that_does_not_exist_is_404(api: client.ApiClient, proxies: Proxies,
                                                             kind: str) -> None:
    # plugin/pkg/admission/namespace/lifecycle (NamespaceLifecycle admission, on by default):
    # creating a namespaced object in a missing namespace returns the namespace lookup's
    # NotFound: 404, reason NotFound, 'namespaces "<name>" not found'.
    core = client.CoreV1Api(api)
    create: Any = {
        "pod": lambda: core.create_namespaced_pod("missing", pod("squid-1")),
        "lease": lambda: client.CoordinationV1Api(api).create_namespaced_lease(
            "missing", client.V1Lease(metadata=client.V1ObjectMeta(name="l"))),
        "event": lambda: core.create_namespaced_event("missing", client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e"), involved_object=client.V1ObjectReference(name="x"))),
        "proxy": lambda: proxies.api.create_namespaced_custom_object(
            GROUP, VERSION, "missing", PLURAL, proxy_body("eu-1", {"provider": "p"})),
    }[kind]

    with pytest.raises(ApiException) as caught:
        create()

    assert caught.value.status == 404
    answer = status_of(caught.value)
    assert (answer["reason"], answer["message"]) == ("NotFound", 'namespaces "missing" not found')
    assert answer["details"] == {"name": "missing", "group": "", "kind": "namespaces"}
    # Listing a namespace that does not exist is an empty list, not an error.
    assert core.list_namespaced_pod("missing").items == []


# --- graceful Pod deletion and the kubelet stand-in -------------------------------------------


def grace_pod(name: str, grace: int | None = 10) -> client.V1Pod:
    body = pod(name)
    assert body.spec is not None
    body.spec.termination_grace_period_seconds = grace
    return body


def test_a_running_pod_is_deleted_gracefully(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # pkg/registry/core/pod/strategy.go CheckGracefulDelete (the grace period defaults to the
    # Pod's terminationGracePeriodSeconds) and k8s.io/apiserver/pkg/registry/rest/delete.go
    # BeforeDelete (deletionTimestamp = now + grace, deletionGracePeriodSeconds = grace,
    # generation + 1); the object stays until the kubelet has stopped it
    # (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination).
    core.create_namespaced_pod(NS, grace_pod("squid-1"))
    running = kube.kubelet_run(NS, "squid-1")
    since = running["metadata"]["resourceVersion"]

    answer = core.delete_namespaced_pod("squid-1", NS)

    assert answer.metadata is not None
    assert answer.metadata.deletion_grace_period_seconds == 10
    assert answer.metadata.deletion_timestamp is not None
    assert answer.metadata.creation_timestamp is not None
    assert answer.metadata.deletion_timestamp > answer.metadata.creation_timestamp  # now + 10 s
    read = core.read_namespaced_pod("squid-1", NS)
    assert read.metadata is not None and read.metadata.deletion_timestamp == answer.metadata.deletion_timestamp
    assert read.metadata.generation == running["metadata"]["generation"] + 1
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items if p.metadata] == ["squid-1"]

    kube.advance(9)
    assert core.list_namespaced_pod(NS).items != []
    kube.advance(1)
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("squid-1", NS)
    assert caught.value.status == 404
    events = [(event["type"], event["raw_object"]["metadata"].get("deletionGracePeriodSeconds")) for event in
              watch_stream(new_watch(), core.list_namespaced_pod, NS, resource_version=since, timeout_seconds=1)]
    assert events == [("MODIFIED", 10), ("DELETED", 0)]


def test_the_grace_period_ends_by_itself_on_the_emulators_clock(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, grace_pod("squid-1", grace=1))
    kube.kubelet_run(NS, "squid-1")

    core.delete_namespaced_pod("squid-1", NS)

    wait_for(lambda: core.list_namespaced_pod(NS).items == [], 5, "the Pod to go once its grace period passed")


@pytest.mark.parametrize(("grace", "options", "expected"), [
    (None, {}, 30),  # no terminationGracePeriodSeconds: the API default, 30
    (10, {"grace_period_seconds": 3}, 3),  # the request's gracePeriodSeconds wins
    (10, {"body": client.V1DeleteOptions(grace_period_seconds=5)}, 5),
])
def test_the_grace_period_comes_from_the_request_or_the_pod(kube: KubeEmulator, core: client.CoreV1Api,
                                                            grace: int | None, options: Obj, expected: int) -> None:
    core.create_namespaced_pod(NS, grace_pod("squid-1", grace))
    kube.kubelet_run(NS, "squid-1")

    answer = core.delete_namespaced_pod("squid-1", NS, **options)

    assert answer.metadata is not None and answer.metadata.deletion_grace_period_seconds == expected
    kube.advance(expected - 1)
    assert core.list_namespaced_pod(NS).items != []
    kube.advance(1)
    assert core.list_namespaced_pod(NS).items == []


def test_a_shorter_or_zero_grace_period_cuts_a_termination_short(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # delete.go BeforeDelete: a second graceful DELETE may only shorten the period; 0 deletes now.
    core.create_namespaced_pod(NS, grace_pod("squid-1", grace=30))
    kube.kubelet_run(NS, "squid-1")
    core.delete_namespaced_pod("squid-1", NS)

    longer = core.delete_namespaced_pod("squid-1", NS, grace_period_seconds=60)
    shorter = core.delete_namespaced_pod("squid-1", NS, grace_period_seconds=5)
    assert longer.metadata is not None and longer.metadata.deletion_grace_period_seconds == 30
    assert shorter.metadata is not None and shorter.metadata.deletion_grace_period_seconds == 5

    core.delete_namespaced_pod("squid-1", NS, grace_period_seconds=0)
    assert core.list_namespaced_pod(NS).items == []


@pytest.mark.parametrize("state", ["unscheduled", "failed", "zero"])
def test_a_pod_with_nothing_to_stop_goes_at_once(kube: KubeEmulator, core: client.CoreV1Api, state: str) -> None:
    # CheckGracefulDelete: period 0 when spec.nodeName is empty (never scheduled) or the phase is
    # Failed or Succeeded, or when the request says gracePeriodSeconds=0.
    core.create_namespaced_pod(NS, grace_pod("squid-1"))
    if state != "unscheduled":
        kube.kubelet_run(NS, "squid-1")
    if state == "failed":
        kube.kubelet_evict(NS, "squid-1")

    answer = core.delete_namespaced_pod("squid-1", NS, grace_period_seconds=0 if state == "zero" else None)

    assert answer.metadata is not None and answer.metadata.deletion_timestamp is None
    assert core.list_namespaced_pod(NS).items == []


def test_a_terminating_pod_with_a_finalizer_waits_for_it(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    body = grace_pod("squid-1", grace=5)
    assert body.metadata is not None
    body.metadata.finalizers = ["example.com/hold"]
    core.create_namespaced_pod(NS, body)
    kube.kubelet_run(NS, "squid-1")
    core.delete_namespaced_pod("squid-1", NS)

    kube.advance(5)
    held = core.read_namespaced_pod("squid-1", NS)
    assert held.metadata is not None and held.metadata.deletion_grace_period_seconds == 0

    core.patch_namespaced_pod("squid-1", NS, {"metadata": {"finalizers": None}})
    assert core.list_namespaced_pod(NS).items == []


def test_kubelet_run_reports_the_pod_running_ready_with_its_ips(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("squid-1"))

    kube.kubelet_run(NS, "squid-1", pod_ip="10.244.1.7", host_ip="172.18.0.3", node="worker-2")

    read = core.read_namespaced_pod("squid-1", NS)
    assert read.spec is not None and read.spec.node_name == "worker-2"
    assert read.status is not None
    assert (read.status.phase, read.status.pod_ip, read.status.host_ip) == ("Running", "10.244.1.7", "172.18.0.3")
    assert {c.type: c.status for c in read.status.conditions or []}["Ready"] == "True"
    assert [s.state.running is not None for s in read.status.container_statuses or [] if s.state] == [True]


def test_kubelet_evict_fails_the_pod_as_the_eviction_manager_does(kube: KubeEmulator,
                                                                  core: client.CoreV1Api) -> None:
    # pkg/kubelet/eviction (evictPod → the pod status: phase Failed, reason "Evicted", a
    # message naming the resource; a DisruptionTarget condition, reason TerminationByKubelet,
    # https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/ and
    # .../workloads/pods/disruptions/#pod-disruption-conditions); containers end terminated.
    core.create_namespaced_pod(NS, pod("squid-1"))
    kube.kubelet_run(NS, "squid-1", pod_ip="10.244.1.7")

    kube.kubelet_evict(NS, "squid-1")

    read = core.read_namespaced_pod("squid-1", NS)
    assert read.status is not None
    assert (read.status.phase, read.status.reason) == ("Failed", "Evicted")
    assert read.status.message and "low on resource" in read.status.message
    conditions = {c.type: (c.status, c.reason) for c in read.status.conditions or []}
    assert conditions["DisruptionTarget"] == ("True", "TerminationByKubelet")
    assert conditions["Ready"][0] == "False"
    terminated = [s.state.terminated for s in read.status.container_statuses or [] if s.state]
    assert [t.exit_code for t in terminated if t] == [137]
    assert read.status.pod_ip == "10.244.1.7"  # the dead Pod keeps its address in status


def test_a_pod_whose_finalizer_goes_during_its_grace_period_stays_until_it_ends(
        kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # The API server removes a gracefully deleted Pod only on the kubelet's final DELETE, after
    # the containers stopped; emptying finalizers meanwhile does not cut the grace period short.
    body = grace_pod("squid-1", grace=5)
    assert body.metadata is not None
    body.metadata.finalizers = ["example.com/hold"]
    core.create_namespaced_pod(NS, body)
    kube.kubelet_run(NS, "squid-1")
    core.delete_namespaced_pod("squid-1", NS)

    core.patch_namespaced_pod("squid-1", NS, {"metadata": {"finalizers": None}})
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items if p.metadata] == ["squid-1"]
    kube.advance(5)
    assert core.list_namespaced_pod(NS).items == []


def test_an_updated_crd_validates_with_its_new_schema_and_keeps_serving(api: client.ApiClient,
                                                                        proxies: Proxies) -> None:
    # Updating a CRD's schema changes what later writes must satisfy (validation is on write);
    # the kind keeps being served and watched across the update.
    crds = client.ApiextensionsV1Api(api)
    proxies.create("eu-1")
    since = proxies.list_objects()["metadata"]["resourceVersion"]
    current = as_dict(api, crds.read_custom_resource_definition(f"{PLURAL}.{GROUP}"))
    spec_schema = current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["port"]["maximum"] = 9999
    crds.replace_custom_resource_definition(f"{PLURAL}.{GROUP}", cast(Any, current))

    with pytest.raises(ApiException) as caught:
        proxies.patch("eu-1", {"spec": {"port": 10000}})
    assert status_of(caught.value)["details"]["causes"][0]["message"] == (
        "Invalid value: 10000: spec.port in body should be less than or equal to 9999")
    proxies.patch("eu-1", {"spec": {"port": 9999}})
    assert summary(proxies.watch(1, resource_version=since)) == [("MODIFIED", "eu-1")]


# --- admission: Pod Security, ResourceQuota; Service defaulting; a lost node ---------------------


def labelled_namespace(core: client.CoreV1Api, name: str, level: str) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"pod-security.kubernetes.io/enforce": level})))


RESTRICTED_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                      "seccompProfile": {"type": "RuntimeDefault"}}


def test_pod_security_admission_enforces_the_namespaces_level(core: client.CoreV1Api) -> None:
    # k8s.io/pod-security-admission: admission.go refuses with apierrors.NewForbidden
    # ('pods "<name>" is forbidden: violates PodSecurity "<level>:<version>": ...'); each check's
    # reason and detail as policy/check_*.go word them, in registry.go's order (baseline IDs
    # sorted, then restricted IDs sorted). The message is the one the "Enforce Pod Security
    # Standards with Namespace Labels" tutorial shows for a plain nginx Pod.
    labelled_namespace(core, "strict", "restricted")
    labelled_namespace(core, "base", "baseline")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("strict", cast(Any, bad_pod()))
    assert caught.value.status == 403
    answer = status_of(caught.value)
    assert (answer["reason"], answer["details"]["kind"]) == ("Forbidden", "pods")
    assert answer["message"] == (
        'pods "squid-1" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "squid" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "squid" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
        'container "squid" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "squid" '
        'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    # baseline: no host namespaces and no hostPort; a restricted-compliant Pod passes both.
    host = bad_pod(spec__hostNetwork=True, spec__containers__0__ports=[{"containerPort": 3128, "hostPort": 3128}])
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("base", cast(Any, host))
    assert status_of(caught.value)["message"] == (
        'pods "squid-1" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
        'hostPort (container "squid" uses hostPort 3128)')
    core.create_namespaced_pod(NS, cast(Any, host))  # no label: privileged
    compliant = bad_pod(spec__containers__0__securityContext=RESTRICTED_CONTEXT)
    core.create_namespaced_pod("strict", cast(Any, compliant))
    core.create_namespaced_pod("base", cast(Any, compliant))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("strict", cast(Any, bad_pod(
            metadata__name="root", spec__containers__0__securityContext={**RESTRICTED_CONTEXT, "runAsUser": 0})))
    assert status_of(caught.value)["message"].endswith(
        'violates PodSecurity "restricted:latest": runAsUser=0 (container "squid" must not set runAsUser=0)')


def test_a_pod_over_a_resource_quota_is_403_exceeded_quota(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go: admission.NewForbidden(a,
    # fmt.Errorf("exceeded quota: %s, requested: %s, used: %s, limited: %s", ...)); Pods in a
    # terminal phase do not count (the Pod evaluator). The quota frees up when Pods go.
    core.create_namespaced_resource_quota(NS, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="proxies"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})))
    core.create_namespaced_pod(NS, pod("squid-1"))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("squid-2"))
    assert caught.value.status == 403
    answer = status_of(caught.value)
    assert (answer["reason"], answer["message"]) == (
        "Forbidden", ('pods "squid-2" is forbidden: exceeded quota: proxies, requested: pods=1, used: pods=1, '
                     'limited: pods=1'))
    kube.kubelet_run(NS, "squid-1")
    kube.kubelet_evict(NS, "squid-1")  # Failed: no longer counted
    core.create_namespaced_pod(NS, pod("squid-2"))


def service(name: str, kind: str, **spec: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": kind, "selector": {"app": name}, "ports": [{"port": 3128, "targetPort": "proxy"}],
                     **spec}}


def test_services_get_a_cluster_ip_and_node_ports_from_the_range(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # pkg/registry/core/service/storage: a cluster IP from --service-cluster-ip-range, a nodePort
    # per port of a NodePort or LoadBalancer Service from --service-node-port-range (30000-32767,
    # unique: "provided port is already allocated"), externalTrafficPolicy defaulting to Cluster,
    # a healthCheckNodePort for LoadBalancer + Local. status.loadBalancer stays empty until the
    # cloud's service controller writes the address.
    node_port = core.create_namespaced_service(NS, cast(Any, service("np", "NodePort")))
    assert node_port.spec is not None and node_port.spec.ports is not None
    assert node_port.spec.cluster_ip and node_port.spec.external_traffic_policy == "Cluster"
    assert 30000 <= (node_port.spec.ports[0].node_port or 0) <= 32767
    balanced = core.create_namespaced_service(NS, cast(Any, service("lb", "LoadBalancer",
                                                                    externalTrafficPolicy="Local")))
    assert balanced.spec is not None and balanced.spec.health_check_node_port
    assert balanced.status is not None and balanced.status.load_balancer is not None
    assert balanced.status.load_balancer.ingress is None
    taken = node_port.spec.ports[0].node_port
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_service(NS, cast(Any, service("np2", "NodePort", ports=[
            {"port": 3128, "targetPort": "proxy", "nodePort": taken}])))
    assert caught.value.status == 422
    assert "provided port is already allocated" in status_of(caught.value)["message"]
    kube.provision_load_balancer(NS, "lb", ip="198.51.100.20")
    read = core.read_namespaced_service("lb", NS)
    assert read.status is not None and read.status.load_balancer is not None
    assert [i.ip for i in read.status.load_balancer.ingress or []] == ["198.51.100.20"]


def test_services_validate_source_ranges_and_node_port_allocation_as_validate_service_does(
        core: client.CoreV1Api) -> None:
    # pkg/apis/core/validation/validation.go ValidateService: loadBalancerSourceRanges and
    # allocateLoadBalancerNodePorts only on type LoadBalancer (Forbidden), each range a CIDR
    # (IsValidCIDR); externalTrafficPolicy only on an externally accessible Service. Not checked:
    # the ranges' IP families (the cloud refuses those, below). Defaulting: ipFamilies [IPv4],
    # SingleStack, allocateLoadBalancerNodePorts true; with false no nodePort is allocated.
    def refused(body: Obj) -> str:
        with pytest.raises(ApiException) as caught:
            core.create_namespaced_service(NS, cast(Any, body))
        assert caught.value.status == 422
        return str(status_of(caught.value)["message"])

    assert refused(service("np", "NodePort", loadBalancerSourceRanges=["203.0.113.0/24"])) == (
        'Service "np" is invalid: spec.LoadBalancerSourceRanges: Forbidden: may only be used when `type` is '
        "'LoadBalancer'")
    assert refused(service("np", "NodePort", allocateLoadBalancerNodePorts=False)) == (
        'Service "np" is invalid: spec.allocateLoadBalancerNodePorts: Forbidden: may only be used when `type` is '
        "'LoadBalancer'")
    assert refused(service("lb", "LoadBalancer", loadBalancerSourceRanges=["203.0.113.7"])) == (
        'Service "lb" is invalid: spec.LoadBalancerSourceRanges[0]: Invalid value: "203.0.113.7": must be a valid '
        "CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)")
    assert refused(service("cip", "ClusterIP", externalTrafficPolicy="Local")) == (
        'Service "cip" is invalid: spec.externalTrafficPolicy: Invalid value: "Local": may only be set for '
        "externally-accessible services")
    mixed = core.create_namespaced_service(NS, cast(Any, service(
        "mixed", "LoadBalancer", externalTrafficPolicy="Local",
        loadBalancerSourceRanges=["203.0.113.0/24", "fc00::/7"])))
    assert mixed.spec is not None and mixed.spec.ports is not None
    assert (mixed.spec.ip_families, mixed.spec.ip_family_policy) == (["IPv4"], "SingleStack")
    assert mixed.spec.allocate_load_balancer_node_ports is True and mixed.spec.ports[0].node_port
    no_ports = core.create_namespaced_service(NS, cast(Any, service(
        "lb", "LoadBalancer", externalTrafficPolicy="Local", allocateLoadBalancerNodePorts=False,
        loadBalancerSourceRanges=["203.0.113.0/24"])))
    assert no_ports.spec is not None and no_ports.spec.ports is not None
    assert no_ports.spec.ports[0].node_port is None and no_ports.spec.health_check_node_port


def test_the_cloud_refuses_a_source_range_of_a_family_the_service_lacks(kube: KubeEmulator,
                                                                         core: client.CoreV1Api) -> None:
    # The API accepts an IPv6 range on a single-stack IPv4 Service; the cloud's service controller
    # cannot put it in an IPv4 firewall (AWS: "error authorizing security group ingress:
    # InvalidParameterValue: CIDR block ... is malformed", kubernetes/kubernetes#67551): the Service
    # never gets an address, and a Warning Event says why.
    core.create_namespaced_service(NS, cast(Any, service(
        "mixed", "LoadBalancer", loadBalancerSourceRanges=["203.0.113.0/24", "fc00::/7"])))
    core.create_namespaced_service(NS, cast(Any, service("v4", "LoadBalancer",
                                                         loadBalancerSourceRanges=["203.0.113.0/24"])))
    kube.provision_load_balancer(NS, "mixed", ip="198.51.100.20")
    kube.provision_load_balancer(NS, "v4", ip="198.51.100.21")
    mixed = core.read_namespaced_service("mixed", NS)
    assert mixed.status is not None and mixed.status.load_balancer is not None
    assert mixed.status.load_balancer.ingress is None
    (event,) = [e for e in core.list_namespaced_event(NS).items if e.involved_object.name == "mixed"]
    assert (event.type, event.reason) == ("Warning", "SyncLoadBalancerFailed")
    assert "CIDR block fc00::/7 is malformed" in (event.message or "")
    v4 = core.read_namespaced_service("v4", NS)
    assert v4.status is not None and v4.status.load_balancer is not None
    assert [i.ip for i in v4.status.load_balancer.ingress or []] == ["198.51.100.21"]


def test_nodes_report_their_addresses_and_a_pods_host_ip_is_its_nodes_internal_ip(
        kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # core/v1 NodeAddress: InternalIP, ExternalIP, Hostname in status.addresses; the kubelet
    # reports the node's primary InternalIP as each Pod's status.hostIP.
    kube.add_node("worker-1", "10.0.0.11", external_ip="198.51.100.11")
    kube.add_node("worker-2", "10.0.0.12")
    nodes = {n.metadata.name: [(a.type, a.address) for a in n.status.addresses or []]
             for n in core.list_node().items if n.metadata and n.status}
    assert nodes == {"worker-1": [("InternalIP", "10.0.0.11"), ("ExternalIP", "198.51.100.11"),
                                  ("Hostname", "worker-1")],
                     "worker-2": [("InternalIP", "10.0.0.12"), ("Hostname", "worker-2")]}
    core.create_namespaced_pod(NS, pod("squid-1"))
    running = kube.kubelet_run(NS, "squid-1", node="worker-1")
    assert running["status"]["hostIP"] == "10.0.0.11"


def test_a_quota_the_controller_has_not_counted_yet_is_403_status_unknown(kube: KubeEmulator,
                                                                         core: client.CoreV1Api) -> None:
    # k8s.io/apiserver resourcequota/controller.go CheckRequest: a quota whose status.hard names a
    # resource that status.used does not (hasUsageStats false) refuses every matching create:
    # "status unknown for quota: <name>, resources: <names>", until the quota controller syncs.
    core.create_namespaced_resource_quota(NS, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="proxies"), spec=client.V1ResourceQuotaSpec(hard={"pods": "5"})))
    kube.quota_unsynced(NS, "proxies")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("squid-1"))
    answer = status_of(caught.value)
    assert (caught.value.status, answer["reason"], answer["message"]) == (
        403, "Forbidden", 'pods "squid-1" is forbidden: status unknown for quota: proxies, resources: pods')
    kube.quota_synced(NS, "proxies")
    core.create_namespaced_pod(NS, pod("squid-1"))


def test_a_node_that_stops_reporting_leaves_its_pods_running_not_ready_then_terminating(
        kube: KubeEmulator, core: client.CoreV1Api) -> None:
    # pkg/controller/nodelifecycle: once the node's Ready condition is Unknown, MarkPodsNotReady
    # (pkg/controller/util/node) sets only each Pod's Ready condition to False; the phase stays
    # Running (nothing sets Unknown). The DefaultTolerationSeconds tolerations (300 s) then let
    # the taint eviction controller delete the Pods; with no kubelet to confirm they stay
    # terminating until the node is back.
    kube.freeze_clock()
    core.create_namespaced_pod(NS, grace_pod("squid-1"))
    kube.kubelet_run(NS, "squid-1", node="worker-3")
    kube.node_lost("worker-3")
    read = core.read_namespaced_pod("squid-1", NS)
    assert read.status is not None and read.status.phase == "Running"
    conditions = {c.type: c.status for c in read.status.conditions or []}
    assert (conditions["Ready"], conditions["ContainersReady"]) == ("False", "True")
    assert read.metadata is not None and read.metadata.deletion_timestamp is None
    kube.advance(300)
    kube.advance(3600)  # far past the grace period: still there, terminating
    read = core.read_namespaced_pod("squid-1", NS)
    assert read.metadata is not None and read.metadata.deletion_timestamp is not None
    assert read.status is not None and read.status.phase == "Running"
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items if p.metadata] == ["squid-1"]
    kube.node_returns("worker-3")
    assert core.list_namespaced_pod(NS).items == []
