"""The probe target: what the controller's probes reach through every proxy, and only it can
answer them (``egress-proxies probe-target``; docs/operations.md, "Running the probe target").

Plain HTTP/1.1 on every address it listens on (one is the port the CONNECT check tunnels to,
443 in a deployment: squid tunnels to 443 only; no TLS there either, the tunnel is what is
checked). For a request whose query carries the probe's nonce (``proof.NONCE_PARAMETER``):

- ``GET <path ending in /echo>``: 200, ``{"ip": <the caller's address>, "proof": proof(key,
  nonce, ip)}``: the proxy's egress address as this server sees it, which nobody else can vouch
  for. Run it where it sees callers' own addresses (not behind a load balancer or NAT of yours);
- ``GET /healthz``: 200 ``ok``;
- ``GET <any other path>``: ``204`` with ``proof(key, nonce)`` in the ``X-Egress-Probe-Proof``
  header (without a nonce, a plain 204, like a ``generate_204`` URL).

``key`` is the file both this server and the controller read (the provider's ``probe.keyFile``).
It keeps connections alive as the probe does, cuts a client that sends no complete request
within ``idle_seconds``, holds at most ``max_connections`` at once, and logs nothing per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Sequence
from urllib.parse import urlsplit

from egress_proxies.http1 import MAX_HEAD_BYTES, MalformedHead, parse_request, read_head
from egress_proxies.serving.proof import PROOF_HEADER, nonce_of, proof

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 405: "Method Not Allowed"}


class ProbeTargetServer:
    """The server; ``answer`` is the whole protocol, ``serve`` the sockets."""

    def __init__(self, key: bytes, *, max_connections: int = 4096, idle_seconds: float = 30.0) -> None:
        self.key = key
        self.max_connections = max_connections
        self.idle_seconds = idle_seconds
        self._open = 0
        self.servers: list[asyncio.Server] = []

    def answer(self, method: str, target: str, peer: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request line's method and target from ``peer``."""
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD"}, b""
        parts = urlsplit(target)
        nonce = nonce_of(parts.query)
        if parts.path == "/healthz":
            return 200, {"Content-Type": "text/plain"}, b"ok\n"
        if parts.path.endswith("/echo"):
            document: dict[str, str] = {"ip": peer}
            if nonce is not None:
                document["proof"] = proof(self.key, nonce, peer)
            return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()
        return 204, ({PROOF_HEADER: proof(self.key, nonce)} if nonce is not None else {}), b""

    async def serve(self, addresses: Sequence[tuple[str, int]]) -> None:
        """Listen on every address (a port of 0 picks a free one: ``servers`` say which)."""
        for host, port in addresses:
            self.servers.append(await asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES,
                                                           backlog=1024))

    def close(self) -> None:
        for server in self.servers:
            server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self.max_connections:
            writer.transport.abort()
            return
        self._open += 1
        peer = str(writer.get_extra_info("peername")[0])
        try:
            while await self._exchange(reader, writer, peer):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass  # a client that went away, sent garbage or nothing: nothing to answer
        finally:
            self._open -= 1
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> bool:
        """One request and its answer; whether the connection carries another."""
        async with asyncio.timeout(self.idle_seconds):
            head = await read_head(reader)
        extra: dict[str, str] = {}
        method = ""
        try:
            request = parse_request(head)
        except MalformedHead:
            status, body = 400, b""
            keep = False
        else:
            method = request.method
            status, extra, body = self.answer(method, request.target, peer)
            # A request with a body is answered, but its body is not read: the connection ends.
            bodiless = request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers
            keep = request.keep_alive and bodiless
        response = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", "Cache-Control: no-store",
                    *(f"{name}: {value}" for name, value in extra.items())]
        if status != 204:
            response.append(f"Content-Length: {len(body)}")
        response.append("Connection: keep-alive" if keep else "Connection: close")
        writer.write(("\r\n".join(response) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body))
        await writer.drain()
        return keep


async def run(key: bytes, addresses: Sequence[tuple[str, int]]) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = ProbeTargetServer(key)
    await server.serve(addresses)
    for listening in server.servers:
        for sock in listening.sockets:
            log.info("probe target listening on %s", sock.getsockname()[:2])
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    server.close()
