"""ProxyPools end to end (issue 18): the real reconciler with the real ``AnsibleRunner`` and the
collection's modules, the Kubernetes API emulator (Proxy and ProxyPool CRDs, the scale
subresource) and two libvirt test-driver daemons as two KVM hosts of two providers.

The test driver's addresses are made up, so both providers say ``probe: none`` (nothing is sent
to them) and Ready means running with an address. Every count below is read back from the API.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess, ServerSettings, TokenScopes
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.pool import PLACEMENT_LABEL, POOL_LABEL, POOL_PLURAL, QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from egress_proxies.sources.kube import KubePools, KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.pools import PoolReconciler
from egress_proxies.sweep.quarantine import Quarantine
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, BaseImage, kvm_host
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd

NAMESPACE = "crawlers"
POOL_CRD_PATH = Path(__file__).resolve().parents[3] / "controller" / "manifests" / "crd-proxypool.yaml"
TOKEN = "operator-token-for-pool-tests"
CRAWLER_TOKEN = "crawler-token-for-pool-tests"
OTHER_TOKEN = "other-team-token-for-pool-tests"
TEST_DRIVER_POOL = "default-pool"


def as_obj(value: object) -> dict[str, Any]:
    """The client's untyped answer (a dict for custom objects), typed for the assertions."""
    assert isinstance(value, dict)
    return value


def pool_crd() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load(POOL_CRD_PATH.read_text()))


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator(crds=[proxy_crd(), pool_crd()]) as emulator:
        emulator.create_namespace(NAMESPACE)
        yield emulator


@pytest.fixture
def api(kube: KubeEmulator) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=kube.url)) as api_client:
        yield api_client


def provider(name: str, host: str, daemon: LibvirtTestDaemon, image: BaseImage) -> dict[str, Any]:
    return {"name": name, "type": "kvm", "probe": "none", "kvm": {
        "hosts": [kvm_host(host, daemon.uri, pool=TEST_DRIVER_POOL)],
        "images": {"debian-12": {"url": image.url, "sha256": image.sha256, "format": "qcow2"}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}},
        "defaultMachineType": "small", "defaultImage": "debian-12"}}


def write_config(path: Path, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon], image: BaseImage,
                 break_b: bool = False, unreachable_b: bool = False) -> Path:
    second = provider("kvm-b", "h2", hosts[1], image)
    if break_b:
        second["kvm"]["hosts"] = "not-a-list"  # an invalid section: only kvm-b is unusable
    if unreachable_b:  # a valid section whose host does not answer: kvm-b's listing fails
        gone = hosts[1].socket_path.with_name("nobody-listens-here")
        second["kvm"]["hosts"][0]["uri"] = f"test+unix:///default?socket={gone}"
    path.write_text(yaml.safe_dump({"owner": OWNER, "providers": [provider("kvm-a", "h1", hosts[0], image),
                                                                  second]}))
    return path


