"""The spider the crawl tests run with ``scrapy runspider``: every page of
tests/support/netns/banning_site.py's tree, through EgressProxiesMiddleware.

Arguments (``-a``): ``start_url``, the site's root; ``stats_path``, where the crawl's stats are
written as JSON when it closes; ``also``, more start URLs (comma-separated); ``meta``, JSON put
into every request's meta (``{"dont_proxy": true}``, ``{"egress_proxies_session": "s1"}``).
Everything else comes from ``-s`` settings (EGRESS_PROXIES_*).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import scrapy
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.http import Response, TextResponse


def page_says_banned(request: scrapy.Request, response: Response) -> str | None:  # noqa: ARG001 -- the detector's signature
    """A ban detector (EGRESS_PROXIES_BAN_DETECTOR) for a site that bans with a 200 and a captcha page."""
    return "captcha page" if b"captcha" in response.body else None


def everything_is_a_ban(request: scrapy.Request, response: Response) -> bool:  # noqa: ARG001 -- the detector's signature
    """A wrong ban rule (every answer is a ban): what the client's quarantine budget is for."""
    return True


class SiteSpider(scrapy.Spider):
    name = "site"
    custom_settings = {  # noqa: RUF012 -- Scrapy's own class attribute
        "DOWNLOADER_MIDDLEWARES": {"egress_proxies_client.scrapy_middleware.EgressProxiesMiddleware": 740},
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "CONCURRENT_REQUESTS": 4,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_TIMEOUT": 20,
    }

    def __init__(self, start_url: str, stats_path: str, also: str = "", meta: str = "{}", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls_given = [start_url, *filter(None, also.split(","))]
        self.stats_path = Path(stats_path)
        self.request_meta: dict[str, Any] = json.loads(meta)

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.start_urls_given:
            yield scrapy.Request(url, meta=dict(self.request_meta))

    def parse(self, response: Response) -> Iterator[dict[str, Any] | scrapy.Request]:
        assert isinstance(response, TextResponse), response  # the site serves HTML
        proxy = response.meta.get("egress_proxy")
        yield {"url": response.url, "proxy": proxy.key if proxy is not None else None}
        yield from response.follow_all(css="a::attr(href)", callback=self.parse, meta=dict(self.request_meta))

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> SiteSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        # When the engine has stopped: after every spider_closed handler, the middleware's too
        # (its flush of ban reports counts in the stats).
        crawler.signals.connect(spider.write_stats, signal=signals.engine_stopped)
        return spider

    def closed(self, reason: str) -> None:
        self.close_reason = reason

    def write_stats(self) -> None:
        stats = self.crawler.stats.get_stats()
        self.stats_path.write_text(json.dumps({"reason": getattr(self, "close_reason", None), **stats}, default=str))
