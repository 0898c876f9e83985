"""Chaos run of the controller: faults everywhere, then prove nothing was lost, doubled or wedged.

The real controller process (``egress-proxies --source kubernetes``, the command as shipped) runs
against the Kubernetes API emulator (a process of its own) and KVM hosts served by libvirt's test
driver (one ``libvirtd`` per ``--proxies-per-host`` Proxies), while this process, from one seed:

- answers about ``--api-fault-rate`` of all Kubernetes API requests with an injected error
  (``KubeEmulator.fail_randomly``: a read 500, a write 500 or 409 half each; nothing processed);
- cuts about ``--module-fault-rate`` of module runs: every KVM host's libvirt socket is reached
  through a relay in this process (``FlakyRelay``) that cuts the connections a seeded
  ``CutSchedule`` picks, at accept or after some replies (so some batch creates die half-way,
  after some domains were defined). A module run opens one connection per host it touches; a
  listing or a placed batch create touches every host, so ``1 - (1 - rate) ** (1 / hosts)`` of
  the connections are cut. What the module then sees (libvirt's "Cannot write data: Broken
  pipe", "client socket is closed") it classifies transient by its own rules: nothing in the
  shipped modules, their paths or the controller is replaced or configured for the test;
- stores a few malformed Proxies with the emulator's ``store_unvalidated`` back door (what a real
  server holds when a CRD's schema tightened after they were written);
- SIGKILLs the controller at three seeded moments and starts it again at once (same identity, as
  a kubelet restarting the container: it takes its Lease straight back);
- creates and deletes Proxies at seeded moments throughout.

Then every fault stops (API, relay; the last kill is already behind) and the run waits until the
fleet converges: every valid live Proxy Ready with exactly one instance, no owned instance
without its Proxy, no deleting Proxy still holding the finalizer. It prints those four counts
(all must be 0) and the time to converge after the last fault. The GC grace is 5 s here
(``--gc-grace``; 600 s by default) so that leaked instances are collected within the run.

The test driver's made-up guest addresses (192.168.122.x) are never contacted: the controller
does not probe them (the provider config says ``probe: none``) and this process only talks to
127.0.0.1 and unix sockets. Run as root from the repository root:
``.venv/bin/python bench/chaos_bench.py [--proxies 1000] [--seed 11]``; the 100-Proxy version
runs in the suite (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import libvirt
import yaml

# Imported first: it puts tests/ on sys.path, as pytest has it, for the emulators and daemons.
from controller_bench import CLOUD_INIT, KVM_PROVIDER, POOL, PROXIES_PER_HOST, TESTS, BenchError, interrupt, say
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from egress_proxies.providers.runner import kill_run_processes
from egress_proxies.resources.proxy import (
    FINALIZER,
    GROUP,
    OWNER_TAG,
    PHASE_FAILED,
    PHASE_READY,
    PLURAL,
    UID_TAG,
    VERSION,
)
from support import waiting
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, kvm_host, make_base_image, write_kubeconfig, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

# The instances are read back with the collection's own parser of its domain metadata.
if collections_path() not in sys.path:
    sys.path.insert(0, collections_path())
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import (
    parse_domain_xml,
)

NAMESPACE = "chaos"
LEASE_NAMESPACE = "egress-proxies"
IDENTITY = "chaos-controller"
KILLS = 3
# Malformed Proxies as an old schema (or none) let them in; each must go Failed alone.
MALFORMED_SPECS: tuple[Any, ...] = (
    {"provider": KVM_PROVIDER, "port": "abc"},
    {"provider": KVM_PROVIDER, "cloudInit": 12345},
    [KVM_PROVIDER],
    {"provider": KVM_PROVIDER, "port": 0},
)
# From the controller's log: each runner call (one module run per operation; a batch create is
# one module run for up to 50 instances), and each Proxy whose step failed transient.
RUNNER_LINE = re.compile(r"runner \S+ (\S+): (\d+) operation\(s\), (\d+) failed")
TRANSIENT_LINE = re.compile(r" egress_proxies\.status: \S+: (\w+): transient: ")

# The emulator in a child process that takes commands, one JSON object a line on stdin, and
# answers each with one JSON line: the back door and the fault switch live in its process.
KUBE_LAUNCHER = """
import json, sys
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd
emulator = KubeEmulator(port=0, namespaces=sys.argv[1:], crds=[proxy_crd()]).start()
print(emulator.url, flush=True)
for line in sys.stdin:
    command = json.loads(line)
    if command["op"] == "store_unvalidated":
        emulator.store_unvalidated(command["object"])
    elif command["op"] == "fail_randomly":
        emulator.fail_randomly(command["rate"], command["seed"])
    answer = {"injected": {str(k): v for k, v in emulator.random_faults_injected.items()},
              "requests": len(emulator.requests())}
    print(json.dumps(answer), flush=True)
