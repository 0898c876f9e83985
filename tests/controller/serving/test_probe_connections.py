"""Which requests of a probe share a connection and which go out together (issue 37 item 5), against
a proxy of our own on 127.0.0.1 that records every request it answers.

The proxy (``RecordingProxy``) answers as a squid with Basic auth in front of the probe target
would: 407 to a request without the right ``Proxy-Authorization``, and otherwise the target's
answers with their proofs (computed here with the key, from the nonces the probe sent); a
CONNECT's tunnel answers the request sent through it. It records (connection number, request,
credentials) per answered request, and with ``hold`` it answers nothing on a connection until
that many requests have arrived on it: only a client that writes them together (pipelining)
gets past that. The last test drives the monitor's own rounds over it. The real-squid and
forwarding-proxy cases are in test_probe.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProbeSettings as CollectionProbeSettings,
)
from egress_proxies.providers.client import ProbeSettings
from egress_proxies.serving.monitor import ServingMonitor, Watched
from egress_proxies.serving.probe import ProbeCredentials, ProbeDestination, ProbeOutcome, Prober, ProbeTarget
from egress_proxies.serving.proof import NONCE_PARAMETER, PROOF_HEADER, answer_proof, echo_proof

KEY = b"connections-test-key-0123456789abcdef"
CREDENTIALS = ProbeCredentials("crawlers", "pw-3c1e0a9b7d5f4e2c")
IDENTITY = ProbeCredentials("probe-instance-identity", CREDENTIALS.password)
# Only ever written into request lines: the proxy below answers for the target, nothing connects there.
DESTINATION = ProbeDestination(http_url="http://192.0.2.10:8080/generate_204", proof_key=KEY,
                               connect="192.0.2.10:8443", egress_echo_url="http://192.0.2.10:8080/echo",
                               check_timeout=2.0)


@dataclass
class RecordingProxy:
    """See the module docstring. ``close_after_first_refusal``: the first 407 ends its connection."""

    hold: int = 0
    close_after_first_refusal: bool = False
    answered: list[tuple[int, str, str]] = field(default_factory=list)  # (connection, request, credentials)
    _refusals: int = 0

    def serve(self, listener: socket.socket) -> None:
        number = 0
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the test closed the listener
            threading.Thread(target=self._connection, args=(conn, number), daemon=True).start()
            number += 1

    def _connection(self, conn: socket.socket, number: int) -> None:
        buffer = b""
        with conn:
            while True:
                held = self.hold if number == 0 and not self.answered else 1
                while buffer.count(b"\r\n\r\n") < max(1, held):
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                if not self._answer(conn, number, head.decode("latin-1").split("\r\n")):
                    return

    def _answer(self, conn: socket.socket, number: int, lines: list[str]) -> bool:
        method, target = lines[0].split(" ")[:2]
        auth = next((line.split(":", 1)[1].strip() for line in lines[1:]
                     if line.lower().startswith("proxy-authorization:")), None)
        who = {None: "none", CREDENTIALS.header_value(): "namespace", IDENTITY.header_value(): "identity"}.get(
            auth, "made-up")
        self.answered.append((number, f"{method} {target.split('?')[0]}", who))
        if who in ("none", "made-up"):
            self._refusals += 1
            close = self.close_after_first_refusal and self._refusals == 1
            conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n"
                         + (b"Connection: close\r\n" if close else b"") + b"\r\n")
            return not close
        if method == "CONNECT":
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            inner = conn.recv(65536).decode("latin-1")
            self.answered.append((number, "through the tunnel: " + inner.split(" ")[0], "none"))
            conn.sendall(f"HTTP/1.1 204 No Content\r\n{PROOF_HEADER}: {answer_proof(KEY, nonce_in(inner))}\r\n"
                         "Connection: close\r\n\r\n".encode())
            return False
        nonce = nonce_in(target)
        if target.split("?")[0].endswith("/echo"):
            body = json.dumps({"ip": "127.0.0.1", "proof": echo_proof(KEY, nonce, "127.0.0.1")}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        else:
            conn.sendall(f"HTTP/1.1 204 No Content\r\n{PROOF_HEADER}: {answer_proof(KEY, nonce)}\r\n\r\n".encode())
        return True


def nonce_in(text: str) -> str:
    return text.split(f"{NONCE_PARAMETER}=", 1)[1].split(" ", 1)[0].split("&", 1)[0]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def probe_through(proxy: RecordingProxy, listener: socket.socket, *, answered: bool) -> ProbeOutcome:
    threading.Thread(target=proxy.serve, args=(listener,), daemon=True).start()
    target = ProbeTarget(key="recorded", host="127.0.0.1", port=listener.getsockname()[1], destination=DESTINATION,
                         credentials=CREDENTIALS, identity=IDENTITY, expect_private=True)
    return asyncio.run(Prober(allowed_networks=["127.0.0.0/8"]).probe_one(target, full=True, answered=answered))


PRIVACY = [("GET http://192.0.2.10:8080/generate_204", "none"),
           ("GET http://192.0.2.10:8080/generate_204", "made-up"),
           ("CONNECT 192.0.2.10:8443", "none")]
SERVING = [("GET http://192.0.2.10:8080/generate_204", "identity"),
           ("GET http://192.0.2.10:8080/echo", "namespace"),
           ("CONNECT 192.0.2.10:8443", "namespace"),
           ("through the tunnel: GET", "none")]


def test_an_instance_that_answered_gets_its_privacy_check_first_written_together_on_its_one_connection(
        listener: socket.socket) -> None:
    """The three requests without valid credentials arrive together (the proxy answers none of
    them before all three are in), then the serving checks follow on the same connection."""
    proxy = RecordingProxy(hold=3)
    outcome = probe_through(proxy, listener, answered=True)
    assert outcome.serving and outcome.private is True, (outcome.message, outcome.privacy_message)
    assert outcome.privacy_message.count(" 407") == 3 and outcome.egress_ip == "127.0.0.1"
    assert [(request, who) for _, request, who in proxy.answered] == PRIVACY + SERVING
    assert {number for number, _, _ in proxy.answered} == {0}  # one connection for the whole probe
    assert outcome.latency_seconds is not None and 0 < outcome.latency_seconds < 2.0


def test_an_instance_not_known_to_answer_gets_its_privacy_check_on_a_connection_of_its_own(
        listener: socket.socket) -> None:
    """A new or failing instance: the privacy check beside the serving checks, on a connection
    that never carries valid credentials (so a hung proxy costs one check timeout, not two)."""
    proxy = RecordingProxy()
    outcome = probe_through(proxy, listener, answered=False)
    assert outcome.serving and outcome.private is True, (outcome.message, outcome.privacy_message)
    by_connection: dict[int, list[tuple[str, str]]] = {}
    for number, request, who in proxy.answered:
        by_connection.setdefault(number, []).append((request, who))
    assert sorted(by_connection.values()) == sorted([PRIVACY, SERVING])


def test_a_connection_the_proxy_ends_after_a_refusal_gets_the_rest_again_on_a_new_one(
        listener: socket.socket) -> None:
    """The proxy closes after the first 407: the two requests written behind it were never
    answered, so they go out again (together) on a new connection that has carried no valid
    credentials either, and the serving checks follow there."""
    proxy = RecordingProxy(close_after_first_refusal=True)
    outcome = probe_through(proxy, listener, answered=True)
    assert outcome.serving and outcome.private is True, (outcome.message, outcome.privacy_message)
    assert outcome.privacy_message.count(" 407") == 3
    assert proxy.answered == [(0, *PRIVACY[0])] + [(1, *request) for request in PRIVACY[1:] + SERVING]


class TargetTakenAsAnswering(Prober):
    """The real Prober, but the probe target asked directly is taken as answering: its address
    here is made up, and nothing may be sent there."""

    async def check_destination(self, destination: ProbeDestination) -> str | None:  # noqa: ARG002
        return None


def test_the_monitor_moves_an_instance_that_served_to_one_connection_per_full_probe(listener: socket.socket) -> None:
    """Through the monitor's own rounds (every probe full): the first probe of a new instance
    takes two connections, the next one, the instance having served, one."""
    proxy = RecordingProxy()
    threading.Thread(target=proxy.serve, args=(listener,), daemon=True).start()
    target = ProbeTarget(key="recorded", host="127.0.0.1", port=listener.getsockname()[1], destination=DESTINATION,
                         credentials=CREDENTIALS, identity=IDENTITY, expect_private=True)
    settings = ProbeSettings.from_result(CollectionProbeSettings(
        enabled=True, http_url=DESTINATION.http_url, key_file="/unused").as_dict())
    monitor = ServingMonitor(TargetTakenAsAnswering(allowed_networks=["127.0.0.0/8"]), full_every=1)
    monitor.watch({target.key: Watched("local", target)}, {"local": settings})
    monitor.probe_now()
    first = list(proxy.answered)
    assert len({number for number, _, _ in first}) == 2
    monitor.probe_now()
    second = proxy.answered[len(first):]
    outcome = monitor.outcome(target.key)
    assert outcome is not None and outcome.serving and outcome.full and outcome.private is True, outcome
    assert len({number for number, _, _ in second}) == 1
    assert [(request, who) for _, request, who in second] == PRIVACY + SERVING
