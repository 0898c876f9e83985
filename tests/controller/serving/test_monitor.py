"""serving/monitor.py: what is probed for an instance (probe_target, target_key, instance_identity)
and the monitor's scheduling and bookkeeping (ServingMonitor), with a scripted prober in place of
the network. The real Prober through real squid is in test_probe.py; the real command probing fake
proxies in scenarios/test_serving_command.py."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProbeSettings as CollectionProbeSettings,
)
from egress_proxies.providers.client import Instance, ProbeSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.monitor import ServingMonitor, Watched, instance_identity, probe_target, target_key
from egress_proxies.serving.probe import ProbeCredentials, ProbeDestination, ProbeOutcome, ProbeReason, ProbeTarget
from support.controller.fakes import ScriptedProber
from support.waiting import wait_for

NOW = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)
INSTANCE = Instance(provider_id="kvm://hosts/h1/domains/p-eu-1", name="p-eu-1", state="running", ip="192.0.2.10",
                    endpoint="192.0.2.10:8080")
KEY = b"k" * 32
DESTINATION = ProbeDestination(http_url="http://probe.test/generate_204", proof_key=KEY)


def target(host: str, port: int = 3128) -> ProbeTarget:
    return ProbeTarget(key=f"kvm://{host}@{host}:{port}", host=host, port=port, destination=DESTINATION)


def settings(**probe: Any) -> ProbeSettings:
    """A provider's probe settings as the collection's validator returns them."""
    wire = {**CollectionProbeSettings(enabled=True, http_url="http://probe.test/generate_204",
                                      key_file="/k").as_dict(), **probe}
    return ProbeSettings.from_result(wire)


class Watching:
    """A monitor with a scripted prober, and what each verdict write saw."""

    def __init__(self, interval: float = 10.0, **provider: Any) -> None:
        self.prober = ScriptedProber()
        self.monitor = ServingMonitor(self.prober, interval_seconds=interval)  # type: ignore[arg-type]
        self.written: list[tuple[str, float]] = []
        self.provider_settings = settings(**provider)

    def watch(self, hosts: dict[str, list[str]], served: bool = False) -> dict[str, ProbeTarget]:
        targets = {host: target(host) for hosts_of in hosts.values() for host in hosts_of}
        watched = {targets[host].key: Watched(provider, targets[host], self._writer(host), served)
                   for provider, hosts_of in hosts.items() for host in hosts_of}
        self.monitor.watch(watched, dict.fromkeys(hosts, self.provider_settings))
        return targets

    def _writer(self, host: str) -> Any:
        return lambda: self.written.append((host, time.monotonic()))

    def outcome(self, host: str) -> ProbeOutcome | None:
        return self.monitor.outcome(target(host).key)


# -- what is probed ----------------------------------------------------------------------------------


def test_a_target_takes_the_providers_checks_overridden_by_the_proxys_spec() -> None:
    provider = settings(httpUrl="http://example.test/a", connect="example.test:443",
                        egressEchoUrl="http://echo.test/echo", timeoutSeconds=7)
    proxy = Proxy("crawlers", "eu-1", "uid-1", {"port": 8080, "probe": {"httpUrl": "http://other.test/b",
                                                                        "expectStatus": 200, "connect": None}})
    probe = probe_target(provider, proxy, INSTANCE, KEY)
    destination = probe.destination
    assert (probe.host, probe.port, destination.http_url, destination.expected_status) == (
        "192.0.2.10", 8080, "http://other.test/b", 200)
    assert destination.connect is None  # the spec turned the CONNECT check off
    assert destination.egress_echo_url == "http://echo.test/echo"
    assert (destination.proof_key, destination.check_timeout) == (KEY, 7.0)  # probe.timeoutSeconds honoured
    assert probe.key == target_key(INSTANCE) and not probe.expect_private and probe.identity is None


def test_the_providers_control_listener_is_asked_directly_unless_the_proxy_names_another_target() -> None:
    provider = settings(controlUrl="http://10.0.0.5:8081/generate_204")
    own = probe_target(provider, Proxy("crawlers", "eu-1", "uid-1", {}), INSTANCE, KEY)
    assert own.destination.control_url == "http://10.0.0.5:8081/generate_204"
    # Another probe target (its own httpUrl) is not served by the provider's target's control listener.
    other = probe_target(provider, Proxy("crawlers", "eu-1", "uid-1", {"probe": {"httpUrl": "http://other.test/b"}}),
                         INSTANCE, KEY)
    assert other.destination.control_url is None
    status = probe_target(provider, Proxy("crawlers", "eu-1", "uid-1", {"probe": {"expectStatus": 200}}), INSTANCE, KEY)
    assert status.destination.control_url is None
    assert probe_target(settings(), Proxy("crawlers", "eu-1", "uid-1", {}), INSTANCE,
                        KEY).destination.control_url is None


def test_with_credentials_the_target_expects_a_private_proxy_and_logs_in_as_the_instance() -> None:
    probe = probe_target(settings(), Proxy("crawlers", "eu-1", "uid-1", {}), INSTANCE, KEY,
                         ProbeCredentials("crawl-crawlers", "secret"))
    assert probe.expect_private and probe.credentials == ProbeCredentials("crawl-crawlers", "secret")
    # The instance's own user, with the namespace's password: only that instance knows it.
    assert probe.identity == ProbeCredentials(instance_identity("p-eu-1"), "secret")
    assert instance_identity("p-eu-1") != instance_identity("p-eu-2")
    assert instance_identity("p-eu-1").startswith("probe-") and len(instance_identity("p-eu-1")) <= 64


def test_the_target_is_the_endpoint_the_provider_hands_out_not_the_instances_own_address() -> None:
    # A Pod behind a NodePort: its own address is the Pod IP, crawlers (and so the probe) dial
    # the node's address and the node port (docs/contract.md, the instance's endpoint).
    behind = Instance(provider_id="k8s://namespaces/egress/pods/p-1", state="running", ip="10.244.1.7",
                      endpoint="192.0.2.21:31234")
    probe = probe_target(settings(httpUrl="http://example.test/"), Proxy("crawlers", "eu-1", "uid-1", {}), behind,
                         KEY)
    assert (probe.host, probe.port, probe.endpoint) == ("192.0.2.21", 31234, "192.0.2.21:31234")
    v6 = Instance(provider_id="k8s://namespaces/egress/pods/p-2", state="running", ip="fd00::7",
                  endpoint="[2001:db8::1]:3128")
    assert probe_target(settings(httpUrl="http://example.test/"), Proxy("crawlers", "eu-1", "uid-1", {}),
                        v6, KEY).host == "2001:db8::1"
    assert target_key(behind) != target_key(Instance(provider_id=behind.provider_id, state="running",
                                                     ip="10.244.1.7", endpoint="192.0.2.22:31234"))


def test_an_outcome_belongs_to_one_instance_at_one_address() -> None:
    moved = Instance(provider_id=INSTANCE.provider_id, state="running", ip="192.0.2.11", endpoint="192.0.2.11:8080")
    replaced = Instance(provider_id="kvm://hosts/h1/domains/p-eu-1-2", state="running", ip="192.0.2.10",
                        endpoint="192.0.2.10:8080")
    other_port = Instance(provider_id=INSTANCE.provider_id, state="running", ip="192.0.2.10",
                          endpoint="192.0.2.10:3128")
    keys = {target_key(INSTANCE), target_key(moved), target_key(replaced), target_key(other_port)}
    assert len(keys) == 4


# -- rounds --------------------------------------------------------------------------------------------


def test_a_changed_outcome_writes_its_verdict_and_an_unchanged_one_does_not() -> None:
    watching = Watching()
    assert not watching.monitor.probe_now()  # nothing watched: nothing probed
    watching.watch({"kvm": ["192.0.2.10"]})
    assert watching.monitor.probe_now()
    assert [host for host, _ in watching.written] == ["192.0.2.10"]
    outcome = watching.outcome("192.0.2.10")
    assert outcome is not None and outcome.serving
    assert not watching.monitor.probe_now() and len(watching.written) == 1
    watching.prober.serving["192.0.2.10"] = ProbeReason.CONNECTION_REFUSED
    assert watching.monitor.probe_now() and len(watching.written) == 2


def test_watching_a_new_set_drops_the_records_of_the_old() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10", "192.0.2.11"]})
    watching.monitor.probe_now()
    watching.watch({"kvm": ["192.0.2.11"]})
    assert watching.outcome("192.0.2.10") is None and watching.outcome("192.0.2.11") is not None
    watching.prober.probed.clear()
    watching.monitor.probe_now()
    assert [host for host, _ in watching.prober.probed] == ["192.0.2.11"]


def test_each_probe_is_counted_by_provider_and_reason() -> None:
    watching = Watching()
    labels = {"provider": "monitor-test", "reason": "Serving"}
    before = REGISTRY.get_sample_value("egress_proxies_probes_total", labels) or 0.0
    watching.watch({"monitor-test": ["192.0.2.10"]})
    watching.monitor.probe_now()
    assert REGISTRY.get_sample_value("egress_proxies_probes_total", labels) == before + 1


def test_while_the_probe_target_does_not_answer_nothing_is_known_and_no_proxy_is_probed() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10", "192.0.2.11"]})
    watching.prober.target_down = True
    watching.monitor.probe_now()
    assert watching.prober.probed == []
    for host in ("192.0.2.10", "192.0.2.11"):
        outcome = watching.outcome(host)
        assert outcome is not None and outcome.reason is ProbeReason.PROBE_TARGET_UNREACHABLE
        assert outcome.reason.unknown
    record = watching.monitor.record(target("192.0.2.10").key)
    assert record is not None and record.failing_since is None  # an unknown is no failure


def test_a_failure_is_the_proxys_only_when_the_target_answers_after_it() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10"]})
    watching.monitor.probe_now()
    checks = watching.prober.checks
    watching.prober.serving["192.0.2.10"] = ProbeReason.TIMEOUT
    watching.monitor.probe_now()
    assert watching.prober.checks == checks + 2  # the round's own, and one after the failure
    outcome = watching.outcome("192.0.2.10")
    assert outcome is not None and outcome.reason is ProbeReason.TIMEOUT
    record = watching.monitor.record(target("192.0.2.10").key)
    assert record is not None and record.last_success is not None and record.failing_since is not None
    # Failing again: nothing to tell apart (it is failing either way); the round's check only.
    watching.monitor.probe_now()
    assert watching.prober.checks == checks + 3


def test_the_failure_clock_is_reset_by_every_success() -> None:
    watching = Watching()
    key = target("192.0.2.10").key
    watching.watch({"kvm": ["192.0.2.10"]})
    watching.prober.serving["192.0.2.10"] = ProbeReason.TIMEOUT
    watching.monitor.probe_now()
    first = watching.monitor.record(key)
    assert first is not None and first.last_success is None and first.failing_since is not None
    watching.monitor.probe_now()
    again = watching.monitor.record(key)
    assert again is not None and again.failing_since == first.failing_since  # still the same streak
    watching.prober.serving["192.0.2.10"] = True
    watching.monitor.probe_now()
    served = watching.monitor.record(key)
    assert served is not None and served.failing_since is None and served.last_success is not None
    watching.prober.serving["192.0.2.10"] = ProbeReason.TIMEOUT
    watching.monitor.probe_now()
    later = watching.monitor.record(key)
    assert later is not None and later.failing_since is not None and later.failing_since > first.failing_since


def test_every_instance_that_served_failing_at_once_is_a_provider_wide_failure() -> None:
    watching = Watching()
    hosts = ["192.0.2.10", "192.0.2.11", "192.0.2.12"]
    watching.watch({"kvm": hosts, "other": ["192.0.2.20"]})
    watching.monitor.probe_now()
    for host in hosts:
        watching.prober.serving[host] = ProbeReason.TIMEOUT
    watching.monitor.probe_now()
    assert watching.monitor.provider_failing_since("kvm") is not None
    assert watching.monitor.provider_failing_since("other") is None
    # One of them serving again: the others' failures are their own.
    watching.prober.serving["192.0.2.10"] = True
    watching.monitor.probe_now()
    assert watching.monitor.provider_failing_since("kvm") is None


def test_one_instance_failing_while_another_serves_is_its_own_failure() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10", "192.0.2.11"]})
    watching.monitor.probe_now()
    watching.prober.serving["192.0.2.10"] = ProbeReason.TIMEOUT
    watching.monitor.probe_now()
    assert watching.monitor.provider_failing_since("kvm") is None
    outcome = watching.outcome("192.0.2.10")
    assert outcome is not None and not outcome.serving


def test_the_egress_echo_and_privacy_run_first_after_a_failure_and_every_sixth_probe() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10"]})
    for _ in range(7):
        watching.monitor.probe_now()
    assert [full for _, full in watching.prober.probed] == [True, False, False, False, False, False, True]
    outcome = watching.outcome("192.0.2.10")
    assert outcome is not None and outcome.private is True and outcome.egress_ip == "198.51.100.7"
    watching.monitor.probe_now()  # not full: what the full one found is carried forward
    carried = watching.outcome("192.0.2.10")
    assert carried is not None and not carried.full and carried.private is True
    assert carried.egress_ip == "198.51.100.7"


def test_the_prober_is_told_which_instances_answered_since_their_last_failure() -> None:
    """Only an instance that served and has not failed since gets its privacy check on its one
    connection (``answered``); a new one, or one failing (a hung one would cost two timeouts), not."""
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10"]})
    watching.monitor.probe_now()  # new
    watching.monitor.probe_now()  # served
    watching.prober.serving["192.0.2.10"] = False
    watching.monitor.probe_now()  # served, then fails
    watching.monitor.probe_now()  # failing
    watching.prober.serving["192.0.2.10"] = True
    watching.monitor.probe_now()  # failing, then serves
    watching.monitor.probe_now()
    assert [answered for _, answered in watching.prober.answered] == [False, True, True, False, False, True]


# -- the thread: each provider on its own ---------------------------------------------------------------


def test_a_verdict_is_written_when_its_probe_ends_and_hung_ones_delay_no_other_provider() -> None:
    watching = Watching(interval=3600, concurrency=4)
    hung = [f"192.0.2.{n}" for n in range(100, 140)]
    for host in hung:
        watching.prober.delay[host] = 5.0  # each takes its whole check timeout
        watching.prober.serving[host] = ProbeReason.TIMEOUT
    watching.prober.delay["192.0.2.11"] = 1.5  # one slow one among the good
    started = time.monotonic()
    watching.watch({"hung": hung, "good": ["192.0.2.10", "192.0.2.11", "192.0.2.12"]})
    stopping = threading.Event()
    thread = threading.Thread(target=watching.monitor.run, args=(stopping,))
    thread.start()
    try:
        wait_for(lambda: len({h for h, _ in watching.written} & {"192.0.2.10", "192.0.2.12"}) == 2, 10,
                 "the good verdicts")
        written = dict(watching.written)
        # Neither the 40 hung instances of another provider (4 at a time: 50 s) nor the slow
        # one of their own held them up.
        assert written["192.0.2.10"] - started < 1.0 and written["192.0.2.12"] - started < 1.0
        wait_for(lambda: "192.0.2.11" in dict(watching.written), 10, "the slow one's verdict")
        assert dict(watching.written)["192.0.2.11"] - started >= 1.4
    finally:
        stopping.set()
        watching.monitor.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_the_thread_survives_a_failed_round_and_probes_a_new_instance_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    watching = Watching(interval=3600)
    watching.watch({"kvm": ["192.0.2.10"]})
    watching.prober.error = RuntimeError("prober broke")
    stopping = threading.Event()
    thread = threading.Thread(target=watching.monitor.run, args=(stopping,))
    thread.start()
    try:
        wait_for(lambda: "probe round of provider kvm failed" in caplog.text, 10, "the failed round in the log")
        watching.prober.error = None
        watching.watch({"kvm": ["192.0.2.10", "192.0.2.11"]})  # probed long before the interval
        wait_for(lambda: "192.0.2.11" in dict(watching.written), 10, "the new instance's verdict")
    finally:
        stopping.set()
        watching.monitor.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_sweep_watching_again_mid_round_keeps_the_outcome_and_an_unwatched_one_gets_none() -> None:
    watching = Watching()
    watching.watch({"kvm": ["192.0.2.10", "192.0.2.11"]})
    watching.prober.delay = {"192.0.2.10": 0.5, "192.0.2.11": 0.5}
    # While the round's probes are under way, a sweep hands the monitor its instances again (new
    # Watched objects, the same targets), and one of them is gone.
    again = threading.Timer(0.2, lambda: watching.watch({"kvm": ["192.0.2.10"]}))
    again.start()
    watching.monitor.probe_now()
    again.join()
    assert watching.outcome("192.0.2.10") is not None
    assert watching.outcome("192.0.2.11") is None
