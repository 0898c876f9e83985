"""Benchmark of the controller at scale: prints figures, asserts nothing (not part of pytest).

N Proxies in the Kubernetes API emulator (its own process, so its memory is not the
controller's), instances on emulated providers (other processes), and the real
``Reconciler`` + ``KubeStore`` + ``AnsibleRunner`` running the real modules. This process
hosts only the controller, so its peak RSS is the controller's.

Two fleets:

- KVM (the default): every Proxy on one KVM provider, libvirt's test driver served by one
  libvirtd per ``--proxies-per-host`` Proxies;
- ``--mixed``: the Proxies split round-robin over three providers in one controller: that KVM
  provider, a GCP provider on the Compute REST emulator (its own process, three zones) and a
  Kubernetes provider whose Pods live in the same Kubernetes API emulator as the Proxies. The
  emulator has no kubelet, so a stand-in in this process marks new Pods Running and Ready
  with a podIP between sweeps (the output says how long that took; it is not the controller).

Measured, in this order:

1. batch (the controller as shipped): sweeps from empty until all N are Ready, then three
   steady sweeps;
2. per-object steady state (what the Operator SDK's Ansible operator does: one runner call
   per Proxy per reconcile, here ``<kind>_proxy_info`` by providerID) on a sample of the N;
3. per-object from empty (``<kind>_proxy`` create with a batch of one per Proxy) on a sample
   of fresh Proxies, after the test driver has been emptied.

A full per-object pass over 1,000 Proxies takes 15-27 minutes here, so per-object figures are
measured on the sample and extrapolated linearly to N; the output labels every figure as
measured or extrapolated.

Run as root from the repository root (the test daemon needs a mount namespace):
``.venv/bin/python bench/controller_bench.py [--mixed] [--proxies 1000] [--per-object-sample 30]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import cProfile
import io
import itertools
import json
import os
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The controller is installed editable in .venv; the test helpers (the emulators, the test
# daemon, provider configs) are imported the way pytest imports them, from tests/.
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from kubernetes import client  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402

from egress_proxies.providers.client import ProviderClient, ProviderType, Target, check_config  # noqa: E402
from egress_proxies.providers.runner import AnsibleRunner, Operation, OperationResult  # noqa: E402
from egress_proxies.resources.proxy import GROUP, PHASE_READY, PLURAL, VERSION, Proxy, spec_hash  # noqa: E402
from egress_proxies.sources.kube import KubeStore  # noqa: E402
from egress_proxies.sweep.backoff import Backoff  # noqa: E402
from egress_proxies.sweep.live import LiveParts, LivePath, LiveSettings, SweepPass  # noqa: E402
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts, SweepReport  # noqa: E402
from support.collection.modules import collections_path  # noqa: E402
from support.collection.provider_config import (  # noqa: E402
    kvm_host,
    make_base_image,
    write_kubeconfig,
    write_kvm_config,
)
from support.hosts.libvirt_daemon import LibvirtTestDaemon  # noqa: E402

# The collection, for what the providers would have made (the listing figures' seeded instances).
if collections_path() not in sys.path:
    sys.path.insert(0, collections_path())
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.instances import (  # noqa: E402
    user_data_metadata,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import (  # noqa: E402
    PORT_METADATA_KEY,
    TAGS_METADATA_KEY,
    encode_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest  # noqa: E402
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import build_pod  # noqa: E402
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import (  # noqa: E402
    KubernetesSettings,
)

MIB = 1024 * 1024
KVM_PROVIDER = "lab"  # the KVM provider support.collection.provider_config writes
GCP_PROVIDER = "gcp-eu"
K8S_PROVIDER = "cluster"
GCP_PROJECT = "bench-project"
GCP_ZONES = ("europe-west1-b", "europe-west4-a", "us-central1-a")
POD_NAMESPACE = "egress"
POOL = "default-pool"  # the test driver's built-in pool
# The test driver gives every pool 100 GiB and a volume without <allocation> allocates its
# capacity, so one host holds at most 99 overlays of the smallest disk (1 GiB): the bench runs
# one test-driver libvirtd per this many KVM Proxies, each a KVM host of the one provider (as a
# real fleet would spread 1,000 proxy VMs over many hypervisors).
PROXIES_PER_HOST = 90
BATCH_NAMESPACE = "bench"
PER_OBJECT_NAMESPACE = "bench-per-object"
CLOUD_INIT = "#cloud-config\npackages: [squid]\n"
STEADY_SWEEPS = 3
# The issues' targets on this 2-core machine: for 1,000 Proxies, and (issue 15) the same steady
# sweep time for 10,000 with the controller's RSS at most 300 MiB.
TARGET_STEADY_SECONDS = 10.0
TARGET_CALLS_PER_PROVIDER = 1
TARGET_SPAWN_RATIO = 100.0
TARGET_RSS_MIB = {1000: 200.0, 10000: 300.0}
# Issue 32's table, for 10,000 KVM Proxies (--proxies 10000 --proxies-per-host 99 --batch-size
# 250): the steady sweep and its parts, the controller's RSS, a fill from empty; and each
# provider's one list call at that many instances.
TABLE_PROXIES = 10000
TARGET_TABLE_STEADY_SECONDS = 5.0
TARGET_LIST_SECONDS = 3.0
TARGET_CONTROLLER_SECONDS = 1.5
TARGET_TABLE_RSS_MIB = 300.0
TARGET_FILL_SECONDS = 180.0
# The listing figures' own providers and instances, apart from the fleet's.
LISTING_OWNER = "bench-listing"
LISTING_NAMESPACE = "bench-listing"
GCP_LISTING_PROVIDER = "gcp-listing"
K8S_LISTING_PROVIDER = "k8s-listing"
LISTING_IMAGE = "ubuntu/squid:6.6-24.04_beta"
LIST_REPEATS = 3


def rss_target_mib(proxies: int) -> float:
    """The RSS target of the nearest fleet size with one (a 3,000 fleet is held to 1,000's)."""
    return TARGET_RSS_MIB[max((n for n in TARGET_RSS_MIB if n <= proxies), default=min(TARGET_RSS_MIB))]

# The emulators run in processes of their own: their memory (every object, its history) must
# not count against the controller's RSS. Each serves until its stdin closes, so it also ends
# when the bench dies without cleaning up. Both emulators disable Nagle themselves.
KUBE_LAUNCHER = """
import json, sys
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd
# A cluster as the seed file says: its namespaces made, the Proxy CRD installed (or not), its Pods
# created and each reported running, as the scheduler and kubelet would.
seed = json.loads(open(sys.argv[1]).read())
emulator = KubeEmulator(port=0, namespaces=seed["namespaces"], crds=[proxy_crd()] if seed["crd"] else []).start()
for number, pod in enumerate(seed["pods"]):
    namespace = pod["metadata"]["namespace"]
    emulator.create("pods", namespace, pod)
    high, low = divmod(number, 250)
    emulator.kubelet_run(namespace, pod["metadata"]["name"], pod_ip=f"10.245.{high}.{low + 1}")
sys.stdout.write(emulator.url + "\\n")
sys.stdout.flush()
sys.stdin.read()
emulator.stop()
"""
COMPUTE_LAUNCHER = """
import json, sys
from support.compute.emulator import ComputeEmulator
# A project as the seed file says: its zones, and instances already running in them.
seed = json.loads(open(sys.argv[1]).read())
with ComputeEmulator(project=seed["project"], zones=tuple(seed["zones"])) as emulator:
    for instance in seed["instances"]:
        emulator.add_instance(instance["zone"], instance["name"], labels=instance["labels"],
                              metadata=instance["metadata"])
    sys.stdout.write(emulator.endpoint + "\\n")
    sys.stdout.flush()
    sys.stdin.read()
"""


class BenchError(RuntimeError):
    """The bench could not measure what it set out to (a sweep failed, Proxies never got Ready)."""


class Stopping(Exception):
    """The bench is being interrupted: no new runner call may start."""


@dataclass
class Shutdown:
    """What an interrupt needs to stop the measurement thread's runner calls."""

    stopping: threading.Event = field(default_factory=threading.Event)
    runner: AnsibleRunner | None = None

    def stop_runner_calls(self) -> None:
        # The runner's cancel callback ends a run in flight within ansible-runner's poll
        # interval (5 s) and kills what is left of it; no new call starts after this.
        self.stopping.set()
        if self.runner is not None:
            self.runner.cancel()


def say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- the pieces ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    provider: str
    verb: str
    operations: int
    seconds: float  # wall time of the call, including any wait for a free runner slot


class CountingRunner:
    """The real AnsibleRunner, recording each call's provider, verb, size and wall time."""

    def __init__(self, inner: AnsibleRunner, stopping: threading.Event) -> None:
        self.inner = inner
        self.stopping = stopping
        self.calls: list[Call] = []

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        if self.stopping.is_set():
            raise Stopping
        started = time.monotonic()
        results = self.inner.run(provider, verb, operations)
        # A batch-form call (``operations`` / ``provider_ids``) is one module run for all its items.
        items = sum(len(op.args.get("operations") or op.args.get("provider_ids") or [None]) for op in operations)
        self.calls.append(Call(provider, verb, items, time.monotonic() - started))
        return results


def runner_seconds(provider: str, verb: str) -> float:
    """The runner's own time for (provider, verb) so far, from its metrics: a run's wall time
    without the wait for a runner slot, which the bench's wall clock around a call includes."""
    value = REGISTRY.get_sample_value("egress_proxies_runner_duration_seconds_sum",
                                      {"provider": provider, "verb": verb})
    return value or 0.0


@dataclass
class Phase:
    """What one measured stretch cost: wall time, sweeps and the runner calls made in it."""

    seconds: float = 0.0
    sweeps: int = 0
    calls: list[Call] = field(default_factory=list)
    list_seconds: dict[str, float] = field(default_factory=dict)  # provider -> runner's own list time
    create_seconds: dict[str, float] = field(default_factory=dict)  # provider -> runner's own create time
    kubelet_seconds: float = 0.0  # the bench's kubelet stand-in, inside ``seconds``
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # whose CPU (cpu_seconds()) -> seconds in it

    @property
    def spawns(self) -> int:
        return len(self.calls)

    @property
    def runner_seconds(self) -> float:
        return sum(call.seconds for call in self.calls)

    def by_verb(self) -> str:
        counts = Counter(call.verb for call in self.calls)
        return ", ".join(f"{count} {verb}" for verb, count in sorted(counts.items())) or "none"

    def by_provider(self) -> Counter[str]:
        return Counter(call.provider for call in self.calls)


def seed_file(path: Path, document: dict[str, Any]) -> str:
    path.write_text(json.dumps(document))
    return str(path)


@contextlib.contextmanager
def emulator_process(launcher: str, *args: str) -> Iterator[str]:
    """An emulator in a child process; yields the URL it prints."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    # Its own session: a Ctrl-C reaches only the bench, which then stops it in order.
    process = subprocess.Popen([sys.executable, "-c", launcher, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise BenchError(f"an emulator did not start (exit {process.poll()})")
        yield url
    finally:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class KubeletStandIn:
    """What the kubelet would report once a Pod's container runs and its readiness probe
    passes: phase Running, Ready, a podIP. The emulator has none, so the bench plays it
    between sweeps, as tests/controller/scenarios/test_mixed_providers.py does."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.addresses = itertools.count(1)
        self.seconds = 0.0
        self.marked = 0

    def run(self) -> None:
        started = time.monotonic()
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            if pod.metadata is None or not pod.metadata.name or (pod.status and pod.status.phase == "Running"):
                continue
            high, low = divmod(next(self.addresses), 250)
            self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
                "phase": "Running", "podIP": f"10.244.{high}.{low + 1}", "hostIP": "192.0.2.21",
                "conditions": [{"type": "Ready", "status": "True"}]}})
            self.marked += 1
        self.seconds += time.monotonic() - started


def interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- the workload ----------------------------------------------------------------------------------


def create_proxies(objects: client.CustomObjectsApi, namespace: str, count: int, providers: Sequence[str]) -> None:
    """``count`` Proxies spread round-robin over ``providers``, placement left to each provider."""
    for index in range(count):
        provider = providers[index % len(providers)]
        # A Pod has no cloud-init (the provider refuses user-data, permanently): its squid
        # comes from the provider config instead.
        spec = {"provider": provider} if provider == K8S_PROVIDER else {"provider": provider, "cloudInit": CLOUD_INIT}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                "metadata": {"name": f"proxy-{index:05d}", "namespace": namespace}, "spec": spec}
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def share(count: int, providers: Sequence[str]) -> dict[str, int]:
    """How many of ``count`` round-robin Proxies each provider gets."""
    return {name: len(range(index, count, len(providers))) for index, name in enumerate(providers)}


def ready_count(store: KubeStore) -> tuple[int, int]:
    proxies, _ = store.list_proxies()
    return sum(1 for p in proxies if p.status.get("phase") == PHASE_READY), len(proxies)


def checked(report: SweepReport) -> SweepReport:
    if not report.ok:
        raise BenchError(f"a sweep failed: {'; '.join(report.errors)}")
    return report


def timed_sweep(reconciler: Reconciler, runner: CountingRunner, providers: Sequence[str]) -> Phase:
    """One sweep, with its runner calls and each provider's list time (the runner's own)."""
    mark = len(runner.calls)
    before = {name: runner_seconds(name, "list") for name in providers}
    started = time.monotonic()
    checked(reconciler.sweep())
    return Phase(time.monotonic() - started, 1, runner.calls[mark:],
                 {name: runner_seconds(name, "list") - before[name] for name in providers})


