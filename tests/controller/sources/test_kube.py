"""KubeStore against the Kubernetes API emulator, through the real ``kubernetes`` client.

The store is the controller's only way to read and write Proxies in a cluster, so each
behaviour the reconcile logic relies on is proved here over HTTP: listing and watching
(including resume and 410 expiry), optimistic writes of metadata and status, finalizers
holding a deleted Proxy, best-effort Events, and the mapping of HTTP statuses to errors.
"""

from __future__ import annotations

import copy
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from egress_proxies.resources.proxy import (
    API_VERSION,
    FINALIZER,
    GROUP,
    KIND,
    PLURAL,
    SPEC_HASH_ANNOTATION,
    VERSION,
    Proxy,
)
from egress_proxies.sources.kube import (
    NO_CLUSTER_MESSAGE,
    KubeLeases,
    KubeSecrets,
    KubeStore,
    NoClusterConfig,
    kube_client,
    paged_list,
)
from egress_proxies.sources.store import Conflict, Gone, StoreError, WatchEvent, WatchExpired
from support.kube.emulator import KubeEmulator
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

NS = "crawlers"
Obj = dict[str, Any]
# What ``create`` stores: its spec with the CRD schema's defaults filled in by the API server.
STORED_SPEC = {"provider": "home-kvm", "port": 3128, "cloudInitEncoding": "plain", "auth": "basic"}


@pytest.fixture(autouse=True)
def namespaces(kube: KubeEmulator) -> None:
    """The namespaces the Proxies here live in (the API refuses objects in a missing one)."""
    for namespace in (NS, "other"):
        kube.create_namespace(namespace)


@pytest.fixture
def store(api: client.ApiClient) -> KubeStore:
    return KubeStore(api)


def create(api: client.ApiClient, name: str, namespace: str = NS, **metadata: Any) -> Obj:
    """A Proxy made by someone else (a user, kubectl), straight through the client."""
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, **metadata},
            "spec": {"provider": "home-kvm", "port": 3128}}
    return cast(Obj, client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body))


def delete(api: client.ApiClient, name: str, namespace: str = NS) -> None:
    client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def stored(kube: KubeEmulator, name: str, namespace: str = NS) -> Obj | None:
    return kube.get_object(f"{PLURAL}.{GROUP}", namespace, name)


def summary(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(event.type, event.proxy.key) for event in events]


# -- reading ---------------------------------------------------------------------------------


def test_list_returns_proxies_of_every_namespace_and_a_resumable_version(
        api: client.ApiClient, kube: KubeEmulator, store: KubeStore) -> None:
    created = create(api, "eu-1", labels={"team": "crawl"})
    create(api, "us-1", namespace="other")

    proxies, version = store.list_proxies()

    assert sorted(p.key for p in proxies) == ["crawlers/eu-1", "other/us-1"]
    assert version == str(kube.resource_version)
    eu = next(p for p in proxies if p.name == "eu-1")
    assert (eu.uid, eu.resource_version, eu.generation) == (
        created["metadata"]["uid"], created["metadata"]["resourceVersion"], 1)
    assert eu.spec == STORED_SPEC
    assert eu.raw is not None and eu.raw["metadata"]["labels"] == {"team": "crawl"}


def test_a_namespaced_store_sees_only_its_namespace(api: client.ApiClient) -> None:
    create(api, "eu-1")
    create(api, "us-1", namespace="other")

    proxies, _ = KubeStore(api, namespace="other").list_proxies()

    assert [p.key for p in proxies] == ["other/us-1"]


def test_get_reads_fresh_and_a_missing_proxy_is_gone(api: client.ApiClient, store: KubeStore) -> None:
    create(api, "eu-1")

    assert store.get_proxy(NS, "eu-1").key == "crawlers/eu-1"
    with pytest.raises(Gone, match="not found"):
        store.get_proxy(NS, "nope")


# -- watching --------------------------------------------------------------------------------


