"""The reconciler's decisions, with fakes of the store and the runner (tests/support/controller/fakes.py).

The same behaviours run end to end through ansible-runner, the real modules, libvirt and the
Kubernetes API emulator in test_controller_e2e.py; these pin the decision table exactly,
including cases the real backends cannot be made to produce on demand.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from egress_proxies.resources.conditions import find_condition
from egress_proxies.resources.proxy import (
    FINALIZER,
    OWNER_TAG,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_TAG,
    UID_TAG,
    instance_name,
    spec_hash,
)
from egress_proxies.serving.credentials import Credentials
from egress_proxies.sources.file_secrets import FileSecrets
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts
from support.controller.fakes import FakeRunner, MemoryStore
from support.controller.fakes import ManualClock as Clock

SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "test-owner", "providers": [
        {"name": "home-kvm", "type": "kvm", "kvm": {}}, {"name": "cluster", "type": "kubernetes",
                                                          "kubernetes": {}}]}))
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


def reconciler(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock,
               **settings: object) -> Reconciler:
    return Reconciler(store, runner, str(config), ReconcileSettings(**settings),  # type: ignore[arg-type]
                      SweepParts(backoff=Backoff(clock=clock, rng=lambda: 0.5)))


def test_create_ready_with_finalizer_status_and_tags(store: MemoryStore, runner: FakeRunner, config: Path,
                                                      clock: Clock) -> None:
    proxy = store.add("eu-1", SPEC)
    rec = reconciler(store, runner, config, clock)
    report = rec.sweep()
    assert report.ok and report.created == 1
    # What discovery serves and the phase gauge: the sweep's end state.
    assert [p.key for p in rec.discovery.swept] == ["crawlers/eu-1"]
    assert rec.discovery.swept[0].status["endpoint"] == "192.0.2.10:3128"
    assert REGISTRY.get_sample_value("egress_proxies_proxies", {"phase": "Ready"}) == 1
    # One list per provider, one batched create: never a runner call per Proxy.
    assert runner.verbs() == ["list", "list", "create"]
    saved = store.get("eu-1")
    assert FINALIZER in saved.finalizers
    assert saved.status["phase"] == "Ready"
    assert saved.status["endpoint"] == "192.0.2.10:3128"
    assert saved.status["observedGeneration"] == 1
    assert saved.status["conditions"][0]["reason"] == "InstanceRunning"
    assert saved.annotations[SPEC_HASH_ANNOTATION] == spec_hash(SPEC)
    (instance,) = runner.instances.values()
    assert instance["tags"] == {OWNER_TAG: "test-owner", "crawl.example.com/proxy": "crawlers/eu-1",
                                UID_TAG: proxy.uid, SPEC_HASH_TAG: spec_hash(SPEC)}
    assert store.reasons() == ["Created"]

    again = reconciler(store, runner, config, clock).sweep()
    assert again.created == 0 and runner.verbs()[-2:] == ["list", "list"]


def test_user_data_travels_base64(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    store.add("eu-1", {"provider": "home-kvm", "cloudInit": "## template: jinja\n{{ lookup('pipe', 'id') }}\n"})
    reconciler(store, runner, config, clock).sweep()
    (create,) = [op for call in runner.calls if call.verb == "create" for op in call.operations]
    assert create.args["user_data_encoding"] == "base64"
    assert "{{" not in create.args["user_data"]


def test_many_proxies_are_batched(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    for n in range(7):
        store.add(f"p{n}", SPEC)
    reconciler(store, runner, config, clock, batch_size=3).sweep()
    creates = sorted(len(call.operations) for call in runner.calls if call.verb == "create")
    assert creates == [1, 3, 3]  # bounded batches (run side by side, so in any order)


def test_spec_change_makes_before_it_breaks(store: MemoryStore, runner: FakeRunner, config: Path,
                                            clock: Clock) -> None:
    store.add("eu-1", SPEC)
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    (old_id,) = runner.instances
    store.update_spec("eu-1", port=8080)
    rec.sweep()
    creates = [i for i, c in enumerate(runner.calls) if c.verb == "create"]
    deletes = [i for i, c in enumerate(runner.calls) if c.verb == "delete"]
    assert len(creates) == 2 and len(deletes) == 1 and creates[1] < deletes[0]
    assert runner.calls[deletes[0]].operations[0].args["provider_id"] == old_id
    (new_id,) = runner.instances
    saved = store.get("eu-1")
    assert saved.status["providerID"] == new_id != old_id
    assert saved.status["endpoint"].endswith(":8080")
    assert saved.status["observedGeneration"] == 2
    assert saved.annotations[SPEC_HASH_ANNOTATION] == spec_hash({**SPEC, "port": 8080})
    assert store.reasons() == ["Created", "Replacing", "Replaced"]


def test_old_instance_stays_until_the_new_one_is_ready(store: MemoryStore, runner: FakeRunner, config: Path,
                                                       clock: Clock) -> None:
    store.add("eu-1", SPEC)
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    runner.ip = None  # the successor boots without an IP for now
    store.update_spec("eu-1", port=8080)
    rec.sweep()
    assert len(runner.instances) == 2
    assert "delete" not in runner.verbs()
    assert store.get("eu-1").status["phase"] == "Provisioning"
    for instance in runner.instances.values():
        instance.update(ip="192.0.2.11", endpoint="192.0.2.11:8080")
    rec.sweep()
    assert len(runner.instances) == 1
    assert store.get("eu-1").status["phase"] == "Ready"


def test_restart_after_create_adopts_instead_of_duplicating(store: MemoryStore, runner: FakeRunner, config: Path,
                                                           clock: Clock) -> None:
    proxy = store.add("eu-1", SPEC)
    # A controller created the instance and died before writing status.
    name = instance_name(proxy, spec_hash(SPEC))
    runner.instances[f"kvm://hosts/h1/domains/{name}"] = {
        "provider_id": f"kvm://hosts/h1/domains/{name}", "name": name, "location": "h1", "state": "running",
        "ip": "192.0.2.10", "created": "2026-01-01T00:00:00Z",
        "tags": {OWNER_TAG: "test-owner", UID_TAG: proxy.uid, SPEC_HASH_TAG: spec_hash(SPEC)}}
    reconciler(store, runner, config, clock).sweep()
    assert "create" not in runner.verbs()
    assert len(runner.instances) == 1
    assert store.get("eu-1").status["providerID"] == f"kvm://hosts/h1/domains/{name}"


def test_transient_create_failure_backs_off_exponentially(store: MemoryStore, runner: FakeRunner, config: Path,
                                                          clock: Clock) -> None:
    proxy = store.add("eu-1", SPEC)
    runner.fail[("kvm_proxy", instance_name(proxy, spec_hash(SPEC)))] = ("transient", "host h1 does not answer")
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Pending"
    assert saved.status["conditions"][0]["reason"] == "CreateFailed"
    assert "transient: host h1 does not answer (next attempt in 5 s)" in saved.status["conditions"][0]["message"]
    rec.sweep()  # too early: no second attempt
    assert runner.verbs().count("create") == 1
    assert store.reasons() == ["CreateFailed"]
    clock.now += 5
    rec.sweep()
    assert runner.verbs().count("create") == 2
    assert "next attempt in 10 s" in store.get("eu-1").status["conditions"][0]["message"]
    assert store.reasons() == ["CreateFailed"]  # the same failure again: no second Event


def test_a_batch_failing_transient_backs_off_the_provider_not_each_proxy(store: MemoryStore, runner: FakeRunner,
                                                                           config: Path, clock: Clock) -> None:
    # Items of one batch failing transient (the host dropped the connection; each message names
    # its item, as the KVM module's do): the provider's failure. The batch is tried again after
    # the provider's short backoff, however often it failed, and no Proxy's own backoff grows.
    proxies = [store.add(f"eu-{n}", SPEC) for n in range(3)]
    for index, proxy in enumerate(proxies):
        name = instance_name(proxy, spec_hash(SPEC))
        runner.fail[("kvm_proxy", name)] = (
            "transient", f"operations[{index}]: looking up domain {name}: internal error: client socket is closed")
    rec = reconciler(store, runner, config, clock)
    delays = []
    for _ in range(6):
        rec.sweep()
        message = store.get("eu-0").status["conditions"][0]["message"]
        delays.append(int(message.rsplit("next attempt in ", 1)[1].split(" s")[0]))
        rec.sweep()  # too early: nothing is tried
        clock.now += delays[-1]
    assert delays == [2, 4, 8, 16, 30, 30]  # capped at 30 s, not the 300 s of a Proxy's own failures
    assert runner.verbs().count("create") == 6  # one batch run per attempt
    assert all(rec.backoff.due(p.uid) for p in proxies)
    runner.fail.clear()
    rec.sweep()
    assert all(store.get(p.name).status["phase"] == "Ready" for p in proxies)
    # One success clears the provider's backoff: a new Proxy is created at once.
    store.add("eu-9", SPEC)
    rec.sweep()
    assert store.get("eu-9").status["phase"] == "Ready"


def test_failed_listings_never_delay_the_create_once_the_provider_lists_again(
        store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    # The chaos run's last cause: each failed listing grew every unlisted Proxy's own backoff, so
    # after a flapping minute half the Proxies waited minutes with their host answering again.
    store.add("eu-1", SPEC)
    runner.list_failure = ("transient", "connecting to KVM host h1: Cannot recv data: Connection reset by peer")
    rec = reconciler(store, runner, config, clock)
    for _ in range(8):
        rec.sweep()
        clock.now += 1
    condition = store.get("eu-1").status["conditions"][0]
    assert condition["reason"] == "ListFailed" and condition["message"].endswith("(tried again next sweep)")
    assert runner.verbs().count("create") == 0
    runner.list_failure = None
    rec.sweep()
    assert runner.verbs().count("create") == 1
    assert store.get("eu-1").status["phase"] == "Ready"


def test_one_item_failing_alone_backs_off_its_own_proxy(store: MemoryStore, runner: FakeRunner, config: Path,
                                                        clock: Clock) -> None:
    proxies = [store.add(f"eu-{n}", SPEC) for n in range(3)]
    name = instance_name(proxies[0], spec_hash(SPEC))
    runner.fail[("kvm_proxy", name)] = ("transient", f"{name}: disk full on host h1")
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    assert not rec.backoff.due(proxies[0].uid)
    assert "next attempt in 5 s" in store.get("eu-0").status["conditions"][0]["message"]
    assert [store.get(p.name).status["phase"] for p in proxies[1:]] == ["Ready", "Ready"]


def test_permanent_create_failure_fails_and_requeues_slowly(store: MemoryStore, runner: FakeRunner, config: Path,
                                                            clock: Clock) -> None:
    proxy = store.add("eu-1", {**SPEC, "image": "windows-95"})
    name = instance_name(proxy, spec_hash({**SPEC, "image": "windows-95"}))
    runner.fail[("kvm_proxy", name)] = ("permanent", "image: 'windows-95' is not an image of this provider")
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    assert store.get("eu-1").status["phase"] == "Failed"
    clock.now += 300
    rec.sweep()
    assert runner.verbs().count("create") == 1
    clock.now += 301
    rec.sweep()
    assert runner.verbs().count("create") == 2


def test_unknown_provider_is_a_permanent_condition(store: MemoryStore, runner: FakeRunner, config: Path,
                                                   clock: Clock) -> None:
    store.add("eu-1", {"provider": "gone-provider"})
    reconciler(store, runner, config, clock).sweep()
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Failed"
    assert saved.status["conditions"][0]["reason"] == "ProviderNotConfigured"
    assert "gone-provider" in saved.status["conditions"][0]["message"]
    assert "create" not in runner.verbs()


# -- deletion, in the order of docs/contract.md ----------------------------------------------


def ready_then_deleted(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock,
                       annotations: dict[str, str] | None = None) -> tuple[Reconciler, str]:
    store.add("eu-1", SPEC, annotations=annotations)
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    provider_id = store.get("eu-1").status["providerID"]
    store.delete("eu-1")
    return rec, provider_id


def test_delete_without_provider_id_releases(store: MemoryStore, runner: FakeRunner, config: Path,
                                             clock: Clock) -> None:
    store.add("eu-1", SPEC)
    proxy = store.objects[("crawlers", "eu-1")]
    proxy.finalizers = [FINALIZER]
    store.delete("eu-1")
    rec = reconciler(store, runner, config, clock)
    rec.sweep()
    assert not store.exists("eu-1")
    assert "get" not in runner.verbs() and "delete" not in runner.verbs()
    assert rec.discovery.swept == []  # a released Proxy is no longer reported


def test_delete_with_skip_cleanup_abandons_before_the_provider_lookup(store: MemoryStore, runner: FakeRunner,
                                                                      config: Path, clock: Clock) -> None:
    rec, provider_id = ready_then_deleted(store, runner, config, clock,
                                          {"crawl.example.com/skip-cleanup": "true"})
    store.objects[("crawlers", "eu-1")].spec["provider"] = "removed-from-config"
    rec.sweep()
    assert not store.exists("eu-1")
    assert provider_id in runner.instances  # abandoned, not deleted
    assert "get" not in runner.verbs() and "delete" not in runner.verbs()
    assert store.reasons()[-1] == "Abandoned"


def test_delete_with_provider_missing_is_permanent_until_skip_cleanup(store: MemoryStore, runner: FakeRunner,
                                                                      config: Path, clock: Clock) -> None:
    rec, _ = ready_then_deleted(store, runner, config, clock)
    store.objects[("crawlers", "eu-1")].spec["provider"] = "removed-from-config"
    rec.sweep()
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Deleting"
    assert saved.status["conditions"][0]["reason"] == "ProviderNotConfigured"
    assert "skip-cleanup" in saved.status["conditions"][0]["message"]
    store.objects[("crawlers", "eu-1")].annotations["crawl.example.com/skip-cleanup"] = "true"
    rec.sweep()
    assert not store.exists("eu-1")


def test_delete_when_get_says_not_found_releases_without_delete(store: MemoryStore, runner: FakeRunner,
                                                                config: Path, clock: Clock) -> None:
    rec, provider_id = ready_then_deleted(store, runner, config, clock)
    del runner.instances[provider_id]  # gone behind our back
    rec.sweep()
    assert not store.exists("eu-1")
    assert runner.verbs()[-1] == "get"


def test_delete_when_get_is_permanent_calls_delete_anyway(store: MemoryStore, runner: FakeRunner, config: Path,
                                                          clock: Clock) -> None:
    rec, provider_id = ready_then_deleted(store, runner, config, clock)
    runner.fail[("kvm_proxy_info", provider_id)] = ("permanent", "host h1 is not configured")
    rec.sweep()
    assert not store.exists("eu-1")
    assert runner.verbs()[-2:] == ["get", "delete"]
    assert provider_id not in runner.instances


def test_delete_when_get_and_delete_both_fail_reports_both(store: MemoryStore, runner: FakeRunner, config: Path,
                                                           clock: Clock) -> None:
    rec, provider_id = ready_then_deleted(store, runner, config, clock)
    runner.fail[("kvm_proxy_info", provider_id)] = ("permanent", "GET-ERROR")
    runner.fail[("kvm_proxy", provider_id)] = ("transient", "DELETE-ERROR")
    rec.sweep()
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Deleting"
    message = saved.status["conditions"][0]["message"]
    assert "GET-ERROR" in message and "DELETE-ERROR" in message
    assert FINALIZER in saved.finalizers


def test_delete_when_get_is_transient_backs_off(store: MemoryStore, runner: FakeRunner, config: Path,
                                                clock: Clock) -> None:
    rec, provider_id = ready_then_deleted(store, runner, config, clock)
    runner.fail[("kvm_proxy_info", provider_id)] = ("transient", "timed out")
    rec.sweep()
    assert store.exists("eu-1") and "delete" not in runner.verbs()
    rec.sweep()
    assert runner.verbs().count("get") == 1  # backing off
    del runner.fail[("kvm_proxy_info", provider_id)]
    clock.now += 10
    rec.sweep()
    assert not store.exists("eu-1")


def test_status_conflicts_are_retried_with_a_fresh_read(store: MemoryStore, runner: FakeRunner, config: Path,
                                                        clock: Clock) -> None:
    store.add("eu-1", SPEC)
    store.conflicts_to_inject = 3
    reconciler(store, runner, config, clock).sweep()
    assert store.get("eu-1").status["phase"] == "Ready"


# -- garbage collection -----------------------------------------------------------------------


def orphan(runner: FakeRunner, name: str, owner: str = "test-owner", created: str = "2026-01-01T00:00:00Z") -> str:
    provider_id = f"kvm://hosts/h1/domains/{name}"
    runner.instances[provider_id] = {"provider_id": provider_id, "name": name, "location": "h1",
                                     "state": "running", "ip": None, "created": created,
                                     "tags": {OWNER_TAG: owner, UID_TAG: "no-such-uid",
                                              "crawl.example.com/proxy": "crawlers/old"}}
    return provider_id


def test_gc_deletes_old_orphans_only(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    old = orphan(runner, "old")
    young = orphan(runner, "young", created="2999-01-01T00:00:00Z")
    report = reconciler(store, runner, config, clock, gc_grace_seconds=60).sweep()
    assert report.gc == [old]
    assert old not in runner.instances and young in runner.instances
    assert store.reasons("crawlers/old") == ["GarbageCollected"]


def test_gc_never_touches_foreign_owners(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    foreign = orphan(runner, "foreign", owner="other-cluster")
    # Even if a listing returned it, the controller checks the owner tag itself.
    runner.filter_by_tags = False
    report = reconciler(store, runner, config, clock, gc_grace_seconds=0).sweep()
    assert report.gc == [] and foreign in runner.instances


def test_gc_does_nothing_when_a_listing_failed(store: MemoryStore, runner: FakeRunner, config: Path,
                                               clock: Clock) -> None:
    old = orphan(runner, "old")
    runner.list_failure = ("transient", "listing failed on KVM host(s): h2: does not answer")
    report = reconciler(store, runner, config, clock, gc_grace_seconds=0).sweep()
    assert report.gc == [] and old in runner.instances


def test_gc_does_nothing_when_listing_proxies_failed(store: MemoryStore, runner: FakeRunner, config: Path,
                                                     clock: Clock) -> None:
    old = orphan(runner, "old")

    def broken() -> tuple[list[object], str]:
        from egress_proxies.sources.store import StoreError

        raise StoreError("the API server is down")

    store.list_proxies = broken  # type: ignore[assignment,method-assign]
    report = reconciler(store, runner, config, clock, gc_grace_seconds=0).sweep()
    assert not report.ok and old in runner.instances
    # The listing runs beside the read (the config check is no provider call); nothing is deleted.
    assert set(runner.verbs()) <= {"list"}


def test_gc_dry_run_only_reports(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock) -> None:
    old = orphan(runner, "old")
    report = reconciler(store, runner, config, clock, gc_grace_seconds=0, gc_dry_run=True).sweep()
    assert report.gc == [old] and old in runner.instances
    assert "gc" not in runner.verbs()


# -- credentials bound to namespaces (issue 26, rows 9 and 10) --------------------------------------


def with_credentials(store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock,
                     directory: Path) -> tuple[Reconciler, Credentials]:
    credentials = Credentials(FileSecrets(directory))
    return Reconciler(store, runner, str(config),
                      parts=SweepParts(backoff=Backoff(clock=clock, rng=lambda: 0.5),
                                       credentials=credentials)), credentials


def test_each_sweep_binds_the_credentials_to_the_namespaces_the_source_reports(
        store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock, tmp_path: Path) -> None:
    store.add("eu-1", SPEC)
    rec, credentials = with_credentials(store, runner, config, clock, tmp_path / "credentials")
    rec.sweep()
    first = credentials.current("crawlers")
    assert first.identity == store.namespace_uids["crawlers"]
    store.namespace_uids["crawlers"] = "uid-of-a-namespace-made-again"
    rec.sweep()
    second = credentials.current("crawlers")
    assert second.password != first.password and second.identity == "uid-of-a-namespace-made-again"
    assert store.get("eu-1").status["credentialGeneration"] == second.generation
    assert credentials.by_generation("crawlers", first.generation) is None


def test_proxies_of_a_namespace_the_source_does_not_list_wait_and_get_no_credential(
        store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store.add("eu-1", SPEC)
    store.add("eu-2", SPEC, namespace="team-b")
    store.missing_namespaces.add("crawlers")  # deleted between listing the Proxies and the namespaces
    rec, _ = with_credentials(store, runner, config, clock, tmp_path / "credentials")
    report = rec.sweep()
    assert report.ok and report.created == 1 and not store.get("eu-1").status
    assert sorted(p.name for p in (tmp_path / "credentials").iterdir()) == ["team-b.yaml"]
    assert "namespace(s) crawlers not found: their Proxies wait for the next sweep" in caplog.text
    store.missing_namespaces.clear()
    assert rec.sweep().created == 1


def test_a_proxy_whose_namespace_or_name_is_no_kubernetes_name_fails_alone_and_nothing_is_written_for_it(
        store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock, tmp_path: Path) -> None:
    store.add("eu-1", SPEC, namespace="../../x")
    store.add("../../y", SPEC)
    store.add("eu-2", SPEC)
    rec, _ = with_credentials(store, runner, config, clock, tmp_path / "store" / "credentials")
    report = rec.sweep()
    assert report.created == 1 and store.get("eu-2").status["phase"] == "Ready"
    for key, field in ((("eu-1", "../../x"), "metadata.namespace"), (("../../y", "crawlers"), "metadata.name")):
        status = store.get(*key).status
        assert (status["phase"], status["conditions"][0]["reason"]) == ("Failed", "InvalidSpec")
        assert status["conditions"][0]["message"].startswith(f"{field}: must be a DNS-1123")
        assert FINALIZER not in store.get(*key).finalizers
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml")) == [
        "providers.yaml", "store/credentials/crawlers.yaml"]


def test_namespaces_that_cannot_be_read_fail_the_sweep(store: MemoryStore, runner: FakeRunner, config: Path,
                                                      clock: Clock, tmp_path: Path) -> None:
    def forbidden(_namespaces: Collection[str]) -> dict[str, str]:
        from egress_proxies.sources.store import StoreError

        raise StoreError("listing namespaces: HTTP 403: namespaces is forbidden")

    store.add("eu-1", SPEC)
    store.namespace_identities = forbidden  # type: ignore[assignment,method-assign]
    rec, _ = with_credentials(store, runner, config, clock, tmp_path / "credentials")
    report = rec.sweep()
    assert not report.ok and "namespaces is forbidden" in report.summary()
    assert "create" not in runner.verbs()


def test_a_draining_host_moves_its_proxies_but_not_one_pinned_there(
        store: MemoryStore, runner: FakeRunner, config: Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store.add("eu-1", SPEC)
    store.add("pinned", {**SPEC, "location": "h1"})
    rec = reconciler(store, runner, config, clock)
    assert rec.sweep().created == 2  # both on h1 (the fake's only host)
    runner.location_states = {"home-kvm": {"h1": "draining"}}
    config.write_text(config.read_text() + "# h1 draining\n")  # the file changed: read again
    runner.calls.clear()
    with caplog.at_level(logging.INFO, logger="egress_proxies"):
        report = rec.sweep()
    assert report.ok and report.created == 1  # eu-1's successor; the pinned one stays
    # Make before break: its successor Ready at once here (the fake's), the old one deleted after.
    assert store.reasons("crawlers/eu-1")[-3:] == ["HostDraining", "Replacing", "Replaced"]
    assert store.get("eu-1").status["phase"] == "Ready"
    assert REGISTRY.get_sample_value("egress_proxies_replacements_total",
                                     {"provider": "home-kvm", "reason": "HostDraining"}) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("host h1 is draining: 2 instance(s) left on it" in m for m in messages), messages
    # The pinned one is not moved: its status says so and what to do, with one Warning Event.
    pinned = store.get("pinned").status
    assert pinned["phase"] == "Ready"
    (host_active,) = [c for c in pinned["conditions"] if c["type"] == "HostActive"]
    assert (host_active["status"], host_active["reason"]) == ("False", "HostDraining")
    assert "pins this Proxy to host h1, whose state is draining" in host_active["message"]
    assert "change spec.location to another host" in host_active["message"]
    assert [(kind, reason) for key, kind, reason, _ in store.events if key == "crawlers/pinned"][-1] == (
        "Warning", "HostDraining")
    assert not [c for c in store.get("eu-1").status["conditions"] if c["type"] == "HostActive"]
    # The host's state and what is on it, as gauges (sweep/locations.py).
    labels = {"provider": "home-kvm", "location": "h1"}
    assert REGISTRY.get_sample_value("egress_proxies_location_instances", labels) == 2
    assert REGISTRY.get_sample_value("egress_proxies_location_state", {**labels, "state": "draining"}) == 1
    assert REGISTRY.get_sample_value("egress_proxies_location_state", {**labels, "state": "drained"}) == 0

    # Cordoned: still pinned there, another reason; the Warning once per change, not per sweep.
    runner.location_states = {"home-kvm": {"h1": "cordoned"}}
    config.write_text(config.read_text() + "# h1 cordoned\n")
    rec.sweep()
    rec.sweep()
    assert find_condition(store.get("pinned").status, "HostActive")["reason"] == "HostCordoned"
    pinned_events = [reason for key, kind, reason, _ in store.events if key == "crawlers/pinned" and kind == "Warning"]
    assert pinned_events == ["HostDraining", "HostCordoned"]
    assert REGISTRY.get_sample_value("egress_proxies_location_state", {**labels, "state": "cordoned"}) == 1

    # Active again: the condition clears, and the host has no state series any more.
    runner.location_states = {}
    config.write_text(config.read_text() + "# h1 active\n")
    rec.sweep()
    assert find_condition(store.get("pinned").status, "HostActive") == {}
    assert REGISTRY.get_sample_value("egress_proxies_location_state", {**labels, "state": "cordoned"}) is None
    assert REGISTRY.get_sample_value("egress_proxies_location_instances", labels) == 2
