"""Benchmark of the controller's probing (``egress_proxies.serving.monitor`` with the real
``Prober``) over 10,000 proxy endpoints, 10 % of which hang (issue 27).

Prints figures with PASS/MISS against the issue's targets and fails nothing (not part of pytest).
What answers the probes, all on this machine and nowhere else:

- **real squids** (Debian's package): ``--squids`` instances (default 4) in a network namespace
  the bench creates (tests/support/netns/squid.py), each on ``--ports-per-squid`` ports (default 25),
  Basic auth through ``basic_ncsa_auth``; they really fetch the 204 URL and the echo and open the
  tunnel to the project's own **probe target** (``egress-proxies probe-target``) in the same
  namespace, which also answers the controller's direct checks;
- **proxy stubs** for the rest: ``--stub-processes`` asyncio processes on 127.0.0.1, each
  listening on its share of the ports, speaking just enough of a proxy's side of HTTP/1.1: 407
  without one of the right ``Proxy-Authorization`` values (the namespace's credentials or the
  instance's identity; a made-up user gets 407 too), and the probe target's answers with their
  proofs (a stub stands for a remote proxy *and* the target behind it, so it computes the proofs
  with the key itself), keeping connections alive as squid does; the tunnel after a CONNECT gets
  the target's answer too;
- **hung stubs** (``--hung-percent``, default 10): accept, read, never answer.

Every endpoint is watched by one ``ServingMonitor`` under one provider with the defaults a
provider gets (concurrency 200, 5 s checks, 30 s rounds, the full probe on an instance's first
probe and every sixth), its verdicts written by the monitor's own verdict thread (the write here
records the time). Rounds are driven one after the other by the monitor's own round code.

Printed per round: wall time until the last healthy probe ended (target <= 10 s) and until the
last probe of the round ended, the probes started, the prober's CPU (the bench process: event
loop and verdict thread; target <= 5 s; user and system apart, and the verdict thread's share),
outcomes by reason, how often the probe target was asked directly; for the first round (every
instance new, the hung ones mixed in, every probe full) and for a round in which every healthy
instance's verdict changes (the controller's key changed: the target's proofs fail the direct
check, every verdict goes Unknown and nothing is probed; then back, every probe full): each
healthy verdict's delay from its probe's start, p50/p99/max (target: within its check timeout +
1 s). Then the process's peak RSS (target <= 300 MiB for the whole controller; this is the
probing part).

Run as root (the namespace) from the repository root:
``.venv/bin/python bench/probe_bench.py [--endpoints 10000] [--hung-percent 10] [--rounds 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from egress_proxies.providers.client import ProbeSettings  # noqa: E402
from egress_proxies.serving import monitor as monitor_module  # noqa: E402
from egress_proxies.serving.monitor import ServingMonitor, Watched  # noqa: E402
from egress_proxies.serving.probe import (  # noqa: E402
    ProbeCredentials,
    ProbeDestination,
    ProbeOutcome,
    Prober,
    ProbeTarget,
)
from support.netns.namespace import NetworkNamespace  # noqa: E402
from support.netns.probe_target import ProbeTargetProcess  # noqa: E402
from support.netns.squid import Squid, basic_auth_config, write_password_file  # noqa: E402

USER = "bench"
PASSWORD = "bench-9a1f3c5e7b2d4f6a8c0e1b3d5f7a9c1e"
IDENTITY = ProbeCredentials("probe-bench-identity", PASSWORD)
PROVIDER = "bench"

# A stub process: argv[1] ports on 127.0.0.1 to serve, argv[2] how many of them hang, argv[3] the
# key, argv[4:] the accepted Proxy-Authorization values. Prints its ports, then serves until killed.
STUBS = r"""
import asyncio, json, sys
from egress_proxies.serving.proof import answer_proof, echo_proof

count, hung, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
accepted = {value.encode() for value in sys.argv[4:]}
DENIED = (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"stub\"\r\n"
          b"Content-Length: 0\r\n\r\n")
TUNNEL = b"HTTP/1.1 200 Connection established\r\n\r\n"

def nonce_of(target):
    after = target.split(b"egress-probe-nonce=", 1)
    return after[1].split(b"&", 1)[0].decode() if len(after) == 2 else None