class PoolClock:
    """The pool reconciler's clock: the wall clock, moved on by ``advance``, so a placement's
    hysteresis passes when the test says so rather than by sleeping it out."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew

    def advance(self, seconds: float) -> None:
        self.skew += seconds


def reconciler(api: client.ApiClient, config: Path, work: Path,
               pool_clock: Callable[[], float] = time.time) -> Reconciler:
    store = KubeStore(api)
    runner = AnsibleRunner(work, timeout_seconds=120, max_concurrent=2, collections_path=collections_path())
    return Reconciler(store, runner, str(config),
                      parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0),
                                       pools=PoolReconciler(KubePools(api), store, now=pool_clock)))


def create_pool(objects: client.CustomObjectsApi, name: str, spec: dict[str, Any]) -> None:
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})


def get_pool(objects: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, name))


def members(objects: client.CustomObjectsApi, pool: str) -> list[dict[str, Any]]:
    listing = objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                    label_selector=f"{POOL_LABEL}={pool}")
    return cast(list[dict[str, Any]], as_obj(listing)["items"])


def serving(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Members a crawler may use: Ready, not deleting, not quarantined."""
    return [m for m in items if (m.get("status") or {}).get("phase") == "Ready"
            and not m["metadata"].get("deletionTimestamp")
            and (m["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION)
            != m["status"].get("providerID")]


def domains(daemon: LibvirtTestDaemon) -> list[str]:
    return sorted(d.name() for d in daemon.connection.listAllDomains() if d.name() != "test")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def sweep_until(rec: Reconciler, done: Any, limit: int = 6) -> int:
    for count in range(1, limit + 1):
        assert rec.sweep().ok
        if done():
            return count
    raise AssertionError(f"not done after {limit} sweeps")


BASE_SPEC: dict[str, Any] = {"template": {"cloudInit": "#cloud-config\n"}, "placement": [
    {"provider": "kvm-a", "location": "h1", "weight": 2}, {"provider": "kvm-b", "location": "h2", "weight": 1}]}


def test_scale_from_zero_to_six_by_weight_then_through_the_scale_subresource_then_delete(
        api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
        image: BaseImage, tmp_path: Path) -> None:
    objects = client.CustomObjectsApi(api)
    rec = reconciler(api, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
    create_pool(objects, "eu", {**BASE_SPEC, "replicas": 0})
    assert rec.sweep().ok
    scale = as_obj(objects.get_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu"))
    assert (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert (scale["spec"]["replicas"], scale["status"]) == (0, {"replicas": 0, "selector": f"{POOL_LABEL}=eu"})

    objects.replace_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu", {
        "apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "eu", "namespace": NAMESPACE},
        "spec": {"replicas": 6}})
    pool = get_pool(objects, "eu")
    assert pool["spec"]["replicas"] == 6 and pool["metadata"]["generation"] == 2
    sweeps = sweep_until(rec, lambda: len(serving(members(objects, "eu"))) == 6)
    assert sweeps == 1  # the members are created first in the sweep, then get their instances
    items = members(objects, "eu")
    by_placement = sorted(m["metadata"]["labels"][PLACEMENT_LABEL] for m in items)
    assert by_placement == ["0", "0", "0", "0", "1", "1"]
    assert (len(domains(hosts[0])), len(domains(hosts[1]))) == (4, 2)
    pool = get_pool(objects, "eu")
    for member in items:
        assert member["metadata"]["name"].startswith("eu-")
        assert member["metadata"]["ownerReferences"] == [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": "eu", "uid": pool["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]
        assert member["status"].get("readySince")
    assert rec.sweep().ok  # the status after everything was Ready
    pool = get_pool(objects, "eu")
    status = pool["status"]
    assert (status["replicas"], status["readyReplicas"], status["phase"]) == (6, 6, "Ready")
    assert [(p["desired"], p["members"], p["ready"], p["state"]) for p in status["placements"]] == [
        (4, 4, 4, "Healthy"), (2, 2, 2, "Healthy")]
    # Distinct addresses (the two test-driver daemons make up the same ones: fewer than 6).
    assert status["egressIPs"] == len({m["status"]["ip"] for m in items}) >= 2
    assert condition(pool, "Available")["status"] == "True"
    assert pool["metadata"]["annotations"]["crawl.example.com/pool-serial"] == "6"
    scale = as_obj(objects.get_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu"))
    assert scale["status"]["replicas"] == 6

    # kubectl scale sends a merge patch to the scale subresource.
    objects.patch_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu",
                                                 {"spec": {"replicas": 3}})
    sweep_until(rec, lambda: len(members(objects, "eu")) == 3)
    assert sorted(m["metadata"]["labels"][PLACEMENT_LABEL] for m in members(objects, "eu")) == ["0", "0", "1"]
    assert (len(domains(hosts[0])), len(domains(hosts[1]))) == (2, 1)

    objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu")
    assert get_pool(objects, "eu")["metadata"].get("deletionTimestamp")  # held by the finalizer

    def pool_gone() -> bool:
        try:
            get_pool(objects, "eu")
        except client.ApiException as error:
            return bool(error.status == 404)
        return False

    sweep_until(rec, pool_gone, limit=4)
    assert members(objects, "eu") == []
    assert as_obj(objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL))["items"] == []
    assert domains(hosts[0]) == domains(hosts[1]) == []


def three_serving(api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon], image: BaseImage,
                  tmp_path: Path, failover_after: str,
                  pool_clock: Callable[[], float] = time.time) -> tuple[Reconciler, Path, set[str]]:
    """Pool "eu": 3 members over kvm-a (2) and kvm-b (1), maxSurge 1, all serving; the
    reconciler, the provider config's path and the members' names."""
    objects = client.CustomObjectsApi(api)
    config = write_config(tmp_path / "providers.yaml", hosts, image)
    rec = reconciler(api, config, tmp_path / "work", pool_clock)
    create_pool(objects, "eu", {**BASE_SPEC, "replicas": 3, "failoverAfter": failover_after,
                                "rotation": {"maxSurge": 1}})
    sweep_until(rec, lambda: len(serving(members(objects, "eu"))) == 3)
    return rec, config, {m["metadata"]["name"] for m in members(objects, "eu")}


def test_a_broken_placement_fails_over_within_max_surge_and_moves_back_without_churn(
        api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
        image: BaseImage, tmp_path: Path) -> None:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    clock = PoolClock()
    rec, config, seen = three_serving(api, hosts, image, tmp_path, failover_after="5s", pool_clock=clock)

    write_config(config, hosts, image, break_b=True)
    report = rec.sweep()
    assert report.ok and "kvm-b" in report.providers_failed
    items = members(objects, "eu")
    assert sorted(m["metadata"]["labels"][PLACEMENT_LABEL] for m in items) == ["0", "0", "0", "1"]
    seen |= {m["metadata"]["name"] for m in items}
    pool = get_pool(objects, "eu")
    assert condition(pool, "PlacementDegraded")["status"] == "True"
    assert "placement[1] kvm-b/h2" in condition(pool, "PlacementDegraded")["message"]
    for _ in range(2):  # no churn while it lasts: the kvm-b member is kept, nothing more is made
        assert rec.sweep().ok
        assert {m["metadata"]["name"] for m in members(objects, "eu")} == {m["metadata"]["name"] for m in items}
    assert len(serving(members(objects, "eu"))) == 3 and len(domains(hosts[1])) == 1
    assert get_pool(objects, "eu")["status"]["readyReplicas"] == 3
    reasons = [e.reason for e in core.list_namespaced_event(NAMESPACE).items if e.involved_object.kind == "ProxyPool"]
    assert reasons.count("PlacementDegraded") == 1

    write_config(config, hosts, image)
    # The first good sweep makes the kvm-b member Ready again; the next one sees it serving.
    sweep_until(rec, lambda: get_pool(objects, "eu")["status"]["placements"][1]["state"] == "Recovering", limit=2)
    assert len(members(objects, "eu")) == 4  # nothing moves on the first good sweeps
    recovering_since = clock()
    assert rec.sweep().ok
    assert len(members(objects, "eu")) == 4 or clock() - recovering_since >= 10
    clock.advance(max(0.0, 10.5 - (clock() - recovering_since)))  # 2 x failoverAfter of health
    sweep_until(rec, lambda: len(members(objects, "eu")) == 3, limit=2)
    items = members(objects, "eu")
    assert sorted(m["metadata"]["labels"][PLACEMENT_LABEL] for m in items) == ["0", "0", "1"]
    assert len(serving(items)) == 3
    assert seen == {m["metadata"]["name"] for m in items} | seen and len(seen) == 4  # one extra, ever
    assert get_pool(objects, "eu")["status"]["placements"][1]["state"] == "Healthy"


def test_a_failing_listing_fails_over_only_once_it_has_lasted_failover_after(
        api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
        image: BaseImage, tmp_path: Path) -> None:
    """One failed listing (an API blip) creates nothing: a member made elsewhere would be deleted
    again after the hysteresis. A listing failing for failoverAfter degrades the placement in
    the sweep that sees it, the view of that sweep's own listing."""
    objects = client.CustomObjectsApi(api)
    rec, config, names = three_serving(api, hosts, image, tmp_path, failover_after="4s")

    write_config(config, hosts, image, unreachable_b=True)
    report = rec.sweep()
    assert "kvm-b" in report.providers_failed
    assert {m["metadata"]["name"] for m in members(objects, "eu")} == names  # nothing created
    assert condition(get_pool(objects, "eu"), "PlacementDegraded")["status"] != "True"
    write_config(config, hosts, image)  # the blip is over
    assert rec.sweep().ok
    assert {m["metadata"]["name"] for m in members(objects, "eu")} == names
    assert len(serving(members(objects, "eu"))) == 3

    write_config(config, hosts, image, unreachable_b=True)  # now for good
    assert "kvm-b" in rec.sweep().providers_failed
    # The failure's clock started again in that sweep (the listing in between worked): by the
    # sweep's end at the latest.
    started = time.monotonic()
    assert {m["metadata"]["name"] for m in members(objects, "eu")} == names
    time.sleep(max(0.0, 4.2 - (time.monotonic() - started)))
    report = rec.sweep()
    pool = get_pool(objects, "eu")
    degraded = condition(pool, "PlacementDegraded")
    assert degraded["status"] == "True" and "kvm-b cannot be listed for" in degraded["message"], degraded
    items = members(objects, "eu")
    assert sorted(m["metadata"]["labels"][PLACEMENT_LABEL] for m in items) == ["0", "0", "0", "1"]


def test_rotation_never_drops_below_replicas_minus_max_unavailable(
        api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
        image: BaseImage, tmp_path: Path) -> None:
    objects = client.CustomObjectsApi(api)
    rec = reconciler(api, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
    create_pool(objects, "eu", {**BASE_SPEC, "replicas": 3,
                                # 1 ms: every member Ready in an earlier sweep is due, so each
                                # sweep rotates as far as maxSurge and maxUnavailable let it,
                                # with no wait for an age between sweeps.
                                "rotation": {"maxAge": "1ms", "maxSurge": 1, "maxUnavailable": 0, "jitter": 0}})
    sweep_until(rec, lambda: len(serving(members(objects, "eu"))) == 3)
    original = {m["metadata"]["name"] for m in members(objects, "eu")}
    ready_per_sweep = []
    for _ in range(16):
        assert rec.sweep().ok
        items = members(objects, "eu")
        ready_per_sweep.append(len(serving(items)))
        assert len([m for m in items if not m["metadata"].get("deletionTimestamp")]) <= 4  # maxSurge
        if original.isdisjoint(m["metadata"]["name"] for m in items):
            break
    assert original.isdisjoint(m["metadata"]["name"] for m in members(objects, "eu")), "all rotated"
    assert min(ready_per_sweep) >= 3, ready_per_sweep
    assert len(domains(hosts[0])) + len(domains(hosts[1])) <= 4


def http_call(server: ControllerHTTPServer, method: str, path: str, token: str | None,
              body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_quarantine_over_http_hides_at_once_replaces_records_and_rate_limits(
        api: client.ApiClient, hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
        image: BaseImage, tmp_path: Path) -> None:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    rec = reconciler(api, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
    # minReady 1: the pool keeps its floor without the member quarantined below, so it leaves at once.
    create_pool(objects, "eu", {"replicas": 2, "minReady": 1, "template": {}, "placement": [{"provider": "kvm-a"}]})
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "solo", "namespace": NAMESPACE},
        "spec": {"provider": "kvm-b"}})
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "nowhere", "namespace": NAMESPACE},
        "spec": {"provider": "not-configured"}})
    sweep_until(rec, lambda: len(serving(members(objects, "eu"))) == 2)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([
        {"name": "crawlers", "namespaces": [NAMESPACE],
         "sha256": hashlib.sha256(CRAWLER_TOKEN.encode()).hexdigest()},
        {"name": "others", "namespaces": ["others"],
         "sha256": hashlib.sha256(OTHER_TOKEN.encode()).hexdigest()}]))
    rec.discovery.serve_sweeps(True)  # a leader: what its sweeps publish
    access = DiscoveryAccess(TOKEN, TokenScopes(tokens), quarantine=Quarantine(rec.store, rec.discovery))
    server = ControllerHTTPServer(SweepHealth(60), rec.discovery, access, ServerSettings(quarantine_per_minute=3))
    server.start("127.0.0.1", 0)
    try:
        code, _, body = http_call(server, "GET", f"/v1/pools/{NAMESPACE}/eu/proxies", CRAWLER_TOKEN)
        listed = json.loads(body)["proxies"]
        assert code == 200 and len(listed) == 2
        victim = listed[0]["name"]
        code, _, text = http_call(server, "GET", f"/v1/pools/{NAMESPACE}/eu/proxies.txt", CRAWLER_TOKEN)
        assert code == 200 and len(text.decode().split()) == 2
        assert http_call(server, "GET", f"/v1/pools/{NAMESPACE}/eu/proxies", OTHER_TOKEN)[0] == 403
        assert http_call(server, "GET", f"/v1/pools/{NAMESPACE}/eu/proxies", "wrong")[0] == 401
        # Issue 41 row 5: a pool that does not exist is told apart from one with no member ready;
        # a token that does not cover the namespace still learns nothing (403 before the 404).
        assert http_call(server, "GET", f"/v1/pools/{NAMESPACE}/nonexistent/proxies", CRAWLER_TOKEN)[:3:2] == (
            404, f"no ProxyPool {NAMESPACE}/nonexistent\n".encode())
        assert http_call(server, "GET", f"/v1/pools/{NAMESPACE}/nonexistent/proxies", OTHER_TOKEN)[0] == 403

        path = f"/v1/proxies/{NAMESPACE}/{victim}/quarantine"
        assert http_call(server, "POST", path, "wrong", {"reason": "banned"})[0] == 401
        assert http_call(server, "POST", path, OTHER_TOKEN, {"reason": "banned"})[0] == 403
        assert http_call(server, "POST", path, CRAWLER_TOKEN, {})[0] == 400
        assert http_call(server, "POST", path, CRAWLER_TOKEN, {"reason": "x" * 513})[0] == 400
        assert http_call(server, "POST", f"/v1/proxies/{NAMESPACE}/missing/quarantine", CRAWLER_TOKEN,
                         {"reason": "banned"})[0] == 404
        code, _, body = http_call(server, "POST", path, CRAWLER_TOKEN, {"reason": "403 from example.com"})
        assert code == 200 and json.loads(body)["quarantined"] is True
        # Gone from discovery at once, before any sweep.
        code, _, body = http_call(server, "GET", f"/v1/pools/{NAMESPACE}/eu/proxies", CRAWLER_TOKEN)
        assert [p["name"] for p in json.loads(body)["proxies"]] == [listed[1]["name"]]
        code, _, body = http_call(server, "GET", "/v1/proxies", TOKEN)
        assert victim not in [p["name"] for p in json.loads(body)["proxies"]]
        # Beyond the rate: 3 a minute; every authorized, well-formed request counts (the 404 and the
        # 200 did, the 401/403/400s did not), so the third goes through and the fourth is refused.
        assert http_call(server, "POST", f"/v1/proxies/{NAMESPACE}/nowhere/quarantine", CRAWLER_TOKEN,
                         {"reason": "banned"})[0] == 409  # no instance to quarantine
        code, headers, _ = http_call(server, "POST", f"/v1/proxies/{NAMESPACE}/solo/quarantine", CRAWLER_TOKEN,
                                     {"reason": "banned"})
        assert code == 429 and int(headers["Retry-After"]) >= 1
        events = [e for e in core.list_namespaced_event(NAMESPACE).items
                  if e.involved_object.name == victim and e.reason == "Quarantined"]
        assert len(events) == 1 and events[0].type == "Warning" and "403 from example.com" in str(events[0].message)
        assert "token crawlers" in str(events[0].message)

        # The pool replaces the member: a new one first, the quarantined one deleted once it is Ready.
        sweep_until(rec, lambda: victim not in {m["metadata"]["name"] for m in members(objects, "eu")})
        items = members(objects, "eu")
        assert len(items) == 2 and len(serving(items)) == 2
        assert get_pool(objects, "eu")["status"]["readyReplicas"] == 2

        # A bare Proxy (the operator token: every namespace): its instance is replaced, the Proxy stays.
        solo = as_obj(objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "solo"))
        old_id = solo["status"]["providerID"]
        assert http_call(server, "POST", f"/v1/proxies/{NAMESPACE}/solo/quarantine", TOKEN,
                         {"reason": "captcha wall"})[0] == 200
        code, _, body = http_call(server, "GET", "/v1/proxies", TOKEN)
        assert "solo" not in [p["name"] for p in json.loads(body)["proxies"]]

        def replaced() -> bool:
            status = as_obj(objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "solo"))["status"]
            return status["phase"] == "Ready" and status["providerID"] != old_id and len(domains(hosts[1])) == 1

        sweep_until(rec, replaced)
        solo = as_obj(objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "solo"))
        reasons = [e.reason for e in core.list_namespaced_event(NAMESPACE).items if e.involved_object.name == "solo"]
        assert reasons.count("Quarantined") == 2  # the report, and the replacement it caused
        assert "crawl.example.com/quarantine-replacements" in solo["metadata"]["annotations"]
        code, _, body = http_call(server, "GET", "/v1/proxies", TOKEN)
        assert "solo" in [p["name"] for p in json.loads(body)["proxies"]]  # its new instance serves
    finally:
        server.stop()


