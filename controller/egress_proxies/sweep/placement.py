"""What a ProxyPool does this sweep: the pure decision that ``pools.PoolReconciler`` applies, as
``verdict`` is the Proxy's. From the pool's spec and what its members are now, ``decide`` returns
the members to create (by placement), to delete and to mark retiring, and each placement's
health row; ``pool_status`` makes the status of it. It reads nothing but its arguments and writes
nothing; tests/controller/sweep/test_placement.py pins it with a table and a simulated world.

The decisions (docs/architecture.md, "Pools"):

- **Spread**: ``split`` gives each placement its largest-remainder share of ``replicas`` by
  weight, capped by its ``max`` (what a capped placement cannot take goes to the others).
- **Failover**: a placement is degraded when its provider cannot be used (invalid section, not
  configured, listing failed) or it has members and none has been Ready for ``failoverAfter``.
  Its shortfall is made up on the healthy placements, at most ``maxSurge`` extra members in
  total; its own members are kept (they may recover). It counts as healthy again only after
  ``2 x failoverAfter`` of continuous health (hysteresis, its ``since`` kept in status, so a
  restart keeps it); then the extra members elsewhere go, newest first, only while
  ``readyReplicas`` stays at least ``replicas``.
- **Rotation**: a member Ready longer than ``maxAge * (1 + jitter * u)`` (``u`` in [-1, 1] from a
  hash of its name: deterministic, and spread over the pool) is marked retiring and replaced
  make-before-break by a new member (within ``maxSurge``); the retiring member is deleted once
  its replacement is Ready and never so that ``readyReplicas < replicas - maxUnavailable``.
  A member built from an older template is rotated the same way.
- **Quarantine**: a member whose quarantine annotation names its current instance is not ready,
  not counted against the surge, and replaced like a retiring one. Discovery keeps listing as
  many quarantined members as the pool needs to keep ``minReady`` discoverable (``discovery.kept_listed``),
  so no burst of quarantines empties a pool: each leaves once its replacement serves.
- **Steps**: a sweep creates and deletes at most a bounded number of members (``Budget``), so a
  fill of thousands goes in steps of the size of one round of create batches, and every sweep
  keeps its pace for the other Proxies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egress_proxies.resources import times
from egress_proxies.resources.pool import (
    PLACEMENT_LABEL,
    RETIRING_ANNOTATION,
    RETIRING_ROTATION,
    RETIRING_TEMPLATE,
    Placement,
    PoolSpec,
    quarantined,
)
from egress_proxies.resources.proxy import PHASE_READY, Proxy, spec_hash

# A placement's state in the pool's status (``placements[].state``).
HEALTHY = "Healthy"
DEGRADED = "Degraded"
RECOVERING = "Recovering"
# Recovery must last this many failoverAfter periods before members move back.
HYSTERESIS_FACTOR = 2.0


def split(total: int, weights: Sequence[int], caps: Sequence[int | None]) -> list[int]:
    """``total`` spread by ``weights`` with the largest-remainder method, each share capped by
    its cap; what a capped entry cannot take goes to the others. Ties go to the earlier entry.
    The sum is less than ``total`` only when the caps allow no more."""
    result = [0] * len(weights)
    remaining = total
    active = [i for i, weight in enumerate(weights) if weight > 0 and caps[i] != 0]
    while remaining > 0 and active:
        weight_sum = sum(weights[i] for i in active)
        quotas = {i: remaining * weights[i] / weight_sum for i in active}
        shares = {i: math.floor(quotas[i]) for i in active}
        left = remaining - sum(shares.values())
        for i in sorted(active, key=lambda i: (-(quotas[i] - shares[i]), i))[:left]:
            shares[i] += 1
        assigned = 0
        for i in active:
            cap = caps[i]
            give = shares[i] if cap is None else min(shares[i], cap - result[i])
            result[i] += give
            assigned += give
        remaining -= assigned
        active = [i for i in active if caps[i] is None or result[i] < (caps[i] or 0)]
        if assigned == 0:
            break
    return result


def jitter_factor(name: str, jitter: float) -> float:
    """``1 + jitter * u``, ``u`` in [-1, 1] from a hash of the member's name: each member's
    maxAge is its own, stable across restarts, and a pool created at once does not rotate at once."""
    u = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 2 - 1
    return 1 + jitter * u


@dataclass
class Budget:
    """How many members a sweep may still create and delete, all pools together (``--batch-size``
    times the create batches a provider runs side by side: one round of them). A fill of
    thousands goes in steps, each sweep keeps its pace, and the other Proxies are served
    between them; what a step leaves out, the next sweep's decision asks for again."""

    left: int

    def take(self, wanted: Sequence[Any]) -> list[Any]:
        granted = list(wanted[:max(0, self.left)])
        self.left -= len(granted)
        return granted


