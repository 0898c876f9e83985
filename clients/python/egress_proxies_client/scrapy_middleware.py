"""A Scrapy downloader middleware: every request through a proxy from egress-proxies discovery.

Enable it before Scrapy's ``HttpProxyMiddleware`` (750), in settings.py::

    DOWNLOADER_MIDDLEWARES = {"egress_proxies_client.scrapy_middleware.EgressProxiesMiddleware": 740}
    EGRESS_PROXIES_URL = "http://egress-proxies.egress-proxies.svc:8080"
    EGRESS_PROXIES_TOKEN = os.environ["EGRESS_PROXIES_TOKEN"]
    EGRESS_PROXIES_POOL = "crawlers/eu"          # or EGRESS_PROXIES_NAMESPACE = "crawlers"

What it does per request: picks a proxy (``EGRESS_PROXIES_POLICY``, the site is the request's host),
sets ``request.meta["proxy"]`` to its address and the ``Proxy-Authorization`` header to its
credentials. A response that is a ban (its status in ``EGRESS_PROXIES_BAN_CODES``, or
``EGRESS_PROXIES_BAN_DETECTOR`` says so) is reported: the proxy is handed out no more, the
controller is asked to quarantine it, and the request is sent again through another proxy, up to
``EGRESS_PROXIES_BAN_RETRIES`` times. A request whose ``meta["proxy"]`` someone else set (to a
proxy, or to None: no proxy, as Scrapy reads it) is left alone. With no proxy listed, a request
waits up to ``EGRESS_PROXIES_EMPTY_WAIT`` seconds for one and is then dropped (``IgnoreRequest``);
it is sent without a proxy only with ``EGRESS_PROXIES_ALLOW_DIRECT = True``. Everything is counted
in the crawl's stats under ``egress_proxies/``. docs/crawlers.md has every setting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import DownloadConnectionRefusedError, IgnoreRequest, NotConfigured
from scrapy.utils.asyncio import sleep
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from twisted.internet.error import ConnectError

from egress_proxies_client.client import EgressProxiesError, NoProxyAvailable, ProxyClient, QuarantineOutcome
from egress_proxies_client.policies import POLICIES
from egress_proxies_client.proxy import Proxy

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

log = logging.getLogger("egress_proxies_client.scrapy")

# request.meta keys of this middleware.
PROXY_META = "egress_proxy"  # the Proxy this request went through
BAN_RETRIES_META = "egress_proxies_ban_retries"
BanDetector = Callable[[Request, "Response"], object]
# The proxy could not be connected to: refused (Scrapy's own exception since 2.14), or another of
# Twisted's connect errors (no route, timed out), which Scrapy passes on as they are.
CONNECT_FAILURES = (DownloadConnectionRefusedError, ConnectError)


class EgressProxiesConfigError(EgressProxiesError):
    """A setting is missing or wrong; the message names it and the fix."""


@dataclass(frozen=True)
class MiddlewareSettings:
    url: str
    token: str
    namespace: str | None
    pool: str | None
    policy: str
    refresh_seconds: float
    ban_codes: frozenset[int]
    ban_detector: BanDetector | None
    ban_retries: int
    quarantine: bool
    allow_direct: bool
    empty_wait: float
    failure_cooldown: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> MiddlewareSettings:
        url, token = settings.get("EGRESS_PROXIES_URL"), settings.get("EGRESS_PROXIES_TOKEN")
        if not url:
            raise EgressProxiesConfigError("EGRESS_PROXIES_URL is not set: the controller's address, e.g. "
                                           "http://egress-proxies.egress-proxies.svc:8080")
        if not token:
            raise EgressProxiesConfigError("EGRESS_PROXIES_TOKEN is not set: your team's discovery token")
        policy = settings.get("EGRESS_PROXIES_POLICY", "round_robin")
        if policy not in POLICIES:
            raise EgressProxiesConfigError(f"EGRESS_PROXIES_POLICY: {policy!r} is not one of {', '.join(POLICIES)}")
        detector = settings.get("EGRESS_PROXIES_BAN_DETECTOR")
        if isinstance(detector, str):
            detector = load_object(detector)
        if detector is not None and not callable(detector):
            raise EgressProxiesConfigError("EGRESS_PROXIES_BAN_DETECTOR: must be a callable (request, response) -> "
                                           "bool or reason, or its import path")
        try:
            codes = frozenset(int(code) for code in settings.getlist("EGRESS_PROXIES_BAN_CODES", [403]))
        except ValueError:
            raise EgressProxiesConfigError("EGRESS_PROXIES_BAN_CODES: must be HTTP status codes, e.g. [403, 429]"
                                           ) from None
        return cls(url=str(url), token=str(token), namespace=settings.get("EGRESS_PROXIES_NAMESPACE"),
                   pool=settings.get("EGRESS_PROXIES_POOL"), policy=str(policy),
                   refresh_seconds=settings.getfloat("EGRESS_PROXIES_REFRESH_SECONDS", 5.0),
                   ban_codes=codes, ban_detector=detector,
                   ban_retries=settings.getint("EGRESS_PROXIES_BAN_RETRIES", 3),
                   quarantine=settings.getbool("EGRESS_PROXIES_QUARANTINE", True),
                   allow_direct=settings.getbool("EGRESS_PROXIES_ALLOW_DIRECT", False),
                   empty_wait=settings.getfloat("EGRESS_PROXIES_EMPTY_WAIT", 60.0),
                   failure_cooldown=settings.getfloat("EGRESS_PROXIES_FAILURE_COOLDOWN", 30.0))

    def client(self) -> ProxyClient:
        try:
            return ProxyClient(self.url, self.token, namespace=self.namespace, pool=self.pool, policy=self.policy,
                               refresh_seconds=self.refresh_seconds)
        except ValueError as error:  # the client names its argument first; say which setting that is
            argument, _, problem = str(error).partition(": ")
            raise EgressProxiesConfigError(f"EGRESS_PROXIES_{argument.upper()}: {problem}") from None


class EgressProxiesMiddleware:
    def __init__(self, crawler: Crawler, settings: MiddlewareSettings, client: ProxyClient) -> None:
        self.crawler = crawler
        self.settings = settings
        self.client = client
        # Quarantine outcomes arrive on the client's thread; stats are written on Scrapy's.
        self._outcomes: list[QuarantineOutcome] = []
        self._outcomes_lock = threading.Lock()
        self._reported: set[tuple[str, str, str]] = set()
        self._empty_since: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> EgressProxiesMiddleware:
        if not crawler.settings.getbool("EGRESS_PROXIES_ENABLED", True):
            raise NotConfigured("EGRESS_PROXIES_ENABLED is False")
        settings = MiddlewareSettings.from_settings(crawler.settings)
        middleware = cls(crawler, settings, settings.client())
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        return middleware

    def spider_closed(self) -> None:
        self.client.close()
        self._record_outcomes()

    # -- Scrapy's hooks (no spider argument: Scrapy 2.19 passes none to methods without it) -------

    async def process_request(self, request: Request) -> None:
        self._record_outcomes()
        if "proxy" in request.meta and PROXY_META not in request.meta:
            return  # a proxy someone else chose, or None: this request goes without one on purpose
        proxy = self._pick(request) or await self._wait_for_proxy(request)
        if proxy is None:  # EGRESS_PROXIES_ALLOW_DIRECT
            self._unassign(request)
            self._inc("egress_proxies/direct")
            return
        request.meta["proxy"] = proxy.address
        request.meta[PROXY_META] = proxy
        # Scrapy's HttpProxyMiddleware keeps the header only for the proxy it last saw it with.
        request.meta.pop("_auth_proxy", None)
        authorization = proxy.proxy_authorization
        if authorization is not None:
            request.headers[b"Proxy-Authorization"] = authorization.encode("latin-1")
        else:
            request.headers.pop(b"Proxy-Authorization", None)
        self._inc("egress_proxies/requests")
        self._inc(f"egress_proxies/requests/{proxy.key}")

    def process_response(self, request: Request, response: Response) -> Request | Response:
        proxy = request.meta.get(PROXY_META)
        if not isinstance(proxy, Proxy):
            return response
        reason = self._ban_reason(request, response)
        if reason is None:
            return response
        self._inc("egress_proxies/bans")
        future = self.client.report_banned(proxy, reason, quarantine=self.settings.quarantine)
        if proxy.instance not in self._reported:  # a second ban of one instance shares the first report
            self._reported.add(proxy.instance)
            future.add_done_callback(self._outcome_arrived)
        log.info("ban through %s: %s", proxy, reason)
        return self._again(request, response, reason)

    def process_exception(self, request: Request, exception: Exception) -> None:
        """A proxy that cannot be connected to is set aside for ``EGRESS_PROXIES_FAILURE_COOLDOWN``
        seconds (the controller's probe decides whether it is dead); Scrapy's RetryMiddleware
        sends the request again, and ``process_request`` picks another proxy for it."""
        proxy = request.meta.get(PROXY_META)
        if isinstance(proxy, Proxy) and isinstance(exception, CONNECT_FAILURES):
            self.client.set_aside(proxy, self.settings.failure_cooldown)
            self._inc("egress_proxies/proxy_connect_errors")
            log.warning("%s: %s; not handed out for %.0f s", proxy, type(exception).__name__,
                        self.settings.failure_cooldown)

    # -- helpers ---------------------------------------------------------------------------------

    def _pick(self, request: Request) -> Proxy | None:
        try:
            proxy = self.client.pick(urlparse_cached(request).hostname)
        except NoProxyAvailable:
            return None
        if self._empty_since is not None:
            log.warning("egress proxies: a proxy is available again after %.0f s", time.monotonic() - self._empty_since)
            self._empty_since = None
        return proxy

    async def _wait_for_proxy(self, request: Request) -> Proxy | None:
        """None (go direct) only with EGRESS_PROXIES_ALLOW_DIRECT; else a proxy within
        EGRESS_PROXIES_EMPTY_WAIT seconds, or IgnoreRequest."""
        if self.settings.allow_direct:
            return None
        if self._empty_since is None:
            self._empty_since = time.monotonic()
            log.warning("egress proxies: no proxy to hand out (%s); requests wait up to %.0f s for one",
                        self.client.scope, self.settings.empty_wait)
        deadline = time.monotonic() + self.settings.empty_wait
        while time.monotonic() < deadline:
            await sleep(0.25)
            proxy = self._pick(request)
            if proxy is not None:
                return proxy
        self._inc("egress_proxies/no_proxy")
        raise IgnoreRequest(f"no proxy from egress-proxies discovery for {self.settings.empty_wait:.0f} s; "
                            "EGRESS_PROXIES_ALLOW_DIRECT = True would send it without one")

    def _ban_reason(self, request: Request, response: Response) -> str | None:
        host = urlparse_cached(request).hostname or "?"
        if response.status in self.settings.ban_codes:
            return f"HTTP {response.status} from {host}"
        if self.settings.ban_detector is not None:
            verdict = self.settings.ban_detector(request, response)
            if verdict:
                return verdict if isinstance(verdict, str) else f"ban detected on {host} (HTTP {response.status})"
        return None

    def _again(self, request: Request, response: Response, reason: str) -> Request | Response:
        """The request once more through another proxy, or the ban response when retries are spent."""
        retries = int(request.meta.get(BAN_RETRIES_META, 0))
        if retries >= self.settings.ban_retries:
            self._inc("egress_proxies/ban_gave_up")
            log.warning("gave up on %s after %d bans (%s)", request.url, retries + 1, reason)
            return response
        again = request.replace(dont_filter=True)
        self._unassign(again)
        again.meta[BAN_RETRIES_META] = retries + 1
        self._inc("egress_proxies/ban_retries")
        return again

    @staticmethod
    def _unassign(request: Request) -> None:
        if request.meta.pop(PROXY_META, None) is not None:
            request.meta.pop("proxy", None)
            request.meta.pop("_auth_proxy", None)
            request.headers.pop(b"Proxy-Authorization", None)

    def _outcome_arrived(self, future: Future[QuarantineOutcome]) -> None:
        with self._outcomes_lock:
            self._outcomes.append(future.result())

    def _record_outcomes(self) -> None:
        with self._outcomes_lock:
            outcomes, self._outcomes = self._outcomes, []
        for outcome in outcomes:
            if outcome.quarantined:
                self._inc("egress_proxies/quarantined")
            elif outcome.status is not None or outcome.attempts:
                self._inc(f"egress_proxies/quarantine_failed/{outcome.status or 'unreachable'}")

    def _inc(self, key: str) -> None:
        stats: Any = self.crawler.stats
        if stats is not None:
            stats.inc_value(key)
