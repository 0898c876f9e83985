"""sweep/verdict.py: the pure Ready/Serving/Private decision, as a table of cases (what the status
says, what the provider reports, what the probe found) and what each must give."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from egress_proxies.providers.client import Instance
from egress_proxies.resources.conditions import HOST_ACTIVE, PRIVATE, PROVIDER_LISTED, SERVING
from egress_proxies.serving.discovery import serves
from egress_proxies.serving.probe import ProbeOutcome, ProbeReason, unknown_outcome
from egress_proxies.sweep.verdict import Observation, Pinned, host_active, judge, with_known_address

NOW = "2026-12-06T10:00:00Z"
PROBED_AT = datetime(2026, 12, 6, 9, 59, 50, tzinfo=UTC)
ID = "kvm://hosts/h1/domains/p-a"
RUNNING = Instance(provider_id=ID, name="p-a", location="h1", state="running", ip="192.0.2.10",
                   endpoint="192.0.2.10:3128")
BUILT_PRIVATE = ("True", "CredentialsRequired", "requests need the crawlers credentials, from 10.0.0.0/8")
OPEN = ("False", "AuthDisabled", "spec.auth is none: anyone from 10.0.0.0/8 who reaches it can use this proxy")


def outcome(serving: bool, reason: ProbeReason = ProbeReason.SERVING, private: bool | None = True,
            egress: str | None = "203.0.113.5") -> ProbeOutcome:
    return ProbeOutcome(serving=serving, reason=reason, message=f"{reason} details", latency_seconds=0.012,
                        egress_ip=egress if serving else None, private=private,
                        privacy_message="requests without credentials refused", probed_at=PROBED_AT)


def ready_status(**extra: Any) -> dict[str, Any]:
    return {"phase": "Ready", "providerID": ID, "ip": "192.0.2.10", "endpoint": "192.0.2.10:3128",
            "readyProviderID": ID, "readySince": "2026-12-06T09:00:00Z",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "it serves"},
                           {"type": SERVING, "status": "True", "reason": "Serving", "message": "served"},
                           {"type": PRIVATE, "status": "True", "reason": "CredentialsRequired", "message": "m"}],
            **extra}


UNREACHABLE = unknown_outcome(ProbeReason.PROBE_TARGET_UNREACHABLE, "ProbeTargetUnreachable: Timeout", PROBED_AT)
NOT_CONFIGURED = unknown_outcome(ProbeReason.PROBE_NOT_CONFIGURED, "ProbeNotConfigured: no target", PROBED_AT)

CASES = [
    # (id, status, observation, phase, Ready reason, Serving (status, reason), Private reason or None)
    ("stopped", {}, Observation(Instance(ID, state="stopped"), 3128),
     "Provisioning", "InstanceStopped", ("False", "InstanceStopped"), None),
    ("error", {}, Observation(Instance(ID, state="error"), 3128),
     "Provisioning", "InstanceError", ("False", "InstanceError"), None),
    ("pending", {}, Observation(Instance(ID, state="pending"), 3128),
     "Provisioning", "Provisioning", ("Unknown", "AwaitingProbe"), None),
    ("running without an address", {}, Observation(Instance(ID, state="running"), 3128),
     "Provisioning", "Provisioning", ("Unknown", "AwaitingProbe"), None),
    # Nothing probes it: neither that it serves nor that it refuses strangers is measured.
    ("probe: none", {}, Observation(RUNNING, 3128, built_private=BUILT_PRIVATE),
     "Ready", "InstanceRunning", ("Unknown", "Unverified"), "Unverified"),
    ("probe: none, auth none", {}, Observation(RUNNING, 3128, built_private=OPEN),
     "Ready", "InstanceRunning", ("Unknown", "Unverified"), "AuthDisabled"),
    ("not probed yet", {}, Observation(RUNNING, 3128, probed=True, built_private=BUILT_PRIVATE),
     "Provisioning", "AwaitingProbe", ("Unknown", "AwaitingProbe"), "CredentialsRequired"),
    ("not probed yet, served before", ready_status(), Observation(RUNNING, 3128, probed=True),
     "Ready", "Serving", ("True", "Serving"), None),
    ("serving", {}, Observation(RUNNING, 3128, probed=True, outcome=outcome(True), built_private=BUILT_PRIVATE),
     "Ready", "Serving", ("True", "Serving"), "CredentialsRequired"),
    ("serving anyone", {}, Observation(RUNNING, 3128, probed=True, outcome=outcome(True, private=False),
                                       built_private=BUILT_PRIVATE),
     "Provisioning", "NotPrivate", ("True", "Serving"), "NotPrivate"),
    ("not serving", {}, Observation(RUNNING, 3128, probed=True,
                                    outcome=outcome(False, ProbeReason.CONNECTION_REFUSED)),
     "Provisioning", "NotServing", ("False", "ConnectionRefused"), None),
    ("auth none, serving", {}, Observation(RUNNING, 3128, probed=True, outcome=outcome(True, private=None),
                                           built_private=OPEN),
     "Ready", "Serving", ("True", "Serving"), "AuthDisabled"),
    # Quarantined whatever else holds; Serving and Private still tell the truth (discovery.serves).
    ("quarantined, serving", {}, Observation(RUNNING, 3128, probed=True, outcome=outcome(True),
                                             built_private=BUILT_PRIVATE, quarantined=True),
     "Quarantined", "Quarantined", ("True", "Serving"), "CredentialsRequired"),
    ("quarantined, probe: none", {}, Observation(RUNNING, 3128, quarantined=True),
     "Quarantined", "Quarantined", ("Unknown", "Unverified"), None),
    ("quarantined, stopped", {}, Observation(Instance(ID, state="stopped"), 3128, quarantined=True),
     "Quarantined", "Quarantined", ("False", "InstanceStopped"), None),
    # An answer without the probe target's proof of its nonce (a liar, a captive portal).
    ("no proof of the nonce", {}, Observation(RUNNING, 3128, probed=True,
                                             outcome=outcome(False, ProbeReason.TARGET_NOT_REACHED)),
     "Provisioning", "NotServing", ("False", "TargetNotReached"), None),
    # The probe target does not answer the controller: nothing is known; the last verdict stands.
    ("target unreachable, was Ready", ready_status(), Observation(RUNNING, 3128, probed=True, outcome=UNREACHABLE),
     "Ready", "Serving", ("Unknown", "ProbeTargetUnreachable"), None),
    ("target unreachable, never Ready", {}, Observation(RUNNING, 3128, probed=True, outcome=UNREACHABLE),
     "Provisioning", "AwaitingProbe", ("Unknown", "ProbeTargetUnreachable"), None),
    ("no probe target named", ready_status(), Observation(RUNNING, 3128, probed=True, outcome=NOT_CONFIGURED),
     "Ready", "Serving", ("Unknown", "ProbeNotConfigured"), None),
    # Every probe of the provider fails at once: a Ready one stays Ready, for a bounded time.
    ("provider-wide failure, was Ready", ready_status(),
     Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT),
                 provider_failing_since="2026-12-06T09:58:00Z", hold_seconds=300),
     "Ready", "ProviderWideFailure", ("False", "Timeout"), None),
    ("provider-wide failure past its hold", ready_status(),
     Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT),
                 provider_failing_since="2026-12-06T09:50:00Z", hold_seconds=300),
     "Provisioning", "NotServing", ("False", "Timeout"), None),
    ("provider-wide failure, never Ready", {},
     Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT),
                 provider_failing_since="2026-12-06T09:58:00Z", hold_seconds=300),
     "Provisioning", "NotServing", ("False", "Timeout"), None),
]


@pytest.mark.parametrize(("status", "seen", "phase", "ready", "serving", "private"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_verdict_table(status: dict[str, Any], seen: Observation, phase: str, ready: str,
                           serving: tuple[str, str], private: str | None) -> None:
    verdict = judge(status, seen, NOW)
    assert (verdict.phase, verdict.ready[1]) == (phase, ready)
    found_serving = verdict.conditions[SERVING]
    assert found_serving is not None
    assert found_serving[:2] == serving
    assert PROVIDER_LISTED in verdict.conditions and verdict.conditions[PROVIDER_LISTED] is None
    found = verdict.conditions.get(PRIVATE)
    assert (found[1] if found is not None else None) == private
    assert verdict.fields["providerID"] == ID


def test_the_serving_verdict_says_whether_the_outside_path_was_verified() -> None:
    # Issue 39 row 5: a probe answered inside the cluster is a Ready the crawler's path did not
    # earn; the provider says how the endpoint is reached, and the verdict carries it.
    exposed = Instance(provider_id=ID, state="running", ip="10.244.1.7", endpoint="198.51.100.20:3128",
                       exposure="LoadBalancer that admits private sources (10.0.0.0/8): ... not verified; to verify it")
    verdict = judge({}, Observation(exposed, 3128, probed=True, outcome=outcome(True)), NOW)
    assert verdict.fields["exposure"] == exposed.exposure
    serving = verdict.conditions[SERVING]
    assert serving is not None and serving[0] == "True"
    assert serving[2].endswith("; reached as LoadBalancer that admits private sources (10.0.0.0/8): ... not verified; "
                               "to verify it")
    # Another instance in its place: nothing said of the old one's exposure stays.
    plain = judge(ready_status(exposure="old"), Observation(
        Instance(provider_id=ID + "-2", state="running", ip="192.0.2.11", endpoint="192.0.2.11:3128"), 3128), NOW)
    assert plain.new_instance and plain.fields.get("exposure") is None


def test_a_serving_instance_reports_its_probe_and_first_serving_time() -> None:
    verdict = judge({}, Observation(RUNNING, 3128, probed=True, outcome=outcome(True)), NOW)
    assert verdict.fields["endpoint"] == "192.0.2.10:3128"
    assert verdict.fields["egressIP"] == "203.0.113.5"
    assert verdict.fields["probe"] == {"latencySeconds": 0.012, "lastProbeTime": "2026-12-06T09:59:50Z",
                                       "servedProviderID": ID}
    assert (verdict.fields["readySince"], verdict.fields["readyProviderID"]) == (NOW, ID)
    # Still serving later: when it first served stays as recorded.
    again = judge(ready_status(), Observation(RUNNING, 3128, probed=True, outcome=outcome(True)), NOW)
    assert "readySince" not in again.fields


def test_an_instance_that_stops_serving_keeps_the_record_that_it_served() -> None:
    status = ready_status(probe={"servedProviderID": ID, "lastProbeTime": "2026-12-06T09:59:00Z"})
    verdict = judge(status, Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT)),
                    NOW)
    assert verdict.fields["probe"] == {"lastProbeTime": "2026-12-06T09:59:50Z", "servedProviderID": ID}
    assert "readySince" not in verdict.fields


def test_another_instance_starts_from_a_clean_status() -> None:
    other = Instance("kvm://hosts/h1/domains/p-b", state="running", ip="192.0.2.11", endpoint="192.0.2.11:3128")
    verdict = judge(ready_status(probe={"servedProviderID": ID}), Observation(other, 3128, probed=True), NOW)
    assert verdict.new_instance
    # Not probed yet, and its predecessor's Ready verdict does not carry over.
    assert (verdict.phase, verdict.ready[1]) == ("Provisioning", "AwaitingProbe")


@pytest.mark.parametrize(("previous", "built", "probe", "events"), [
    (None, OPEN, outcome(True, private=None), [("Warning", "AuthDisabled")]),
    ("AuthDisabled", OPEN, outcome(True, private=None), []),
    (None, BUILT_PRIVATE, outcome(True, private=False), [("Warning", "NotPrivate")]),
    ("NotPrivate", BUILT_PRIVATE, outcome(True, private=False), []),
    (None, BUILT_PRIVATE, outcome(True), []),
])
def test_warnings_about_privacy_are_emitted_once_when_they_start(
        previous: str | None, built: tuple[str, str, str], probe: ProbeOutcome, events: list[tuple[str, str]]) -> None:
    status = {"conditions": [{"type": PRIVATE, "status": "False", "reason": previous}]} if previous else {}
    verdict = judge(status, Observation(RUNNING, 3128, probed=True, outcome=probe, built_private=built), NOW)
    assert [event[:2] for event in verdict.events] == events


def test_the_endpoint_is_the_providers_and_the_ip_the_instances_own() -> None:
    # A Pod exposed by a LoadBalancer Service: crawlers dial the load balancer, status.ip stays the
    # Pod's own address (docs/contract.md, "Status").
    exposed = Instance(provider_id="k8s://namespaces/egress/pods/p-a", name="p-a", location="egress",
                       state="running", ip="10.244.1.7", endpoint="198.51.100.20:3128")
    verdict = judge({}, Observation(exposed, 3128, probed=True, outcome=outcome(True)), NOW)
    assert (verdict.fields["ip"], verdict.fields["endpoint"]) == ("10.244.1.7", "198.51.100.20:3128")
    assert "198.51.100.20:3128" in verdict.ready[2]
    # Without one the instance is not running yet for the controller (docs/contract.md).
    no_endpoint = Instance(ID, name="p-a", state="running", ip="192.0.2.10")
    assert judge({}, Observation(no_endpoint, 3128), NOW).ready[1] == "Provisioning"


def test_a_ready_instance_keeps_its_address_when_the_provider_cannot_read_it() -> None:
    unknown = Instance(ID, state="running", ip=None)
    known = with_known_address(ready_status(), unknown)
    assert (known.ip, known.endpoint, known.running) == ("192.0.2.10", "192.0.2.10:3128", True)
    # Not for another instance, nor for one that was never Ready.
    assert with_known_address(ready_status(providerID="other"), unknown).ip is None
    assert with_known_address({**ready_status(), "phase": "Provisioning"}, unknown).ip is None


@pytest.mark.parametrize(("seen", "serves_now"), [
    (Observation(RUNNING, 3128, probed=True, outcome=outcome(True), built_private=BUILT_PRIVATE, quarantined=True),
     True),
    (Observation(RUNNING, 3128, quarantined=True), True),  # probe: none, running with an address
    (Observation(RUNNING, 3128, probed=True, outcome=outcome(True, private=False), quarantined=True), False),
    (Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT), quarantined=True), False),
    (Observation(Instance(ID, state="stopped"), 3128, quarantined=True), False),
])
def test_a_quarantined_instance_still_says_whether_it_serves(seen: Observation, serves_now: bool) -> None:
    """What a pool needs to keep a quarantined member listed while its replacement boots."""
    verdict = judge({}, seen, NOW)
    status = {**verdict.fields, "conditions": [{"type": kind, "status": value[0], "reason": value[1]}
                                               for kind, value in verdict.conditions.items() if value is not None]}
    assert "it still serves" in verdict.ready[2] if serves_now else True
    assert serves(status) is serves_now


def test_a_held_instance_says_until_when_and_keeps_its_record() -> None:
    verdict = judge(ready_status(), Observation(RUNNING, 3128, probed=True, outcome=outcome(False, ProbeReason.TIMEOUT),
                                                provider_failing_since="2026-12-06T09:58:00Z", hold_seconds=300),
                    NOW)
    assert "until 2026-12-06T10:03:00Z" in verdict.ready[2] and "provider-wide failure" in verdict.ready[2]
    assert "readySince" not in verdict.fields  # still the same instance serving since it first did


@pytest.mark.parametrize(("pinned", "reason", "action"), [
    (Pinned("h1", "draining"), "HostDraining", "it is not moved"),
    (Pinned("h1", "cordoned"), "HostCordoned", "no successor can be created there"),
])
def test_a_proxy_pinned_to_a_host_out_of_placement_is_told_once_and_stays_ready(
        pinned: Pinned, reason: str, action: str) -> None:
    seen = Observation(RUNNING, 3128, probed=True, outcome=outcome(True), pinned=pinned)
    first = judge(ready_status(), seen, NOW)
    assert first.phase == "Ready"  # pinned is not broken: it serves where it is
    status, found, message = first.conditions[HOST_ACTIVE] or ("", "", "")
    assert (status, found) == ("False", reason)
    assert f"spec.location pins this Proxy to host h1, whose state is {pinned.state}" in message
    assert action in message
    assert "change spec.location to another host" in message
    assert first.events == (("Warning", reason, message),)
    written = ready_status(conditions=[*ready_status()["conditions"],
                                       {"type": HOST_ACTIVE, "status": "False", "reason": reason, "message": message}])
    assert judge(written, seen, NOW).events == ()  # once, when it starts or changes
    # Not pinned (the host active again, or another location): the condition is removed.
    assert judge(written, Observation(RUNNING, 3128, probed=True, outcome=outcome(True)), NOW).conditions[
        HOST_ACTIVE] is None


def test_a_pool_member_pinned_by_its_pools_placement_is_told_to_change_the_pool() -> None:
    status, reason, message = host_active(Pinned("h1", "draining", pool="scrapers")) or ("", "", "")
    assert (status, reason) == ("False", "HostDraining")
    assert message.startswith("the placement of ProxyPool scrapers pins this Proxy to host h1")
    assert "change the location of ProxyPool scrapers's placement to another host" in message
    assert "spec.location" not in message  # the pool owns the member's spec: editing it is not the fix
