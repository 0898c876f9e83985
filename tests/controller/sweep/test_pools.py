"""sweep/pools.py: the pools' part of a sweep -- PoolReconciler's I/O around ``placement``'s
decisions (the decisions themselves: test_placement.py) and ProviderHealth -- against the
directory source's pools (real files on tmp_path; no runner: members are Proxy files). Through
the real runner and libvirt's test driver: scenarios/test_directory_pools.py; through the
Kubernetes API emulator: scenarios/test_pools_emulators.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress_proxies.resources.pool import SERIAL_ANNOTATION
from egress_proxies.resources.proxy import FINALIZER, Proxy
from egress_proxies.serving.discovery import PoolFloor
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sources.directory_pools import DirectoryPools
from egress_proxies.sweep.pools import PoolReconciler, ProviderHealth

HEALTHY = ProviderHealth(configured=("a", "b"), invalid={})
SPEC: dict[str, Any] = {"replicas": 3, "template": {"cloudInit": "#cloud-config\n"},
                        "placement": [{"provider": "a", "weight": 2}, {"provider": "b"}]}


class Pools:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.store = DirectoryStore(directory)
        self.source = DirectoryPools(self.store)
        self.now = 1_000_000.0
        self.reconciler = PoolReconciler(self.source, self.store, now=lambda: self.now)

    def write(self, name: str = "eu", spec: Any = None) -> None:
        (self.directory / f"{name}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": name, "namespace": "crawlers"}, "spec": SPEC if spec is None else spec}))

    def proxies(self) -> list[Proxy]:
        return self.store.list_proxies()[0]

    def sweep(self, health: ProviderHealth = HEALTHY) -> bool:
        return self.reconciler.reconcile(self.proxies(), health)

    def members(self) -> dict[str, str]:
        """Member name -> its placement's provider."""
        return {p.name: p.provider for p in self.proxies()}

    def status(self, name: str = "eu") -> dict[str, Any]:
        return next(p for p in self.source.list_pools() if p.name == name).status


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[Pools]:
    directory = tmp_path / "proxies"
    directory.mkdir()
    made = Pools(directory)
    yield made
    made.store.close()


def test_a_pool_gets_our_finalizer_and_its_members_by_weight(pools: Pools) -> None:
    pools.write()
    assert pools.sweep() is True
    assert sorted(pools.members().values()) == ["a", "a", "b"]
    [pool] = pools.source.list_pools()
    assert FINALIZER in pool.finalizers and pool.annotations[SERIAL_ANNOTATION] == "3"
    assert (pool.status["desiredReplicas"], pool.status["phase"]) == (3, "Progressing")
    assert "3 to create" in str(pool.status["conditions"]) and pools.reconciler.failed == {}


def test_members_that_exist_are_not_made_again(pools: Pools) -> None:
    pools.write()
    pools.sweep()
    first = pools.members()
    assert pools.sweep() is False
    assert pools.members() == first
    assert [(row["desired"], row["members"]) for row in pools.status()["placements"]] == [(2, 2), (1, 1)]