class Hang(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        pass

# A bare Protocol, not streams: the stub should cost as little CPU as it can, it is not measured.
class Stub(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer, self.tunnel = transport, b"", False

    def data_received(self, data):
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            method, target = lines[0].split(b" ")[:2]
            if self.tunnel:  # the request through the tunnel: the target's answer, then the end
                nonce = nonce_of(target)
                self.transport.write(b"HTTP/1.1 204 No Content\r\nX-Egress-Probe-Proof: %s\r\nConnection: close\r\n\r\n"
                                     % answer_proof(key, nonce).encode())
                self.transport.close()
                return
            authorized = any(line[:20].lower() == b"proxy-authorization:" and line[20:].strip() in accepted
                             for line in lines[1:])
            if not authorized:
                self.transport.write(DENIED)
            elif method == b"CONNECT":
                self.transport.write(TUNNEL)
                self.tunnel = True
            elif b"/echo" in target:
                peer = self.transport.get_extra_info("peername")[0]
                body = json.dumps({"ip": peer, "proof": echo_proof(key, nonce_of(target), peer)}).encode()
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                self.transport.write(b"HTTP/1.1 204 No Content\r\nX-Egress-Probe-Proof: %s\r\n\r\n"
                                     % answer_proof(key, nonce_of(target)).encode())

async def main():
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Hang if i < hung else Stub, "127.0.0.1", 0, backlog=1024)
               for i in range(count)]
    print(" ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextmanager
def stub_ports(count: int, hung: int, key: bytes, accepted: list[str]) -> Iterator[tuple[list[int], int]]:
    """(ports, pid) of a stub process serving ``count`` ports on 127.0.0.1, the first ``hung`` hanging."""
    process = subprocess.Popen([sys.executable, "-c", STUBS, str(count), str(hung), key.decode(), *accepted],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        ports = [int(port) for port in process.stdout.readline().split()]
        if len(ports) != count:
            raise RuntimeError(f"the stub process did not start its {count} ports (exit {process.poll()})")
        yield ports, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


class TimedProber(Prober):
    """The real prober, remembering when each probe of each key started and ended."""

    def __init__(self, allowed_networks: list[str]) -> None:
        super().__init__(allowed_networks=allowed_networks)
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.destination_checks = 0

    async def check_destination(self, destination: ProbeDestination) -> str | None:
        self.destination_checks += 1
        return await super().check_destination(destination)

    async def probe_one(self, target: ProbeTarget, *, full: bool = True, answered: bool = False) -> ProbeOutcome:
        started = time.monotonic()
        outcome = await super().probe_one(target, full=full, answered=answered)
        self.spans.setdefault(target.key, []).append((started, time.monotonic()))
        return outcome


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] if ordered else float("nan")


def verdict(label: str, value: float, target: float, unit: str = "s") -> str:
    return f"{label} {value:.2f} {unit} (target <= {target:g} {unit}: {'PASS' if value <= target else 'MISS'})"


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10000)
    parser.add_argument("--hung-percent", type=float, default=10.0)
    parser.add_argument("--squids", type=int, default=4)
    parser.add_argument("--ports-per-squid", type=int, default=25)
    parser.add_argument("--stub-processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the real squids and the probe target live in a network namespace")
    return args


class Bench:
    """The monitor over every endpoint, its verdict thread, and what the verdicts recorded."""

    def __init__(self, prober: TimedProber, targets: list[ProbeTarget], healthy: set[str]) -> None:
        self.prober = prober
        self.healthy = healthy
        self.monitor = ServingMonitor(prober)
        self.written: dict[str, list[float]] = {}
        lock = threading.Lock()

        def writer(key: str) -> Callable[[], None]:
            def write() -> None:
                with lock:
                    self.written.setdefault(key, []).append(time.monotonic())
            return write

        settings = ProbeSettings(enabled=True, http_url=targets[0].destination.http_url, key_file="/bench",
                                 expect_status=204, connect=None, egress_echo_url=None, control_url=None,
                                 timeout_seconds=5, unhealthy_after_seconds=300, startup_seconds=900, concurrency=200,
                                 round_seconds=30, flap_window=30, flap_percent=25)
        self.monitor.watch({t.key: Watched(PROVIDER, t, writer(t.key)) for t in targets}, {PROVIDER: settings})
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.monitor._verdict_loop, args=(self.stopping,), daemon=True)
        self.thread.start()

    def round(self, number: int, out: object) -> None:
        destinations = monitor_module._Destinations(self.prober)  # one per round, as a round starts one
        written_before = {k: len(v) for k, v in self.written.items()}
        checks_before = self.prober.destination_checks
        verdict_clock = time.pthread_getcpuclockid(self.thread.ident or 0)
        (user, system), started = cpu_seconds(), time.monotonic()
        verdict_cpu = time.clock_gettime(verdict_clock)
        asyncio.run(self.monitor._round(PROVIDER, destinations))
        time.sleep(1.0)  # the verdict thread's last writes
        verdict_cpu = time.clock_gettime(verdict_clock) - verdict_cpu
        wall, (user_after, system_after) = time.monotonic() - started, cpu_seconds()
        user, system = user_after - user, system_after - system
        cpu = user + system
        asked = self.prober.destination_checks - checks_before
        this = {k: spans[-1] for k, spans in self.prober.spans.items() if spans[-1][0] >= started}
        healthy_end = max((end for k, (_, end) in this.items() if k in self.healthy), default=started)
        reasons = Counter(str(o.reason) for k in this if (o := self.monitor.outcome(k)) is not None)
        delays = [self.written[k][-1] - this[k][0] for k in this if k in self.healthy
                  and len(self.written.get(k, [])) > written_before.get(k, 0)]
        lines = [f"round {number}: {len(this)} probes started, {len(delays)} healthy verdicts written; "
                 + verdict("healthy done in", healthy_end - started, 10.0) + f"; all done in {wall - 1.0:.2f} s; "
                 + verdict("prober CPU", cpu, 5.0) + f" ({user:.2f} user, {system:.2f} system; of it the "
                 f"verdict thread {verdict_cpu:.2f})",
                 f"  reasons: {dict(reasons)}; the probe target asked directly {asked} time(s)"]
        if delays:
            lines.append(f"  healthy verdict delay from its probe's start: p50 {percentile(delays, 0.5):.3f} s, "
                         f"p99 {percentile(delays, 0.99):.3f} s, max {max(delays):.3f} s "
                         f"(target: within the 5 s check timeout + 1 s: {'PASS' if max(delays) <= 6.0 else 'MISS'})")
        print("\n".join(lines), file=out, flush=True)  # type: ignore[call-overload]


