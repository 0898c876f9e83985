"""The controller's one HTTP port: probes, metrics, and the crawler discovery endpoint.

Started by ``cli`` next to ``loop.Controller``. Routes:

- ``/healthz`` and ``/readyz``: ``SweepHealth.alive()`` / ``ready()``, 200 ``ok`` or 503 with the
  reason. Unauthenticated, for the kubelet.
- ``/metrics``: the Prometheus registry. Unauthenticated, for scrapers.
- ``/v1/proxies`` (JSON) and ``/v1/proxies.txt`` (``ip:port`` lines): the Ready proxies, for
  crawlers. Always behind ``Authorization: Bearer <DISCOVERY_TOKEN>``: the list is a map of
  egress addresses, so it is never served unauthenticated -- without a configured token the
  endpoint answers 503 rather than opening up.

A stdlib ``ThreadingHTTPServer``: four routes do not justify a framework, and a slow client
only holds its own thread (bounded by ``_Handler.timeout``), never the sweep loop.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from egress_proxies.health import SweepHealth
from egress_proxies.model import Proxy

log = logging.getLogger(__name__)

TOKEN_ENV = "DISCOVERY_TOKEN"
DISABLED_MESSAGE = f"discovery endpoint disabled: set {TOKEN_ENV} to enable it\n"
_TEXT = "text/plain; charset=utf-8"


def token_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """The discovery token, or None when unset or blank.

    Surrounding whitespace is dropped: a Secret written with ``echo`` ends in a newline that
    no crawler sends back.
    """
    token = environ.get(TOKEN_ENV, "").strip()
    return token or None


def warn_if_no_token(token: str | None, logger: logging.Logger) -> None:
    """Say loudly at startup that discovery is off; never logs the token itself."""
    if not token:
        logger.warning("!!! %s is not set: the crawler discovery endpoint (/v1/proxies) refuses every request "
                       "with 503 until it is. Create the Secret egress-proxies-discovery (key: token) and "
                       "restart the controller. !!!", TOKEN_ENV)


def proxy_entry(proxy: Proxy) -> dict[str, Any]:
    """One Ready proxy as crawlers see it."""
    return {
        "name": proxy.name,
        "namespace": proxy.namespace,
        "provider": proxy.provider,
        "location": proxy.spec.get("location"),
        "ip": proxy.status.get("ip"),
        "port": proxy.port,
        "endpoint": proxy.status.get("endpoint"),
        "providerID": proxy.status.get("providerID"),
    }


class ControllerHTTPServer:
    """Serves the routes above from a daemon thread; ``start()``, ``port``, ``stop()``.

    ``ready_proxies`` returns the Ready proxies at the time of the call (the reconciler's last
    sweep); it is called once per discovery request, from the request's thread.
    """

    def __init__(self, health: SweepHealth, ready_proxies: Callable[[], list[Proxy]], discovery_token: str | None,
                 registry: CollectorRegistry = REGISTRY) -> None:
        self.health = health
        self.ready_proxies = ready_proxies
        self.registry = registry
        # Bytes, so compare_digest also works on a header with non-ASCII characters (str would raise).
        self._token = discovery_token.encode() if discovery_token else None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def discovery_enabled(self) -> bool:
        return self._token is not None

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries the token (constant-time comparison)."""
        if self._token is None or header is None:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # http.server decodes headers as latin-1; surrogateescape keeps any byte comparable.
        return hmac.compare_digest(credentials.strip().encode("utf-8", "surrogateescape"), self._token)

    def start(self, host: str, port: int) -> None:
        """Listen on host:port (port 0: any free port, see ``port``) and serve from a daemon thread."""
        if self._server is not None:
            raise RuntimeError("already started")
        self._server = _Server((host, port), _Handler, self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="http", daemon=True)
        self._thread.start()
        log.debug("HTTP server on %s:%d (/healthz /readyz /metrics /v1/proxies)", host, self.port)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("not started")
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 app: ControllerHTTPServer) -> None:
        self.app = app
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "egress-proxies"
    # A client that stalls mid-request loses its connection instead of holding a thread forever.
    timeout = 10

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        app = self.server.app
        if path == "/healthz":
            self._probe(*app.health.alive())
        elif path == "/readyz":
            self._probe(*app.health.ready())
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(app.registry))
        elif path in ("/v1/proxies", "/v1/proxies.txt"):
            self._discovery(app, as_text=path.endswith(".txt"))
        else:
            self._send(404, _TEXT, b"not found\n")

    def _probe(self, ok: bool, reason: str) -> None:
        if ok:
            self._send(200, _TEXT, b"ok\n")
        else:
            self._send(503, _TEXT, f"{reason}\n".encode())

    def _discovery(self, app: ControllerHTTPServer, as_text: bool) -> None:
        if not app.discovery_enabled:
            self._send(503, _TEXT, DISABLED_MESSAGE.encode())
            return
        header = self.headers.get("Authorization")
        if not app.authorized(header):
            challenge = 'Bearer realm="egress-proxies"'
            if header is not None:
                challenge += ', error="invalid_token"'
            log.info("discovery request from %s refused: %s", self.client_address[0],
                     "wrong token" if header is not None else "no token")
            self._send(401, _TEXT, b"unauthorized\n", {"WWW-Authenticate": challenge})
            return
        entries = [proxy_entry(proxy) for proxy in sorted(app.ready_proxies(), key=lambda p: (p.namespace, p.name))]
        if as_text:
            body = "".join(f"{entry['ip']}:{entry['port']}\n" for entry in entries if entry["ip"])
            self._send(200, _TEXT, body.encode())
        else:
            self._send(200, "application/json", json.dumps({"proxies": entries}).encode())

    def _send(self, code: int, content_type: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        # Discovery answers are per-client secrets and probes must never be answered by a cache.
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # The base class writes every request to stderr; probes would flood it. The request line
        # holds no credentials (the token only travels in a header), so debug level may show it.
        log.debug("%s %s", self.client_address[0], format % args)
