"""A Scrapy downloader middleware: every request through a proxy from egress-proxies discovery.

Enable it with the add-on (Scrapy's ``ADDONS``), or by hand before Scrapy's ``HttpProxyMiddleware``
(750), in settings.py::

    ADDONS = {"egress_proxies_client.scrapy_middleware.EgressProxiesAddon": 0}
    # or: DOWNLOADER_MIDDLEWARES = {"egress_proxies_client.scrapy_middleware.EgressProxiesMiddleware": 740}
    EGRESS_PROXIES_URL = "http://egress-proxies.egress-proxies.svc:8080"
    EGRESS_PROXIES_TOKEN = os.environ["EGRESS_PROXIES_TOKEN"]
    EGRESS_PROXIES_POOL = "crawlers/eu"          # or EGRESS_PROXIES_NAMESPACE = "crawlers"

Per request: picks a proxy (``EGRESS_PROXIES_POLICY``, the site is the request's host; the same
proxy for every request with the same ``meta["egress_proxies_session"]``), sets
``request.meta["proxy"]`` and the ``Proxy-Authorization`` header. Per answer:

- the proxy's own error (its ``X-Egress-Proxies-Error`` header, which the fleet adds for credential
  holders only) is never a ban: a refusal by the fleet's policy drops the request with a log line
  saying so, any other (the site unreachable from the proxy) goes on as it is;
- a ban (``EGRESS_PROXIES_BAN_DETECTOR`` says so, or it has no opinion and the status is in
  ``EGRESS_PROXIES_BAN_CODES``) is reported to the controller, which quarantines the proxy for
  every crawler, and the request goes again through another proxy (``EGRESS_PROXIES_BAN_RETRIES``);
  the client bounds how many it reports (``EGRESS_PROXIES_MAX_QUARANTINES`` ...);
- a status in ``EGRESS_PROXIES_COOLDOWN_CODES`` (429, 503) keeps that proxy away from that site for
  ``Retry-After`` (at most ``EGRESS_PROXIES_MAX_SITE_COOLDOWN``) and the request goes again through
  another proxy;
- a proxy that cannot be connected to, times out or refuses the credentials (407) is set aside
  with backoff (credentials read again on a 407) and the request goes again through another proxy.

Requests with ``meta["dont_proxy"]`` or a ``meta["proxy"]`` someone else set are left alone. With no
proxy, a request waits up to ``EGRESS_PROXIES_EMPTY_WAIT`` seconds and is then dropped; it goes
without one only with ``EGRESS_PROXIES_ALLOW_DIRECT``. A pool discovery does not know fails the
start, or closes the spider during the crawl (reason ``egress_proxies_pool_missing <pool>``), after
``EGRESS_PROXIES_POOL_WAIT`` seconds.
Everything is counted under ``egress_proxies/`` in the crawl's stats, and the pool's state is
logged every ``EGRESS_PROXIES_LOG_SECONDS``. docs/crawlers.md has every setting.

Scrapy 2.13 through 2.19: the hooks take an optional ``spider`` (2.13 passes it, 2.19 does not).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object

from egress_proxies_client.client import EgressProxiesError, NoProxyAvailable, ProxyClient, QuarantineOutcome
from egress_proxies_client.policies import POLICIES
from egress_proxies_client.proxy import Proxy
from egress_proxies_client.scrapy_compat import PROXY_FAILURES, close_spider, sleep
from egress_proxies_client.transport import retry_after_seconds

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

log = logging.getLogger("egress_proxies_client.scrapy")

# request.meta keys of this middleware.
PROXY_META = "egress_proxy"  # the Proxy this request went through
SESSION_META = "egress_proxies_session"  # the same proxy for every request with this value
BAN_RETRIES_META = "egress_proxies_ban_retries"
PROXY_RETRIES_META = "egress_proxies_proxy_retries"
# The header the fleet's squid adds to its own error answers, for credential holders only
# (plugins/module_utils/squid_access.py, OWN_ERROR_HEADER); its value is squid's error name.
OWN_ERROR_HEADER = b"X-Egress-Proxies-Error"
POLICY_REFUSAL = "ERR_ACCESS_DENIED"
BanDetector = Callable[[Request, "Response"], object]
# Sticky sessions remembered; beyond, the oldest are forgotten.
MAX_SESSIONS = 10_000


class EgressProxiesConfigError(EgressProxiesError):
    """A setting is missing or wrong; the message names it and the fix."""


@dataclass(frozen=True)
class MiddlewareSettings:
    url: str
    token: str = field(repr=False)
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
    cooldown_codes: frozenset[int]
    site_cooldown: float
    max_site_cooldown: float
    proxy_retries: int
    pool_wait: float
    flush_seconds: float
    log_seconds: float
    client_limits: dict[str, float] = field(default_factory=dict)

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
        return cls(url=str(url), token=str(token), namespace=settings.get("EGRESS_PROXIES_NAMESPACE"),
                   pool=settings.get("EGRESS_PROXIES_POOL"), policy=str(policy),
                   refresh_seconds=settings.getfloat("EGRESS_PROXIES_REFRESH_SECONDS", 5.0),
                   ban_codes=_codes(settings, "EGRESS_PROXIES_BAN_CODES", [403]), ban_detector=_detector(settings),
                   ban_retries=settings.getint("EGRESS_PROXIES_BAN_RETRIES", 3),
                   quarantine=settings.getbool("EGRESS_PROXIES_QUARANTINE", True),
                   allow_direct=settings.getbool("EGRESS_PROXIES_ALLOW_DIRECT", False),
                   empty_wait=settings.getfloat("EGRESS_PROXIES_EMPTY_WAIT", 60.0),
                   cooldown_codes=_codes(settings, "EGRESS_PROXIES_COOLDOWN_CODES", [429, 503]),
                   site_cooldown=settings.getfloat("EGRESS_PROXIES_SITE_COOLDOWN", 10.0),
                   max_site_cooldown=settings.getfloat("EGRESS_PROXIES_MAX_SITE_COOLDOWN", 60.0),
                   proxy_retries=settings.getint("EGRESS_PROXIES_PROXY_RETRIES", 10),
                   pool_wait=settings.getfloat("EGRESS_PROXIES_POOL_WAIT", 30.0),
                   flush_seconds=settings.getfloat("EGRESS_PROXIES_FLUSH_SECONDS", 10.0),
                   log_seconds=settings.getfloat("EGRESS_PROXIES_LOG_SECONDS", 60.0),
                   client_limits={
                       "failure_cooldown": settings.getfloat("EGRESS_PROXIES_FAILURE_COOLDOWN", 5.0),
                       "max_failure_cooldown": settings.getfloat("EGRESS_PROXIES_MAX_FAILURE_COOLDOWN", 300.0),
                       "max_quarantines": settings.getint("EGRESS_PROXIES_MAX_QUARANTINES", 10),
                       "quarantine_window": settings.getfloat("EGRESS_PROXIES_QUARANTINE_WINDOW", 60.0),
                       "max_quarantine_share": settings.getfloat("EGRESS_PROXIES_MAX_QUARANTINE_SHARE", 0.5)})

    def client(self) -> ProxyClient:
        try:
            return ProxyClient(self.url, self.token, namespace=self.namespace, pool=self.pool, policy=self.policy,
                               refresh_seconds=self.refresh_seconds, pool_wait=self.pool_wait,
                               failure_cooldown=self.client_limits["failure_cooldown"],
                               max_failure_cooldown=self.client_limits["max_failure_cooldown"],
                               max_quarantines=int(self.client_limits["max_quarantines"]),
                               quarantine_window=self.client_limits["quarantine_window"],
                               max_quarantine_share=self.client_limits["max_quarantine_share"])
        except ValueError as error:  # the client names its argument first; say which setting that is
            argument, _, problem = str(error).partition(": ")
            raise EgressProxiesConfigError(f"EGRESS_PROXIES_{argument.upper()}: {problem}") from None


def _codes(settings: BaseSettings, name: str, default: list[int]) -> frozenset[int]:
    """HTTP error statuses a site answers with; never a success, a redirect or the proxy's 407."""
    try:
        codes = frozenset(int(code) for code in settings.getlist(name, default))
    except ValueError:
        raise EgressProxiesConfigError(f"{name}: must be HTTP status codes, e.g. [403]") from None
    wrong = sorted(code for code in codes if not 400 <= code <= 599 or code == 407)
    if wrong:
        raise EgressProxiesConfigError(f"{name}: {wrong} are not a site's error statuses (400-599, not the proxy's "
                                       "407): every answer would count; use EGRESS_PROXIES_BAN_DETECTOR for a site "
                                       "that bans with a 200")
    return codes


