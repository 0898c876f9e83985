"""Benchmark of the controller at scale: prints figures, asserts nothing (not part of pytest).

N Proxies in the Kubernetes API emulator (its own process, so its memory is not the
controller's), the KVM provider on libvirt's test driver served by a libvirtd (another
process), and the real ``Reconciler`` + ``KubeStore`` + ``AnsibleRunner`` running the real
modules. This process hosts only the controller, so its peak RSS is the controller's.

Measured, in this order:

1. batch (the controller as shipped): sweeps from empty until all N are Ready, then three
   steady sweeps;
2. per-object steady state (what the Operator SDK's Ansible operator does: one runner call
   per Proxy per reconcile, here ``kvm_proxy_info`` by providerID) on a sample of the N;
3. per-object from empty (``kvm_proxy`` create with a batch of one per Proxy) on a sample of
   fresh Proxies, after the test driver has been emptied.

A full per-object pass over 1,000 Proxies takes 16-20 minutes here, so per-object figures are
measured on the sample and extrapolated linearly to N; the output labels every figure as
measured or extrapolated.

Run as root from the repository root (the test daemon needs a mount namespace):
``.venv/bin/python bench/controller_bench.py [--proxies 1000] [--per-object-sample 30]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
# The controller is installed editable in .venv; the test helpers (the emulator, the test
# daemon, provider configs) are imported the way pytest imports them, from tests/.
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from kubernetes import client  # noqa: E402

from egress_proxies.backoff import Backoff  # noqa: E402
from egress_proxies.kube import KubeStore  # noqa: E402
from egress_proxies.model import GROUP, PHASE_READY, PLURAL, VERSION, Proxy, spec_hash  # noqa: E402
from egress_proxies.reconcile import Reconciler, ReconcileSettings, SweepReport  # noqa: E402
from egress_proxies.runner import AnsibleRunner, Operation, OperationResult  # noqa: E402
from support.ansible_modules import collections_path  # noqa: E402
from support.libvirt_daemon import LibvirtTestDaemon  # noqa: E402
from support.provider_config import kvm_host, make_base_image, write_kvm_config  # noqa: E402

MIB = 1024 * 1024
PROVIDER = "lab"  # the one KVM provider support.provider_config writes
POOL = "default-pool"  # the test driver's built-in pool
# The test driver gives every pool 100 GiB and a volume without <allocation> allocates its
# capacity, so one host holds at most 99 overlays of the smallest disk (1 GiB): the bench runs
# one test-driver libvirtd per this many Proxies, each a KVM host of the one provider (as a
# real fleet would spread 1,000 proxy VMs over many hypervisors).
PROXIES_PER_HOST = 90
BATCH_NAMESPACE = "bench"
PER_OBJECT_NAMESPACE = "bench-per-object"
# A Proxy as a crawler team would write it: the provider picks the host (placement runs).
SPEC = {"provider": PROVIDER, "cloudInit": "#cloud-config\npackages: [squid]\n"}
STEADY_SWEEPS = 3
# The targets (for 1,000 Proxies on this 2-core machine).
TARGET_STEADY_SECONDS = 10.0
TARGET_CALLS_PER_PROVIDER = 1
TARGET_SPAWN_RATIO = 100.0
TARGET_RSS_MIB = 200.0

# Runs in its own process: the emulator's memory (every object, its history) must not count
# against the controller's RSS. It serves until its stdin closes, so it also ends when the
# bench dies without cleaning up.
# TCP_NODELAY on its connections, as a real API server has (Go sets it on every TCP
# connection): without it every request whose response is small (a PUT, a GET of one object)
# waits ~40 ms for the client's delayed ACK (Nagle), measured 44 ms against 0.6 ms, which
# would make the emulator, not the controller, dominate every write-heavy figure.
EMULATOR_LAUNCHER = """
import sys
from support import kube_emulator
from support.kube_emulator import KubeEmulator
kube_emulator._Handler.disable_nagle_algorithm = True
emulator = KubeEmulator(port=0).start()
sys.stdout.write(emulator.url + "\\n")
sys.stdout.flush()
sys.stdin.read()
emulator.stop()
"""


class BenchError(RuntimeError):
    """The bench could not measure what it set out to (a sweep failed, Proxies never got Ready)."""


class Stopping(Exception):
    """The bench is being interrupted: no new runner call may start."""


@dataclass
class Shutdown:
    """What an interrupt needs to stop the measurement thread's runner calls, and only those."""

    stopping: threading.Event = field(default_factory=threading.Event)
    spare: set[int] = field(default_factory=set)  # our children that stop through their own cleanup

    def stop_runner_calls(self) -> None:
        self.stopping.set()
        kill_children(self.spare)


