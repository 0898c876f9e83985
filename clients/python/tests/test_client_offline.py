"""ProxyClient against a stand-in discovery on 127.0.0.1 (conftest.py): per-site cool-downs,
backoff, the quarantine budget, the missing pool, and the asyncio API."""

from __future__ import annotations

import asyncio
import time

import pytest

from egress_proxies_client import NoProxyAvailable, PoolNotFound, ProxyClient

from .conftest import TOKEN, Discovery


def test_a_cool_down_keeps_one_proxy_from_one_site_only(discovery: Discovery) -> None:
    with ProxyClient(discovery.url, TOKEN, namespace="crawlers") as client:
        limited = client.pick("shop.example")
        client.cool_down(limited, "shop.example", 30)
        assert all(client.pick("shop.example") != limited for _ in range(12))
        assert limited in {client.pick("news.example") for _ in range(12)}  # every other site keeps it
        assert not client.usable(limited, "shop.example") and client.usable(limited, "news.example")
        for proxy in client.proxies():
            client.cool_down(proxy, "shop.example", 30)
        with pytest.raises(NoProxyAvailable, match=r"the rest asked by shop\.example to wait"):
            client.pick("shop.example")


def test_a_sticky_site_moves_while_its_proxy_cools_down(discovery: Discovery) -> None:
    with ProxyClient(discovery.url, TOKEN, namespace="crawlers", policy="sticky") as client:
        home = client.pick("shop.example")
        client.cool_down(home, "shop.example", 0.3)
        assert client.pick("shop.example") != home
        time.sleep(0.35)
        assert client.pick("shop.example") == home  # back once the site's wait is over


def test_failures_back_off_and_a_success_starts_over(discovery: Discovery) -> None:
    with ProxyClient(discovery.url, TOKEN, namespace="crawlers", failure_cooldown=2,
                     max_failure_cooldown=5) as client:
        sick = client.pick()
        assert [client.report_failure(sick) for _ in range(3)] == [2, 4, 5]
        assert sick not in client.proxies() and client.state()["set_aside"] == 1
        client.report_success(sick)
        assert client.report_failure(sick) == 2


def test_bans_past_the_budget_are_set_aside_not_reported(discovery: Discovery) -> None:
    with ProxyClient(discovery.url, TOKEN, namespace="crawlers", max_quarantines=5,
                     max_quarantine_share=0.5) as client:
        first, second = client.pick(), client.pick()
        assert client.report_banned(first, "403").result(timeout=10).quarantined
        over = client.report_banned(second, "403").result(timeout=1)
        assert over.over_budget and not over.quarantined and "max_quarantine_share 0.5" in over.detail
        assert len(discovery.posts) == 1  # the first only
        assert second not in client.proxies() and client.state() == {"listed": 3, "usable": 1, "banned": 1,
                                                                   "set_aside": 1}


def test_a_missing_pool_is_waited_for_then_an_error_naming_it(discovery: Discovery) -> None:
    discovery.status = 404
    started = time.monotonic()
    with pytest.raises(PoolNotFound, match=r"^discovery knows no pool crawlers/eu \(404 no ProxyPool crawlers/eu\)"):
        ProxyClient(discovery.url, TOKEN, pool="crawlers/eu", pool_wait=1.0)
    assert 1.0 <= time.monotonic() - started < 5


def test_apick_waits_without_blocking_the_loop(discovery: Discovery) -> None:
    proxies = list(discovery.proxies)
    discovery.proxies.clear()

    async def run() -> tuple[int, str]:
        client = await asyncio.to_thread(ProxyClient, discovery.url, TOKEN, namespace="crawlers",
                                         refresh_seconds=0.5)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        asyncio.get_running_loop().call_later(0.4, discovery.proxies.extend, proxies)
        try:
            proxy = await client.apick(wait=10)
        finally:
            ticker.cancel()
            await client.aclose(timeout=1)
        return ticks, proxy.name

    ticks, name = asyncio.run(run())
    assert name.startswith("eu-") and ticks >= 20