emulator.stop()
"""

T = TypeVar("T")


class Emulator:
    """The Kubernetes API emulator's child process and its command channel."""

    def __init__(self, namespaces: tuple[str, ...]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-c", KUBE_LAUNCHER, *namespaces], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.close()
            raise BenchError(f"the Kubernetes API emulator did not start (exit {self.process.poll()})")

    def command(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class CutSchedule:
    """Which libvirt connections the relays cut, one schedule for all of them: one connection in
    every ``round(1 / rate)``, at a seeded place in each block (steadier than a coin per
    connection, which over the few dozen module runs of a small fleet often cuts none). The cut
    lands after some of the daemon's replies (counted as reads from its socket); a connection
    that ends before its cut point hands the cut on to the next one."""

    def __init__(self, rng: random.Random, rate: float) -> None:
        self.rng = rng
        self.rate = rate
        self.connections = 0
        self.cut = 0
        self._lock = threading.Lock()
        self._owed = 0
        self._block_end = 0
        self._cut_index = -1

    def draw(self) -> int | None:
        """For a new connection: after how many replies to cut it, or None."""
        with self._lock:
            index = self.connections
            self.connections += 1
            if not self.rate:
                return None
            if index >= self._block_end:
                size = max(1, round(1 / self.rate))
                self._cut_index, self._block_end = index + self.rng.randrange(size), index + size
            if index != self._cut_index and not self._owed:
                return None
            if index != self._cut_index:
                # A cut handed on: early, in the handshake, so that it lands (many connections
                # live only a few replies, measured).
                self._owed -= 1
                return self.rng.randint(0, 3)
            # Half at once or in the first replies, half anywhere in the first hundred (some
            # domains of a batch created, the rest not).
            return self.rng.randint(0, 3) if self.rng.random() < 0.5 else self.rng.randint(0, 100)

    def landed(self) -> None:
        with self._lock:
            self.cut += 1

    def missed(self) -> None:
        with self._lock:
            self._owed += 1


class FlakyRelay:
    """A unix-socket relay in front of one libvirtd that cuts the connections ``schedule`` picks:
    at accept, or after some of the daemon's replies (a host that drops off mid-call)."""

    def __init__(self, target: Path, path: Path, schedule: CutSchedule) -> None:
        self.target = str(target)
        self.path = path
        self.schedule = schedule
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(128)
        self._stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{path.name}").start()

    @property
    def uri(self) -> str:
        return f"test+unix:///default?socket={self.path}"

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            cut_after = self.schedule.draw()
            threading.Thread(target=self._relay, args=(downstream, cut_after), daemon=True).start()

    def _relay(self, downstream: socket.socket, cut_after: int | None) -> None:
        with downstream, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            if cut_after == 0:
                self.schedule.landed()
                return  # refused at once
            try:
                upstream.connect(self.target)
                replies = 0
                while True:
                    readable, _, _ = select.select([downstream, upstream], [], [], 60)
                    for source in readable:
                        data = source.recv(65536)
                        if not data:
                            if cut_after is not None:
                                self.schedule.missed()
                            return
                        (upstream if source is downstream else downstream).sendall(data)
                        if source is upstream:
                            replies += 1
                            # No cut once the faults are off (rate 0): the last fault is over.
                            if cut_after is not None and replies >= cut_after and self.schedule.rate:
                                self.schedule.landed()
                                return  # the host drops off mid-conversation
            except OSError:
                return


@dataclass
class Fleet:
    """What the run did and what it found."""

    proxies: int
    hosts: int
    seed: int
    created: int = 0
    deleted: int = 0
    malformed: set[str] = field(default_factory=set)
    kills: list[float] = field(default_factory=list)  # seconds since the chaos began
    chaos_seconds: float = 0.0
    converge_seconds: float | None = None  # after the last fault; None: never within the timeout
    counts: dict[str, int] = field(default_factory=dict)
    api_requests: int = 0
    api_injected: dict[str, int] = field(default_factory=dict)
    relay_connections: int = 0
    relay_cut: int = 0
    module_runs: Counter[str] = field(default_factory=Counter)
    module_failed: Counter[str] = field(default_factory=Counter)
    transient: Counter[str] = field(default_factory=Counter)  # Proxy steps failed transient, by reason
    malformed_failed: int = 0
    not_ready: Counter[str] = field(default_factory=Counter)  # live valid Proxies not Ready, by condition
    ready: int = 0
    live: int = 0
    total_seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return self.converge_seconds is not None and not any(self.counts.values())


def retried(call: Callable[[], T], attempts: int = 30) -> T:
    """The bench's own API calls meet the same injected faults as the controller's: retry them."""
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as error:
            if error.status not in (409, 500) or attempt == attempts - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


class Controller:
    """The real ``egress-proxies`` process; SIGKILLed and restarted by the chaos."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.incarnations = 0

    def start(self) -> None:
        env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path(), "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            # Its own session: a Ctrl-C of the bench reaches only the bench, which stops it in order.
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.incarnations += 1

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def instances(daemons: list[LibvirtTestDaemon]) -> list[tuple[str, str]]:
    """(uid, domain name) of every domain our owner tag marks, read from the daemons directly."""
    # A domain deleted between the listing and its XML is skipped below, not printed by libvirt.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    found = []
    for daemon in daemons:
        connection = libvirt.open(daemon.uri)
        try:
            for domain in connection.listAllDomains():
                try:
                    xml = domain.XMLDesc()
                except libvirt.libvirtError as error:
                    if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                        continue  # deleted since the listing: not there
                    raise
                info = parse_domain_xml(xml)
                if info.ours and info.tags.get(OWNER_TAG) == OWNER:
                    found.append((info.tags.get(UID_TAG, ""), info.name))
        finally:
            connection.close()
    return found


def inspect(objects: client.CustomObjectsApi, daemons: list[LibvirtTestDaemon], fleet: Fleet) -> bool:
    """Count the four failures (into ``fleet``); True when converged: all 0 and every valid live
    Proxy Ready."""
    listed = retried(lambda: objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL))
    proxies: list[dict[str, Any]] = cast(dict[str, Any], listed)["items"]
    by_uid = Counter(uid for uid, _ in instances(daemons))
    uids = {p["metadata"]["uid"] for p in proxies}
    live = [p for p in proxies if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["name"] not in fleet.malformed]
    fleet.counts = {
        "live Proxies without their instance": sum(1 for p in live if not by_uid[p["metadata"]["uid"]]),
        "duplicate instances": sum(count - 1 for count in by_uid.values() if count > 1),
        "leaked instances (owned, no Proxy)": sum(count for uid, count in by_uid.items() if uid not in uids),
        "wedged finalizers": sum(1 for p in proxies if p["metadata"].get("deletionTimestamp")
                                 and FINALIZER in (p["metadata"].get("finalizers") or [])),
    }
    fleet.live = len(live)
    fleet.ready = sum(1 for p in live if (p.get("status") or {}).get("phase") == PHASE_READY)
    # Why the stragglers are not Ready (their Ready condition, numbers blanked so alike ones group).
    fleet.not_ready = Counter()
    for proxy in live:
        status = proxy.get("status") or {}
        if status.get("phase") != PHASE_READY:
            ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
            fleet.not_ready[re.sub(r"\d+(\.\d+)?", "N", f"{ready.get('reason')}: {ready.get('message')}")[:200]] += 1
    fleet.malformed_failed = sum(1 for p in proxies if p["metadata"]["name"] in fleet.malformed
                                 and (p.get("status") or {}).get("phase") == PHASE_FAILED)
    return not any(fleet.counts.values()) and fleet.ready == fleet.live


def proxy_body(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"provider": KVM_PROVIDER, "cloudInit": CLOUD_INIT}}


def schedule(rng: random.Random, seconds: float, churn: int) -> list[tuple[float, str]]:
    """Seeded moments in the chaos window: three kills in its second to fifth tenth (a restarted
    controller needs ~10-15 s under load before its first module run, so kills later than that
    would leave the module faults little to hit) and ``churn`` creates and deletes each."""
    events = [(rng.uniform(0.1, 0.5) * seconds, "kill") for _ in range(KILLS)]
    events += [(rng.uniform(0, seconds), "create") for _ in range(churn)]
    events += [(rng.uniform(0, seconds), "delete") for _ in range(churn)]
    return sorted(events)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> Fleet:
    started = time.monotonic()
    rng = random.Random(args.seed)
    hosts = -(-args.proxies // args.proxies_per_host)
    fleet = Fleet(proxies=args.proxies, hosts=hosts, seed=args.seed)
    work = Path(tempfile.mkdtemp(prefix="egress-proxies-chaos-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)

    say(f"chaos: seed {args.seed}; starting {hosts} libvirtd(s) (test driver) and the emulator ...")
    daemons = [stack.enter_context(LibvirtTestDaemon()) for _ in range(hosts)]
    connection_rate = 1 - (1 - args.module_fault_rate) ** (1 / hosts)
    cuts = CutSchedule(random.Random(rng.random()), connection_rate)
    relays = [FlakyRelay(d.socket_path, work / f"relay-{i}.sock", cuts) for i, d in enumerate(daemons)]
    for relay in relays:
        stack.callback(relay.stop)
    emulator = Emulator((NAMESPACE, LEASE_NAMESPACE))
    stack.callback(emulator.close)
    api = stack.enter_context(client.ApiClient(client.Configuration(host=emulator.url)))
    objects = client.CustomObjectsApi(api)
    config = write_kvm_config(work / "providers.yaml",
                              [kvm_host(f"h{i:02d}", relay.uri, pool=POOL) for i, relay in enumerate(relays)],
                              make_base_image(work))
    # The test driver's addresses are made up: the controller must never send anything to them.
    document = yaml.safe_load(config.read_text())
    document["providers"][0]["probe"] = "none"
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    kubeconfig = write_kubeconfig(work / "kubeconfig", emulator.url)
    log_path = work / "controller.log"
    controller = Controller([
        str(Path(sys.executable).parent / "egress-proxies"), "--source", "kubernetes", "--kubeconfig", str(kubeconfig),
        "--namespace", NAMESPACE, "--lease-namespace", LEASE_NAMESPACE, "--identity", IDENTITY,
        "--provider-config", str(config), "--work-dir", str(work / "controller"), "--interval", "2",
        "--gc-grace", str(args.gc_grace), "--listen", "127.0.0.1:0", "--max-runners", "2"], log_path)
    stack.callback(lambda: leftovers(work / "controller" / "runs"))
    stack.callback(controller.stop)

    say(f"creating {args.proxies} Proxies and {args.malformed} malformed ones ...")
    for index in range(args.proxies):
        retried(lambda index=index: objects.create_namespaced_custom_object(  # type: ignore[misc]
            GROUP, VERSION, NAMESPACE, PLURAL, proxy_body(f"proxy-{index:05d}")))
    for index in range(args.malformed):
        name = f"malformed-{index:02d}"
        emulator.command("store_unvalidated", object={
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": MALFORMED_SPECS[index % len(MALFORMED_SPECS)]})
        fleet.malformed.add(name)
    names = [f"proxy-{index:05d}" for index in range(args.proxies)]

    before = emulator.command("fail_randomly", rate=args.api_fault_rate, seed=rng.randrange(2**32))
    controller.start()
    chaos_started = time.monotonic()
    events = schedule(rng, args.chaos_seconds, max(5, args.proxies // 10))
    say(f"chaos for {args.chaos_seconds:.0f} s: {args.api_fault_rate:.0%} API faults, {args.module_fault_rate:.0%} "
        f"module runs cut ({connection_rate:.2%} of libvirt connections), {KILLS} SIGKILLs, "
        f"{sum(1 for _, e in events if e == 'create')} creates and deletes ...")
    for moment, event in events:
        time.sleep(max(0.0, chaos_started + moment - time.monotonic()))
        if event == "kill":
            controller.kill()
            fleet.kills.append(time.monotonic() - chaos_started)
            say(f"  {fleet.kills[-1]:6.1f} s: SIGKILL, restarted")
            controller.start()
        elif event == "create":
            name = f"churn-{fleet.created:05d}"
            retried(lambda name=name: objects.create_namespaced_custom_object(  # type: ignore[misc]
                GROUP, VERSION, NAMESPACE, PLURAL, proxy_body(name)))
            names.append(name)
            fleet.created += 1
        else:
            victim = names.pop(rng.randrange(len(names)))
            with contextlib.suppress(ApiException):  # 404: already gone
                retried(lambda victim=victim: objects.delete_namespaced_custom_object(  # type: ignore[misc]
                    GROUP, VERSION, NAMESPACE, PLURAL, victim))
            fleet.deleted += 1
    time.sleep(max(0.0, chaos_started + args.chaos_seconds - time.monotonic()))
    # Under load a restarted controller may not reach a module run before the window ends: the
    # faults go on until at least one libvirt connection was cut (at most 60 s more), so that
    # every run has met every kind of fault.
    waiting.poll(lambda: cuts.cut > 0 or not args.module_fault_rate, 60, interval=0.5)

    # The last fault: from here on, every API call and every libvirt connection goes through.
    stats = emulator.command("fail_randomly", rate=0.0, seed=0)
    cuts.rate = 0.0
    last_fault = time.monotonic()
    fleet.chaos_seconds = last_fault - chaos_started
    say(f"faults stopped after {fleet.chaos_seconds:.0f} s; waiting for convergence ...")
    if waiting.poll(lambda: inspect(objects, daemons, fleet), args.converge_timeout, interval=2):
        fleet.converge_seconds = time.monotonic() - last_fault
    fleet.api_requests = stats["requests"] - before["requests"]
    fleet.api_injected = stats["injected"]
    fleet.relay_connections = cuts.connections
    fleet.relay_cut = cuts.cut
    controller.stop()
    log_text = log_path.read_text(errors="replace")
    for match in RUNNER_LINE.finditer(log_text):
        fleet.module_runs[match[1]] += int(match[2])
        fleet.module_failed[match[1]] += int(match[3])
    fleet.transient.update(match[1] for match in TRANSIENT_LINE.finditer(log_text))
    if args.keep_log:
        shutil.copy(log_path, args.keep_log)
    fleet.total_seconds = time.monotonic() - started
    return fleet


def leftovers(runs: Path) -> None:
    """Runs a killed incarnation left behind (its successor kills them at start-up; after the
    last one, nobody would): their processes are this bench's descendants."""
    if runs.is_dir():
        for private in runs.iterdir():
            kill_run_processes(private.name)


def report(fleet: Fleet) -> None:
    say()
    say(f"== chaos run, seed {fleet.seed}: {fleet.proxies} Proxies on {fleet.hosts} KVM host(s) (test driver), "
        f"{len(fleet.malformed)} malformed, {fleet.created} created and {fleet.deleted} deleted during the chaos")
    injected = sum(fleet.api_injected.values())
    by_status = ", ".join(f"{count}x {status}" for status, count in sorted(fleet.api_injected.items()))
    say(f"  API faults injected: {injected} of {fleet.api_requests} requests during the chaos "
        f"({injected / max(1, fleet.api_requests):.1%}: {by_status or 'none'})")
    say(f"  libvirt connections cut: {fleet.relay_cut} of {fleet.relay_connections}")
    runs, failed = sum(fleet.module_runs.values()), sum(fleet.module_failed.values())
    per_verb = ", ".join(f"{verb} {fleet.module_failed[verb]}/{count}"
                         for verb, count in sorted(fleet.module_runs.items()))
    say(f"  module runs failed as a whole: {failed} of {runs} ({per_verb}; runs of killed incarnations not counted)")
    transient = ", ".join(f"{count}x {reason}" for reason, count in sorted(fleet.transient.items()))
    say(f"  Proxy steps failed transient (per instance, from the log): {fleet.transient.total()}"
        f" ({transient or 'none'})")
    say(f"  SIGKILLs at: {', '.join(f'{k:.1f} s' for k in fleet.kills)} into the {fleet.chaos_seconds:.0f} s of chaos")
    say(f"  malformed Proxies Failed: {fleet.malformed_failed} of {len(fleet.malformed)}")
    say(f"  live valid Proxies Ready: {fleet.ready} of {fleet.live}")
    for why, count in fleet.not_ready.most_common(5):
        say(f"    not Ready, {count}x: {why}")
    for what, count in fleet.counts.items():
        say(f"  {what + ':':42} {count}  {'ok' if count == 0 else 'FAIL'}")
    converged = (f"{fleet.converge_seconds:.1f} s" if fleet.converge_seconds is not None
                 else "did not converge within the timeout")
    say(f"  time to converge after the last fault: {converged}")
    say(f"  total run time {fleet.total_seconds:.0f} s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    add = parser.add_argument
    add("--proxies", type=int, default=1000, help="Proxies at the start (default: %(default)s)")
    add("--seed", type=int, default=11, help="seed of every random choice (default: %(default)s)")
    add("--chaos-seconds", type=float, default=None,
        help="how long the faults last (default: 60 s + 0.15 s per Proxy, so a kill may land in the fill)")
    add("--api-fault-rate", type=float, default=0.05, help="share of API requests failed (default: %(default)s)")
    add("--module-fault-rate", type=float, default=0.05, help="share of module runs cut (default: %(default)s)")
    add("--malformed", type=int, default=None, help="malformed Proxies (default: 1 per 200 Proxies, at least 3)")
    add("--gc-grace", type=float, default=5.0, help="the controller's --gc-grace (default: %(default)s s)")
    add("--proxies-per-host", type=int, default=PROXIES_PER_HOST, help="KVM Proxies per test-driver libvirtd")
    add("--converge-timeout", type=float, default=900.0, help="give up converging after this (default: %(default)s s)")
    add("--keep-log", type=Path, default=None, help="copy the controller's log here")
    args = parser.parse_args(argv)
    if args.chaos_seconds is None:
        args.chaos_seconds = 60 + 0.15 * args.proxies
    if args.malformed is None:
        args.malformed = max(3, args.proxies // 200)
    if min(args.proxies, args.proxies_per_host) < 1 or not (0 <= args.api_fault_rate < 1 and
                                                            0 <= args.module_fault_rate < 1):
        parser.error("--proxies and --proxies-per-host must be at least 1, the rates in [0, 1)")
    if not math.isfinite(args.chaos_seconds) or args.chaos_seconds <= 0:
        parser.error("--chaos-seconds must be positive")
    return args


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def chaos(argv: list[str] | None = None) -> Fleet:
    """One chaos run (for the test and for ``main``); every process it started is stopped."""
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        return run(args, stack)


def main(argv: list[str] | None = None) -> int:
    if os.geteuid() != 0:
        say("chaos_bench: needs root (the test libvirtd runs in a private mount namespace)")
        return 2
    try:
        with _signals():
            fleet = chaos(argv)
    except KeyboardInterrupt:
        say("interrupted; every process and temporary directory of the bench was removed")
        return 130
    except BenchError as error:
        say(f"chaos_bench: {error}")
        return 1
    report(fleet)
    return 0 if fleet.clean else 1


if __name__ == "__main__":
    sys.exit(main())
