"""The real ``egress-proxies`` command as a test runs it: in its own session (so its ansible-runner
children go with it), its log read line by line as it comes, its HTTP port found in that log, its
discovery endpoint asked over 127.0.0.1, and stopped with SIGTERM when the test ends; and the
directory source's files as such a test writes and reads them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from support import waiting
from support.ansible_modules import collections_path

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")
_SERVING = re.compile(r"serving health, metrics and discovery on 127\.0\.0\.1:(\d+)")


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


def run_refused(arguments: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the command expecting it to stop by itself (a refused start); one that is still running
    after ``timeout`` is killed with everything it started, and the test fails."""
    process = subprocess.Popen([EGRESS_PROXIES, *arguments], env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"egress-proxies was still running after {timeout} s; it should have refused to "
                             f"start. Its log:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


class ControllerProcess:
    """``egress-proxies ARGUMENTS --listen 127.0.0.1:0``, serving until ``stop`` (or the end of a
    ``with`` block)."""

    def __init__(self, *arguments: str) -> None:
        self.process = subprocess.Popen([EGRESS_PROXIES, *arguments, "--listen", "127.0.0.1:0"], env=environment(),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: list[str] = []
        assert self.process.stderr is not None
        stderr = self.process.stderr
        self._reader = threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in stderr),
                                        daemon=True)
        self._reader.start()
        self.port = 0
        try:
            self.wait_for(self._serving, 60, "the HTTP server")
        except BaseException:
            self.stop()
            raise

    def _serving(self) -> bool:
        for line in list(self.lines):
            if found := _SERVING.search(line):
                self.port = int(found.group(1))
        return self.port != 0

    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, condition: Callable[[], object], seconds: float, what: str) -> None:
        """``support.waiting.wait_for``, failing at once, with the log, when the controller exits."""
        def done() -> object:
            assert self.process.poll() is None, f"the controller exited ({self.process.returncode}); log:\n{self.log()}"
            return condition()
        waiting.wait_for(done, seconds, what, interval=0.2, diagnostics=lambda: "log:\n" + "\n".join(self.lines[-40:]))

    def get(self, path: str, authorization: str | None = None) -> tuple[int, str]:
        """GET ``path`` from the controller's port: the status and the body."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if authorization is not None:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def __enter__(self) -> ControllerProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
