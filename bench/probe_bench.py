"""Benchmark of the controller's probe (``egress_proxies.serving.probe``) over 1,000 proxy endpoints.

Prints figures, asserts nothing (not part of pytest). What answers the probes, all on this
machine and nowhere else:

- **real squids** (Debian's package): ``--squids`` instances (default 4) in a network namespace
  the bench creates (tests/support/squid.py), each listening on ``--ports-per-squid`` ports
  (default 25), so 100 of the endpoints are real squid ports. They require Basic credentials
  (``basic_ncsa_auth``, SHA-512-crypt file) and really fetch the 204 URL, the echo URL and open
  the CONNECT tunnel from the target server in the same namespace;
- **proxy stubs** for the rest (900 by default): one asyncio process listening on that many
  ports on 127.0.0.1, speaking just enough of a proxy's side of HTTP/1.1 for the probe: 407
  without the right ``Proxy-Authorization``, ``200 Connection established`` to a CONNECT, 204
  to a GET of the 204 URL and the peer's address to the echo URL, keeping connections alive
  as squid does. A stub does **not** forward anything: it stands for a remote proxy whose work
  happens on another machine, so it costs this machine less than squid would, but its answers
  travel the same loopback sockets.

By default every endpoint gets the full probe, every option on: the HTTP check with
credentials, the CONNECT check, the egress echo, and the privacy check (the HTTP and CONNECT
requests again without credentials): 5 requests on 2 connections per endpoint (the checks
with credentials share one, the privacy checks have their own), 5,000 requests per round.
``--checks serving`` probes HTTP and CONNECT only (2 requests on 1 connection): what a round
costs when the egress address and privacy, which rarely change, are verified less often.
The first round warms nothing in the prober; squid caches a verified credential for a while,
so the rounds after the first one are squid's steady state.

Printed per round: wall time of ``Prober.probe_all`` over all endpoints, p50 / p99 / max of the
HTTP check latency (all endpoints, then squid's and the stubs' apart), outcomes by reason and
privacy, and the prober's CPU time. Target (issue 12): 1,000 proxies in <= 3 s on this 2-core
machine.

Run as root (the namespace) from the repository root:
``.venv/bin/python bench/probe_bench.py [--endpoints 1000] [--squids 4] [--ports-per-squid 25]
[--concurrency 200] [--rounds 3] [--checks full|serving]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from egress_proxies.serving.probe import ProbeCredentials, ProbeOutcome, Prober, ProbeTarget  # noqa: E402
from support.squid import NetworkNamespace, Squid, TargetServer, basic_auth_config, write_password_file  # noqa: E402

USER = "bench"
PASSWORD = "bench-9a1f3c5e7b2d4f6a8c0e1b3d5f7a9c1e"

# The stub server: argv[1] ports on 127.0.0.1, argv[2] the expected Proxy-Authorization value.
# It prints one line with the ports, then serves until killed.
STUBS = r"""
import asyncio, sys

count, expected = int(sys.argv[1]), sys.argv[2].encode()
DENIED = (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"stub\"\r\n"
          b"Content-Length: 0\r\n\r\n")
TUNNEL = b"HTTP/1.1 200 Connection established\r\n\r\n"
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"

