"""Garbage collection: delete our instances whose Proxy is gone, once older than the grace period.

Called by ``reconcile.Reconciler`` at the end of a sweep, per provider. Never anything without
our owner tag; never on a provider whose listing was incomplete (a partial view could make a live
instance look orphaned); never while the Proxies themselves could not all be read; never an
instance of a Proxy that is present but could not be reconciled (an invalid or defective Proxy
keeps its instance: its uid may be unknown, so its ``namespace/name`` protects it too). A failing
provider only stops collection on itself.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from egress_proxies import metrics
from egress_proxies.providers.client import Instance, Listing, ProviderClient, Target
from egress_proxies.resources import reasons, times
from egress_proxies.resources.proxy import Proxy
from egress_proxies.sources.store import ProxyStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GarbageSettings:
    grace_seconds: float = 600.0
    dry_run: bool = False


class GarbageCollector:
    def __init__(self, store: ProxyStore, settings: GarbageSettings, owner: str,
                 count: Callable[[str, int], None], collected: Callable[[str], None]) -> None:
        self.store = store
        self.settings = settings
        self.owner = owner
        self.count = count
        self.collected = collected

    def collect(self, proxies: Collection[Proxy], unreconciled: Collection[Proxy],
                clients: Mapping[str, ProviderClient], listings: Mapping[str, Listing]) -> None:
        """``unreconciled``: Proxies present but invalid or defective; their instances stay, by uid
        and by ``namespace/name`` (a defective Proxy's uid may be unknown). Only those: a Proxy
        deleted and made again under its name has a new uid, and the old instance is garbage."""
        uids = {p.uid for p in proxies} | {p.uid for p in unreconciled}
        keys = {p.key for p in unreconciled}
        now = times.now()
        for name, listing in listings.items():
            if not listing.complete:
                log.info("garbage collection skipped on provider %s: it could not be listed completely", name)
                continue
            orphans = [i for i in listing.instances if self._orphaned(i, uids, keys, now)]
            if orphans:
                self._delete(clients[name], orphans)

    def _orphaned(self, instance: Instance, uids: set[str], keys: set[str], now: datetime.datetime) -> bool:
        if instance.owner != self.owner or instance.uid in uids or instance.proxy_key in keys:
            return False
        age = times.seconds_since(instance.created, now)
        return age is not None and age >= self.settings.grace_seconds

    def _delete(self, client: ProviderClient, orphans: list[Instance]) -> None:
        dry = "true" if self.settings.dry_run else "false"
        for instance in orphans:
            log.info("garbage collection%s: %s (Proxy %s, uid %s, no longer exists)",
                     " (dry run, not deleting)" if self.settings.dry_run else "", instance.provider_id,
                     instance.proxy_key, instance.uid)
            self.collected(instance.provider_id)
        if self.settings.dry_run:
            metrics.GC_DELETIONS.labels(provider=client.name, dry_run=dry).inc(len(orphans))
            return
        results = client.delete([Target(i.uid or "", i.provider_id) for i in orphans], verb="gc")
        self.count("runner_calls", 1)
        for instance, result in zip(orphans, results, strict=True):
            if result.error is None:
                metrics.GC_DELETIONS.labels(provider=client.name, dry_run=dry).inc()
                self.store.record_event(_former_owner(instance), "Normal", reasons.GARBAGE_COLLECTED,
                                        f"orphaned instance {instance.provider_id} deleted")
            else:
                log.warning("garbage collection of %s failed (%s)", instance.provider_id, result.error)


def _former_owner(instance: Instance) -> Proxy:
    """A stand-in for the deleted Proxy an orphan belonged to, to hang its Event on."""
    namespace, _, name = (instance.proxy_key or "/").partition("/")
    return Proxy(namespace=namespace or "default", name=name or instance.name, uid=instance.uid or "", spec={})
