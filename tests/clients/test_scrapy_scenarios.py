"""Issue 41's scenarios as real Scrapy crawls (``scrapy runspider``) through real squids running
the fleet's own generated policy (tests/support/netns/fleet_squid.py: credentials, refused ports
and addresses, the own-error marker), with the controller's real HTTP server serving discovery and
quarantine (tests/support/controller/discovery_server.py), against a local site that bans,
rate-limits, or is asked for what the fleet refuses; a proxy with the wrong password and one that
accepts and never answers. Each scenario counts the pages the crawl kept; the figures are printed
at the end of the module.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import figures
from support.controller.discovery_server import PASSWORD, DiscoveryServer
from support.crawl import Crawl, crawl
from support.netns.banning_site import BanningSite
from support.netns.fleet_squid import FleetSquid
from support.netns.namespace import NetworkNamespace
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

USER = "crawl-crawlers"  # the user discovery's URLs carry (discovery_server.py)


@dataclass
class Lab:
    netns: NetworkNamespace
    squids: list[FleetSquid]  # the credentials discovery hands out
    wrong_password: FleetSquid  # another password than discovery's
    hanging: tuple[str, int]  # accepts connections and never answers
    kept: list[str] = field(default_factory=list)

    def discovery(self, directory: Path, *names: str) -> DiscoveryServer:
        """Discovery listing the good squids as eu-0, eu-1, ... and ``names`` of the bad ones."""
        server = DiscoveryServer(directory)
        for index, squid in enumerate(self.squids):
            server.add(f"eu-{index}", squid.address, pool="eu")
        if "wrong-password" in names:
            server.add("wrong-password", self.wrong_password.address, pool="eu")
        if "hanging" in names:
            server.add("hanging", self.hanging[0], pool="eu", port=self.hanging[1])
        return server

    def record(self, row: str, result: Crawl, pages: int) -> None:
        self.kept.append(f"{row}: {result.stats.get('item_scraped_count', 0)} of {pages} pages in "
                         f"{result.seconds:.1f} s")


def _hang(listener: socket.socket, stop: threading.Event) -> None:
    held = []
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            held.append(listener.accept()[0])
        except TimeoutError:
            continue
    for connection in held:
        connection.close()


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces); run the tests as root, as CI does", pytrace=False)
    stop = threading.Event()
    with NetworkNamespace() as ns, socket.create_server(("127.0.0.1", 0)) as listener:
        squids = [FleetSquid(ns, {USER: PASSWORD}, allowed_destinations=[ns.network], name=f"fleet-{n}")
                  for n in range(3)]
        wrong = FleetSquid(ns, {USER: "not-" + PASSWORD}, allowed_destinations=[ns.network], name="fleet-wrong")
        hanging = threading.Thread(target=_hang, args=(listener, stop), daemon=True)
        hanging.start()
        try:
            for squid in [*squids, wrong]:
                squid.start()
            found = Lab(ns, squids, wrong, listener.getsockname()[:2])
            yield found
        finally:
            stop.set()
            for squid in [*squids, wrong]:
                squid.terminate()
            for squid in [*squids, wrong]:
                squid.stop()
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    figures.show(request.config, "Issue 41 scenarios, pages kept (Scrapy through the fleet's squid policy):",
                 [*found.kept, load])


def test_the_proxys_own_refusal_is_no_ban_and_a_forged_marker_is_still_one(lab: Lab, tmp_path: Path) -> None:
    """Row 1: a start URL on a port the fleet refuses reaches no site and quarantines nothing; the
    site's own ban, sent with the fleet's marker forged, is still a ban."""
    discovery = lab.discovery(tmp_path)
    forged = {"X-Egress-Proxies-Error": "ERR_ACCESS_DENIED"}
    try:
        with BanningSite(lab.netns, pages=40, ban_after=8, ban_headers=forged) as site:
            refused = f"http://{site.address}:22/"
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu", also=refused)
            assert result.returncode == 0, result.log[-3000:]
            stats = result.stats
            assert stats["item_scraped_count"] == 40
            assert stats["egress_proxies/proxy_refused"] == 1
            assert stats["egress_proxies/proxy_errors/ERR_ACCESS_DENIED"] == 1
            assert f"{refused} refused by the fleet's policy through crawlers/eu-" in result.log
            assert "not a ban; dropped" in result.log
            banned = {r["peer"] for r in site.requests() if r["banned"]}
            assert len(banned) == 1 and stats["egress_proxies/quarantined"] == 1  # the site's ban, forged marker
            assert len(discovery.server.posts) == 1 and not any(":22" in r["path"] for r in site.requests())
            lab.record("row 1 (a refused port beside a banning site)", result, 40)
    finally:
        discovery.stop()


def test_a_wrong_ban_rule_quarantines_a_bounded_share_of_the_pool(lab: Lab, tmp_path: Path) -> None:
    """Row 1: every answer taken for a ban (a detector that says so) reports one proxy of three,
    not the pool; BAN_CODES that would match every answer are refused at start-up."""
    discovery = lab.discovery(tmp_path)
    try:
        with BanningSite(lab.netns, pages=6, ban_after=100) as site:
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu",
                           "EGRESS_PROXIES_BAN_DETECTOR=site_spider.everything_is_a_ban",
                           "EGRESS_PROXIES_EMPTY_WAIT=1", "EGRESS_PROXIES_BAN_RETRIES=2")
            assert result.returncode == 0, result.log[-3000:]
            assert len(discovery.server.posts) == 1 and result.stats["egress_proxies/quarantined"] == 1
            assert result.stats["egress_proxies/quarantine_over_budget"] == 2
            assert "not reported: the quarantine budget is spent" in result.log
            before = len(site.requests())
            codes = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_BAN_CODES=200")
            # Stopped before its first request (Scrapy 2.19 exits 1; 2.13 logs the error and exits 0).
            assert "EGRESS_PROXIES_BAN_CODES: [200] are not a site's error statuses" in codes.log
            assert len(site.requests()) == before and "item_scraped_count" not in codes.stats
    finally:
        discovery.stop()


def test_a_proxy_refusing_the_credentials_is_set_aside_and_no_page_is_lost(lab: Lab, tmp_path: Path) -> None:
    """Row 2: one proxy of four answers 407 to discovery's credentials."""
    discovery = lab.discovery(tmp_path, "wrong-password")
    try:
        with BanningSite(lab.netns, pages=60, ban_after=1000) as site:
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu")
            assert result.returncode == 0, result.log[-3000:]
            stats = result.stats
            assert stats["item_scraped_count"] == 60
            # Set aside after its first 407s: at most the requests in flight then (4 at a time), and
            # another round when its backoff ends, if the crawl is still running (a loaded machine).
            assert 1 <= stats["egress_proxies/proxy_failures"] <= 8
            assert "crawlers/wrong-password" in result.log and "407: the proxy refused the credentials" in result.log
            assert discovery.server.posts == [] and "egress_proxies/bans" not in stats
            lab.record("row 2 (one proxy of four with a wrong password)", result, 60)
    finally:
        discovery.stop()


