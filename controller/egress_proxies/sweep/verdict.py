"""Is a Proxy's instance Ready? The pure decision that ``live.LivePath.observe`` applies.

Ready means running *and* serving (docs/contract.md, "Serving"): from what the provider reports
about the instance and the latest probe through it, ``judge`` returns the phase, the Ready,
Serving, Private and HostActive conditions, the status fields and the Events to emit. It reads
nothing but its arguments and writes nothing; the table in tests/controller/sweep/test_verdict.py
pins it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from egress_proxies.providers.client import CORDONED, DRAINING, Instance
from egress_proxies.resources import reasons, times
from egress_proxies.resources.conditions import (
    HOST_ACTIVE,
    PRIVATE,
    PROVIDER_LISTED,
    READY,
    SERVING,
    Wanted,
    find_condition,
)
from egress_proxies.resources.proxy import PHASE_PROVISIONING, PHASE_QUARANTINED, PHASE_READY
from egress_proxies.serving.probe import ProbeOutcome

# Status fields that describe one instance, dropped when another takes its place.
INSTANCE_FIELDS = ("ip", "endpoint", "egressIP", "probe", "credentialGeneration", "exposure")
# The Serving reasons of an instance that is not there to serve at all (lost, not "slow").
LOST_REASONS = (reasons.INSTANCE_STOPPED, reasons.INSTANCE_ERROR)

# Private reasons that warn (an Event) when they start: anyone may use the proxy.
WARNED_PRIVACY = (reasons.AUTH_DISABLED, reasons.NOT_PRIVATE)
# (type, reason, message) of an Event about the Proxy.
Event = tuple[str, str, str]


@dataclass(frozen=True)
class Observation:
    """What is known of the Proxy's instance now.

    ``probed``: the provider's instances are probed (``probe: none`` and the decision tests say
    no). ``outcome``: the latest probe of this instance at this address; None when it has not been
    probed yet. ``built_private``: the Private condition as the instance was built (None: no
    access policy). ``credential_generation``: the credential it was built with, for status.
    ``quarantined``: a crawler reported this instance unusable (``pool.quarantined``).
    ``provider_failing_since``: since when every probe of the provider fails at once (a stamp;
    None: not so); for at most ``hold_seconds`` from then a Ready instance stays Ready.
    ``pinned``: its location names a host taken out of placement (None: it does not)."""

    instance: Instance
    port: int
    probed: bool = False
    outcome: ProbeOutcome | None = None
    built_private: Wanted | None = None
    credential_generation: str | None = None
    quarantined: bool = False
    provider_failing_since: str | None = None
    hold_seconds: float = 0.0
    pinned: Pinned | None = None


@dataclass(frozen=True)
class Verdict:
    """``ready`` is the Ready condition; ``conditions`` the others (None removes one); ``fields``
    the status fields to set; ``new_instance``: the status described another instance, whose
    fields (``INSTANCE_FIELDS``) must go first."""

    phase: str
    ready: Wanted
    conditions: dict[str, Wanted | None]
    fields: dict[str, Any]
    new_instance: bool = False
    events: tuple[Event, ...] = field(default=())


def with_known_address(status: Mapping[str, Any], instance: Instance) -> Instance:
    """The instance, with the address and endpoint its status recorded when the provider could not
    read them this time (a hypervisor's daemon just restarted, a lease file rotated): those of a
    running instance that was Ready do not change."""
    if (instance.state == "running" and not instance.ip and status.get("ip")
            and status.get("providerID") == instance.provider_id and status.get("phase") == PHASE_READY):
        return dataclasses.replace(instance, ip=str(status["ip"]),
                                   endpoint=instance.endpoint or str(status.get("endpoint") or "") or None)
    return instance


def judge(status: Mapping[str, Any], seen: Observation, now: str) -> Verdict:
    """The Proxy's next phase and conditions, from its current ``status`` and what was ``seen``;
    ``now`` stamps when an instance first served (``status.readySince``). A quarantined instance
    is ``Quarantined`` whatever else holds (its Serving and Private conditions still tell the
    truth: ``discovery.serves`` reads them), until it is gone."""
    verdict = _on_host(status, seen, _judge(status, seen, now))
    if not seen.quarantined:
        return verdict
    where = f"instance {seen.instance.provider_id}"
    still = "it still serves and " if verdict.phase == PHASE_READY else ""
    message = f"a crawler quarantined {where}; {still}it is being replaced"
    return dataclasses.replace(verdict, phase=PHASE_QUARANTINED, ready=("False", reasons.QUARANTINED, message))


@dataclass(frozen=True)
class Pinned:
    """A Proxy whose location names a host taken out of placement (a KVM host's ``state``:
    ``cordoned`` or ``draining``): the host, its state, and the ProxyPool whose placement set the
    location (None: the Proxy's own spec.location)."""

    host: str
    state: str
    pool: str | None = None

    @property
    def fix(self) -> str:
        """What moves it: a new location, replaced there make before break."""
        if self.pool is not None:
            return (f"change the location of ProxyPool {self.pool}'s placement to another host (its members are "
                    "replaced there, make before break)")
        return "change spec.location to another host (the Proxy is replaced there, make before break) or delete it"


# What a pinned Proxy is told per state (its HostActive reason), and what it means for it.
_PINNED = {
    DRAINING: (reasons.HOST_DRAINING, "it is not moved, and the host is not reported drained while it is there"),
    CORDONED: (reasons.HOST_CORDONED, ("its instance stays and serves, but if it is lost or replaced no successor "
                                       "can be created there")),
}


def host_active(pinned: Pinned | None) -> Wanted | None:
    """The HostActive condition of a Proxy ``pinned`` to a host out of placement; None (no
    condition) when it is not pinned to one."""
    if pinned is None or pinned.state not in _PINNED:
        return None
    reason, meaning = _PINNED[pinned.state]
    where = "spec.location" if pinned.pool is None else f"the placement of ProxyPool {pinned.pool}"
    return ("False", reason, (f"{where} pins this Proxy to host {pinned.host}, whose state is {pinned.state}: "
                              f"{meaning}; {pinned.fix}, or wait for the host to be set active again"))


def _on_host(status: Mapping[str, Any], seen: Observation, verdict: Verdict) -> Verdict:
    """The verdict with the HostActive condition, and a Warning Event when it starts or changes."""
    wanted = host_active(seen.pinned)
    events = verdict.events
    if wanted is not None and find_condition(status, HOST_ACTIVE).get("reason") != wanted[1]:
        events = (*events, ("Warning", wanted[1], wanted[2]))
    return dataclasses.replace(verdict, conditions={**verdict.conditions, HOST_ACTIVE: wanted}, events=events)


def _judge(status: Mapping[str, Any], seen: Observation, now: str) -> Verdict:
    instance = seen.instance
    new_instance = status.get("providerID") != instance.provider_id
    if new_instance:
        status = {k: v for k, v in status.items() if k not in INSTANCE_FIELDS}
    where = f"instance {instance.provider_id}"
    fields: dict[str, Any] = {"providerID": instance.provider_id}
    if instance.location:
        # Where the provider placed it (spec.location, or the host/zone/namespace it chose):
        # the CRD's `-o wide` Location column reads status.location.
        fields["location"] = instance.location
    if instance.state in ("stopped", "error"):
        reason = LOST_REASONS[0] if instance.state == "stopped" else LOST_REASONS[1]
        lost = ("False", reason, f"{where} is {instance.state}")
        return Verdict(PHASE_PROVISIONING, lost, {SERVING: lost, PROVIDER_LISTED: None}, fields, new_instance)
    if not instance.running:
        waiting = ("False", reasons.PROVISIONING, f"{where} is {instance.state}, waiting for it to run with an IP")
        not_yet = ("Unknown", reasons.AWAITING_PROBE, "not running yet")
        return Verdict(PHASE_PROVISIONING, waiting, {SERVING: not_yet, PROVIDER_LISTED: None}, fields, new_instance)
    endpoint = str(instance.endpoint)  # running: the provider reported it
    fields.update(ip=instance.ip, endpoint=endpoint, exposure=instance.exposure)
    if seen.credential_generation is not None:
        fields["credentialGeneration"] = seen.credential_generation
    phase, ready, serving, private = _serving(status, seen, where, endpoint, fields, now)
    if phase == PHASE_READY:
        if status.get("readyProviderID") != instance.provider_id or not status.get("readySince"):
            # When this instance first served: a pool rotates its members by this age.
            fields["readySince"] = now
        fields["readyProviderID"] = instance.provider_id
    events: tuple[Event, ...] = ()
    if (private is not None and private[1] in WARNED_PRIVACY
            and find_condition(status, PRIVATE).get("reason") != private[1]):
        events = (("Warning", private[1], private[2]),)  # once, when it starts
    return Verdict(phase, ready, {SERVING: serving, PROVIDER_LISTED: None, PRIVATE: private}, fields,
                   new_instance, events)


def _serving(status: Mapping[str, Any], seen: Observation, where: str, endpoint: str,
             fields: dict[str, Any], now: str) -> tuple[str, Wanted, Wanted, Wanted | None]:
    """(phase, Ready, Serving, Private) of a running instance with an address, from its probe;
    adds the probe's own fields to ``fields``."""
    instance, outcome, private = seen.instance, seen.outcome, seen.built_private
    if not seen.probed:
        unverified = ("Unknown", reasons.UNVERIFIED, "the provider config says probe: none: nothing checks it serves")
        if private is not None and private[0] == "True":
            # Built to require credentials; with nothing probing, nothing measured that it does.
            private = ("Unknown", reasons.UNVERIFIED, ("the provider config says probe: none: nothing checks that "
                                               "requests without credentials are refused"))
        return PHASE_READY, ("True", reasons.INSTANCE_RUNNING, f"{where} is running at {endpoint}"), unverified, private
    previous_serving = find_condition(status, SERVING)
    was_ready = status.get("phase") == PHASE_READY and status.get("readyProviderID") == instance.provider_id
    if outcome is not None and outcome.reason.unknown:
        return (*_unknown(status, outcome, was_ready, where, endpoint), private)
    if outcome is None:
        if was_ready and previous_serving.get("status") == "True":
            # Served when last probed, and not probed by this process yet (a restarted controller,
            # a provider listed again): the last verdict stands until the first probe, one probe
            # interval, rather than pulling a serving proxy out of discovery.
            message = str(find_condition(status, READY).get("message") or f"{where} at {endpoint} serves")
            kept = ("True", reasons.SERVING, str(previous_serving.get("message") or "served when last probed"))
            return PHASE_READY, ("True", reasons.SERVING, message), kept, private
        awaiting = ("False", reasons.AWAITING_PROBE,
                    f"{where} is running at {endpoint}; waiting for the first probe through it")
        return PHASE_PROVISIONING, awaiting, ("Unknown", reasons.AWAITING_PROBE, "not probed yet"), private
    probed_at = times.stamp(outcome.probed_at)
    if outcome.serving and outcome.private is False:
        # It serves anyone: an open relay is never handed to crawlers.
        message = f"{where} at {endpoint} serves requests WITHOUT credentials: {outcome.privacy_message}"
        return (PHASE_PROVISIONING, ("False", reasons.NOT_PRIVATE, message),
                ("True", reasons.SERVING, f"serves ({outcome.message})"), ("False", reasons.NOT_PRIVATE, message))
    if outcome.serving:
        latency = outcome.latency_seconds or 0.0
        message = (f"{where} at {endpoint} serves: requests through it reached the probe target "
                   f"({latency * 1000:.0f} ms)")
        if instance.exposure:  # whether that proves the path a crawler outside takes (the provider says)
            message += f"; reached as {instance.exposure}"
        fields["egressIP"] = outcome.egress_ip
        fields["probe"] = {"latencySeconds": round(latency, 4), "lastProbeTime": probed_at,
                           "servedProviderID": instance.provider_id}
        return PHASE_READY, ("True", reasons.SERVING, message), ("True", reasons.SERVING, message), private
    message = f"{where} at {endpoint} runs but does not serve: {outcome.reason}: {outcome.message}"
    served = (status.get("probe") or {}).get("servedProviderID")
    fields["probe"] = {"lastProbeTime": probed_at,
                       **({"servedProviderID": served} if served == instance.provider_id else {})}
    failing: Wanted = ("False", outcome.reason.value, outcome.message)
    until = _held_until(seen, now) if was_ready else None
    if until is not None:
        # Every probe of the provider fails at once: the provider's failure, not this proxy's. The
        # last serving set stays in discovery for a bounded time.
        held = (f"{where} at {endpoint} kept in discovery until {until}: every probe of its provider fails at "
                f"once since {seen.provider_failing_since} (a provider-wide failure); this one: {outcome.reason}")
        return PHASE_READY, ("True", reasons.PROVIDER_WIDE_FAILURE, held), failing, private
    return PHASE_PROVISIONING, ("False", reasons.NOT_SERVING, message), failing, private


def _unknown(status: Mapping[str, Any], outcome: ProbeOutcome, was_ready: bool, where: str,
             endpoint: str) -> tuple[str, Wanted, Wanted]:
    """(phase, Ready, Serving) while the probe says nothing of the proxy (the probe target does not
    answer, or none is configured): the last verdict stands; nothing new becomes Ready."""
    serving: Wanted = ("Unknown", outcome.reason.value, outcome.message)
    if was_ready:
        ready = find_condition(status, READY)
        message = str(ready.get("message") or f"{where} at {endpoint} serves")
        return PHASE_READY, ("True", str(ready.get("reason") or reasons.SERVING), message), serving
    waiting = f"{where} is running at {endpoint}; no probe can tell whether it serves: {outcome.message}"
    return PHASE_PROVISIONING, ("False", reasons.AWAITING_PROBE, waiting), serving


def _held_until(seen: Observation, now: str) -> str | None:
    """Until when a Ready instance stays Ready through a provider-wide failure (None: not held)."""
    since = times.parse(seen.provider_failing_since)
    current = times.parse(now)
    if since is None or current is None:
        return None
    until = since.timestamp() + seen.hold_seconds
    return times.stamp(until) if current.timestamp() < until else None
