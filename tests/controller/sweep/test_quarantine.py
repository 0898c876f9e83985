"""sweep/quarantine.py: a crawler's quarantine marks the Proxy's current instance, once."""

from __future__ import annotations

import pytest

from egress_proxies.resources.pool import POOL_LABEL, QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import FINALIZER, Proxy
from egress_proxies.serving.discovery import DiscoveryView, PoolFloor
from egress_proxies.sources.store import StoreError
from egress_proxies.sweep.quarantine import Quarantine, QuarantineError
from support.controller.fakes import MemoryStore

ID = "kvm://hosts/h1/domains/p-a"


def store_with_instance() -> MemoryStore:
    store = MemoryStore()
    store.add("eu-1", {"provider": "home-kvm"})
    store.objects[("crawlers", "eu-1")].status = {"providerID": ID, "phase": "Ready"}
    return store


def test_it_marks_the_current_instance_with_one_event() -> None:
    store = store_with_instance()
    quarantine = Quarantine(store, DiscoveryView())
    outcome = quarantine("crawlers", "eu-1", "403 from example.com", "token team-a")
    assert outcome.proxy.annotations[QUARANTINE_ANNOTATION] == ID
    assert outcome.hidden and outcome.answer()["hidden"] is True  # a bare Proxy leaves discovery at once
    assert store.get("eu-1").annotations[QUARANTINE_ANNOTATION] == ID
    # Idempotent: asked again, no second Event.
    quarantine("crawlers", "eu-1", "again", "token team-a")
    assert store.reasons() == ["Quarantined"]
    assert "by token team-a: 403 from example.com" in store.events[0][3]


def test_a_conflict_is_retried_on_the_fresh_object() -> None:
    store = store_with_instance()
    store.conflicts_to_inject = 2
    outcome = Quarantine(store, DiscoveryView())("crawlers", "eu-1", "banned", "op")
    assert outcome.proxy.annotations[QUARANTINE_ANNOTATION] == ID


def test_a_proxy_that_keeps_changing_is_a_store_error() -> None:
    store = store_with_instance()
    store.conflicts_to_inject = 100
    with pytest.raises(StoreError, match="kept conflicting"):
        Quarantine(store, DiscoveryView())("crawlers", "eu-1", "banned", "op")
    assert store.reasons() == []


@pytest.mark.parametrize(("setup", "status"), [("missing", 404), ("deleting", 404), ("no instance", 409)])
def test_what_cannot_be_quarantined_is_told_as_an_http_status(setup: str, status: int) -> None:
    store = store_with_instance()
    stored = store.objects[("crawlers", "eu-1")]
    if setup == "missing":
        store.delete("eu-1")
    elif setup == "deleting":
        stored.finalizers = [FINALIZER]
        store.delete("eu-1")
    else:
        stored.status = {}
    with pytest.raises(QuarantineError) as raised:
        Quarantine(store, DiscoveryView())("crawlers", "eu-1", "banned", "op")
    assert raised.value.status == status
    assert store.reasons() == []


def pool_of_four() -> MemoryStore:
    """Four Ready members of pool eu (uid pool-uid), each on its own instance."""
    store = MemoryStore()
    owner = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": "eu", "uid": "pool-uid",
             "controller": True}
    for index in range(4):
        store.add(f"eu-{index}", {"provider": "home-kvm"})
        stored = store.objects[("crawlers", f"eu-{index}")]
        stored.status = {"providerID": f"{ID}-{index}", "phase": "Ready"}
        stored.raw = {"metadata": {"labels": {POOL_LABEL: "eu"}, "ownerReferences": [owner]}}
    return store


def swept(listed: list[Proxy], floor: PoolFloor) -> DiscoveryView:
    """A leader's view after a sweep that found ``listed`` and pool eu's ``floor``."""
    view = DiscoveryView()
    view.publish(listed, {("crawlers", "eu"): floor}, 0.0)
    view.serve_sweeps(True)
    return view


def test_a_pool_member_leaves_discovery_at_once_only_while_its_pool_keeps_min_ready() -> None:
    """minReady 2 of 4: the first two leave at once, the next two stay listed until replaced,
    whoever asks; asking again for one changes nothing."""
    store = pool_of_four()
    view = swept(store.list_proxies()[0], PoolFloor("pool-uid", 2))
    quarantine = Quarantine(store, view)
    outcomes = [quarantine("crawlers", f"eu-{index}", "banned", "token team-a") for index in range(4)]
    assert [o.hidden for o in outcomes] == [True, True, False, False]
    assert outcomes[3].answer()["detail"] == ("still listed: its pool crawlers/eu keeps 2 member(s) discoverable "
                                              "(minReady) and would have 1 without it; it leaves discovery once its "
                                              "replacement serves")
    assert quarantine("crawlers", "eu-3", "again", "token team-a").hidden is False
    assert [store.reasons(f"crawlers/eu-{i}") for i in range(4)] == [["Quarantined"]] * 4  # all the same
    assert [p.name for p in view.handed_out()] == ["eu-2", "eu-3"]


def test_a_sweep_that_caught_up_is_what_counts_and_without_floors_everything_leaves() -> None:
    store = pool_of_four()
    listed = store.list_proxies()[0]
    floor = PoolFloor("pool-uid", 3)
    view = swept(listed, floor)
    quarantine = Quarantine(store, view)
    assert quarantine("crawlers", "eu-0", "banned", "op").hidden is True
    assert quarantine("crawlers", "eu-1", "banned", "op").hidden is False
    # A sweep later: eu-0's replacement serves and eu-0 is no longer listed.
    replacement = store.add("eu-4", {"provider": "home-kvm"})
    replacement.raw = listed[0].raw
    replacement.status = {"providerID": f"{ID}-4", "phase": "Ready"}
    listed = [p for p in listed if p.name != "eu-0"] + [replacement]
    view.publish(listed, {("crawlers", "eu"): floor}, 0.0)
    assert quarantine("crawlers", "eu-2", "banned", "op").hidden is True  # eu-1, eu-3, eu-4 besides it
    # No floor known (no sweep or stored read yet): everything leaves at once.
    assert Quarantine(pool_of_four(), DiscoveryView())("crawlers", "eu-0", "banned", "op").hidden is True
