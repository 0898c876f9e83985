"""Discovery hands out one set, whoever serves it (issue 36): the leader from its sweeps, a standby
from the Proxies and ProxyPools as stored, both by the one rule of serving/discovery.py. Two real
controller loops elect a leader through a Lease on the Kubernetes API emulator (Proxy and
ProxyPool CRDs), each with its real HTTP server; the leader reconciles through the fake provider
at the edge (``FakeRunner``, probe: none: its addresses are made up and never contacted)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess
from egress_proxies.leader import LeaseElector
from egress_proxies.loop import Controller, LoopSettings
from egress_proxies.resources.pool import POOL_LABEL, POOL_PLURAL
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.sources.kube import KubeLeases, KubePools, KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.pools import PoolReconciler
from egress_proxies.sweep.quarantine import Quarantine
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.controller.fakes import FakeRunner
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

NAMESPACE, LEASE_NS, LEASE = "crawlers", "egress-proxies", "egress-proxies-leader"
TOKEN = "discovery-view-test-token"
POOL_CRD_PATH = Path(__file__).resolve().parents[3] / "controller" / "manifests" / "crd-proxypool.yaml"
SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    crds = [proxy_crd(), cast(dict[str, Any], yaml.safe_load(POOL_CRD_PATH.read_text()))]
    with KubeEmulator(crds=crds) as emulator:
        emulator.create_namespace(NAMESPACE)
        emulator.create_namespace(LEASE_NS)
        with client.ApiClient(client.Configuration(host=emulator.url)) as api_client:
            yield api_client


def controller(api: client.ApiClient, runner: FakeRunner, config: Path, identity: str) -> Controller:
    """A controller process as ``cli`` builds one, with the fake provider."""
    store = KubeStore(api)
    reconciler = Reconciler(store, runner, str(config),
                            parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0),
                                             pools=PoolReconciler(KubePools(api), store)))
    elector = LeaseElector(KubeLeases(api), LEASE_NS, LEASE, identity, lease_seconds=15, renew_seconds=0.1)
    settings = LoopSettings(interval_seconds=0.3, debounce_seconds=0.0, watch=False, renew_seconds=0.1)
    return Controller(reconciler, store, SweepHealth(settings.interval_seconds, leader=False), settings,
                      elector=elector)


def served(server: ControllerHTTPServer) -> list[tuple[str, str]]:
    """What a crawler is handed by this process: (name, endpoint) of every entry."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/proxies",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return [(entry["name"], entry["endpoint"]) for entry in json.load(response)["proxies"]]


def test_a_standby_and_the_leader_hand_out_the_same_set(api: client.ApiClient, config: Path) -> None:
    objects = client.CustomObjectsApi(api)
    runner = FakeRunner()
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool", "metadata": {"name": "eu", "namespace": NAMESPACE},
        "spec": {"replicas": 3, "minReady": 2, "template": {"cloudInit": "#cloud-config\n"},
                 "placement": [{"provider": "home-kvm"}]}})
    for name in ("solo", "leaving"):
        objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": SPEC})
    leader = controller(api, runner, config, "leader")
    standby = controller(api, runner, config, "standby")
    servers = [ControllerHTTPServer(c.health, c.discovery, DiscoveryAccess(TOKEN)) for c in (leader, standby)]
    threads = [threading.Thread(target=leader.run, daemon=True)]
    try:
        threads[0].start()
        wait_for(lambda: len(leader.discovery.handed_out()) == 5, 20, "the pool's 3 members and 2 bare Proxies")
        threads.append(threading.Thread(target=standby.run, daemon=True))
        threads[1].start()
        wait_for(lambda: len(standby.discovery.handed_out()) == 5, 20, "the standby's stored view")
        for server in servers:
            server.start("127.0.0.1", 0)
        assert served(servers[0]) == served(servers[1])

        # From now on new instances get no address: the pool's replacements do not serve.
        runner.ip = None
        members = sorted(p.name for p in KubeStore(api).list_proxies()[0] if p.labels.get(POOL_LABEL) == "eu")
        # Two members quarantined through a third replica (its own view, nothing read yet: it hides
        # both itself, neither of these two does).
        other_replica = Quarantine(KubeStore(api), DiscoveryView())
        assert all(other_replica(NAMESPACE, name, "banned", "op").hidden for name in members[:2])
        # A bare Proxy deleted whose instance cannot be deleted yet: deleting for a while.
        leaving = next(p for p in KubeStore(api).list_proxies()[0] if p.name == "leaving")
        runner.fail[("kvm_proxy", str(leaving.status["providerID"]))] = ("transient", "host h1 does not answer")
        objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "leaving")

        # The floor (minReady 2) keeps one quarantined member listed beside the one left serving, by
        # name; the other quarantined one, the deleting Proxy and the replacements are not handed out.
        expected = sorted([members[0], members[2], "solo"])
        def handed_out(process: Controller) -> list[str]:
            return sorted(p.name for p in process.discovery.handed_out())

        wait_for(lambda: handed_out(leader) == expected, 20, f"the leader to hand out {expected}")
        wait_for(lambda: handed_out(standby) == expected, 20, f"the standby to hand out {expected}")
        stored = {p.name: p for p in KubeStore(api).list_proxies()[0]}
        assert stored[members[0]].status["phase"] == "Quarantined" and stored["leaving"].deleting
        replacements = [p for p in stored.values() if p.labels.get(POOL_LABEL) == "eu" and p.name not in members]
        assert replacements and all(p.status.get("phase") != "Ready" for p in replacements)  # made, not serving
        assert standby.reconciler.pools is not None and standby.reconciler.pools.floors  # read, not swept
        assert standby.sweeps == 0 and leader.discovery.serving_sweeps and not standby.discovery.serving_sweeps
        assert served(servers[0]) == served(servers[1]) and len(served(servers[0])) == 3
    finally:
        for process in (leader, standby):
            process.stop()
        for thread in threads:
            thread.join(timeout=10)
        for server in servers:
            server.stop()
