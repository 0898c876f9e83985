"""Writing what a sweep decided: status and conditions, finalizers and annotations, Events.

Used by every part of a sweep (``live``, ``deletion``, ``garbage``, ``reconcile``). Writes are
optimistic: a 409 reads the object again and re-applies the change, never a blind overwrite; a
Proxy that keeps conflicting raises ``StoreError`` for that Proxy alone (the sweep contains it
and retries next time). ``latest`` is every Proxy as last read or written in this sweep: the
sweep's end state, without listing them all again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from egress_proxies import metrics
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.resources import times
from egress_proxies.resources.conditions import READY, Wanted, find_condition, merge_conditions
from egress_proxies.resources.proxy import (
    FINALIZER,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_PROVISIONING,
    PHASE_QUARANTINED,
    PHASE_READY,
    Proxy,
)
from egress_proxies.sources.store import Gone, ProxyStore, retry_on_conflict
from egress_proxies.sweep.backoff import Backoff

log = logging.getLogger(__name__)


class ProxyWriter:
    def __init__(self, store: ProxyStore, backoff: Backoff, now: Callable[[], str] = times.stamp,
                 purge: Callable[[set[str]], int] | None = None) -> None:
        self.store = store
        self.backoff = backoff
        # Keyed by provider name: creates that failed as a whole batch (the host or API was
        # unreachable, the run died) say nothing about the Proxies in it. Counted against each
        # Proxy, a flapping outage would grow every Proxy's backoff to minutes; one short, capped
        # backoff per provider retries the whole batch soon after the provider answers again.
        self.provider_backoff = Backoff(base_seconds=2.0, cap_seconds=30.0, jitter=backoff.jitter, clock=backoff.clock,
                                        rng=backoff.rng)
        self.now = now
        self.purge = purge
        self.latest: dict[str, Proxy] = {}
        # Proxy key -> why it failed in this sweep (reset by the sweep): the sweep's report.
        self.failures: dict[str, str] = {}

    # -- status --------------------------------------------------------------------------------

    def status(self, proxy: Proxy, phase: str, ready: str, reason: str, message: str,
               conditions: Mapping[str, Wanted | None] | None = None,
               **fields: Any) -> dict[str, Any]:
        """The Proxy's next status: ``phase``, the Ready condition, and other conditions by type
        (``None`` removes one); conditions not named keep theirs, with their transition times."""
        status = {key: value for key, value in proxy.status.items() if key != "conditions"}
        status.update({key: value for key, value in fields.items() if value is not None})
        if phase in (PHASE_PENDING, PHASE_FAILED) and not status.get("providerID"):
            status.pop("ip", None)
            status.pop("endpoint", None)
        if phase not in (PHASE_READY, PHASE_PROVISIONING, PHASE_QUARANTINED):
            status.pop("endpoint", None)
        status["phase"] = phase
        status["observedGeneration"] = proxy.generation
        wanted: dict[str, Wanted | None] = {READY: (ready, reason, message), **(conditions or {})}
        status["conditions"] = merge_conditions(proxy.status.get("conditions"), wanted, self.now(), proxy.generation)
        return status

    def write_status(self, proxy: Proxy, status: dict[str, Any] | Callable[[Proxy], dict[str, Any]]) -> Proxy:
        """Write ``status`` (unless it is what the Proxy has already); a Proxy deleted meanwhile is
        forgotten, not an error. A callable computes the status from the Proxy as stored, again
        after a conflict (a decision made from what another writer has just changed)."""
        def write(current: Proxy) -> Proxy:
            wanted = {**(status(current) if callable(status) else status), "observedGeneration": current.generation}
            if current.status == wanted:
                return current
            current.status = wanted
            try:
                return self.remember(self.store.replace_status(current))
            except Gone:
                self.forget(current)
                return current
        return retry_on_conflict(proxy, write, self._reread, f"{proxy.key}: status update")

    def update_metadata(self, proxy: Proxy, change: Callable[[Proxy], None]) -> Proxy:
        """Apply ``change`` and write it; on a 409, read again and re-apply (never blind-overwrite)."""
        def write(current: Proxy) -> Proxy:
            change(current)
            return self.remember(self.store.replace_metadata(current))
        return retry_on_conflict(proxy, write, self._reread, f"{proxy.key}: metadata update")

    def _reread(self, proxy: Proxy) -> Proxy:
        return self.store.get_proxy(proxy.namespace, proxy.name)

    def remember(self, proxy: Proxy) -> Proxy:
        self.latest[proxy.uid] = proxy
        return proxy

    def forget(self, proxy: Proxy) -> None:
        self.latest.pop(proxy.uid, None)

    # -- decisions every part shares -----------------------------------------------------------

    def ensure_finalizer(self, proxy: Proxy) -> Proxy:
        if proxy.deleting or FINALIZER in proxy.finalizers:
            return proxy
        return self.update_metadata(proxy, lambda p: p.finalizers.append(FINALIZER))

    def release(self, proxy: Proxy) -> None:
        """Remove our finalizer so the API can finish deleting the Proxy."""
        def drop(p: Proxy) -> None:
            p.finalizers = [f for f in p.finalizers if f != FINALIZER]
        try:
            self.update_metadata(proxy, drop)
        except Gone:
            pass
        self.forget(proxy)  # no longer ours to report
        self.backoff.succeeded(proxy.uid)
        if self.purge is not None:
            self.purge({proxy.uid})

    def failed(self, proxy: Proxy, error: ProviderError, reason: str, phase: str | None = None,
               delay: float | None = None) -> None:
        """A provider operation failed for this Proxy: back off by its class, say so once.
        ``delay``: the failure was the provider's (see ``provider_backoff``; 0: a listing, tried
        every sweep), which already decided when to try again; this Proxy's own backoff is left
        as it was."""
        metrics.ERRORS.labels(provider=proxy.provider, error_class=error.error_class.value).inc()
        if delay is None:
            delay = self.backoff.failed(proxy.uid, error.error_class.value)
        message = f"{error} ({f'next attempt in {delay:.0f} s' if delay else 'tried again next sweep'})"
        self.failures[proxy.key] = f"{reason}: {error}"
        log.warning("%s: %s: %s", proxy.key, reason, message, extra={"proxy": proxy.key, "provider": proxy.provider})
        previous = find_condition(proxy.status, READY)
        if previous.get("reason") != reason or not str(previous.get("message", "")).startswith(str(error)):
            # One Event when a failure starts or changes, not one per sweep while it lasts.
            self.store.record_event(proxy, "Warning", reason, message)
        if phase is None:
            phase = PHASE_FAILED if error.error_class is ErrorClass.PERMANENT else (
                PHASE_PROVISIONING if proxy.status.get("providerID") else PHASE_PENDING)
        self.write_status(proxy, self.status(proxy, phase, "False", reason, message))

    def invalid(self, proxy: Proxy, reason: str, message: str) -> None:
        """The Proxy itself is wrong (schema, source): Failed, one Warning Event, nothing else."""
        metrics.ERRORS.labels(provider=proxy.provider, error_class=ErrorClass.PERMANENT.value).inc()
        self.failures[proxy.key] = f"{reason}: {message}"
        previous = find_condition(proxy.status, READY)
        if previous.get("reason") != reason or previous.get("message") != message:
            log.warning("%s: %s: %s", proxy.key, reason, message,
                        extra={"proxy": proxy.key, "provider": proxy.provider})
            self.store.record_event(proxy, "Warning", reason, message)
        self.write_status(proxy, self.status(proxy, PHASE_FAILED, "False", reason, message))
