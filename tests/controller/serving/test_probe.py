"""The controller's probe through real squid (Debian's package) in a network namespace of our own,
against the project's own probe target (``egress-proxies probe-target``) in the same namespace.

Proxies and the target live in the namespace (tests/support/netns/squid.py, probe_target.py); the probe
runs here, in the test process, and reaches them over the namespace's veth. Every Prober here is
limited to the namespace's /24 and loopback (``allowed_networks``), so a mistake cannot send a
probe anywhere else. Liars, blackholes and garbage servers are fake proxies in the namespace
(tests/support/netns/fake_proxies.py) or sockets on 127.0.0.1 in this process.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from egress_proxies.serving import target as target_module
from egress_proxies.serving.probe import (
    ProbeConfigError,
    ProbeCredentials,
    ProbeDestination,
    ProbeOutcome,
    Prober,
    ProbeReason,
    ProbeTarget,
)
from egress_proxies.serving.proof import (
    PROOF_HEADER,
    answer_proof,
    echo_proof,
    new_nonce,
    proves_answer,
    proves_echo,
)
from egress_proxies.serving.target import ProbeTargetServer
from support.netns.fake_proxies import FakeProxies
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import ProbeTargetProcess
from support.netns.squid import Squid, basic_auth_config, write_password_file

USER = "crawlers"
PASSWORD = "pw-5f0c2b7e9d4a41c3b8e6a1d09c7f3e2b"  # a marker no message, repr or log may contain
# Every proxy is fast here; a generous bound keeps a loaded CI machine from failing the good path.
CHECK_TIMEOUT = 5.0


@dataclass
class Lab:
    ns: NetworkNamespace
    target: ProbeTargetProcess
    fakes: FakeProxies
    open_squid: Squid  # allows everything
    auth_squid: Squid  # Basic auth (basic_ncsa_auth), USER / PASSWORD
    deny_squid: Squid  # allows everything except the probe target's address

    def prober(self) -> Prober:
        return Prober(allowed_networks=[self.ns.network, "127.0.0.0/8"])

    def destination(self, check_timeout: float = CHECK_TIMEOUT, **fields: Any) -> ProbeDestination:
        settings: dict[str, Any] = {"http_url": self.target.url(), "proof_key": self.target.key,
                                    "connect": self.target.connect_target, "check_timeout": check_timeout, **fields}
        return ProbeDestination(**settings)

    def target_of(self, squid: Squid, *, key: str = "p", destination: ProbeDestination | None = None,
                  **fields: Any) -> ProbeTarget:
        return ProbeTarget(key=key, host=squid.address, port=squid.port,
                           destination=destination or self.destination(), **fields)

    def fake(self, mode: str, port: int, destination: ProbeDestination | None = None,
             **options: Any) -> ProbeTarget:
        """A fake proxy in the namespace answering as ``mode``, with USER's credentials."""
        self.fakes.set(self.ns.address, port, mode, {USER: _bcrypt(PASSWORD)}, **options)
        return ProbeTarget(key=f"fake-{port}", host=self.ns.address, port=port,
                           destination=destination or self.destination(), credentials=ProbeCredentials(USER, PASSWORD),
                           expect_private=True)