def say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- the pieces ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    verb: str
    operations: int
    seconds: float


class CountingRunner:
    """The real AnsibleRunner, recording each call's verb, size and wall time."""

    def __init__(self, inner: AnsibleRunner, stopping: threading.Event) -> None:
        self.inner = inner
        self.stopping = stopping
        self.calls: list[Call] = []

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        if self.stopping.is_set():
            raise Stopping
        started = time.monotonic()
        results = self.inner.run(provider, verb, operations)
        self.calls.append(Call(verb, len(operations), time.monotonic() - started))
        return results


@dataclass
class Phase:
    """What one measured stretch cost: wall time, sweeps and the runner calls made in it."""

    seconds: float = 0.0
    sweeps: int = 0
    calls: list[Call] = field(default_factory=list)

    @property
    def spawns(self) -> int:
        return len(self.calls)

    @property
    def runner_seconds(self) -> float:
        return sum(call.seconds for call in self.calls)

    def by_verb(self) -> str:
        counts = Counter(call.verb for call in self.calls)
        return ", ".join(f"{count} {verb}" for verb, count in sorted(counts.items())) or "none"


@contextlib.contextmanager
def emulator_process() -> Iterator[str]:
    """The Kubernetes API emulator in a child process; yields its URL."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    # Its own session: a Ctrl-C reaches only the bench, which then stops it in order.
    process = subprocess.Popen([sys.executable, "-c", EMULATOR_LAUNCHER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise BenchError(f"the Kubernetes API emulator did not start (exit {process.poll()})")
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


def own_children() -> set[int]:
    """The pids whose parent is this process."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == me:
            found.add(int(stat.parent.name))
    return found


def kill_children(spare: set[int]) -> None:
    """Kill the process groups of our children not in ``spare`` (an interrupted runner call).

    ansible-runner starts ansible-playbook through pexpect, which makes it a session leader,
    so a Ctrl-C in the terminal never reaches it, and ansible-runner does not stop it on a
    KeyboardInterrupt. Only direct children of this process (and their groups) are touched;
    ``spare`` are the daemon and the emulator, which stop in order through their own cleanup.
    """
    for pid in own_children() - spare:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- the workload ----------------------------------------------------------------------------------


def create_proxies(objects: client.CustomObjectsApi, namespace: str, count: int) -> None:
    for index in range(count):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                "metadata": {"name": f"proxy-{index:05d}", "namespace": namespace}, "spec": dict(SPEC)}
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def ready_count(store: KubeStore) -> tuple[int, int]:
    proxies, _ = store.list_proxies()
    return sum(1 for p in proxies if p.status.get("phase") == PHASE_READY), len(proxies)


def checked(report: SweepReport) -> SweepReport:
    if not report.ok:
        raise BenchError(f"a sweep failed: {'; '.join(report.errors)}")
    return report


def until_ready(reconciler: Reconciler, store: KubeStore, runner: CountingRunner, max_sweeps: int) -> Phase:
    """Sweep from empty until every Proxy of ``store`` is Ready."""
    mark = len(runner.calls)
    started = time.monotonic()
    phase = Phase()
    while True:
        checked(reconciler.sweep())
        phase.sweeps += 1
        ready, total = ready_count(store)
        if ready == total:
            break
        if phase.sweeps >= max_sweeps:
            raise BenchError(f"only {ready} of {total} Proxies Ready after {phase.sweeps} sweeps")
    phase.seconds = time.monotonic() - started
    phase.calls = runner.calls[mark:]
    return phase


def steady_sweeps(reconciler: Reconciler, runner: CountingRunner, count: int) -> list[Phase]:
    phases = []
    for _ in range(count):
        mark = len(runner.calls)
        started = time.monotonic()
        report = checked(reconciler.sweep())
        if report.created or report.deleted:
            raise BenchError(f"a steady sweep changed instances: {report}")
        phases.append(Phase(time.monotonic() - started, 1, runner.calls[mark:]))
    return phases


