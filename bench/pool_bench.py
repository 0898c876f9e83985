"""Benchmark of a ProxyPool at scale: prints figures, asserts nothing (not part of pytest).

One pool of N members (default 300) over three placements of equal weight: KVM (libvirt's test
driver, one libvirtd per 90 members), GCP (the Compute REST emulator) and Kubernetes Pods (in
the Kubernetes API emulator, which also serves the Proxy and ProxyPool CRDs; it runs in a
process of its own). The real ``Reconciler`` with its ``PoolReconciler``, ``KubeStore``,
``KubePools`` and ``AnsibleRunner`` running the collection's modules; every provider says
``probe: none`` (the emulators' addresses are made up: nothing is sent to them). The emulator
has no kubelet, so a stand-in here marks new Pods Running with a podIP between sweeps.

Measured, in this order:

1. ``replicas: 0 -> N`` through the scale subresource, until ``readyReplicas == N``;
2. a full rotation (``maxAge: 1s``, ``maxSurge`` N/10, ``maxUnavailable: 0``): sweeps until
   every original member is replaced, with the ready count read from the API after every
   sweep (its minimum must stay >= N);
3. quarantine-to-replaced latency: ``POST .../quarantine`` on the real HTTP server, then sweeps
   until the member is gone and the pool has N ready again;
4. a provider killed mid-run (the Compute emulator stops answering): sweeps until the pool has N
   ready again, refilled on KVM and Kubernetes (``maxSurge`` raised to N/3 for this); the
   placement degrades once its listing has failed for the pool's failoverAfter (60 s).

Run as root from the repository root: ``.venv/bin/python bench/pool_bench.py [--replicas 300]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, cast

import yaml

# Imported first: it puts tests/ on sys.path, as pytest has it, for the emulators and daemons.
from controller_bench import emulator_process, say
from kubernetes import client
from pool_fill import KUBE_LAUNCHER, POOL_CRD, run_fill

from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.pool import POOL_LABEL, POOL_PLURAL, QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from egress_proxies.sources.kube import KubePools, KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.pools import PoolReconciler
from egress_proxies.sweep.quarantine import Quarantine
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, kvm_host, make_base_image, write_kubeconfig
from support.compute.emulator import ComputeEmulator
from support.hosts.libvirt_daemon import LibvirtTestDaemon

NAMESPACE = "bench"
POD_NAMESPACE = "egress"
POOL_NAME = "bench"
GCP_PROJECT = "bench-project"
GCP_ZONE = "europe-west1-b"
PER_HOST = 90  # the test driver's 100 GiB pool holds at most 99 1-GiB overlays
TOKEN = "pool-bench-operator-token"
# The pool's failoverAfter: how long a placement may be bad (members not Ready, or its listing
# failing) before its shortfall moves.
FAILOVER_AFTER_SECONDS = 60


class Kubelet:
    """Marks new proxy Pods Running and Ready with a podIP, as a kubelet would (between sweeps)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.addresses = itertools.count(1)

    def run(self) -> None:
        for pod in self.core.list_namespaced_pod(POD_NAMESPACE).items:
            if pod.metadata is None or not pod.metadata.name or (pod.status and pod.status.phase == "Running"):
                continue
            high, low = divmod(next(self.addresses), 250)
            self.core.patch_namespaced_pod_status(pod.metadata.name, POD_NAMESPACE, {"status": {
                "phase": "Running", "podIP": f"10.244.{high}.{low + 1}", "hostIP": "192.0.2.21",
                "conditions": [{"type": "Ready", "status": "True"}]}})


class Bench:
    def __init__(self, api: client.ApiClient, reconciler: Reconciler, kubelet: Kubelet) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.reconciler = reconciler
        self.kubelet = kubelet
        self.sweep_seconds: list[float] = []

    def sweep(self) -> None:
        self.kubelet.run()
        started = time.monotonic()
        report = self.reconciler.sweep()
        self.sweep_seconds.append(time.monotonic() - started)
        if not report.ok:
            raise RuntimeError(f"a sweep failed: {report.errors}")

    def members(self) -> list[dict[str, Any]]:
        listing = self.objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                             label_selector=f"{POOL_LABEL}={POOL_NAME}")
        return list(cast(dict[str, Any], listing)["items"])

    def serving(self, items: list[dict[str, Any]] | None = None) -> int:
        items = self.members() if items is None else items
        return sum(1 for m in items if (m.get("status") or {}).get("phase") == "Ready"
                   and not m["metadata"].get("deletionTimestamp")
                   and (m["metadata"].get("annotations") or {}).get(QUARANTINE_ANNOTATION)
                   != m["status"].get("providerID"))

    def pool(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL,
                                                                              POOL_NAME))

    def ready_replicas(self) -> int:
        return int((self.pool().get("status") or {}).get("readyReplicas") or 0)

    def until(self, done: Callable[[], bool], limit: int, on_sweep: Callable[[], None] | None = None,
              wait_seconds: float = 0.0) -> tuple[float, int]:
        """Sweeps until ``done``: at most ``limit`` sweeps once ``wait_seconds`` (what the pool
        must wait by its spec, such as failoverAfter) have passed, as many as it takes before."""
        started = time.monotonic()
        count = after_wait = 0
        while after_wait < limit:
            count += 1
            if time.monotonic() - started >= wait_seconds:
                after_wait += 1
            self.sweep()
            if on_sweep is not None:
                on_sweep()
            if done():
                return time.monotonic() - started, count
        raise RuntimeError(f"not done after {count} sweeps")

    def patch_pool(self, spec: dict[str, Any]) -> None:
        self.objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, POOL_NAME, {"spec": spec})