def test_a_malformed_pool_fails_alone(kube: KubeEmulator, api: client.ApiClient,
                                      hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon], image: BaseImage,
                                      tmp_path: Path) -> None:
    objects = client.CustomObjectsApi(api)
    rec = reconciler(api, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
    # Stored before a schema existed: the API server would refuse both today.
    kube.store_unvalidated({"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
                            "metadata": {"name": "bad", "namespace": NAMESPACE},
                            "spec": {"replicas": "abc", "placement": [{"provider": "kvm-a"}]}})
    kube.store_unvalidated({"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
                            "metadata": {"name": "elsewhere", "namespace": NAMESPACE},
                            "spec": {"replicas": 1, "placement": [{"provider": "mars"}],
                                     "template": {"port": "abc"}}})
    create_pool(objects, "good", {"replicas": 2, "placement": [{"provider": "kvm-a"}]})
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "solo", "namespace": NAMESPACE},
        "spec": {"provider": "kvm-b"}})
    report = rec.sweep()
    assert report.ok and set(report.proxies_failed) == {f"pool {NAMESPACE}/bad", f"pool {NAMESPACE}/elsewhere"}
    bad = get_pool(objects, "bad")
    assert bad["status"]["phase"] == "Failed"
    available = condition(bad, "Available")
    assert (available["status"], available["reason"]) == ("False", "InvalidSpec")
    assert "spec.replicas: must be an integer >= 0 (got 'abc')" in available["message"]
    elsewhere = condition(get_pool(objects, "elsewhere"), "Available")["message"]
    assert "spec.template.port: must be an integer 1024-65535 (got 'abc')" in elsewhere, elsewhere
    assert "mars" not in elsewhere  # an unconfigured provider degrades its placement, it is no spec error
    assert members(objects, "bad") == members(objects, "elsewhere") == []
    assert len(serving(members(objects, "good"))) == 2
    solo = as_obj(objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "solo"))
    assert solo["status"]["phase"] == "Ready"
    # A template the Proxy schema refuses fails the pool, naming the template's field.
    objects.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "good", {
        **get_pool(objects, "good"), "spec": {"replicas": 2, "placement": [{"provider": "kvm-a"}],
                                              "template": {"port": 70000}}})
    assert rec.sweep().ok
    message = condition(get_pool(objects, "good"), "Available")["message"]
    assert "spec.template.port: must be an integer 1024-65535 (got 70000)" in message
    assert len(members(objects, "good")) == 2  # an invalid pool deletes nothing


