"""The pools' part of a sweep: the I/O around ``placement``'s decisions.

``PoolReconciler.reconcile`` runs early in every sweep (``reconcile.Reconciler``), after the
providers are listed and before the Proxies are reconciled, so it sees this sweep's listing
failures and a member it creates gets its instance in the same sweep. Every
pool is handled on its own: a malformed one goes Failed alone (a condition naming the field and
the fix), an exception on one is logged and recorded on it, and the others and every Proxy go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egress_proxies import metrics
from egress_proxies.resources import reasons
from egress_proxies.resources.conditions import AVAILABLE, find_condition
from egress_proxies.resources.pool import (
    POOL_LABEL,
    QUARANTINE_ANNOTATION,
    RETIRING_ANNOTATION,
    RETIRING_ROTATION,
    SERIAL_ANNOTATION,
    Pool,
    PoolSpec,
    controller_of,
    foreign,
    member_body,
    member_name,
    owned_by,
    parse_spec,
)
from egress_proxies.resources.proxy import FINALIZER, Proxy
from egress_proxies.resources.schema import identity_errors, spec_errors
from egress_proxies.serving.discovery import Floors, PoolFloor
from egress_proxies.sources.store import Conflict, Gone, PoolStore, ProxyStore, StoreError, retry_on_conflict
from egress_proxies.sweep.containment import Containment
from egress_proxies.sweep.placement import Budget, Decision, Member, decide, interleaved
from egress_proxies.sweep.pool_status import failed_status, pool_status

log = logging.getLogger(__name__)


# Member creates and deletes per sweep, all pools together, unless told: one round of create
# batches at the default batch size (``cli`` passes --batch-size times the batches run side by side).
DEFAULT_STEP = 200


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
            return (f"provider {provider} is not in the provider config (configured: "
                    f"{', '.join(sorted(self.configured)) or 'none'})")
        if provider in self.failing:
            why, seconds = self.failing[provider]
            if seconds >= failover_after:
                return f"provider {provider} cannot be listed for {seconds:.0f} s ({why})"
        return None


def _valid_spec(pool: Pool) -> tuple[PoolSpec | None, list[str]]:
    """The pool's typed spec, or every problem with it (its defect, its namespace and name, its
    fields, its template). A bad name fails the pool before anything is written: members are
    named after it (files, for the directory source)."""
    spec, errors = (None, [pool.defect]) if pool.defect else parse_spec(pool.spec)
    identity = identity_errors(pool.namespace, pool.name)
    if spec is not None:
        # The template is a Proxy spec: checked against the Proxy CRD's own schema, as every
        # member will be, so a bad template fails the pool once instead of every member.
        sample = Proxy(namespace=pool.namespace, name=pool.name, uid="", spec=spec.member_spec(0))
        errors = [e.replace("spec.", "spec.template.", 1) for e in spec_errors(sample)]
    errors = identity + errors
    return (spec if not errors else None), errors


def pool_floors(pools: Sequence[Pool]) -> dict[tuple[str, str], PoolFloor]:
    """Each pool's floor for discovery, as a sweep records it: a deleting or invalid pool has none."""
    floors: dict[tuple[str, str], PoolFloor] = {}
    for pool in pools:
        spec, _ = _valid_spec(pool)
        if spec is not None and not pool.deleting:
            floors[(pool.namespace, pool.name)] = PoolFloor(pool.uid, spec.available_minimum)
    return floors


def _broken(spec: PoolSpec, health: ProviderHealth) -> dict[int, str]:
    """The placements whose provider cannot be used now, with why."""
    return {i: why for i, placement in enumerate(spec.placements)
            if (why := health.broken(placement.provider, spec.failover_after_seconds)) is not None}


def _previous_placements(pool: Pool) -> list[dict[str, Any]]:
    """The placement rows of the pool's last status (the failover clocks)."""
    found = pool.status.get("placements")
    return [row for row in found if isinstance(row, dict)] if isinstance(found, list) else []


