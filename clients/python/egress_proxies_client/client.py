"""``ProxyClient``: the proxies of a namespace or pool from the controller's discovery, kept fresh in
the background, handed out by a policy, and banned ones reported to the controller's quarantine.

Threads: the caller's (``pick``, ``report_banned``, ``report_failure``, ``cool_down``: in memory,
never waiting on the network), a refresher (one conditional GET every ``refresh_seconds`` +-20 %,
its first at a random point of the first interval, so processes started together spread out), and
a reporter started by the first ``report_banned`` (quarantine POSTs one at a time, 429s waited out
as ``Retry-After`` says, an unreachable controller retried with backoff for as long as the client
runs, and what is left given ``close``'s time to go out). asyncio code uses ``apick`` and
``aclose``, which never block the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from egress_proxies_client.limits import Backoff, QuarantineBudget, SiteCooldowns
from egress_proxies_client.policies import Policy, make_policy
from egress_proxies_client.proxy import DiscoveryFormatError, Proxy, parse_listing
from egress_proxies_client.transport import Answer, Controller, ControllerUnreachable, Scope, reason_text

log = logging.getLogger("egress_proxies_client")

# Each refresh interval is this much shorter or longer at random, so clients never fall in step.
JITTER = 0.2
# A quarantine report the controller did not take (unreachable, 5xx) is sent again after this many
# seconds, doubled each time up to REPORT_BACKOFF_CEILING, for as long as the client runs; a 429
# as Retry-After says; any other 4xx never (the same request would be refused again).
REPORT_BACKOFF, REPORT_BACKOFF_CEILING = 1.0, 30.0
# How often a client starting against a pool discovery does not know asks again (pool_wait).
POOL_POLL = 1.0


class EgressProxiesError(Exception):
    """Base of this package's errors."""


class DiscoveryError(EgressProxiesError):
    """Discovery cannot be used at start-up: wrong token, scope, address, or the controller is down."""


class PoolNotFound(DiscoveryError):
    """The ProxyPool does not exist (a typo, another namespace, not created yet) after ``pool_wait``."""


class NoProxyAvailable(EgressProxiesError):
    """Nothing to hand out: discovery lists no usable proxy (none Ready, or all banned or set aside)."""


@dataclass(frozen=True)
class Refresh:
    """One discovery request, for ``on_refresh`` (metrics, logs, the benchmark)."""

    status: int | None
    """The HTTP status (200, 304, ...); None when the controller did not answer."""
    seconds: float
    error: str | None = None


@dataclass(frozen=True)
class QuarantineOutcome:
    """How a ``report_banned`` ended."""

    proxy: Proxy
    quarantined: bool
    status: int | None
    """The controller's last answer (200, 404, 429, ...); None when it never answered or was not asked."""
    detail: str
    attempts: int
    over_budget: bool = False
    """Not sent: this client's quarantine budget was spent (the proxy is set aside instead)."""

    @property
    def undelivered(self) -> bool:
        """Sent but never answered: the controller was unreachable until the client closed."""
        return not self.quarantined and self.status is None and self.attempts > 0