def test_the_example_pool_is_admitted_and_valid(api: client.ApiClient) -> None:
    """controller/examples/proxypool-*.yaml: accepted by the API server's schema (and defaulted),
    and valid for the controller against the example provider config's providers."""
    from egress_proxies.resources.pool import parse_spec

    examples = sorted((POOL_CRD_PATH.parents[1] / "examples").glob("proxypool-*.yaml"))
    assert examples
    config = yaml.safe_load(yaml.safe_load((POOL_CRD_PATH.parent / "configmap-example.yaml").read_text())
                            ["data"]["providers.yaml"])
    names = [p["name"] for p in config["providers"]]
    objects = client.CustomObjectsApi(api)
    for path in examples:
        document = yaml.safe_load(path.read_text())
        stored = as_obj(objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, document))
        spec, errors = parse_spec(stored["spec"])
        assert errors == [] and spec is not None, (path.name, errors)
        assert {p.provider for p in spec.placements} <= set(names), path.name
        assert stored["spec"]["placement"][0].get("weight") == 2


def test_a_pool_change_reaches_the_loop_through_the_watch(api: client.ApiClient) -> None:
    """``KubePools`` is the loop's pool feed: a scale wakes the sweep instead of waiting an interval."""
    objects, pools = client.CustomObjectsApi(api), KubePools(api)
    start = pools.list_version()
    create_pool(objects, "eu", {"replicas": 1, "placement": [{"provider": "kvm-a"}]})
    objects.patch_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu",
                                                 {"spec": {"replicas": 2}})
    versions = list(pools.watch(start, 1))
    assert len(versions) == 2 and int(versions[-1]) > int(versions[0]) > int(start)


