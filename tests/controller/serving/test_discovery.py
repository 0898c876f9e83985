"""serving/discovery.py: the one rule for what crawlers are handed (a table), pool floors, and the
view every writer changes and the HTTP server and the loop only read. The leader and the standby
handing out the same set, through the real sweep and the real stored read, is in
scenarios/test_discovery_view.py."""

from __future__ import annotations

from typing import Any

import pytest

from egress_proxies.resources.pool import POOL_LABEL, QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.discovery import (
    DiscoveryView,
    PoolFloor,
    handed_out,
    handed_out_of,
    kept_for_floors,
    kept_listed,
)

FLOORS = {("crawlers", "eu"): PoolFloor("pool-uid", 2)}


def proxy(name: str, phase: str, quarantined: bool = False, deleting: bool = False, serving: str = "True",
          reason: str = "Serving", private: str = "CredentialsRequired", uid: str = "pool-uid",
          pool: bool = True, old_quarantine: bool = False) -> Proxy:
    """A Proxy as a sweep leaves it: its phase, Serving and Private conditions; a member of pool eu
    (controlled by ``uid``) unless ``pool`` is False; quarantined now, or for an instance it had."""
    provider_id = f"kvm://hosts/h1/domains/{name}"
    annotations = {QUARANTINE_ANNOTATION: provider_id} if quarantined else {}
    if old_quarantine:
        annotations = {QUARANTINE_ANNOTATION: provider_id + "-before"}
    raw: dict[str, Any] = {"metadata": {}}
    if pool:
        owner = {"kind": "ProxyPool", "name": "eu", "uid": uid, "controller": True}
        raw = {"metadata": {"labels": {POOL_LABEL: "eu"}, "ownerReferences": [owner]}}
    return Proxy("crawlers", name, f"uid-{name}", {"provider": "a"},
                 status={"phase": phase, "providerID": provider_id, "endpoint": "192.0.2.1:3128",
                         "conditions": [{"type": "Serving", "status": serving, "reason": reason},
                                        {"type": "Private", "status": "True", "reason": private}]},
                 annotations=annotations, deletion_timestamp="2026-12-06T12:00:00Z" if deleting else None,
                 raw=raw)


@pytest.mark.parametrize(("case", "kept", "expected"), [
    (proxy("ready", "Ready"), False, True),
    (proxy("provisioning", "Provisioning"), False, False),
    (proxy("pending", "Pending"), False, False),
    (proxy("failed", "Failed"), False, False),
    # A deleting Proxy never, whatever its last phase: its instance is going.
    (proxy("deleting", "Ready", deleting=True), False, False),
    (proxy("deleting-kept", "Quarantined", quarantined=True, deleting=True), True, False),
    # A quarantined one only where its pool keeps it for its floor, and only while it serves.
    (proxy("quarantined", "Quarantined", quarantined=True), False, False),
    (proxy("quarantined-kept", "Quarantined", quarantined=True), True, True),
    (proxy("kept-not-serving", "Quarantined", quarantined=True, serving="False", reason="Timeout"), True, False),
    (proxy("kept-open", "Quarantined", quarantined=True, private="NotPrivate"), True, False),
    (proxy("kept-unverified", "Quarantined", quarantined=True, serving="Unknown", reason="Unverified"), True, True),
    # Still Ready (its provider could not be listed since the quarantine): no different.
    (proxy("ready-quarantined", "Ready", quarantined=True), False, False),
    (proxy("ready-quarantined-kept", "Ready", quarantined=True, serving="False", reason="Timeout"), True, True),
    # A quarantine of an instance it no longer has is no quarantine.
    (proxy("replaced", "Ready", old_quarantine=True), False, True),
])
def test_the_one_rule_for_what_crawlers_are_handed(case: Proxy, kept: bool, expected: bool) -> None:
    assert handed_out(case, kept_for_floor=kept) is expected


