"""The controller's HTTP port against a real server on 127.0.0.1: probes that follow the sweep
loop's health, the metrics page, and the discovery endpoint's bearer-token guard, its conditional
answers (ETag, 304) and its namespace route."""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import yaml

from egress_proxies import metrics
from egress_proxies.health import SweepHealth
from egress_proxies.http_server import (
    EMPTY_SHA256,
    ControllerHTTPServer,
    DiscoveryAccess,
    TokenEntry,
    TokenScopes,
    TokensFileError,
    parse_tokens,
    token_from_env,
    warn_if_no_token,
)
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.discovery import DiscoveryView

TOKEN = "s3cret-discovery-token-0123456789"
INTERVAL = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ready_proxy(name: str, ip: str, port: int, location: str | None = "beelink") -> Proxy:
    spec: dict[str, object] = {"provider": "home-kvm", "port": port}
    if location is not None:
        spec["location"] = location
    provider_id = f"kvm://hosts/beelink/domains/p-crawlers-{name}-abcdef"
    return Proxy(namespace="crawlers", name=name, uid=f"uid-{name}", spec=spec,
                 status={"phase": "Ready", "providerID": provider_id, "ip": ip, "endpoint": f"{ip}:{port}"})


READY = [ready_proxy("eu-2", "192.0.2.11", 8080, location=None), ready_proxy("eu-1", "192.0.2.10", 3128)]

def shown(proxies: list[Proxy]) -> DiscoveryView:
    """A view handing out ``proxies``, as a process that read them from the store does."""
    view = DiscoveryView()
    view.load_stored(proxies, {}, 0.0)
    return view


ServerFactory = Callable[..., tuple[ControllerHTTPServer, FakeClock, SweepHealth]]


@pytest.fixture
def serve() -> Iterator[ServerFactory]:
    """Starts servers on 127.0.0.1 (free ports) and stops them all after the test."""
    servers: list[ControllerHTTPServer] = []

    def start(token: str | None = TOKEN) -> tuple[ControllerHTTPServer, FakeClock, SweepHealth]:
        clock = FakeClock()
        health = SweepHealth(INTERVAL, clock=clock)
        server = ControllerHTTPServer(health, shown(READY), DiscoveryAccess(token))
        server.start("127.0.0.1", 0)
        servers.append(server)
        return server, clock, health

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def token_server() -> Iterator[ControllerHTTPServer]:
    """One server with the token, for the tests that only read (stopping one takes a poll interval)."""
    server = ControllerHTTPServer(SweepHealth(INTERVAL), shown(READY), DiscoveryAccess(TOKEN))
    server.start("127.0.0.1", 0, metrics=("127.0.0.1", 0))
    yield server
    server.stop()


