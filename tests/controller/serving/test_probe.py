"""The controller's probe through real squid (Debian's package) in a network namespace of our own.

Proxies and targets live in the namespace (tests/support/squid.py); the probe runs here, in the
test process, and reaches them over the namespace's veth. Every Prober here is limited to the
namespace's /24 and loopback (``allowed_networks``), so a mistake cannot send a probe anywhere
else. Blackholes and garbage servers are sockets on 127.0.0.1 in this process.
"""

from __future__ import annotations

import asyncio
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

from egress_proxies.serving.probe import (
    ProbeConfigError,
    ProbeCredentials,
    ProbeOutcome,
    Prober,
    ProbeReason,
    ProbeTarget,
)
from support.squid import NetworkNamespace, Squid, TargetServer, basic_auth_config, write_password_file

USER = "crawlers"
PASSWORD = "pw-5f0c2b7e9d4a41c3b8e6a1d09c7f3e2b"  # a marker no message, repr or log may contain
# Every proxy is fast here; a generous bound keeps a loaded CI machine from failing the good path.
CHECK_TIMEOUT = 5.0


@dataclass
class Lab:
    ns: NetworkNamespace
    targets: TargetServer
    open_squid: Squid  # allows everything
    auth_squid: Squid  # Basic auth (basic_ncsa_auth), USER / PASSWORD
    deny_squid: Squid  # allows everything except the target server's address

    def prober(self, *, check_timeout: float = CHECK_TIMEOUT, concurrency: int = 200,
               deadline: float = 30.0) -> Prober:
        return Prober(allowed_networks=[self.ns.network, "127.0.0.0/8"], check_timeout=check_timeout,
                      concurrency=concurrency, deadline=deadline)

    def target(self, squid: Squid, *, key: str = "p", **fields: Any) -> ProbeTarget:
        return ProbeTarget(key=key, host=squid.address, port=squid.port, http_url=self.targets.url("/generate_204"),
                           connect_target=self.targets.connect_target, **fields)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the probe tests need root (network namespaces); run them as root, as CI does", pytrace=False)
    with NetworkNamespace() as ns, TargetServer(ns) as targets:
        password_file = write_password_file(ns.root / "passwords", {USER: PASSWORD})
        deny = f"acl target dst {targets.address}/32\nhttp_access deny target\nhttp_access allow all\n"
        with Squid(ns, "http_access allow all\n", port=3128, name="open") as open_squid, \
                Squid(ns, basic_auth_config(password_file), port=3129, name="auth") as auth_squid, \
                Squid(ns, deny, port=3130, name="deny") as deny_squid:
            yield Lab(ns, targets, open_squid, auth_squid, deny_squid)
            for squid in (open_squid, auth_squid, deny_squid):
                squid.terminate()  # all three shut down at once, then each is waited for


def probe(lab: Lab, target: ProbeTarget, check_timeout: float = CHECK_TIMEOUT) -> ProbeOutcome:
    return lab.prober(check_timeout=check_timeout).probe_all([target])[target.key]


