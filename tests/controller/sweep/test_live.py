"""sweep/live.py: LivePath for one provider in one sweep -- creates, status from what the provider
reports, make-before-break retirement, listing failures, provider-wide backoff and replacements
of lost instances -- with the fakes of tests/support/controller/fakes.py behind a real
ProviderClient and ProxyWriter. Nothing is probed here (no monitor): running with an address is
Ready, reported unverified; probing is tested in tests/controller/scenarios/test_serving.py."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProbeSettings as CollectionProbeSettings,
)
from egress_proxies.providers.client import Listing, ProbeSettings, ProviderClient, ProviderType
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.resources.proxy import (
    REPLACEMENTS_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    Proxy,
    instance_name,
    spec_hash,
)
from egress_proxies.serving.credentials import AccessPolicy, Credentials
from egress_proxies.serving.monitor import instance_identity
from egress_proxies.sources.file_secrets import FileSecrets
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.live import LiveParts, LivePath, LiveSettings, SweepPass
from egress_proxies.sweep.writer import ProxyWriter
from support.controller.fakes import FakeRunner, MemoryStore

SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
OWNER = "test-owner"
# The provider config says probe: none (the fake's addresses are made up).
NOT_PROBED = ProbeSettings.from_result(CollectionProbeSettings(enabled=False).as_dict())


class Live:
    def __init__(self, access: AccessPolicy | None = None, **settings: Any) -> None:
        self.store = MemoryStore()
        self.runner = FakeRunner()
        self.writer = ProxyWriter(self.store, Backoff(clock=lambda: 0.0, rng=lambda: 0.5))
        self.client = ProviderClient(self.runner, "providers.yaml", "home-kvm", ProviderType.KVM)
        self.counts: Counter[str] = Counter()
        self.seconds = 0.0  # what seconds_since answers for every stamp
        self.path = LivePath(LiveSettings(**settings), LiveParts(self.writer, lambda _stamp: self.seconds),
                             SweepPass(OWNER, self.contain, self.count, access=access), NOT_PROBED)

    @staticmethod
    def contain(_proxy: Proxy, action: Callable[[], object]) -> None:
        action()

    def count(self, counter: str, amount: int) -> None:
        self.counts[counter] += amount

    def sweep(self, *names: str, listing: Listing | None = None) -> None:
        proxies = [self.store.get(n) for n in names]
        self.path.reconcile(self.client, proxies, listing or self.client.list_instances(OWNER))

    def condition(self, name: str, condition_type: str) -> dict[str, Any]:
        return next(c for c in self.store.get(name).status["conditions"] if c["type"] == condition_type)

    def created_names(self) -> list[str]:
        return [op.args["name"] for call in self.runner.calls if call.verb == "create" for op in call.operations]


@pytest.fixture
def live() -> Live:
    return Live()


def test_a_proxy_without_an_instance_gets_one_and_is_ready_unverified(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    proxy = live.store.get("eu-1")
    [instance] = live.runner.instances.values()
    assert proxy.status["providerID"] == instance["provider_id"] and proxy.status["phase"] == "Ready"
    assert proxy.status["endpoint"] == "192.0.2.10:3128" and proxy.status["location"] == "h1"
    assert proxy.status["readyProviderID"] == instance["provider_id"] and proxy.status["readySince"]
    assert live.condition("eu-1", "Serving")["reason"] == "Unverified"
    assert proxy.annotations[SPEC_HASH_ANNOTATION] == spec_hash(SPEC)
    assert live.store.reasons() == ["Created"] and live.counts["created"] == 1


def test_an_instance_already_there_is_adopted_not_created_again(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    live.runner.calls.clear()
    live.sweep("eu-1")
    assert live.runner.verbs() == ["list"]
    assert len(live.runner.instances) == 1


def test_creates_are_batched(live: Live) -> None:
    live = Live(batch_size=2)
    for n in range(5):
        live.store.add(f"eu-{n}", SPEC)
    live.sweep(*(f"eu-{n}" for n in range(5)))
    assert sorted(len(c.operations) for c in live.runner.calls if c.verb == "create") == [1, 2, 2]
    assert live.counts["runner_calls"] == 3


def test_a_sweep_with_more_creates_than_its_parallel_batches_hold_makes_them_larger(live: Live) -> None:
    # A fill: 20 creates would be 10 batches of 2, 4 at a time; they go as 4 batches of 5 (the
    # largest a fill batch may be), each one runner call's start-up for five creates instead of two.
    live = Live(batch_size=2, parallel_batches=4, fill_batch_size=5)
    for n in range(20):
        live.store.add(f"eu-{n}", SPEC)
    live.sweep(*(f"eu-{n}" for n in range(20)))
    assert sorted(len(c.operations) for c in live.runner.calls if c.verb == "create") == [5, 5, 5, 5]
    assert len(live.runner.instances) == 20

    # Fewer creates than four batches hold: as few batches as run side by side, never under batch_size.
    live = Live(batch_size=2, parallel_batches=4, fill_batch_size=5)
    for n in range(9):
        live.store.add(f"eu-{n}", SPEC)
    live.sweep(*(f"eu-{n}" for n in range(9)))
    assert sorted(len(c.operations) for c in live.runner.calls if c.verb == "create") == [3, 3, 3]


def test_batches_write_their_results_side_by_side(live: Live) -> None:
    # A fill's batches return one after another while others still run; each writes its Proxies'
    # statuses in its own thread. One thread writing every batch's (two API writes per create) was
    # the fill's critical path. Here the first status write of each batch waits until another
    # batch is writing too: with a single writer that never happens.
    live = Live(batch_size=2, parallel_batches=2, fill_batch_size=2)
    both_writing = threading.Barrier(2, timeout=10)
    writers: set[int] = set()
    write_status = live.writer.write_status

    def meeting(proxy: Proxy, status: Any) -> Proxy:
        if threading.get_ident() not in writers:
            writers.add(threading.get_ident())
            both_writing.wait()
        return write_status(proxy, status)
    live.writer.write_status = meeting  # type: ignore[method-assign]
    for n in range(4):
        live.store.add(f"eu-{n}", SPEC)
    live.sweep(*(f"eu-{n}" for n in range(4)))
    assert len(writers) == 2
    assert [live.store.get(f"eu-{n}").status["phase"] for n in range(4)] == ["Ready"] * 4


def test_a_spec_change_makes_the_new_instance_before_it_breaks_the_old(live: Live) -> None:
    """Make before break for crawlers too: while the successor boots, the Proxy stays Ready on the
    instance that serves (its status, so discovery, names it), then moves in one write."""
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    [old] = list(live.runner.instances)
    serving = dict(live.store.get("eu-1").status)
    live.store.update_spec("eu-1", port=8080)
    live.runner.ip = None  # the new instance runs without an address yet: it does not serve
    for _ in range(2):  # the sweep that creates it and one that lists it
        live.sweep("eu-1")
        status = live.store.get("eu-1").status
        assert old in live.runner.instances and len(live.runner.instances) == 2
        assert (status["phase"], status["providerID"], status["endpoint"]) == (
            "Ready", serving["providerID"], serving["endpoint"]), status
    assert live.store.reasons()[-1] == "Replacing"  # the Normal Event: a successor is being made
    [successor] = [i for i in live.runner.instances if i != old]
    live.runner.instances[successor].update(ip="192.0.2.11", endpoint="192.0.2.11:8080")
    live.sweep("eu-1")
    assert old not in live.runner.instances and len(live.runner.instances) == 1
    assert live.store.reasons()[-1] == "Replaced"
    status = live.store.get("eu-1").status
    assert (status["phase"], status["endpoint"]) == ("Ready", "192.0.2.11:8080"), status
    assert status["providerID"].endswith(successor)


def test_a_probe_verdict_is_written_only_for_the_instance_the_status_may_describe(live: Live) -> None:
    """A verdict written between sweeps: the named instance's always; the booting successor's not
    while the predecessor keeps the Proxy Ready (it would take the Proxy out of discovery); once
    the status moved on, a late verdict of the retired predecessor never names it again."""
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    old = live.client.list_instances(OWNER).instances[0]
    old_hash = spec_hash(SPEC)
    live.store.update_spec("eu-1", port=8080)
    live.runner.ip = None
    live.sweep("eu-1")
    new_hash = spec_hash({**SPEC, "port": 8080})
    [booting] = [i for i in live.client.list_instances(OWNER).instances if i.provider_id != old.provider_id]
    proxy = live.store.get("eu-1")
    assert live.path._describes(proxy, old, old_hash)
    assert not live.path._describes(proxy, booting, new_hash)
    live.runner.instances[booting.provider_id].update(ip="192.0.2.11", endpoint="192.0.2.11:8080")
    serving = next(i for i in live.client.list_instances(OWNER).instances if i.name == booting.name)
    assert live.path._describes(proxy, serving, new_hash)  # it serves: the status moves to it
    live.sweep("eu-1")
    moved = live.store.get("eu-1")
    assert moved.status["providerID"] == serving.provider_id
    assert not live.path._describes(moved, old, old_hash)


def test_a_successor_that_does_not_serve_within_its_start_up_allowance_is_judged_on_its_own(live: Live) -> None:
    """The predecessor keeps the Proxy Ready for the successor's start-up allowance
    (probe.startupSeconds from its creation), no longer: then the status names the successor
    and the usual rules (its failure clock, replacement) apply to it."""
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    [old] = list(live.runner.instances)
    live.store.update_spec("eu-1", port=8080)
    live.runner.ip = None
    live.sweep("eu-1")
    assert live.store.get("eu-1").status["providerID"].endswith(old)
    live.seconds = NOT_PROBED.startup_seconds  # the successor's allowance is over
    live.sweep("eu-1")
    status = live.store.get("eu-1").status
    assert status["phase"] == "Provisioning" and not status["providerID"].endswith(old), status
    assert old in live.runner.instances  # not deleted for that: only once a successor is Ready


def test_a_partial_listing_that_misses_the_successor_keeps_the_serving_predecessor(live: Live) -> None:
    """The successor's location did not answer: "not listed" is not "gone". Neither made again
    nor its predecessor cleared before the successor is seen Ready (make before break held)."""
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    [old] = list(live.runner.instances)
    live.store.update_spec("eu-1", port=8080)
    live.runner.ip = None  # the successor boots: not Ready yet
    live.sweep("eu-1")
    [successor] = [i for i in live.runner.instances if i != old]
    full = live.client.list_instances(OWNER)
    partial = Listing([i for i in full.instances if i.provider_id == old],
                      error=ProviderError(ErrorClass.TRANSIENT, "h2: connection refused"))
    live.runner.calls.clear()
    live.sweep("eu-1", listing=partial)
    assert set(live.runner.instances) == {old, successor}
    assert live.runner.verbs() == []  # no create, no delete
    for instance in live.runner.instances.values():
        instance.update(ip="192.0.2.11", endpoint="192.0.2.11:8080")
    live.sweep("eu-1")  # a full listing again: the successor is Ready, then the predecessor goes
    assert set(live.runner.instances) == {successor}


def test_a_running_instance_without_an_address_this_time_keeps_its_address(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    for instance in live.runner.instances.values():
        instance.update(ip=None, endpoint=None)  # a KVM endpoint is its ip:port
    live.sweep("eu-1")
    assert live.store.get("eu-1").status["phase"] == "Ready"
    assert live.store.get("eu-1").status["ip"] == "192.0.2.10"


def test_a_failed_listing_keeps_a_ready_proxy_ready_for_a_bounded_time(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    down = Listing(error=ProviderError(ErrorClass.TRANSIENT, "libvirtd restarting"))
    live.sweep("eu-1", listing=down)
    assert live.store.get("eu-1").status["phase"] == "Ready"
    assert live.condition("eu-1", "ProviderListed")["status"] == "False"
    live.seconds = LiveSettings.stale_listing_seconds
    live.sweep("eu-1", listing=down)
    assert live.store.get("eu-1").status["phase"] == "Provisioning"
    assert live.condition("eu-1", "Ready")["reason"] == "ListFailed"
    assert live.writer.backoff.due(live.store.get("eu-1").uid)  # a listing is tried every sweep
    live.sweep("eu-1")
    assert live.store.get("eu-1").status["phase"] == "Ready"
    assert "ProviderListed" not in {c["type"] for c in live.store.get("eu-1").status["conditions"]}


def fail_creates(live: Live, *names: str) -> None:
    for name in names:
        proxy = live.store.get(name)
        live.runner.fail[("kvm_proxy", instance_name(proxy, spec_hash(SPEC)))] = ("transient", f"{name}: no route")


def test_a_batch_failing_transient_backs_off_the_provider_not_each_proxy(live: Live) -> None:
    for name in ("eu-1", "eu-2"):
        live.store.add(name, SPEC)
    fail_creates(live, "eu-1", "eu-2")
    live.sweep("eu-1", "eu-2")
    assert not live.writer.provider_backoff.due("home-kvm")
    assert all(live.writer.backoff.due(live.store.get(n).uid) for n in ("eu-1", "eu-2"))
    assert live.condition("eu-1", "Ready")["reason"] == "CreateFailed"
    live.runner.fail.clear()
    live.runner.calls.clear()
    live.sweep("eu-1", "eu-2")
    assert live.runner.verbs() == ["list"]  # the provider is not due yet: no create


def test_one_item_failing_alone_backs_off_its_own_proxy(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.store.add("eu-2", SPEC)
    fail_creates(live, "eu-1")
    live.sweep("eu-1", "eu-2")
    assert not live.writer.backoff.due(live.store.get("eu-1").uid)
    assert live.writer.provider_backoff.due("home-kvm")
    assert live.store.get("eu-2").status["phase"] == "Ready"


def test_a_stopped_instance_that_never_was_ready_is_created_again_by_name(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.runner.ip = None
    live.sweep("eu-1")
    for instance in live.runner.instances.values():
        instance["state"] = "stopped"
    live.sweep("eu-1")
    first, second = live.created_names()
    assert first == second and len(live.runner.instances) == 1


def test_a_lost_instance_is_replaced_under_a_new_name_once_unhealthy_long_enough(live: Live) -> None:
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    for instance in live.runner.instances.values():
        instance["state"] = "stopped"
    live.sweep("eu-1")
    assert live.condition("eu-1", "Serving")["reason"] == "InstanceStopped"
    assert len(live.created_names()) == 1
    live.seconds = 300.0
    live.sweep("eu-1")
    assert live.store.get("eu-1").annotations[REPLACEMENTS_ANNOTATION] == f"{spec_hash(SPEC)}:1"
    first, second = live.created_names()
    assert first != second and "InstanceLost" in live.store.reasons()


def test_a_replacement_of_a_replacement_deletes_the_other_instance_before_it_creates(live: Live) -> None:
    """At most two instances per Proxy at any moment (issue 37): the first instance is lost and
    replaced, its successor never becomes Ready and is lost too; the first instance (still there:
    make before break) is deleted *before* the third is created. Before: created, then deleted,
    three for a moment."""
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    (first,) = live.runner.instances
    live.runner.instances[first]["state"] = "stopped"
    live.seconds = 10_000.0
    live.runner.ip = None  # the successor never gets an address: never Ready
    live.sweep("eu-1")  # the Serving=False clock starts
    live.sweep("eu-1")  # replaced: the successor is created, the first stays
    (second,) = set(live.runner.instances) - {first}
    live.runner.instances[second]["state"] = "error"
    live.runner.calls.clear()
    live.sweep("eu-1")  # the successor is lost too
    live.sweep("eu-1")
    order = [(call.verb, op.args.get("name") or op.args.get("provider_id")) for call in live.runner.calls
             if call.verb in ("create", "delete") for op in call.operations]
    assert [verb for verb, _ in order] == ["delete", "create"], order
    assert first not in live.runner.instances and len(live.runner.instances) == 2
    assert live.store.reasons().count("Replaced") == 1


def test_replacements_are_budgeted_per_provider_and_sweep() -> None:
    live = Live(replacement_budget=0.2)
    names = [f"eu-{n}" for n in range(10)]
    for name in names:
        live.store.add(name, SPEC)
    live.sweep(*names)
    for instance in live.runner.instances.values():
        instance["state"] = "stopped"
    live.seconds = 10_000.0
    live.sweep(*names)
    replaced = [n for n in names if REPLACEMENTS_ANNOTATION in live.store.get(n).annotations]
    assert len(replaced) == 2


def test_replacements_end_in_failed_once_exhausted() -> None:
    live = Live(max_replacements=1)
    live.store.add("eu-1", SPEC)
    live.seconds = 10_000.0
    for _ in range(3):
        live.sweep("eu-1")  # created Ready, then (stopped) replaced once, then given up
        for instance in live.runner.instances.values():
            instance["state"] = "stopped"
    assert live.store.get("eu-1").status["phase"] == "Failed"
    assert live.condition("eu-1", "Ready")["reason"] == "ReplacementsExhausted"
    assert len(live.created_names()) == 2


def swept_with_access(tmp_path: Path) -> tuple[Credentials, Live]:
    """A Live path with an access policy (the namespace's credential kept under ``tmp_path``) that
    has swept Proxy eu-1 once."""
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    credentials.refresh({"crawlers": "uid-of-crawlers"})
    live = Live(access=AccessPolicy(credentials, {"home-kvm": ("10.0.0.0/8",)}))
    live.store.add("eu-1", SPEC)
    live.sweep("eu-1")
    return credentials, live


def test_with_access_an_instance_gets_the_hash_never_the_password(tmp_path: Path) -> None:
    credentials, live = swept_with_access(tmp_path)
    credential = credentials.current("crawlers")
    [create] = [op for call in live.runner.calls if call.verb == "create" for op in call.operations]
    # The namespace's user, and the probe's identity for this instance alone (the same hash).
    identity = instance_identity(create.args["name"])
    assert create.args["access"] == {"users": [{"name": credential.user, "password_hash": credential.password_hash},
                                               {"name": identity, "password_hash": credential.password_hash}],
                                     "allowed_sources": ["10.0.0.0/8"], "allowed_destinations": [], "open": False}
    assert credential.password not in repr(live.runner.calls)
    assert live.store.get("eu-1").status["credentialGeneration"] == credential.generation
    # Built to require credentials, but nothing probes it here (probe: none), so nothing measured it.
    assert (live.condition("eu-1", "Private")["status"], live.condition("eu-1", "Private")["reason"]) == (
        "Unknown", "Unverified")


def test_a_predecessor_kept_through_a_rotation_keeps_its_own_credential(tmp_path: Path) -> None:
    """A rotation replaces the instances (the credential is part of the build hash); while the
    successor boots, the Proxy stays Ready on the old instance, which answers only the previous
    credential: its status keeps that generation, which discovery hands out and the probe uses."""
    credentials, live = swept_with_access(tmp_path)
    previous = credentials.current("crawlers")
    for stored in [f for f in (tmp_path / "credentials").rglob("*") if f.is_file()]:
        stored.unlink()  # the documented rotation: delete the namespace's credential
    credentials.refresh({"crawlers": "uid-of-crawlers"})
    live.runner.ip = None  # the successor boots
    live.sweep("eu-1")  # created
    live.sweep("eu-1")  # listed, still booting
    assert credentials.current("crawlers").generation != previous.generation
    assert len(live.runner.instances) == 2
    status = live.store.get("eu-1").status
    assert (status["phase"], status["credentialGeneration"]) == ("Ready", previous.generation), status


def test_a_pool_member_pinned_to_a_draining_host_is_told_to_change_its_pools_placement() -> None:
    live = Live()
    live.store.add("scrapers-0", {**SPEC, "location": "h1"})
    # What a member's metadata holds (labels and owner references are read from the object as read).
    live.store.objects[("crawlers", "scrapers-0")].raw = {"metadata": {
        "labels": {"crawl.example.com/pool": "scrapers"},
        "ownerReferences": [{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": "scrapers",
                             "uid": "pool-uid", "controller": True}]}}
    live.sweep("scrapers-0")
    live.path = LivePath(LiveSettings(), LiveParts(live.writer, lambda _stamp: live.seconds),
                         SweepPass(OWNER, live.contain, live.count), NOT_PROBED, {"h1": "draining"})
    live.runner.calls.clear()
    live.sweep("scrapers-0")
    assert live.runner.verbs() == ["list"]  # not moved: its pool's placement says h1
    told = live.condition("scrapers-0", "HostActive")
    assert (told["status"], told["reason"]) == ("False", "HostDraining")
    assert told["message"].startswith("the placement of ProxyPool scrapers pins this Proxy to host h1")
    assert live.store.get("scrapers-0").status["phase"] == "Ready"
    assert live.store.reasons("crawlers/scrapers-0")[-1] == "HostDraining"