def test_a_proxy_that_never_answers_is_set_aside_and_no_page_is_lost(lab: Lab, tmp_path: Path) -> None:
    """Row 3: one proxy accepts connections and never answers; DOWNLOAD_TIMEOUT=2."""
    discovery = lab.discovery(tmp_path, "hanging")
    try:
        with BanningSite(lab.netns, pages=40, ban_after=1000) as site:
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu",
                           "DOWNLOAD_TIMEOUT=2")
            assert result.returncode == 0, result.log[-3000:]
            stats = result.stats
            assert stats["item_scraped_count"] == 40
            # Only the requests sent to it before its first timeout (4 at a time) wait on it, and
            # another round when its backoff ends, if the crawl is still running (a loaded machine).
            assert 1 <= stats.get("egress_proxies/requests/crawlers/hanging", 0) <= 8
            assert stats["egress_proxies/proxy_failures"] == stats["egress_proxies/requests/crawlers/hanging"]
            lab.record("row 3 (one proxy of four never answers, DOWNLOAD_TIMEOUT=2)", result, 40)
    finally:
        discovery.stop()


def test_a_rate_limiting_site_cools_one_proxy_down_for_that_site_only(lab: Lab, tmp_path: Path) -> None:
    """Row 4: the site answers 429 with Retry-After: 1 to the first proxy past 10 pages."""
    discovery = lab.discovery(tmp_path)
    try:
        with BanningSite(lab.netns, pages=60, ban_after=10, ban_status=429, ban_headers={"Retry-After": "1"}) as site:
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu")
            assert result.returncode == 0, result.log[-3000:]
            stats = result.stats
            assert stats["item_scraped_count"] == 60
            limited = [r for r in site.requests() if r["banned"]]
            assert limited and stats["egress_proxies/site_cooldowns"] == len(limited)
            assert "egress_proxies/bans" not in stats and discovery.server.posts == []  # no quarantine
            assert "that proxy waits 1 s for that site" in result.log
            lab.record("row 4 (429 + Retry-After from a site, default settings)", result, 60)
    finally:
        discovery.stop()