# A bare Protocol, not streams: the stub should cost as little CPU as it can, it is not measured.
# Keep-alive as squid does it: requests follow each other on a connection until a tunnel opens.
class Stub(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            method, target = lines[0].split(b" ")[:2]
            authorized = any(line[:20].lower() == b"proxy-authorization:" and line[20:].strip() == expected
                             for line in lines[1:])
            if not authorized:
                self.transport.write(DENIED)
            elif method == b"CONNECT":
                self.transport.write(TUNNEL)
                self.transport.close()
                return
            elif target.endswith(b"/echo"):
                body = self.transport.get_extra_info("peername")[0].encode()
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                self.transport.write(NO_CONTENT)

async def main():
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Stub, "127.0.0.1", 0, backlog=1024) for _ in range(count)]
    print(" ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextmanager
def stub_ports(count: int, auth_header: str) -> Iterator[tuple[list[int], int]]:
    """(ports, pid) of a stub process serving ``count`` ports on 127.0.0.1."""
    process = subprocess.Popen([sys.executable, "-c", STUBS, str(count), auth_header], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        ports = [int(port) for port in line.split()]
        if len(ports) != count:
            raise RuntimeError(f"the stub process did not start its {count} ports (exit {process.poll()})")
        yield ports, process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of_helpers(pids: dict[str, int], squids: list[Squid]) -> dict[str, float]:
    cpu = {name: process_cpu(pid) for name, pid in pids.items() if pid}
    cpu["squids"] = sum(process_cpu(squid.pid) for squid in squids)
    return cpu


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency_line(label: str, outcomes: list[ProbeOutcome]) -> str:
    values = [o.latency_seconds for o in outcomes if o.latency_seconds is not None]
    if not values:
        return f"  {label}: no latencies"
    return (f"  {label} ({len(values)}): p50 {percentile(values, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(values, 0.99) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms, "
            f"mean {statistics.fmean(values) * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--squids", type=int, default=4)
    parser.add_argument("--ports-per-squid", type=int, default=25)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-timeout", type=float, default=5.0)
    parser.add_argument("--checks", choices=("full", "serving"), default="full",
                        help="full: HTTP, egress echo, CONNECT and privacy (5 requests per endpoint); "
                             "serving: HTTP and CONNECT only (2)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the real squids live in a network namespace")
    squid_endpoints = args.squids * args.ports_per_squid
    if squid_endpoints > args.endpoints:
        parser.error("more squid ports than endpoints")
    credentials = ProbeCredentials(USER, PASSWORD)
    full = args.checks == "full"
    requests, connections = (5, 2) if full else (2, 1)
    out = sys.stdout
    with ExitStack() as stack:
        ns = stack.enter_context(NetworkNamespace())
        targets = stack.enter_context(TargetServer(ns))
        password_file = write_password_file(ns.root / "passwords", {USER: PASSWORD})
        squids = [stack.enter_context(Squid(ns, basic_auth_config(password_file), address=ns.add_address(),
                                            ports=range(3128, 3128 + args.ports_per_squid), name=f"bench{i}"))
                  for i in range(args.squids)]
        stubs, stub_pid = stack.enter_context(stub_ports(args.endpoints - squid_endpoints,
                                                         credentials.header_value()))
        helper_pids = {"stubs": stub_pid, "squids": 0, "target server": targets.pid}
        endpoints = [(s.address, port, "squid") for s in squids for port in s.ports]
        endpoints += [("127.0.0.1", port, "stub") for port in stubs]
        probe_targets = [
            ProbeTarget(key=f"{kind}-{host}-{port}", host=host, port=port, http_url=targets.url("/generate_204"),
                        connect_target=targets.connect_target,
                        egress_echo_url=targets.url("/echo") if full else None,
                        credentials=credentials, expect_private=full)
            for host, port, kind in endpoints]
        out.write(f"endpoints: {len(probe_targets)} ({squid_endpoints} real squid ports on {args.squids} squids in "
                  f"namespace {ns.namespace}, {len(stubs)} stubs on 127.0.0.1); concurrency {args.concurrency}, "
                  f"check timeout {args.check_timeout:g}s; checks: {args.checks}, "
                  f"{requests} requests on {connections} connection{'s' if connections > 1 else ''} per endpoint\n")
        prober = Prober(concurrency=args.concurrency, check_timeout=args.check_timeout, deadline=60.0,
                        allowed_networks=[ns.network, "127.0.0.0/8"])
        for round_number in range(1, args.rounds + 1):
            others_before = cpu_of_helpers(helper_pids, squids)
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
            started = time.perf_counter()
            outcomes = prober.probe_all(probe_targets)
            wall = time.perf_counter() - started
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
            others_after = cpu_of_helpers(helper_pids, squids)
            others = {name: others_after[name] - others_before[name] for name in others_after}
            reasons = Counter(str(o.reason) for o in outcomes.values())
            private = Counter(str(o.private) for o in outcomes.values())
            egress = Counter(str(o.egress_ip) for o in outcomes.values())
            squid_outcomes = [o for key, o in outcomes.items() if key.startswith("squid-")]
            stub_outcomes = [o for key, o in outcomes.items() if key.startswith("stub-")]
            verdict = "PASS" if wall <= 3.0 and reasons["Serving"] == len(outcomes) else "MISS"
            out.write(f"round {round_number}: {len(outcomes)} proxies probed in {wall:.2f} s "
                      f"(target <= 3 s: {verdict}); CPU: prober {cpu:.2f} s, "
                      + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in others.items()) + "\n")
            out.write(latency_line("HTTP check latency, all", list(outcomes.values())) + "\n")
            out.write(latency_line("real squid", squid_outcomes) + "\n")
            out.write(latency_line("stubs", stub_outcomes) + "\n")
            out.write(f"  reasons: {dict(reasons)}; private: {dict(private)}; egress_ip: {dict(egress)}\n")
            failures = [o.message for o in outcomes.values() if not o.serving][:3]
            for message in failures:
                out.write(f"  e.g. {message}\n")
        for squid in squids:
            squid.terminate()  # shut down side by side; the ExitStack waits for each
        load = os.getloadavg()
        out.write(f"load average after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
