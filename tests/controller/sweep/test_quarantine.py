"""sweep/quarantine.py: a crawler's quarantine marks the Proxy's current instance, once."""

from __future__ import annotations

import pytest

from egress_proxies.resources.pool import QUARANTINE_ANNOTATION
from egress_proxies.resources.proxy import FINALIZER
from egress_proxies.sources.store import StoreError
from egress_proxies.sweep.quarantine import Quarantine, QuarantineError
from support.controller_fakes import MemoryStore

ID = "kvm://hosts/h1/domains/p-a"


def store_with_instance() -> MemoryStore:
    store = MemoryStore()
    store.add("eu-1", {"provider": "home-kvm"})
    store.objects[("crawlers", "eu-1")].status = {"providerID": ID, "phase": "Ready"}
    return store


def test_it_marks_the_current_instance_with_one_event() -> None:
    store = store_with_instance()
    quarantine = Quarantine(store)
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
    assert Quarantine(store)("crawlers", "eu-1", "banned", "op").proxy.annotations[QUARANTINE_ANNOTATION] == ID


def test_a_proxy_that_keeps_changing_is_a_store_error() -> None:
    store = store_with_instance()
    store.conflicts_to_inject = 100
    with pytest.raises(StoreError, match="kept conflicting"):
        Quarantine(store)("crawlers", "eu-1", "banned", "op")
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
        Quarantine(store)("crawlers", "eu-1", "banned", "op")
    assert raised.value.status == status
    assert store.reasons() == []
