"""What differs between the Scrapy lines the middleware supports (2.13 through 2.19), in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy.exceptions
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.error import ConnectError
from twisted.internet.error import TimeoutError as TwistedTimeoutError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["PROXY_FAILURES", "close_spider", "sleep"]

try:  # Scrapy 2.18+
    from scrapy.utils.asyncio import sleep
except ImportError:  # older: a Twisted delay, awaitable on either reactor
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet.task import deferLater

    async def sleep(seconds: float) -> None:
        # Imported here: importing it installs the default reactor, and the add-on is imported
        # before Scrapy installs the one its settings ask for.
        from twisted.internet import reactor

        await maybe_deferred_to_future(deferLater(reactor, seconds))  # type: ignore[arg-type,unused-ignore]

# The proxy could not be connected to or did not answer in time: Scrapy's own exceptions (2.14+:
# refused, timed out), and Twisted's, which older lines pass on as they are.
PROXY_FAILURES: tuple[type[BaseException], ...] = (
    *(getattr(scrapy.exceptions, name) for name in ("DownloadConnectionRefusedError", "DownloadTimeoutError")
      if hasattr(scrapy.exceptions, name)),
    ConnectError, TwistedTimeoutError)


def close_spider(crawler: Crawler, reason: str) -> None:
    """Close the crawl's spider with ``reason`` (2.14 made it a coroutine without the spider)."""
    engine: Any = crawler.engine
    if engine is None:
        return
    if hasattr(engine, "close_spider_async"):
        deferred_from_coro(engine.close_spider_async(reason=reason))
    else:
        engine.close_spider(crawler.spider, reason)