def endpoints(stack: ExitStack, args: argparse.Namespace, target: ProbeTargetProcess,
              ns: NetworkNamespace) -> tuple[list[tuple[str, int, bool]], list[Squid]]:
    """(host, port, hung) of every endpoint, and the squids."""
    password_file = write_password_file(ns.root / "passwords", {USER: PASSWORD, IDENTITY.user: PASSWORD})
    squids = [stack.enter_context(Squid(ns, basic_auth_config(password_file), address=ns.add_address(),
                                        ports=range(3128, 3128 + args.ports_per_squid), name=f"bench{i}"))
              for i in range(args.squids)]
    found = [(s.address, port, False) for s in squids for port in s.ports]
    stubs = args.endpoints - len(found)
    hung = round(args.endpoints * args.hung_percent / 100)
    accepted = [ProbeCredentials(USER, PASSWORD).header_value(), IDENTITY.header_value()]
    for index in range(args.stub_processes):
        share = stubs // args.stub_processes + (1 if index < stubs % args.stub_processes else 0)
        hung_share = hung // args.stub_processes + (1 if index < hung % args.stub_processes else 0)
        ports, _ = stack.enter_context(stub_ports(share, hung_share, target.key, accepted))
        found += [("127.0.0.1", port, i < hung_share) for i, port in enumerate(ports)]
    return found, squids


def main() -> int:
    args = parse()
    out = sys.stdout
    with ExitStack() as stack:
        ns = stack.enter_context(NetworkNamespace())
        target = stack.enter_context(ProbeTargetProcess(ns))
        found, squids = endpoints(stack, args, target, ns)
        destination = ProbeDestination(http_url=target.url(), proof_key=target.key, connect=target.connect_target,
                                       egress_echo_url=target.url("/echo"), check_timeout=5.0)
        targets = [ProbeTarget(key=f"{host}:{port}", host=host, port=port, destination=destination,
                               credentials=ProbeCredentials(USER, PASSWORD), identity=IDENTITY, expect_private=True)
                   for host, port, _ in found]
        healthy = {f"{host}:{port}" for host, port, hung in found if not hung}
        out.write(f"endpoints: {len(found)} ({len(squids) * args.ports_per_squid} real squid ports, "
                  f"{len(found) - len(healthy)} hung stubs, the rest answering stubs in {args.stub_processes} "
                  "processes); one provider: concurrency 200, 5 s checks, 30 s rounds\n")
        bench = Bench(TimedProber([ns.network, "127.0.0.0/8"]), targets, healthy)
        for number in range(1, args.rounds + 1):
            bench.round(number, out)
        # Every healthy verdict changes at once: the controller's key changes (a rotation it sees
        # first), so the direct check fails and every verdict goes Unknown (nothing probed), then
        # back. The second of these rounds writes every verdict, each when its (full) probe ends.
        bench.monitor.watch({t.key: replace(w, target=replace(t, destination=replace(destination, proof_key=b"x" * 32)))
                             for t, w in ((t, bench.monitor._watched[t.key]) for t in targets)},
                            {PROVIDER: bench.monitor._settings[PROVIDER]})
        bench.round(args.rounds + 1, out)
        bench.monitor.watch({t.key: replace(bench.monitor._watched[t.key], target=t) for t in targets},
                            {PROVIDER: bench.monitor._settings[PROVIDER]})
        bench.round(args.rounds + 2, out)
        bench.stopping.set()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.write(verdict("peak RSS of the probing process", peak, 300.0, "MiB") + "\n")
        for squid in squids:
            squid.terminate()
        load = os.getloadavg()
        out.write(f"load average after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
