"""A ProxyPool's status: what ``placement.decide`` decided, and what its members are, as the
status ``pools.PoolReconciler`` writes (docs/contract.md, "The ProxyPool resource", "Status").
Pure, like the decision it renders; condition transition times move only when a status does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from egress_proxies.resources import reasons, times
from egress_proxies.resources.conditions import (
    AVAILABLE,
    DISTINCT_EGRESS_IPS,
    PLACEMENT_DEGRADED,
    PROGRESSING,
    Wanted,
    merge_conditions,
)
from egress_proxies.resources.pool import Pool, PoolSpec
from egress_proxies.sweep.placement import Decision, Member


def pool_status(pool: Pool, spec: PoolSpec, decision: Decision, members: Sequence[Member],
                previous: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The pool's next status, from this sweep's decision and the members it was made from."""
    stamp = times.stamp(now)
    ready = decision.ready
    available = ready >= spec.available_minimum
    busy = bool(decision.creates or decision.deletes or decision.retire) or any(
        m.retiring or m.quarantined for m in members) or len(members) != spec.replicas or ready < spec.replicas
    degraded = sorted(decision.degraded)
    conditions = {
        AVAILABLE: ("True" if available else "False", reasons.MINIMUM_REPLICAS_AVAILABLE if available
                    else reasons.MINIMUM_REPLICAS_UNAVAILABLE,
                    f"{ready} of {spec.replicas} replicas ready (at least {spec.available_minimum} needed)"),
        PROGRESSING: ("True", reasons.RECONCILING if busy else reasons.COMPLETE,
                      (f"{len(decision.creates)} to create, {len(decision.deletes)} to delete, "
                       f"{sum(1 for m in members if m.retiring) + len(decision.retire)} retiring"
                       if busy else "every member is in place and ready")),
        PLACEMENT_DEGRADED: (("True", reasons.PLACEMENT_DEGRADED, "; ".join(
            f"placement[{i}] {spec.placements[i].label}: {decision.degraded[i]}" for i in degraded))
            if degraded else ("False", reasons.ALL_PLACEMENTS_SERVING, "every placement can serve")),
    }
    if spec.distinct_egress_ips:
        conditions[DISTINCT_EGRESS_IPS] = _distinct_egress_condition(decision.shared_egress)
    if decision.shortfall:
        conditions[AVAILABLE] = (conditions[AVAILABLE][0], conditions[AVAILABLE][1],
                                 conditions[AVAILABLE][2] + f"; the placements' max allow only "
                                 f"{spec.replicas - decision.shortfall} of {spec.replicas}")
    return {
        "phase": "Ready" if available and not busy else "Progressing" if available or busy else "Degraded",
        "replicas": len(members), "readyReplicas": ready, "desiredReplicas": spec.replicas,
        "placements": decision.placements,
        "egressIPs": len({m.egress_ip for m in members if m.ready and m.egress_ip}),
        "selector": pool.selector, "observedGeneration": pool.generation,
        "conditions": merge_conditions(previous.get("conditions"), conditions, stamp, pool.generation),
    }


def _distinct_egress_condition(shared: Mapping[str, str]) -> Wanted:
    if not shared:
        return "True", reasons.EGRESS_IPS_DISTINCT, "every ready member leaves from an egress address of its own"
    return "False", reasons.EGRESS_IP_SHARED, (
        "; ".join(f"{name} {why}" for name, why in sorted(shared.items()))
        + ": not counted ready until it leaves from an address of its own (give its host more source addresses, "
        "or place the pool where each proxy gets one: KVM route or bridge hosts, more hosts)")


def failed_status(pool: Pool, errors: Sequence[str], members: int, now: float) -> dict[str, Any]:
    """An invalid pool: Failed, its members left as they are (nothing is created or deleted)."""
    message = "; ".join(errors)
    conditions = {AVAILABLE: ("False", reasons.INVALID_SPEC, message),
                  PROGRESSING: ("False", reasons.INVALID_SPEC, "nothing is done until the spec is fixed")}
    previous = pool.status
    return {**{k: v for k, v in previous.items() if k in ("replicas", "readyReplicas", "placements", "egressIPs")},
            "phase": "Failed", "replicas": members, "selector": pool.selector,
            "observedGeneration": pool.generation,
            "conditions": merge_conditions(previous.get("conditions"), conditions, times.stamp(now), pool.generation)}