def interleaved(placements: Sequence[int]) -> list[int]:
    """New members' placements taken round-robin (``[0, 0, 1, 1, 2]`` -> ``[0, 1, 2, 0, 1]``): a
    step cut short of a fill still spreads over the providers, whose creates run side by side."""
    queues: dict[int, int] = {}
    for index in placements:
        queues[index] = queues.get(index, 0) + 1
    out: list[int] = []
    while queues:
        for index in sorted(queues):
            out.append(index)
            queues[index] -= 1
        queues = {index: count for index, count in queues.items() if count}
    return out


@dataclass(frozen=True)
class Member:
    """What the decisions need of one member."""

    name: str
    placement: int | None
    ready: bool
    ready_age: float | None = None
    quarantined: bool = False
    retiring: str | None = None
    outdated: bool = False
    created: float = 0.0
    egress_ip: str | None = None

    @classmethod
    def of(cls, proxy: Proxy, spec: PoolSpec, now: float) -> Member:
        label = proxy.labels.get(PLACEMENT_LABEL, "")
        index = int(label) if label.isdigit() and int(label) < len(spec.placements) else None
        placed = index is not None and (proxy.spec.get("provider") == spec.placements[index].provider
                                        and proxy.spec.get("location") == spec.placements[index].location)
        is_quarantined = quarantined(proxy)
        ready = proxy.status.get("phase") == PHASE_READY and not is_quarantined and not proxy.deleting
        since = times.epoch_seconds(proxy.status.get("readySince"))
        outdated = placed and index is not None and spec_hash(proxy.spec) != spec_hash(spec.member_spec(index))
        return cls(name=proxy.name, placement=index if placed else None, ready=ready,
                   ready_age=None if since is None or not ready else max(0.0, now - since),
                   quarantined=is_quarantined, retiring=proxy.annotations.get(RETIRING_ANNOTATION) or None,
                   outdated=outdated, created=times.epoch_seconds(proxy.creation_timestamp) or 0.0,
                   egress_ip=str(proxy.status.get("egressIP") or proxy.status.get("ip") or "") or None)


@dataclass
class Decision:
    """What ``decide`` decided for one pool this sweep (``pools.PoolReconciler`` may cut its creates
    and deletes to the sweep's ``Budget``)."""

    creates: list[int] = field(default_factory=list)  # placement index of each new member
    deletes: list[str] = field(default_factory=list)
    retire: dict[str, str] = field(default_factory=dict)  # member name -> RETIRING_ROTATION or RETIRING_TEMPLATE
    placements: list[dict[str, Any]] = field(default_factory=list)
    desired: list[int] = field(default_factory=list)
    ready: int = 0
    members: int = 0
    degraded: dict[int, str] = field(default_factory=dict)
    recovered: list[int] = field(default_factory=list)
    newly_degraded: list[int] = field(default_factory=list)
    shortfall: int = 0  # replicas the caps cannot place
    shared_egress: dict[str, str] = field(default_factory=dict)  # member name -> whose egress address it shares


def _placement_state(previous: Mapping[str, Any] | None, placement: Placement, broken: str | None,
                     members: Sequence[Member], failover_after: float, now: float) -> dict[str, Any]:
    """One placement's health row, carried over from the last status (so a restart keeps the
    clocks): ``state`` Healthy / Degraded / Recovering since ``since``; ``unreadySince`` while it
    has members and none is Ready."""
    row = dict(previous or {})
    if row.get("provider") != placement.provider or row.get("location") != placement.location:
        row = {}
    ready = sum(1 for m in members if m.ready)
    unready_since = times.epoch_seconds(row.get("unreadySince"))
    unready_since = (unready_since if unready_since is not None else now) if members and ready == 0 else None
    bad_reason = broken
    if bad_reason is None and unready_since is not None and now - unready_since >= failover_after:
        bad_reason = f"no member Ready for {now - unready_since:.0f} s (failoverAfter {failover_after:.0f} s)"
    state = str(row.get("state") or HEALTHY)
    since = times.epoch_seconds(row.get("since")) or now
    if bad_reason is not None:
        if state != DEGRADED:
            state, since = DEGRADED, now
    elif state in (DEGRADED, RECOVERING):
        # Healthy again needs a member serving (or none to have), continuously, for the hysteresis.
        if members and ready == 0:
            state, since = (DEGRADED, since) if state == DEGRADED else (DEGRADED, now)
        elif state == DEGRADED:
            state, since = RECOVERING, now
        elif now - since >= HYSTERESIS_FACTOR * failover_after:
            state, since = HEALTHY, now
    out: dict[str, Any] = {"provider": placement.provider, "state": state, "since": times.stamp(since)}
    if placement.location:
        out["location"] = placement.location
    if unready_since is not None:
        out["unreadySince"] = times.stamp(unready_since)
    if bad_reason is not None:
        out["reason"] = bad_reason
    return out