def _deleted_why(proxy: Proxy | None) -> str:
    """Why a member is deleted, for its event: quarantined, retiring (and why), or scaled down."""
    return ("quarantined" if proxy is not None and proxy.annotations.get(QUARANTINE_ANNOTATION) else
            proxy.annotations.get(RETIRING_ANNOTATION) if proxy is not None else None) or "scaled down"


class PoolReconciler:
    def __init__(self, pools: PoolStore, proxies: ProxyStore, now: Callable[[], float] = time.time,
                 step: int = DEFAULT_STEP) -> None:
        self.pools = pools
        self.proxies = proxies
        self.now = now
        self.step = step
        self.containment = Containment("pool")
        self.failed: dict[str, str] = {}  # pool key -> why, this sweep
        # (namespace, pool name) -> its floor, as of the last sweep: read by discovery and by the
        # quarantine endpoint from other threads (replaced whole, never changed in place).
        self.floors: Mapping[tuple[str, str], PoolFloor] = {}
        # (pool uid, Proxy uid) of the Proxies reported as carrying a pool's label without being its
        # members: one Event each while that lasts, not one per sweep.
        self._foreign: set[tuple[str, str]] = set()
        self._sweeps = 0

    def read_floors(self) -> Floors:
        """Each pool's floor read from the source now, for a process that does not sweep (a
        standby's stored view); the last ones read (or swept) when the pools cannot be listed."""
        try:
            self.floors = pool_floors(self.pools.list_pools())
        except StoreError as error:
            log.debug("pools could not be listed for discovery's floors: %s", error)
        return self.floors

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
        budget = Budget(self.step)
        changed = self._orphans(pools, proxies, budget)
        self._report_foreign(pools, proxies)
        floors: dict[tuple[str, str], PoolFloor] = {}
        # Each sweep starts the step at another pool, so no pool waits behind a big one for long.
        self._sweeps += 1
        start = self._sweeps % len(pools) if pools else 0
        for pool in [*pools[start:], *pools[:start]]:
            def step(pool: Pool = pool) -> None:
                nonlocal changed
                changed |= self._reconcile_pool(pool, proxies, health, budget, floors)

            def record_crash(signature: str, pool: Pool = pool) -> None:
                self._write_status(pool, failed_status(
                    pool, [f"the controller failed on this pool ({signature}); see its log"], 0, self.now()))

            def failed(why: str, key: str = pool.key) -> None:
                self.failed[key] = why

            self.containment.run(f"pool {pool.key}", pool.uid, step, failed=failed, record_crash=record_crash)
        self.floors = floors
        if budget.left <= 0:
            log.info("pools: %d member creates and deletes this sweep (the step); the rest follow next sweep",
                     self.step)
        return changed

    # -- one pool ------------------------------------------------------------------------------

    def _reconcile_pool(self, pool: Pool, proxies: Sequence[Proxy], health: ProviderHealth, budget: Budget,
                        floors: dict[tuple[str, str], PoolFloor]) -> bool:
        members = [p for p in proxies if owned_by(p, pool)]
        if pool.deleting:
            return self._delete_all(pool, members, budget)
        if FINALIZER not in pool.finalizers:
            pool = self._update_metadata(pool, lambda p: p.finalizers.append(FINALIZER))
        spec, errors = _valid_spec(pool)
        now = self.now()
        if spec is None:
            self._fail(pool, errors, len(members), now)
            return False
        floors[(pool.namespace, pool.name)] = PoolFloor(pool.uid, spec.available_minimum)
        live = [p for p in members if not p.deleting]
        views = [Member.of(p, spec, now) for p in live]
        decision = decide(spec, views, _broken(spec, health), _previous_placements(pool), now)
        # The step: what this sweep does of it (the status says what is left to do).
        decision.creates = budget.take(interleaved(decision.creates))
        decision.deletes = budget.take(decision.deletes)
        return self._apply(pool, spec, decision, live, views, now)

    def _fail(self, pool: Pool, errors: Sequence[str], members: int, now: float) -> None:
        """An invalid pool: Failed, with an event when its message changes; nothing else is written."""
        self.failed[pool.key] = "; ".join(errors)
        before = find_condition(pool.status, AVAILABLE)
        status = failed_status(pool, errors, members, now)
        if before.get("message") != "; ".join(errors):
            log.warning("pool %s is invalid: %s", pool.key, "; ".join(errors))
            self.pools.record_pool_event(pool, "Warning", reasons.INVALID_SPEC, "; ".join(errors))
        self._write_status(pool, status)

    def _apply(self, pool: Pool, spec: PoolSpec, decision: Decision, live: Sequence[Proxy],
               views: Sequence[Member], now: float) -> bool:
        """Write what ``decide`` decided: events, retiring marks, creates, deletes, status and
        metrics. True when a member was created or deleted."""
        by_name = {p.name: p for p in live}
        self._record_placement_health(pool, spec, decision)
        for name, why in decision.retire.items():
            self._mark_retiring(by_name[name], why)
            reason = reasons.ROTATING if why == RETIRING_ROTATION else reasons.UPDATING
            self.pools.record_pool_event(pool, "Normal", reason,
                                         f"member {name} is replaced ({why}); it stays until its successor is "
                                         "ready")
        # Deletes before creates: ``decide`` used the surge the deletes free, so the other order
        # would overshoot replicas + maxSurge between the two (and after a crash between them).
        for name in decision.deletes:
            self.pools.delete_proxy(pool.namespace, name)
            self.pools.record_pool_event(pool, "Normal", reasons.MEMBER_DELETED,
                                         f"member {name} deleted ({_deleted_why(by_name.get(name))})")
        if decision.creates:
            pool = self._create_members(pool, spec, decision.creates)
        status = pool_status(pool, spec, decision, views, pool.status, now)
        metrics.POOL_DESIRED.labels(namespace=pool.namespace, pool=pool.name).set(spec.replicas)
        metrics.POOL_READY.labels(namespace=pool.namespace, pool=pool.name).set(decision.ready)
        if decision.degraded:
            self.failed[pool.key] = "; ".join(f"placement[{i}] {spec.placements[i].label}: {why}"
                                              for i, why in sorted(decision.degraded.items()))
        self._write_status(pool, status)
        return bool(decision.creates or decision.deletes)

    def _record_placement_health(self, pool: Pool, spec: PoolSpec, decision: Decision) -> None:
        """An event for each placement degraded or recovered this sweep."""
        for i in decision.newly_degraded:
            self.pools.record_pool_event(pool, "Warning", reasons.PLACEMENT_DEGRADED,
                                         f"placement[{i}] {spec.placements[i].label}: {decision.degraded[i]}; "
                                         f"its shortfall goes to the other placements (maxSurge {spec.max_surge})")
        for i in decision.recovered:
            self.pools.record_pool_event(pool, "Normal", reasons.PLACEMENT_RECOVERED,
                                         f"placement[{i}] {spec.placements[i].label} serves again; members "
                                         "move back")

    def _create_members(self, pool: Pool, spec: PoolSpec, placements: Sequence[int]) -> Pool:
        """One new member on each of ``placements``; the pool as its serial annotation left it."""
        # The serials are recorded before the creates: a crash in between re-creates the same
        # names (AlreadyExists: they exist), never a second member under another name.
        first = pool.serial + 1
        last = pool.serial + len(placements)
        pool = self._update_metadata(pool, lambda p: p.annotations.__setitem__(SERIAL_ANNOTATION, str(last)))
        for serial, index in zip(range(first, last + 1), placements, strict=True):
            name = member_name(pool, serial)
            try:
                self.pools.create_proxy(pool.namespace, member_body(pool, spec, index, name))
            except Conflict:
                log.info("pool %s: member %s exists already (a create repeated after a restart)", pool.key,
                         name)
        self.pools.record_pool_event(pool, "Normal", reasons.MEMBERS_CREATED, f"{len(placements)} member(s) created")
        return pool

    def _report_foreign(self, pools: Sequence[Pool], proxies: Sequence[Proxy]) -> None:
        """A Proxy that carries a pool's label but was not created by a pool (no ProxyPool owner
        reference): never adopted, scaled down or deleted, and reported on the pool once."""
        seen: set[tuple[str, str]] = set()
        for pool in pools:
            for proxy in proxies:
                if not foreign(proxy, pool):
                    continue
                seen.add((pool.uid, proxy.uid))
                if (pool.uid, proxy.uid) in self._foreign:
                    continue
                message = (f"Proxy {proxy.key} carries the label {POOL_LABEL}={pool.name} but this pool did not "
                           "create it (no ownerReference to it): it is not a member and is left alone; remove the "
                           "label, or delete it and let the pool make its own")
                log.warning("pool %s: %s", pool.key, message)
                self.pools.record_pool_event(pool, "Warning", reasons.FOREIGN_PROXY, message)
        self._foreign = seen

    def _orphans(self, pools: Sequence[Pool], proxies: Sequence[Proxy], budget: Budget) -> bool:
        """Members whose pool is gone (deleted before the controller saw it, or its record lost):
        deleted through their finalizer, as a garbage collector would; the emulator and the
        directory source have none, and a cluster's may be slow."""
        present = {(p.namespace, p.uid) for p in pools}
        orphans = [p for p in proxies if (owner := controller_of(p)) is not None and not p.deleting
                   and (p.namespace, owner) not in present]
        deleted = False
        for proxy in budget.take(orphans):
            owner = controller_of(proxy)
            try:
                self.pools.delete_proxy(proxy.namespace, proxy.name)
            except StoreError as error:
                log.warning("%s: its pool is gone, but deleting it failed: %s", proxy.key, error)
                continue
            log.info("%s: its pool (uid %s) is gone: deleted", proxy.key, owner)
            deleted = True
        return deleted

    def _delete_all(self, pool: Pool, members: Sequence[Proxy], budget: Budget) -> bool:
        """A deleting pool: its members go through their own deletion path, a step a sweep; the
        pool's finalizer is released once none is left (the emulator, like a cluster without GC,
        relies on this)."""
        for member in budget.take([m for m in members if not m.deleting]):
            self.pools.delete_proxy(member.namespace, member.name)
        if not members and FINALIZER in pool.finalizers:
            def drop(p: Pool) -> None:
                p.finalizers = [f for f in p.finalizers if f != FINALIZER]
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
        def write(current: Pool) -> Pool:
            change(current)
            return self.pools.replace_pool_metadata(current)
        return retry_on_conflict(pool, write, self._reread, f"pool {pool.key}: metadata update")

    def _write_status(self, pool: Pool, status: dict[str, Any]) -> None:
        def write(current: Pool) -> None:
            wanted = {**status, "observedGeneration": current.generation}
            if current.status != wanted:
                current.status = wanted
                self.pools.replace_pool_status(current)
        retry_on_conflict(pool, write, self._reread, f"pool {pool.key}: status update")

    def _reread(self, pool: Pool) -> Pool:
        for candidate in self.pools.list_pools():
            if candidate.uid == pool.uid:
                return candidate
        raise Gone(pool.key)

    def _mark_retiring(self, proxy: Proxy, why: str) -> None:
        def write(current: Proxy) -> None:
            current.annotations[RETIRING_ANNOTATION] = why
            self.proxies.replace_metadata(current)
        retry_on_conflict(proxy, write, lambda p: self.proxies.get_proxy(p.namespace, p.name),
                          f"member {proxy.key}: marking it retiring")
