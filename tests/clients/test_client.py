"""The Python client (clients/python, ``egress_proxies_client``) against the controller's real HTTP
server (``ControllerHTTPServer`` on 127.0.0.1, the real ``Quarantine`` on an in-memory store):
start-up errors, scopes and credentials, the policies, conditional refreshes, an outage of the
controller, and quarantine reports with 401, 403, 404 and 429 answers.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egress_proxies_client import POLICIES, DiscoveryError, NoProxyAvailable, Proxy, ProxyClient, Refresh
from support.controller.discovery_server import CRAWLER_TOKEN, OPERATOR_TOKEN, OTHER_TOKEN, PASSWORD, DiscoveryServer
from support.waiting import wait_for


@pytest.fixture
def discovery(tmp_path: Path) -> Iterator[DiscoveryServer]:
    found = DiscoveryServer(tmp_path)
    for index in range(3):
        found.add(f"eu-{index}", f"10.20.0.{index + 1}", pool="eu")
    found.add("solo", "10.20.0.9")
    found.add("theirs", "10.30.0.1", namespace="team-b")
    yield found
    found.stop()


@pytest.fixture
def clients() -> Iterator[list[ProxyClient]]:
    """Clients made by a test, closed after it."""
    made: list[ProxyClient] = []
    yield made
    for client in made:
        client.close(timeout=1)


def test_a_namespace_and_a_pool_with_their_credentials(discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    crawlers = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers")
    pool = ProxyClient(discovery.url, CRAWLER_TOKEN, pool="crawlers/eu")
    everything = ProxyClient(discovery.url, CRAWLER_TOKEN)
    clients += [crawlers, pool, everything]
    assert [p.name for p in crawlers.proxies()] == ["eu-0", "eu-1", "eu-2", "solo"]
    assert [p.name for p in pool.proxies()] == ["eu-0", "eu-1", "eu-2"]
    assert {p.namespace for p in everything.proxies()} == {"crawlers"}  # the token's namespaces only
    proxy = pool.pick()
    assert (proxy.username, proxy.password, proxy.port) == ("crawl-crawlers", PASSWORD, 3128)
    assert proxy.url == f"http://crawl-crawlers:s3cret%2Fwith%3Aodd%40chars@{proxy.host}:3128"
    assert proxy.address == f"http://{proxy.host}:3128"
    assert proxy.proxy_authorization == "Basic Y3Jhd2wtY3Jhd2xlcnM6czNjcmV0L3dpdGg6b2RkQGNoYXJz"
    assert PASSWORD not in repr(proxy) and PASSWORD not in str(proxy) and "s3cret" not in repr(proxy)
    # The operator's token sees every namespace, without credentials.
    operator = ProxyClient(discovery.url, OPERATOR_TOKEN)
    clients.append(operator)
    assert {p.namespace for p in operator.proxies()} == {"crawlers", "team-b"}
    assert all(p.username is None and p.proxy_authorization is None for p in operator.proxies())


def test_wrong_token_scope_address_or_argument_is_one_clear_error_at_start(discovery: DiscoveryServer) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"token": "not-a-token", "namespace": "crawlers"}, "the controller refused the token (401"),
        ({"token": CRAWLER_TOKEN, "namespace": "team-b"}, "the token does not cover namespace team-b (403"),
        ({"token": CRAWLER_TOKEN, "pool": "team-b/eu"}, "the token does not cover pool team-b/eu (403"),
        # Issue 41 row 5: a mistyped pool is an error, not an empty list to wait on.
        ({"token": CRAWLER_TOKEN, "pool": "crawlers/nonexistent"},
         "discovery knows no pool crawlers/nonexistent (404 no ProxyPool crawlers/nonexistent"),
    ]
    for arguments, message in cases:
        with pytest.raises(DiscoveryError, match=message.replace("(", r"\(")):
            ProxyClient(discovery.url, **arguments)
    closed = discovery.port
    discovery.stop()
    with pytest.raises(DiscoveryError, match=rf"cannot reach the egress-proxies controller at http://127.0.0.1:{closed}:"
                                             " ConnectionRefusedError"):
        ProxyClient(f"http://127.0.0.1:{closed}", CRAWLER_TOKEN)
    bad_arguments: list[tuple[dict[str, Any], str]] = [
        ({"pool": "eu"}, "pool: 'eu' is not namespace/name"),
        ({"policy": "fastest"}, "policy: 'fastest' is not one of"),
        ({"refresh_seconds": 0.1}, "refresh_seconds: 0.1 is below 0.5 s")]
    for bad, message in bad_arguments:
        with pytest.raises(ValueError, match=message):
            ProxyClient(f"http://127.0.0.1:{closed}", CRAWLER_TOKEN, **bad)
    with pytest.raises(ValueError, match="url: 'egress-proxies:8080' is not the controller's http://"):
        ProxyClient("egress-proxies:8080", CRAWLER_TOKEN)
    with pytest.raises(ValueError, match="token: contains whitespace or a control character") as caught:
        ProxyClient(f"http://127.0.0.1:{closed}", CRAWLER_TOKEN + "\n")
    assert CRAWLER_TOKEN not in str(caught.value)


def test_each_policy_hands_out_every_proxy_its_own_way(discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    assert POLICIES == ("round_robin", "random", "least_recently_used", "sticky")
    made = {policy: ProxyClient(discovery.url, CRAWLER_TOKEN, pool="crawlers/eu", policy=policy)
            for policy in POLICIES}
    clients += made.values()
    round_robin = [made["round_robin"].pick().name for _ in range(6)]
    assert sorted(round_robin[:3]) == ["eu-0", "eu-1", "eu-2"] and round_robin[3:] == round_robin[:3]
    assert set(Counter(made["random"].pick().name for _ in range(300))) == {"eu-0", "eu-1", "eu-2"}
    lru = made["least_recently_used"]
    first = [lru.pick().name for _ in range(3)]
    assert sorted(first) == ["eu-0", "eu-1", "eu-2"] and [lru.pick().name for _ in range(3)] == first
    sticky = made["sticky"]
    by_site = {site: sticky.pick(site).name for site in (f"site-{n}.example" for n in range(60))}
    assert all(sticky.pick(site).name == name for site, name in by_site.items())
    assert set(by_site.values()) == {"eu-0", "eu-1", "eu-2"}  # sites spread over every proxy
    # A proxy going away moves only its own sites; the others keep theirs.
    gone = sticky.pick("site-0.example")
    sticky.report_banned(gone, "test", quarantine=False)
    moved = {site for site, name in by_site.items() if sticky.pick(site).name != name}
    assert moved == {site for site, name in by_site.items() if name == gone.name}


def test_refreshes_are_conditional_and_see_changes(discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    seen: list[Refresh] = []
    client = ProxyClient(discovery.url, CRAWLER_TOKEN, pool="crawlers/eu", refresh_seconds=0.5,
                         on_refresh=seen.append)
    clients.append(client)
    wait_for(lambda: len(seen) >= 3, 10, "three refreshes")
    assert [r.status for r in seen[:3]] == [200, 304, 304]  # unchanged: no body sent
    discovery.add("eu-3", "10.20.0.4", pool="eu")
    wait_for(lambda: "eu-3" in {p.name for p in client.proxies()}, 10, "the new member")
    assert seen[-1].status == 200 and all(r.seconds < 5 for r in seen)
    # The raw conditional request: the answer's ETag back in If-None-Match is a 304 without a body.
    request = urllib.request.Request(f"{discovery.url}/v1/pools/crawlers/eu/proxies",
                                     headers={"Authorization": f"Bearer {CRAWLER_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        etag = answer.headers["ETag"]
    request.add_header("If-None-Match", etag)
    with pytest.raises(urllib.error.HTTPError) as unchanged:
        urllib.request.urlopen(request, timeout=5)
    unchanged.value.close()
    assert unchanged.value.code == 304 and unchanged.value.headers["ETag"] == etag


def test_an_outage_of_the_controller_keeps_the_last_good_list(
        discovery: DiscoveryServer, clients: list[ProxyClient], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="egress_proxies_client")
    client = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers", refresh_seconds=0.5)
    clients.append(client)
    before = client.proxies()
    discovery.stop()
    assert client.refresh() is False
    time.sleep(1.2)  # background refreshes fail too
    assert client.proxies() == before and client.pick() in before and client.stale_seconds >= 1.0
    warnings = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and "using the last good list of 4 proxies" in warnings[0]  # once per outage
    discovery.add("late", "10.20.0.7")
    discovery.restart()
    wait_for(lambda: "late" in {p.name for p in client.proxies()}, 10, "the list after the outage")
    assert client.stale_seconds < 2 and any("answers again" in r.getMessage() for r in caplog.records)


def test_a_banned_proxy_is_quarantined_once_and_leaves_at_once(discovery: DiscoveryServer,
                                                               clients: list[ProxyClient]) -> None:
    client = ProxyClient(discovery.url, CRAWLER_TOKEN, pool="crawlers/eu")
    clients.append(client)
    victim = client.pick()
    future = client.report_banned(victim, "HTTP 403 from example.com")
    assert victim not in client.proxies()  # at once, before the controller answered
    assert client.report_banned(victim, "again") is future  # one report per instance
    outcome = future.result(timeout=10)
    assert (outcome.quarantined, outcome.status, outcome.attempts) == (True, 200, 1)
    assert discovery.server.posts == [f"/v1/proxies/crawlers/{victim.name}/quarantine"]
    assert discovery.store.reasons(victim.key) == ["Quarantined"]
    client.refresh()
    assert victim.name not in {p.name for p in client.proxies()}  # the controller stopped listing it
    for _ in range(10):
        assert client.pick() != victim


def test_refused_reports_are_never_retried(discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    client = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers")
    clients.append(client)
    ghost = Proxy("crawlers", "ghost", "10.20.0.99", 3128)
    theirs = Proxy("team-b", "theirs", "10.30.0.1", 3128)
    outcomes = [client.report_banned(p, "banned").result(timeout=10) for p in (ghost, theirs)]
    assert [(o.status, o.attempts, o.quarantined) for o in outcomes] == [(404, 1, False), (403, 1, False)]
    assert "no Proxy crawlers/ghost" in outcomes[0].detail
    discovery.write_tokens({OTHER_TOKEN: ["team-b"]})  # the crawler token is revoked
    time.sleep(0.01)  # a new mtime for TokenScopes
    outcome = client.report_banned(client.pick(), "banned").result(timeout=10)
    assert (outcome.status, outcome.attempts) == (401, 1)
    assert len(discovery.server.posts) == 3  # one each
    assert client.refresh() is False and client.proxies()  # refused, and still the last good list


def test_429_waits_for_retry_after_and_gives_up_beyond_max_retry_after(tmp_path: Path,
                                                                        clients: list[ProxyClient]) -> None:
    # A burst of 12, then one every 5 s: the 12 reports below take far less than 5 s even on a
    # loaded machine, so the bucket is empty when the next two come.
    discovery = DiscoveryServer(tmp_path, quarantine_per_minute=12)
    try:
        discovery.add("eu-0", "10.20.0.1")
        discovery.add("eu-1", "10.20.0.2")
        # Past the client's own quarantine budget (10 a minute, half the pool): the controller's is tested.
        client = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers", max_quarantines=100,
                             max_quarantine_share=1.0)
        impatient = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers", max_retry_after=1)
        clients += [client, impatient]
        ghosts = [client.report_banned(Proxy("crawlers", f"ghost-{n}", "10.20.0.99", 3128), "banned")
                  for n in range(12)]  # 404s: well-formed, so each takes from the bucket
        assert {g.result(timeout=30).status for g in ghosts} == {404}
        (first, second) = client.proxies()
        refused = impatient.report_banned(first, "banned").result(timeout=10)
        assert (refused.status, refused.attempts, refused.quarantined) == (429, 1, False)
        assert "beyond max_retry_after 1 s" in refused.detail
        started = time.monotonic()
        outcome = client.report_banned(second, "banned").result(timeout=30)
        assert (outcome.quarantined, outcome.attempts) == (True, 2) and time.monotonic() - started >= 1.0
        assert len(discovery.server.posts) == 15
    finally:
        discovery.stop()


def test_an_empty_list_raises_instead_of_handing_out_nothing(tmp_path: Path, clients: list[ProxyClient]) -> None:
    discovery = DiscoveryServer(tmp_path)
    try:
        client = ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers", refresh_seconds=0.5)
        clients.append(client)
        with pytest.raises(NoProxyAvailable, match="lists no usable proxy for namespace crawlers"):
            client.pick()
        threading.Timer(0.3, discovery.add, ("eu-0", "10.20.0.1")).start()
        assert client.pick(wait=5).name == "eu-0"  # waits for the list to fill
        client.set_aside(client.pick(), 2.0)
        with pytest.raises(NoProxyAvailable, match="1 set aside"):
            client.pick()
        time.sleep(2.1)
        assert client.pick().name == "eu-0"
    finally:
        discovery.stop()


def test_clients_started_together_refresh_spread_out(discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    """No thundering herd: the first background refresh of each falls anywhere in the interval."""
    moments: dict[int, list[float]] = {n: [] for n in range(20)}
    for n in range(20):
        clients.append(ProxyClient(discovery.url, CRAWLER_TOKEN, namespace="crawlers", refresh_seconds=2.0,
                                   on_refresh=lambda _, n=n: moments[n].append(time.monotonic())))  # type: ignore[misc]
    wait_for(lambda: all(len(times) >= 2 for times in moments.values()), 30, "every client's first background refresh")
    # From each client's start-up read to its first refresh: uniform over the 2 s interval, so 20
    # clients spread over most of it (a loaded machine adds delay, never uniformity).
    offsets = sorted(times[1] - times[0] for times in moments.values())
    assert offsets[-1] - offsets[0] >= 0.8 and offsets[0] < 1.0, offsets


def test_a_ban_report_outlives_an_outage_and_close_flushes_for_a_bounded_time(
        discovery: DiscoveryServer, clients: list[ProxyClient]) -> None:
    """Issue 41 row 6: a report made while the controller is down is sent when it is back; one
    still undelivered when the client closes gets close's time, then counts as undelivered."""
    client = ProxyClient(discovery.url, CRAWLER_TOKEN, pool="crawlers/eu", max_quarantine_share=1.0)
    clients.append(client)
    first, second = client.pick(), client.pick()
    discovery.stop()
    future = client.report_banned(first, "HTTP 403 from example.com")
    assert first not in client.proxies()  # out at once, whatever the controller
    with pytest.raises(TimeoutError):
        future.result(timeout=1.5)  # still trying
    discovery.restart()
    outcome = future.result(timeout=30)
    assert outcome.quarantined and outcome.attempts >= 2 and discovery.store.reasons(first.key) == ["Quarantined"]
    discovery.stop()
    late = client.report_banned(second, "HTTP 403 from example.com")
    started = time.monotonic()
    client.close(timeout=1.0)
    closed_in = time.monotonic() - started
    outcome = late.result(timeout=5)
    assert outcome.undelivered and not outcome.quarantined
    assert "not delivered before the client closed" in outcome.detail
    assert 0.9 <= closed_in < 5, closed_in