def test_the_emulators_scale_subresource_refuses_what_the_api_server_refuses(kube: KubeEmulator,
                                                                           api: client.ApiClient) -> None:
    """What tests/support/kube/emulator.py's scale subresource does beyond GET/PUT/PATCH, as
    apiextensions-apiserver does it: discovery names it (autoscaling/v1 Scale), a negative
    replica count is 422, a stale resourceVersion 409, a kind without it 404."""
    objects = client.CustomObjectsApi(api)
    create_pool(objects, "eu", {"replicas": 1, "placement": [{"provider": "kvm-a"}]})
    with urllib.request.urlopen(f"{kube.url}/apis/{GROUP}/{VERSION}", timeout=5) as answer:
        resources = json.loads(answer.read())["resources"]
    (scale,) = [r for r in resources if r["name"] == f"{POOL_PLURAL}/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    assert not [r for r in resources if r["name"] == f"{PLURAL}/scale"]
    current = as_obj(objects.get_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu"))
    for body, status in (({"spec": {"replicas": -1}}, 422),
                         ({"metadata": {"name": "eu", "resourceVersion": "1"}, "spec": {"replicas": 2}}, 409)):
        with pytest.raises(client.ApiException) as refused:
            objects.replace_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu", {
                "apiVersion": "autoscaling/v1", "kind": "Scale", **body})
        assert refused.value.status == status
    assert get_pool(objects, "eu")["spec"]["replicas"] == 1
    with pytest.raises(client.ApiException) as missing:
        objects.get_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, PLURAL, "nothing")
    assert missing.value.status == 404
    written = as_obj(objects.replace_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, "eu", {
        "apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": current["metadata"], "spec": {"replicas": 2}}))
    assert written["spec"]["replicas"] == 2
    assert int(written["metadata"]["resourceVersion"]) > int(current["metadata"]["resourceVersion"])


