"""sweep/placement.py: a ProxyPool's decision, pure -- the split, a table of single sweeps (what
the members are, what ``decide`` must do), then failover with its hysteresis, rotation bounds and
quarantine over many sweeps; and sweep/pool_status.py, the status made of it.

The many-sweep tests drive ``decide`` through a small simulated world (members appear not ready
and become ready a few sweeps later, deletions take effect at once) so a bound like "ready never
below replicas - maxUnavailable" is checked on every sweep, not at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from egress_proxies.resources.pool import POOL_LABEL, Placement, Pool, PoolSpec
from egress_proxies.sweep.placement import (
    DEGRADED,
    HEALTHY,
    RECOVERING,
    Budget,
    Decision,
    Member,
    decide,
    interleaved,
    jitter_factor,
    split,
)
from egress_proxies.sweep.pool_status import pool_status

# -- the split -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("total", "weights", "caps", "expected"), [
    (6, [2, 1], [None, None], [4, 2]),
    (7, [1, 1, 1], [None, None, None], [3, 2, 2]),
    (1, [1, 1], [None, None], [1, 0]),  # a tie goes to the earlier placement
    (5, [2, 1], [None, None], [3, 2]),  # remainders 0.33 and 0.67: the larger one wins
    (6, [1, 1], [2, None], [2, 4]),  # what a capped placement cannot take goes to the others
    (6, [1, 1], [2, 1], [2, 1]),  # the caps allow no more: the sum is short
    (4, [0, 1], [None, None], [0, 4]),  # weight 0 takes nothing
    (0, [1, 1], [None, None], [0, 0]),
])
def test_split_is_largest_remainder_by_weight_capped(total: int, weights: list[int], caps: list[int | None],
                                                      expected: list[int]) -> None:
    assert split(total, weights, caps) == expected


# -- the decision, case by case --------------------------------------------------------------------

# Three replicas over placements a (weight 2) and b (weight 1): shares [2, 1].
TABLE_SPEC = PoolSpec(replicas=3, template={}, placements=(Placement("a", "h1", 2), Placement("b", "h2", 1)),
                      max_age_seconds=300.0, jitter=0.0, failover_after_seconds=60.0)


def member(name: str, placement: int | None, ready: bool = True, age: float = 100.0, created: float = 0.0,
           **flags: Any) -> Member:
    return Member(name, placement, ready=ready, ready_age=age if ready else None, created=created, **flags)


SETTLED = [member("a1", 0, created=1.0), member("a2", 0, created=2.0), member("b1", 1, created=3.0)]


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    members: list[Member]
    creates: list[int]  # the placement of each new member
    deletes: list[str] = dataclasses.field(default_factory=list)
    retire: dict[str, str] = dataclasses.field(default_factory=dict)
    broken: dict[int, str] = dataclasses.field(default_factory=dict)
    spec: PoolSpec = TABLE_SPEC
    degraded: dict[int, str] = dataclasses.field(default_factory=dict)
    shortfall: int = 0


CASES = [
    Case("an empty pool fills by weight", [], creates=[0, 0, 1]),
    Case("a settled pool does nothing", SETTLED, creates=[]),
    Case("one too many: a member not ready goes first",
         [*SETTLED, member("a3", 0, ready=False, created=9.0)], creates=[], deletes=["a3"]),
    Case("one too many, all ready: the newest goes, replicas stay ready",
         [*SETTLED, member("a3", 0, created=4.0), member("a0", 0, created=0.5)], creates=[], deletes=["a3", "a2"]),
    Case("a stray (no placement of the spec places it) goes once replicas stay ready without it",
         [*SETTLED, member("x1", None)], creates=[], deletes=["x1"]),
    Case("a broken placement keeps its members; its share is made up elsewhere within maxSurge",
         SETTLED, creates=[0], broken={1: "provider b cannot be used"}, degraded={1: "provider b cannot be used"}),
    Case("a member past maxAge is marked retiring and replaced before it goes, the oldest first",
         [member("a1", 0, age=1000.0), member("a2", 0, age=500.0), member("b1", 1)],
         creates=[0], retire={"a1": "rotation"}),
    Case("a retiring member goes once its successor serves",
         [member("a1", 0, retiring="rotation"), member("a2", 0), member("a3", 0), member("b1", 1)],
         creates=[], deletes=["a1"]),
    Case("rotation waits while the pool is short",
         [member("a1", 0, age=1000.0), member("a2", 0, age=1000.0)], creates=[1]),
    Case("maxSurge 0, maxUnavailable 1: an outdated member goes before its successor is made",
         [member("a1", 0, outdated=True), member("a2", 0), member("b1", 1)], creates=[], deletes=["a1"],
         retire={"a1": "template"}, spec=dataclasses.replace(TABLE_SPEC, max_surge=0, max_unavailable=1)),
    Case("a quarantined member is replaced first and stays until its successor serves",
         [member("a1", 0, ready=False, quarantined=True), member("a2", 0), member("b1", 1)], creates=[0]),
    Case("what a capped placement cannot take goes to the others", [], creates=[0, 1, 1],
         spec=dataclasses.replace(TABLE_SPEC, placements=(Placement("a", "h1", 2, 1), Placement("b", "h2", 1)))),
    Case("caps short of replicas: the shortfall is reported", [], creates=[0, 1], shortfall=1,
         spec=dataclasses.replace(TABLE_SPEC, placements=(Placement("a", "h1", 2, 1), Placement("b", "h2", 1, 1)))),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_decision_table(case: Case) -> None:
    decision = decide(case.spec, case.members, case.broken, [], 1_000_000.0)
    assert (decision.creates, decision.deletes, decision.retire) == (case.creates, case.deletes, case.retire)
    assert (decision.degraded, decision.shortfall) == (case.degraded, case.shortfall)
    assert [row["state"] for row in decision.placements] == [
        DEGRADED if i in case.degraded else HEALTHY for i in range(len(case.spec.placements))]


# -- quarantine, steps, jitter ---------------------------------------------------------------------

def test_a_budget_grants_what_is_left_and_creates_interleave_placements() -> None:
    budget = Budget(5)
    assert budget.take([1, 2, 3]) == [1, 2, 3] and budget.take(["a", "b", "c"]) == ["a", "b"]
    assert budget.take([9]) == [] and budget.left == 0
    assert interleaved([0, 0, 0, 1, 1, 2]) == [0, 1, 2, 0, 1, 0]
    assert interleaved([]) == []


def test_jitter_is_stable_bounded_and_spread() -> None:
    factors = [jitter_factor(f"eu-{i:05x}", 0.2) for i in range(200)]
    assert all(0.8 <= f <= 1.2 for f in factors)
    assert min(factors) < 0.85 and max(factors) > 1.15  # spread over the range, not all at once
    assert jitter_factor("eu-00001", 0.2) == jitter_factor("eu-00001", 0.2)
    assert jitter_factor("eu-00001", 0.0) == 1.0


# -- the simulated world: many sweeps --------------------------------------------------------------

@dataclasses.dataclass
class World:
    """Members as ``decide`` sees them; a created member becomes Ready ``boot`` sweeps later."""

    spec: PoolSpec
    boot: int = 2
    now: float = 1_000_000.0
    step: float = 10.0
    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    born: dict[str, int] = dataclasses.field(default_factory=dict)
    ready_at: dict[str, float] = dataclasses.field(default_factory=dict)
    never_ready: set[int] = dataclasses.field(default_factory=set)  # placements whose members never serve
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    serial: int = 0
    sweep: int = 0
    ready_per_sweep: list[int] = dataclasses.field(default_factory=list)

    def add_ready(self, placement: int, count: int, age: float = 0.0) -> None:
        for _ in range(count):
            name = self._new(placement)
            self.members[name] = dataclasses.replace(self.members[name], ready=True, ready_age=age)
            self.ready_at[name] = self.now - age

    def _new(self, placement: int) -> str:
        self.serial += 1
        name = f"m-{self.serial:04d}"
        self.members[name] = Member(name, placement, ready=False, created=self.now + self.serial * 1e-3)
        self.born[name] = self.sweep
        return name

    def run(self, broken: dict[int, str] | None = None) -> Decision:
        self.sweep += 1
        self.now += self.step
        for name, member in list(self.members.items()):
            if (not member.ready and not member.quarantined and member.placement not in self.never_ready
                    and self.sweep - self.born[name] >= self.boot):
                self.ready_at[name] = self.now
                member = dataclasses.replace(member, ready=True)
            if member.ready:
                member = dataclasses.replace(member, ready_age=self.now - self.ready_at[name])
            self.members[name] = member
        self.ready_per_sweep.append(sum(1 for m in self.members.values() if m.ready))
        decision = decide(self.spec, list(self.members.values()), broken or {}, self.rows, self.now)
        self.rows = decision.placements
        for name, why in decision.retire.items():
            self.members[name] = dataclasses.replace(self.members[name], retiring=why)
        for placement in decision.creates:
            self._new(placement)
        for name in decision.deletes:
            del self.members[name]
        return decision

    def per_placement(self) -> list[int]:
        counts = [0] * len(self.spec.placements)
        for member in self.members.values():
            if member.placement is not None:
                counts[member.placement] += 1
        return counts


def pool_spec(**changes: Any) -> PoolSpec:
    base = PoolSpec(replicas=6, template={}, placements=(Placement("a", "h1", 2), Placement("b", "h2", 1)),
                    failover_after_seconds=60.0)
    return dataclasses.replace(base, **changes)


def test_scaling_up_spreads_by_weight_and_settles() -> None:
    world = World(pool_spec())
    first = world.run()
    assert sorted(first.creates) == [0, 0, 0, 0, 1, 1]
    for _ in range(4):
        world.run()
    assert world.per_placement() == [4, 2] and world.ready_per_sweep[-1] == 6
    settled = world.run()
    assert (settled.creates, settled.deletes, settled.retire) == ([], [], {})
    status = pool_status(Pool("ns", "eu", "uid", {}), world.spec, settled, list(world.members.values()), {},
                         world.now)
    assert (status["replicas"], status["readyReplicas"], status["phase"]) == (6, 6, "Ready")
    assert status["selector"] == f"{POOL_LABEL}=eu"
    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "Available": "MinimumReplicasAvailable", "Progressing": "Complete", "PlacementDegraded": "AllPlacementsServing"}


def test_scaling_down_deletes_not_ready_members_first_then_the_newest() -> None:
    world = World(pool_spec(replicas=4))
    world.add_ready(0, 4)
    world.add_ready(1, 2)
    booting = world._new(1)
    decision = world.run()
    # [3, 1] wanted: the booting one goes first, then the newest ready one on placement 0 and 1.
    assert booting in decision.deletes and len(decision.deletes) == 3
    assert world.per_placement() == [3, 1]


def test_a_broken_placement_fails_over_within_max_surge_and_comes_back_after_hysteresis() -> None:
    world = World(pool_spec(replicas=3, max_surge=1))
    world.add_ready(0, 2)
    world.add_ready(1, 1)
    assert world.run().creates == []
    # Placement 1's provider breaks (its section invalid): its member is kept, one extra on 0.
    world.members = {n: dataclasses.replace(m, ready=False) if m.placement == 1 else m
                     for n, m in world.members.items()}
    world.never_ready = {1}
    broken = {1: "provider b cannot be used"}
    decision = world.run(broken)
    assert decision.creates == [0] and decision.deletes == [] and decision.newly_degraded == [1]
    assert world.rows[1]["state"] == DEGRADED
    for _ in range(5):
        decision = world.run(broken)
        assert decision.creates == [] and decision.deletes == []  # no churn while it lasts
    assert world.per_placement() == [3, 1] and world.ready_per_sweep[-1] == 3

    # It recovers: nothing moves before 2 x failoverAfter of continuous health.
    world.never_ready = set()
    world.members = {n: dataclasses.replace(m, ready=True, ready_age=0.0) if m.placement == 1 else m
                     for n, m in world.members.items()}
    for name, member in world.members.items():
        world.ready_at.setdefault(name, world.now)
        if member.placement == 1:
            world.ready_at[name] = world.now
    moves: list[int | str] = []
    for _ in range(12):  # recovering from the first of these sweeps: 110 s < 120 s
        decision = world.run()
        moves += [*decision.creates, *decision.deletes]
    assert moves == [] and world.rows[1]["state"] == RECOVERING
    decision = world.run()  # 120 s
    assert decision.recovered == [1] and world.rows[1]["state"] == HEALTHY
    assert len(decision.deletes) == 1 and decision.creates == []
    assert world.per_placement() == [2, 1]
    # Down to 2 only while the extra member booted; never again, the move back included.
    assert world.ready_per_sweep[:4] == [3, 2, 2, 3] and min(world.ready_per_sweep[3:]) >= 3
    assert world.run().deletes == [] and min(world.ready_per_sweep[3:]) >= 3


def test_a_placement_whose_members_never_get_ready_fails_over_after_failover_after() -> None:
    world = World(pool_spec(replicas=3, max_surge=2), boot=1)
    world.never_ready = {1}
    world.run()  # creates the members; the next sweep sees placement 1's, none ready
    for _ in range(6):  # 0 to 50 s without a ready member: not yet
        assert world.run().creates == []
    assert world.rows[1]["state"] == HEALTHY and "unreadySince" in world.rows[1]
    decision = world.run()  # 60 s without a ready member on placement 1
    assert decision.creates == [0] and world.rows[1]["state"] == DEGRADED
    assert "no member Ready for 60 s" in world.rows[1]["reason"]


def test_members_started_on_a_placement_that_then_dies_do_not_block_the_refill() -> None:
    """A rotation started members on placement 1 just before its provider died: they will never
    be ready, and must not use up the surge the refill on placement 0 needs."""
    world = World(pool_spec(replicas=3, max_surge=2))
    world.add_ready(0, 2)
    world.add_ready(1, 1)
    world.never_ready = {1}
    world._new(1)
    world._new(1)  # two stuck members there: 5 in all, the cap (3 + 2) reached
    for name in [n for n, m in world.members.items() if m.placement == 1 and m.ready]:
        world.members[name] = dataclasses.replace(world.members[name], ready=False)
    decision = world.run({1: "provider b cannot be listed"})
    assert decision.creates == [0] and decision.deletes == []  # its members kept, one made up on 0
    world.run({1: "provider b cannot be listed"})
    world.run({1: "provider b cannot be listed"})
    assert world.ready_per_sweep[-1] == 3


def test_an_unplaceable_shortfall_is_capped_by_max_surge() -> None:
    world = World(pool_spec(replicas=6, max_surge=1))
    world.add_ready(0, 4)
    decision = world.run({1: "provider b is not configured"})
    assert decision.creates == [0]  # 2 missing on placement 1, one extra allowed


@pytest.mark.parametrize(("surge", "unavailable"), [(1, 0), (2, 0), (0, 1), (1, 1)])
def test_rotation_replaces_every_member_without_dropping_below_the_floor(surge: int, unavailable: int) -> None:
    spec = pool_spec(replicas=6, max_age_seconds=300.0, jitter=0.1, max_surge=surge, max_unavailable=unavailable)
    world = World(spec, boot=3)
    world.add_ready(0, 4, age=100.0)
    world.add_ready(1, 2, age=100.0)
    original = set(world.members)
    for _ in range(150):
        world.run()
        assert len(world.members) <= 6 + surge
        if original.isdisjoint(world.members):
            break
    assert original.isdisjoint(world.members), "every member rotated"
    for _ in range(5):  # maxSurge 0: the last one was deleted first, its successor follows
        world.run()
    assert min(world.ready_per_sweep) >= 6 - unavailable, world.ready_per_sweep
    assert world.per_placement() == [4, 2] and len(world.members) == 6


def test_rotation_waits_while_the_pool_is_short() -> None:
    world = World(pool_spec(replicas=3, max_age_seconds=10.0), boot=100)
    world.add_ready(0, 2, age=1000.0)
    decision = world.run()
    assert decision.retire == {} and decision.creates == [1]


def test_a_template_change_rotates_members_like_age() -> None:
    world = World(pool_spec(replicas=2))
    world.add_ready(0, 1)
    world.add_ready(1, 1)
    name = next(iter(world.members))
    world.members[name] = dataclasses.replace(world.members[name], outdated=True)
    decision = world.run()
    assert decision.retire == {name: "template"} and decision.creates == [0]


@pytest.mark.parametrize(("replicas", "surge", "sweeps"), [(3, 1, 4), (6, 1, 7), (6, 2, 4), (10, 3, 5)])
def test_a_template_change_converges_in_replicas_over_max_surge_sweeps_plus_one(replicas: int, surge: int,
                                                                                 sweeps: int) -> None:
    """A member whose successor serves is deleted first, and the surge it frees is used in the
    same sweep: ceil(replicas / maxSurge) + 1 sweeps when a member serves a sweep after it is made
    (twice that before issue 30: a delete and the next retirement never shared a sweep). Nothing
    is remembered but the members themselves, so a restart in between changes nothing."""
    world = World(pool_spec(replicas=replicas, max_surge=surge), boot=1)
    world.add_ready(0, replicas)
    old = set(world.members)
    world.members = {n: dataclasses.replace(m, outdated=True) for n, m in world.members.items()}
    while not (old.isdisjoint(world.members) and all(m.ready for m in world.members.values())):
        world.run()
        assert len(world.members) <= replicas + surge and world.sweep < 50
    assert world.sweep == sweeps and len(world.members) == replicas
    assert min(world.ready_per_sweep) >= replicas


def test_a_quarantined_member_is_replaced_and_deleted_once_its_successor_is_ready() -> None:
    world = World(pool_spec(replicas=3, max_surge=1), boot=2)
    world.add_ready(0, 2)
    world.add_ready(1, 1)
    victim = next(n for n, m in world.members.items() if m.placement == 1)
    world.members[victim] = dataclasses.replace(world.members[victim], ready=False, quarantined=True)
    decision = world.run()
    assert decision.creates == [1] and victim not in decision.deletes  # make before break
    world.run()
    decision = world.run()
    assert victim in decision.deletes and world.per_placement() == [2, 1]


# -- distinct egress addresses ---------------------------------------------------------------------

def test_members_sharing_an_egress_address_wait_not_ready_with_a_reason() -> None:
    spec = pool_spec(replicas=3, distinct_egress_ips=True)
    members = [Member("m-1", 0, ready=True, ready_age=300.0, egress_ip="198.51.100.7", created=1.0),
               Member("m-2", 0, ready=True, ready_age=100.0, egress_ip="198.51.100.7", created=2.0),
               Member("m-3", 1, ready=True, ready_age=50.0, egress_ip="198.51.100.8", created=3.0)]
    decision = decide(spec, members, {}, [], 1_000_000.0)
    # The one Ready longest keeps its address; the other counts as not ready, and nothing rotates.
    assert decision.shared_egress == {"m-2": "leaves from 198.51.100.7, as m-1 does"}
    assert decision.ready == 2 and decision.retire == {} and decision.deletes == []
    status = pool_status(Pool("ns", "eu", "uid", {}), spec, decision, members, {}, 1_000_000.0)
    condition = next(c for c in status["conditions"] if c["type"] == "DistinctEgressIPs")
    assert (condition["status"], condition["reason"]) == ("False", "EgressIPShared")
    assert "m-2 leaves from 198.51.100.7, as m-1 does" in condition["message"]
    assert status["readyReplicas"] == 2 and status["egressIPs"] == 2

    # Without the field, the same members are all ready and the condition is not there.
    plain = decide(dataclasses.replace(spec, distinct_egress_ips=False), members, {}, [], 1_000_000.0)
    assert plain.ready == 3 and plain.shared_egress == {}

    # Once it leaves from an address of its own (another source address, another host), it counts.
    moved = [*members[:1], dataclasses.replace(members[1], egress_ip="198.51.100.9"), members[2]]
    settled = decide(spec, moved, {}, [], 1_000_000.0)
    assert settled.ready == 3 and settled.shared_egress == {}
    status = pool_status(Pool("ns", "eu", "uid", {}), spec, settled, moved, {}, 1_000_000.0)
    assert {c["type"]: c["reason"] for c in status["conditions"]}["DistinctEgressIPs"] == "EgressIPsDistinct"