def _live_children_cpu() -> float:
    """CPU seconds of this process's children still running (the test libvirtds, the emulators):
    not in RUSAGE_CHILDREN until they are waited for."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == os.getpid():  # field 4, the parent's pid
            total += int(fields[11]) + int(fields[12])  # fields 14 and 15, utime and stime
    return total / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far, by whom: figures that do not depend on how loaded the machine is."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"controller": own.ru_utime + own.ru_stime,
            "runner processes (ansible-playbook, modules)": children.ru_utime + children.ru_stime,
            "test libvirtds and API emulator(s)": _live_children_cpu()}


def until_ready(reconciler: Reconciler, store: KubeStore, runner: CountingRunner, providers: Sequence[str],
                max_sweeps: int, kubelet: KubeletStandIn | None) -> Phase:
    """Sweep from empty until every Proxy of ``store`` is Ready (the kubelet plays in between)."""
    started = time.monotonic()
    kubelet_before = kubelet.seconds if kubelet else 0.0
    creates_before = {name: runner_seconds(name, "create") for name in providers}
    cpu_before = cpu_seconds()
    phase = Phase()
    while True:
        sweep = timed_sweep(reconciler, runner, providers)
        phase.sweeps += 1
        phase.calls += sweep.calls
        if phase.sweeps == 1:
            phase.list_seconds = sweep.list_seconds  # the lists with no instance yet
        if kubelet is not None:
            kubelet.run()
        ready, total = ready_count(store)
        if ready == total:
            break
        if phase.sweeps >= max_sweeps:
            raise BenchError(f"only {ready} of {total} Proxies Ready after {phase.sweeps} sweeps")
    phase.seconds = time.monotonic() - started
    phase.cpu_seconds = {who: spent - cpu_before[who] for who, spent in cpu_seconds().items()}
    phase.kubelet_seconds = kubelet.seconds - kubelet_before if kubelet else 0.0
    phase.create_seconds = {name: runner_seconds(name, "create") - creates_before[name] for name in providers}
    return phase


def steady_sweeps(reconciler: Reconciler, runner: CountingRunner, providers: Sequence[str],
                  count: int) -> list[Phase]:
    phases = []
    for _ in range(count):
        mark = len(runner.calls)
        phase = timed_sweep(reconciler, runner, providers)
        changed = [c for c in runner.calls[mark:] if c.verb != "list"]
        if changed:
            raise BenchError(f"a steady sweep changed instances: {changed}")
        phases.append(phase)
    return phases


def _run_step(_proxy: Proxy, step: Callable[[], object]) -> None:
    step()


class PerObjectStrategy:
    """What the Operator SDK's Ansible operator does in steady state: one runner call per
    Proxy per reconcile (``<kind>_proxy_info`` by providerID), then that Proxy's status.

    The status comes from the controller's own ``LivePath.observe``, so both modes do the
    same work per Proxy apart from how they ask the provider.
    """

    def __init__(self, reconciler: Reconciler, runner: CountingRunner, config_path: str) -> None:
        self.reconciler = reconciler
        self.runner = runner
        self.config_path = config_path
        providers = reconciler.providers or check_config(runner, config_path)
        self.clients = providers.clients(runner)
        parts = LiveParts(reconciler.writer, seconds_since=lambda _stamp: 0.0)
        sweep = SweepPass(providers.owner, contain=_run_step, count=lambda _counter, _amount: None)
        self.live = {name: LivePath(LiveSettings(), parts, sweep, providers.probes[name]) for name in self.clients}

    def reconcile(self, proxy: Proxy) -> None:
        (result,) = self.clients[proxy.provider].get([Target(proxy.uid, proxy.status["providerID"])])
        if result.error is not None or result.instance is None:
            raise BenchError(f"{proxy.key}: get failed: {result.error}")
        self.live[proxy.provider].observe(proxy, result.instance, spec_hash(proxy.spec))

    def measure(self, proxies: Sequence[Proxy]) -> Phase:
        mark = len(self.runner.calls)
        started = time.monotonic()
        for proxy in proxies:
            self.reconcile(proxy)
        return Phase(time.monotonic() - started, 1, self.runner.calls[mark:])


# -- reporting -------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def row(label: str, value: str, note: str = "") -> None:
    say(f"  {label:<44} {value:<22} {note}".rstrip())


def peak_rss_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


@dataclass
class ListingFigure:
    """One provider's list call: the runner's own time of each call with ``instances`` listed,
    and of one that lists none."""

    provider: str
    description: str
    instances: int
    seconds: list[float]
    empty_seconds: float

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


@dataclass
class Results:
    proxies: int
    sample: int
    batch_size: int
    max_runners: int
    providers: dict[str, int]  # provider -> Proxies on it
    hosts: int
    from_empty: Phase = field(default_factory=Phase)
    steady: list[Phase] = field(default_factory=list)
    per_object_steady: Phase = field(default_factory=Phase)
    per_object_empty: Phase = field(default_factory=Phase)
    kubelet_pods: int = 0
    rss_self_mib: float = 0.0
    rss_children_mib: float = 0.0
    profile: str = ""
    profile_fill: str = ""
    listings: list[ListingFigure] = field(default_factory=list)
    # os.getloadavg() at points of the run: the machine's share of the figures.
    loads: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def mixed(self) -> bool:
        return len(self.providers) > 1


DESCRIPTIONS = {KVM_PROVIDER: "KVM, {hosts} test-driver libvirtd(s)",
                GCP_PROVIDER: f"GCP, Compute emulator, {len(GCP_ZONES)} zones",
                K8S_PROVIDER: "Kubernetes Pods in the API emulator"}


def print_results(r: Results) -> None:
    n, s = r.proxies, r.sample
    scale = n / s
    steady_median = statistics.median(p.seconds for p in r.steady)
    steady_runner = statistics.median(max((c.seconds for c in p.calls), default=0.0) for p in r.steady)
    per_provider = {name: max(p.by_provider()[name] for p in r.steady) for name in r.providers}
    steady_calls = max(p.spawns for p in r.steady)
    sizes = " and ".join(map(str, TARGET_RSS_MIB))
    for_target = "" if n in TARGET_RSS_MIB else f" (targets are for {sizes}; this run has {n})"
    rss_target = rss_target_mib(n)
    fleet = ", ".join(f"{name} ({DESCRIPTIONS[name].format(hosts=r.hosts)}) {count}"
                      for name, count in r.providers.items())

    say()
    say(f"== batch: the controller as shipped, {n} Proxies on {len(r.providers)} provider(s): {fleet}; "
        f"batch size {r.batch_size}, at most {r.max_runners} runner processes (all measured)")
    if r.mixed:
        say(f"   Pods get Running+Ready and a podIP from the bench's kubelet stand-in between sweeps "
            f"(the emulator has no kubelet): {r.kubelet_pods} Pods marked")
    fe = r.from_empty
    row("time until all Ready, from empty", f"{fe.seconds:.1f} s",
        f"{fe.sweeps} sweep(s), {fe.spawns} runner call(s): {fe.by_verb()}")
    if r.mixed:
        row("  of which the kubelet stand-in (bench)", f"{fe.kubelet_seconds:.1f} s",
            "patching Pod status; a real kubelet does this, not the controller")
        row("  runner calls by provider", ", ".join(f"{name} {count}" for name, count in fe.by_provider().items()))
    # The runner's own time, summed over calls: more than the wall time when create batches
    # run side by side, and each of those is slower for sharing the cores.
    creates = Counter[str]()
    for call in fe.calls:
        if call.verb == "create":
            creates[call.provider] += call.operations
    row("  create calls' runner time, summed", f"{sum(fe.create_seconds.values()):.1f} s",
        f"{sum(fe.create_seconds.values()) / max(1, creates.total()):.2f} s per create; runs side by side share "
        f"{os.cpu_count()} cores")
    row("  CPU seconds, all processes", f"{sum(fe.cpu_seconds.values()):.1f} s",
        f"{sum(fe.cpu_seconds.values()) / max(1, creates.total()) * 1000:.1f} ms per create; "
        f"{os.cpu_count()} cores: the fill's floor on a quiet machine is this / {os.cpu_count()}")
    for who, spent in fe.cpu_seconds.items():
        row(f"    {who}", f"{spent:.1f} s", f"{spent / max(1, creates.total()) * 1000:.1f} ms per create")
    if r.mixed:
        for name in r.providers:
            row(f"    {name}", f"{fe.create_seconds[name]:.1f} s",
                f"{fe.create_seconds[name] / max(1, creates[name]):.2f} s per create, {creates[name]} creates")
    row("steady sweep wall time (median of 3)", f"{steady_median:.2f} s",
        f"[{', '.join(f'{p.seconds:.2f}' for p in r.steady)}]  {verdict(steady_median <= TARGET_STEADY_SECONDS)}"
        f" (target <= {TARGET_STEADY_SECONDS:.0f} s){for_target}")
    lists_label = "the list calls (side by side)" if r.mixed else "the one list runner call"
    row(f"  of which {lists_label}", f"{steady_runner:.2f} s", "the slowest list call's wall time")
    row("  of which controller-side (API, diff)", f"{steady_median - steady_runner:.2f} s")
    for name in r.providers:
        times = [p.list_seconds[name] for p in r.steady]
        row(f"  list call {name}", f"{statistics.median(times):.2f} s",
            f"runner's own time, median of [{', '.join(f'{t:.2f}' for t in times)}]; "
            f"{fe.list_seconds[name]:.2f} s with 0 instances")
    by_provider = ", ".join(f"{name} {count}" for name, count in per_provider.items())
    row("runner calls per steady sweep", f"{steady_calls} ({by_provider})",
        f"{verdict(max(per_provider.values()) <= TARGET_CALLS_PER_PROVIDER)} "
        f"(target <= {TARGET_CALLS_PER_PROVIDER} per provider)")
    row("controller peak RSS (RUSAGE_SELF)", f"{r.rss_self_mib:.0f} MiB",
        f"{verdict(r.rss_self_mib <= rss_target)} (target <= {rss_target:.0f} MiB)")
    row("runner children peak RSS (RUSAGE_CHILDREN)", f"{r.rss_children_mib:.0f} MiB",
        "largest single ansible-playbook/module process, not counted above")

    say()
    say(f"== per-object: one runner call per Proxy per reconcile (Operator SDK style), sample of {s} "
        f"({', '.join(f'{name} {count}' for name, count in share(s, list(r.providers)).items())})")
    ps, pe = r.per_object_steady, r.per_object_empty
    pe_creates = sum(1 for c in pe.calls if c.verb == "create")
    pe_lists = pe.spawns - pe_creates
    row(f"steady pass over {s} Ready Proxies", f"{ps.seconds:.1f} s", f"measured, {ps.spawns} runner calls")
    row("  per Proxy", f"{ps.seconds / s:.2f} s", "measured")
    row(f"steady pass over {n}", f"{ps.seconds * scale:.0f} s ({ps.seconds * scale / 60:.1f} min)",
        f"EXTRAPOLATED, {n} runner calls")
    row(f"from empty, {s} Proxies (batch size 1)", f"{pe.seconds:.1f} s",
        f"measured, {pe.sweeps} sweep(s), {pe.spawns} runner calls: {pe.by_verb()}")
    row(f"from empty, {n} Proxies", f"{pe.seconds * scale:.0f} s ({pe.seconds * scale / 60:.1f} min)",
        f"EXTRAPOLATED, {round(pe_creates * scale) + pe_lists} runner calls")

    say()
    say("== per-object / batch")
    steady_ratio = n / max(1, steady_calls)
    empty_ratio = (pe_creates * scale + pe_lists) / max(1, fe.spawns)
    row("runner spawns, steady sweep", f"{steady_ratio:.0f}x",
        f"{n} vs {steady_calls}  {verdict(steady_ratio >= TARGET_SPAWN_RATIO)} (target >= {TARGET_SPAWN_RATIO:.0f}x)")
    row("runner spawns, from empty", f"{empty_ratio:.0f}x",
        f"{round(pe_creates * scale) + pe_lists} vs {fe.spawns}  {verdict(empty_ratio >= TARGET_SPAWN_RATIO)}"
        f" (target >= {TARGET_SPAWN_RATIO:.0f}x)")
    row("steady sweep time", f"{ps.seconds * scale / steady_median:.0f}x",
        f"{ps.seconds * scale:.0f} s (extrapolated) vs {steady_median:.2f} s (measured)")
    row("time until all Ready from empty", f"{pe.seconds * scale / fe.seconds:.1f}x",
        f"{pe.seconds * scale:.0f} s (extrapolated) vs {fe.seconds:.0f} s (measured)")
    print_listings(r)
    print_table(r)
    say()
    say("== load average (1, 5, 15 min) of the machine: " + "; ".join(
        f"{when} {' '.join(f'{value:.2f}' for value in load)}" for when, load in r.loads.items()))
    if r.profile:
        say()
        say("== cProfile of one more steady sweep (the controller process: its main thread and the sweep's worker "
            "threads merged; the main thread waiting for them shows as lock acquire, a worker waiting for the runner "
            "as poll, for the API as socket reads)")
        say(r.profile)
    if r.profile_fill:
        say()
        say("== cProfile of the fill from empty (the controller process, threads merged as above)")
        say(r.profile_fill)


def fleet_list_figure(r: Results) -> ListingFigure:
    """The fleet's KVM list call in the steady sweeps (every instance of the fleet's KVM share)."""
    return ListingFigure(KVM_PROVIDER, DESCRIPTIONS[KVM_PROVIDER].format(hosts=r.hosts), r.providers[KVM_PROVIDER],
                         [p.list_seconds[KVM_PROVIDER] for p in r.steady], r.from_empty.list_seconds[KVM_PROVIDER])


def print_listings(r: Results) -> None:
    figures = [fleet_list_figure(r), *r.listings]
    say()
    say(f"== one list call per provider: the runner's own time, median of {LIST_REPEATS}, and with 0 instances "
        f"(target <= {TARGET_LIST_SECONDS:.0f} s at {TABLE_PROXIES} instances)")
    for figure in figures:
        target = (f"{verdict(figure.median <= TARGET_LIST_SECONDS)}"
                  + ("" if figure.instances == TABLE_PROXIES else f" (target is for {TABLE_PROXIES})"))
        row(f"{figure.provider} ({figure.description})", f"{figure.median:.2f} s",
            f"{figure.instances} instances [{', '.join(f'{t:.2f}' for t in figure.seconds)}]; "
            f"{figure.empty_seconds:.2f} s with 0  {target}")
    if not r.listings:
        say("  (GCP and Kubernetes not measured: --list-instances 0)")


def print_table(r: Results) -> None:
    """Issue 32's table, each figure beside its target."""
    steady = statistics.median(p.seconds for p in r.steady)
    listed = statistics.median(max((c.seconds for c in p.calls), default=0.0) for p in r.steady)
    fe = r.from_empty
    empty = fe.list_seconds.get(KVM_PROVIDER, 0.0)
    rows = [
        ("steady sweep, median of 3", steady, f"{steady:.2f} s ({', '.join(f'{p.seconds:.2f}' for p in r.steady)})",
         TARGET_TABLE_STEADY_SECONDS, "s"),
        ("of which the one list runner call", listed, f"{listed:.2f} s ({empty:.2f} s with 0 instances)",
         TARGET_LIST_SECONDS, "s"),
        ("of which controller-side", steady - listed, f"{steady - listed:.2f} s", TARGET_CONTROLLER_SECONDS, "s"),
        ("controller peak RSS", r.rss_self_mib, f"{r.rss_self_mib:.0f} MiB", TARGET_TABLE_RSS_MIB, "MiB"),
        ("all Ready from empty", fe.seconds, f"{fe.seconds:.0f} s, {fe.spawns} runner calls", TARGET_FILL_SECONDS,
         "s"),
    ]
    say()
    fleet = "" if (r.proxies, r.mixed) == (TABLE_PROXIES, False) else (
        f" (targets are for {TABLE_PROXIES} KVM Proxies; this run has {r.proxies}{' mixed' if r.mixed else ''})")
    say(f"== issue 32's table{fleet}")
    say("| figure | measured | target |")
    say("|---|---|---|")
    for label, value, shown, target, unit in rows:
        say(f"| {label} | {shown} | <= {target:g} {unit}: **{verdict(value <= target)}** |")


