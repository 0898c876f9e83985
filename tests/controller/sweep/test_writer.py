"""sweep/writer.py: ProxyWriter's status building, its optimistic writes against the memory store
of tests/support/controller/fakes.py (409 -> read again and re-apply; Gone), and the decisions
every part of a sweep shares (finalizer, release, failed, invalid)."""

from __future__ import annotations

import pytest

from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.resources.proxy import FINALIZER, Proxy
from egress_proxies.sources.store import CONFLICT_RETRIES, StoreError
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.writer import ProxyWriter
from support.controller.fakes import MemoryStore

SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


class Now:
    def __init__(self) -> None:
        self.value = T0

    def __call__(self) -> str:
        return self.value


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def now() -> Now:
    return Now()


@pytest.fixture
def writer(store: MemoryStore, now: Now) -> ProxyWriter:
    return ProxyWriter(store, Backoff(clock=lambda: 0.0, rng=lambda: 0.5), now)


def conditions(proxy: Proxy) -> dict[str, dict[str, object]]:
    return {str(c["type"]): c for c in proxy.status["conditions"]}


def test_status_sets_phase_ready_and_generation(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    proxy.generation = 3
    status = writer.status(proxy, "Provisioning", "False", "Provisioning", "waiting", providerID="kvm://x", ip=None)
    assert status["phase"] == "Provisioning" and status["observedGeneration"] == 3
    assert status["providerID"] == "kvm://x" and "ip" not in status  # None fields are not written
    assert status["conditions"] == [{"type": "Ready", "status": "False", "reason": "Provisioning",
                                     "message": "waiting", "lastTransitionTime": T0, "observedGeneration": 3}]


def test_status_keeps_other_conditions_and_their_transition_times(writer: ProxyWriter, store: MemoryStore,
                                                                   now: Now) -> None:
    proxy = store.add("eu-1", SPEC)
    proxy.status = writer.status(proxy, "Ready", "True", "Serving", "ok",
                                 conditions={"Serving": ("True", "Serving", "ok"), "Private": ("True", "R", "m")})
    now.value = T1
    status = writer.status(proxy, "Ready", "True", "Serving", "ok again", conditions={"Serving": ("False", "X", "y")})
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == T0  # same status: the transition is the old one
    assert by_type["Ready"]["message"] == "ok again"
    assert by_type["Serving"]["lastTransitionTime"] == T1  # True -> False: a transition now
    assert by_type["Private"] == conditions(proxy)["Private"]  # not named: kept as it was


def test_status_removes_a_condition_named_none(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    proxy.status = writer.status(proxy, "Ready", "True", "R", "m", conditions={"ProviderListed": ("False", "L", "m")})
    status = writer.status(proxy, "Ready", "True", "R", "m", conditions={"ProviderListed": None})
    assert [c["type"] for c in status["conditions"]] == ["Ready"]


@pytest.mark.parametrize(("phase", "kept"), [
    ("Pending", set()), ("Failed", set()), ("Deleting", {"ip"}), ("Provisioning", {"ip", "endpoint"}),
    ("Ready", {"ip", "endpoint"}),
])
def test_an_address_is_kept_only_where_the_phase_can_have_one(writer: ProxyWriter, store: MemoryStore,
                                                               phase: str, kept: set[str]) -> None:
    proxy = store.add("eu-1", SPEC)
    proxy.status = {"ip": "192.0.2.10", "endpoint": "192.0.2.10:3128"}
    status = writer.status(proxy, phase, "False", "R", "m")
    assert {"ip", "endpoint"} & set(status) == kept


def test_write_status_writes_and_remembers(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    written = writer.write_status(proxy, writer.status(proxy, "Pending", "False", "R", "m"))
    assert store.get("eu-1").status["phase"] == "Pending"
    assert writer.latest[proxy.uid] is written


def test_an_unchanged_status_is_not_written(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = writer.write_status(store.add("eu-1", SPEC), {"phase": "Pending"})
    version = store.get("eu-1").resource_version
    writer.write_status(proxy, {"phase": "Pending"})
    assert store.get("eu-1").resource_version == version


def test_a_conflict_reads_again_and_reapplies_the_status(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    store.update_spec("eu-1", port=8080)  # someone else wrote: generation 2, the proxy in hand is stale
    writer.write_status(proxy, writer.status(proxy, "Pending", "False", "R", "m"))
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Pending"
    assert saved.status["observedGeneration"] == 2  # of the object it was finally written to
    assert saved.spec["port"] == 8080  # the other writer's change survives


def test_a_proxy_that_keeps_conflicting_fails_alone(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    store.conflicts_to_inject = CONFLICT_RETRIES
    with pytest.raises(StoreError, match="kept conflicting"):
        writer.write_status(proxy, {"phase": "Pending"})


def test_a_proxy_gone_mid_write_is_forgotten_not_an_error(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = writer.write_status(store.add("eu-1", SPEC), {"phase": "Pending"})
    del store.objects[("crawlers", "eu-1")]
    writer.write_status(proxy, {"phase": "Ready"})
    assert proxy.uid not in writer.latest


def test_update_metadata_reapplies_the_change_after_a_conflict(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC, annotations={"other": "kept"})
    store.conflicts_to_inject = 1
    applied: list[str] = []

    def change(p: Proxy) -> None:
        applied.append(p.resource_version)
        p.annotations["mine"] = "yes"

    writer.update_metadata(proxy, change)
    assert len(applied) == 2 and applied[0] != applied[1]  # applied again to the fresh read
    assert store.get("eu-1").annotations == {"other": "kept", "mine": "yes"}


def test_ensure_finalizer_adds_it_once_and_never_to_a_deleting_proxy(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = writer.ensure_finalizer(store.add("eu-1", SPEC))
    writer.ensure_finalizer(proxy)
    assert store.get("eu-1").finalizers == [FINALIZER]
    deleting = store.add("eu-2", SPEC)
    deleting.deletion_timestamp = T0
    writer.ensure_finalizer(deleting)
    assert store.get("eu-2").finalizers == []


def test_release_drops_our_finalizer_backoff_and_artifacts(store: MemoryStore) -> None:
    purged: list[set[str]] = []

    def purge(keys: set[str]) -> int:
        purged.append(keys)
        return len(keys)

    backoff = Backoff(clock=lambda: 0.0, rng=lambda: 0.5)
    writer = ProxyWriter(store, backoff, purge=purge)
    proxy = store.add("eu-1", SPEC)
    proxy.finalizers = [FINALIZER, "someone-else/keep"]
    proxy = writer.update_metadata(proxy, lambda _: None)
    backoff.failed(proxy.uid, "transient")
    writer.release(proxy)
    assert store.get("eu-1").finalizers == ["someone-else/keep"]
    assert backoff.due(proxy.uid) and purged == [{proxy.uid}] and proxy.uid not in writer.latest


def test_release_of_a_proxy_already_gone_is_fine(writer: ProxyWriter, store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    del store.objects[("crawlers", "eu-1")]
    writer.release(proxy)
    assert not store.exists("eu-1")


def test_failed_emits_one_event_per_change_not_per_sweep(writer: ProxyWriter, store: MemoryStore) -> None:
    store.add("eu-1", SPEC)
    down = ProviderError(ErrorClass.TRANSIENT, "host unreachable")
    for _ in range(3):
        writer.failed(store.get("eu-1"), down, "CreateFailed")
    assert store.reasons() == ["CreateFailed"]
    writer.failed(store.get("eu-1"), ProviderError(ErrorClass.TRANSIENT, "quota exceeded"), "CreateFailed")
    writer.failed(store.get("eu-1"), ProviderError(ErrorClass.TRANSIENT, "quota exceeded"), "DeleteFailed")
    assert store.reasons() == ["CreateFailed", "CreateFailed", "DeleteFailed"]
    assert writer.failures["crawlers/eu-1"] == "DeleteFailed: transient: quota exceeded"


@pytest.mark.parametrize(("error_class", "provider_id", "phase"), [
    (ErrorClass.PERMANENT, None, "Failed"), (ErrorClass.TRANSIENT, None, "Pending"),
    (ErrorClass.TRANSIENT, "kvm://x", "Provisioning"),
])
def test_failed_picks_the_phase_by_class_and_progress(writer: ProxyWriter, store: MemoryStore,
                                                      error_class: ErrorClass, provider_id: str | None,
                                                      phase: str) -> None:
    proxy = store.add("eu-1", SPEC)
    if provider_id:
        proxy = writer.write_status(proxy, {"providerID": provider_id})
    writer.failed(proxy, ProviderError(error_class, "no"), "CreateFailed")
    ready = conditions(store.get("eu-1"))["Ready"]
    assert store.get("eu-1").status["phase"] == phase and ready["reason"] == "CreateFailed"


def test_failed_backs_off_the_proxy_unless_the_provider_decided_the_delay(writer: ProxyWriter,
                                                                         store: MemoryStore) -> None:
    proxy = store.add("eu-1", SPEC)
    writer.failed(proxy, ProviderError(ErrorClass.TRANSIENT, "no"), "ListFailed", delay=0.0)
    assert writer.backoff.due(proxy.uid)
    assert "tried again next sweep" in str(conditions(store.get("eu-1"))["Ready"]["message"])
    writer.failed(store.get("eu-1"), ProviderError(ErrorClass.TRANSIENT, "no"), "CreateFailed")
    assert not writer.backoff.due(proxy.uid)
    assert "next attempt in 5 s" in str(conditions(store.get("eu-1"))["Ready"]["message"])


def test_invalid_is_failed_with_one_warning(writer: ProxyWriter, store: MemoryStore) -> None:
    store.add("eu-1", SPEC)
    for _ in range(2):
        writer.invalid(store.get("eu-1"), "InvalidSpec", "spec.port: must be an integer 1024-65535")
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Failed"
    assert conditions(saved)["Ready"]["message"] == "spec.port: must be an integer 1024-65535"
    assert store.reasons() == ["InvalidSpec"]
    assert writer.backoff.due(saved.uid)  # nothing to retry sooner or later: the Proxy must change