def test_watch_replays_changes_after_a_version_and_resumes_from_any_event(
        api: client.ApiClient, store: KubeStore) -> None:
    _, version = store.list_proxies()
    proxy = store.get_proxy(NS, create(api, "eu-1")["metadata"]["name"])
    proxy.finalizers.append(FINALIZER)
    proxy = store.replace_metadata(proxy)
    proxy.finalizers.clear()
    store.replace_metadata(proxy)
    delete(api, "eu-1")

    # The server ends the stream after timeoutSeconds, so the iterator ends by itself.
    events = list(store.watch_proxies(version, timeout_seconds=1))

    assert summary(events) == [("ADDED", "crawlers/eu-1"), ("MODIFIED", "crawlers/eu-1"),
                               ("MODIFIED", "crawlers/eu-1"), ("DELETED", "crawlers/eu-1")]
    assert events[1].proxy.finalizers == [FINALIZER]
    resumed = list(store.watch_proxies(events[2].proxy.resource_version, timeout_seconds=1))
    assert summary(resumed) == [("DELETED", "crawlers/eu-1")]


def test_watch_streams_live_changes(api: client.ApiClient, kube: KubeEmulator, store: KubeStore) -> None:
    _, version = store.list_proxies()
    seen: list[WatchEvent] = []

    def consume() -> None:
        for event in store.watch_proxies(version, timeout_seconds=10):
            seen.append(event)
            return  # closing the iterator early must release the stream

    watcher = threading.Thread(target=consume)
    watcher.start()
    kube.wait_for_watchers(1)
    create(api, "eu-1")
    watcher.join(timeout=5)

    assert not watcher.is_alive()
    assert summary(seen) == [("ADDED", "crawlers/eu-1")]
    kube.wait_for_watchers(0)  # the server saw the stream closed


def recording_list(api: client.ApiClient, calls: list[dict[str, Any]],
                   between_pages: Callable[[int], object]) -> Callable[..., object]:
    """The cluster-wide list call, each call's paging arguments recorded in ``calls``;
    ``between_pages(n)`` runs before the n-th call from the second on."""
    def listing(*args: Any, **kwargs: Any) -> object:
        calls.append(kwargs)
        if len(calls) > 1:
            between_pages(len(calls))
        return client.CustomObjectsApi(api).list_cluster_custom_object(*args, **kwargs)
    return listing


def test_a_list_is_read_in_pages_of_one_snapshot(api: client.ApiClient, kube: KubeEmulator) -> None:
    for number in range(7):
        create(api, f"p-{number}")
    pages: list[dict[str, Any]] = []
    # Written between pages, and named to come after every page's start key: only the snapshot
    # keeps them out.
    listing = recording_list(api, pages, lambda n: create(api, f"z-late-{n}"))

    items, version = paged_list("listing proxies", 10, listing, GROUP, VERSION, PLURAL, page_size=3)
    assert [item["metadata"]["name"] for item in items] == [f"p-{number}" for number in range(7)]
    assert [page["limit"] for page in pages] == [3, 3, 3]
    assert "_continue" not in pages[0] and all(page["_continue"] for page in pages[1:])
    assert int(version) < kube.resource_version


def test_a_list_whose_continue_token_expired_is_read_again(api: client.ApiClient, kube: KubeEmulator) -> None:
    for number in range(5):
        create(api, f"p-{number}")
    calls: list[dict[str, Any]] = []

    def write_and_compact(call: int) -> None:
        if call == 2:  # written and compacted away since the first page: 410 for its token
            create(api, "late")
            kube.compact()

    listing = recording_list(api, calls, write_and_compact)
    items, _version = paged_list("listing proxies", 10, listing, GROUP, VERSION, PLURAL, page_size=2)
    assert sorted(item["metadata"]["name"] for item in items) == ["late", *(f"p-{number}" for number in range(5))]
    assert "_continue" not in calls[2]  # started over from the first page


def test_watch_from_a_compacted_version_is_expired(api: client.ApiClient, kube: KubeEmulator,
                                                   store: KubeStore) -> None:
    _, version = store.list_proxies()
    create(api, "eu-1")
    kube.compact()

    with pytest.raises(WatchExpired, match="410"):
        list(store.watch_proxies(version, timeout_seconds=1))