@dataclass(frozen=True)
class _Shares:
    """How many members each placement should have this sweep (lists by placement index)."""

    desired: list[int]  # its share of ``replicas``
    target: list[int]  # that, plus the failover extras it takes now
    keep: list[int]  # what it may keep: extras still held for a placement that is recovering
    unhealthy: frozenset[int]  # degraded or recovering: it takes no members, and loses none to a scale-down


def _vouched(members: Sequence[Member], broken: Mapping[int, str]) -> list[Member]:
    """A member whose provider cannot be used or listed is not counted ready, whatever its last
    status says: nothing vouches for it now (the failover must not wait a sweep for its Proxy)."""
    return [dataclasses.replace(m, ready=False, ready_age=None) if m.placement in broken else m for m in members]


def _grouped(members: Sequence[Member], count: int) -> tuple[list[list[Member]], list[Member]]:
    """The members of each placement, and the strays (placed by no placement of the spec now)."""
    by_placement: list[list[Member]] = [[] for _ in range(count)]
    strays: list[Member] = []
    for member in members:
        (by_placement[member.placement] if member.placement is not None else strays).append(member)
    return by_placement, strays


def _staying(member: Member, retiring: Mapping[str, str]) -> bool:
    """Serving on, or to serve: neither quarantined nor retiring (marked, or now)."""
    return not member.quarantined and not member.retiring and member.name not in retiring


def _active(members: Sequence[Member], retiring: Mapping[str, str]) -> list[Member]:
    return [m for m in members if _staying(m, retiring)]


def _previous_row(previous: Sequence[Mapping[str, Any]], index: int) -> Mapping[str, Any] | None:
    return previous[index] if index < len(previous) else None


def _placement_rows(spec: PoolSpec, grouped: Sequence[Sequence[Member]], broken: Mapping[int, str],
                    previous: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """Each placement's health row this sweep."""
    return [_placement_state(_previous_row(previous, i), placement, broken.get(i), grouped[i],
                             spec.failover_after_seconds, now) for i, placement in enumerate(spec.placements)]


def _health_changes(rows: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]]
                    ) -> tuple[dict[int, str], list[int], list[int]]:
    """The degraded placements with why, those degraded since the last status, and those healthy
    again since it."""
    degraded: dict[int, str] = {}
    newly_degraded: list[int] = []
    recovered: list[int] = []
    for i, row in enumerate(rows):
        before = _previous_row(previous, i) or {}
        if row["state"] == DEGRADED:
            degraded[i] = str(row.get("reason") or "degraded")
            if before.get("state") != DEGRADED:
                newly_degraded.append(i)
        elif row["state"] == HEALTHY and before.get("state") in (DEGRADED, RECOVERING):
            recovered.append(i)
    return degraded, newly_degraded, recovered


def _shares(spec: PoolSpec, grouped: Sequence[Sequence[Member]], rows: Sequence[Mapping[str, Any]]) -> _Shares:
    """Spread and failover: each placement's share of ``replicas``, and the unhealthy placements'
    shortfall made up on the healthy ones, within maxSurge."""
    weights = [p.weight for p in spec.placements]
    caps = [p.max for p in spec.placements]
    desired = split(spec.replicas, weights, caps)
    # A recovering placement still counts as degraded for the spread: members move back only
    # after the hysteresis, never on the first good sweep.
    unhealthy = {i for i, row in enumerate(rows) if row["state"] != HEALTHY}
    degraded = {i for i, row in enumerate(rows) if row["state"] == DEGRADED}
    shortfall = sum(max(0, desired[i] - sum(1 for m in _active(grouped[i], {}) if m.ready)) for i in degraded)
    healthy_weights = [w if i not in unhealthy else 0 for i, w in enumerate(weights)]
    room_caps = [None if c is None else max(0, c - desired[i]) for i, c in enumerate(caps)]
    extras = split(min(shortfall, spec.max_surge), healthy_weights, room_caps)
    # A recovering placement's share stays held elsewhere until the hysteresis has passed: the
    # extra members are neither deleted nor re-created on its first good sweeps.
    held = shortfall + sum(desired[i] for i in unhealthy - degraded)
    kept = split(min(held, spec.max_surge), healthy_weights, room_caps)
    return _Shares(desired=desired, target=[d + extra for d, extra in zip(desired, extras, strict=True)],
                   keep=[d + extra for d, extra in zip(desired, kept, strict=True)], unhealthy=frozenset(unhealthy))