@pytest.mark.parametrize(("proxies", "listed"), [
    # A burst quarantined all four; the floor (2) keeps two listed, by name, until replacements serve.
    ([proxy(f"eu-{i}", "Quarantined", quarantined=True) for i in range(4)], ["eu-0", "eu-1"]),
    ([proxy("eu-0", "Quarantined", quarantined=True), proxy("eu-1", "Quarantined", quarantined=True),
      proxy("eu-5", "Ready"), proxy("eu-6", "Provisioning")], ["eu-0"]),
    ([proxy("eu-0", "Quarantined", quarantined=True), proxy("eu-5", "Ready"), proxy("eu-6", "Ready")], []),
    # One that no longer serves is no use; one still Ready (its provider unlisted) still serves.
    ([proxy("eu-0", "Quarantined", quarantined=True, serving="False"),
      proxy("eu-1", "Ready", quarantined=True)], ["eu-1"]),
    # Members of another pool of that name (an old uid) are not this pool's, nor a bare Proxy.
    ([proxy("eu-0", "Quarantined", quarantined=True, uid="old-uid"),
      proxy("bare", "Quarantined", quarantined=True, pool=False)], []),
    # A deleting member neither counts nor is kept.
    ([proxy("eu-0", "Quarantined", quarantined=True), proxy("eu-1", "Ready", deleting=True)], ["eu-0"]),
])
def test_quarantined_members_are_kept_only_to_keep_min_ready(proxies: list[Proxy], listed: list[str]) -> None:
    kept = kept_for_floors(proxies, FLOORS)
    assert sorted(p.name for p in proxies if p.uid in kept) == listed
    assert kept_for_floors(proxies, {}) == set()  # no pool, no floor: nothing quarantined is kept
    # handed_out_of: the Ready ones and the kept ones, nothing else, in their order.
    assert [p.name for p in handed_out_of(proxies, FLOORS)] == [
        p.name for p in proxies if p.uid in kept or (p.status["phase"] == "Ready" and handed_out(p))]


def names(view: DiscoveryView) -> list[str]:
    return [p.name for p in view.handed_out()]


def test_a_leader_serves_its_sweeps_and_verdicts_follow_between_them() -> None:
    view = DiscoveryView()
    stored = [proxy("eu-0", "Ready"), proxy("eu-1", "Ready")]
    view.load_stored(stored, FLOORS, 0.0)
    assert names(view) == ["eu-0", "eu-1"] and view.swept == []  # no sweep yet: the stored set
    view.publish([proxy("eu-0", "Ready"), proxy("eu-1", "Provisioning")], FLOORS, 1.0)
    assert names(view) == ["eu-0", "eu-1"] and view.published == 1  # still stored until told
    view.serve_sweeps(True)
    assert names(view) == ["eu-0"]
    view.follow(proxy("eu-1", "Ready"))  # a probe's verdict: it serves now
    assert names(view) == ["eu-0", "eu-1"]
    view.follow(proxy("eu-0", "Provisioning"))  # it stopped serving
    assert names(view) == ["eu-1"]
    view.follow(proxy("eu-9", "Quarantined", quarantined=True))  # never kept by a sweep: stays out
    assert names(view) == ["eu-1"]
    view.serve_sweeps(False)  # the leadership was lost: the stored set again
    assert names(view) == ["eu-0", "eu-1"]


def test_a_verdict_keeps_a_floor_kept_member_only_while_it_serves() -> None:
    view = DiscoveryView()
    view.serve_sweeps(True)
    view.publish([proxy("eu-0", "Quarantined", quarantined=True), proxy("eu-1", "Ready")], FLOORS, 0.0)
    assert names(view) == ["eu-0", "eu-1"]
    view.follow(proxy("eu-0", "Quarantined", quarantined=True, serving="True"))
    assert names(view) == ["eu-0", "eu-1"]
    view.follow(proxy("eu-0", "Quarantined", quarantined=True, serving="False", reason="Timeout"))
    assert names(view) == ["eu-1"]
    view.follow(proxy("eu-0", "Quarantined", quarantined=True))  # serves again, but the sweep let it go
    assert names(view) == ["eu-1"]