class PerObjectStrategy:
    """What the Operator SDK's Ansible operator does in steady state: one runner call per
    Proxy per reconcile (``kvm_proxy_info`` by providerID), then that Proxy's status.

    The status comes from the controller's own ``Reconciler._observe``, so both modes do the
    same work per Proxy apart from how they ask the provider.
    """

    def __init__(self, reconciler: Reconciler, runner: CountingRunner, config_path: str) -> None:
        self.reconciler = reconciler
        self.runner = runner
        self.config_path = config_path

    def reconcile(self, proxy: Proxy) -> None:
        (result,) = self.runner.run(PROVIDER, "get", [Operation("kvm_proxy_info", {
            "provider_config": self.config_path, "provider": PROVIDER,
            "provider_id": proxy.status["providerID"]}, key=proxy.uid)])
        if not result.ok:
            raise BenchError(f"{proxy.key}: kvm_proxy_info failed ({result.error_class}): {result.message}")
        (instance,) = result.result["instances"]
        self.reconciler._observe(proxy, instance, spec_hash(proxy.spec))

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
class Results:
    proxies: int
    sample: int
    batch_size: int
    hosts: int
    empty_list_seconds: float = 0.0
    from_empty: Phase = field(default_factory=Phase)
    steady: list[Phase] = field(default_factory=list)
    per_object_steady: Phase = field(default_factory=Phase)
    per_object_empty: Phase = field(default_factory=Phase)
    rss_self_mib: float = 0.0
    rss_children_mib: float = 0.0
    profile: str = ""


def print_results(r: Results) -> None:
    n, s = r.proxies, r.sample
    scale = n / s
    steady_median = statistics.median(p.seconds for p in r.steady)
    steady_runner = statistics.median(p.runner_seconds for p in r.steady)
    steady_calls = max(p.spawns for p in r.steady)
    for_target = "" if n == 1000 else f" (target is for 1000; this run has {n})"

    say()
    say(f"== batch: the controller as shipped, {n} Proxies on 1 provider of {r.hosts} KVM host(s), "
        f"batch size {r.batch_size} (all measured)")
    fe = r.from_empty
    row("time until all Ready, from empty", f"{fe.seconds:.1f} s",
        f"{fe.sweeps} sweep(s), {fe.spawns} runner call(s): {fe.by_verb()}")
    # Summed over calls: more than the wall time when create batches run side by side.
    row("  runner call time, summed", f"{fe.runner_seconds:.1f} s",
        f"{fe.runner_seconds / max(1, sum(c.operations for c in fe.calls if c.verb == 'create')):.2f} s per create")
    row("steady sweep wall time (median of 3)", f"{steady_median:.2f} s",
        f"[{', '.join(f'{p.seconds:.2f}' for p in r.steady)}]  {verdict(steady_median <= TARGET_STEADY_SECONDS)}"
        f" (target <= {TARGET_STEADY_SECONDS:.0f} s){for_target}")
    row("  of which the one list runner call", f"{steady_runner:.2f} s",
        f"the same call with 0 instances took {r.empty_list_seconds:.2f} s")
    row("  of which controller-side (API, diff)", f"{steady_median - steady_runner:.2f} s")
    row("runner calls per steady sweep", f"{steady_calls} (1 provider)",
        f"{verdict(steady_calls <= TARGET_CALLS_PER_PROVIDER)} (target <= {TARGET_CALLS_PER_PROVIDER} per provider)")
    row("controller peak RSS (RUSAGE_SELF)", f"{r.rss_self_mib:.0f} MiB",
        f"{verdict(r.rss_self_mib <= TARGET_RSS_MIB)} (target <= {TARGET_RSS_MIB:.0f} MiB)")
    row("runner children peak RSS (RUSAGE_CHILDREN)", f"{r.rss_children_mib:.0f} MiB",
        "largest single ansible-playbook/module process, not counted above")

    say()
    say(f"== per-object: one runner call per Proxy per reconcile (Operator SDK style), sample of {s}")
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
    if r.profile:
        say()
        say("== cProfile of one more steady sweep (controller process only; waiting for the runner "
        "shows as lock acquire, for the API as socket reads)")
        say(r.profile)


# -- the run ---------------------------------------------------------------------------------------


def profile_sweep(reconciler: Reconciler) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    checked(reconciler.sweep())
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
    return out.getvalue()


