"""EgressProxiesMiddleware in real Scrapy crawls (``scrapy runspider``) through real squids, with the
controller's real HTTP server serving discovery and quarantine (tests/support/controller/discovery_server.py):
start-up errors stop the crawl before any request, an empty list never sends a request without a
proxy unless EGRESS_PROXIES_ALLOW_DIRECT says so, a crawler's own ban detector and a proxy that
refuses connections. The whole path with the controller managing the proxies is
test_scrapy_crawl.py.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.controller.discovery_server import CRAWLER_TOKEN, PASSWORD, DiscoveryServer
from support.crawl import Crawl
from support.crawl import crawl as run_crawl
from support.netns.banning_site import BanningSite
from support.netns.namespace import NetworkNamespace
from support.netns.squid import Squid, basic_auth_config, write_password_file

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent
HERE = Path(__file__).parent


@dataclass
class Squids:
    netns: NetworkNamespace
    addresses: list[str]


@pytest.fixture(scope="module")
def squids() -> Iterator[Squids]:
    """Two squids requiring the credentials discovery hands out, each fetching from its own address."""
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces); run the tests as root, as CI does", pytrace=False)
    with NetworkNamespace() as ns:
        passwords = write_password_file(ns.root / "passwd", {"crawl-crawlers": PASSWORD})
        running = []
        try:
            for index in range(2):
                address = ns.add_address()
                squid = Squid(ns, basic_auth_config(passwords) + f"tcp_outgoing_address {address}\n",
                              address=address, name=f"squid-{index}")
                squid.start()
                running.append(squid)
            yield Squids(ns, [squid.address for squid in running])
        finally:
            for squid in running:
                squid.terminate()
            for squid in running:
                squid.stop()


def crawl(discovery: DiscoveryServer, site: BanningSite, directory: Path, *settings: str) -> Crawl:
    return run_crawl(discovery.url, site.url("/"), directory, *settings)


def test_start_up_errors_stop_the_crawl_before_any_request(squids: Squids, tmp_path: Path) -> None:
    discovery = DiscoveryServer(tmp_path)
    discovery.add("eu-0", squids.addresses[0])
    try:
        with BanningSite(squids.netns, pages=5, ban_after=100) as site:
            for setting, message in [
                    (f"EGRESS_PROXIES_TOKEN={CRAWLER_TOKEN}-typo", "DiscoveryError: the controller refused the token"),
                    ("EGRESS_PROXIES_NAMESPACE=team-b", "DiscoveryError: the token does not cover namespace team-b"),
                    ("EGRESS_PROXIES_URL=", "EgressProxiesConfigError: EGRESS_PROXIES_URL is not set"),
                    ("EGRESS_PROXIES_POOL=eu", "EgressProxiesConfigError: EGRESS_PROXIES_POOL: 'eu' is not namespace/"),
            ]:
                result = crawl(discovery, site, tmp_path, setting)
                # Scrapy 2.19 exits 1; 2.13 logs the error and exits 0: no request either way (below).
                assert message in result.log and "item_scraped_count" not in result.stats, (setting,
                                                                                           result.log[-2000:])
            assert site.requests() == []
    finally:
        discovery.stop()


def test_an_empty_list_never_sends_a_request_without_a_proxy_unless_allowed(squids: Squids, tmp_path: Path) -> None:
    discovery = DiscoveryServer(tmp_path)  # Ready proxies: none
    try:
        with BanningSite(squids.netns, pages=7, ban_after=100) as site:
            waited = crawl(discovery, site, tmp_path, "EGRESS_PROXIES_EMPTY_WAIT=1")
            assert waited.returncode == 0, waited.log[-2000:]
            assert waited.stats["egress_proxies/no_proxy"] == 1 and "item_scraped_count" not in waited.stats
            assert (f"no proxy to hand out for {site.address} (namespace crawlers); requests wait up to 1 s"
                    in waited.log)
            assert site.requests() == []
            direct = crawl(discovery, site, tmp_path, "EGRESS_PROXIES_ALLOW_DIRECT=True")
            assert direct.stats["item_scraped_count"] == 7 and direct.stats["egress_proxies/direct"] == 7
            assert {r["peer"] for r in site.requests()} == {squids.netns.gateway}  # the crawler's own address
    finally:
        discovery.stop()


def test_a_ban_detector_a_dead_proxy_and_the_crawl_still_gets_every_page(squids: Squids, tmp_path: Path) -> None:
    discovery = DiscoveryServer(tmp_path)
    dead = squids.netns.add_address()  # nothing listens there: connections are refused
    for name, address in [("eu-0", squids.addresses[0]), ("eu-1", squids.addresses[1]), ("dead", dead)]:
        discovery.add(name, address)
    try:
        # The site bans with a 200 and a captcha page: only the crawler's detector can tell.
        with BanningSite(squids.netns, pages=80, ban_after=10, ban_status=200) as site:
            result = crawl(discovery, site, tmp_path, "EGRESS_PROXIES_BAN_DETECTOR=site_spider.page_says_banned",
                           "EGRESS_PROXIES_FAILURE_COOLDOWN=300")
            assert result.returncode == 0, result.log[-2000:]
            stats = result.stats
            assert stats["item_scraped_count"] == 80  # every page, none of them the captcha
            requests = site.requests()
            banned = {r["peer"] for r in requests if r["banned"]}
            assert len(banned) == 1 and banned <= set(squids.addresses)
            assert stats["egress_proxies/bans"] == sum(r["banned"] for r in requests)
            assert stats["egress_proxies/quarantined"] == 1
            assert "ban through crawlers/eu-" in result.log and ": captcha page" in result.log
            victim = "eu-0" if banned == {squids.addresses[0]} else "eu-1"
            assert discovery.store.reasons(f"crawlers/{victim}") == ["Quarantined"]
            assert discovery.server.posts == [f"/v1/proxies/crawlers/{victim}/quarantine"]
            assert stats["egress_proxies/proxy_failures"] >= 1 and "requests/crawlers/dead" in json.dumps(stats)
            assert Counter(r["peer"] for r in requests if not r["banned"]).keys() <= set(squids.addresses)
    finally:
        discovery.stop()


def test_the_crawler_docs_show_valid_python_and_every_setting() -> None:
    """docs/crawlers.md: its code (the example spider included) parses, and its settings table
    names exactly the settings the middleware reads."""
    text = (HERE.parents[1] / "docs" / "crawlers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    for block in blocks:
        ast.parse(block)
    spider = next(block for block in blocks if "class BooksSpider" in block)
    source = (HERE.parents[1] / "clients" / "python" / "egress_proxies_client" / "scrapy_middleware.py").read_text()
    read = set(re.findall(r'"(EGRESS_PROXIES_[A-Z_]+)"', source))
    table = set(re.findall(r"^\| `(EGRESS_PROXIES_[A-Z_]+)` \|", text, re.M))
    assert table == read and set(re.findall(r'"(EGRESS_PROXIES_[A-Z_]+)"', spider)) <= read