def get(server: ControllerHTTPServer, path: str, token: str | None = None,
        authorization: str | None = None, port: int | None = None) -> tuple[int, Message, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port or server.port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read().decode()


# -- probes ----------------------------------------------------------------------------------------


def test_probes_follow_the_sweep_loop(serve: ServerFactory) -> None:
    server, clock, health = serve()
    assert get(server, "/healthz")[::2] == (200, "ok\n")
    code, _, body = get(server, "/readyz")
    assert (code, body) == (503, "no successful sweep yet\n")

    health.sweep_started()
    clock.advance(5)
    health.sweep_finished(ok=True)
    assert get(server, "/readyz")[::2] == (200, "ok\n")

    # A failed sweep after a good one: still ready while the good one is younger than 3 intervals.
    clock.advance(INTERVAL)
    health.sweep_started()
    health.sweep_finished(ok=False)
    assert get(server, "/readyz")[0] == 200
    clock.advance(2 * INTERVAL + 1)
    code, _, body = get(server, "/readyz")
    assert code == 503
    assert body.startswith("last successful sweep finished 31s ago")
    assert get(server, "/healthz")[0] == 200


def test_liveness_fails_when_no_sweep_starts_for_the_stall_window(serve: ServerFactory) -> None:
    server, clock, health = serve()
    health.sweep_started()
    health.sweep_finished(ok=True)
    clock.advance(health.stall_seconds - 1)
    assert get(server, "/healthz")[0] == 200
    clock.advance(2)
    code, _, body = get(server, "/healthz")
    assert code == 503
    assert body.startswith("no sweep started or finished for 121s")
    # Not alive means not ready either.
    assert get(server, "/readyz")[0] == 503


def test_a_long_sweep_is_alive_until_the_bound(serve: ServerFactory) -> None:
    server, clock, health = serve()
    health.sweep_started()
    clock.advance(health.stall_seconds * 3)
    assert get(server, "/healthz")[0] == 200
    clock.advance(health.max_sweep_seconds)
    code, _, body = get(server, "/healthz")
    assert code == 503
    assert "wedged" in body


def test_a_standby_is_alive_and_ready_while_its_election_loop_reports(serve: ServerFactory) -> None:
    server, clock, health = serve()
    health.set_leader(False)
    # Not ready before it has read the stored Proxies: its discovery answer would be empty.
    waiting = "standby: the stored Proxies were not read yet (discovery would be empty)\n"
    assert get(server, "/readyz")[::2] == (503, waiting)
    health.view_loaded()
    clock.advance(health.stall_seconds - 1)
    health.set_leader(False)
    clock.advance(health.stall_seconds - 1)
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/readyz")[::2] == (200, "ok\n")
    # Elected: ready on the stored view for one readiness window, then only after its own
    # first sweep, whatever an earlier term achieved.
    health.set_leader(True)
    assert get(server, "/readyz")[0] == 200
    clock.advance(3 * INTERVAL + 1)
    health.set_leader(True)
    assert get(server, "/readyz")[::2] == (503, "no successful sweep yet\n")
    health.set_leader(False)
    clock.advance(health.stall_seconds + 1)
    code, _, body = get(server, "/healthz")
    assert code == 503
    assert body.startswith("leader election silent")


def test_a_new_leader_does_not_inherit_readiness_from_an_earlier_term() -> None:
    clock = FakeClock()
    health = SweepHealth(INTERVAL, clock=clock)
    health.sweep_started()
    health.sweep_finished(ok=True)
    assert health.ready()[0]
    clock.advance(1)
    health.set_leader(False)
    clock.advance(1)
    health.set_leader(True)
    assert health.ready() == (False, "no successful sweep yet")


def test_windows_scale_with_the_interval() -> None:
    assert SweepHealth(10).stall_seconds == 120
    assert SweepHealth(60).stall_seconds == 180
    assert SweepHealth(60).max_sweep_seconds == 1800
    assert SweepHealth(600).max_sweep_seconds == 6000
    with pytest.raises(ValueError, match="positive"):
        SweepHealth(0)


# -- metrics ---------------------------------------------------------------------------------------


def test_metrics_are_served_unauthenticated_on_their_own_listener(token_server: ControllerHTTPServer) -> None:
    metrics.SWEEPS.labels(result="ok").inc()
    code, headers, body = get(token_server, "/metrics", port=token_server.metrics_port)
    assert code == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    assert "egress_proxies_sweep_duration_seconds_bucket" in body
    assert 'egress_proxies_sweeps_total{result="ok"}' in body
    assert "# TYPE egress_proxies_runner_calls_total counter" in body
    # Nothing else there: no discovery, no health, no POST.
    for path in ("/v1/proxies", "/healthz", "/"):
        assert get(token_server, path, token=TOKEN, port=token_server.metrics_port)[0] == 404


def test_the_discovery_port_has_no_metrics(token_server: ControllerHTTPServer) -> None:
    """Issue 38 row 7: pool names and sizes per namespace are not for whoever reaches discovery."""
    metrics.POOL_DESIRED.labels(namespace="team-b", pool="secret-eu-pool").set(40)
    assert "secret-eu-pool" in get(token_server, "/metrics", port=token_server.metrics_port)[2]
    for token in (None, "wrong", TOKEN):
        code, _, body = get(token_server, "/metrics", token=token)
        assert (code, body) == (404, "not found\n")


def test_a_metrics_port_already_taken_fails_the_start_and_frees_the_discovery_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        server = ControllerHTTPServer(SweepHealth(INTERVAL), shown(READY), DiscoveryAccess(TOKEN))
        with pytest.raises(OSError, match="in use"):
            server.start("127.0.0.1", 0, metrics=("127.0.0.1", taken.getsockname()[1]))
    server.start("127.0.0.1", 0)  # nothing was left bound or started
    try:
        with pytest.raises(RuntimeError, match="no metrics listener"):
            _ = server.metrics_port
    finally:
        server.stop()


def test_unknown_paths_are_404(token_server: ControllerHTTPServer) -> None:
    assert get(token_server, "/v1/proxies/extra", token=TOKEN)[0] == 404
    assert get(token_server, "/")[0] == 404


# -- discovery -------------------------------------------------------------------------------------


# What discovery says of a proxy its provider does not probe (probe: none).
UNPROBED = {"egressIP": None, "serving": "Unknown", "latencySeconds": None, "lastProbeTime": None}


def test_discovery_json_with_the_right_token(token_server: ControllerHTTPServer) -> None:
    code, headers, body = get(token_server, "/v1/proxies", token=TOKEN)
    assert code == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    assert json.loads(body) == {"proxies": [
        {"name": "eu-1", "namespace": "crawlers", "provider": "home-kvm", "location": "beelink", "ip": "192.0.2.10",
         "port": 3128, "endpoint": "192.0.2.10:3128",
         "providerID": "kvm://hosts/beelink/domains/p-crawlers-eu-1-abcdef",
         **UNPROBED},
        {"name": "eu-2", "namespace": "crawlers", "provider": "home-kvm", "location": None, "ip": "192.0.2.11",
         "port": 8080, "endpoint": "192.0.2.11:8080",
         "providerID": "kvm://hosts/beelink/domains/p-crawlers-eu-2-abcdef",
         **UNPROBED},
    ]}


def test_discovery_text_with_the_right_token(token_server: ControllerHTTPServer) -> None:
    # The scheme is case-insensitive (RFC 7235); a query string does not change the route.
    code, headers, body = get(token_server, "/v1/proxies.txt?fresh=1", authorization=f"bearer {TOKEN}")
    assert code == 200
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert body == "192.0.2.10:3128\n192.0.2.11:8080\n"


@pytest.mark.parametrize("authorization", [
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    f"Basic {TOKEN}",
    TOKEN,
    "Bearer ",
    "Bearer s\u00e9cret",  # non-ASCII: compared as bytes, so refused rather than raising
])
@pytest.mark.parametrize("path", ["/v1/proxies", "/v1/proxies.txt"])
def test_discovery_refuses_a_wrong_token(token_server: ControllerHTTPServer, path: str, authorization: str) -> None:
    code, headers, body = get(token_server, path, authorization=authorization)
    assert code == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="egress-proxies", error="invalid_token"'
    assert "192.0.2" not in body


@pytest.mark.parametrize("path", ["/v1/proxies", "/v1/proxies.txt"])
def test_discovery_refuses_a_missing_token(token_server: ControllerHTTPServer, path: str) -> None:
    code, headers, body = get(token_server, path)
    assert code == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="egress-proxies"'
    assert body == "unauthorized\n"


@pytest.mark.parametrize("token", [None, ""])
def test_discovery_is_disabled_without_a_configured_token(serve: ServerFactory, token: str | None) -> None:
    server, _, _ = serve(token=token)
    for authorization in (None, "Bearer ", f"Bearer {TOKEN}"):
        code, _, body = get(server, "/v1/proxies", authorization=authorization)
        assert code == 503
        assert body == "discovery endpoint disabled: set DISCOVERY_TOKEN to enable it\n"
    # Health does not depend on the token.
    assert get(server, "/healthz")[0] == 200


def test_token_from_env_strips_the_newline_of_an_echoed_secret() -> None:
    assert token_from_env({"DISCOVERY_TOKEN": f"{TOKEN}\n"}) == TOKEN
    assert token_from_env({"DISCOVERY_TOKEN": "  \n"}) is None
    assert token_from_env({}) is None


def test_startup_warns_loudly_without_a_token(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("egress_proxies.test")
    with caplog.at_level(logging.INFO, logger="egress_proxies.test"):
        warn_if_no_token(None, logger)
        warn_if_no_token(TOKEN, logger)
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "DISCOVERY_TOKEN is not set" in caplog.records[0].getMessage()


def test_the_token_never_reaches_the_log(serve: ServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        server, _, _ = serve()
        assert get(server, "/v1/proxies", token=TOKEN)[0] == 200
        assert get(server, "/v1/proxies.txt", token=TOKEN + "x")[0] == 401
        assert get(server, "/v1/proxies", authorization=f"Basic {TOKEN}")[0] == 401
        assert get(server, "/v1/proxies")[0] == 401
        warn_if_no_token(TOKEN, logging.getLogger("egress_proxies"))
    messages = [record.getMessage() for record in caplog.records]
    # The requests were logged (so the check below looks at real log lines) ...
    assert any("GET /v1/proxies" in message for message in messages)
    assert any("refused: wrong token" in message for message in messages)
    # ... and none of them carries the token.
    assert not [message for message in messages if TOKEN in message]
    assert TOKEN not in caplog.text


def test_a_query_string_is_never_logged(serve: ServerFactory, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        server, _, _ = serve()
        assert get(server, f"/v1/proxies.txt?token={TOKEN}")[0] == 401  # no token is read from a query
        assert get(server, f"/healthz?{TOKEN}")[0] == 200
    assert TOKEN not in caplog.text
    assert '"GET /v1/proxies.txt" 401' in caplog.text and '"GET /healthz" 200' in caplog.text


# -- scoped tokens: the file, checked at start and on every change (issue 26, rows 8 and 12) -------

TEAM = "team-token-0123456789"
TEAM_ENTRY: dict[str, Any] = {"name": "crawlers", "sha256": hashlib.sha256(TEAM.encode()).hexdigest(),
                              "namespaces": ["crawlers"]}


@pytest.mark.parametrize(("entry", "problem"), [
    ({**TEAM_ENTRY, "sha256": EMPTY_SHA256}, "entry[0] (crawlers): sha256: is the hash of an empty token"),
    ({**TEAM_ENTRY, "sha256": EMPTY_SHA256.upper()}, "entry[0] (crawlers): sha256: is the hash of an empty token"),
    ({**TEAM_ENTRY, "namespaces": "crawlers"},
     ("entry[0] (crawlers): namespaces: must be a list of namespace names, not the string 'crawlers' "
     "(write [crawlers])")),
    ({**TEAM_ENTRY, "namespaces": []}, "entry[0] (crawlers): namespaces: must be a non-empty list"),
    ({**TEAM_ENTRY, "namespaces": ["ok", "../x", 7]}, "entry[0] (crawlers): namespaces[1]: must be a DNS-1123 label"),
    ({**TEAM_ENTRY, "sha256": "abc"}, "entry[0] (crawlers): sha256: must be the 64 hex digits"),
    ({**TEAM_ENTRY, "sha256": 12}, "entry[0] (crawlers): sha256: must be the 64 hex digits"),
    ({"sha256": TEAM_ENTRY["sha256"], "namespaces": ["crawlers"]}, "entry[0]: name: must be a non-empty string"),
    ({**TEAM_ENTRY, "namespace": ["crawlers"]}, ("entry[0] (crawlers): namespace: unknown field; allowed: name, "
                                                "sha256, namespaces")),
    ("crawlers", "entry[0]: must be a mapping {name, sha256, namespaces}, not str"),
])
def test_a_bad_entry_is_named_with_its_field_and_left_out(entry: Any, problem: str) -> None:
    entries, problems = parse_tokens([entry, TEAM_ENTRY | {"name": "other", "sha256": "a" * 64}])
    assert problems[0].startswith(problem), problems
    assert list(entries) == ["a" * 64]  # only the good one


def test_good_entries_are_read_by_their_lower_case_hash() -> None:
    entries, problems = parse_tokens([{**TEAM_ENTRY, "sha256": TEAM_ENTRY["sha256"].upper(),
                                       "namespaces": ["crawlers", "team-b"]}])
    assert problems == []
    assert entries == {TEAM_ENTRY["sha256"]: TokenEntry("crawlers", frozenset({"crawlers", "team-b"}))}


def test_one_token_in_two_entries_is_refused_in_both() -> None:
    entries, problems = parse_tokens([TEAM_ENTRY, {**TEAM_ENTRY, "name": "wider", "namespaces": ["team-b"]}])
    assert entries == {}
    assert problems == [("entry[0] (crawlers), entry[1] (wider): sha256: the same token in 2 entries; give each its "
                         "own token (none of them is accepted meanwhile)")]


@pytest.mark.parametrize("document", [None, {"crawlers": "x"}, "text"])
def test_a_document_that_is_not_a_list_has_no_entries(document: Any) -> None:
    entries, problems = parse_tokens(document)
    assert entries == {} and problems[0].startswith("must be a YAML list of entries {name, sha256, namespaces}")


def tokens_file(path: Path, entries: Any, stamp: float | None = None) -> Path:
    path.write_text(yaml.safe_dump(entries) if not isinstance(entries, str) else entries)
    if stamp is not None:
        os.utime(path, (stamp, stamp))
    return path


@pytest.mark.parametrize("content", [[{**TEAM_ENTRY, "sha256": EMPTY_SHA256}], [{**TEAM_ENTRY, "namespaces": "x"}],
                                     "[unclosed", {"a": 1}])
def test_check_refuses_a_file_with_any_problem(tmp_path: Path, content: Any) -> None:
    path = tokens_file(tmp_path / "tokens.yaml", [TEAM_ENTRY, *content] if isinstance(content, list) else content)
    with pytest.raises(TokensFileError, match=str(path)):
        TokenScopes(path).check()
    with pytest.raises(TokensFileError, match="cannot be read"):
        TokenScopes(tmp_path / "missing.yaml").check()
    TokenScopes(None).check()  # no file, no scoped tokens: nothing to refuse


def test_an_empty_token_is_never_a_scoped_one(tmp_path: Path) -> None:
    scopes = TokenScopes(tokens_file(tmp_path / "tokens.yaml", [TEAM_ENTRY]))
    scopes.check()
    assert scopes.scope(TEAM.encode()) == frozenset({"crawlers"}) and scopes.name(TEAM.encode()) == "token crawlers"
    assert scopes.scope(b"") is None


def test_a_changed_file_with_a_bad_entry_refuses_that_one_and_keeps_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tokens_file(tmp_path / "tokens.yaml", [TEAM_ENTRY], stamp=1000)
    scopes = TokenScopes(path)
    scopes.check()
    other = {"name": "letters", "sha256": hashlib.sha256(b"other").hexdigest(), "namespaces": "team-b"}
    tokens_file(path, [TEAM_ENTRY, other, {**TEAM_ENTRY, "name": "empty", "sha256": EMPTY_SHA256}], stamp=2000)
    with caplog.at_level(logging.ERROR):
        assert scopes.scope(TEAM.encode()) == frozenset({"crawlers"})
        assert scopes.scope(b"other") is None  # never the set of the letters of "team-b"
        assert scopes.scope(b"") is None
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]  # once per change
    assert "entry[1] (letters): namespaces: must be a list" in error and "entry[2] (empty): sha256" in error
    assert "1 good one(s) in force" in error
    tokens_file(path, "[unclosed", stamp=3000)  # unreadable: every scoped token refused until fixed
    assert scopes.scope(TEAM.encode()) is None
    path.unlink()
    assert scopes.scope(TEAM.encode()) is None


def test_an_empty_bearer_token_gets_nothing_from_a_server_with_scoped_tokens(tmp_path: Path) -> None:
    scopes = TokenScopes(tokens_file(tmp_path / "tokens.yaml", [TEAM_ENTRY]))
    scopes.check()
    access = DiscoveryAccess(None, scopes, lambda proxy: f"http://user:secret@{proxy.status['endpoint']}")
    server = ControllerHTTPServer(SweepHealth(INTERVAL), shown(READY), access)
    server.start("127.0.0.1", 0)
    try:
        assert get(server, "/v1/proxies.txt", token=TEAM)[0] == 200
        for authorization in ("Bearer ", "Bearer", "Bearer \t ", "bearer"):
            code, _, body = get(server, "/v1/proxies.txt", authorization=authorization)
            assert (code, "secret" in body) == (401, False), authorization
    finally:
        server.stop()


# -- slow and many clients -------------------------------------------------------------------------


def slow_drip(port: int, stop: threading.Event, cut_off: list[float], started: float) -> None:
    """A client that sends its request one byte a second (and records when it was cut off)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        for byte in request:
            if stop.is_set():
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                cut_off.append(time.monotonic() - started)
                return
            conn.settimeout(1.0)
            try:
                if conn.recv(1024) == b"":
                    cut_off.append(time.monotonic() - started)
                    return
            except TimeoutError:
                continue
            except OSError:
                cut_off.append(time.monotonic() - started)
                return


def test_slow_drip_clients_hold_no_thread_and_are_cut_off(serve: ServerFactory) -> None:
    server, _, _ = serve()
    server.request_timeout = 3.0
    threads_before = threading.active_count()
    stop = threading.Event()
    cut_off: list[float] = []
    started = time.monotonic()
    clients = [threading.Thread(target=slow_drip, args=(server.port, stop, cut_off, started), daemon=True)
               for _ in range(50)]
    for client in clients:
        client.start()
    try:
        time.sleep(1.5)  # all 50 connected and dripping
        # The probes answer at once all the same ...
        for _ in range(3):
            asked = time.monotonic()
            assert get(server, "/healthz")[0] == 200
            assert time.monotonic() - asked < 1.0
        # ... and the server did not start a thread per slow client (the 50 clients are this
        # test's own threads; the server may add its few workers).
        server_threads = threading.active_count() - threads_before - 50
        assert server_threads <= 5, server_threads
        for client in clients:
            client.join(timeout=max(0.0, started + 8 - time.monotonic()))
        # Every slow client was disconnected within the bound (3 s, plus a drip's second).
        assert len(cut_off) == 50
        assert max(cut_off) < 3.0 + 2.0, max(cut_off)
    finally:
        stop.set()


def test_connections_beyond_the_bound_are_closed_at_once(serve: ServerFactory) -> None:
    server, _, _ = serve()
    server.max_connections = 5
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    try:
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as extra:
            asked = time.monotonic()
            extra.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            try:
                answer = extra.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert answer == b"" and time.monotonic() - asked < 1.0
    finally:
        for conn in held:
            conn.close()
    time.sleep(0.3)
    assert get(server, "/healthz")[0] == 200  # a slot is free again as soon as a client leaves


def test_a_dead_loop_thread_fails_liveness_at_once(serve: ServerFactory) -> None:
    server, _, health = serve()
    health.sweep_started()
    health.thread_died("sweep", "KeyError: 'spec'")
    assert get(server, "/healthz")[::2] == (503, "the sweep thread died: KeyError: 'spec'\n")
    assert get(server, "/readyz")[0] == 503


def test_a_non_get_request_is_refused(serve: ServerFactory) -> None:
    server, _, _ = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        assert conn.recv(1024).startswith(b"HTTP/1.1 501 ")


# -- conditional discovery and the namespace route (issue 31) --------------------------------------


def raw_get(server: ControllerHTTPServer, path: str, token: str = TOKEN,
            if_none_match: str | None = None) -> tuple[int, Message, bytes]:
    """One GET with http.client, which hands back a 304 as it came (urllib raises on it)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def test_discovery_answers_304_while_the_list_is_unchanged() -> None:
    view = shown(READY)
    server = ControllerHTTPServer(SweepHealth(INTERVAL), view, DiscoveryAccess(TOKEN))
    server.start("127.0.0.1", 0)
    try:
        code, headers, body = raw_get(server, "/v1/proxies")
        etag = headers["ETag"]
        assert code == 200 and etag.startswith('"') and etag.endswith('"') and body
        assert raw_get(server, "/v1/proxies")[1]["ETag"] == etag  # the same list, the same tag
        for if_none_match in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            code, headers, body = raw_get(server, "/v1/proxies", if_none_match=if_none_match)
            assert (code, body, headers["ETag"]) == (304, b"", etag), if_none_match
            assert headers["Content-Length"] is None and headers["Cache-Control"] == "no-store"
        assert raw_get(server, "/v1/proxies", if_none_match='"other"')[0] == 200
        assert raw_get(server, "/v1/proxies.txt")[1]["ETag"] != etag  # another representation
        # A wrong token learns nothing, not even that the list is unchanged.
        assert raw_get(server, "/v1/proxies", token="wrong", if_none_match=etag)[0] == 401
        view.load_stored(READY[:1], {}, 0.0)
        code, headers, body = raw_get(server, "/v1/proxies", if_none_match=etag)
        assert code == 200 and headers["ETag"] != etag and len(json.loads(body)["proxies"]) == 1
    finally:
        server.stop()


def test_one_namespace_is_listed_for_a_token_that_covers_it(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {{name: others, namespaces: [others], sha256: {hashlib.sha256(b'others').hexdigest()}}}\n")
    server = ControllerHTTPServer(SweepHealth(INTERVAL), shown(READY), DiscoveryAccess(TOKEN, TokenScopes(tokens)))
    server.start("127.0.0.1", 0)
    try:
        code, _, body = raw_get(server, "/v1/namespaces/crawlers/proxies")
        assert code == 200 and [p["name"] for p in json.loads(body)["proxies"]] == ["eu-1", "eu-2"]
        assert raw_get(server, "/v1/namespaces/others/proxies.txt") == (200, ANY, b"")
        code, _, body = raw_get(server, "/v1/namespaces/crawlers/proxies", token="others")
        assert (code, body) == (403, b"this token does not cover namespace crawlers\n")
        assert raw_get(server, "/v1/namespaces/others/proxies", token="others")[0] == 200
        assert raw_get(server, "/v1/namespaces/crawlers/proxies", token="wrong")[0] == 401
    finally:
        server.stop()
