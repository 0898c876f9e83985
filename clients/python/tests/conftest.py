"""A stand-in discovery for the client's unit tests: a stdlib HTTP server on 127.0.0.1 answering
the controller's routes with what a test sets (no root, squid or controller needed; the real
controller's server is tests/clients' business in the repository)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

TOKEN = "unit-test-token"


@dataclass
class Discovery:
    """``proxies``: the listing's entries; ``status``: discovery's answer (404 with ``no ProxyPool``
    for a missing pool); ``quarantine_status``: the quarantine POST's; ``posts``: paths POSTed."""

    proxies: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    quarantine_status: int = 200
    posts: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, name: str, host: str, port: int = 3128) -> None:
        self.proxies.append({"namespace": "crawlers", "name": name, "ip": host, "port": port,
                             "endpoint": f"{host}:{port}", "providerID": f"lab://{name}",
                             "url": f"http://crawl-crawlers:pw@{host}:{port}"})


def _handler(discovery: Discovery) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if discovery.status == 404:
                self._answer(404, b"no ProxyPool crawlers/eu\n")
            else:
                self._answer(discovery.status, json.dumps({"proxies": discovery.proxies}).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            discovery.posts.append(self.path)
            self._answer(discovery.quarantine_status, b"{}")

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def discovery() -> Iterator[Discovery]:
    found = Discovery()
    for index in range(3):
        found.add(f"eu-{index}", f"10.20.0.{index + 1}")
    found.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(found))
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()
