"""The real ``egress-proxies`` command as a child process, for tests and benchmarks that must run
the controller as shipped (a SIGKILL hits the real thing, its memory is its own).

It logs JSON (``--log-format json``) to a pipe this reads on a thread; the HTTP port is read from
its "serving ... on HOST:PORT" line, and each finished sweep from its "sweep N (S s): ..." line,
so a test counts sweeps and their durations without reaching into the process. Beside it, the
directory source's files as such a test writes and reads them, and a start that must be refused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from egress_proxies.providers.runner import AnsibleRunner
from support import waiting
from support.collection.modules import collections_path

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")
_SERVING = re.compile(r"serving health and discovery on [^ ]+:(\d+)$")
_SWEEP = re.compile(r"^sweep (\d+)(?: \(([0-9.]+) s\))?: ")


def proxy_document(name: str, namespace: str = "crawlers", provider: str = "lab") -> dict[str, Any]:
    """A Proxy as a user writes it (for a directory file or the API)."""
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"provider": provider, "cloudInit": "#cloud-config\n"}}


def recorded_status(directory: Path, stem: str) -> dict[str, Any]:
    """The status the controller recorded in ``<stem>.status.yaml`` (empty before it wrote one)."""
    try:
        state = yaml.safe_load((directory / f"{stem}.status.yaml").read_text())
    except FileNotFoundError:
        return {}
    return dict((state or {}).get("status") or {})


def environment() -> dict[str, str]:
    """What the command needs to find the collection's modules."""
    return {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}


def run_refused(arguments: list[str], timeout: float = 60, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command expecting it to stop by itself (a refused start, a ``--check-config``); one
    that is still running after ``timeout`` is killed with everything it started, and the test
    fails. ``env`` replaces ``environment()``; ``cwd`` is where it runs."""
    process = subprocess.Popen([EGRESS_PROXIES, *arguments], env=env or environment(), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"egress-proxies was still running after {timeout} s; it should have refused to "
                             f"start. Its log:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


class ControllerProcess:
    """``egress-proxies <args> --log-format json``; a context manager that stops it (SIGTERM, then
    SIGKILL) on the way out. ``env``: extra environment (``DISCOVERY_TOKEN``). ``work_dir``: its
    ``--work-dir``; once it is gone (stopped or killed), a runner is started there, as the next
    controller's would be, which removes what a run cut short left (its temporary directory)."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None, work_dir: Path | None = None) -> None:
        self.args = [EGRESS_PROXIES, *args, "--log-format", "json"]
        self.work_dir = work_dir
        self.env = {**environment(), **(env or {})}
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> Self:
        self.process = subprocess.Popen(self.args, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        stderr = self.process.stderr
        assert stderr is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in stderr),
                                        daemon=True)
        self._reader.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def messages(self) -> list[str]:
        found = []
        for line in list(self.lines):
            try:
                found.append(str(json.loads(line)["message"]))
            except (ValueError, KeyError, TypeError):
                found.append(line)  # not JSON: a traceback's tail, printed before logging was set up
        return found

    def log(self) -> str:
        """Every message so far, one per line (``lines`` holds the JSON records as written)."""
        return "\n".join(self.messages())

    def output(self) -> str:
        """Everything it wrote, as written: what a secret must never be found in."""
        return "\n".join(self.lines)

    def log_tail(self, lines: int = 40) -> str:
        return "log:\n" + "\n".join(self.messages()[-lines:])

    def sweep_seconds(self) -> list[float]:
        """How long each finished sweep took, in order."""
        return [float(m.group(2) or "nan") for message in self.messages() if (m := _SWEEP.match(message))]

    def sweeps(self) -> int:
        return len(self.sweep_seconds())

    def _announced_port(self) -> int | None:
        for message in self.messages():
            if found := _SERVING.search(message):
                return int(found.group(1))
        return None

    @property
    def port(self) -> int:
        """Its HTTP port, once it has said where it serves (waited for, up to a minute)."""
        self.wait_for(lambda: self._announced_port() is not None, 60, "the HTTP server to start")
        port = self._announced_port()
        assert port is not None
        return port

    def wait_for(self, condition: Callable[[], object], seconds: float, what: str, interval: float = 0.2) -> None:
        """``waiting.wait_for``, failing at once (with the log) when the controller exits."""
        assert self.process is not None, "the controller is not started"
        waiting.wait_for(condition, seconds, what, interval, self.log_tail, process=self.process)

    def wait_sweeps(self, count: int, seconds: float) -> None:
        """Until ``count`` more sweeps have finished."""
        target = self.sweeps() + count
        self.wait_for(lambda: self.sweeps() >= target, seconds, f"{count} more sweep(s)")

    def http(self, method: str, path: str, token: str | None = None, body: dict[str, Any] | None = None,
             authorization: str | None = None) -> tuple[int, Any]:
        """One request to its HTTP port: the status and the decoded JSON (or text) answer.
        ``token`` is sent as a bearer token; ``authorization``, the header as given."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        if token is not None:
            authorization = f"Bearer {token}"
        if authorization is not None:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                code, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            code, raw = error.code, error.read()
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode()

    def peak_rss_mib(self) -> float:
        """The controller process's peak resident memory (VmHWM; its runner children are apart)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")

    def kill(self) -> None:
        """SIGKILL the whole process group (the runner and its modules with it), as an OOM kill would."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
        self._close()

    def _signal(self, number: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, number)
        except ProcessLookupError:
            pass
        if number == signal.SIGKILL:
            self.process.wait(timeout=60)
            self._close()

    def _close(self) -> None:
        if self.work_dir is not None:
            AnsibleRunner(self.work_dir, timeout_seconds=1, max_concurrent=1)  # removes the leftovers
        if self._reader is not None:
            self._reader.join(timeout=10)
            self._reader = None
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
