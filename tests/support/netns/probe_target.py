"""The project's own probe target (``egress-proxies probe-target``) running inside a test's network
namespace, on an address of its own: plain HTTP on port 8080 (the 204 URL and the echo) and on
8443 (the CONNECT check's tunnel port), with a key file of the test's. ``pause`` stops the
process (SIGSTOP: connections still complete in the kernel's backlog, nothing answers),
``resume`` lets it go on; ``stop`` and ``start`` take it away and bring it back.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
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
    def __init__(self, netns: NetworkNamespace, address: str | None = None, tunnel_port: int = TUNNEL_PORT) -> None:
        """``tunnel_port``: where its CONNECT target listens (443 where squid's own policy applies:
        it tunnels to 443 only)."""
        super().__init__(netns)
        self.address = address or ""
        self.tunnel_port = tunnel_port
        self.key = secrets.token_urlsafe(32).encode()
        self.key_file = Path()

    def url(self, path: str = "/generate_204") -> str:
        return f"http://{self.address}:{HTTP_PORT}{path}"

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
        process = self.launch([EGRESS_PROXIES, "probe-target", "--listen", f"{self.address}:{HTTP_PORT}",
                               "--listen", f"{self.address}:{self.tunnel_port}", "--key-file", str(self.key_file)],
                              directory / "out.log")
        wait_for(lambda: all(tcp_port_accepts(self.address, port) for port in (HTTP_PORT, self.tunnel_port)), 30,
                 f"the probe target on {self.address}:{HTTP_PORT},{self.tunnel_port}",
                 diagnostics=lambda: log_tail([directory / "out.log"]), process=process, error=DaemonStartError)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.pid:
            self.resume()  # a stopped process would not act on SIGTERM
        super().stop()
