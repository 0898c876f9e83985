"""The pools' part of a sweep, and the quarantine a crawler asks for: the I/O around ``pools``.

``PoolReconciler.reconcile`` runs early in every sweep (``reconcile.Reconciler``), after the
providers are listed and before the Proxies are reconciled, so it sees this sweep's listing
failures and a member it creates gets its instance in the same sweep. Every
pool is handled on its own: a malformed one goes Failed alone (a condition naming the field and
the fix), an exception on one is logged and recorded on it, and the others and every Proxy go on.

``Quarantine`` is what ``POST /v1/proxies/{namespace}/{name}/quarantine`` does (``http``): the
annotation naming the Proxy's current instance, a Warning Event and a metric. The pool replaces
a quarantined member; ``live`` replaces the instance of a quarantined bare Proxy.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egress_proxies import metrics
from egress_proxies.resources.pool import (
    POOL_FINALIZER,
    QUARANTINE_ANNOTATION,
    RETIRING_ANNOTATION,
    SERIAL_ANNOTATION,
    Member,
    Pool,
    PoolStore,
    controller_of,
    decide,
    failed_status,
    member_body,
    member_name,
    owned_by,
    parse_spec,
    pool_status,
)
from egress_proxies.resources.proxy import Proxy
from egress_proxies.resources.schema import validation_errors
from egress_proxies.sources.store import Conflict, Gone, ProxyStore, StoreError

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class ProviderHealth:
    """What the sweep knows of the providers: configured names, invalid sections, and the
    providers whose listing is failing, with why and for how long (seconds, this sweep's
    listing included)."""

    configured: Sequence[str]
    invalid: Mapping[str, str]
    failing: Mapping[str, tuple[str, float]] = field(default_factory=dict)

    def broken(self, provider: str, failover_after: float) -> str | None:
        """Why a placement on ``provider`` cannot be used now, or None. A listing that fails
        counts once it has failed for ``failover_after``, as a placement whose members are not
        Ready does: one failed listing (an API blip) must not create a member elsewhere and
        delete it again after the hysteresis. Until then the members' own status stands (the
        live path keeps a Ready Proxy Ready for a bounded time while its provider cannot be
        listed, and the serving probe keeps testing it)."""
        if provider in self.invalid:
            return f"provider {provider} cannot be used: its section of the provider config is invalid"
        if provider not in self.configured:
            return f"provider {provider} is not configured"
        if provider in self.failing:
            why, seconds = self.failing[provider]
            if seconds >= failover_after:
                return f"provider {provider} cannot be listed for {seconds:.0f} s ({why})"
        return None


class PoolReconciler:
    def __init__(self, pools: PoolStore, proxies: ProxyStore, now: Callable[[], float] = time.time) -> None:
        self.pools = pools
        self.proxies = proxies
        self.now = now
        self._crashes: dict[str, str] = {}
        self.failed: dict[str, str] = {}  # pool key -> why, this sweep

    def reconcile(self, proxies: Sequence[Proxy], health: ProviderHealth) -> bool:
        """One pass over every pool; True when a member was created or deleted (list again)."""
        self.failed = {}
        try:
            pools = self.pools.list_pools()
        except StoreError as error:
            # The pools cannot be read: nothing about them is decided, the Proxies go on.
            log.warning("pools could not be listed: %s", error)
            self.failed["*"] = str(error)
            return False
        changed = self._orphans(pools, proxies)
        for pool in pools:
            try:
                changed |= self._one(pool, proxies, health)
            except Gone:
                continue
            except StoreError as error:
                log.warning("pool %s: %s", pool.key, error)
                self.failed[pool.key] = str(error)
            except Exception as error:  # noqa: BLE001 - one pool's bug stays with that pool
                signature = f"{type(error).__name__}: {error}"
                if self._crashes.get(pool.uid) != signature:
                    self._crashes[pool.uid] = signature
                    log.error("pool %s: unexpected error (contained to this pool):\n%s", pool.key,
                              traceback.format_exc())
                self.failed[pool.key] = signature
                try:
                    self._write_status(pool, failed_status(
                        pool, [f"the controller failed on this pool ({signature}); see its log"], 0, self.now()))
                except Exception:
                    log.debug("pool %s: could not record the internal error", pool.key, exc_info=True)
        return changed

    # -- one pool ------------------------------------------------------------------------------

    def _one(self, pool: Pool, proxies: Sequence[Proxy], health: ProviderHealth) -> bool:
        members = [p for p in proxies if owned_by(p, pool)]
        if pool.deleting:
            return self._delete_all(pool, members)
        if POOL_FINALIZER not in pool.finalizers:
            pool = self._update_metadata(pool, lambda p: p.finalizers.append(POOL_FINALIZER))
        spec, errors = (None, [pool.defect]) if pool.defect else parse_spec(pool.spec, list(health.configured))
        if spec is not None:
            # The template is a Proxy spec: checked against the Proxy CRD's own schema, as every
            # member will be, so a bad template fails the pool once instead of every member.
            sample = Proxy(namespace=pool.namespace, name=pool.name, uid="", spec=spec.member_spec(0))
            errors = [e.replace("spec.", "spec.template.", 1) for e in validation_errors(sample)]
            spec = spec if not errors else None
        now = self.now()
        if spec is None:
            self.failed[pool.key] = "; ".join(errors)
            before = next((c for c in pool.status.get("conditions") or [] if isinstance(c, dict)
                           and c.get("type") == "Available"), {})
            status = failed_status(pool, errors, len(members), now)
            if before.get("message") != "; ".join(errors):
                log.warning("pool %s is invalid: %s", pool.key, "; ".join(errors))
                self.pools.record_pool_event(pool, "Warning", "InvalidSpec", "; ".join(errors))
            self._write_status(pool, status)
            return False
        live = [p for p in members if not p.deleting]
        views = [Member.of(p, spec, now) for p in live]
        broken = {i: why for i, placement in enumerate(spec.placements)
                  if (why := health.broken(placement.provider, spec.failover_after_seconds)) is not None}
        found = pool.status.get("placements")
        previous = [row for row in found if isinstance(row, dict)] if isinstance(found, list) else []
        decision = decide(spec, views, broken, previous, now)
        by_name = {p.name: p for p in live}

        for i in decision.newly_degraded:
            self.pools.record_pool_event(pool, "Warning", "PlacementDegraded",
                                         f"placement[{i}] {spec.placements[i].label}: {decision.degraded[i]}; "
                                         f"its shortfall goes to the other placements (maxSurge {spec.max_surge})")
        for i in decision.recovered:
            self.pools.record_pool_event(pool, "Normal", "PlacementRecovered",
                                         f"placement[{i}] {spec.placements[i].label} serves again; members "
                                         "move back")
        for name, why in decision.retire.items():
            self._mark_retiring(by_name[name], why)
            self.pools.record_pool_event(pool, "Normal", "Rotating" if why == "rotation" else "Updating",
                                         f"member {name} is replaced ({why}); it stays until its successor is "
                                         "ready")
        if decision.creates:
            # The serials are recorded before the creates: a crash in between re-creates the same
            # names (AlreadyExists: they exist), never a second member under another name.
            first = pool.serial + 1
            last = pool.serial + len(decision.creates)
            pool = self._update_metadata(pool, lambda p: p.annotations.__setitem__(SERIAL_ANNOTATION, str(last)))
            for serial, index in zip(range(first, last + 1), decision.creates, strict=True):
                name = member_name(pool, serial)
                try:
                    self.pools.create_proxy(pool.namespace, member_body(pool, spec, index, name))
                except Conflict:
                    log.info("pool %s: member %s exists already (a create repeated after a restart)", pool.key,
                             name)
            self.pools.record_pool_event(pool, "Normal", "MembersCreated",
                                         f"{len(decision.creates)} member(s) created")
        for name in decision.deletes:
            self.pools.delete_proxy(pool.namespace, name)
            proxy = by_name.get(name)
            why = ("quarantined" if proxy is not None and proxy.annotations.get(QUARANTINE_ANNOTATION) else
                   proxy.annotations.get(RETIRING_ANNOTATION) if proxy is not None else None) or "scaled down"
            self.pools.record_pool_event(pool, "Normal", "MemberDeleted", f"member {name} deleted ({why})")
        status = pool_status(pool, spec, decision, views, pool.status, now)
        metrics.POOL_DESIRED.labels(namespace=pool.namespace, pool=pool.name).set(spec.replicas)
        metrics.POOL_READY.labels(namespace=pool.namespace, pool=pool.name).set(decision.ready)
        if decision.degraded:
            self.failed[pool.key] = "; ".join(f"placement[{i}] {spec.placements[i].label}: {why}"
                                              for i, why in sorted(decision.degraded.items()))
        self._write_status(pool, status)
        return bool(decision.creates or decision.deletes)

    def _orphans(self, pools: Sequence[Pool], proxies: Sequence[Proxy]) -> bool:
        """Members whose pool is gone (deleted before the controller saw it, or its record lost):
        deleted through their finalizer, as a garbage collector would; the emulator and the
        directory source have none, and a cluster's may be slow."""
        present = {(p.namespace, p.uid) for p in pools}
        deleted = False
        for proxy in proxies:
            owner = controller_of(proxy)
            if owner is None or proxy.deleting or (proxy.namespace, owner) in present:
                continue
            try:
                self.pools.delete_proxy(proxy.namespace, proxy.name)
            except StoreError as error:
                log.warning("%s: its pool is gone, but deleting it failed: %s", proxy.key, error)
                continue
            log.info("%s: its pool (uid %s) is gone: deleted", proxy.key, owner)
            deleted = True
        return deleted

    def _delete_all(self, pool: Pool, members: Sequence[Proxy]) -> bool:
        """A deleting pool: its members go through their own deletion path; the pool's finalizer is
        released once none is left (the emulator, like a cluster without GC, relies on this)."""
        for member in members:
            if not member.deleting:
                self.pools.delete_proxy(member.namespace, member.name)
        if not members and POOL_FINALIZER in pool.finalizers:
            def drop(p: Pool) -> None:
                p.finalizers = [f for f in p.finalizers if f != POOL_FINALIZER]
            try:
                self._update_metadata(pool, drop)
            except Gone:
                pass
            for gauge in (metrics.POOL_DESIRED, metrics.POOL_READY):
                try:
                    gauge.remove(pool.namespace, pool.name)
                except KeyError:
                    pass  # never published (an invalid pool)
        return bool(members)

    # -- writes, optimistic ------------------------------------------------------------------

    def _update_metadata(self, pool: Pool, change: Callable[[Pool], None]) -> Pool:
        for _ in range(CONFLICT_RETRIES):
            change(pool)
            try:
                return self.pools.replace_pool_metadata(pool)
            except Conflict:
                pool = self._fresh(pool)
        raise StoreError(f"pool {pool.key}: metadata update kept conflicting; retried next sweep")

    def _write_status(self, pool: Pool, status: dict[str, Any]) -> None:
        for _ in range(CONFLICT_RETRIES):
            if pool.status == status:
                return
            pool.status = status
            try:
                self.pools.replace_pool_status(pool)
                return
            except Conflict:
                pool = self._fresh(pool)
                status = {**status, "observedGeneration": pool.generation}
        raise StoreError(f"pool {pool.key}: status update kept conflicting; retried next sweep")

    def _fresh(self, pool: Pool) -> Pool:
        for candidate in self.pools.list_pools():
            if candidate.uid == pool.uid:
                return candidate
        raise Gone(pool.key)

    def _mark_retiring(self, proxy: Proxy, why: str) -> None:
        for _ in range(CONFLICT_RETRIES):
            proxy.annotations[RETIRING_ANNOTATION] = why
            try:
                self.proxies.replace_metadata(proxy)
                return
            except Conflict:
                proxy = self.proxies.get_proxy(proxy.namespace, proxy.name)
        raise StoreError(f"member {proxy.key}: marking it retiring kept conflicting; retried next sweep")