@pytest.fixture
def blackhole() -> Iterator[socket.socket]:
    """A socket on 127.0.0.1 that listens and never accepts: the kernel completes the handshake,
    nothing ever answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield listener


# -- serving ---------------------------------------------------------------------------------------


def test_serving_proxy_passes_every_check_with_its_latency(lab: Lab) -> None:
    before = len(lab.targets.requests())
    outcome = probe(lab, lab.target(lab.open_squid))
    assert outcome.serving, outcome.message
    assert outcome.reason is ProbeReason.SERVING
    assert outcome.latency_seconds is not None and 0 < outcome.latency_seconds < CHECK_TIMEOUT
    assert f"CONNECT {lab.targets.connect_target} answered 200" in outcome.message
    assert outcome.private is None  # not asked for
    # The 204 came from the origin through squid, not from squid alone: the origin saw the
    # request arrive with squid's Via header.
    seen = lab.targets.requests()[before:]
    assert [r["path"] for r in seen] == ["/generate_204"]
    assert any(name == "Via" and "squid" in value for name, value in seen[0]["headers"])


def test_stopped_squid_is_connection_refused(lab: Lab) -> None:
    with Squid(lab.ns, "http_access allow all\n", port=3140, name="stopping") as squid:
        assert probe(lab, lab.target(squid)).serving
    outcome = probe(lab, lab.target(squid))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.CONNECTION_REFUSED)
    assert f"{squid.address}:3140" in outcome.message
    assert outcome.latency_seconds is None


def test_auth_squid_with_the_right_credentials_is_serving_and_private(lab: Lab) -> None:
    target = lab.target(lab.auth_squid, credentials=ProbeCredentials(USER, PASSWORD), expect_private=True)
    outcome = probe(lab, target)
    assert outcome.serving, outcome.message
    assert outcome.private is True
    # Both ways out were tried without credentials, and both were refused by the auth rule.
    assert "GET " in outcome.privacy_message and "CONNECT " in outcome.privacy_message
    assert outcome.privacy_message.count(" 407") == 2
    assert PASSWORD not in repr(target) and PASSWORD not in repr(outcome)


def test_auth_squid_without_configured_credentials_is_proxy_authentication_required(lab: Lab) -> None:
    outcome = probe(lab, lab.target(lab.auth_squid, expect_private=True))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.PROXY_AUTHENTICATION_REQUIRED)
    assert "answered 407 without credentials" in outcome.message
    # That 407 is the privacy check's answer too: nothing gets through without credentials.
    assert outcome.private is True


def test_wrong_credentials_are_proxy_authentication_required_never_healthy(
        lab: Lab, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "wrong-" + PASSWORD
    caplog.set_level(logging.DEBUG, logger="egress_proxies")
    outcome = probe(lab, lab.target(lab.auth_squid, credentials=ProbeCredentials(USER, wrong), expect_private=True))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.PROXY_AUTHENTICATION_REQUIRED)
    assert "407 with the configured credentials" in outcome.message
    assert outcome.private is None  # not verified: the proxy is not serving us
    assert wrong not in repr(outcome) and wrong not in caplog.text


def test_squid_denying_the_target_is_unexpected_status_403(lab: Lab) -> None:
    outcome = probe(lab, lab.target(lab.deny_squid))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.UNEXPECTED_STATUS)
    assert outcome.message.startswith("UnexpectedStatus 403: ")
    assert "expected 204" in outcome.message


def test_blackhole_times_out_within_the_check_timeout(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    target = ProbeTarget(key="hole", host="127.0.0.1", port=port, http_url=lab.targets.url("/generate_204"))
    started = time.monotonic()
    outcome = probe(lab, target, check_timeout=0.5)
    elapsed = time.monotonic() - started
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.TIMEOUT)
    assert "within 0.5s" in outcome.message
    assert 0.5 <= elapsed < 1.5


def test_connect_to_a_closed_port_is_connect_failed(lab: Lab) -> None:
    target = ProbeTarget(key="p", host=lab.open_squid.address, port=lab.open_squid.port,
                         http_url=lab.targets.url("/generate_204"), connect_target=lab.targets.closed_connect_target)
    outcome = probe(lab, target)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.CONNECT_FAILED)
    # Squid answers 503 when its own connection to the target is refused: the 200 of a
    # successful CONNECT does prove the target was reached.
    assert outcome.message.startswith("ConnectFailed 503: CONNECT ")
    assert outcome.latency_seconds is not None  # the HTTP check before it passed


def test_egress_echo_reports_the_address_the_target_saw(lab: Lab) -> None:
    egress = lab.ns.add_address()
    config = f"http_access allow all\ntcp_outgoing_address {egress}\n"
    with Squid(lab.ns, config, port=3141, name="egress") as squid:
        before = len(lab.targets.requests())
        outcome = probe(lab, lab.target(squid, egress_echo_url=lab.targets.url("/echo")))
    assert outcome.serving, outcome.message
    echoed = [r for r in lab.targets.requests()[before:] if r["path"] == "/echo"]
    assert len(echoed) == 1
    assert outcome.egress_ip == echoed[0]["peer"] == egress
    assert outcome.egress_ip != squid.address  # the way out, not the way in


# A 204 is no echo (no body, so no address); a 404 is a wrong URL.
@pytest.mark.parametrize(("path", "status"), [("/generate_204", 204), ("/nowhere", 404)])
def test_an_egress_echo_that_does_not_answer_is_egress_echo_failed(lab: Lab, path: str, status: int) -> None:
    outcome = probe(lab, lab.target(lab.open_squid, egress_echo_url=lab.targets.url(path)))
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.EGRESS_ECHO_FAILED)
    assert outcome.message.startswith(f"EgressEchoFailed {status}: GET {lab.targets.url(path)} through ")
    assert outcome.latency_seconds is not None  # the HTTP check before it passed


def test_open_squid_expected_private_is_reported_not_private(lab: Lab) -> None:
    without = probe(lab, lab.target(lab.open_squid, expect_private=True))
    assert without.serving and without.private is False
    # With credentials the probe asks again without them; squid ignores what it does not require.
    with_credentials = probe(lab, lab.target(lab.open_squid, credentials=ProbeCredentials(USER, PASSWORD),
                                             expect_private=True))
    assert with_credentials.serving and with_credentials.private is False
    assert "without credentials" in with_credentials.privacy_message
    assert "answered 204, not 407 or 403" in with_credentials.privacy_message


def test_a_squid_denying_only_credential_less_get_is_still_not_private_if_connect_is_open(lab: Lab) -> None:
    password_file = write_password_file(lab.ns.root / "half-passwords", {USER: PASSWORD})
    config = (f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {password_file}\n"
              "acl authenticated proxy_auth REQUIRED\nacl CONNECT method CONNECT\n"
              "http_access allow CONNECT\nhttp_access deny !authenticated\nhttp_access allow authenticated\n")
    with Squid(lab.ns, config, port=3142, name="half-open") as squid:
        outcome = probe(lab, lab.target(squid, credentials=ProbeCredentials(USER, PASSWORD), expect_private=True))
    assert outcome.serving, outcome.message
    assert outcome.private is False
    assert f"CONNECT {lab.targets.connect_target} without credentials" in outcome.privacy_message


def test_checks_share_kept_alive_connections_through_squid(lab: Lab) -> None:
    # Squid logs each request's client port (%>p): one port per connection the probe opened.
    log = lab.ns.root / "keepalive" / "connections.log"  # in the squid's own directory, where it may write
    config = ("logformat probe %>p %rm %ru %>Hs\n"
              f"access_log stdio:{log} probe\n" + basic_auth_config(lab.ns.root / "passwords"))
    with Squid(lab.ns, config, port=3143, name="keepalive") as squid:
        outcome = probe(lab, lab.target(squid, credentials=ProbeCredentials(USER, PASSWORD), expect_private=True,
                                        egress_echo_url=lab.targets.url("/echo")))
    assert outcome.serving and outcome.private is True, outcome.message
    by_port: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        port, method, url, status = line.split()
        if method != "-":  # the harness's readiness check: connected, sent nothing
            by_port.setdefault(port, []).append(f"{method} {url.rsplit('/', 1)[-1]} {status}")
    assert sorted(by_port.values()) == sorted([
        ["GET generate_204 204", "GET echo 200", f"CONNECT {lab.targets.connect_target} 200"],
        ["GET generate_204 407", f"CONNECT {lab.targets.connect_target} 407"],
    ])


def test_a_kept_alive_connection_the_proxy_closed_is_retried_once_on_a_new_one(lab: Lab) -> None:
    """A proxy may close an idle persistent connection at any time; the next request is resent."""
    connections: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve() -> None:
            for answer in (b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 200 Connection established\r\n\r\n"):
                conn, _ = listener.accept()
                with conn:
                    connections.append(conn.recv(4096).split(b" ", 1)[0])
                    conn.sendall(answer)  # keep-alive by HTTP/1.1's default, then closed anyway

        server = threading.Thread(target=serve)
        server.start()
        target = ProbeTarget(key="flaky", host="127.0.0.1", port=listener.getsockname()[1],
                             http_url=lab.targets.url("/generate_204"), connect_target=lab.targets.connect_target)
        outcome = probe(lab, target)
        server.join(timeout=5)
    assert outcome.serving, outcome.message
    assert connections == [b"GET", b"CONNECT"]


# -- failures of the endpoint itself -----------------------------------------------------------------


def test_a_deadline_bounds_the_whole_round(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    holes = [ProbeTarget(key=f"hole-{i}", host="127.0.0.1", port=port, http_url=lab.targets.url("/generate_204"))
             for i in range(3)]
    prober = lab.prober(concurrency=1, check_timeout=10.0, deadline=0.5)
    started = time.monotonic()
    outcomes = prober.probe_all([lab.target(lab.open_squid, key="good"), *holes])
    elapsed = time.monotonic() - started
    assert elapsed < 2.0
    assert outcomes["good"].serving  # probed first, before the deadline
    for hole in holes:
        assert outcomes[hole.key].reason is ProbeReason.TIMEOUT
        assert "deadline of 0.5s" in outcomes[hole.key].message


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
                             http_url=lab.targets.url("/generate_204"))
        outcome = probe(lab, target)
        server.join(timeout=5)
    assert (outcome.serving, outcome.reason) == (False, ProbeReason.BAD_RESPONSE)
    assert "not an HTTP/1.x status line" in outcome.message


def test_an_endpoint_outside_the_allowed_networks_is_never_contacted(lab: Lab, blackhole: socket.socket) -> None:
    port = blackhole.getsockname()[1]
    prober = Prober(allowed_networks=[lab.ns.network], check_timeout=1.0)
    outcomes = prober.probe_all([
        ProbeTarget(key="loopback", host="127.0.0.1", port=port, http_url=lab.targets.url("/generate_204")),
        ProbeTarget(key="named", host="localhost", port=port, http_url=lab.targets.url("/generate_204")),
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
    targets = [lab.target(squid, key=f"{squid.name}-{i}", credentials=credentials, expect_private=True)
               for i in range(20) for squid in (lab.open_squid, lab.auth_squid, lab.deny_squid)]
    outcomes = lab.prober(concurrency=8).probe_all(targets)
    assert len(outcomes) == 60
    by_squid = {(key.rsplit("-", 1)[0], o.serving, o.reason, o.private) for key, o in outcomes.items()}
    assert by_squid == {("open", True, ProbeReason.SERVING, False), ("auth", True, ProbeReason.SERVING, True),
                        ("deny", False, ProbeReason.UNEXPECTED_STATUS, None)}


def test_probe_all_runs_from_a_plain_thread_and_refuses_to_block_a_running_event_loop(lab: Lab) -> None:
    prober = lab.prober()
    target = lab.target(lab.open_squid)
    # The sweep loop is a plain thread: probe_all runs an event loop of its own in it.
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
    ({"connect_target": "example.test"}, "connect_target must be host:port"),
    ({"connect_target": "example.test:0"}, "connect_target must be host:port"),
    ({"egress_echo_url": "ftp://example.test/"}, "egress_echo_url must be an http:// URL"),
    ({"port": 0}, "port must be 1-65535"),
    ({"expected_status": 2040}, "expected_status must be an HTTP status"),
])
def test_a_bad_target_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"key": "uid-1", "host": "10.0.0.1", "port": 3128,
                                   "http_url": "http://example.test/generate_204", **fields}
    with pytest.raises(ProbeConfigError, match=message) as raised:
        ProbeTarget(**settings)  # type: ignore[arg-type]
    assert "probe target 'uid-1'" in str(raised.value)


def test_bad_credentials_and_duplicate_keys_are_refused() -> None:
    with pytest.raises(ProbeConfigError, match=r"credentials.user .* no ':'"):
        ProbeCredentials("team:a", PASSWORD)
    with pytest.raises(ProbeConfigError, match=r"credentials\.password must not contain CR, LF"):
        ProbeCredentials(USER, "line\nbreak")
    target = ProbeTarget(key="same", host="127.0.0.1", port=1, http_url="http://example.test/")
    with pytest.raises(ProbeConfigError, match="'same' appears twice"):
        Prober(allowed_networks=["127.0.0.0/8"]).probe_all([target, target])
    with pytest.raises(ProbeConfigError, match="allowed_networks"):
        Prober(allowed_networks=["10.0.0.300/8"])