# -- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled_workers(profiles: list[cProfile.Profile]) -> Iterator[None]:
    """Profile what ThreadPoolExecutor workers run, too: a sweep lists and reconciles its
    providers in worker threads, which cProfile (one thread's) would show only as the main
    thread waiting. Wraps concurrent.futures' work item (private, fine for a bench)."""
    work_item: Any = concurrent.futures.thread._WorkItem
    original = work_item.run

    def run(self: Any) -> None:
        profiler = cProfile.Profile()
        profiles.append(profiler)
        profiler.enable()
        try:
            original(self)
        finally:
            profiler.disable()
    work_item.run = run
    try:
        yield
    finally:
        work_item.run = original


def profiled(what: str, step: Callable[[], object]) -> str:
    """``step``'s profile, the main thread's and its workers' merged: the workers' time shows
    under their functions, and the main thread's waiting for them as lock acquire."""
    workers: list[cProfile.Profile] = []
    profiler = cProfile.Profile()
    started = time.monotonic()
    with profiled_workers(workers):
        profiler.enable()
        try:
            step()
        finally:
            profiler.disable()
    out = io.StringIO()
    out.write(f"{what} under the profiler: {time.monotonic() - started:.2f} s wall\n")
    stats = pstats.Stats(profiler, stream=out)
    for worker in workers:
        stats.add(worker)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats("egress_proxies", 25)
    return out.getvalue()