def _surge_room(spec: PoolSpec, members: Sequence[Member], shares: _Shares) -> int:
    """How many more members the surge allows: what it bounds is the members that serve or may
    serve where placements are healthy. Those of an unhealthy placement are kept but not counted,
    or members a rotation had just started there when its provider died (never ready, never to
    be) would block the refill for good."""
    counted = [m for m in members if not m.quarantined and (m.placement is None or m.placement not in shares.unhealthy)]
    return sum(shares.desired) + spec.max_surge - len(counted)


def _due(spec: PoolSpec, grouped: Sequence[Sequence[Member]]) -> list[tuple[Member, str]]:
    """The members due for replacement, with why, first due first: an older template first, then
    the longest Ready past its maxAge."""
    due: list[tuple[float, Member, str]] = []
    for here in grouped:
        for member in _active(here, {}):
            if member.outdated:
                due.append((-math.inf, member, RETIRING_TEMPLATE))
            elif (spec.max_age_seconds is not None and member.ready and member.ready_age is not None
                  and member.ready_age >= spec.max_age_seconds * jitter_factor(member.name, spec.jitter)):
                due.append((-member.ready_age, member, RETIRING_ROTATION))
    due.sort(key=lambda item: (item[0], item[1].name))
    return [(member, why) for _, member, why in due]


def _retire(spec: PoolSpec, members: Sequence[Member], grouped: Sequence[Sequence[Member]], shares: _Shares,
            room: int) -> dict[str, str]:
    """Rotation (and a template change): which members to mark retiring, with why; only from a
    pool at full strength, within the surge left."""
    ready_total = sum(1 for m in members if m.ready)
    if ready_total < spec.replicas or shares.unhealthy:
        return {}
    need = sum(max(0, shares.target[i] - len(_active(here, {}))) for i, here in enumerate(grouped))
    room -= need
    # With surge room, make before break; without (maxSurge 0), maxUnavailable lets one go first.
    slots = room if room > 0 else min(spec.max_unavailable, ready_total - spec.available_minimum)
    slots = min(slots, spec.max_surge + spec.max_unavailable - sum(1 for m in members if m.retiring))
    return {member.name: why for member, why in _due(spec, grouped)[:max(0, slots)]}


def _creates(grouped: Sequence[Sequence[Member]], shares: _Shares, retiring: Mapping[str, str],
             room: int) -> list[int]:
    """The placement of each new member: what each healthy placement lacks, within the pool's total."""
    creates: list[int] = []
    for i, here in enumerate(grouped):
        if i in shares.unhealthy:
            continue
        lacking = max(0, shares.target[i] - len(_active(here, retiring)))
        take = min(lacking, max(0, room))
        creates.extend([i] * take)
        room -= take
    return creates


def _delete_leaving(spec: PoolSpec, leaving: Sequence[Member], replaced: bool, retiring: Mapping[str, str],
                    ready_left: int) -> tuple[list[str], int]:
    """Which quarantined and retiring members go now, never below what must stay ready; and the
    ready members left after them."""
    floor_ready = max(0, spec.replicas - spec.max_unavailable)
    gone: list[str] = []
    for member in sorted(leaving, key=lambda m: (m.ready, m.created, m.name)):
        after = ready_left - (1 if member.ready else 0)
        early = (spec.max_unavailable > 0 and (member.retiring or member.name in retiring)
                 and after >= spec.available_minimum)
        if (replaced or early) and after >= floor_ready:
            gone.append(member.name)
            ready_left = after
    return gone, ready_left


def _scale_down(candidates: Sequence[Member], excess: int, replicas: int, ready_left: int) -> tuple[list[str], int]:
    """Which ``excess`` members go: not-ready members first, then the newest, a ready one only
    while ``replicas`` stay ready; and the ready members left after them."""
    gone: list[str] = []
    for member in sorted(candidates, key=lambda m: (m.ready, -m.created, m.name))[:excess]:
        after = ready_left - (1 if member.ready else 0)
        if not member.ready or after >= replicas:
            gone.append(member.name)
            ready_left = after
    return gone, ready_left


