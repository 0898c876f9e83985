"""sweep/deletion.py: DeletePath's order (docs/contract.md, "Deletion") with the fakes of
tests/support/controller/fakes.py behind a real ProviderClient and ProxyWriter."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from egress_proxies.providers.client import ProviderClient, ProviderType
from egress_proxies.resources.proxy import FINALIZER, SKIP_CLEANUP_ANNOTATION, Proxy
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.deletion import DeletePath
from egress_proxies.sweep.writer import ProxyWriter
from support.controller.fakes import FakeRunner, MemoryStore

SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
INFO, PROXY = "kvm_proxy_info", "kvm_proxy"


class Sweep:
    """One DeletePath as the reconciler builds it, with what it counted and what it contained."""

    def __init__(self, batch_size: int = 50) -> None:
        self.store = MemoryStore()
        self.runner = FakeRunner()
        self.writer = ProxyWriter(self.store, Backoff(clock=lambda: 0.0, rng=lambda: 0.5))
        self.counts: Counter[str] = Counter()
        self.contained: list[tuple[str, str]] = []
        self.path = DeletePath(self.writer, batch_size, self.contain, self.count)
        self.client = ProviderClient(self.runner, "providers.yaml", "home-kvm", ProviderType.KVM)

    def contain(self, proxy: Proxy, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - what the reconciler's containment does
            self.contained.append((proxy.key, str(error)))

    def count(self, counter: str, amount: int) -> None:
        self.counts[counter] += amount

    def deleting(self, name: str, instance: bool = True, annotations: dict[str, str] | None = None) -> Proxy:
        """A deleting Proxy holding our finalizer, with (or without) an instance at the provider."""
        self.store.add(name, SPEC, annotations=annotations)
        stored = self.store.objects[("crawlers", name)]
        stored.finalizers = [FINALIZER]
        if instance:
            provider_id = f"kvm://hosts/h1/domains/{name}"
            stored.status = {"providerID": provider_id, "phase": "Ready"}
            self.runner.instances[provider_id] = {"provider_id": provider_id, "name": name, "state": "running",
                                                  "tags": {}}
        self.store.delete(name)
        return self.store.get(name)

    def run(self, *names: str, clients: bool = True, unusable: dict[str, str] | None = None) -> None:
        self.path.reconcile([self.store.get(n) for n in names if self.store.exists(n)],
                            {"home-kvm": self.client} if clients else {}, unusable or {})

    def ready(self, name: str) -> dict[str, object]:
        proxy = self.store.get(name)
        return next(c for c in proxy.status["conditions"] if c["type"] == "Ready")


@pytest.fixture
def sweep() -> Sweep:
    return Sweep()


def test_nothing_created_is_released_without_asking_the_provider(sweep: Sweep) -> None:
    sweep.deleting("eu-1", instance=False)
    sweep.run("eu-1")
    assert not sweep.store.exists("eu-1") and sweep.runner.calls == []
    assert sweep.counts["released"] == 1


def test_an_instance_is_got_then_deleted_then_released(sweep: Sweep) -> None:
    sweep.deleting("eu-1")
    sweep.run("eu-1")
    assert sweep.runner.verbs() == ["get", "delete"]
    assert sweep.runner.instances == {}
    assert not sweep.store.exists("eu-1")
    assert sweep.store.reasons() == ["Deleted"]
    assert (sweep.counts["deleted"], sweep.counts["released"], sweep.counts["runner_calls"]) == (1, 1, 2)


@pytest.mark.parametrize("configured", [True, False])
def test_skip_cleanup_abandons_before_the_provider_is_looked_up(sweep: Sweep, configured: bool) -> None:
    sweep.deleting("eu-1", annotations={SKIP_CLEANUP_ANNOTATION: "true"})
    sweep.run("eu-1", clients=configured)
    assert not sweep.store.exists("eu-1") and sweep.runner.calls == []
    assert len(sweep.runner.instances) == 1  # abandoned, not deleted
    assert sweep.store.reasons() == ["Abandoned"]


def test_a_provider_missing_from_the_config_holds_the_proxy_and_names_the_way_out(sweep: Sweep) -> None:
    sweep.deleting("eu-1")
    sweep.run("eu-1", clients=False)
    assert sweep.store.get("eu-1").finalizers == [FINALIZER]
    ready = sweep.ready("eu-1")
    assert ready["reason"] == "ProviderNotConfigured"
    assert SKIP_CLEANUP_ANNOTATION in str(ready["message"]) and sweep.runner.calls == []


def test_an_unusable_provider_section_holds_the_proxy_as_permanent(sweep: Sweep) -> None:
    sweep.deleting("eu-1")
    sweep.run("eu-1", clients=False, unusable={"home-kvm": "kvm.uri: is required"})
    proxy = sweep.store.get("eu-1")
    assert proxy.finalizers == [FINALIZER] and proxy.status["phase"] == "Deleting"
    assert sweep.ready("eu-1")["reason"] == "ProviderConfigInvalid"
    assert "permanent: kvm.uri: is required" in str(sweep.ready("eu-1")["message"])


def test_an_instance_already_gone_is_released_without_a_delete(sweep: Sweep) -> None:
    sweep.deleting("eu-1")
    sweep.runner.instances.clear()
    sweep.run("eu-1")
    assert sweep.runner.verbs() == ["get"] and not sweep.store.exists("eu-1")


def test_a_permanent_get_deletes_anyway(sweep: Sweep) -> None:
    proxy = sweep.deleting("eu-1")
    sweep.runner.fail[(INFO, proxy.status["providerID"])] = ("permanent", "domain XML unreadable")
    sweep.run("eu-1")
    assert sweep.runner.verbs() == ["get", "delete"] and not sweep.store.exists("eu-1")


def test_when_get_and_delete_both_fail_both_errors_are_reported(sweep: Sweep) -> None:
    proxy = sweep.deleting("eu-1")
    sweep.runner.fail[(INFO, proxy.status["providerID"])] = ("permanent", "cannot read it")
    sweep.runner.fail[(PROXY, proxy.status["providerID"])] = ("transient", "host busy")
    sweep.run("eu-1")
    message = str(sweep.ready("eu-1")["message"])
    assert "get failed (permanent: cannot read it); delete failed (transient: host busy)" in message
    assert sweep.ready("eu-1")["reason"] == "DeleteFailed"
    assert sweep.store.get("eu-1").status["phase"] == "Deleting"
    assert sweep.store.get("eu-1").finalizers == [FINALIZER]


def test_a_failed_delete_after_a_good_get_reports_the_delete(sweep: Sweep) -> None:
    proxy = sweep.deleting("eu-1")
    sweep.runner.fail[(PROXY, proxy.status["providerID"])] = ("permanent", "refused")
    sweep.run("eu-1")
    assert "permanent: refused" in str(sweep.ready("eu-1")["message"])
    assert "get failed" not in str(sweep.ready("eu-1")["message"])


def test_a_transient_get_backs_off_without_deleting(sweep: Sweep) -> None:
    proxy = sweep.deleting("eu-1")
    sweep.runner.fail[(INFO, proxy.status["providerID"])] = ("transient", "host unreachable")
    sweep.run("eu-1")
    assert sweep.runner.verbs() == ["get"]
    assert sweep.ready("eu-1")["reason"] == "DeleteFailed"
    sweep.run("eu-1")  # not due yet: no second call
    assert sweep.runner.verbs() == ["get"]


def test_deletes_are_batched_per_provider() -> None:
    sweep = Sweep(batch_size=2)
    for n in range(3):
        sweep.deleting(f"eu-{n}")
    sweep.run("eu-0", "eu-1", "eu-2")
    assert sweep.runner.verbs() == ["get", "delete", "get", "delete"]
    assert [len(call.operations) for call in sweep.runner.calls] == [2, 2, 1, 1]
    assert not any(sweep.store.exists(f"eu-{n}") for n in range(3))


def test_one_proxy_that_cannot_be_released_holds_up_no_other(sweep: Sweep) -> None:
    for name in ("eu-1", "eu-bad", "eu-2"):
        sweep.deleting(name)

    def refuse(proxy: Proxy) -> Proxy:
        if proxy.name == "eu-bad":
            raise RuntimeError("boom")
        return MemoryStore.replace_metadata(sweep.store, proxy)

    sweep.store.replace_metadata = refuse  # type: ignore[method-assign]
    sweep.run("eu-1", "eu-bad", "eu-2")
    assert sweep.contained == [("crawlers/eu-bad", "boom")]
    assert not sweep.store.exists("eu-1") and not sweep.store.exists("eu-2")
    assert sweep.store.exists("eu-bad")
