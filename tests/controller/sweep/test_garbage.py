"""sweep/garbage.py: which listed instances GarbageCollector deletes (owner tag, grace period,
complete listings only, present and unreconciled Proxies protected), with listings built by the
test and deletes through a real ProviderClient on the runner fake of tests/support."""

from __future__ import annotations

import datetime
import logging

import pytest

from egress_proxies.providers.client import Instance, Listing, ProviderClient, ProviderType
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.resources import times
from egress_proxies.resources.proxy import OWNER_TAG, PROXY_TAG, UID_TAG, Proxy
from egress_proxies.sweep.garbage import GarbageCollector, GarbageSettings
from support.controller.fakes import FakeRunner, MemoryStore

OWNER = "test-owner"
GRACE = 600.0


def instance(name: str, uid: str = "uid-gone", owner: str | None = OWNER, age: float = GRACE + 60,
             key: str = "crawlers/gone", created: str | None = "") -> Instance:
    tags = {UID_TAG: uid, PROXY_TAG: key, **({OWNER_TAG: owner} if owner else {})}
    stamp = times.stamp(times.now() - datetime.timedelta(seconds=age)) if created == "" else created
    return Instance(provider_id=f"kvm://hosts/h1/domains/{name}", name=name, state="running", tags=tags,
                    created=stamp)


def proxy(name: str, uid: str) -> Proxy:
    return Proxy(namespace="crawlers", name=name, uid=uid, spec={"provider": "home-kvm"})


class Collector:
    def __init__(self, dry_run: bool = False) -> None:
        self.store = MemoryStore()
        self.runner = FakeRunner()
        self.collected: list[str] = []
        self.calls = 0
        self.gc = GarbageCollector(self.store, GarbageSettings(grace_seconds=GRACE, dry_run=dry_run), OWNER,
                                   self.count, self.collected.append)
        self.clients = {name: ProviderClient(self.runner, "providers.yaml", name, ProviderType.KVM)
                        for name in ("home-kvm", "other")}

    def count(self, counter: str, amount: int) -> None:
        assert counter == "runner_calls"
        self.calls += amount

    def collect(self, *instances: Instance, proxies: tuple[Proxy, ...] = (), unreconciled: tuple[Proxy, ...] = (),
                error: ProviderError | None = None) -> list[str]:
        """Runs one collection; returns the provider IDs deleted at the provider."""
        for i in instances:
            self.runner.instances[i.provider_id] = {"provider_id": i.provider_id, "tags": dict(i.tags)}
        self.gc.collect(proxies, unreconciled, self.clients,
                        {"home-kvm": Listing(instances=list(instances), error=error)})
        return sorted(i.provider_id for i in instances if i.provider_id not in self.runner.instances)


@pytest.fixture
def collector() -> Collector:
    return Collector()


def test_an_old_orphan_of_ours_is_deleted_with_an_event_on_its_former_proxy(collector: Collector) -> None:
    orphan = instance("old")
    assert collector.collect(orphan) == [orphan.provider_id]
    assert collector.collected == [orphan.provider_id] and collector.calls == 1
    assert collector.runner.verbs() == ["gc"]
    assert collector.store.events == [("crawlers/gone", "Normal", "GarbageCollected",
                                       f"orphaned instance {orphan.provider_id} deleted")]


def test_an_orphan_younger_than_the_grace_period_stays(collector: Collector) -> None:
    assert collector.collect(instance("young", age=GRACE - 60)) == []
    assert collector.runner.calls == [] and collector.collected == []


@pytest.mark.parametrize("created", [None, "yesterday"])
def test_an_instance_of_unknown_age_stays(collector: Collector, created: str | None) -> None:
    assert collector.collect(instance("ageless", created=created)) == []


@pytest.mark.parametrize("owner", [None, "someone-else"])
def test_never_an_instance_without_our_owner_tag(collector: Collector, owner: str | None) -> None:
    assert collector.collect(instance("foreign", owner=owner)) == []


def test_the_instance_of_a_present_proxy_stays(collector: Collector) -> None:
    assert collector.collect(instance("live", uid="uid-1"), proxies=(proxy("eu-1", "uid-1"),)) == []


def test_nothing_is_collected_from_an_incomplete_listing(collector: Collector,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    error = ProviderError(ErrorClass.TRANSIENT, "host h2 unreachable")
    assert collector.collect(instance("old"), error=error) == []
    assert "garbage collection skipped on provider home-kvm" in caplog.text


def test_an_incomplete_listing_stops_collection_only_on_its_own_provider(collector: Collector) -> None:
    orphan = instance("old-other")
    collector.runner.provider = "other"
    collector.runner.instances[orphan.provider_id] = {"provider_id": orphan.provider_id}
    collector.gc.collect((), (), collector.clients, {
        "home-kvm": Listing(instances=[instance("old")], error=ProviderError(ErrorClass.TRANSIENT, "down")),
        "other": Listing(instances=[orphan])})
    assert collector.collected == [orphan.provider_id]
    assert orphan.provider_id not in collector.runner.instances


def test_an_unreconciled_proxy_protects_its_instance_by_uid(collector: Collector) -> None:
    assert collector.collect(instance("invalid", uid="uid-1", key="crawlers/eu-1"),
                             unreconciled=(proxy("renamed", "uid-1"),)) == []


def test_an_unreconciled_proxy_of_unknown_uid_protects_its_instance_by_key(collector: Collector) -> None:
    assert collector.collect(instance("defective", uid="uid-1", key="crawlers/eu-1"),
                             unreconciled=(proxy("eu-1", ""),)) == []


def test_a_proxy_made_again_under_its_name_does_not_protect_the_old_instance(collector: Collector) -> None:
    old = instance("old", uid="uid-old", key="crawlers/eu-1")
    assert collector.collect(old, proxies=(proxy("eu-1", "uid-new"),)) == [old.provider_id]


def test_a_dry_run_reports_and_deletes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    collector = Collector(dry_run=True)
    orphan = instance("old")
    assert collector.collect(orphan) == []
    assert collector.collected == [orphan.provider_id]
    assert collector.runner.calls == [] and collector.store.events == []
    assert "(dry run, not deleting)" in caplog.text


def test_a_failed_delete_is_logged_without_an_event(collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    orphan = instance("stuck")
    collector.runner.fail[("kvm_proxy", orphan.provider_id)] = ("transient", "host busy")
    assert collector.collect(orphan) == []
    assert collector.store.events == []
    assert f"garbage collection of {orphan.provider_id} failed (transient: host busy)" in caplog.text