# -- quarantine ------------------------------------------------------------------------------------

class QuarantineError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Quarantine:
    """Marks a Proxy's current instance as quarantined (``http``'s POST .../quarantine)."""

    def __init__(self, store: ProxyStore) -> None:
        self.store = store

    def __call__(self, namespace: str, name: str, reason: str, who: str) -> Proxy:
        """Returns the Proxy as written; raises QuarantineError (404, 409) for what the caller
        must be told."""
        for _ in range(CONFLICT_RETRIES):
            try:
                proxy = self.store.get_proxy(namespace, name)
            except Gone:
                raise QuarantineError(404, f"no Proxy {namespace}/{name}") from None
            if proxy.deleting:
                raise QuarantineError(404, f"Proxy {namespace}/{name} is being deleted")
            provider_id = str(proxy.status.get("providerID") or "")
            if not provider_id:
                raise QuarantineError(409, f"Proxy {namespace}/{name} has no instance to quarantine")
            if proxy.annotations.get(QUARANTINE_ANNOTATION) == provider_id:
                return proxy  # already: idempotent, no second Event
            proxy.annotations[QUARANTINE_ANNOTATION] = provider_id
            try:
                written = self.store.replace_metadata(proxy)
            except Conflict:
                continue
            except Gone:
                raise QuarantineError(404, f"no Proxy {namespace}/{name}") from None
            metrics.QUARANTINES.labels(namespace=namespace).inc()
            message = f"instance {provider_id} quarantined by {who}: {reason}"
            log.warning("%s: %s", proxy.key, message, extra={"proxy": proxy.key, "provider": proxy.provider})
            self.store.record_event(written, "Warning", "Quarantined", message)
            return written
        raise QuarantineError(503, f"Proxy {namespace}/{name} kept changing; try again")