# -- metadata writes -------------------------------------------------------------------------


def test_replace_metadata_adds_and_removes_our_finalizer_and_keeps_the_rest(
        api: client.ApiClient, kube: KubeEmulator, store: KubeStore) -> None:
    create(api, "eu-1", labels={"team": "crawl"}, annotations={"note": "theirs"})
    proxy = store.get_proxy(NS, "eu-1")

    proxy.finalizers.append(FINALIZER)
    proxy.annotations[SPEC_HASH_ANNOTATION] = "0123456789abcdef"
    proxy.spec["port"] = 9999  # only finalizers and annotations are written
    written = store.replace_metadata(proxy)

    obj = stored(kube, "eu-1")
    assert obj is not None
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    assert obj["metadata"]["annotations"] == {"note": "theirs", SPEC_HASH_ANNOTATION: "0123456789abcdef"}
    assert obj["metadata"]["labels"] == {"team": "crawl"}
    assert obj["spec"] == STORED_SPEC
    assert written.resource_version == obj["metadata"]["resourceVersion"] != proxy.resource_version

    written.finalizers.remove(FINALIZER)
    store.replace_metadata(written)
    obj = stored(kube, "eu-1")
    assert obj is not None and "finalizers" not in obj["metadata"]


def test_replace_metadata_at_a_stale_version_conflicts(api: client.ApiClient, kube: KubeEmulator,
                                                       store: KubeStore) -> None:
    create(api, "eu-1")
    stale = store.get_proxy(NS, "eu-1")
    fresh = store.get_proxy(NS, "eu-1")
    fresh.annotations["someone"] = "else"
    store.replace_metadata(fresh)

    stale.finalizers.append(FINALIZER)
    with pytest.raises(Conflict, match="409"):
        store.replace_metadata(stale)
    obj = stored(kube, "eu-1")
    assert obj is not None and "finalizers" not in obj["metadata"]


def test_a_proxy_built_by_hand_is_written_over_a_fresh_read(api: client.ApiClient, kube: KubeEmulator,
                                                           store: KubeStore) -> None:
    created = create(api, "eu-1", labels={"team": "crawl"})
    meta = created["metadata"]
    by_hand = Proxy(namespace=NS, name="eu-1", uid=meta["uid"], spec={}, resource_version=meta["resourceVersion"],
                    finalizers=[FINALIZER])

    store.replace_metadata(by_hand)

    obj = stored(kube, "eu-1")
    assert obj is not None
    assert (obj["metadata"]["finalizers"], obj["metadata"]["labels"]) == ([FINALIZER], {"team": "crawl"})
    assert obj["spec"] == STORED_SPEC  # not the hand-built empty spec
    with pytest.raises(Conflict, match="changed since it was read"):
        store.replace_metadata(by_hand)  # its resourceVersion is now stale


def test_a_deleted_proxy_is_held_by_our_finalizer_until_we_remove_it(
        api: client.ApiClient, kube: KubeEmulator, store: KubeStore) -> None:
    create(api, "eu-1")
    proxy = store.get_proxy(NS, "eu-1")
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)

    delete(api, "eu-1")

    deleting = store.get_proxy(NS, "eu-1")
    assert deleting.deleting and deleting.finalizers == [FINALIZER]
    deleting.finalizers.remove(FINALIZER)
    store.replace_metadata(deleting)
    assert stored(kube, "eu-1") is None
    with pytest.raises(Gone):
        store.get_proxy(NS, "eu-1")


# -- status writes ---------------------------------------------------------------------------