def test_a_missing_pool_stops_the_crawl_naming_it(lab: Lab, tmp_path: Path) -> None:
    """Row 5: a mistyped pool fails the crawl after EGRESS_PROXIES_POOL_WAIT, before any request."""
    discovery = lab.discovery(tmp_path)
    try:
        with BanningSite(lab.netns, pages=5, ban_after=100) as site:
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/nonexistent",
                           "EGRESS_PROXIES_POOL_WAIT=1")
            # Stopped before its first request (Scrapy 2.19 exits 1; 2.13 logs the error and exits 0).
            assert "PoolNotFound: discovery knows no pool crawlers/nonexistent" in result.log
            assert site.requests() == [] and "item_scraped_count" not in result.stats and result.seconds < 60
            lab.kept.append(f"row 5 (pool crawlers/nonexistent): crawl failed naming the pool after "
                            f"{result.seconds:.1f} s (EGRESS_PROXIES_POOL_WAIT=1)")
    finally:
        discovery.stop()


def test_a_pool_deleted_during_the_crawl_closes_the_spider_naming_it(lab: Lab, tmp_path: Path) -> None:
    """Row 5, during a crawl: discovery stops knowing the pool; after EGRESS_PROXIES_POOL_WAIT the
    spider closes with a reason that names it, instead of draining its queue request by request."""
    discovery = lab.discovery(tmp_path)

    def delete_the_pool(site: BanningSite) -> None:
        wait_for(lambda: len(site.requests()) >= 5, 60, "the crawl's first pages")
        for index in range(len(lab.squids)):
            discovery.remove(f"eu-{index}")

    try:
        with BanningSite(lab.netns, pages=400, ban_after=1000, delay=0.1) as site:
            deleting = threading.Thread(target=delete_the_pool, args=(site,))
            deleting.start()
            result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu",
                           "EGRESS_PROXIES_REFRESH_SECONDS=0.5", "EGRESS_PROXIES_POOL_WAIT=1")
            deleting.join()
            assert result.returncode == 0, result.log[-3000:]
            assert result.stats["reason"] == "egress_proxies_pool_missing crawlers/eu"
            assert "discovery knows no pool crawlers/eu" in result.log
            assert result.stats["item_scraped_count"] < 400 and result.seconds < 60
            lab.kept.append(f"row 5 (pool deleted mid-crawl): spider closed naming it after "
                            f"{result.stats['item_scraped_count']} pages, {result.seconds:.1f} s")
    finally:
        discovery.stop()