def _bcrypt(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the probe tests need root (network namespaces); run them as root, as CI does", pytrace=False)
    with NetworkNamespace() as ns, ProbeTargetProcess(ns) as target, FakeProxies(ns) as fakes:
        password_file = write_password_file(ns.root / "passwords", {USER: PASSWORD})
        deny = f"acl target dst {target.address}/32\nhttp_access deny target\nhttp_access allow all\n"
        with Squid(ns, "http_access allow all\n", port=3128, name="open") as open_squid, \
                Squid(ns, basic_auth_config(password_file), port=3129, name="auth") as auth_squid, \
                Squid(ns, deny, port=3130, name="deny") as deny_squid:
            yield Lab(ns, target, fakes, open_squid, auth_squid, deny_squid)
            for squid in (open_squid, auth_squid, deny_squid):
                squid.terminate()  # all three shut down at once, then each is waited for


def probe(lab: Lab, target: ProbeTarget, full: bool = True, answered: bool = False) -> ProbeOutcome:
    async def one() -> ProbeOutcome:
        return await lab.prober().probe_one(target, full=full, answered=answered)
    return asyncio.run(one())


@pytest.fixture
def blackhole() -> Iterator[socket.socket]:
    """A socket on 127.0.0.1 that listens and never accepts: the kernel completes the handshake,
    nothing ever answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield listener


# -- serving: through real squid to the real probe target ------------------------------------------------


def test_serving_proxy_passes_every_check_with_the_targets_proof(lab: Lab) -> None:
    outcome = probe(lab, lab.target_of(lab.open_squid, destination=lab.destination(egress_echo_url=lab.target.url(
        "/echo"))))
    assert outcome.serving, outcome.message
    assert outcome.reason is ProbeReason.SERVING
    assert outcome.latency_seconds is not None and 0 < outcome.latency_seconds < CHECK_TIMEOUT
    # The tunnel reached the target: a request went through it and its proof came back.
    assert f"CONNECT {lab.target.connect_target} reached it" in outcome.message
    # The address squid connected to the target from, as the target saw it (and proved).
    assert outcome.egress_ip is not None and ipaddress.ip_address(outcome.egress_ip) in ipaddress.ip_network(
        lab.ns.network)
    assert outcome.private is None  # not asked for


def test_egress_echo_reports_the_address_the_target_saw(lab: Lab) -> None:
    egress = lab.ns.add_address()
    config = f"http_access allow all\ntcp_outgoing_address {egress}\n"
    with Squid(lab.ns, config, port=3141, name="egress") as squid:
        outcome = probe(lab, lab.target_of(squid, destination=lab.destination(egress_echo_url=lab.target.url(
            "/echo"))))
    assert outcome.serving, outcome.message
    assert outcome.egress_ip == egress != squid.address  # the way out, not the way in


def test_a_probe_that_is_not_full_skips_the_echo_and_privacy(lab: Lab) -> None:
    target = lab.target_of(lab.auth_squid, destination=lab.destination(egress_echo_url=lab.target.url("/echo")),
                           credentials=ProbeCredentials(USER, PASSWORD), expect_private=True)
    outcome = probe(lab, target, full=False)
    assert outcome.serving and not outcome.full
    assert outcome.egress_ip is None and outcome.private is None


def test_stopped_squid_is_connection_refused(lab: Lab) -> None:
    with Squid(lab.ns, "http_access allow all\n", port=3140, name="stopping") as squid:
        assert probe(lab, lab.target_of(squid)).serving
    outcome = probe(lab, lab.target_of(squid))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.CONNECTION_REFUSED)
    assert f"{squid.address}:3140" in outcome.message
    assert outcome.latency_seconds is None


@pytest.mark.parametrize("answered", [False, True], ids=["privacy-beside", "privacy-first-on-one-connection"])
def test_auth_squid_with_the_right_credentials_is_serving_and_private(lab: Lab, answered: bool) -> None:
    """Squid takes the privacy check's three requests written together, on a connection of their
    own or (an instance that answered before) first on the probe's one connection."""
    target = lab.target_of(lab.auth_squid, credentials=ProbeCredentials(USER, PASSWORD), expect_private=True,
                           destination=lab.destination(egress_echo_url=lab.target.url("/echo")))
    outcome = probe(lab, target, answered=answered)
    assert outcome.serving, outcome.message
    assert outcome.private is True and outcome.egress_ip is not None
    # Both ways out without credentials, and a made-up user and password: all refused.
    assert outcome.privacy_message.count(" 407") == 3
    assert "made-up user and password" in outcome.privacy_message
    assert PASSWORD not in repr(target) and PASSWORD not in repr(outcome)


def test_an_identity_the_proxy_does_not_know_is_refused_never_serving(lab: Lab) -> None:
    """The HTTP check logs in as the instance itself: another instance at this address (which
    knows only its own identity) answers 407."""
    target = lab.target_of(lab.auth_squid, credentials=ProbeCredentials(USER, PASSWORD),
                           identity=ProbeCredentials("probe-another-instance", PASSWORD), expect_private=True)
    outcome = probe(lab, target)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.PROXY_AUTHENTICATION_REQUIRED)
    assert "another instance answers at this address" in outcome.message


