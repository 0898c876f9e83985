"""The one HTTP/1.1 head parser (egress_proxies.http1): its rules, and the same parser and
16 KiB limit in its three users, each through its real socket path on 127.0.0.1: the probe's
client, the probe target and the controller's HTTP server."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from egress_proxies.health import SweepHealth
from egress_proxies.http1 import MAX_HEAD_BYTES, MalformedHead, parse_request, parse_response
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.serving.probe import ProbeDestination, Prober, ProbeReason, ProbeTarget
from egress_proxies.serving.target import ProbeTargetServer

OVERSIZED = b"X-Padding: " + b"a" * MAX_HEAD_BYTES


def test_a_response_head_gives_status_headers_and_keep_alive() -> None:
    head = parse_response(b"HTTP/1.1 204 No Content\r\nX-Egress-Probe-Proof:  abc \r\nCONNECTION: Close\r\n"
                          b"X-Egress-Probe-Proof: second\r\nnot a field")
    assert (head.version, head.status) == ("HTTP/1.1", 204)
    # Names lower-cased, values stripped; of a repeated field the first counts.
    assert head.headers == {"x-egress-probe-proof": "abc", "connection": "Close"}
    assert not head.keep_alive


@pytest.mark.parametrize(("version", "connection", "keep"), [
    ("HTTP/1.1", None, True), ("HTTP/1.1", "close", False), ("HTTP/1.0", None, False),
    ("HTTP/1.0", "Keep-Alive", True)])
def test_keep_alive_follows_the_version_and_connection(version: str, connection: str | None, keep: bool) -> None:
    field = f"\r\nConnection: {connection}" if connection else ""
    assert parse_response(f"{version} 200 OK{field}".encode()).keep_alive is keep
    assert parse_request(f"GET / {version}{field}".encode()).keep_alive is keep


def test_a_request_head_gives_method_target_and_headers() -> None:
    head = parse_request(b"GET /v1/proxies?x=1 HTTP/1.1\r\nAuthorization: Bearer t\r\nHost: h")
    assert (head.method, head.target, head.version) == ("GET", "/v1/proxies?x=1", "HTTP/1.1")
    assert head.headers == {"authorization": "Bearer t", "host": "h"}


@pytest.mark.parametrize("head", [b"SSH-2.0-OpenSSH_9.2", b"HTTP/2 200", b"HTTP/1.1 20 OK", b"HTTP/1.1 abc OK", b""])
def test_what_is_not_a_status_line_is_malformed(head: bytes) -> None:
    with pytest.raises(MalformedHead, match=r"^not an HTTP/1\.x status line$"):
        parse_response(head)


@pytest.mark.parametrize("head", [b"GET /", b"GET  / HTTP/1.1", b"GET / HTTP/2.0", b"GET / HTTP/1.1 x", b""])
def test_what_is_not_a_request_line_is_malformed(head: bytes) -> None:
    with pytest.raises(MalformedHead, match=r"^not an HTTP/1\.x request line$"):
        parse_request(head)


def test_the_probe_calls_a_head_over_the_limit_a_bad_response() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def answer_oversized() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 204 No Content\r\n" + OVERSIZED + b"\r\n\r\n")

        server = threading.Thread(target=answer_oversized)
        server.start()
        destination = ProbeDestination(http_url="http://127.0.0.1:9/generate_204", proof_key=b"k" * 32)
        target = ProbeTarget(key="big", host="127.0.0.1", port=listener.getsockname()[1], destination=destination)
        outcome = asyncio.run(Prober().probe_one(target, full=False))
        server.join(timeout=5)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.BAD_RESPONSE)
    assert outcome.message.endswith(f"response headers exceed {MAX_HEAD_BYTES} bytes")


def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_the_controller_server_answers_431_over_the_limit_and_400_to_a_bad_request_line() -> None:
    server = ControllerHTTPServer(SweepHealth(30.0), DiscoveryView(), DiscoveryAccess(None))
    server.start("127.0.0.1", 0)
    try:
        assert exchange(server.port, b"GET /healthz HTTP/1.1\r\n" + OVERSIZED + b"\r\n\r\n").startswith(
            b"HTTP/1.1 431 ")
        assert exchange(server.port, b"GET /healthz\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 ")
    finally:
        server.stop()


def test_the_probe_target_keeps_alive_what_asks_for_it_and_drops_a_head_over_the_limit() -> None:
    async def run() -> tuple[bytes, bytes, bytes]:
        target = ProbeTargetServer(b"k" * 32)
        await target.serve([("127.0.0.1", 0)])
        port = target.servers[0].sockets[0].getsockname()[1]
        try:
            # HTTP/1.0 asking for keep-alive, then a malformed line on the same connection.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHELLO\r\n\r\n")
            both = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\n" + OVERSIZED + b"\r\n\r\n")
            oversized = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return both.split(b"\r\n\r\n", 2)[0], both.split(b"ok\n", 1)[1], oversized
        finally:
            target.close()

    first, second, oversized = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 200 ") and b"Connection: keep-alive" in first
    assert second.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in second
    assert oversized == b""  # closed without an answer