class ProxyClient:
    """Proxies from discovery; see the module docstring.

    ``namespace`` lists one namespace and ``pool`` (``"namespace/name"``) one ProxyPool; with
    neither, every namespace the token covers. The constructor reads discovery once and raises
    ``DiscoveryError`` saying what is wrong (the token, the scope, the address). After that an
    unreachable controller never takes the proxies away: the last good list is used until
    discovery answers again. A pool discovery does not know is waited for ``pool_wait`` seconds
    (it may be being created), then ``PoolNotFound``.

    Bounds (``limits.py``): proxies that fail are set aside ``failure_cooldown`` seconds, doubled
    per failure in a row up to ``max_failure_cooldown``; at most ``max_quarantines`` reports, and
    ``max_quarantine_share`` of the pool, in ``quarantine_window`` seconds (a ban past them sets the
    proxy aside for ``max_failure_cooldown`` instead of reporting it)."""

    def __init__(self, url: str, token: str, *, namespace: str | None = None, pool: str | None = None,
                 policy: str = "round_robin", refresh_seconds: float = 5.0, timeout: float = 5.0,
                 max_retry_after: float = 120.0, on_refresh: Callable[[Refresh], None] | None = None,
                 rng: random.Random | None = None, pool_wait: float = 0.0, failure_cooldown: float = 5.0,
                 max_failure_cooldown: float = 300.0, max_quarantines: int = 10, quarantine_window: float = 60.0,
                 max_quarantine_share: float = 0.5) -> None:
        self.scope = _scope(namespace, pool)
        if refresh_seconds < 0.5:
            raise ValueError(f"refresh_seconds: {refresh_seconds!r} is below 0.5 s (every crawler process polls)")
        self._backoff = Backoff(failure_cooldown, max_failure_cooldown)
        self._budget = QuarantineBudget(max_quarantines, quarantine_window, max_quarantine_share)
        self._cooldowns = SiteCooldowns()
        self.pool_wait = pool_wait
        self.pool_missing_since: float | None = None  # time.monotonic() since discovery says no such pool
        self._rng = rng or random.Random()
        self._policy: Policy = make_policy(policy, self._rng)
        self.policy = policy
        self._controller = Controller(url, token, timeout)
        self.refresh_seconds = refresh_seconds
        self.max_retry_after = max_retry_after
        self.on_refresh = on_refresh
        self._lock = threading.Lock()
        self._listed: tuple[Proxy, ...] = ()
        self._usable_instances: set[tuple[str, str, str]] = set()
        self._etag: str | None = None
        self._banned: set[tuple[str, str, str]] = set()
        self._aside: dict[tuple[str, str, str], float] = {}
        self._aside_until = float("inf")  # the earliest set-aside to expire: the list is rebuilt then
        self._reports: dict[tuple[str, str, str], Future[QuarantineOutcome]] = {}
        self._queue: queue.Queue[tuple[Proxy, str, Future[QuarantineOutcome]] | None] = queue.Queue()
        self._reporter: threading.Thread | None = None
        self._stop = threading.Event()  # the threads end now
        self._closing = threading.Event()  # close() was called: reports still queued get its time
        self._wake = threading.Event()
        self.last_success = 0.0  # time.monotonic() of the last good discovery answer
        self._failing_since: float | None = None
        self._start()
        self._refresher = threading.Thread(target=self._refresh_loop, name="egress-proxies-refresh", daemon=True)
        self._refresher.start()

    # -- handing out -----------------------------------------------------------------------------

    def pick(self, site: str | None = None, wait: float = 0.0) -> Proxy:
        """A proxy by the policy (``site``: the host name, for ``sticky``). With nothing usable,
        waits up to ``wait`` seconds for discovery to list one, then raises ``NoProxyAvailable``."""
        deadline = time.monotonic() + wait
        asked = False
        while True:
            proxy = self._pick_now(site)
            if proxy is not None:
                return proxy
            self._give_up_at(deadline, site)
            if not asked:  # one early refresh, not one per turn of this loop
                self._wake.set()
                asked = True
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    async def apick(self, site: str | None = None, wait: float = 0.0) -> Proxy:
        """``pick`` for asyncio code: the wait never blocks the event loop."""
        deadline = time.monotonic() + wait
        asked = False
        while True:
            proxy = self._pick_now(site)
            if proxy is not None:
                return proxy
            self._give_up_at(deadline, site)
            if not asked:
                self._wake.set()
                asked = True
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _pick_now(self, site: str | None) -> Proxy | None:
        """The policy's choice, or, when the site asked that proxy to wait (``cool_down``), the next
        one it has not; None when nothing is usable for ``site``."""
        with self._lock:
            now = time.monotonic()
            if self._aside_until <= now:
                self._rebuild()
            proxy = self._policy.pick(site)
            if proxy is None or site is None or not len(self._cooldowns) \
                    or not self._cooldowns.cooling(proxy.instance, site, now):
                return proxy
            usable = self._usable()
            for _ in range(len(usable)):  # the policy's order first (round robin moves on)
                proxy = self._policy.pick(site)
                if proxy is not None and not self._cooldowns.cooling(proxy.instance, site, now):
                    return proxy
            return next((p for p in usable if not self._cooldowns.cooling(p.instance, site, now)), None)

    def _give_up_at(self, deadline: float, site: str | None) -> None:
        if time.monotonic() < deadline and not self._stop.is_set():
            return
        with self._lock:
            counts = (f"{len(self._listed)} listed, {len(self._banned)} banned, {len(self._aside)} set aside"
                      + (f", the rest asked by {site} to wait" if site is not None and len(self._cooldowns) else ""))
        raise NoProxyAvailable(f"discovery at {self._controller.url} lists no usable proxy for {self.scope} "
                               f"({counts})")

    def usable(self, proxy: Proxy, site: str | None = None) -> bool:
        """``proxy`` is still handed out (listed, not banned, not set aside; not cooling down for
        ``site``): a sticky session keeps it while it is."""
        with self._lock:
            if proxy.instance not in self._usable_instances:
                return False
            return site is None or not self._cooldowns.cooling(proxy.instance, site, time.monotonic())

    def state(self) -> dict[str, int]:
        """How many proxies are listed, usable, banned and set aside now (stats, the periodic log)."""
        with self._lock:
            self._rebuild()
            return {"listed": len(self._listed), "usable": len(self._usable_instances), "banned": len(self._banned),
                    "set_aside": len(self._aside)}

    def proxies(self) -> list[Proxy]:
        """The proxies ``pick`` chooses from now (listed, not banned, not set aside)."""
        with self._lock:
            self._rebuild()
            return self._usable()

    def set_aside(self, proxy: Proxy, seconds: float) -> None:
        """Hand ``proxy`` out to nobody for ``seconds`` (not a ban: the controller's probe decides
        whether it is dead)."""
        with self._lock:
            self._set_aside(proxy, seconds)

    def report_failure(self, proxy: Proxy) -> float:
        """``proxy`` failed to answer (refused, timed out, refused its credentials): set aside with
        backoff; the seconds it is. Credentials are read again from discovery soon."""
        with self._lock:
            seconds = self._backoff.failed(proxy.instance)
            self._set_aside(proxy, seconds)
        self._wake.set()
        return seconds

    def report_success(self, proxy: Proxy) -> None:
        """``proxy`` answered: its next failure starts the backoff over."""
        with self._lock:
            self._backoff.succeeded(proxy.instance)

    def cool_down(self, proxy: Proxy, site: str, seconds: float) -> None:
        """``site`` asked ``proxy`` to wait (429/503, ``Retry-After``): hand it out to nobody for
        that site for ``seconds``; it serves every other site meanwhile."""
        with self._lock:
            now = time.monotonic()
            self._cooldowns.cool(proxy.instance, site, now + seconds, now)

    def refresh_soon(self) -> None:
        """Read discovery now rather than at the next interval (new credentials, a new list)."""
        self._wake.set()

    def _set_aside(self, proxy: Proxy, seconds: float) -> None:
        until = time.monotonic() + seconds
        self._aside[proxy.instance] = max(until, self._aside.get(proxy.instance, 0.0))
        self._aside_until = min(self._aside_until, until)
        self._rebuild()

    def report_banned(self, proxy: Proxy, reason: str, *, quarantine: bool = True) -> Future[QuarantineOutcome]:
        """Stop handing ``proxy`` out at once and, with ``quarantine``, report it to the controller,
        which takes it out of discovery and replaces it. Returns at once; the Future says how the
        report ended. Reporting the same instance again returns the first report's Future.

        Past the quarantine budget (see the class) the proxy is set aside for
        ``max_failure_cooldown`` seconds and not reported (``QuarantineOutcome.over_budget``)."""
        with self._lock:
            known = self._reports.get(proxy.instance)
            if known is not None:
                return known
            future: Future[QuarantineOutcome] = Future()
            verdict = self._budget.take(proxy.instance, {listed.instance for listed in self._listed},
                                        time.monotonic())
            if not verdict.allowed:
                self._set_aside(proxy, self._backoff.ceiling)
                future.set_result(QuarantineOutcome(proxy, False, None, f"not reported: the quarantine budget is "
                                                    f"spent: {verdict.why}", 0, over_budget=True))
                return future
            self._banned.add(proxy.instance)
            self._rebuild()
            self._reports[proxy.instance] = future
        if not quarantine:
            future.set_result(QuarantineOutcome(proxy, False, None, "banned here only (quarantine=False)", 0))
            return future
        if self._closing.is_set():
            future.set_result(QuarantineOutcome(proxy, False, None, "not reported: the client is closed", 0))
            return future
        self._start_reporter()
        self._queue.put((proxy, reason_text(reason), future))
        return future

    @property
    def stale_seconds(self) -> float:
        """Seconds since discovery last answered (0 right after a good refresh)."""
        return time.monotonic() - self.last_success

    def refresh(self) -> bool:
        """Read discovery now (the background thread does this every ``refresh_seconds``); False
        when it failed, and the last good list stays in use."""
        answer, failure = self._fetch()
        if answer is not None and _no_such_pool(answer, self.scope):
            if self.pool_missing_since is None:
                self.pool_missing_since = time.monotonic()
                log.warning("egress proxies: %s", _refusal(answer, self.scope))
            with self._lock:
                self._install_locked((), None)
            return False
        if answer is None or answer.status not in (200, 304):
            self._failed(failure or _refusal(answer, self.scope))
            return False
        self.pool_missing_since = None
        if answer.status == 200:
            try:
                listed = parse_listing(answer.body)
            except DiscoveryFormatError as error:
                self._failed(str(error))
                return False
            self._install(listed, answer.etag)
        self._succeeded()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads; reports still queued or being retried get ``timeout`` seconds to go
        out, and those that did not end ``undelivered``."""
        deadline = time.monotonic() + timeout
        self._closing.set()
        self._queue.put(None)
        self._wake.set()
        if self._reporter is not None:
            self._reporter.join(timeout=max(0.0, deadline - time.monotonic()))
        self._stop.set()
        self._wake.set()
        self._refresher.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._reporter is not None:
            self._reporter.join(timeout=1.0)

    async def aclose(self, timeout: float = 5.0) -> None:
        """``close`` for asyncio code, in a worker thread."""
        await asyncio.to_thread(self.close, timeout)

    def __enter__(self) -> ProxyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- discovery ------------------------------------------------------------------------------

    def _start(self) -> None:
        deadline = time.monotonic() + self.pool_wait
        answer, failure = self._fetch()
        while answer is not None and _no_such_pool(answer, self.scope) and time.monotonic() < deadline:
            log.warning("egress proxies: %s; waiting up to %.0f s for it", _refusal(answer, self.scope),
                        deadline - time.monotonic())
            time.sleep(min(POOL_POLL, max(0.0, deadline - time.monotonic())))
            answer, failure = self._fetch()
        if answer is not None and _no_such_pool(answer, self.scope):
            raise PoolNotFound(_refusal(answer, self.scope))
        if answer is None:
            raise DiscoveryError(f"cannot reach the egress-proxies controller at {self._controller.url}: {failure}. "
                                 "Check the address (url=, EGRESS_PROXIES_URL) and that the controller runs")
        if answer.status != 200:
            raise DiscoveryError(_refusal(answer, self.scope))
        try:
            listed = parse_listing(answer.body)
        except DiscoveryFormatError as error:
            raise DiscoveryError(f"{self._controller.url} is not an egress-proxies controller: {error}") from None
        self._install(listed, answer.etag)
        self._succeeded()
        log.info("egress proxies: %d listed for %s by %s", len(listed), self.scope, self._controller.url)

    def _fetch(self) -> tuple[Answer | None, str | None]:
        started = time.monotonic()
        try:
            answer = self._controller.get(self.scope.path, self._etag)
        except ControllerUnreachable as error:
            self._observe(Refresh(None, time.monotonic() - started, str(error)))
            return None, str(error)
        self._observe(Refresh(answer.status, time.monotonic() - started))
        return answer, None

    def _observe(self, refresh: Refresh) -> None:
        if self.on_refresh is not None:
            self.on_refresh(refresh)

    def _install(self, listed: tuple[Proxy, ...], etag: str | None) -> None:
        with self._lock:
            self._install_locked(listed, etag)

    def _install_locked(self, listed: tuple[Proxy, ...], etag: str | None) -> None:
        self._listed, self._etag = listed, etag
        present = {proxy.instance for proxy in listed}
        # A banned or failing instance discovery no longer lists is gone for good: forget it.
        self._banned &= present
        self._backoff.forget(present)
        self._rebuild()

    def _rebuild(self) -> None:
        """The policy's list from what is listed, minus bans and set-asides (under the lock)."""
        now = time.monotonic()
        self._aside = {key: until for key, until in self._aside.items() if until > now}
        self._aside_until = min(self._aside.values(), default=float("inf"))
        usable = self._usable()
        self._usable_instances = {proxy.instance for proxy in usable}
        self._policy.update(usable)

    def _usable(self) -> list[Proxy]:
        excluded = self._banned | self._aside.keys()
        return [proxy for proxy in self._listed if proxy.instance not in excluded]

    def _succeeded(self) -> None:
        if self._failing_since is not None:
            log.warning("egress proxies: discovery at %s answers again after %.0f s; %d proxies listed",
                        self._controller.url, time.monotonic() - self._failing_since, len(self._listed))
        self._failing_since = None
        self.last_success = time.monotonic()

    def _failed(self, why: str) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning("egress proxies: discovery at %s failed (%s); using the last good list of %d proxies "
                        "until it answers again", self._controller.url, why, len(self._listed))

    def _refresh_loop(self) -> None:
        delay = self._rng.uniform(0.0, self.refresh_seconds)  # the first: anywhere in the interval
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                return
            started = time.monotonic()
            self.refresh()
            # From start to start, so a slow answer does not stretch the cadence; but at least half
            # an interval of rest, so a controller that answers slowly is not asked back to back.
            interval = self.refresh_seconds * self._rng.uniform(1.0 - JITTER, 1.0 + JITTER)
            delay = max(interval - (time.monotonic() - started), self.refresh_seconds / 2)

    # -- quarantine -----------------------------------------------------------------------------

    def _start_reporter(self) -> None:
        with self._lock:
            if self._reporter is None:
                self._reporter = threading.Thread(target=self._report_loop, name="egress-proxies-report",
                                                  daemon=True)
                self._reporter.start()

    def _report_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            proxy, reason, future = item
            outcome = self._quarantine(proxy, reason)
            if outcome.quarantined:
                log.info("egress proxies: %s quarantined (%s)", proxy, reason)
            else:
                log.warning("egress proxies: %s not quarantined: %s", proxy, outcome.detail)
            future.set_result(outcome)
        while not self._queue.empty():  # closed: what is left was never sent
            left = self._queue.get_nowait()
            if left is not None:
                left[2].set_result(QuarantineOutcome(left[0], False, None, "not reported: the client closed", 1))

    def _quarantine(self, proxy: Proxy, reason: str) -> QuarantineOutcome:
        """Until the controller answers for good, or the client has closed (``close``'s time spent)."""
        status: int | None = None
        detail = ""
        attempt, backoff = 0, REPORT_BACKOFF
        while True:
            attempt += 1
            try:
                answer = self._controller.post_quarantine(proxy.namespace, proxy.name, reason)
            except ControllerUnreachable as error:
                status, detail, wait = None, f"controller unreachable: {error}", backoff
                backoff = min(REPORT_BACKOFF_CEILING, backoff * 2)
            else:
                status, detail = answer.status, answer.text()
                if answer.status == 200:
                    return QuarantineOutcome(proxy, True, 200, "quarantined", attempt)
                if answer.status == 429:
                    wait = answer.retry_after if answer.retry_after is not None else 60.0
                    if wait > self.max_retry_after:
                        return QuarantineOutcome(proxy, False, 429, f"{detail} (Retry-After {wait:.0f} s is beyond "
                                                 f"max_retry_after {self.max_retry_after:.0f} s)", attempt)
                elif answer.status < 500:
                    return QuarantineOutcome(proxy, False, answer.status, detail, attempt)
                else:
                    wait, backoff = backoff, min(REPORT_BACKOFF_CEILING, backoff * 2)
            # While closing, retries come every half second until close's time is spent.
            if self._stop.wait(min(wait, 0.5) if self._closing.is_set() else wait):
                return QuarantineOutcome(proxy, False, status if status is not None and status < 500 else None,
                                         f"not delivered before the client closed: {detail}", attempt)