def test_auth_squid_without_configured_credentials_is_proxy_authentication_required(lab: Lab) -> None:
    outcome = probe(lab, lab.target_of(lab.auth_squid, expect_private=True))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.PROXY_AUTHENTICATION_REQUIRED)
    assert "answered 407 without credentials" in outcome.message


def test_wrong_credentials_are_proxy_authentication_required_never_healthy(
        lab: Lab, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "wrong-" + PASSWORD
    caplog.set_level(logging.DEBUG, logger="egress_proxies")
    outcome = probe(lab, lab.target_of(lab.auth_squid, credentials=ProbeCredentials(USER, wrong),
                                       expect_private=True))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.PROXY_AUTHENTICATION_REQUIRED)
    assert "407 with the configured credentials" in outcome.message
    assert outcome.private is None  # not verified: the proxy is not serving us
    assert wrong not in repr(outcome) and wrong not in caplog.text


def test_squid_denying_the_target_is_unexpected_status_403(lab: Lab) -> None:
    outcome = probe(lab, lab.target_of(lab.deny_squid))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.UNEXPECTED_STATUS)
    assert outcome.message.startswith("UnexpectedStatus 403: ")
    assert "expected 204" in outcome.message


def test_connect_to_a_closed_port_is_connect_failed(lab: Lab) -> None:
    closed = lab.destination(connect=f"{lab.target.address}:8444")
    outcome = probe(lab, lab.target_of(lab.open_squid, destination=closed))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.CONNECT_FAILED)
    # Squid answers 503 when its own connection to the target is refused.
    assert outcome.message.startswith("ConnectFailed 503: CONNECT ")
    assert outcome.latency_seconds is not None  # the HTTP check before it passed


def test_a_tunnel_to_something_that_is_not_the_target_is_connect_failed(lab: Lab) -> None:
    """A CONNECT that opens (squid's 200) to a port that answers, but not with the target's proof."""
    elsewhere = lab.destination(connect=f"{lab.open_squid.address}:{lab.auth_squid.port}")
    outcome = probe(lab, lab.target_of(lab.open_squid, destination=elsewhere))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.CONNECT_FAILED)
    assert "then GET through the tunnel answered 400, expected 204" in outcome.message


# -- liars and leaks (fake proxies) ---------------------------------------------------------------------


def test_an_endpoint_that_answers_by_itself_never_passes(lab: Lab) -> None:
    """Issue 27 row 3: a 204 of its own, a CONNECT 200 echoing the "tunnel", an invented echo address."""
    outcome = probe(lab, lab.fake("liar", 3200))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.TARGET_NOT_REACHED)
    assert "no valid proof of the probe's nonce" in outcome.message
    # A proxy that forwards the plain-HTTP check but lies about its tunnel, or its echo.
    tunnel = probe(lab, lab.fake("forward", 3204, lie=["connect"]))
    assert (tunnel.serving, tunnel.reason) == (False, ProbeReason.CONNECT_FAILED)
    echo = probe(lab, lab.fake("forward", 3205, lab.destination(egress_echo_url=lab.target.url("/echo")),
                               lie=["echo"]))
    assert (echo.serving, echo.reason) == (False, ProbeReason.EGRESS_ECHO_FAILED)
    assert "no valid proof" in echo.message and "203.0.113.77" not in echo.message and echo.egress_ip is None
    honest = probe(lab, lab.fake("forward", 3206, lab.destination(egress_echo_url=lab.target.url("/echo"))))
    assert honest.serving and honest.private is True, honest.message
    # This proxy ends the connection after each forwarded answer: the CONNECT written behind the
    # echo is lost with it and goes out again on a new connection.
    again = probe(lab, lab.fake("forward", 3207, lab.destination(egress_echo_url=lab.target.url("/echo"))),
                  answered=True)
    assert again.serving and again.private is True and again.egress_ip is not None, again.message