def test_replace_status_writes_only_the_status(api: client.ApiClient, kube: KubeEmulator, store: KubeStore) -> None:
    create(api, "eu-1")
    proxy = store.get_proxy(NS, "eu-1")

    proxy.status = {"phase": "Ready", "ip": "192.0.2.10", "endpoint": "192.0.2.10:3128", "observedGeneration": 1}
    proxy.spec["port"] = 9999  # a spec change smuggled through the status write is ignored
    written = store.replace_status(proxy)

    obj = stored(kube, "eu-1")
    assert obj is not None
    assert obj["status"] == proxy.status
    assert obj["spec"] == STORED_SPEC
    assert obj["metadata"]["generation"] == 1
    assert written.status == proxy.status and written.spec["port"] == 3128


def test_changing_a_proxy_in_place_leaves_the_object_it_was_read_from_alone(
        api: client.ApiClient, store: KubeStore) -> None:
    """A read Proxy keeps the object as the API sent it (``raw``, what a write sends back for
    everything it did not change); its spec, status and metadata are its own, nested values too."""
    body = {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "eu-1", "annotations": {"team": "crawl"}, "finalizers": ["example.com/keep"]},
            "spec": {"provider": "home-kvm", "allowedSources": ["10.0.0.0/8"], "probe": {"url": "http://a.test/"}}}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    proxy = store.get_proxy(NS, "eu-1")
    proxy.status = {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True", "reason": "Serving",
                                                     "message": "ok", "lastTransitionTime": "2026-12-03T21:00:00Z"}]}
    store.replace_status(proxy)
    (proxy,), _ = store.list_proxies()
    assert proxy.raw is not None
    before = copy.deepcopy(proxy.raw)

    proxy.spec["allowedSources"].append("0.0.0.0/0")
    proxy.spec["probe"]["url"] = "http://b.test/"
    proxy.status["conditions"][0]["status"] = "False"
    proxy.annotations["team"] = "other"
    proxy.finalizers.append(FINALIZER)

    assert proxy.raw == before


def test_replace_status_at_a_stale_version_conflicts(api: client.ApiClient, kube: KubeEmulator,
                                                     store: KubeStore) -> None:
    create(api, "eu-1")
    stale = store.get_proxy(NS, "eu-1")
    fresh = store.get_proxy(NS, "eu-1")
    fresh.status = {"phase": "Provisioning"}
    store.replace_status(fresh)

    stale.status = {"phase": "Ready"}
    with pytest.raises(Conflict):
        store.replace_status(stale)
    obj = stored(kube, "eu-1")
    assert obj is not None and obj["status"] == {"phase": "Provisioning"}


# -- events ----------------------------------------------------------------------------------


def test_record_event_describes_the_proxy(api: client.ApiClient, store: KubeStore) -> None:
    proxy = store.get_proxy(NS, create(api, "eu-1")["metadata"]["name"])

    store.record_event(proxy, "Warning", "CreateFailed", "transient: host down")

    events = client.CoreV1Api(api).list_namespaced_event(NS).items
    assert len(events) == 1
    event = events[0]
    assert event.metadata.name is not None and event.metadata.name.startswith("eu-1.")
    involved = event.involved_object
    assert (involved.api_version, involved.kind, involved.namespace, involved.name, involved.uid) == (
        API_VERSION, KIND, NS, "eu-1", proxy.uid)
    assert (event.reason, event.message, event.type, event.count) == (
        "CreateFailed", "transient: host down", "Warning", 1)
    assert event.source is not None and event.source.component == "egress-proxies"
    assert event.first_timestamp is not None and event.first_timestamp == event.last_timestamp


def test_record_event_never_raises(api: client.ApiClient, kube: KubeEmulator, store: KubeStore,
                                   caplog: pytest.LogCaptureFixture) -> None:
    proxy = store.get_proxy(NS, create(api, "eu-1")["metadata"]["name"])
    kube.fail_next("POST", ".*/events", 500)

    with caplog.at_level(logging.WARNING, logger="egress_proxies.sources.kube"):
        store.record_event(proxy, "Normal", "Created", "instance created")

    assert "event not recorded (Created: instance created)" in caplog.text
    assert "HTTP 500" in caplog.text
    assert client.CoreV1Api(api).list_namespaced_event(NS).items == []


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error"), [
    (403, StoreError), (404, Gone), (409, Conflict), (410, WatchExpired), (500, StoreError)])