def test_a_ban_during_a_discovery_outage_is_reported_when_it_is_back_or_counted(lab: Lab, tmp_path: Path) -> None:
    """Row 6: discovery goes down at the crawl's first page. Back while the crawl runs, the ban
    made meanwhile is delivered; down to the end, close's flush is bounded and the stats say it."""
    discovery = lab.discovery(tmp_path)

    def outage(site: BanningSite, back: bool) -> None:
        wait_for(lambda: bool(site.requests()), 60, "the crawl's first page")
        discovery.stop()
        if back:  # once the crawl went past the ban, so its report was tried while down
            wait_for(lambda: _pages_after_the_ban(site) >= 4, 60, "pages after the ban")
            discovery.restart()

    try:
        for back in (True, False):
            with BanningSite(lab.netns, pages=60, ban_after=5, delay=0.05) as site:
                down = threading.Thread(target=outage, args=(site, back))
                down.start()
                result = crawl(discovery.url, site.url("/"), tmp_path, "EGRESS_PROXIES_POOL=crawlers/eu",
                               "EGRESS_PROXIES_FLUSH_SECONDS=1")
                down.join()
                assert result.returncode == 0, result.log[-3000:]
                stats = result.stats
                assert stats["item_scraped_count"] == 60 and stats["egress_proxies/bans"] >= 1
                if back:
                    assert stats["egress_proxies/quarantined"] == 1 and len(discovery.server.posts) == 1
                    lab.record("row 6 (a ban during a discovery outage; back before the end): reported", result, 60)
                else:  # the first crawl's report is the one the controller ever got
                    assert stats["egress_proxies/quarantine_undelivered"] == 1 and len(discovery.server.posts) == 1
                    lab.record("row 6 (discovery down to the end): counted undelivered", result, 60)
    finally:
        discovery.stop()


def _pages_after_the_ban(site: BanningSite) -> int:
    requests = site.requests()
    first_ban = next((n for n, r in enumerate(requests) if r["banned"]), None)
    return 0 if first_ban is None else sum(1 for r in requests[first_ban:] if not r["banned"])


def test_dont_proxy_the_add_on_and_sticky_sessions(lab: Lab, tmp_path: Path) -> None:
    """Row 8 and item 6: meta["dont_proxy"] goes direct; the add-on alone enables the middleware;
    one session key keeps one proxy for every page."""
    discovery = lab.discovery(tmp_path)
    addon = ['DOWNLOADER_MIDDLEWARES={}',
             'ADDONS={"egress_proxies_client.scrapy_middleware.EgressProxiesAddon": 0}']
    try:
        with BanningSite(lab.netns, pages=12, ban_after=1000) as site:
            direct = crawl(discovery.url, site.url("/"), tmp_path, *addon, meta='{"dont_proxy": true}')
            assert direct.returncode == 0, direct.log[-3000:]
            assert direct.stats["item_scraped_count"] == 12 and direct.stats["egress_proxies/dont_proxy"] == 12
            assert {r["peer"] for r in site.requests()} == {lab.netns.gateway}  # the crawler's own address
            before = len(site.requests())
            sticky = crawl(discovery.url, site.url("/"), tmp_path, *addon, "EGRESS_PROXIES_POOL=crawlers/eu",
                           meta='{"egress_proxies_session": "basket-1"}')
            assert sticky.returncode == 0, sticky.log[-3000:]
            assert sticky.stats["item_scraped_count"] == 12
            peers = {r["peer"] for r in site.requests()[before:]}
            assert len(peers) == 1 and peers <= {squid.address for squid in lab.squids}
            assert sticky.stats["egress_proxies/pool/usable"] == 3
            assert "egress proxies (pool crawlers/eu): 3 listed, 3 usable, 0 banned, 0 set_aside" in sticky.log
    finally:
        discovery.stop()