def _deletes(spec: PoolSpec, grouped: Sequence[Sequence[Member]], strays: Sequence[Member], shares: _Shares,
             retiring: Mapping[str, str], ready_total: int) -> list[str]:
    """The members to delete, placement by placement (the replaced ones, then a scale-down or
    failback), then the strays; never below what must stay ready."""
    deletes: list[str] = []
    ready_left = ready_total
    for i, here in enumerate(grouped):
        current = _active(here, retiring)
        ready_here = sum(1 for m in current if m.ready)
        leaving = [m for m in here if not _staying(m, retiring)]
        replaced = ready_here >= shares.target[i] or i in shares.unhealthy
        gone, ready_left = _delete_leaving(spec, leaving, replaced, retiring, ready_left)
        deletes += gone
        excess = len(current) - max(shares.target[i], shares.keep[i])
        if excess > 0 and i not in shares.unhealthy:
            gone, ready_left = _scale_down(current, excess, spec.replicas, ready_left)
            deletes += gone
    gone, _ = _scale_down(strays, len(strays), spec.replicas, ready_left)
    return deletes + gone


def _final_rows(rows: list[dict[str, Any]], grouped: Sequence[Sequence[Member]], shares: _Shares
                ) -> list[dict[str, Any]]:
    """The placement rows of the status: health, plus what each should have, has, and has ready."""
    for i, row in enumerate(rows):
        here = grouped[i]
        row.update(desired=max(shares.target[i], min(shares.keep[i], len(here))), members=len(here),
                   ready=sum(1 for m in here if m.ready))
    return rows


def decide(spec: PoolSpec, members: Sequence[Member], broken: Mapping[int, str],
           previous: Sequence[Mapping[str, Any]], now: float) -> Decision:
    """Everything the pool does this sweep, from what its members are now.

    ``broken``: placements whose provider cannot be used now, with why. ``previous``: the
    placement rows of the last status (the failover clocks)."""
    members = _vouched(members, broken)
    members, shared_egress = _distinct_egress(members) if spec.distinct_egress_ips else (list(members), {})
    grouped, strays = _grouped(members, len(spec.placements))
    rows = _placement_rows(spec, grouped, broken, previous, now)
    degraded, newly_degraded, recovered = _health_changes(rows, previous)
    shares = _shares(spec, grouped, rows)
    ready = sum(1 for m in members if m.ready)
    # What goes now (a successor serves, a scale-down) goes first: the surge it frees is used in
    # the same sweep, so a rotation or a template change replaces maxSurge members a sweep, not
    # every other sweep.
    deletes = _deletes(spec, grouped, strays, shares, {}, ready)
    staying = [m for m in members if m.name not in deletes]
    kept, kept_strays = _grouped(staying, len(spec.placements))
    room = _surge_room(spec, staying, shares)
    retire = _retire(spec, staying, kept, shares, room)
    ready_left = sum(1 for m in staying if m.ready)
    return Decision(creates=_creates(kept, shares, retire, room),
                    deletes=deletes + _deletes(spec, kept, kept_strays, shares, retire, ready_left), retire=retire,
                    placements=_final_rows(rows, grouped, shares), desired=shares.desired, ready=ready,
                    members=len(members), degraded=degraded, recovered=recovered, newly_degraded=newly_degraded,
                    shortfall=spec.replicas - sum(shares.desired), shared_egress=shared_egress)


def _distinct_egress(members: Sequence[Member]) -> tuple[list[Member], dict[str, str]]:
    """With distinctEgressIPs: of the ready members leaving from one egress address, the one
    Ready longest keeps counting ready; the others are not ready for the pool (so no
    rotation starts and readyReplicas says what the origins see) until they get one of their own."""
    holders: dict[str, str] = {}
    shared: dict[str, str] = {}
    for member in sorted(members, key=lambda m: (-(m.ready_age or 0.0), m.created, m.name)):
        if not member.ready or not member.egress_ip:
            continue
        holder = holders.setdefault(member.egress_ip, member.name)
        if holder != member.name:
            shared[member.name] = f"leaves from {member.egress_ip}, as {holder} does"
    return [dataclasses.replace(m, ready=False, ready_age=None) if m.name in shared else m for m in members], shared