def test_a_withdrawn_proxy_leaves_at_once_until_a_later_view_knows() -> None:
    view = DiscoveryView()
    view.serve_sweeps(True)
    view.publish([proxy("eu-0", "Ready"), proxy("eu-1", "Ready")], {}, 0.0)
    view.withdraw("uid-eu-0", seen=5.0)
    assert names(view) == ["eu-1"]
    view.publish([proxy("eu-0", "Ready"), proxy("eu-1", "Ready")], {}, 4.0)  # began before: it stays out
    assert names(view) == ["eu-1"]
    view.load_stored([proxy("eu-0", "Ready", deleting=True), proxy("eu-1", "Ready")], {}, 6.0)
    assert view._withdrawn == {}  # a read that began later knows of it: forgotten
    view.publish([proxy("eu-0", "Ready", deleting=True), proxy("eu-1", "Ready")], {}, 7.0)
    assert names(view) == ["eu-1"]  # deleting: out by the rule itself


def test_a_quarantine_hides_at_once_within_the_floor_and_is_forgotten_once_the_view_caught_up() -> None:
    view = DiscoveryView()
    members = [proxy(f"eu-{i}", "Ready") for i in range(3)]
    bare = proxy("bare", "Ready", pool=False)
    view.load_stored([*members, bare], FLOORS, 0.0)
    assert view.hide(bare).hidden and view.hide(bare).floor is None
    assert view.hide(members[0]).hidden  # eu-1, eu-2 keep the floor (2)
    kept = view.hide(members[1])
    assert (kept.hidden, kept.floor, kept.others) == (False, FLOORS[("crawlers", "eu")], 1)
    assert names(view) == ["eu-1", "eu-2"]
    # The next read shows eu-0 on another instance and the bare Proxy gone: both forgotten.
    moved = proxy("eu-0", "Ready")
    moved.status["providerID"] += "-new"
    view.load_stored([moved, *members[1:]], FLOORS, 1.0)
    assert names(view) == ["eu-0", "eu-1", "eu-2"] and view._hidden == {}
    # Without floors (nothing read yet) everything leaves at once.
    assert DiscoveryView().hide(members[2]).hidden


@pytest.mark.parametrize(("floor", "serving", "quarantined_serving", "listed"), [
    (4, 4, [], []),
    (4, 3, ["eu-b"], ["eu-b"]),  # its replacement is not serving yet: it stays listed
    (4, 4, ["eu-b"], []),  # it is: out
    (4, 0, ["eu-d", "eu-a", "eu-c", "eu-b"], ["eu-a", "eu-b", "eu-c", "eu-d"]),  # a burst: none leaves
    (2, 0, ["eu-d", "eu-a", "eu-c", "eu-b"], ["eu-a", "eu-b"]),  # minReady 2: two leave at once
    (2, 1, ["eu-d", "eu-a"], ["eu-a"]),
    (0, 0, ["eu-a"], []),
])
def test_quarantined_members_stay_listed_only_to_keep_min_ready(floor: int, serving: int,
                                                                 quarantined_serving: list[str],
                                                                 listed: list[str]) -> None:
    assert kept_listed(floor, serving, quarantined_serving) == listed


def test_the_view_knows_a_pool_from_its_floors_once_the_pools_were_read() -> None:
    """Issue 41 row 5: discovery's 404 for a pool that does not exist. Before any sweep or stored
    read the view knows no pools yet, so it refuses none (an empty list, as before)."""
    view = DiscoveryView()
    assert view.knows_pool("crawlers", "anything")
    view.load_stored([], FLOORS, 0.0)
    assert view.knows_pool("crawlers", "eu") and not view.knows_pool("crawlers", "nonexistent")
    assert not view.knows_pool("others", "eu")  # a pool's name is per namespace
    view.publish([], {}, 1.0)  # a sweep that saw the pool go
    assert not view.knows_pool("crawlers", "eu")