@pytest.mark.parametrize("forge", ["append-address", "replay-204"])
def test_a_204_proof_replayed_as_the_egress_echo_is_refused(lab: Lab, forge: str) -> None:
    """Issue 38 row 2: a lying proxy forwards the 204 check honestly, then asks the real probe target
    for a 204 proof of the echo's nonce with an invented address appended (``N%20203.0.113.77``), or
    of the echo's nonce itself, and hands that in as the echo's proof of 203.0.113.77."""
    port = 3209 if forge == "append-address" else 3210
    liar = lab.fake("forward", port, lab.destination(egress_echo_url=lab.target.url("/echo")), lie=["echo"],
                    forge=forge)
    outcome = probe(lab, liar)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.EGRESS_ECHO_FAILED), outcome.message
    assert outcome.egress_ip is None and "203.0.113.77" not in outcome.message
    assert "no valid proof" in outcome.message


@pytest.mark.parametrize("answered", [False, True], ids=["privacy-beside", "privacy-first-on-one-connection"])
def test_a_proxy_that_takes_any_password_is_not_private(lab: Lab, answered: bool) -> None:
    """Issue 26 row 7: made-up credentials must get 407 too. First on the probe's connection,
    the serving checks then go on a new one (the answers still due are not theirs)."""
    outcome = probe(lab, lab.fake("any-password", 3201 + 100 * answered), answered=answered)
    assert outcome.serving and outcome.private is False
    assert "made-up user and password" in outcome.privacy_message and "not 407 or 403" in outcome.privacy_message


