"""The controller's real HTTP server (``ControllerHTTPServer``) on 127.0.0.1 with scoped tokens and the
real ``Quarantine``, serving Proxies a test puts in an in-memory store, for the crawler's side
(tests/clients, bench/discovery_bench.py) without a sweep loop.

Tokens: ``CRAWLER_TOKEN`` covers namespace ``crawlers``, ``OTHER_TOKEN`` ``team-b``,
``OPERATOR_TOKEN`` is the operator's (every namespace, no credentials). A scoped token's entries
carry the URL ``http://crawl-<namespace>:<PASSWORD>@<endpoint>``, as the controller builds it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess, Response, ServerSettings, TokenScopes
from egress_proxies.resources.pool import POOL_LABEL, pool_of
from egress_proxies.serving.discovery import DiscoveryView, PoolFloor
from egress_proxies.sweep.quarantine import Quarantine
from support.controller.fakes import MemoryStore

CRAWLER_TOKEN, OTHER_TOKEN, OPERATOR_TOKEN = "crawler-token", "other-team-token", "operator-token"
PASSWORD = "s3cret/with:odd@chars"


class CountingServer(ControllerHTTPServer):
    """The real server, counting the quarantine POSTs that reach it (every answer, 4xx included)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posts: list[str] = []

    def _respond_post(self, path: str, authorization: str | None, peer: str, body: bytes) -> Response:
        self.posts.append(path)
        return super()._respond_post(path, authorization, peer, body)


class DiscoveryServer:
    """Ready Proxies (``add``) behind a started ``CountingServer``, its discovery view read from the
    store at each change (``load``); ``stop``, ``restart``."""

    def __init__(self, directory: Path, quarantine_per_minute: float = 10.0) -> None:
        self.store = MemoryStore()
        self.tokens = directory / "tokens.yaml"
        self.write_tokens({CRAWLER_TOKEN: ["crawlers"], OTHER_TOKEN: ["team-b"]})
        self.quarantine_per_minute = quarantine_per_minute
        self.server = self._server()
        self.server.start("127.0.0.1", 0)
        self.port = self.server.port

    def _server(self) -> CountingServer:
        """A new process's server: its discovery view read from the store (as a standby's is)."""
        health = SweepHealth(60)
        health.sweep_started()
        health.sweep_finished(True)
        password = quote(PASSWORD, safe="")
        self.view = DiscoveryView()
        self.load()
        access = DiscoveryAccess(OPERATOR_TOKEN, TokenScopes(self.tokens),
                                 lambda p: f"http://crawl-{p.namespace}:{password}@{p.status['endpoint']}",
                                 Quarantine(self.store, self.view))
        settings = ServerSettings(quarantine_per_minute=self.quarantine_per_minute)
        return CountingServer(health, self.view, access, settings)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def load(self) -> None:
        """The view reads the store again (after a change a test made); the pools are those the
        Proxies name (floor 0: none kept listed once quarantined)."""
        proxies = self.store.list_proxies()[0]
        floors = {(p.namespace, pool): PoolFloor(f"pool-{pool}", 0) for p in proxies
                  if (pool := pool_of(p)) is not None}
        self.view.load_stored(proxies, floors, time.monotonic())

    def write_tokens(self, scopes: dict[str, list[str]]) -> None:
        """Replace the tokens file (the server reads it again when it changes)."""
        self.tokens.write_text(yaml.safe_dump([{"name": token.split("-")[0], "namespaces": namespaces,
                                                "sha256": hashlib.sha256(token.encode()).hexdigest()}
                                               for token, namespaces in scopes.items()]))

    def add(self, name: str, ip: str, namespace: str = "crawlers", pool: str | None = None,
            port: int = 3128) -> None:
        """A Ready Proxy at ``ip:port`` (a member of ``pool`` when given)."""
        self.store.add(name, {"provider": "lab"}, namespace=namespace)
        stored = self.store.objects[(namespace, name)]
        stored.status = {"phase": "Ready", "ip": ip, "endpoint": f"{ip}:{port}",
                         "providerID": f"k8s://namespaces/egress/pods/{name}-{ip}"}
        if pool is not None:
            stored.raw = {"metadata": {"labels": {POOL_LABEL: pool}}}
        self.load()

    def replace(self, name: str, ip: str, namespace: str = "crawlers") -> None:
        """The Proxy's instance replaced: a new address and providerID (the list changes)."""
        stored = self.store.objects[(namespace, name)]
        stored.status = {**stored.status, "ip": ip, "endpoint": f"{ip}:{stored.status['endpoint'].split(':')[1]}",
                         "providerID": f"k8s://namespaces/egress/pods/{name}-{ip}"}
        self.load()

    def remove(self, name: str, namespace: str = "crawlers") -> None:
        """The Proxy is gone (a pool whose last member goes is gone for discovery too)."""
        del self.store.objects[(namespace, name)]
        self.load()

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """A new server on the same port (the controller restarted)."""
        posts = self.server.posts
        self.server = self._server()
        self.server.posts = posts
        self.server.start("127.0.0.1", self.port)