def provider_config(path: Path, daemons: list[LibvirtTestDaemon], compute_url: str, kubeconfig: Path,
                    work: Path) -> Path:
    image = make_base_image(work)
    kvm = {"hosts": [kvm_host(f"h{i:02d}", d.uri, pool="default-pool") for i, d in enumerate(daemons)],
           "images": {"debian-12": {"url": image.url, "sha256": image.sha256, "format": "qcow2"}},
           "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}},
           "defaultMachineType": "small", "defaultImage": "debian-12"}
    path.write_text(yaml.safe_dump({"owner": OWNER, "providers": [
        {"name": "lab", "type": "kvm", "probe": "none", "kvm": kvm},
        {"name": "gcp-eu", "type": "gcp", "probe": "none", "gcp": {
            "project": GCP_PROJECT, "zones": [GCP_ZONE], "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "defaultMachineType": "small", "defaultImage": "debian-12", "apiEndpoint": compute_url}},
        {"name": "cluster", "type": "kubernetes", "probe": "none", "kubernetes": {
            "namespace": POD_NAMESPACE, "image": "ubuntu/squid:6.6-24.04_beta", "kubeconfig": str(kubeconfig)}},
    ]}))
    return path


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    n = args.replicas
    work = Path(tempfile.mkdtemp(prefix="egress-proxies-pool-bench-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    os.environ["EGRESS_PROXIES_CACHE_DIR"] = str(work / "image-cache")
    # Its third, half of GCP's third after the failover, and a rotation's surge at worst.
    kvm_most = -(-n // 3) + -(-n // 6) + max(1, n // 10)
    daemons = [stack.enter_context(LibvirtTestDaemon()) for _ in range(-(-kvm_most // PER_HOST))]
    compute = stack.enter_context(ComputeEmulator(project=GCP_PROJECT, zones=(GCP_ZONE,)))
    url = stack.enter_context(emulator_process(KUBE_LAUNCHER, str(POOL_CRD), NAMESPACE, POD_NAMESPACE))
    api = stack.enter_context(client.ApiClient(client.Configuration(host=url)))
    config = provider_config(work / "providers.yaml", daemons, compute.endpoint,
                             write_kubeconfig(work / "kubeconfig", url), work)
    runner = AnsibleRunner(work / "runner", timeout_seconds=1800, max_concurrent=args.max_runners,
                           collections_path=collections_path())
    stack.callback(runner.cancel)
    store = KubeStore(api, namespace=NAMESPACE)
    reconciler = Reconciler(store, runner, str(config), ReconcileSettings(gc_grace_seconds=10**9),
                            parts=SweepParts(backoff=Backoff(),
                                             pools=PoolReconciler(KubePools(api, namespace=NAMESPACE), store)))
    bench = Bench(api, reconciler, Kubelet(client.CoreV1Api(api)))
    say(f"pool of {n} over {len(daemons)} KVM test-driver host(s), the Compute emulator and Kubernetes Pods")
    bench.objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
        "metadata": {"name": POOL_NAME, "namespace": NAMESPACE},
        "spec": {"replicas": 0, "template": {}, "failoverAfter": f"{FAILOVER_AFTER_SECONDS}s",
                 "placement": [{"provider": "lab"}, {"provider": "gcp-eu"}, {"provider": "cluster"}]}})
    bench.sweep()

    # 1. 0 -> N
    bench.objects.patch_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, POOL_NAME,
                                                      {"spec": {"replicas": n}})
    seconds, sweeps = bench.until(lambda: bench.ready_replicas() == n, args.max_sweeps)
    say(f"1. replicas 0 -> {n}: all ready in {seconds:.1f} s, {sweeps} sweep(s) "
        f"(placements {[p['ready'] for p in bench.pool()['status']['placements']]})")
    steady_started = time.monotonic()
    bench.sweep()
    say(f"   a steady sweep of the full pool: {time.monotonic() - steady_started:.1f} s")

    # 2. a full rotation
    surge = max(1, n // 10)
    original = {m["metadata"]["name"] for m in bench.members()}
    ready_per_sweep: list[int] = []
    bench.patch_pool({"rotation": {"maxAge": "1s", "maxSurge": surge, "maxUnavailable": 0, "jitter": 0}})
    time.sleep(1.0)
    seconds, sweeps = bench.until(lambda: original.isdisjoint(m["metadata"]["name"] for m in bench.members()),
                                  args.max_sweeps * 20, on_sweep=lambda: ready_per_sweep.append(bench.serving()))
    say(f"2. full rotation (maxSurge {surge}, maxUnavailable 0): {seconds:.1f} s, {sweeps} sweeps; "
        f"ready per sweep min {min(ready_per_sweep)} (floor {n}), max {max(ready_per_sweep)}")
    # No more age rotation (a merge patch: null removes maxAge).
    bench.patch_pool({"rotation": {"maxAge": None, "maxSurge": surge, "maxUnavailable": 0}})
    bench.until(lambda: len(bench.members()) == n and bench.serving() == n, args.max_sweeps)

    # 3. quarantine -> replaced, through the HTTP server
    reconciler.discovery.serve_sweeps(True)  # a leader: what its sweeps publish
    server = ControllerHTTPServer(SweepHealth(60), reconciler.discovery,
                                  DiscoveryAccess(TOKEN, quarantine=Quarantine(store, reconciler.discovery)))
    server.start("127.0.0.1", 0)
    stack.callback(server.stop)
    victim = sorted(m["metadata"]["name"] for m in bench.members())[0]
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/proxies/{NAMESPACE}/{victim}/quarantine",
                                     data=json.dumps({"reason": "bench"}).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    hidden = time.monotonic() - started
    seconds, sweeps = bench.until(lambda: victim not in {m["metadata"]["name"] for m in bench.members()}
                                  and bench.serving() == n, args.max_sweeps)
    say(f"3. quarantine: out of discovery in {hidden * 1000:.0f} ms (the POST); replaced and deleted "
        f"{time.monotonic() - started:.1f} s after it, {sweeps} sweep(s)")

    # 4. a provider killed mid-run
    bench.patch_pool({"rotation": {"maxAge": None, "maxSurge": -(-n // 3), "maxUnavailable": 0}})
    compute.__exit__(None, None, None)  # the emulator stops: every call to it is refused from now on
    started = time.monotonic()

    def refilled() -> bool:
        status = bench.pool()["status"]
        # The pool has noticed (the placement is degraded, its members no longer count) and
        # has made the shortfall up elsewhere.
        return bool(status["placements"][1]["state"] == "Degraded" and status["readyReplicas"] == n)

    # A failing listing degrades the placement once it has lasted failoverAfter (contract change 23).
    seconds, sweeps = bench.until(refilled, args.max_sweeps * 2, wait_seconds=FAILOVER_AFTER_SECONDS)
    placements = bench.pool()["status"]["placements"]
    say(f"4. GCP killed: pool back to {n} ready in {seconds:.1f} s, {sweeps} sweep(s); placements now "
        f"{[(p['provider'], p['ready'], p['state']) for p in placements]} (gcp-eu's members kept, not counted)")
    durations = sorted(bench.sweep_seconds)
    say(f"sweeps: {len(durations)}, median {durations[len(durations) // 2]:.1f} s, max {durations[-1]:.1f} s")


def interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=300, help="pool size (default: %(default)s)")
    parser.add_argument("--max-runners", type=int, default=4, help="concurrent runner processes")
    parser.add_argument("--max-sweeps", type=int, default=8, help="give up when a phase needs more sweeps")
    parser.add_argument("--fill", type=int, default=None, metavar="N",
                        help="instead: the fill of an N-member pool through the real command, both sources "
                             "(bench/pool_fill.py says what it measures)")
    parser.add_argument("--per-host", type=int, default=95, help="with --fill: members per test-driver host")
    parser.add_argument("--batch-size", type=int, default=125, help="with --fill: the controller's --batch-size")
    parser.add_argument("--rotation-replicas", type=int, default=300,
                        help="with --fill: the pool whose template is edited mid-rotation before a restart")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("pool_bench: needs root (the test libvirtd runs in a private mount namespace)")
        return 2
    # SIGTERM unwinds like Ctrl-C, so the ExitStack stops the libvirtds and emulators it started.
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.fill is not None:
            run_fill(args.fill, args.per_host, args.batch_size, args.rotation_replicas, stack)
        else:
            run(args, stack)
    say(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