def test_an_answer_never_reaches_a_message(lab: Lab, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 26 row 11: an endpoint echoing Proxy-Authorization back puts none of it anywhere."""
    caplog.set_level(logging.DEBUG, logger="egress_proxies")
    echoer = lab.fake("echo-credentials", 3202)
    outcome = probe(lab, echoer)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.BAD_RESPONSE)
    assert outcome.message.endswith("not an HTTP/1.x status line")
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for text in (outcome.message, outcome.privacy_message, repr(outcome), caplog.text):
        assert PASSWORD not in text and basic not in text


def test_a_hung_proxy_times_out_within_its_own_check_timeout(lab: Lab) -> None:
    hung = lab.fake("hang", 3203)
    quick = ProbeTarget(key="hung", host=hung.host, port=hung.port, destination=lab.destination(check_timeout=1.0))
    started = time.monotonic()
    outcome = probe(lab, quick)
    elapsed = time.monotonic() - started
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.TIMEOUT)
    assert "within 1s" in outcome.message and 1.0 <= elapsed < 2.0


# -- the probe target itself, asked directly ---------------------------------------------------------------


def test_the_probe_target_answers_directly_and_its_absence_is_named(lab: Lab) -> None:
    prober = lab.prober()
    destination = lab.destination(egress_echo_url=lab.target.url("/echo"), check_timeout=1.0)
    assert asyncio.run(prober.check_destination(destination)) is None
    wrong_key = lab.destination(proof_key=b"another key, not the target's")
    problem = asyncio.run(prober.check_destination(wrong_key))
    assert problem is not None and "probe.keyFile" in problem and problem.startswith("ProbeTargetUnreachable")
    lab.target.pause()
    try:
        problem = asyncio.run(prober.check_destination(destination))
    finally:
        lab.target.resume()
    assert problem is not None and problem.startswith("ProbeTargetUnreachable: Timeout: GET ")
    assert "asked directly" in problem


def test_the_probe_targets_answers() -> None:
    """The shipped server's protocol: a proof for a nonce, the caller's address with its own proof."""
    server = ProbeTargetServer(b"k" * 32)
    nonce = new_nonce()
    status, headers, body = server.answer("GET", f"/generate_204?egress-probe-nonce={nonce}", "198.51.100.7")
    assert (status, headers, body) == (204, {PROOF_HEADER: answer_proof(b"k" * 32, nonce)}, b"")
    status, _, body = server.answer("GET", f"http://probe.test/echo?egress-probe-nonce={nonce}", "198.51.100.7")
    assert status == 200 and body == (b'{"ip": "198.51.100.7", "proof": "'
                                      + echo_proof(b"k" * 32, nonce, "198.51.100.7").encode() + b'"}')
    assert server.answer("GET", "/generate_204", "198.51.100.7") == (204, {}, b"")
    assert server.answer("POST", "/generate_204", "198.51.100.7")[0] == 405
    # The control listener answers the direct check's 204 only: no echo there.
    assert server.answer("GET", f"/generate_204?egress-probe-nonce={nonce}", "198.51.100.7", control=True)[0] == 204
    assert server.answer("GET", f"/echo?egress-probe-nonce={nonce}", "198.51.100.7", control=True)[0] == 404


def test_a_control_listener_without_the_controllers_networks_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the controller's networks"):
        asyncio.run(ProbeTargetServer(b"k" * 32).serve([], control=[("127.0.0.1", 0)]))


@pytest.mark.parametrize("query", ["egress-probe-nonce=abc", f"egress-probe-nonce={new_nonce()}%20203.0.113.77",
                                   f"egress-probe-nonce={new_nonce().upper()}", "egress-probe-nonce=",
                                   f"egress-probe-nonce={new_nonce()}&egress-probe-nonce={new_nonce()}"])
def test_the_probe_target_signs_only_nonces_of_the_one_format(query: str) -> None:
    """Issue 38 row 2: whatever a stranger sends as a nonce, the target signs only 32 lower-case hex digits."""
    server = ProbeTargetServer(b"k" * 32)
    for path in ("/generate_204", "/echo"):
        status, headers, body = server.answer("GET", f"{path}?{query}", "198.51.100.7")
        assert (status, PROOF_HEADER in headers) == (400, False)
        assert b"32 lower-case hex digits" in body and b"proof" not in body


def test_one_kind_of_proof_never_passes_for_another() -> None:
    """Domain separation: the 204 proof of any nonce is not an echo proof, and a proof of a nonce
    that is not of the probe's format proves nothing."""
    key, nonce = b"k" * 32, new_nonce()
    assert answer_proof(key, nonce) != echo_proof(key, nonce, "203.0.113.77")
    assert proves_answer(key, nonce, answer_proof(key, nonce))
    assert proves_echo(key, nonce, "203.0.113.77", echo_proof(key, nonce, "203.0.113.77"))
    assert not proves_echo(key, nonce, "203.0.113.77", answer_proof(key, nonce))
    assert not proves_answer(key, nonce, echo_proof(key, nonce, "203.0.113.77"))
    old_style = hmac.new(key, f"{nonce} 203.0.113.77".encode(), hashlib.sha256).hexdigest()
    assert not proves_echo(key, nonce, "203.0.113.77", old_style)
    assert not proves_answer(key, "abc", hmac.new(key, b"abc", hashlib.sha256).hexdigest())


# -- the endpoint itself, on loopback ---------------------------------------------------------------------


def test_blackhole_times_out_within_the_check_timeout(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    target = ProbeTarget(key="hole", host="127.0.0.1", port=port, destination=lab.destination(check_timeout=0.5))
    started = time.monotonic()
    outcome = probe(lab, target)
    elapsed = time.monotonic() - started
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.TIMEOUT)
    assert "within 0.5s" in outcome.message
    assert 0.5 <= elapsed < 1.5


def test_a_kept_alive_connection_the_proxy_closed_is_retried_once_on_a_new_one(lab: Lab) -> None:
    """A proxy may close an idle persistent connection at any time; the next request is resent.
    The answers carry the target's proofs, computed here from the nonces the probe sent."""
    key = lab.target.key
    requests: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    head = conn.recv(4096)
                    requests.append(head.split(b" ", 1)[0])
                    if head.startswith(b"GET"):
                        nonce = head.split(b"egress-probe-nonce=", 1)[1].split(b" ", 1)[0].decode()
                        conn.sendall(f"HTTP/1.1 204 No Content\r\n{PROOF_HEADER}: {answer_proof(key, nonce)}\r\n\r\n"
                                     .encode())
                    else:  # the CONNECT, then the request through the "tunnel"
                        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        inner = conn.recv(4096)
                        nonce = inner.split(b"egress-probe-nonce=", 1)[1].split(b" ", 1)[0].decode()
                        conn.sendall(f"HTTP/1.1 204 No Content\r\n{PROOF_HEADER}: {answer_proof(key, nonce)}\r\n"
                                     "Connection: close\r\n\r\n".encode())

        server = threading.Thread(target=serve)
        server.start()
        target = ProbeTarget(key="flaky", host="127.0.0.1", port=listener.getsockname()[1],
                             destination=lab.destination())
        outcome = probe(lab, target)
        server.join(timeout=5)
    assert outcome.serving, outcome.message
    assert requests == [b"GET", b"CONNECT"]


def test_a_peer_that_does_not_speak_http_is_a_bad_response(lab: Lab) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def answer_garbage() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

        server = threading.Thread(target=answer_garbage)
        server.start()
        target = ProbeTarget(key="ssh", host="127.0.0.1", port=listener.getsockname()[1],
                             destination=lab.destination())
        outcome = probe(lab, target)
        server.join(timeout=5)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.BAD_RESPONSE)
    assert outcome.message.endswith("not an HTTP/1.x status line") and "SSH" not in outcome.message


