"""ProxyPool: the resource, its validation, its members' names and bodies, and which Proxies are
its members. Pure: no I/O but reading the ProxyPool CRD's schema once (``schema.pool_spec_errors``).

A pool manages ordinary Proxy objects, Deployment-style: ``sweep.pools.PoolReconciler`` reads
the pools and their members, asks ``sweep.placement.decide`` what to do (spread, failover,
rotation, quarantine, steps: docs/architecture.md, "Pools"), and writes it through a
``PoolStore`` with the status ``sweep.pool_status`` makes of it. Each member is then reconciled
by the existing Proxy path (instances, Serving, privacy, deletion through the finalizer), so a
pool adds no instance machinery of its own.

**Ownership**: a pool manages only the Proxies it created, those with a controller owner
reference to its uid (``owned_by``); a Proxy merely carrying its label is someone else's
(``foreign``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from egress_proxies.resources.proxy import API_VERSION, GROUP, KIND, CustomObject, Proxy
from egress_proxies.resources.schema import DURATION_PATTERN, pool_spec_errors

POOL_KIND = "ProxyPool"
POOL_PLURAL = "proxypools"
POOL_LABEL = f"{GROUP}/pool"
PLACEMENT_LABEL = f"{GROUP}/pool-placement"
# The last member serial used; written before the members it names are created.
SERIAL_ANNOTATION = f"{GROUP}/pool-serial"
# On a member: why the pool replaces it (one of the two below); written before its successor is
# created, so a restart continues the same replacement.
RETIRING_ANNOTATION = f"{GROUP}/pool-retiring"
RETIRING_ROTATION = "rotation"  # Ready longer than its jittered maxAge
RETIRING_TEMPLATE = "template"  # built from an older template
# On any Proxy: the providerID a crawler reported as unusable (banned); set by the quarantine
# endpoint. Only the instance it names is quarantined: a replacement is not.
QUARANTINE_ANNOTATION = f"{GROUP}/quarantine"
# On a bare Proxy: "<spec hash>:<n>", how many of its recorded replacements were for quarantine (or
# a draining host, sweep/live.NOT_THE_SPECS_FAULT);
# they do not count toward ReplacementsExhausted (a banned IP says nothing about the spec).
QUARANTINE_REPLACEMENTS = f"{GROUP}/quarantine-replacements"

DEFAULT_FAILOVER_AFTER = 120.0
DEFAULT_MAX_SURGE = 1
DEFAULT_MAX_UNAVAILABLE = 0
DEFAULT_JITTER = 0.1
TEMPLATE_FORBIDDEN = ("provider", "location")

# The CRD's own pattern (ASCII digits only, as the API server's), so the two never disagree.
_DURATION = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: Any) -> float | None:
    """A Go-style duration ("6h", "1h30m", "90s", "500ms") in seconds; None when it is not one."""
    if not isinstance(text, str) or not _DURATION.match(text):
        return None
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text))


@dataclass
class Pool(CustomObject[Any]):
    """One ProxyPool object as a source read it (the API's own shape, as plain dicts). Its
    ``defect``: why the source cannot present it now (an unparseable file, malformed metadata):
    it goes Failed with that message, and nothing is created or deleted for it."""

    @classmethod
    def _spec_from(cls, spec: Any, problems: list[str]) -> Any:  # noqa: ARG003 - the base's signature
        # Kept as found: ``parse_spec`` says what is wrong with it, field by field.
        return spec

    @property
    def serial(self) -> int:
        value = self.annotations.get(SERIAL_ANNOTATION, "0")
        return int(value) if value.isdigit() else 0

    @property
    def selector(self) -> str:
        return f"{POOL_LABEL}={self.name}"

    @classmethod
    def from_object(cls, obj: Any) -> Self:
        pool = super().from_object(obj)
        pool.raw = obj if isinstance(obj, dict) else None  # a write sends back what it did not change
        return pool


@dataclass(frozen=True)
class Placement:
    provider: str
    location: str | None = None
    weight: int = 1
    max: int | None = None

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.location}" if self.location else self.provider


@dataclass(frozen=True)
class PoolSpec:
    replicas: int
    template: Mapping[str, Any]
    placements: tuple[Placement, ...]
    max_age_seconds: float | None = None
    max_surge: int = DEFAULT_MAX_SURGE
    max_unavailable: int = DEFAULT_MAX_UNAVAILABLE
    jitter: float = DEFAULT_JITTER
    min_ready: int | None = None
    failover_after_seconds: float = DEFAULT_FAILOVER_AFTER
    distinct_egress_ips: bool = False

    def member_spec(self, index: int) -> dict[str, Any]:
        placement = self.placements[index]
        spec = {**self.template, "provider": placement.provider}
        if placement.location:
            spec["location"] = placement.location
        return spec

    @property
    def available_minimum(self) -> int:
        return self.min_ready if self.min_ready is not None else max(0, self.replicas - self.max_unavailable)


def _duration(value: Any, path: str, errors: list[str]) -> float | None:
    """A duration field in seconds (None: omitted, or not one, which the schema reports)."""
    seconds = parse_duration(value) if value is not None else None
    if seconds is not None and seconds <= 0:
        # The schema's pattern admits "0s"; a pattern that does not would be unreadable (RE2,
        # which the API server uses, has no lookahead).
        errors.append(f"{path}: must be a duration greater than 0, such as \"90s\" or \"6h\" (got {value!r})")
        return None
    return seconds


def parse_spec(spec: Any) -> tuple[PoolSpec | None, list[str]]:
    """The typed spec, or every problem as ``<field path>: <what it must be> (got ...)``.

    What each field may hold is the ProxyPool CRD's schema, checked as the API server checks it
    (``schema.pool_spec_errors``); here only what a JSON schema cannot say: rules across fields
    (``minReady <= replicas`` is also the CRD's CEL rule, for the API server), a template field
    that the placement owns, a duration of 0. A placement naming a provider the provider config
    does not have is not an error of the pool: the config changes under a pool (a provider
    removed, or not added yet), so such a placement is degraded like a failing one
    (``sweep.pools.ProviderHealth``) and the others carry the pool."""
    spec, errors = pool_spec_errors(spec)
    if not isinstance(spec, dict):
        return None, errors
    template = spec.get("template", {})
    for forbidden in TEMPLATE_FORBIDDEN:
        if isinstance(template, dict) and forbidden in template:
            errors.append(f"spec.template.{forbidden}: not allowed: each member's {forbidden} comes from "
                          "spec.placement; move it there")
    found = spec.get("placement")
    entries: list[Any] = found if isinstance(found, list) else []
    weights = [entry.get("weight", 1) for entry in entries if isinstance(entry, dict)]
    numbers = [w for w in weights if isinstance(w, int | float)]
    if entries and len(numbers) == len(entries) and not any(w > 0 for w in numbers):
        errors.append("spec.placement: at least one placement needs a weight > 0")
    found = spec.get("rotation", {})
    rotation: dict[str, Any] = found if isinstance(found, dict) else {}
    max_age = _duration(rotation.get("maxAge"), "spec.rotation.maxAge", errors)
    surge = rotation.get("maxSurge", DEFAULT_MAX_SURGE)
    unavailable = rotation.get("maxUnavailable", DEFAULT_MAX_UNAVAILABLE)
    if max_age is not None and surge == 0 and unavailable == 0:
        errors.append("spec.rotation: maxSurge and maxUnavailable cannot both be 0 with maxAge set "
                      "(no member could ever be replaced); set maxSurge: 1")
    failover = _duration(spec.get("failoverAfter"), "spec.failoverAfter", errors)
    errors += _min_ready_errors(spec)
    if errors:
        return None, errors
    # Valid against the schema: every value below has its type; an omitted one its CRD default.
    placements = tuple(Placement(e["provider"], e.get("location"), int(e.get("weight", 1)),
                                 None if e.get("max") is None else int(e["max"])) for e in entries)
    min_ready = spec.get("minReady")
    return PoolSpec(replicas=int(spec.get("replicas", 0)), template=dict(template), placements=placements,
                    max_age_seconds=max_age, max_surge=int(surge), max_unavailable=int(unavailable),
                    jitter=float(rotation.get("jitter", DEFAULT_JITTER)),
                    min_ready=None if min_ready is None else int(min_ready),
                    failover_after_seconds=DEFAULT_FAILOVER_AFTER if failover is None else failover,
                    distinct_egress_ips=bool(spec.get("distinctEgressIPs", False))), []


def _min_ready_errors(spec: Mapping[str, Any]) -> list[str]:
    """minReady above replicas: the pool could never be Available (the CRD's CEL rule says the same)."""
    replicas, min_ready = spec.get("replicas", 0), spec.get("minReady")
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (replicas, min_ready))
    if numbers and min_ready > replicas:
        return [(f"spec.minReady: must be at most spec.replicas (got minReady {min_ready} > replicas "
                 f"{replicas}); lower spec.minReady or raise spec.replicas")]
    return []


def member_name(pool: Pool, serial: int) -> str:
    """``<pool>-<5 hex of the pool's uid>-<serial>``: deterministic, so a create repeated after a
    crash names the same member (AlreadyExists), never a second one; unique within the pool at
    any size, since no serial is used twice (a hash of the serial collides: 45 times in 10,000 with
    5 hex characters). The uid's part keeps a re-created pool of the same name off the names of
    the old one's members that are still being deleted."""
    suffix = f"{hashlib.sha256(pool.uid.encode()).hexdigest()[:5]}-{serial}"
    return f"{pool.name[:253 - 1 - len(suffix)]}-{suffix}"


def member_body(pool: Pool, spec: PoolSpec, index: int, name: str) -> dict[str, Any]:
    """A new member Proxy: labels, the owner reference (the pool controls it) and its spec."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": pool.namespace,
                         "labels": {POOL_LABEL: pool.name, PLACEMENT_LABEL: str(index)},
                         "ownerReferences": [{"apiVersion": API_VERSION, "kind": POOL_KIND, "name": pool.name,
                                              "uid": pool.uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec.member_spec(index)}


def pool_of(proxy: Proxy) -> str | None:
    """The name of the pool this Proxy is a member of (its label), or None for a bare Proxy."""
    return proxy.labels.get(POOL_LABEL) or None


def owned_by(proxy: Proxy, pool: Pool) -> bool:
    """A member of ``pool``: created by it, so its label and its controller owner reference to the
    pool's uid. The label alone is anyone's to write: a Proxy that only carries it (written by
    hand, or by another tool) is never adopted, scaled down or deleted (``foreign``)."""
    return proxy.namespace == pool.namespace and pool_of(proxy) == pool.name and controller_of(proxy) == pool.uid


def foreign(proxy: Proxy, pool: Pool) -> bool:
    """Labelled as a member of ``pool`` but created by no pool (no ProxyPool controls it): left
    alone, and reported. One controlled by a pool that is gone is an orphan, deleted instead."""
    return proxy.namespace == pool.namespace and pool_of(proxy) == pool.name and controller_of(proxy) is None


def controller_of(proxy: Proxy) -> str | None:
    """The uid of the ProxyPool controlling this Proxy (its owner reference), or None."""
    for owner in proxy.owner_references:
        if owner.get("kind") == POOL_KIND and owner.get("controller") and owner.get("uid"):
            return str(owner["uid"])
    return None


def quarantine_replacements(annotations: Mapping[str, str], hash_of_spec: str) -> int:
    recorded, _, count = annotations.get(QUARANTINE_REPLACEMENTS, "").partition(":")
    return int(count) if recorded == hash_of_spec and count.isdigit() else 0


def quarantined(proxy: Proxy) -> bool:
    """Whether the instance the Proxy has now was reported unusable (its replacement is not)."""
    provider_id = proxy.status.get("providerID")
    return bool(provider_id) and proxy.annotations.get(QUARANTINE_ANNOTATION) == provider_id
