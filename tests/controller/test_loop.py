"""loop.Controller's threads: a prompt Lease release on stop, a dead thread seen by /healthz at
once, and discovery that never goes dark on a standby or a new leader.

The Lease is the real one (``LeaseElector`` through ``KubeLeases`` on the API emulator); the
reconciler is a stand-in whose sweep the test controls (blocks, raises, or says which Proxies
are Ready), because what is tested is the loop around it. One test runs the real command
against the emulator and sends it SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess
from egress_proxies.leader import LeaseElector
from egress_proxies.loop import Controller, LoopSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.sources.kube import KubeLeases
from egress_proxies.sources.store import WatchEvent
from egress_proxies.sweep.reconcile import Reconciler, SweepReport
from support.controller.fakes import MemoryStore
from support.kube.emulator import KubeEmulator
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

LEASE_NS, LEASE = "egress-proxies", "egress-proxies-leader"
TOKEN = "loop-test-token"
REPO = Path(__file__).resolve().parents[2]


class FakeReconciler:
    """What the loop needs of ``Reconciler``: ``sweep()``, which publishes to ``discovery``, ``pools``
    (none: no floors) and ``monitor`` (none: no probing).

    ``block`` holds a sweep until set; ``fail`` makes the next sweep raise; ``ready`` is what a
    finished sweep found Ready (a new list each sweep, as the real one assigns).
    """

    def __init__(self, ready: Callable[[], list[Proxy]] = list) -> None:
        self.ready = ready
        self.discovery = DiscoveryView()
        self.pools = None
        self.monitor = None
        self.block = threading.Event()
        self.block.set()
        self.in_sweep = threading.Event()
        self.fail: BaseException | None = None
        self.sweeps = 0

    def sweep(self) -> SweepReport:
        started = time.monotonic()
        self.in_sweep.set()
        try:
            self.block.wait()
            if self.fail is not None:
                raise self.fail
            self.discovery.publish(self.ready(), {}, started)
            self.sweeps += 1
            return SweepReport()
        finally:
            self.in_sweep.clear()


def ready_store(*names: str, pending: tuple[str, ...] = ()) -> MemoryStore:
    """Proxies as the leader left them in the store: ``names`` Ready, ``pending`` not."""
    store = MemoryStore()
    for index, name in enumerate((*names, *pending)):
        store.add(name, {"provider": "lab", "port": 3128})
        if name in names:
            ip = f"192.0.2.{index + 10}"
            store.objects[("crawlers", name)].status = {"phase": "Ready", "ip": ip, "endpoint": f"{ip}:3128"}
        else:
            store.objects[("crawlers", name)].status = {"phase": "Provisioning"}
    return store


@pytest.fixture
def leases(kube: KubeEmulator) -> Iterator[KubeLeases]:
    kube.create_namespace(LEASE_NS)
    api_client = client.ApiClient(client.Configuration(host=kube.url))
    try:
        yield KubeLeases(api_client)
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def holder(kube: KubeEmulator) -> str:
    lease = kube.get_object("leases.coordination.k8s.io", LEASE_NS, LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def make_controller(reconciler: FakeReconciler, store: MemoryStore, leases: KubeLeases | None, identity: str,
                    **settings: Any) -> Controller:
    elector = None
    if leases is not None:
        elector = LeaseElector(leases, LEASE_NS, LEASE, identity, lease_seconds=15, renew_seconds=1)
    loop_settings = LoopSettings(**{"interval_seconds": 0.3, "watch": False, "renew_seconds": 0.1, **settings})
    health = SweepHealth(loop_settings.interval_seconds, leader=elector is None)
    return Controller(cast(Reconciler, reconciler), store, health, loop_settings, elector=elector)


def start(controller: Controller) -> threading.Thread:
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    return thread


# -- stop ------------------------------------------------------------------------------------------


def test_stop_releases_the_lease_within_seconds_while_a_sweep_is_in_flight(kube: KubeEmulator,
                                                                            leases: KubeLeases) -> None:
    reconciler = FakeReconciler()
    controller = make_controller(reconciler, MemoryStore(), leases, "first", watch=False)
    thread = start(controller)
    try:
        wait_for(lambda: controller.sweeps >= 1, 10, "the first sweep")
        reconciler.block.clear()  # the next sweep hangs (a batch of creates waiting for boots)
        controller.trigger()
        wait_for(reconciler.in_sweep.is_set, 10, "a sweep in flight")
        assert holder(kube) == "first"
        stopped = time.monotonic()
        controller.stop()
        wait_for(lambda: holder(kube) == "", 10, "the Lease to be released")
        released = time.monotonic() - stopped
        thread.join(timeout=10)
        returned = time.monotonic() - stopped
    finally:
        reconciler.block.set()
    # Before: 30 s (run() joined the sweep thread first); a successor now waits at most 5 s.
    assert released < 1.0, released
    assert not thread.is_alive() and returned < controller.settings.stop_grace_seconds + 1, returned


def test_sigterm_releases_the_lease_of_the_real_command_within_5_s(kube: KubeEmulator, tmp_path: Path) -> None:
    kube.create_namespace(LEASE_NS)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: emu, cluster: {{server: "{kube.url}"}}}}]
users: [{{name: me, user: {{token: t}}}}]
contexts: [{{name: emu, context: {{cluster: emu, user: me}}}}]
current-context: emu
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "controller"), os.environ.get("PYTHONPATH", "")])}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    command = [sys.executable, "-m", "egress_proxies.cli", "--source", "kubernetes", "--kubeconfig", str(kubeconfig),
               "--provider-config", str(tmp_path / "providers.yaml"), "--work-dir", str(tmp_path / "work"),
               "--listen", "127.0.0.1:0", "--identity", "cli-under-test", "--lease-namespace", LEASE_NS,
               "--lease-name", LEASE, "--interval", "60"]
    log_file = tmp_path / "controller.log"
    with log_file.open("wb") as log_out:
        controller = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log_out)
    try:
        wait_for(lambda: holder(kube) == "cli-under-test" or controller.poll() is not None, 60, "the Lease")
        assert controller.poll() is None, log_file.read_text()
        time.sleep(1.0)  # its watch is open and blocking now (it held run() for 30 s before)
        stopped = time.monotonic()
        controller.send_signal(signal.SIGTERM)
        wait_for(lambda: holder(kube) == "", 10, "the Lease to be released")
        released = time.monotonic() - stopped
        assert controller.wait(timeout=10) == 0
        exited = time.monotonic() - stopped
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    assert released < 5.0, (released, log_file.read_text())
    assert exited < 5.0, (exited, log_file.read_text())


# -- a dead thread -----------------------------------------------------------------------------------


class Broken(Exception):
    pass


def test_a_sweep_thread_that_dies_fails_liveness_at_once(caplog: pytest.LogCaptureFixture) -> None:
    reconciler = FakeReconciler()
    reconciler.fail = Broken("a bug in the sweep")
    controller = make_controller(reconciler, MemoryStore(), None, "only")
    with caplog.at_level(logging.ERROR, logger="egress_proxies.loop"):
        thread = start(controller)
        try:
            wait_for(lambda: not controller.health.alive()[0], 5, "liveness to fail")
        finally:
            controller.stop()
            thread.join(timeout=10)
    assert controller.health.alive() == (False, "the sweep thread died: Broken: a bug in the sweep")
    assert not controller.health.ready()[0]
    (record,) = [r for r in caplog.records if "sweep thread died" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is Broken  # logged with its traceback


def test_a_watch_or_leader_thread_that_dies_fails_liveness_at_once() -> None:
    class BrokenWatch(MemoryStore):
        def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[Any]:  # noqa: ARG002
            raise TypeError("unexpected")

    controller = make_controller(FakeReconciler(), BrokenWatch(), None, "only", watch=True)
    thread = start(controller)
    try:
        wait_for(lambda: not controller.health.alive()[0], 5, "liveness to fail")
        assert controller.health.alive()[1] == "the watch thread died: TypeError: unexpected"
    finally:
        controller.stop()
        thread.join(timeout=10)

    class BrokenLeases:
        def get(self, namespace: str, name: str) -> dict[str, Any] | None:  # noqa: ARG002
            raise KeyError("spec")

    elected = make_controller(FakeReconciler(), MemoryStore(), None, "leader")
    elected.elector = LeaseElector(cast(KubeLeases, BrokenLeases()), LEASE_NS, LEASE, "leader")
    thread = start(elected)
    try:
        wait_for(lambda: not elected.health.alive()[0], 5, "liveness to fail")
        assert elected.health.alive()[1].startswith("the leader thread died: KeyError")
    finally:
        elected.stop()
        thread.join(timeout=10)


# -- discovery on a standby ------------------------------------------------------------------------


def test_a_standby_serves_discovery_from_the_stored_status(leases: KubeLeases) -> None:
    # Someone else holds the Lease.
    other = LeaseElector(leases, LEASE_NS, LEASE, "the-leader", lease_seconds=60, renew_seconds=1)
    assert other.try_acquire_or_renew()
    store = ready_store("eu-1", "eu-2", pending=("eu-3",))
    standby = make_controller(FakeReconciler(), store, leases, "standby")
    assert not standby.health.ready()[0]  # before it has read the store it is not ready
    thread = start(standby)
    try:
        wait_for(lambda: standby.discovery.handed_out(), 5, "the stored view")
        assert sorted(p.name for p in standby.discovery.handed_out()) == ["eu-1", "eu-2"]
        assert standby.health.ready() == (True, "standby: waiting for the leader Lease")
        # It follows the store: a Proxy that went Ready meanwhile is served next interval.
        store.objects[("crawlers", "eu-3")].status = {"phase": "Ready", "ip": "192.0.2.30"}
        wait_for(lambda: len(standby.discovery.handed_out()) == 3, 5, "the refreshed view")
        assert standby.reconciler.sweeps == 0  # type: ignore[attr-defined]  # and never swept
    finally:
        standby.stop()
        thread.join(timeout=10)


def test_a_proxy_seen_deleting_leaves_discovery_before_the_sweep_in_flight_ends() -> None:
    # The real-guest test saw a deleted Proxy handed to a crawler while the sweep deleted its
    # instance: the watch's deletion must take it out of discovery at once.
    store = ready_store("eu-1", "eu-2")
    both = [store.get_proxy("crawlers", "eu-1"), store.get_proxy("crawlers", "eu-2")]
    reconciler = FakeReconciler(lambda: list(both))
    deleting = threading.Event()
    sent: list[Proxy] = []

    def watch(resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:  # noqa: ARG001
        if deleting.wait(0.1) and not sent:
            proxy = store.get_proxy("crawlers", "eu-1")
            proxy.deletion_timestamp = "2026-12-03T12:00:00Z"
            sent.append(proxy)
            yield WatchEvent("MODIFIED", proxy)

    store.watch_proxies = watch  # type: ignore[method-assign]
    controller = make_controller(reconciler, store, None, "solo", watch=True)
    thread = start(controller)
    try:
        wait_for(lambda: len(controller.discovery.handed_out()) == 2, 5, "the first sweep's view")
        reconciler.block.clear()  # the next sweep (the one deleting eu-1's instance) takes a while
        wait_for(reconciler.in_sweep.is_set, 5, "a sweep in flight")
        deleting.set()
        wait_for(lambda: [p.name for p in controller.discovery.handed_out()] == ["eu-2"], 5, "eu-1 out of discovery")
        assert [p.name for p in reconciler.discovery.swept] == ["eu-1", "eu-2"]  # the sweep has not said so yet
        both.pop(0)  # a sweep that began after the deletion leaves it out itself
        reconciler.block.set()
        wait_for(lambda: reconciler.sweeps >= 3, 5, "a sweep after the deletion")
        assert [p.name for p in controller.discovery.handed_out()] == ["eu-2"]
        assert controller.discovery._withdrawn == {}  # forgotten once a later view knows
    finally:
        controller.stop()
        thread.join(timeout=10)


def discovery(server: ControllerHTTPServer) -> list[str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/proxies",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=2) as response:
        return sorted(entry["name"] for entry in json.load(response)["proxies"])


def test_after_the_leaders_stop_the_successor_never_serves_an_empty_list(kube: KubeEmulator,
                                                                       leases: KubeLeases) -> None:
    store = ready_store("eu-1", "eu-2")

    def stored_ready() -> list[Proxy]:
        return [p for p in store.list_proxies()[0] if p.status.get("phase") == "Ready"]

    leader = make_controller(FakeReconciler(stored_ready), store, leases, "first")
    successor_reconciler = FakeReconciler(stored_ready)
    successor = make_controller(successor_reconciler, store, leases, "second")
    server = ControllerHTTPServer(successor.health, successor.discovery, DiscoveryAccess(TOKEN))
    server.start("127.0.0.1", 0)
    threads = [start(leader)]
    try:
        wait_for(lambda: leader.sweeps >= 1, 10, "the leader's first sweep")
        threads.append(start(successor))
        wait_for(lambda: successor.health.ready()[0], 5, "the standby to be ready")
        # Its first sweep as the new leader will take a while (instances to create).
        successor_reconciler.block.clear()
        answers: list[list[str]] = []
        leader.stop()
        threads[0].join(timeout=10)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            answers.append(discovery(server))
            time.sleep(0.02)
        assert holder(kube) == "second" and successor_reconciler.in_sweep.is_set()
        successor_reconciler.block.set()
        wait_for(lambda: successor.sweeps >= 1, 10, "the successor's first sweep")
        for _ in range(10):
            answers.append(discovery(server))
    finally:
        successor_reconciler.block.set()
        for controller in (leader, successor):
            controller.stop()
        for thread in threads:
            thread.join(timeout=10)
        server.stop()
    assert answers and all(answer == ["eu-1", "eu-2"] for answer in answers), answers
    assert successor.health.ready()[0]