def test_an_endpoint_outside_the_allowed_networks_is_never_contacted(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    prober = Prober(allowed_networks=[lab.ns.network])
    outcomes = prober.probe_all([
        ProbeTarget(key="loopback", host="127.0.0.1", port=port, destination=lab.destination()),
        ProbeTarget(key="named", host="localhost", port=port, destination=lab.destination()),
    ])
    for outcome in outcomes.values():
        assert (outcome.serving, outcome.reason) == (False, ProbeReason.NOT_ALLOWED)
        assert "nothing was sent" in outcome.message
    # No connection is waiting in the listener's backlog: nothing was even connected.
    readable, _, _ = select.select([blackhole], [], [], 0.2)
    assert readable == []


# -- the interface -----------------------------------------------------------------------------------


def test_many_proxies_at_once_each_get_their_own_outcome(lab: Lab) -> None:
    credentials = ProbeCredentials(USER, PASSWORD)
    targets = [lab.target_of(squid, key=f"{squid.name}-{i}", credentials=credentials, expect_private=True)
               for i in range(20) for squid in (lab.open_squid, lab.auth_squid, lab.deny_squid)]
    outcomes = lab.prober().probe_all(targets, concurrency=8)
    assert len(outcomes) == 60
    by_squid = {(key.rsplit("-", 1)[0], o.serving, o.reason, o.private) for key, o in outcomes.items()}
    assert by_squid == {("open", True, ProbeReason.SERVING, False), ("auth", True, ProbeReason.SERVING, True),
                        ("deny", False, ProbeReason.UNEXPECTED_STATUS, None)}


def test_a_deadline_bounds_when_probes_start(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    holes = [ProbeTarget(key=f"hole-{i}", host="127.0.0.1", port=port, destination=lab.destination(check_timeout=0.5))
             for i in range(3)]
    started = time.monotonic()
    outcomes = lab.prober().probe_all([lab.target_of(lab.open_squid, key="good"), *holes], concurrency=1,
                                      deadline=0.3)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0
    assert outcomes["good"].serving  # probed first, before the deadline
    # The first hole started in time and ran to its own timeout; the others never started.
    assert outcomes["hole-0"].reason is ProbeReason.TIMEOUT
    assert "hole-1" not in outcomes and "hole-2" not in outcomes


def test_probe_all_runs_from_a_plain_thread_and_refuses_to_block_a_running_event_loop(lab: Lab) -> None:
    prober = lab.prober()
    target = lab.target_of(lab.open_squid)
    results: list[ProbeOutcome] = []
    sweep = threading.Thread(target=lambda: results.append(prober.probe_all([target])[target.key]))
    sweep.start()
    sweep.join(timeout=30)
    assert len(results) == 1 and results[0].serving

    async def inside_a_loop() -> ProbeOutcome:
        with pytest.raises(RuntimeError, match="await probe_all_async"):
            prober.probe_all([target])
        return (await prober.probe_all_async([target]))[target.key]

    assert asyncio.run(inside_a_loop()).serving


@pytest.mark.parametrize(("fields", "message"), [
    ({"http_url": "https://example.test/generate_204"}, "http_url must be an http:// URL"),
    ({"http_url": "http://user:pw@example.test/"}, "http_url must not carry user information"),
    ({"connect": "example.test"}, "connect_target must be host:port"),
    ({"connect": "example.test:0"}, "connect_target must be host:port"),
    ({"egress_echo_url": "ftp://example.test/"}, "egress_echo_url must be an http:// URL"),
    ({"expected_status": 2040}, "expected_status must be an HTTP status"),
    ({"proof_key": b""}, "proof_key must be the probe target's key"),
    ({"check_timeout": 0}, "check_timeout must be positive"),
])
def test_a_bad_destination_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"http_url": "http://example.test/generate_204", "proof_key": b"k" * 32, **fields}
    with pytest.raises(ProbeConfigError, match=message):
        ProbeDestination(**settings)  # type: ignore[arg-type]


def test_bad_targets_credentials_and_duplicate_keys_are_refused() -> None:
    destination = ProbeDestination(http_url="http://example.test/", proof_key=b"k" * 32)
    with pytest.raises(ProbeConfigError, match="probe target 'uid-1': port must be 1-65535"):
        ProbeTarget(key="uid-1", host="10.0.0.1", port=0, destination=destination)
    with pytest.raises(ProbeConfigError, match=r"credentials.user .* no ':'"):
        ProbeCredentials("team:a", PASSWORD)
    with pytest.raises(ProbeConfigError, match=r"credentials\.password must not contain CR, LF"):
        ProbeCredentials(USER, "line\nbreak")
    target = ProbeTarget(key="same", host="127.0.0.1", port=1, destination=destination)
    with pytest.raises(ProbeConfigError, match="'same' appears twice"):
        Prober(allowed_networks=["127.0.0.0/8"]).probe_all([target, target])
    with pytest.raises(ProbeConfigError, match="allowed_networks"):
        Prober(allowed_networks=["10.0.0.300/8"])


@pytest.mark.parametrize(("peer", "source"), [
    ("198.51.100.7", "198.51.100.7"),
    ("::ffff:198.51.100.7", "198.51.100.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_the_probe_targets_limits_count_a_host_as_one_source(peer: str, source: str) -> None:
    """Issue 38 row 4: an IPv6 client has its whole /64, so that is one source; an IPv4-mapped
    address is its IPv4 address; the controller's networks match either way."""
    assert target_module._source(peer) == source
    networks = (ipaddress.ip_network("198.51.100.0/24"), ipaddress.ip_network("2001:db8::/32"))
    assert target_module._inside(peer, networks) == (not peer.startswith("fe80"))
    # The controller's own slots go by its exact address, not by its /64.
    one = (ipaddress.ip_network("2001:db8:1:2:aaaa::1/128"),)
    assert target_module._inside(peer, one) == (peer == "2001:db8:1:2:aaaa::1")