def test_members_of_a_pool_that_is_gone_are_deleted(api: client.ApiClient,
                                                   hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon],
                                                   image: BaseImage, tmp_path: Path) -> None:
    """A pool deleted before the controller put its finalizer on it leaves members behind; the
    emulator (like the directory source) has no garbage collector, so the controller deletes them.
    A bare Proxy, and a Proxy merely labelled like a member, are not touched."""
    objects = client.CustomObjectsApi(api)
    rec = reconciler(api, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "name": "gone", "uid": "0000-gone",
             "controller": True, "blockOwnerDeletion": True}
    for name, metadata in (("orphan", {"labels": {POOL_LABEL: "gone"}, "ownerReferences": [owner]}),
                           ("bare", {}), ("lookalike", {"labels": {POOL_LABEL: "gone"}})):
        objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": name, "namespace": NAMESPACE, **metadata}, "spec": {"provider": "kvm-a"}})
    assert rec.sweep().ok
    names = sorted(p["metadata"]["name"] for p in as_obj(
        objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL))["items"])
    assert names == ["bare", "lookalike"]
    assert len(domains(hosts[0])) == 2


def test_a_cluster_without_the_proxypool_crd_has_no_pools_and_a_clean_sweep(
        hosts: tuple[LibvirtTestDaemon, LibvirtTestDaemon], image: BaseImage, tmp_path: Path) -> None:
    """Upgrading the controller before applying crd-proxypool.yaml: listing pools is a 404, which
    means no pools, not a failing sweep (--once would exit 1 forever)."""
    with KubeEmulator(crds=[proxy_crd()]) as emulator, \
            client.ApiClient(client.Configuration(host=emulator.url)) as api_client:
        emulator.create_namespace(NAMESPACE)
        rec = reconciler(api_client, write_config(tmp_path / "providers.yaml", hosts, image), tmp_path / "work")
        report = rec.sweep()
        assert report.ok and report.clean, report.summary()
        assert KubePools(api_client).list_pools() == []
