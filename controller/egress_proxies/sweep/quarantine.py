"""The quarantine a crawler asks for: ``POST /v1/proxies/{namespace}/{name}/quarantine``
(``http_server``). It writes the annotation naming the Proxy's current instance, a Warning Event
and a metric; the pool replaces a quarantined member (``pools``) and ``live`` replaces the
instance of a quarantined bare Proxy.

Whether the Proxy leaves discovery at once is decided here: a pool member leaves only while its
pool keeps ``minReady`` members discoverable without it (``placement.kept_listed``; the sweep decides
the same from then on). Beyond that it is quarantined all the same (marked, replaced) and stays
listed until its replacement serves, and the answer says so: no burst of quarantines, from any
number of tokens, empties a pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from egress_proxies import metrics
from egress_proxies.resources import reasons
from egress_proxies.resources.pool import QUARANTINE_ANNOTATION, controller_of, pool_of
from egress_proxies.resources.proxy import Proxy
from egress_proxies.sources.store import Gone, ProxyStore, retry_on_conflict
from egress_proxies.sweep.pools import PoolFloor

log = logging.getLogger(__name__)


class QuarantineError(Exception):
    """What the crawler must be told, as an HTTP status (404, 409) and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class QuarantineOutcome:
    """The Proxy as written, and whether it left discovery now (``hidden``), with why (``detail``)."""

    proxy: Proxy
    hidden: bool
    detail: str

    @property
    def provider_id(self) -> str:
        return str(self.proxy.status.get("providerID") or "")

    def answer(self) -> dict[str, Any]:
        """The endpoint's JSON answer."""
        return {"namespace": self.proxy.namespace, "name": self.proxy.name, "providerID": self.provider_id,
                "quarantined": True, "hidden": self.hidden, "detail": self.detail}


class Quarantine:
    """Marks a Proxy's current instance as quarantined.

    ``listed``: what discovery lists now (``loop.Controller.ready_proxies``); ``floors``: each
    pool's floor as of the last sweep (``PoolReconciler.floors``). Without them (a standby, a
    test) every quarantined Proxy leaves discovery at once."""

    def __init__(self, store: ProxyStore, listed: Callable[[], list[Proxy]] | None = None,
                 floors: Callable[[], Mapping[tuple[str, str], PoolFloor]] | None = None) -> None:
        self.store = store
        self.listed = listed
        self.floors = floors
        # (namespace, name) -> providerID hidden here since the listing last showed it: counted out
        # of its pool's discoverable members until a sweep has caught up.
        self._hidden: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def __call__(self, namespace: str, name: str, reason: str, who: str) -> QuarantineOutcome:
        """The outcome; raises QuarantineError (404, 409) for what the caller must be told, and
        ``StoreError`` when the Proxy kept changing under us (try again)."""
        def read(_: Proxy | None = None) -> Proxy:
            try:
                return self.store.get_proxy(namespace, name)
            except Gone:
                raise QuarantineError(404, f"no Proxy {namespace}/{name}") from None

        def mark(proxy: Proxy) -> tuple[Proxy, bool]:
            if proxy.deleting:
                raise QuarantineError(404, f"Proxy {namespace}/{name} is being deleted")
            provider_id = str(proxy.status.get("providerID") or "")
            if not provider_id:
                raise QuarantineError(409, f"Proxy {namespace}/{name} has no instance to quarantine")
            if proxy.annotations.get(QUARANTINE_ANNOTATION) == provider_id:
                return proxy, False  # already: idempotent, no second Event
            proxy.annotations[QUARANTINE_ANNOTATION] = provider_id
            try:
                return self.store.replace_metadata(proxy), True
            except Gone:
                raise QuarantineError(404, f"no Proxy {namespace}/{name}") from None

        written, marked = retry_on_conflict(read(), mark, read, f"quarantine of Proxy {namespace}/{name}")
        hidden, detail = self._hides(written)
        if marked:
            metrics.QUARANTINES.labels(namespace=namespace).inc()
            message = f"instance {written.status.get('providerID')} quarantined by {who}: {reason}; {detail}"
            log.warning("%s: %s", written.key, message, extra={"proxy": written.key, "provider": written.provider})
            self.store.record_event(written, "Warning", reasons.QUARANTINED, message)
        return QuarantineOutcome(written, hidden, detail)

    def _hides(self, proxy: Proxy) -> tuple[bool, str]:
        """Whether the Proxy leaves discovery now: always for a bare Proxy; for a pool member only
        while its pool keeps its floor discoverable without it."""
        pool = pool_of(proxy)
        floor = self.floors().get((proxy.namespace, pool)) if pool and self.floors is not None else None
        if floor is None or self.listed is None or controller_of(proxy) != floor.uid:
            return True, "out of discovery now; its instance is replaced"
        key = (proxy.namespace, proxy.name)
        with self._lock:
            listed = self.listed()
            shown = {(p.namespace, p.name): p.status.get("providerID") for p in listed}
            self._hidden = {k: v for k, v in self._hidden.items() if shown.get(k) == v}
            others = [p for p in listed if p.namespace == proxy.namespace and pool_of(p) == pool
                      and controller_of(p) == floor.uid and p.name != proxy.name
                      and (p.namespace, p.name) not in self._hidden]
            if len(others) >= floor.floor:
                self._hidden[key] = str(proxy.status.get("providerID") or "")
                return True, "out of discovery now; its pool replaces it"
        return False, (f"still listed: its pool {proxy.namespace}/{pool} keeps {floor.floor} member(s) discoverable "
                       f"(minReady) and would have {len(others)} without it; it leaves discovery once its "
                       "replacement serves")
