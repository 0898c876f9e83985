"""The quarantine a crawler asks for: ``POST /v1/proxies/{namespace}/{name}/quarantine``
(``http_server``). It writes the annotation naming the Proxy's current instance, a Warning Event
and a metric; the pool replaces a quarantined member (``pools``) and ``live`` replaces the
instance of a quarantined bare Proxy.
"""

from __future__ import annotations

import logging

from egress_proxies import metrics
from egress_proxies.resources.pool import QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import Proxy
from egress_proxies.sources.store import Gone, ProxyStore, retry_on_conflict

log = logging.getLogger(__name__)


class QuarantineError(Exception):
    """What the crawler must be told, as an HTTP status (404, 409) and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Quarantine:
    """Marks a Proxy's current instance as quarantined."""

    def __init__(self, store: ProxyStore) -> None:
        self.store = store

    def __call__(self, namespace: str, name: str, reason: str, who: str) -> Proxy:
        """The Proxy as written; raises QuarantineError (404, 409) for what the caller must be
        told, and ``StoreError`` when it kept changing under us (try again)."""
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
        if marked:
            metrics.QUARANTINES.labels(namespace=namespace).inc()
            message = f"instance {written.status.get('providerID')} quarantined by {who}: {reason}"
            log.warning("%s: %s", written.key, message, extra={"proxy": written.key, "provider": written.provider})
            self.store.record_event(written, "Warning", "Quarantined", message)
        return written