def run(args: argparse.Namespace, stack: contextlib.ExitStack, shutdown: Shutdown) -> Results:
    results = Results(proxies=args.proxies, sample=min(args.per_object_sample, args.proxies),
                      batch_size=args.batch_size, hosts=-(-args.proxies // args.proxies_per_host))
    work = Path(tempfile.mkdtemp(prefix="egress-proxies-bench-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    # The modules cache base images here instead of under ~/.cache.
    os.environ["EGRESS_PROXIES_CACHE_DIR"] = str(work / "image-cache")

    hosts = results.hosts
    say(f"starting {hosts} libvirtd(s) (test driver) and the Kubernetes API emulator ...")
    daemons = [stack.enter_context(LibvirtTestDaemon()) for _ in range(hosts)]
    url = stack.enter_context(emulator_process())
    api = stack.enter_context(client.ApiClient(client.Configuration(host=url)))
    objects = client.CustomObjectsApi(api)
    host_entries = [kvm_host(f"h{index:02d}", daemon.uri, pool=POOL) for index, daemon in enumerate(daemons)]
    config = write_kvm_config(work / "providers.yaml", host_entries, make_base_image(work))
    # Registered last, so it runs first: no runner call outlives the daemons or the work dir.
    shutdown.spare = own_children()
    stack.callback(shutdown.stop_runner_calls)
    runner = CountingRunner(AnsibleRunner(work / "runner", timeout_seconds=args.runner_timeout,
                                          max_concurrent=args.max_runners, keep_artifacts=5,
                                          collections_path=collections_path()), shutdown.stopping)
    # GC never fires here (every instance belongs to a Proxy); a long grace keeps it that way
    # for the per-object sample's instances too.
    settings = ReconcileSettings(gc_grace_seconds=10**9, batch_size=args.batch_size)

    say(f"creating {args.proxies} Proxies in the emulator ...")
    create_proxies(objects, BATCH_NAMESPACE, args.proxies)
    store = KubeStore(api, namespace=BATCH_NAMESPACE)
    reconciler = Reconciler(store, runner, str(config), settings, backoff=Backoff())

    say("batch: sweeping from empty until all are Ready ...")
    results.from_empty = until_ready(reconciler, store, runner, args.max_sweeps)
    results.empty_list_seconds = next(c.seconds for c in results.from_empty.calls if c.verb == "list")
    say(f"  all Ready after {results.from_empty.seconds:.1f} s; {STEADY_SWEEPS} steady sweeps ...")
    results.steady = steady_sweeps(reconciler, runner, STEADY_SWEEPS)
    if args.profile:
        results.profile = profile_sweep(reconciler)

    say(f"per-object: steady pass over {results.sample} of the Ready Proxies ...")
    proxies, _ = store.list_proxies()
    strategy = PerObjectStrategy(reconciler, runner, str(config))
    results.per_object_steady = strategy.measure(proxies[:results.sample])

    say(f"per-object: {results.sample} Proxies from empty, batch size 1 ...")
    # From empty means no domains: drop the batch run's, so placement sees an empty host.
    for daemon in daemons:
        daemon.reset()
    create_proxies(objects, PER_OBJECT_NAMESPACE, results.sample)
    sample_store = KubeStore(api, namespace=PER_OBJECT_NAMESPACE)
    per_object = Reconciler(sample_store, runner, str(config),
                            ReconcileSettings(gc_grace_seconds=10**9, batch_size=1), backoff=Backoff())
    results.per_object_empty = until_ready(per_object, sample_store, runner, args.max_sweeps)

    # Read before the daemon and the emulator are stopped and waited for, so that
    # RUSAGE_CHILDREN holds only the runner processes (and qemu-img).
    results.rss_self_mib = peak_rss_mib(resource.RUSAGE_SELF)
    results.rss_children_mib = peak_rss_mib(resource.RUSAGE_CHILDREN)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--proxies", type=int, default=1000, help="Proxies to create (default: %(default)s)")
    parser.add_argument("--per-object-sample", type=int, default=30,
                        help="Proxies the per-object mode is measured on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=ReconcileSettings.batch_size,
                        help="module calls per runner call in batch mode (default: the controller's, %(default)s)")
    parser.add_argument("--proxies-per-host", type=int, default=PROXIES_PER_HOST,
                        help="Proxies per test-driver libvirtd (at most 99 fit one; default: %(default)s)")
    parser.add_argument("--max-runners", type=int, default=2, help="concurrent runner processes (default: 2)")
    parser.add_argument("--runner-timeout", type=int, default=1800, help="seconds per runner call")
    parser.add_argument("--max-sweeps", type=int, default=5, help="give up when not all Ready after this many")
    parser.add_argument("--profile", action="store_true", help="also cProfile one steady sweep (controller side)")
    args = parser.parse_args(argv)
    if min(args.proxies, args.per_object_sample, args.proxies_per_host) < 1:
        parser.error("--proxies, --per-object-sample and --proxies-per-host must be at least 1")
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
            # The measurement runs in a thread, as the controller's sweeps do (loop.Controller):
            # ansible-runner replaces the SIGINT/SIGTERM handlers when called from the main
            # thread (to cancel its run instead), which would make Ctrl-C stop one runner call
            # and let the bench carry on. Here the main thread keeps the signals.
            worker = threading.Thread(target=measure, args=(stack,), name="bench", daemon=True)
            worker.start()
            try:
                while worker.is_alive():
                    worker.join(0.5)
            except KeyboardInterrupt:
                # Stop the runner calls and let the thread unwind before the daemons and the
                # emulator go (the ExitStack), so nothing it starts outlives them.
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
    except BenchError as error:
        say(f"controller_bench: {error}")
        return 1
    print_results(results)
    say()
    say(f"total bench time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
