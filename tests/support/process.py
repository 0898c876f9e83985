"""The process toolkit of the test helpers: start-up errors, readiness probes, log tails and
stopping what a helper started (a process group, or everything left in a network namespace).

Waiting for a process to become ready is :func:`support.waiting.wait_for` with ``process=``.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from support.waiting import poll


class DaemonStartError(RuntimeError):
    """A test daemon did not come up; the message carries the tail of its logs."""


def run_checked(cmd: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a set-up command (``ip ...``); a failure is a DaemonStartError with its stderr."""
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, input=stdin)
    if result.returncode != 0:
        raise DaemonStartError(f"{shlex.join(cmd)} failed: {result.stderr.strip()}")
    return result


def unix_socket_accepts(path: str) -> bool:
    """True when something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def tcp_port_accepts(address: str, port: int) -> bool:
    """True when something accepts TCP connections on ``address:port``."""
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False


def log_tail(paths: Iterable[Path], lines: int = 30) -> str:
    """The last ``lines`` lines of each existing log, labelled, for start-up error messages."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        tail = "\n".join(text.splitlines()[-lines:])
        parts.append(f"--- {path} ---\n{tail}")
    return "\n".join(parts) or "(no log output)"


def stop_process_group(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the session ``process`` leads (started with start_new_session), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue
    process.wait()


def namespace_pids(namespace: str) -> list[int]:
    """The processes inside network namespace ``namespace`` (none once it is gone)."""
    result = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    return [int(pid) for pid in result.stdout.split()]


def kill_namespace_processes(namespace: str, timeout: float = 5.0, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM everything in ``namespace``, wait up to ``timeout`` for it to go, SIGKILL what is
    left (and wait 5 s more). What left a helper's process group (a re-parented squid helper,
    libvirt's qemu and dnsmasq) is found here. ``reap`` collects the caller's own child, which
    stays listed until it is waited for."""
    for sig, seconds in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in namespace_pids(namespace):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

        def gone() -> bool:
            if reap is not None:
                reap()
            return not namespace_pids(namespace)
        if poll(gone, seconds, interval=0.1):
            return