def _scope(namespace: str | None, pool: str | None) -> Scope:
    if pool is not None:
        pool_namespace, slash, name = pool.partition("/")
        if not slash or not pool_namespace or not name or "/" in name:
            raise ValueError(f"pool: {pool!r} is not namespace/name (e.g. crawlers/eu)")
        if namespace is not None and namespace != pool_namespace:
            raise ValueError(f"namespace: {namespace!r} and pool {pool!r} disagree; give the pool alone")
        return Scope(pool_namespace, name)
    if namespace is not None and (not namespace or "/" in namespace):
        raise ValueError(f"namespace: {namespace!r} is not a namespace name")
    return Scope(namespace, None)


def _no_such_pool(answer: Answer, scope: Scope) -> bool:
    """Discovery's answer that the pool does not exist (404 "no ProxyPool ..."), not that the
    address is no discovery at all."""
    return scope.pool is not None and answer.status == 404 and answer.body.startswith(b"no ProxyPool")


def _refusal(answer: Answer | None, scope: Scope) -> str:
    """What a refused discovery request means, and what to do about it."""
    if answer is None:
        return "no answer"
    said = answer.text()
    if answer.status == 401:
        return (f"the controller refused the token (401 {said}): it is not one of its discovery tokens. Check the "
                "token (token=, EGRESS_PROXIES_TOKEN) against the operator's --discovery-tokens entry")
    if answer.status == 403:
        return f"the token does not cover {scope} (403 {said}); ask the operator to add it to the token's namespaces"
    if answer.status == 503:
        return f"discovery is disabled on the controller (503 {said})"
    if _no_such_pool(answer, scope):
        return (f"discovery knows no {scope} (404 {said}): check the name (pool=, EGRESS_PROXIES_POOL) against "
                f"`kubectl get proxypools -n {scope.namespace}`")
    if answer.status == 404:
        return f"no discovery at this address (404 {said}): is it the egress-proxies controller, and current enough?"
    return f"discovery answered {answer.status}: {said}"