def test_http_statuses_map_to_store_errors(api: client.ApiClient, kube: KubeEmulator, store: KubeStore,
                                           status: int, error: type[StoreError]) -> None:
    create(api, "eu-1")
    proxy = store.get_proxy(NS, "eu-1")
    kube.fail_next("PUT", f"/namespaces/{NS}/proxies/eu-1$", status, message="injected")

    with pytest.raises(StoreError, match=f"HTTP {status}: injected") as raised:
        store.replace_metadata(proxy)

    assert type(raised.value) is error


def test_throttling_beyond_the_retries_is_a_store_error(kube: KubeEmulator, tmp_path: Path) -> None:
    # bounded_call retries a 429 with Retry-After three times (the client from kube_client
    # never retries by itself); the fourth reaches us.
    api_client = kube_client(str(write_kubeconfig(tmp_path / "config", kube.url)))
    kube.fail_next("GET", f"/{PLURAL}$", 429, count=4, retry_after=0)
    try:
        with pytest.raises(StoreError, match="429") as raised:
            KubeStore(api_client).list_proxies()
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    assert type(raised.value) is StoreError


def test_an_unreachable_server_is_a_store_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api_client = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        with pytest.raises(StoreError, match="Connection refused") as raised:
            KubeStore(api_client).list_proxies()
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    assert type(raised.value) is StoreError


# -- client configuration --------------------------------------------------------------------


def test_kube_client_from_a_kubeconfig(kube: KubeEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A kubeconfig given explicitly wins even inside a cluster.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: emu, cluster: {{server: "{kube.url}"}}}}]
users: [{{name: me, user: {{token: secret}}}}]
contexts: [{{name: emu, context: {{cluster: emu, user: me}}}}]
current-context: emu
""")
    api_client = kube_client(str(kubeconfig))
    try:
        create(api_client, "eu-1")
        proxies, _ = KubeStore(api_client).list_proxies()
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    assert [p.key for p in proxies] == ["crawlers/eu-1"]
    assert kubeconfig.read_text().count("secret") == 1  # never rewritten


def test_kube_client_in_a_cluster_uses_the_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    # No service account is mounted here, so the in-cluster loader's own complaint proves
    # that it, and not the kubeconfig loader, was used.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    with pytest.raises(StoreError, match="Service token file does not exist"):
        kube_client()


def test_kube_client_with_an_unreadable_kubeconfig_is_a_store_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(StoreError, match="kubernetes client configuration"):
        kube_client(str(tmp_path / "missing"))


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: me, user: {{token: secret}}}}]
contexts: [{{name: c, context: {{cluster: c, user: me}}}}]
current-context: c
""")
    return path


