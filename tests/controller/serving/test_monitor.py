"""serving/monitor.py: what is probed for an instance (probe_target, target_key) and the
background monitor's bookkeeping (ServingMonitor), with a scripted prober in place of the network.
The real Prober through real squid is in test_probe.py and, with the sweep, in
scenarios/test_serving.py."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProbeSettings as CollectionProbeSettings,
)
from egress_proxies.providers.client import Instance, ProbeSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.monitor import ServingMonitor, probe_target, target_key
from egress_proxies.serving.probe import ProbeCredentials, ProbeOutcome, ProbeReason, ProbeTarget
from support.waiting import wait_for

NOW = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)
INSTANCE = Instance(provider_id="kvm://hosts/h1/domains/p-eu-1", state="running", ip="192.0.2.10")


class ScriptedProber:
    """``Prober.probe_all`` from a script: host -> serving or not; ``during`` runs mid-round."""

    def __init__(self) -> None:
        self.serving: dict[str, bool] = {}
        self.rounds: list[list[str]] = []
        self.during: list[object] = []
        self.error: Exception | None = None

    def probe_all(self, targets: Iterable[ProbeTarget]) -> dict[str, ProbeOutcome]:
        if self.error is not None:
            raise self.error
        targets = list(targets)
        self.rounds.append(sorted(t.key for t in targets))
        for action in self.during:
            action()  # type: ignore[operator]
        return {t.key: ProbeOutcome(True, ProbeReason.SERVING, "ok", 0.01, None, None, "", NOW)
                if self.serving.get(t.host, True) else
                ProbeOutcome(False, ProbeReason.TIMEOUT, "no answer", None, None, None, "", NOW) for t in targets}


def target(host: str, key: str | None = None) -> ProbeTarget:
    return ProbeTarget(key=key or f"kvm://{host}@{host}:3128", host=host, port=3128, http_url="http://example.test/")


def monitor(prober: ScriptedProber, **kwargs: object) -> ServingMonitor:
    return ServingMonitor(prober, **kwargs)  # type: ignore[arg-type]


def settings(**probe: Any) -> ProbeSettings:
    """A provider's probe settings as the collection's validator returns them."""
    return ProbeSettings.from_result({**CollectionProbeSettings(enabled=True).as_dict(), **probe})


def test_a_target_takes_the_providers_checks_overridden_by_the_proxys_spec() -> None:
    provider = settings(httpUrl="http://example.test/a", connect="example.test:443", egressEchoUrl="http://echo.test/")
    proxy = Proxy("crawlers", "eu-1", "uid-1", {"port": 8080, "probe": {"httpUrl": "http://other.test/b",
                                                                        "expectStatus": 200, "connect": None}})
    probe = probe_target(provider, proxy, INSTANCE)
    assert (probe.host, probe.port, probe.http_url, probe.expected_status) == ("192.0.2.10", 8080,
                                                                              "http://other.test/b", 200)
    assert probe.connect_target is None  # the spec turned the CONNECT check off
    assert probe.egress_echo_url == "http://echo.test/"
    assert probe.key == target_key(INSTANCE, 8080) and not probe.expect_private


def test_without_overrides_the_target_has_the_providers_checks() -> None:
    provider = settings(httpUrl="http://example.test/a", expectStatus=200, connect="example.test:443")
    probe = probe_target(provider, Proxy("crawlers", "eu-1", "uid-1", {}), INSTANCE)
    assert (probe.port, probe.http_url, probe.expected_status, probe.connect_target) == (
        3128, "http://example.test/a", 200, "example.test:443")


def test_with_credentials_the_target_also_expects_a_private_proxy() -> None:
    probe = probe_target(settings(httpUrl="http://example.test/"), Proxy("crawlers", "eu-1", "uid-1", {}), INSTANCE,
                         ProbeCredentials("u", "secret"))
    assert probe.expect_private and probe.credentials == ProbeCredentials("u", "secret")


def test_the_target_is_the_endpoint_the_provider_hands_out_not_the_instances_own_address() -> None:
    # A Pod behind a NodePort: its own address is the Pod IP, crawlers (and so the probe) dial
    # the node's address and the node port (docs/contract.md, the instance's endpoint).
    behind = Instance(provider_id="k8s://namespaces/egress/pods/p-1", state="running", ip="10.244.1.7",
                      endpoint="192.0.2.21:31234")
    probe = probe_target(settings(httpUrl="http://example.test/"), Proxy("crawlers", "eu-1", "uid-1", {}), behind)
    assert (probe.host, probe.port, probe.endpoint) == ("192.0.2.21", 31234, "192.0.2.21:31234")
    v6 = Instance(provider_id="k8s://namespaces/egress/pods/p-2", state="running", ip="fd00::7",
                  endpoint="[2001:db8::1]:3128")
    assert probe_target(settings(httpUrl="http://example.test/"), Proxy("crawlers", "eu-1", "uid-1", {}),
                        v6).host == "2001:db8::1"
    assert target_key(behind, 3128) != target_key(Instance(provider_id=behind.provider_id, state="running",
                                                           ip="10.244.1.7", endpoint="192.0.2.22:31234"), 3128)


def test_an_outcome_belongs_to_one_instance_at_one_address() -> None:
    moved = Instance(provider_id=INSTANCE.provider_id, state="running", ip="192.0.2.11")
    replaced = Instance(provider_id="kvm://hosts/h1/domains/p-eu-1-2", state="running", ip="192.0.2.10")
    keys = {target_key(INSTANCE, 3128), target_key(moved, 3128), target_key(replaced, 3128),
            target_key(INSTANCE, 8080)}
    assert len(keys) == 4


def test_a_round_reports_a_change_only_when_serving_changes() -> None:
    prober = ScriptedProber()
    serving = monitor(prober)
    assert not serving.probe_now()  # nothing watched: nothing probed
    a = target("192.0.2.10")
    serving.watch({a.key: ("home-kvm", a)})
    assert serving.probe_now()
    outcome = serving.outcome(a.key)
    assert outcome is not None and outcome.serving
    assert not serving.probe_now()
    prober.serving["192.0.2.10"] = False
    assert serving.probe_now()
    outcome = serving.outcome(a.key)
    assert outcome is not None and outcome.reason is ProbeReason.TIMEOUT


def test_watching_a_new_set_drops_the_outcomes_of_the_old() -> None:
    prober = ScriptedProber()
    serving = monitor(prober)
    a, b = target("192.0.2.10"), target("192.0.2.11")
    serving.watch({a.key: ("home-kvm", a), b.key: ("home-kvm", b)})
    serving.probe_now()
    serving.watch({b.key: ("home-kvm", b)})
    assert serving.outcome(a.key) is None and serving.outcome(b.key) is not None
    serving.probe_now()
    assert prober.rounds[-1] == [b.key]


def test_a_target_unwatched_during_a_round_gets_no_outcome() -> None:
    prober = ScriptedProber()
    serving = monitor(prober)
    a = target("192.0.2.10")
    serving.watch({a.key: ("home-kvm", a)})
    prober.during.append(lambda: serving.watch({}))
    assert not serving.probe_now()
    assert serving.outcome(a.key) is None


def test_each_probe_is_counted_by_provider_and_reason() -> None:
    prober = ScriptedProber()
    serving = monitor(prober)
    a = target("192.0.2.10")
    labels = {"provider": "monitor-test", "reason": "Serving"}
    before = REGISTRY.get_sample_value("egress_proxies_probes_total", labels) or 0.0
    serving.watch({a.key: ("monitor-test", a)})
    serving.probe_now()
    assert REGISTRY.get_sample_value("egress_proxies_probes_total", labels) == before + 1


def test_the_thread_survives_a_failed_round_and_probes_a_new_target_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    prober = ScriptedProber()
    changed = threading.Event()
    serving = monitor(prober, interval_seconds=3600, on_change=changed.set)
    a, b = target("192.0.2.10"), target("192.0.2.11")
    serving.watch({a.key: ("home-kvm", a)})
    prober.error = RuntimeError("prober broke")
    stopping = threading.Event()
    thread = threading.Thread(target=serving.run, args=(stopping,))
    thread.start()
    try:
        wait_for(lambda: "probe round failed" in caplog.text, 10, "the failed round in the log")
        prober.error = None
        serving.watch({a.key: ("home-kvm", a), b.key: ("home-kvm", b)})  # wakes it long before the interval
        assert changed.wait(10)
    finally:
        stopping.set()
        serving.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert prober.rounds == [sorted([a.key, b.key])]