def extra_providers(stack: contextlib.ExitStack, work: Path, kube_url: str) -> list[dict[str, Any]]:
    """The GCP (Compute emulator, started here) and Kubernetes provider sections of the mixed fleet."""
    compute_url = stack.enter_context(emulator_process(COMPUTE_LAUNCHER, seed_file(
        work / "compute-seed.json", {"project": GCP_PROJECT, "zones": GCP_ZONES, "instances": []})))
    kubeconfig = write_kubeconfig(work / "kubeconfig", kube_url)
    return [
        {"name": GCP_PROVIDER, "type": "gcp", "gcp": {
            "project": GCP_PROJECT, "zones": list(GCP_ZONES), "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "defaultMachineType": "small", "defaultImage": "debian-12", "apiEndpoint": compute_url}},
        {"name": K8S_PROVIDER, "type": "kubernetes", "kubernetes": {
            "namespace": POD_NAMESPACE, "image": "ubuntu/squid:6.6-24.04_beta", "kubeconfig": str(kubeconfig)}},
    ]


def listing_tags(number: int) -> dict[str, str]:
    return {"crawl.example.com/owner": LISTING_OWNER, "crawl.example.com/proxy": f"{LISTING_NAMESPACE}/p-{number:05d}",
            "crawl.example.com/uid": f"00000000-0000-4000-8000-{number:012d}",
            "crawl.example.com/spec-hash": "0123456789abcdef"}


def seeded_backends(stack: contextlib.ExitStack, work: Path, count: int) -> Path:
    """A Compute emulator and a Kubernetes API emulator (processes of their own) holding ``count``
    instances each of LISTING_OWNER, labelled, annotated and with the metadata the providers give
    their own (built by the collection's code), and the provider config that lists them."""
    names = [f"p-{LISTING_NAMESPACE}-p-{number:05d}-0a1b2c" for number in range(count)]
    metadata = dict(user_data_metadata(CLOUD_INIT.encode(), "plain"))
    instances = []
    for number, name in enumerate(names):
        labels, tags_json = encode_tags(listing_tags(number))
        instances.append({"zone": GCP_ZONES[number % len(GCP_ZONES)], "name": name, "labels": labels,
                          "metadata": {**metadata, TAGS_METADATA_KEY: tags_json, PORT_METADATA_KEY: "3128"}})
    settings = KubernetesSettings(namespace=LISTING_NAMESPACE, image=LISTING_IMAGE)
    pods = [build_pod(settings, InstanceRequest(name=name, user_data=b"", tags=listing_tags(number)), LISTING_NAMESPACE)
            for number, name in enumerate(names)]
    compute_url = stack.enter_context(emulator_process(COMPUTE_LAUNCHER, seed_file(
        work / "listing-compute.json", {"project": GCP_PROJECT, "zones": GCP_ZONES, "instances": instances})))
    kube_url = stack.enter_context(emulator_process(KUBE_LAUNCHER, seed_file(
        work / "listing-kube.json", {"namespaces": [LISTING_NAMESPACE], "crd": False, "pods": pods})))
    config = work / "listing-providers.yaml"
    config.write_text(json.dumps({"owner": LISTING_OWNER, "providers": [
        {"name": GCP_LISTING_PROVIDER, "type": "gcp", "probe": "none", "gcp": {
            "project": GCP_PROJECT, "zones": list(GCP_ZONES), "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "defaultMachineType": "small", "defaultImage": "debian-12", "apiEndpoint": compute_url}},
        {"name": K8S_LISTING_PROVIDER, "type": "kubernetes", "probe": "none", "kubernetes": {
            "namespace": LISTING_NAMESPACE, "image": LISTING_IMAGE,
            "kubeconfig": str(write_kubeconfig(work / "listing-kubeconfig", kube_url))}}]}))
    return config


def timed_list(client: ProviderClient, owner: str, expected: int) -> float:
    """One list call; the runner's own time of it."""
    before = runner_seconds(client.name, "list")
    listing = client.list_instances(owner)
    if listing.error is not None or len(listing.instances) != expected:
        raise BenchError(f"{client.name}: listed {len(listing.instances)} of {expected} ({listing.error})")
    return runner_seconds(client.name, "list") - before


def measure_listings(stack: contextlib.ExitStack, work: Path, runner: CountingRunner,
                     count: int) -> list[ListingFigure]:
    """The GCP and Kubernetes list calls with ``count`` instances each, LIST_REPEATS times, and
    once for an owner with none."""
    config = str(seeded_backends(stack, work, count))
    figures = []
    for name, kind, description in ((GCP_LISTING_PROVIDER, ProviderType.GCP, DESCRIPTIONS[GCP_PROVIDER]),
                                    (K8S_LISTING_PROVIDER, ProviderType.KUBERNETES, DESCRIPTIONS[K8S_PROVIDER])):
        client = ProviderClient(runner, config, name, kind)
        seconds = [timed_list(client, LISTING_OWNER, count) for _ in range(LIST_REPEATS)]
        figures.append(ListingFigure(name, description, count, seconds, timed_list(client, "nobody", 0)))
    return figures


def run(args: argparse.Namespace, stack: contextlib.ExitStack, shutdown: Shutdown) -> Results:
    fleet = [KVM_PROVIDER, GCP_PROVIDER, K8S_PROVIDER] if args.mixed else [KVM_PROVIDER]
    providers = share(args.proxies, fleet)
    results = Results(proxies=args.proxies, sample=min(args.per_object_sample, args.proxies),
                      batch_size=args.batch_size, max_runners=args.max_runners or len(fleet) + 1,
                      providers=providers, hosts=-(-providers[KVM_PROVIDER] // args.proxies_per_host))
    work = Path(tempfile.mkdtemp(prefix="egress-proxies-bench-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    # The modules cache base images here instead of under ~/.cache.
    os.environ["EGRESS_PROXIES_CACHE_DIR"] = str(work / "image-cache")

    say(f"starting {results.hosts} libvirtd(s) (test driver) and the emulator(s) ...")
    daemons = [stack.enter_context(LibvirtTestDaemon()) for _ in range(results.hosts)]
    url = stack.enter_context(emulator_process(KUBE_LAUNCHER, seed_file(work / "kube-seed.json", {
        "namespaces": [POD_NAMESPACE, BATCH_NAMESPACE, PER_OBJECT_NAMESPACE], "crd": True, "pods": []})))
    api = stack.enter_context(client.ApiClient(client.Configuration(host=url)))
    objects = client.CustomObjectsApi(api)
    kubelet = KubeletStandIn(client.CoreV1Api(api), POD_NAMESPACE) if args.mixed else None
    host_entries = [kvm_host(f"h{index:02d}", daemon.uri, pool=POOL) for index, daemon in enumerate(daemons)]
    config = write_kvm_config(work / "providers.yaml", host_entries, make_base_image(work),
                              extra_providers=extra_providers(stack, work, url) if args.mixed else ())
    # The runner's default artifact retention, as shipped: its rotation removes the oldest
    # directories by mtime, in-flight runs' included, so a small keep (5) deletes the artifacts
    # of a create batch still running beside others and that whole batch fails (seen here).
    inner = AnsibleRunner(work / "runner", timeout_seconds=args.runner_timeout, max_concurrent=results.max_runners,
                          collections_path=collections_path())
    # Registered last, so it runs first: no runner call outlives the daemons, the emulators
    # or the work dir.
    shutdown.runner = inner
    stack.callback(shutdown.stop_runner_calls)
    runner = CountingRunner(inner, shutdown.stopping)
    # GC never fires here (every instance belongs to a Proxy); a long grace keeps it that way
    # for the per-object sample's instances too.
    settings = ReconcileSettings(gc_grace_seconds=10**9, batch_size=args.batch_size)

    results.loads["start"] = os.getloadavg()
    say(f"creating {args.proxies} Proxies in the emulator ...")
    create_proxies(objects, BATCH_NAMESPACE, args.proxies, fleet)
    store = KubeStore(api, namespace=BATCH_NAMESPACE)
    reconciler = Reconciler(store, runner, str(config), settings, parts=SweepParts(backoff=Backoff()))

    say("batch: sweeping from empty until all are Ready ...")

    def fill() -> None:
        results.from_empty = until_ready(reconciler, store, runner, fleet, args.max_sweeps, kubelet)
    if args.profile_fill:
        results.profile_fill = profiled("the fill from empty (its figures are the profiler's too)", fill)
    else:
        fill()
    results.kubelet_pods = kubelet.marked if kubelet else 0
    say(f"  all Ready after {results.from_empty.seconds:.1f} s; {STEADY_SWEEPS} steady sweeps ...")
    results.steady = steady_sweeps(reconciler, runner, fleet, STEADY_SWEEPS)
    results.loads["after the steady sweeps"] = os.getloadavg()
    if args.profile:
        results.profile = profiled("one steady sweep", lambda: checked(reconciler.sweep()))

    say(f"per-object: steady pass over {results.sample} of the Ready Proxies ...")
    proxies, _ = store.list_proxies()
    # The same round-robin mix as the fleet: the first ``sample`` Proxies by name.
    proxies.sort(key=lambda p: p.name)
    strategy = PerObjectStrategy(reconciler, runner, str(config))
    results.per_object_steady = strategy.measure(proxies[:results.sample])

    say(f"per-object: {results.sample} Proxies from empty, batch size 1 ...")
    # From empty means no domains: drop the batch run's, so placement sees an empty host.
    for daemon in daemons:
        daemon.reset()
    create_proxies(objects, PER_OBJECT_NAMESPACE, results.sample, fleet)
    sample_store = KubeStore(api, namespace=PER_OBJECT_NAMESPACE)
    per_object = Reconciler(sample_store, runner, str(config),
                            ReconcileSettings(gc_grace_seconds=10**9, batch_size=1),
                            parts=SweepParts(backoff=Backoff()))
    results.per_object_empty = until_ready(per_object, sample_store, runner, fleet, args.max_sweeps, kubelet)

    # Read before the daemons and the emulators are stopped and waited for, so that
    # RUSAGE_CHILDREN holds only the runner processes (and qemu-img).
    results.rss_self_mib = peak_rss_mib(resource.RUSAGE_SELF)
    results.rss_children_mib = peak_rss_mib(resource.RUSAGE_CHILDREN)
    if args.list_instances:
        say(f"listing: {args.list_instances} instances each on a seeded Compute emulator and Kubernetes API "
            "emulator ...")
        results.listings = measure_listings(stack, work, runner, args.list_instances)
        results.loads["after the listings"] = os.getloadavg()
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--proxies", type=int, default=1000, help="Proxies to create (default: %(default)s)")
    parser.add_argument("--mixed", action="store_true",
                        help="split the Proxies over KVM, GCP (Compute emulator) and Kubernetes Pods in one controller")
    parser.add_argument("--per-object-sample", type=int, default=30,
                        help="Proxies the per-object mode is measured on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=ReconcileSettings.batch_size,
                        help="module calls per runner call in batch mode (default: the controller's, %(default)s)")
    parser.add_argument("--proxies-per-host", type=int, default=PROXIES_PER_HOST,
                        help="KVM Proxies per test-driver libvirtd (at most 99 fit one; default: %(default)s)")
    parser.add_argument("--max-runners", type=int, default=None,
                        help="concurrent runner processes (default: one per provider plus one, so a sweep's "
                             "list calls never wait for each other: 2, or 4 with --mixed)")
    parser.add_argument("--runner-timeout", type=int, default=1800, help="seconds per runner call")
    parser.add_argument("--max-sweeps", type=int, default=5, help="give up when not all Ready after this many")
    parser.add_argument("--profile", action="store_true", help="also cProfile one steady sweep (controller side)")
    parser.add_argument("--profile-fill", action="store_true",
                        help="cProfile the fill from empty (controller side; its figures then include the profiler)")
    parser.add_argument("--list-instances", type=int, default=None,
                        help="instances each of the GCP and Kubernetes list calls are measured with, on emulators "
                             "seeded apart from the fleet (default: --proxies; 0: not measured)")
    args = parser.parse_args(argv)
    if args.list_instances is None:
        args.list_instances = args.proxies
    if min(args.proxies, args.per_object_sample, args.proxies_per_host, args.max_runners or 1) < 1:
        parser.error("--proxies, --per-object-sample, --proxies-per-host and --max-runners must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        say("controller_bench: needs root (the test libvirtd runs in a private mount namespace)")
        return 2
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    shutdown = Shutdown()
    outcome: list[Results | BaseException] = []

    def measure(stack: contextlib.ExitStack) -> None:
        try:
            outcome.append(run(args, stack, shutdown))
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which re-raises it
            outcome.append(error)

    try:
        with contextlib.ExitStack() as stack:
            # The measurement runs in a thread, as the controller's sweeps do (loop.Controller),
            # so the main thread keeps the signals: a Ctrl-C cancels the runner calls and the
            # ExitStack stops every daemon and emulator.
            worker = threading.Thread(target=measure, args=(stack,), name="bench", daemon=True)
            worker.start()
            try:
                while worker.is_alive():
                    worker.join(0.5)
            except KeyboardInterrupt:
                # Stop the runner calls and let the thread unwind before the daemons and the
                # emulators go (the ExitStack), so nothing it starts outlives them.
                shutdown.stop_runner_calls()
                worker.join(60)
                raise
        (result,) = outcome
        if isinstance(result, BaseException):
            raise result
        results = result
    except KeyboardInterrupt:
        say("interrupted; every process and temporary directory of the bench was removed")
        return 130
    except (BenchError, Stopping) as error:
        say(f"controller_bench: {str(error) or type(error).__name__}")
        return 1
    print_results(results)
    say()
    say(f"total bench time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
