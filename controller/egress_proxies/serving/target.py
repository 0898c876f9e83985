"""The probe target: what the controller's probes reach through every proxy, and only it can
answer them (``egress-proxies probe-target``; docs/operations.md, "Running the probe target").

Plain HTTP/1.1 on every address it listens on (one is the port the CONNECT check tunnels to,
443 in a deployment: squid tunnels to 443 only; no TLS there either, the tunnel is what is
checked). For a request whose query carries the probe's nonce (``proof.NONCE_PARAMETER``):

- ``GET <path ending in /echo>``: 200, ``{"ip": <the caller's address>, "proof": echo_proof(key,
  nonce, ip)}``: the proxy's egress address as this server sees it, which nobody else can vouch
  for. Run it where it sees callers' own addresses (not behind a load balancer or NAT of yours);
- ``GET /healthz``: 200 ``ok``;
- ``GET <any other path>``: ``204`` with ``answer_proof(key, nonce)`` in the
  ``X-Egress-Probe-Proof`` header (without a nonce, a plain 204, like a ``generate_204`` URL).

A nonce that is not of the one format (``proof.NONCE_FORMAT``) gets 400 and no proof: the target
signs only what a probe could have asked for (``serving.proof``, "Two rules").

``key`` is the file both this server and the controller read (the provider's ``probe.keyFile``).
It keeps connections alive as the probe does and logs nothing per request.

Strangers reach it too (it is public), so none of them may lock the controller out (issue 38
row 4: 4,200 idle connections reset the controller's own check, and a connection sending a
request every 20 s kept its slot forever). ``Limits``:

- a client that sends no complete request within ``idle_seconds`` is cut;
- every connection ends after ``lifetime_seconds`` whatever it sends (the answer in flight when
  the time is up says ``Connection: close``; a request not complete by then is cut), so no slot is
  held for longer, and a proxy's kept-alive connection is simply opened anew;
- at most ``per_source`` connections at once from one address (one /64 for IPv6: one host has
  all of it), and ``max_connections`` in all: beyond, a new connection is closed at once;
- connections from ``controller_networks`` (the controller's own egress addresses, from which it
  checks this target directly) count against neither: they have ``controller_slots`` of their
  own, so a flood from any number of addresses never starves the controller's check.

A control listener (``serve(control=...)``, ``--control-listen``; the provider's ``probe.controlUrl``)
is the controller's alone: a connection from outside ``controller_networks`` is closed at once,
and it answers only the direct check (the 204 with its proof, and ``/healthz``; the echo is
404). It has ``control_slots`` of its own, so not even a flood from the controller's own network
on the public listeners reaches it. It runs in the same process as the public listeners, which
all listen or the process exits, so its answer says the target runs with this key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from egress_proxies.http1 import MAX_HEAD_BYTES, MalformedHead, parse_request, read_head
from egress_proxies.serving.proof import PROOF_HEADER, BadNonce, answer_proof, echo_proof, nonce_of

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Limits:
    """What one client may hold (the module docstring says why). ``per_source``: two connections
    per probe in flight (the checks and the privacy check), so raise it when many proxies share
    one egress address (a KVM host without ``sourceAddresses``, a Kubernetes node's SNAT)."""

    max_connections: int = 4096
    per_source: int = 256
    idle_seconds: float = 30.0
    lifetime_seconds: float = 60.0
    controller_networks: tuple[Network, ...] = ()
    controller_slots: int = 64
    control_slots: int = 16  # the control listener's: one direct check per provider at a time


class ProbeTargetServer:
    """The server; ``answer`` is the whole protocol, ``serve`` the sockets."""

    def __init__(self, key: bytes, limits: Limits | None = None) -> None:
        self.key = key
        self.limits = limits or Limits()
        self._open = 0  # strangers' connections (everyone's but the controller's)
        self._by_source: Counter[str] = Counter()
        self._controller_open = 0
        self._control_open = 0  # connections to the control listener
        self.servers: list[asyncio.Server] = []

    def answer(self, method: str, target: str, peer: str, control: bool = False) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request line's method and target from ``peer`` (on the
        control listener: no echo)."""
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD"}, b""
        parts = urlsplit(target)
        try:
            nonce = nonce_of(parts.query)
        except BadNonce as error:
            return 400, {"Content-Type": "text/plain"}, f"{error}\n".encode()
        if parts.path == "/healthz":
            return 200, {"Content-Type": "text/plain"}, b"ok\n"
        if parts.path.endswith("/echo"):
            if control:
                return 404, {"Content-Type": "text/plain"}, b"the control listener answers the direct check only\n"
            document: dict[str, str] = {"ip": peer}
            if nonce is not None:
                document["proof"] = echo_proof(self.key, nonce, peer)
            return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()
        return 204, ({PROOF_HEADER: answer_proof(self.key, nonce)} if nonce is not None else {}), b""

    async def serve(self, addresses: Sequence[tuple[str, int]], control: Sequence[tuple[str, int]] = ()) -> None:
        """Listen on every address, and on every ``control`` address as the control listener (a
        port of 0 picks a free one: ``servers`` say which, the control listeners last)."""
        if control and not self.limits.controller_networks:
            raise ValueError("a control listener needs the controller's networks: it serves no one else")
        for host, port, handler in [*((host, port, self._connection) for host, port in addresses),
                                    *((host, port, self._control_connection) for host, port in control)]:
            # The kernel's most (somaxconn): a burst of connections waits to be accepted (and, beyond
            # the limits, closed at once) rather than refused before this process sees it.
            self.servers.append(await asyncio.start_server(handler, host, port, limit=MAX_HEAD_BYTES, backlog=4096))

    def close(self) -> None:
        for server in self.servers:
            server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername")[0])
        source = _source(peer)
        controller = _inside(peer, self.limits.controller_networks)
        if not self._take_slot(source, controller):
            writer.transport.abort()  # closed at once: answering would cost what the limit protects
            return
        try:
            await self._converse(reader, writer, peer, control=False)
        finally:
            self._give_slot(source, controller)

    async def _control_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection to the control listener: the controller's networks only, within its own slots."""
        peer = str(writer.get_extra_info("peername")[0])
        if not _inside(peer, self.limits.controller_networks) or self._control_open >= self.limits.control_slots:
            writer.transport.abort()  # a stranger learns nothing here, not even an error
            return
        self._control_open += 1
        try:
            await self._converse(reader, writer, peer, control=True)
        finally:
            self._control_open -= 1

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str,
                        control: bool) -> None:
        """Answer one connection's requests until it ends, within its lifetime; then close it."""
        ends = asyncio.get_running_loop().time() + self.limits.lifetime_seconds
        answered = False
        try:
            while await self._exchange(reader, writer, peer, ends, control):
                pass
            answered = True
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass  # a client that went away, sent garbage or nothing, or ran out of time: nothing to answer
        finally:
            if answered:
                writer.close()  # the last answer is on its way: a clean end
            else:
                writer.transport.abort()  # nothing to send; a client that reads nothing holds no buffer

    def _take_slot(self, source: str, controller: bool) -> bool:
        limits = self.limits
        if controller:
            if self._controller_open >= limits.controller_slots:
                return False
            self._controller_open += 1
            return True
        if self._open >= limits.max_connections or self._by_source[source] >= limits.per_source:
            return False
        self._open += 1
        self._by_source[source] += 1
        return True

    def _give_slot(self, source: str, controller: bool) -> None:
        if controller:
            self._controller_open -= 1
            return
        self._open -= 1
        self._by_source[source] -= 1
        if not self._by_source[source]:
            del self._by_source[source]

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str,
                        ends: float, control: bool) -> bool:
        """One request and its answer, all before the connection's end (``ends``, loop time);
        whether the connection carries another."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(min(loop.time() + self.limits.idle_seconds, ends)):
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
            status, extra, body = self.answer(method, request.target, peer, control)
            # A request with a body is answered, but its body is not read: the connection ends.
            bodiless = request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers
            keep = request.keep_alive and bodiless and loop.time() < ends
        response = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", "Cache-Control: no-store",
                    *(f"{name}: {value}" for name, value in extra.items())]
        if status != 204:
            response.append(f"Content-Length: {len(body)}")
        response.append("Connection: keep-alive" if keep else "Connection: close")
        writer.write(("\r\n".join(response) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body))
        async with asyncio.timeout_at(ends):
            await writer.drain()
        return keep


def _address(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The peer's address (an IPv4-mapped one as IPv4, a link-local one without its zone)."""
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _source(peer: str) -> str:
    """Whose connection this is, for the per-source limit: the address, an IPv6 one's /64 (one
    host has all of it)."""
    address = _address(peer)
    if address is None:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _inside(peer: str, networks: Sequence[Network]) -> bool:
    address = _address(peer)
    return address is not None and any(address in network for network in networks)


async def run(key: bytes, addresses: Sequence[tuple[str, int]], limits: Limits | None = None,
              control: Sequence[tuple[str, int]] = ()) -> None:
    """Serve until SIGTERM or SIGINT (``control``: the control listener's addresses)."""
    server = ProbeTargetServer(key, limits)
    await server.serve(addresses, control)
    for index, listening in enumerate(server.servers):
        what = "probe target" if index < len(addresses) else "probe target's control listener"
        for sock in listening.sockets:
            log.info("%s listening on %s", what, sock.getsockname()[:2])
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    server.close()