def _detector(settings: BaseSettings) -> BanDetector | None:
    detector: object = settings.get("EGRESS_PROXIES_BAN_DETECTOR")
    if isinstance(detector, str):
        detector = load_object(detector)
    if detector is not None and not callable(detector):
        raise EgressProxiesConfigError("EGRESS_PROXIES_BAN_DETECTOR: must be a callable (request, response) -> "
                                       "True or a reason (a ban), False (not one), None (the status decides), "
                                       "or its import path")
    return cast("BanDetector | None", detector)


class EgressProxiesAddon:
    """The Scrapy add-on (``ADDONS = {"egress_proxies_client.scrapy_middleware.EgressProxiesAddon": 0}``):
    enables the middleware at 740, before Scrapy's HttpProxyMiddleware (750)."""

    def update_settings(self, settings: BaseSettings) -> None:
        settings["DOWNLOADER_MIDDLEWARES"][f"{__name__}.EgressProxiesMiddleware"] = 740


class EgressProxiesMiddleware:
    def __init__(self, crawler: Crawler, settings: MiddlewareSettings, client: ProxyClient) -> None:
        self.crawler = crawler
        self.settings = settings
        self.client = client
        # Quarantine outcomes arrive on the client's thread; stats are written on Scrapy's.
        self._outcomes: list[QuarantineOutcome] = []
        self._outcomes_lock = threading.Lock()
        self._reported: set[tuple[str, str, str]] = set()
        self._sessions: OrderedDict[str, Proxy] = OrderedDict()
        self._empty_since: float | None = None
        self._logged_at = float("-inf")  # the first request logs the pool's state
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> EgressProxiesMiddleware:
        if not crawler.settings.getbool("EGRESS_PROXIES_ENABLED", True):
            raise NotConfigured("EGRESS_PROXIES_ENABLED is False")
        settings = MiddlewareSettings.from_settings(crawler.settings)
        middleware = cls(crawler, settings, settings.client())
        crawler.signals.connect(middleware.spider_closed, signal=signals.spider_closed)
        return middleware

    def spider_closed(self) -> None:
        """Reports still going out get ``EGRESS_PROXIES_FLUSH_SECONDS``; the pool's last state is logged."""
        self.client.close(timeout=self.settings.flush_seconds)
        self._record_outcomes()
        self._log_state()

    # -- Scrapy's hooks (``spider``: passed by Scrapy before 2.19 only) -----------------------------

    async def process_request(self, request: Request, spider: object = None) -> None:  # noqa: ARG002
        self._record_outcomes()
        self._log_state_now_and_then()
        if request.meta.get("dont_proxy"):
            self._unassign(request)
            self._inc("egress_proxies/dont_proxy")
            return
        if "proxy" in request.meta and PROXY_META not in request.meta:
            return  # a proxy someone else chose, or None: this request goes without one on purpose
        self._close_if_the_pool_is_gone()
        proxy = self._session_proxy(request) or self._pick(request) or await self._wait_for_proxy(request)
        if proxy is None:  # EGRESS_PROXIES_ALLOW_DIRECT
            self._unassign(request)
            self._inc("egress_proxies/direct")
            return
        self._assign(request, proxy)

    def process_response(self, request: Request, response: Response,
                         spider: object = None) -> Request | Response:  # noqa: ARG002
        proxy = request.meta.get(PROXY_META)
        if not isinstance(proxy, Proxy):
            return response
        own_error = response.headers.get(OWN_ERROR_HEADER)
        if own_error is not None:
            return self._proxys_own_error(request, response, proxy, own_error.decode("latin-1"))
        if response.status == 407:
            return self._proxy_failed(request, proxy, "407: the proxy refused the credentials") or response
        self.client.report_success(proxy)
        reason = self._ban_reason(request, response)
        if reason is not None:
            return self._banned(request, response, proxy, reason)
        if response.status in self.settings.cooldown_codes:
            return self._site_asked_to_wait(request, response, proxy)
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: object = None) -> Request | None:  # noqa: ARG002
        """A proxy that cannot be connected to or times out is set aside with backoff and the
        request goes again through another one (after ``EGRESS_PROXIES_PROXY_RETRIES``, Scrapy's
        RetryMiddleware decides)."""
        proxy = request.meta.get(PROXY_META)
        if isinstance(proxy, Proxy) and isinstance(exception, PROXY_FAILURES):
            return self._proxy_failed(request, proxy, type(exception).__name__)
        return None

    # -- answers ---------------------------------------------------------------------------------

    def _proxys_own_error(self, request: Request, response: Response, proxy: Proxy,
                          error: str) -> Response:
        """Never a ban: the fleet's policy refused the request (dropped: no proxy would take it),
        or the proxy could not reach the site (the answer goes on, Scrapy's retries apply)."""
        self._inc(f"egress_proxies/proxy_errors/{error}")
        if error != POLICY_REFUSAL:
            return response
        self._inc("egress_proxies/proxy_refused")
        log.warning("%s refused by the fleet's policy through %s (HTTP %d, %s): not a ban; dropped. Its port or "
                    "address is one the proxies never serve (docs/crawlers.md, \"What the proxies refuse\")",
                    request.url, proxy, response.status, error)
        raise IgnoreRequest(f"refused by the egress proxies' policy ({error})")

    def _banned(self, request: Request, response: Response, proxy: Proxy, reason: str) -> Request | Response:
        self._inc("egress_proxies/bans")
        future = self.client.report_banned(proxy, reason, quarantine=self.settings.quarantine)
        if proxy.instance not in self._reported:  # a second ban of one instance shares the first report
            self._reported.add(proxy.instance)
            future.add_done_callback(self._outcome_arrived)
        log.info("ban through %s: %s", proxy, reason)
        return self._again_after_ban(request, response, reason)

    def _site_asked_to_wait(self, request: Request, response: Response, proxy: Proxy) -> Request | Response:
        host = urlparse_cached(request).hostname or "?"
        header = response.headers.get(b"Retry-After")
        asked = retry_after_seconds(header.decode("latin-1") if header is not None else None)
        seconds = min(self.settings.max_site_cooldown, asked if asked is not None else self.settings.site_cooldown)
        self.client.cool_down(proxy, host, seconds)
        self._inc("egress_proxies/site_cooldowns")
        log.info("%s answered %d through %s: that proxy waits %.0f s for that site", host, response.status, proxy,
                 seconds)
        return self._again(request, "site cool-down") or response

    def _proxy_failed(self, request: Request, proxy: Proxy, what: str) -> Request | None:
        seconds = self.client.report_failure(proxy)
        self._inc("egress_proxies/proxy_failures")
        log.warning("%s: %s; not handed out for %.0f s", proxy, what, seconds)
        return self._again(request, what)

    def _again(self, request: Request, why: str) -> Request | None:
        """The request once more through another proxy, or None when its retries are spent."""
        retries = int(request.meta.get(PROXY_RETRIES_META, 0))
        if retries >= self.settings.proxy_retries:
            self._inc("egress_proxies/proxy_retries_spent")
            log.warning("%s: no more tries through another proxy (%d; last: %s)", request.url, retries, why)
            return None
        return self._through_another(request, PROXY_RETRIES_META, retries, "egress_proxies/proxy_retries")

    def _again_after_ban(self, request: Request, response: Response, reason: str) -> Request | Response:
        """The request once more through another proxy, or the ban response when retries are spent."""
        retries = int(request.meta.get(BAN_RETRIES_META, 0))
        if retries >= self.settings.ban_retries:
            self._inc("egress_proxies/ban_gave_up")
            log.warning("gave up on %s after %d bans (%s)", request.url, retries + 1, reason)
            return response
        return self._through_another(request, BAN_RETRIES_META, retries, "egress_proxies/ban_retries")

    def _through_another(self, request: Request, counter: str, retries: int, stat: str) -> Request:
        """A copy of ``request`` with no proxy assigned (the next pick chooses), its ``counter`` meta
        key one higher, counted in ``stat``."""
        again = request.replace(dont_filter=True)
        self._unassign(again)
        again.meta[counter] = retries + 1
        self._inc(stat)
        return again

    def _ban_reason(self, request: Request, response: Response) -> str | None:
        """The detector's verdict when it has one (False vetoes a status-code ban), else the status."""
        host = urlparse_cached(request).hostname or "?"
        if self.settings.ban_detector is not None:
            verdict = self.settings.ban_detector(request, response)
            if verdict is False:
                return None
            if verdict:
                return verdict if isinstance(verdict, str) else f"ban detected on {host} (HTTP {response.status})"
        if response.status in self.settings.ban_codes:
            return f"HTTP {response.status} from {host}"
        return None

    # -- choosing --------------------------------------------------------------------------------

    def _assign(self, request: Request, proxy: Proxy) -> None:
        request.meta["proxy"] = proxy.address
        request.meta[PROXY_META] = proxy
        # Scrapy's HttpProxyMiddleware keeps the header only for the proxy it last saw it with.
        request.meta.pop("_auth_proxy", None)
        authorization = proxy.proxy_authorization
        if authorization is not None:
            request.headers[b"Proxy-Authorization"] = authorization.encode("latin-1")
        else:
            request.headers.pop(b"Proxy-Authorization", None)
        session = request.meta.get(SESSION_META)
        if session is not None:
            self._sessions[str(session)] = proxy
            self._sessions.move_to_end(str(session))
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        self._inc("egress_proxies/requests")
        self._inc(f"egress_proxies/requests/{proxy.key}")

    def _session_proxy(self, request: Request) -> Proxy | None:
        """The proxy of the request's sticky session while it is usable; a new one after."""
        session = request.meta.get(SESSION_META)
        proxy = self._sessions.get(str(session)) if session is not None else None
        if proxy is None:
            return None
        if self.client.usable(proxy, urlparse_cached(request).hostname):
            return proxy
        del self._sessions[str(session)]
        self._inc("egress_proxies/sessions_moved")
        return None

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
            log.warning("egress proxies: no proxy to hand out for %s (%s); requests wait up to %.0f s for one",
                        urlparse_cached(request).hostname, self.client.scope, self.settings.empty_wait)
        deadline = time.monotonic() + self.settings.empty_wait
        while time.monotonic() < deadline:
            await sleep(0.25)
            self._close_if_the_pool_is_gone()
            proxy = self._pick(request)
            if proxy is not None:
                return proxy
        self._inc("egress_proxies/no_proxy")
        raise IgnoreRequest(f"no proxy from egress-proxies discovery for {self.settings.empty_wait:.0f} s; "
                            "EGRESS_PROXIES_ALLOW_DIRECT = True would send it without one")

    def _close_if_the_pool_is_gone(self) -> None:
        """Discovery said the pool does not exist for EGRESS_PROXIES_POOL_WAIT: close the spider."""
        missing = self.client.pool_missing_since
        if missing is None or time.monotonic() - missing < self.settings.pool_wait:
            return
        if not self._closing:
            self._closing = True
            log.error("egress proxies: discovery knows no %s for %.0f s (EGRESS_PROXIES_POOL_WAIT); closing the "
                      "spider", self.client.scope, time.monotonic() - missing)
            close_spider(self.crawler, f"egress_proxies_pool_missing {self.settings.pool}")
        raise IgnoreRequest(f"no {self.client.scope}")

    @staticmethod
    def _unassign(request: Request) -> None:
        if request.meta.pop(PROXY_META, None) is not None:
            request.meta.pop("proxy", None)
            request.meta.pop("_auth_proxy", None)
            request.headers.pop(b"Proxy-Authorization", None)

    # -- stats and logs --------------------------------------------------------------------------

    def _outcome_arrived(self, future: Future[QuarantineOutcome]) -> None:
        with self._outcomes_lock:
            self._outcomes.append(future.result())

    def _record_outcomes(self) -> None:
        with self._outcomes_lock:
            outcomes, self._outcomes = self._outcomes, []
        for outcome in outcomes:
            if outcome.quarantined:
                self._inc("egress_proxies/quarantined")
            elif outcome.over_budget:
                self._inc("egress_proxies/quarantine_over_budget")
                log.warning("egress proxies: %s not reported: %s", outcome.proxy, outcome.detail)
            elif outcome.undelivered:
                self._inc("egress_proxies/quarantine_undelivered")
            elif outcome.status is not None:
                self._inc(f"egress_proxies/quarantine_failed/{outcome.status}")

    def _log_state_now_and_then(self) -> None:
        if time.monotonic() - self._logged_at >= self.settings.log_seconds:
            self._log_state()

    def _log_state(self) -> None:
        """The pool's state in the stats (``egress_proxies/pool/*``) and one log line."""
        self._logged_at = time.monotonic()
        state = self.client.state()
        stats: Any = self.crawler.stats
        if stats is not None:
            for name, value in state.items():
                stats.set_value(f"egress_proxies/pool/{name}", value)
        counts = {name: stats.get_value(f"egress_proxies/{name}", 0) if stats is not None else 0
                  for name in ("requests", "bans", "proxy_failures", "site_cooldowns", "proxy_refused")}
        log.info("egress proxies (%s): %s; %s", self.client.scope, ", ".join(f"{v} {k}" for k, v in state.items()),
                 ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()))

    def _inc(self, key: str) -> None:
        stats: Any = self.crawler.stats
        if stats is not None:
            stats.inc_value(key)
