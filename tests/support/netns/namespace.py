"""A network namespace a test creates, and processes run inside it (:mod:`support.netns.squid`
describes the layout: a veth pair on ``10.215.<slot>.0/24``, the root namespace's end ``.1``, the
namespace's ``.2``).

- :class:`NetworkNamespace`: the namespace, veth pair and addresses; :meth:`~NetworkNamespace.spawn`
  runs a process inside it, and stopping kills every process left in it. :meth:`~NetworkNamespace.link`
  joins two of them by a veth pair of their own (an "internet" namespace behind a proxy's, with
  public-looking addresses that exist nowhere else), and :meth:`~NetworkNamespace.add_outside_address`
  gives the root namespace's end one more address (a client the proxy does not know).
- :class:`NamespacedProcess`: the base of every helper process run in one (squid, the target
  and DNS servers, fake proxies, the probe target, a banning site).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from support.process import DaemonStartError, kill_namespace_processes, log_tail, run_checked, stop_process_group
from support.waiting import wait_for

PREFIX = "10.215"
SLOTS = range(1, 255)


class _Started:
    """A context manager of start() and stop()."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class NetworkNamespace(_Started):
    """A network namespace joined to the root namespace by a veth pair on 10.215.<slot>.0/24."""

    def __init__(self) -> None:
        self.slot = 0
        self._root: Path | None = None
        self._next_host = 3
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def namespace(self) -> str:
        return f"egp-sq{self.slot}"

    @property
    def _veth_outside(self) -> str:
        return f"egpsq{self.slot}"

    @property
    def _veth_inside(self) -> str:
        return f"egpsq{self.slot}p"

    @property
    def gateway(self) -> str:
        """The root namespace's end of the veth pair: where the test process's packets come from."""
        return f"{PREFIX}.{self.slot}.1"

    @property
    def address(self) -> str:
        """The namespace's first address."""
        return f"{PREFIX}.{self.slot}.2"

    @property
    def network(self) -> str:
        """The /24 routed to the namespace: every address a test may send to (besides loopback)."""
        return f"{PREFIX}.{self.slot}.0/24"

    @property
    def root(self) -> Path:
        """A private temporary directory for this namespace's files; removed on stop."""
        if self._root is None:
            raise RuntimeError("NetworkNamespace is not started")
        return self._root

    def add_address(self, address: str | None = None) -> str:
        """Give the namespace one more address (of its /24 unless ``address`` says which) and return it.

        An address of the caller's choosing exists only inside this namespace (and whatever
        :meth:`link` joins to it): nothing outside routes to it."""
        if address is None:
            if self._next_host > 254:
                raise DaemonStartError(f"namespace {self.namespace} has no free address left")
            address = f"{PREFIX}.{self.slot}.{self._next_host}"
            self._next_host += 1
        prefix = 128 if ":" in address else 32
        run_checked(["ip", "-n", self.namespace, "addr", "add", f"{address}/{prefix}", "dev", self._veth_inside, *(
            ["nodad"] if prefix == 128 else [])])
        return address

    def add_outside_address(self) -> str:
        """One more address of the /24 on the root namespace's end: a client source that is not
        the gateway (bind a socket to it to be someone the proxy does not know)."""
        address = f"{PREFIX}.{self.slot}.254"
        run_checked(["ip", "addr", "add", f"{address}/32", "dev", self._veth_outside])
        return address

    def link(self, other: NetworkNamespace, address: str, peer: str, prefix: int = 24) -> None:
        """Join this namespace to ``other`` by a veth pair: ``address`` here, ``peer`` there, both
        on one ``prefix`` network. Deleting either namespace deletes the pair."""
        here, there = f"egpl{self.slot}x{other.slot}", f"egpl{self.slot}x{other.slot}p"
        run_checked(["ip", "link", "add", here, "netns", self.namespace, "type", "veth", "peer", there, "netns",
              other.namespace])
        for namespace, device, mine in ((self.namespace, here, address), (other.namespace, there, peer)):
            run_checked(["ip", "-n", namespace, "addr", "add", f"{mine}/{prefix}", "dev", device])
            run_checked(["ip", "-n", namespace, "link", "set", device, "up"])

    def route(self, network: str, via: str) -> None:
        """Route ``network`` through ``via`` (a peer of :meth:`link`) inside this namespace."""
        run_checked(["ip", "-n", self.namespace, "route", "add", network, "via", via])

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` as a command line that runs inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def spawn(self, args: Sequence[str], output: IO[bytes],
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``args`` inside the namespace in a session of its own, with ``env`` added to the
        environment; stop() ends it at the latest."""
        process = subprocess.Popen(self.command(args), stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **env} if env else None)
        self._processes.append(process)
        return process

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="squid-netns-"))
        # squid's user has to reach its own directories below this one.
        self._root.chmod(0o755)
        try:
            self._claim_slot()
            outside, inside, ns = self._veth_outside, self._veth_inside, self.namespace
            run_checked(["ip", "link", "add", outside, "type", "veth", "peer", inside, "netns", ns])
            run_checked(["ip", "addr", "add", f"{self.gateway}/24", "dev", outside])
            run_checked(["ip", "link", "set", outside, "up"])
            run_checked(["ip", "-n", ns, "addr", "add", f"{self.address}/24", "dev", inside])
            run_checked(["ip", "-n", ns, "link", "set", inside, "up"])
            run_checked(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.stop()
            raise

    def _claim_slot(self) -> None:
        """Create the namespace in the first free slot; ``ip netns add`` fails on a taken name."""
        for slot in SLOTS:
            self.slot = slot
            if Path(f"/sys/class/net/{self._veth_outside}").exists():
                continue
            if subprocess.run(["ip", "netns", "add", self.namespace], check=False,
                              capture_output=True).returncode == 0:
                return
        self.slot = 0
        raise DaemonStartError("no free slot for a squid test network namespace")

    def stop(self) -> None:
        """Kill every process in the namespace, delete it and the veth pair; safe to repeat."""
        for process in self._processes:
            stop_process_group(process, timeout=5.0)
        self._processes.clear()
        if self.slot:
            # Whatever left our process groups (a squid helper that re-parented) is found here.
            kill_namespace_processes(self.namespace)
            # Deleting one end of a veth pair deletes both; the namespace may already be gone.
            subprocess.run(["ip", "link", "del", self._veth_outside], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", self.namespace], check=False, capture_output=True)
            self.slot = 0
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


class NamespacedProcess(_Started):
    """One process a test runs inside a ``NetworkNamespace``, its output in a log file: ``launch``
    (or ``_run``, which also waits until it is ready) starts it from a subclass's ``start``;
    ``stop`` ends its process group and closes its output (safe to repeat); a context manager."""

    start_timeout: float = 20.0
    stop_timeout = 5.0

    def __init__(self, netns: NetworkNamespace) -> None:
        self.netns = netns
        self._process: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """The process (0 when stopped)."""
        return self._process.pid if self._process is not None else 0

    def launch(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Spawn ``args`` in the namespace, its output to ``log``."""
        self._out = open(log, "ab")  # noqa: SIM115 -- closed in stop()
        self._process = self.netns.spawn(args, self._out, env=env)
        return self._process

    def _run(self, args: Sequence[str], output: Path, ready: Callable[[], bool], what: str,
             logs: Sequence[Path] = ()) -> None:
        """``launch``, then wait until ``ready`` (stopped again when it never is)."""
        process = self.launch(args, output)
        try:
            wait_for(ready, self.start_timeout, what, diagnostics=lambda: log_tail([output, *logs]), process=process,
                     error=DaemonStartError)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the process group and wait for it; safe to repeat."""
        if self._process is not None:
            stop_process_group(self._process, timeout=self.stop_timeout)
            self._process = None
        if self._out is not None:
            self._out.close()
            self._out = None


def read_log(path: Path) -> str:
    """A log's text so far ("" before the process made it)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
