"""ProxyPool: the resource, its validation and every decision about its members. Pure: no I/O
but reading the ProxyPool CRD's schema once (``schema.pool_spec_errors``).

A pool manages ordinary Proxy objects, Deployment-style: ``pool_reconcile.PoolReconciler`` reads
the pools and their members, asks ``decide`` what to do, and writes it through a ``PoolStore``.
Each member is then reconciled by the existing Proxy path (instances, Serving, privacy,
deletion through the finalizer), so a pool adds no instance machinery of its own.

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
  not counted against the surge, and replaced like a retiring one.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from egress_proxies.resources.proxy import (
    API_VERSION,
    GROUP,
    KIND,
    PHASE_READY,
    CustomObject,
    Proxy,
    condition,
    spec_hash,
)
from egress_proxies.resources.schema import DURATION_PATTERN, pool_spec_errors

POOL_KIND = "ProxyPool"
POOL_PLURAL = "proxypools"
POOL_LABEL = f"{GROUP}/pool"
PLACEMENT_LABEL = f"{GROUP}/pool-placement"
# The last member serial used; written before the members it names are created.
SERIAL_ANNOTATION = f"{GROUP}/pool-serial"
# On a member: why the pool replaces it ("rotation" or "template"); written before its successor
# is created, so a restart continues the same replacement.
RETIRING_ANNOTATION = f"{GROUP}/pool-retiring"
# On any Proxy: the providerID a crawler reported as unusable (banned); set by the quarantine
# endpoint. Only the instance it names is quarantined: a replacement is not.
QUARANTINE_ANNOTATION = f"{GROUP}/quarantine"
POOL_FINALIZER = f"{GROUP}/cleanup"
# On a bare Proxy: "<spec hash>:<n>", how many of its recorded replacements were for quarantine;
# they do not count toward ReplacementsExhausted (a banned IP says nothing about the spec).
QUARANTINE_REPLACEMENTS = f"{GROUP}/quarantine-replacements"
# The Serving-like reason of a quarantined instance (a replacement, an Event and a metric label).
QUARANTINED = "Quarantined"

DEFAULT_FAILOVER_AFTER = 120.0
DEFAULT_MAX_SURGE = 1
DEFAULT_MAX_UNAVAILABLE = 0
DEFAULT_JITTER = 0.1
# Recovery must last this many failoverAfter periods before members move back.
HYSTERESIS_FACTOR = 2.0
TEMPLATE_FORBIDDEN = ("provider", "location")

HEALTHY = "Healthy"
DEGRADED = "Degraded"
RECOVERING = "Recovering"

# The CRD's own pattern (ASCII digits only, as the API server's), so the two never disagree.
_DURATION = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: Any) -> float | None:
    """A Go-style duration ("6h", "1h30m", "90s", "500ms") in seconds; None when it is not one."""
    if not isinstance(text, str) or not _DURATION.match(text):
        return None
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text))


def utc_stamp(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


@dataclass
class Pool(CustomObject[Any]):
    """One ProxyPool object as a source read it (the API's own shape, as plain dicts). Its
    ``defect``: why the source cannot present it now (an unparseable file, malformed metadata):
    it goes Failed with that message, and nothing is created or deleted for it."""

    @classmethod
    def _spec_from(cls, spec: Any, problems: list[str]) -> Any:  # noqa: ARG003 - the base's signature
        # Kept as found: ``parse_spec`` says what is wrong with it, field by field.
        return spec

    @property
    def serial(self) -> int:
        value = self.annotations.get(SERIAL_ANNOTATION, "0")
        return int(value) if value.isdigit() else 0

    @property
    def selector(self) -> str:
        return f"{POOL_LABEL}={self.name}"

    @classmethod
    def from_object(cls, obj: Any) -> Self:
        pool = super().from_object(obj)
        pool.raw = obj if isinstance(obj, dict) else None  # a write sends back what it did not change
        return pool


@dataclass(frozen=True)
class Placement:
    provider: str
    location: str | None = None
    weight: int = 1
    max: int | None = None

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.location}" if self.location else self.provider


@dataclass(frozen=True)
class PoolSpec:
    replicas: int
    template: Mapping[str, Any]
    placements: tuple[Placement, ...]
    max_age_seconds: float | None = None
    max_surge: int = DEFAULT_MAX_SURGE
    max_unavailable: int = DEFAULT_MAX_UNAVAILABLE
    jitter: float = DEFAULT_JITTER
    min_ready: int | None = None
    failover_after_seconds: float = DEFAULT_FAILOVER_AFTER

    def member_spec(self, index: int) -> dict[str, Any]:
        placement = self.placements[index]
        spec = {**self.template, "provider": placement.provider}
        if placement.location:
            spec["location"] = placement.location
        return spec

    @property
    def available_minimum(self) -> int:
        return self.min_ready if self.min_ready is not None else max(0, self.replicas - self.max_unavailable)


def _duration(value: Any, path: str, errors: list[str]) -> float | None:
    """A duration field in seconds (None: omitted, or not one, which the schema reports)."""
    seconds = parse_duration(value) if value is not None else None
    if seconds is not None and seconds <= 0:
        # The schema's pattern admits "0s"; a pattern that does not would be unreadable (RE2,
        # which the API server uses, has no lookahead).
        errors.append(f"{path}: must be a duration greater than 0, such as \"90s\" or \"6h\" (got {value!r})")
        return None
    return seconds


def parse_spec(spec: Any, providers: Sequence[str] | None = None) -> tuple[PoolSpec | None, list[str]]:
    """The typed spec, or every problem as ``<field path>: <what it must be> (got ...)``.

    What each field may hold is the ProxyPool CRD's schema, checked as the API server checks it
    (``schema.pool_spec_errors``); here only what a JSON schema cannot say: rules across fields,
    a template field that the placement owns, a duration of 0. ``providers``: the configured
    provider names (a placement naming another is an error of the pool, not a degraded
    placement: nothing will ever serve there). None: not checked."""
    spec, errors = pool_spec_errors(spec)
    if not isinstance(spec, dict):
        return None, errors
    template = spec.get("template", {})
    for forbidden in TEMPLATE_FORBIDDEN:
        if isinstance(template, dict) and forbidden in template:
            errors.append(f"spec.template.{forbidden}: not allowed: each member's {forbidden} comes from "
                          "spec.placement; move it there")
    found = spec.get("placement")
    entries: list[Any] = found if isinstance(found, list) else []
    for index, entry in enumerate(entries):
        provider = entry.get("provider") if isinstance(entry, dict) else None
        if providers is not None and isinstance(provider, str) and provider and provider not in providers:
            errors.append(f"spec.placement[{index}].provider: {provider!r} is not a configured provider (configured: "
                          f"{', '.join(sorted(providers)) or 'none'}); fix the name or add the provider")
    weights = [entry.get("weight", 1) for entry in entries if isinstance(entry, dict)]
    numbers = [w for w in weights if isinstance(w, int | float)]
    if entries and len(numbers) == len(entries) and not any(w > 0 for w in numbers):
        errors.append("spec.placement: at least one placement needs a weight > 0")
    found = spec.get("rotation", {})
    rotation: dict[str, Any] = found if isinstance(found, dict) else {}
    max_age = _duration(rotation.get("maxAge"), "spec.rotation.maxAge", errors)
    surge = rotation.get("maxSurge", DEFAULT_MAX_SURGE)
    unavailable = rotation.get("maxUnavailable", DEFAULT_MAX_UNAVAILABLE)
    if max_age is not None and surge == 0 and unavailable == 0:
        errors.append("spec.rotation: maxSurge and maxUnavailable cannot both be 0 with maxAge set "
                      "(no member could ever be replaced); set maxSurge: 1")
    failover = _duration(spec.get("failoverAfter"), "spec.failoverAfter", errors)
    if errors:
        return None, errors
    # Valid against the schema: every value below has its type; an omitted one its CRD default.
    placements = tuple(Placement(e["provider"], e.get("location"), int(e.get("weight", 1)),
                                 None if e.get("max") is None else int(e["max"])) for e in entries)
    min_ready = spec.get("minReady")
    return PoolSpec(replicas=int(spec.get("replicas", 0)), template=dict(template), placements=placements,
                    max_age_seconds=max_age, max_surge=int(surge), max_unavailable=int(unavailable),
                    jitter=float(rotation.get("jitter", DEFAULT_JITTER)),
                    min_ready=None if min_ready is None else int(min_ready),
                    failover_after_seconds=DEFAULT_FAILOVER_AFTER if failover is None else failover), []


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


def member_name(pool: Pool, serial: int) -> str:
    """``<pool>-<5 hex>``: deterministic in the pool's uid and the member's serial, so a create
    repeated after a crash names the same member (AlreadyExists), never a second one."""
    suffix = hashlib.sha256(f"{pool.uid}/{serial}".encode()).hexdigest()[:5]
    return f"{pool.name[:253 - 6]}-{suffix}"


def jitter_factor(name: str, jitter: float) -> float:
    """``1 + jitter * u``, ``u`` in [-1, 1] from a hash of the member's name: each member's
    maxAge is its own, stable across restarts, and a pool created at once does not rotate at once."""
    u = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 2 - 1
    return 1 + jitter * u


def member_body(pool: Pool, spec: PoolSpec, index: int, name: str) -> dict[str, Any]:
    """A new member Proxy: labels, the owner reference (the pool controls it) and its spec."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": pool.namespace,
                         "labels": {POOL_LABEL: pool.name, PLACEMENT_LABEL: str(index)},
                         "ownerReferences": [{"apiVersion": API_VERSION, "kind": POOL_KIND, "name": pool.name,
                                              "uid": pool.uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec.member_spec(index)}


def pool_of(proxy: Proxy) -> str | None:
    """The name of the pool this Proxy is a member of (its label), or None for a bare Proxy."""
    return proxy.labels.get(POOL_LABEL) or None


def owned_by(proxy: Proxy, pool: Pool) -> bool:
    """A member of ``pool``: its label, and its owner reference when it has one (a Proxy of a
    deleted pool of the same name is not this pool's)."""
    if proxy.namespace != pool.namespace or pool_of(proxy) != pool.name:
        return False
    owners = proxy.owner_references
    return not owners or any(o.get("kind") == POOL_KIND and o.get("uid") == pool.uid for o in owners)


def controller_of(proxy: Proxy) -> str | None:
    """The uid of the ProxyPool controlling this Proxy (its owner reference), or None."""
    for owner in proxy.owner_references:
        if owner.get("kind") == POOL_KIND and owner.get("controller") and owner.get("uid"):
            return str(owner["uid"])
    return None


def quarantine_replacements(annotations: Mapping[str, str], hash_of_spec: str) -> int:
    recorded, _, count = annotations.get(QUARANTINE_REPLACEMENTS, "").partition(":")
    return int(count) if recorded == hash_of_spec and count.isdigit() else 0


def quarantined(proxy: Proxy) -> bool:
    """Whether the instance the Proxy has now was reported unusable (its replacement is not)."""
    provider_id = proxy.status.get("providerID")
    return bool(provider_id) and proxy.annotations.get(QUARANTINE_ANNOTATION) == provider_id


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
        since = parse_stamp(proxy.status.get("readySince"))
        outdated = placed and index is not None and spec_hash(proxy.spec) != spec_hash(spec.member_spec(index))
        return cls(name=proxy.name, placement=index if placed else None, ready=ready,
                   ready_age=None if since is None or not ready else max(0.0, now - since),
                   quarantined=is_quarantined, retiring=proxy.annotations.get(RETIRING_ANNOTATION) or None,
                   outdated=outdated, created=parse_stamp(proxy.creation_timestamp) or 0.0,
                   egress_ip=str(proxy.status.get("egressIP") or proxy.status.get("ip") or "") or None)


@dataclass
class Decision:
    creates: list[int] = field(default_factory=list)  # placement index of each new member
    deletes: list[str] = field(default_factory=list)
    retire: dict[str, str] = field(default_factory=dict)  # member name -> why
    placements: list[dict[str, Any]] = field(default_factory=list)
    desired: list[int] = field(default_factory=list)
    ready: int = 0
    members: int = 0
    degraded: dict[int, str] = field(default_factory=dict)
    recovered: list[int] = field(default_factory=list)
    newly_degraded: list[int] = field(default_factory=list)
    shortfall: int = 0  # replicas the caps cannot place


def _placement_state(previous: Mapping[str, Any] | None, placement: Placement, broken: str | None,
                     members: Sequence[Member], failover_after: float, now: float) -> dict[str, Any]:
    """One placement's health row, carried over from the last status (so a restart keeps the
    clocks): ``state`` Healthy / Degraded / Recovering since ``since``; ``unreadySince`` while it
    has members and none is Ready."""
    row = dict(previous or {})
    if row.get("provider") != placement.provider or row.get("location") != placement.location:
        row = {}
    ready = sum(1 for m in members if m.ready)
    unready_since = parse_stamp(row.get("unreadySince"))
    unready_since = (unready_since if unready_since is not None else now) if members and ready == 0 else None
    bad_reason = broken
    if bad_reason is None and unready_since is not None and now - unready_since >= failover_after:
        bad_reason = f"no member Ready for {now - unready_since:.0f} s (failoverAfter {failover_after:.0f} s)"
    state = str(row.get("state") or HEALTHY)
    since = parse_stamp(row.get("since")) or now
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
    out: dict[str, Any] = {"provider": placement.provider, "state": state, "since": utc_stamp(since)}
    if placement.location:
        out["location"] = placement.location
    if unready_since is not None:
        out["unreadySince"] = utc_stamp(unready_since)
    if bad_reason is not None:
        out["reason"] = bad_reason
    return out


def decide(spec: PoolSpec, members: Sequence[Member], broken: Mapping[int, str],
           previous: Sequence[Mapping[str, Any]], now: float) -> Decision:
    """Everything the pool does this sweep, from what its members are now.

    ``broken``: placements whose provider cannot be used now, with why. ``previous``: the
    placement rows of the last status (the failover clocks)."""
    decision = Decision()
    count = len(spec.placements)
    # A member whose provider cannot be used or listed is not counted ready, whatever its last
    # status says: nothing vouches for it now (the failover must not wait a sweep for its Proxy).
    members = [dataclasses.replace(m, ready=False, ready_age=None) if m.placement in broken else m
               for m in members]
    weights = [p.weight for p in spec.placements]
    caps = [p.max for p in spec.placements]
    desired = split(spec.replicas, weights, caps)
    decision.desired = desired
    decision.shortfall = spec.replicas - sum(desired)
    by_placement: list[list[Member]] = [[] for _ in range(count)]
    strays: list[Member] = []
    for member in members:
        (by_placement[member.placement] if member.placement is not None else strays).append(member)

    rows = []
    for i, placement in enumerate(spec.placements):
        before = previous[i] if i < len(previous) else None
        row = _placement_state(before, placement, broken.get(i), by_placement[i], spec.failover_after_seconds, now)
        if row["state"] == DEGRADED:
            decision.degraded[i] = str(row.get("reason") or "degraded")
            if (before or {}).get("state") != DEGRADED:
                decision.newly_degraded.append(i)
        elif row["state"] == HEALTHY and (before or {}).get("state") in (DEGRADED, RECOVERING):
            decision.recovered.append(i)
        rows.append(row)
    # A recovering placement still counts as degraded for the spread: members move back only
    # after the hysteresis, never on the first good sweep.
    unhealthy = {i for i, row in enumerate(rows) if row["state"] != HEALTHY}

    ready_total = sum(1 for m in members if m.ready)
    decision.ready = ready_total
    decision.members = len(members)

    def active(i: int, retiring: Mapping[str, str]) -> list[Member]:
        return [m for m in by_placement[i] if not m.quarantined and not m.retiring and m.name not in retiring]

    # Failover: the unhealthy placements' shortfall, on the healthy ones, within maxSurge.
    degraded = {i for i, row in enumerate(rows) if row["state"] == DEGRADED}
    shortfall = sum(max(0, desired[i] - sum(1 for m in active(i, {}) if m.ready)) for i in degraded)
    healthy_weights = [w if i not in unhealthy else 0 for i, w in enumerate(weights)]
    room_caps = [None if c is None else max(0, c - desired[i]) for i, c in enumerate(caps)]
    extras = split(min(shortfall, spec.max_surge), healthy_weights, room_caps)
    target = [desired[i] + extras[i] for i in range(count)]
    # A recovering placement's share stays held elsewhere until the hysteresis has passed: the
    # extra members are neither deleted nor re-created on its first good sweeps.
    held = shortfall + sum(desired[i] for i in unhealthy - degraded)
    keep = [desired[i] + extra for i, extra in enumerate(split(min(held, spec.max_surge), healthy_weights,
                                                               room_caps))]

    # Rotation (and a template change): only from a pool at full strength, within the surge left.
    cap_total = sum(desired) + spec.max_surge
    # What the surge bounds: members that serve or may serve where placements are healthy. Those
    # of an unhealthy placement are kept but not counted, or members a rotation had just started
    # there when its provider died (never ready, never to be) would block the refill for good.
    counted = [m for m in members if not m.quarantined and (m.placement is None or m.placement not in unhealthy)]
    need = sum(max(0, target[i] - len(active(i, {}))) for i in range(count) if i not in unhealthy)
    room = cap_total - len(counted) - need
    if ready_total >= spec.replicas and not unhealthy:
        due: list[tuple[float, Member, str]] = []
        for i in range(count):
            for member in active(i, {}):
                if member.outdated:
                    due.append((-math.inf, member, "template"))
                elif (spec.max_age_seconds is not None and member.ready and member.ready_age is not None
                      and member.ready_age >= spec.max_age_seconds * jitter_factor(member.name, spec.jitter)):
                    due.append((-member.ready_age, member, "rotation"))
        due.sort(key=lambda item: (item[0], item[1].name))
        # With surge room, make before break; without (maxSurge 0), maxUnavailable lets one go first.
        slots = room if room > 0 else min(spec.max_unavailable, ready_total - spec.available_minimum)
        slots = min(slots, spec.max_surge + spec.max_unavailable - sum(1 for m in members if m.retiring))
        for _, member, why in due[:max(0, slots)]:
            decision.retire[member.name] = why
    retiring = dict(decision.retire)

    # Creates: what each healthy placement lacks, within the pool's total.
    room = cap_total - len(counted)
    for i in range(count):
        if i in unhealthy:
            continue
        lacking = max(0, target[i] - len(active(i, retiring)))
        take = min(lacking, max(0, room))
        decision.creates.extend([i] * take)
        room -= take

    # Deletes, never below what must stay ready.
    floor_ready = max(0, spec.replicas - spec.max_unavailable)
    ready_left = ready_total
    for i in range(count):
        current = active(i, retiring)
        ready_here = sum(1 for m in current if m.ready)
        leaving = [m for m in by_placement[i] if m.quarantined or m.retiring or m.name in retiring]
        for member in sorted(leaving, key=lambda m: (m.ready, m.created, m.name)):
            after = ready_left - (1 if member.ready else 0)
            replaced = ready_here >= target[i] or i in unhealthy
            early = (spec.max_unavailable > 0 and (member.retiring or member.name in retiring)
                     and after >= spec.available_minimum)
            if (replaced or early) and after >= floor_ready:
                decision.deletes.append(member.name)
                ready_left = after
        # Scale down (and failback): not-ready members first, then the newest.
        excess = len(current) - max(target[i], keep[i])
        if excess > 0 and i not in unhealthy:
            for member in sorted(current, key=lambda m: (m.ready, -m.created, m.name))[:excess]:
                after = ready_left - (1 if member.ready else 0)
                if not member.ready or after >= spec.replicas:
                    decision.deletes.append(member.name)
                    ready_left = after
    for member in sorted(strays, key=lambda m: (m.ready, -m.created, m.name)):
        after = ready_left - (1 if member.ready else 0)
        if not member.ready or after >= spec.replicas:
            decision.deletes.append(member.name)
            ready_left = after

    for i, row in enumerate(rows):
        row.update(desired=max(target[i], min(keep[i], len(by_placement[i]))), members=len(by_placement[i]),
                   ready=sum(1 for m in by_placement[i] if m.ready))
    decision.placements = rows
    return decision


def pool_status(pool: Pool, spec: PoolSpec, decision: Decision, members: Sequence[Member],
                previous: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The pool's next status; condition transition times move only when a status does."""
    stamp = utc_stamp(now)
    ready = decision.ready
    available = ready >= spec.available_minimum
    busy = bool(decision.creates or decision.deletes or decision.retire) or any(
        m.retiring or m.quarantined for m in members) or len(members) != spec.replicas or ready < spec.replicas
    degraded = sorted(decision.degraded)
    conditions = {
        "Available": ("True" if available else "False", "MinimumReplicasAvailable" if available
                      else "MinimumReplicasUnavailable",
                      f"{ready} of {spec.replicas} replicas ready (at least {spec.available_minimum} needed)"),
        "Progressing": ("True", "Reconciling" if busy else "Complete",
                        (f"{len(decision.creates)} to create, {len(decision.deletes)} to delete, "
                         f"{sum(1 for m in members if m.retiring) + len(decision.retire)} retiring"
                         if busy else "every member is in place and ready")),
        "PlacementDegraded": (("True", "PlacementDegraded", "; ".join(
            f"placement[{i}] {spec.placements[i].label}: {decision.degraded[i]}" for i in degraded))
            if degraded else ("False", "AllPlacementsServing", "every placement can serve")),
    }
    if decision.shortfall:
        conditions["Available"] = (conditions["Available"][0], conditions["Available"][1],
                                   conditions["Available"][2] + f"; the placements' max allow only "
                                   f"{spec.replicas - decision.shortfall} of {spec.replicas}")
    return {
        "phase": "Ready" if available and not busy else "Progressing" if available or busy else "Degraded",
        "replicas": len(members), "readyReplicas": ready, "desiredReplicas": spec.replicas,
        "placements": decision.placements,
        "egressIPs": len({m.egress_ip for m in members if m.ready and m.egress_ip}),
        "selector": pool.selector, "observedGeneration": pool.generation,
        "conditions": merge_conditions(previous.get("conditions"), conditions, stamp, pool.generation),
    }


def failed_status(pool: Pool, errors: Sequence[str], members: int, now: float) -> dict[str, Any]:
    """An invalid pool: Failed, its members left as they are (nothing is created or deleted)."""
    message = "; ".join(errors)
    conditions = {"Available": ("False", "InvalidSpec", message),
                  "Progressing": ("False", "InvalidSpec", "nothing is done until the spec is fixed")}
    previous = pool.status
    return {**{k: v for k, v in previous.items() if k in ("replicas", "readyReplicas", "placements", "egressIPs")},
            "phase": "Failed", "replicas": members, "selector": pool.selector,
            "observedGeneration": pool.generation,
            "conditions": merge_conditions(previous.get("conditions"), conditions, utc_stamp(now), pool.generation)}


def merge_conditions(previous: Any, wanted: Mapping[str, tuple[str, str, str]], stamp: str,
                     generation: int) -> list[dict[str, Any]]:
    old = {c.get("type"): c for c in previous or [] if isinstance(c, dict)}
    result = []
    for kind, (status, reason, message) in wanted.items():
        before = old.get(kind) or {}
        transition = before.get("lastTransitionTime") if before.get("status") == status else None
        result.append(condition(kind, status, reason, message, str(transition or stamp), generation))
    return result


class PoolStore(Protocol):
    """What a source must offer for pools, beside ``store.ProxyStore`` (both sources implement it)."""

    def list_pools(self) -> list[Pool]:
        """Every ProxyPool (a deleted one that still has members is presented as deleting)."""

    def create_proxy(self, namespace: str, body: dict[str, Any]) -> None:
        """Create a member Proxy; raises store.Conflict when one of that name exists."""

    def delete_proxy(self, namespace: str, name: str) -> None:
        """Delete a member Proxy (through its finalizer); one already gone is success."""

    def replace_pool_status(self, pool: Pool) -> Pool:
        """Write the pool's status (optimistic: raises Conflict on a stale resourceVersion)."""

    def replace_pool_metadata(self, pool: Pool) -> Pool:
        """Write the pool's annotations and finalizers (optimistic, as above)."""

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, message: str) -> None:
        """Emit an Event about the pool (best effort: never raises)."""