def test_scaling_down_deletes_members_and_says_why(pools: Pools, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    pools.write()
    pools.sweep()
    pools.write(spec={**SPEC, "replicas": 1})
    assert pools.sweep() is True
    assert len(pools.members()) == 1
    assert "MemberDeleted" in caplog.text and "scaled down" in caplog.text


def test_a_malformed_pool_fails_alone_naming_the_field_with_one_warning(pools: Pools,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    pools.write("bad", {**SPEC, "replicas": "three"})
    pools.write("good")
    pools.sweep()
    pools.sweep()
    assert sorted(pools.members().values()) == ["a", "a", "b"]  # the good pool's, nothing of the bad one's
    status = pools.status("bad")
    assert status["phase"] == "Failed" and "spec.replicas" in status["conditions"][0]["message"]
    assert "crawlers/bad" in pools.reconciler.failed
    assert caplog.text.count("InvalidSpec") == 1  # one Event, not one per sweep


def test_a_template_the_proxy_schema_refuses_fails_the_pool_once_not_each_member(pools: Pools) -> None:
    pools.write(spec={**SPEC, "template": {"cloudInit": "#cloud-config\n", "port": 0}})
    pools.sweep()
    assert pools.members() == {}
    assert "spec.template.port" in pools.status()["conditions"][0]["message"]


@pytest.mark.parametrize(("metadata", "field"), [
    ({"name": "../../eu"}, "metadata.name: must be a DNS-1123 subdomain"),
    ({"namespace": "../x"}, "metadata.namespace: must be a DNS-1123 label"),
])
def test_a_pool_whose_name_is_no_kubernetes_name_fails_before_a_member_is_written(
        pools: Pools, metadata: dict[str, str], field: str) -> None:
    # Members are named after the pool (files, for the directory source): `../../eu` would
    # write `../../eu-<serial>.yaml` outside the directory.
    (pools.directory / "eu.yaml").write_text(yaml.safe_dump({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawlers", **metadata}, "spec": SPEC}))
    assert pools.sweep() is False
    assert pools.members() == {}
    assert sorted(p.name for p in pools.directory.parent.rglob("*.yaml")) == [".eu.pool.yaml", "eu.yaml"]
    [pool] = pools.source.list_pools()
    assert pool.status["phase"] == "Failed" and field in pool.status["conditions"][0]["message"]


def test_a_provider_not_configured_degrades_its_placement_and_the_pool_stays_valid(pools: Pools,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    """The provider config changes under a pool (a provider removed, or not added yet): its
    placement is degraded like a failing one, with an Event naming the provider, and the others
    carry the pool within maxSurge."""
    pools.write()
    pools.sweep(ProviderHealth(configured=("a",), invalid={}))
    assert sorted(pools.members().values()) == ["a", "a", "a"]
    status = pools.status()
    assert status["phase"] != "Failed" and status["placements"][1]["state"] == "Degraded"
    assert "provider b is not in the provider config (configured: a)" in status["placements"][1]["reason"]
    assert "Warning: PlacementDegraded: placement[1] b: provider b is not in the provider config" in caplog.text


def test_a_sweep_creates_at_most_a_step_of_members_spread_over_the_placements(pools: Pools) -> None:
    pools.reconciler.step = 4
    pools.write(spec={**SPEC, "replicas": 9})
    pools.sweep()
    assert sorted(pools.members().values()) == ["a", "a", "b", "b"]  # round-robin: both providers work
    assert "5 to create" not in str(pools.status()["conditions"])  # the status says what is left
    pools.sweep()
    pools.sweep()
    assert sorted(pools.members().values()) == ["a"] * 6 + ["b"] * 3
    pools.write(spec={**SPEC, "replicas": 0})
    pools.sweep()
    assert len(pools.members()) == 5  # deletes go in steps too


def test_a_placement_whose_provider_is_broken_sends_its_share_to_the_others(pools: Pools) -> None:
    pools.write()
    pools.sweep(ProviderHealth(configured=("a", "b"), invalid={"b": "kvm.uri: is required"}))
    assert sorted(pools.members().values()) == ["a", "a", "a"]
    assert "placement[1]" in pools.reconciler.failed["crawlers/eu"]


def test_pools_that_cannot_be_listed_decide_nothing(tmp_path: Path) -> None:
    pools = Pools(tmp_path / "missing")
    assert pools.reconciler.reconcile([], HEALTHY) is False
    assert "does not exist" in pools.reconciler.failed["*"]


def test_a_member_whose_pool_is_gone_is_deleted(pools: Pools) -> None:
    pools.write()
    pools.sweep()
    (pools.directory / "eu.yaml").unlink()
    for path in pools.directory.glob(".eu*"):
        path.unlink()  # the pool's record too: nothing says the pool ever existed
    assert pools.sweep() is True
    assert pools.members() == {}


def test_deleting_the_pool_deletes_its_members_then_releases_it(pools: Pools) -> None:
    pools.write()
    pools.sweep()
    (pools.directory / "eu.yaml").unlink()
    assert pools.sweep() is True  # members deleted; the pool waits for them
    assert pools.members() == {}
    assert pools.sweep() is False
    assert pools.source.list_pools() == []


def test_a_crash_on_one_pool_is_recorded_on_it_and_the_others_go_on(pools: Pools,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pools.write("broken")
    pools.write("good")
    create = pools.source.create_proxy

    def create_proxy(namespace: str, body: dict[str, Any]) -> None:
        if body["metadata"]["name"].startswith("broken"):
            raise RuntimeError("boom")
        create(namespace, body)

    monkeypatch.setattr(pools.source, "create_proxy", create_proxy)
    pools.sweep()
    assert len(pools.members()) == 3
    assert pools.reconciler.failed["crawlers/broken"] == "RuntimeError: boom"
    assert "the controller failed on this pool (RuntimeError: boom)" in str(pools.status("broken")["conditions"])


@pytest.mark.parametrize(("health", "why"), [
    (ProviderHealth(("a",), {"a": "bad"}), "provider a cannot be used: its section of the provider config is invalid"),
    (ProviderHealth(("b",), {}), "provider a is not in the provider config (configured: b)"),
    (ProviderHealth(("a",), {}, {"a": ("host down", 59.0)}), None),  # not for long enough: members decide
    (ProviderHealth(("a",), {}, {"a": ("host down", 60.0)}), "provider a cannot be listed for 60 s (host down)"),
    (ProviderHealth(("a",), {}), None),
])
def test_provider_health_says_why_a_placement_cannot_be_used(health: ProviderHealth, why: str | None) -> None:
    assert health.broken("a", failover_after=60.0) == why


def test_a_process_that_does_not_sweep_reads_the_floors_a_sweep_records(pools: Pools) -> None:
    pools.write("eu", {**SPEC, "minReady": 2})
    pools.write("bad", {**SPEC, "replicas": "three"})  # invalid: no floor
    floors = pools.reconciler.read_floors()
    [eu] = [p for p in pools.source.list_pools() if p.name == "eu"]
    assert floors == {("crawlers", "eu"): PoolFloor(eu.uid, 2)}
    pools.sweep()
    assert pools.reconciler.floors == floors
