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

from egress_proxies.serving.proof import PROOF_HEADER, nonce_of, proof

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 16 * 1024
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
            self.servers.append(await asyncio.start_server(self._connection, host, port, limit=_MAX_HEADER_BYTES,
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
            head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        request = lines[0].split(" ")
        headers = {name.strip().lower(): value.strip() for name, _, value in
                   (line.partition(":") for line in lines[1:] if ":" in line)}
        extra: dict[str, str] = {}
        if len(request) != 3 or not request[2].startswith("HTTP/1."):
            status, body = 400, b""
            keep = False
        else:
            status, extra, body = self.answer(request[0], request[1], peer)
            connection = headers.get("connection", "").lower()
            keep = connection == "keep-alive" if request[2] == "HTTP/1.0" else connection != "close"
            keep = keep and headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
        response = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", "Cache-Control: no-store",
                    *(f"{name}: {value}" for name, value in extra.items())]
        if status != 204:
            response.append(f"Content-Length: {len(body)}")
        response.append("Connection: keep-alive" if keep else "Connection: close")
        writer.write(("\r\n".join(response) + "\r\n\r\n").encode("latin-1") + (b"" if request[0] == "HEAD" else body))
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
