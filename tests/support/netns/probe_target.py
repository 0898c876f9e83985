"""The project's own probe target (``egress-proxies probe-target``) running inside a test's network
namespace, on an address of its own: plain HTTP on port 8080 (the 204 URL and the echo) and on
8443 (the CONNECT check's tunnel port), with a key file of the test's and any more ``options``
of the command (its limits: ``--max-per-source``...). ``pause`` stops the
process (SIGSTOP: connections still complete in the kernel's backlog, nothing answers),
``resume`` lets it go on; ``stop`` and ``start`` take it away and bring it back.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from egress_proxies.serving.probe import ProbeDestination
from support.netns.namespace import NamespacedProcess, NetworkNamespace
from support.process import DaemonStartError, log_tail, tcp_port_accepts
from support.waiting import wait_for

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")
HTTP_PORT = 8080
TUNNEL_PORT = 8443


class ProbeTargetProcess(NamespacedProcess):
    """``http_port`` and ``tunnel_port``: 80 and 443 where a test writes a provider config as the
    docs do (the probe's CONNECT check goes to the httpUrl's host on 443 unless told otherwise)."""

    def __init__(self, netns: NetworkNamespace, address: str | None = None, http_port: int = HTTP_PORT,
                 tunnel_port: int = TUNNEL_PORT,
                 options: Sequence[str] = ()) -> None:
        super().__init__(netns)
        self.address = address or ""
        self.http_port, self.tunnel_port = http_port, tunnel_port
        self.options = list(options)
        self.key = secrets.token_urlsafe(32).encode()
        self.key_file = Path()

    def url(self, path: str = "/generate_204") -> str:
        port = "" if self.http_port == 80 else f":{self.http_port}"
        return f"http://{self.address}{port}{path}"

    @property
    def connect_target(self) -> str:
        return f"{self.address}:{self.tunnel_port}"

    def destination(self, check_timeout: float = 5.0, echo: bool = True, connect: bool = True) -> ProbeDestination:
        return ProbeDestination(http_url=self.url(), proof_key=self.key,
                                connect=self.connect_target if connect else None,
                                egress_echo_url=self.url("/echo") if echo else None, check_timeout=check_timeout)

    def probe_settings(self, **extra: Any) -> dict[str, Any]:
        """A provider config's ``probe`` section pointing at this target."""
        return {"httpUrl": self.url(), "keyFile": str(self.key_file), "connect": self.connect_target,
                "egressEchoUrl": self.url("/echo"), **extra}

    def start(self) -> None:
        if not self.address:
            self.address = self.netns.add_address()
        directory = self.netns.root / f"probe-target-{self.address}"
        directory.mkdir(exist_ok=True)
        self.key_file = directory / "key"
        self.key_file.write_bytes(self.key + b"\n")
        self.key_file.chmod(0o600)
        ports = (self.http_port, self.tunnel_port)
        process = self.launch([EGRESS_PROXIES, "probe-target", *(arg for port in ports for arg in (
                                   "--listen", f"{self.address}:{port}")), "--key-file", str(self.key_file),
                               *self.options],
                              directory / "out.log")
        wait_for(lambda: all(tcp_port_accepts(self.address, port) for port in ports), 30,
                 f"the probe target on {self.address}:{self.http_port},{self.tunnel_port}",
                 diagnostics=lambda: log_tail([directory / "out.log"]), process=process, error=DaemonStartError)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.pid:
            self.resume()  # a stopped process would not act on SIGTERM
        super().stop()
