"""The quarantine a crawler asks for: ``POST /v1/proxies/{namespace}/{name}/quarantine``
(``http_server``). It writes the annotation naming the Proxy's current instance, a Warning Event
and a metric; the pool replaces a quarantined member (``pools``) and ``live`` replaces the
instance of a quarantined bare Proxy.

Whether the Proxy leaves discovery at once is decided by the view (``DiscoveryView.hide``): a
pool member leaves only while its pool keeps ``minReady`` members discoverable without it (the
sweep decides the same from then on: ``discovery.handed_out``). Beyond that it is quarantined all
the same (marked, replaced) and stays listed until its replacement serves, and the answer says
so: no burst of quarantines, from any number of tokens, empties a pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from egress_proxies import metrics
from egress_proxies.resources import reasons
from egress_proxies.resources.pool import QUARANTINE_ANNOTATION, pool_of
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.sources.store import Gone, ProxyStore, retry_on_conflict

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
    """Marks a Proxy's current instance as quarantined, and takes it out of ``discovery`` at once
    where its pool's floor allows (``DiscoveryView.hide``)."""

    def __init__(self, store: ProxyStore, discovery: DiscoveryView) -> None:
        self.store = store
        self.discovery = discovery

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
        while its pool keeps its floor discoverable without it. Why, for the answer."""
        hiding = self.discovery.hide(proxy)
        if hiding.floor is None:
            return True, "out of discovery now; its instance is replaced"
        if hiding.hidden:
            return True, "out of discovery now; its pool replaces it"
        return False, (f"still listed: its pool {proxy.namespace}/{pool_of(proxy)} keeps {hiding.floor.floor} "
                       f"member(s) discoverable (minReady) and would have {hiding.others} without it; it leaves "
                       "discovery once its replacement serves")