@pytest.fixture
def silent_api_server() -> Iterator[str]:
    """An "API server" on 127.0.0.1 that accepts connections and never answers a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    server.close()


def test_the_timeout_bounds_a_whole_call_against_a_server_that_never_answers(silent_api_server: str,
                                                                             tmp_path: Path) -> None:
    # Before: every attempt of the client's own retries got a fresh timeout (4 x 30 s = 121 s).
    api_client = kube_client(str(write_kubeconfig(tmp_path / "config", silent_api_server)))
    try:
        calls: dict[str, Callable[[], object]] = {
            "list": KubeStore(api_client, request_timeout=2).list_proxies,
            "get": lambda: KubeStore(api_client, request_timeout=2).get_proxy(NS, "eu-1"),
            "lease": lambda: KubeLeases(api_client, request_timeout=2).get("egress-proxies", "leader"),
        }
        for name, call in calls.items():
            started = time.monotonic()
            with pytest.raises(StoreError, match="timed out"):
                call()
            elapsed = time.monotonic() - started
            assert 1.9 < elapsed < 3.0, f"{name}: {elapsed:.1f} s"
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def test_throttling_is_retried_within_the_timeout(kube: KubeEmulator, tmp_path: Path) -> None:
    api_client = kube_client(str(write_kubeconfig(tmp_path / "config", kube.url)))
    try:
        # Two 429s are retried after the Retry-After the server asked for ...
        kube.fail_next("GET", f"/{PLURAL}$", 429, count=2, retry_after=0)
        proxies, version = KubeStore(api_client).list_proxies()
        assert proxies == [] and version
        # ... but a Retry-After beyond what is left of the timeout fails at once, not after it.
        kube.fail_next("GET", f"/{PLURAL}$", 429, count=1, retry_after=60)
        started = time.monotonic()
        with pytest.raises(StoreError, match="429"):
            KubeStore(api_client, request_timeout=5).list_proxies()
        assert time.monotonic() - started < 1
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def test_without_kubeconfig_outside_a_cluster_the_error_is_one_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    with pytest.raises(NoClusterConfig) as raised:
        kube_client()
    assert str(raised.value) == NO_CLUSTER_MESSAGE
    assert "\n" not in str(raised.value) and "KUBERNETES_SERVICE_HOST unset" in str(raised.value)
    assert isinstance(raised.value, StoreError)


# -- namespaces and the credentials' Secrets (issue 26, row 10) ----------------------------------


def test_namespace_identities_are_the_uids_of_those_that_exist(kube: KubeEmulator, api: client.ApiClient,
                                                               store: KubeStore) -> None:
    uid = cast(Obj, kube.get_object("namespaces", None, NS))["metadata"]["uid"]
    other = cast(Obj, kube.get_object("namespaces", None, "other"))["metadata"]["uid"]
    assert store.namespace_identities({NS, "other", "missing"}) == {NS: uid, "other": other}
    assert store.namespace_identities(set()) == {}
    # One namespace watched: that one only, read on its own.
    assert KubeStore(api, namespace=NS).namespace_identities({NS, "other"}) == {NS: uid}
    assert KubeStore(api, namespace="missing").namespace_identities({"missing"}) == {}


def test_a_namespace_made_again_has_another_identity(kube: KubeEmulator, api: client.ApiClient,
                                                     store: KubeStore) -> None:
    before = store.namespace_identities({"other"})
    client.CoreV1Api(api).delete_namespace("other")
    wait_for(lambda: not store.namespace_identities({"other"}), 10, "the namespace to be removed")
    kube.create_namespace("other")
    assert store.namespace_identities({"other"}).keys() == before.keys()
    assert store.namespace_identities({"other"}) != before


def test_listing_namespaces_that_fails_is_a_store_error(kube: KubeEmulator, store: KubeStore) -> None:
    kube.fail_next("GET", r"^/api/v1/namespaces$", 403, message="namespaces is forbidden")
    with pytest.raises(StoreError, match="listing namespaces: HTTP 403: namespaces is forbidden"):
        store.namespace_identities({NS})


def test_credential_secrets_are_listed_by_their_label_and_deleted(kube: KubeEmulator, api: client.ApiClient) -> None:
    kube.create_namespace("egress-proxies")
    secrets = KubeSecrets(api, "egress-proxies")
    secrets.save("crawlers", {"user": "crawl-crawlers", "password": "p"})
    secrets.save("other", {"user": "crawl-other"})
    # A Secret that carries the label but was not named by the controller is not one of its records.
    client.CoreV1Api(api).create_namespaced_secret("egress-proxies", client.V1Secret(metadata=client.V1ObjectMeta(
        name="lookalike", labels={KubeSecrets.PROXY_NAMESPACE: "team-b"}), string_data={"user": "x"}))
    client.CoreV1Api(api).patch_namespaced_secret(KubeSecrets.secret_name("other"), "egress-proxies", {
        "metadata": {"annotations": {KubeSecrets.ROTATE_ANNOTATION: "yes"}}})
    assert secrets.load_all() == {"crawlers": ({"user": "crawl-crawlers", "password": "p"}, False),
                                  "other": ({"user": "crawl-other"}, True)}
    secrets.delete("crawlers")
    secrets.delete("crawlers")  # gone already: what was asked
    assert set(secrets.load_all()) == {"other"} and secrets.load("crawlers") is None
