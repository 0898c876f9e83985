"""Fakes of the controller's two edges, for reconcile tests that need no runner and no API
(and ``RecordingRunner``, which wraps the real runner to remember what was asked of it).

``MemoryStore`` keeps Proxies as the API server would (resourceVersion, finalizers,
deletionTimestamp); ``FakeRunner`` plays a provider behind the module contract, with
scripted failures. The real edges are tested for real elsewhere.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import ProbeSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import POLICY_VERSION
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.runner import AnsibleRunner, Operation, OperationResult
from egress_proxies.resources.proxy import FINALIZER, Proxy
from egress_proxies.serving.probe import ProbeDestination, ProbeOutcome, ProbeReason, ProbeTarget
from egress_proxies.sources.store import Conflict, Gone, WatchEvent


class ManualClock:
    """A monotonic clock a test moves by hand (``clock.now += 30``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MemoryStore:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Proxy] = {}
        self.events: list[tuple[str, str, str, str]] = []
        self.conflicts_to_inject = 0
        self.namespace_uids: dict[str, str] = {}
        self.missing_namespaces: set[str] = set()
        self._versions = itertools.count(1)

    def add(self, name: str, spec: dict[str, Any], namespace: str = "crawlers",
            annotations: dict[str, str] | None = None) -> Proxy:
        proxy = Proxy(namespace=namespace, name=name, uid=str(uuid.uuid4()), spec=copy.deepcopy(spec),
                      annotations=dict(annotations or {}), resource_version=str(next(self._versions)),
                      creation_timestamp="2026-01-01T00:00:00Z")
        self.objects[(namespace, name)] = proxy
        return copy.deepcopy(proxy)

    def get(self, name: str, namespace: str = "crawlers") -> Proxy:
        return copy.deepcopy(self.objects[(namespace, name)])

    def update_spec(self, name: str, **changes: Any) -> None:
        proxy = self.objects[("crawlers", name)]
        proxy.spec.update(changes)
        proxy.generation += 1
        proxy.resource_version = str(next(self._versions))

    def delete(self, name: str, namespace: str = "crawlers") -> None:
        proxy = self.objects[(namespace, name)]
        if proxy.finalizers:
            proxy.deletion_timestamp = "2026-01-02T00:00:00Z"
            proxy.resource_version = str(next(self._versions))
        else:
            del self.objects[(namespace, name)]

    def exists(self, name: str, namespace: str = "crawlers") -> bool:
        return (namespace, name) in self.objects

    # -- ProxyStore ----------------------------------------------------------------------------

    def list_proxies(self) -> tuple[list[Proxy], str]:
        return [copy.deepcopy(p) for p in self.objects.values()], str(next(self._versions))

    def namespace_identities(self, namespaces: Collection[str]) -> dict[str, str]:
        """Every namespace exists, with the uid in ``namespace_uids`` (made on first sight); a test
        re-creates one by giving it another uid, or deletes one by ``missing_namespaces``."""
        for namespace in namespaces:
            self.namespace_uids.setdefault(namespace, str(uuid.uuid4()))
        return {n: self.namespace_uids[n] for n in namespaces if n not in self.missing_namespaces}

    def get_proxy(self, namespace: str, name: str) -> Proxy:
        if (namespace, name) not in self.objects:
            raise Gone(f"{namespace}/{name}")
        return copy.deepcopy(self.objects[(namespace, name)])

    def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:  # noqa: ARG002
        return iter(())

    def _write(self, proxy: Proxy, what: str) -> Proxy:
        key = (proxy.namespace, proxy.name)
        if key not in self.objects:
            raise Gone(proxy.key)
        stored = self.objects[key]
        if self.conflicts_to_inject > 0:
            self.conflicts_to_inject -= 1
            stored.resource_version = str(next(self._versions))  # someone else wrote meanwhile
        if proxy.resource_version != stored.resource_version:
            raise Conflict(f"{proxy.key}: stale resourceVersion")
        if what == "metadata":
            stored.finalizers = list(proxy.finalizers)
            stored.annotations = dict(proxy.annotations)
            if stored.deleting and FINALIZER not in stored.finalizers and not stored.finalizers:
                del self.objects[key]
                return copy.deepcopy(proxy)
        else:
            stored.status = copy.deepcopy(proxy.status)
        stored.resource_version = str(next(self._versions))
        return copy.deepcopy(stored)

    def replace_metadata(self, proxy: Proxy) -> Proxy:
        return self._write(proxy, "metadata")

    def replace_status(self, proxy: Proxy) -> Proxy:
        return self._write(proxy, "status")

    def record_event(self, proxy: Proxy, event_type: str, reason: str, message: str) -> None:
        self.events.append((proxy.key, event_type, reason, message))

    def reasons(self, key: str = "crawlers/eu-1") -> list[str]:
        return [reason for event_key, _, reason, _ in self.events if event_key == key]


@dataclass
class Call:
    provider: str
    verb: str
    operations: list[Operation]


@dataclass
class FakeRunner:
    """A provider behind the module contract. ``fail`` maps (module, provider_id or name) to a
    failure (error_class, message) returned instead of acting."""

    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    fail: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    list_failure: tuple[str, str] | None = None
    provider: str = "home-kvm"  # the provider this fake plays; every other one is empty
    filter_by_tags: bool = True  # False: a listing that (wrongly) returns every instance
    ip: str | None = "192.0.2.10"
    created: str = "2026-01-01T00:00:00Z"
    # provider name -> its section's errors, as the collection's validator would report them.
    invalid_providers: dict[str, list[str]] = field(default_factory=dict)
    # What a provider's backend shows wrong, reported when the check asks for it (check_backends).
    backend_errors: dict[str, list[str]] = field(default_factory=dict)
    # The access policy version the collection's modules deliver (provider_config_info's).
    policy_version: str = POLICY_VERSION
    # Every provider's probe settings as the validator reports them (None: probe: none).
    probe: dict[str, Any] | None = None
    # provider name -> {location: "cordoned" | "draining"}, as the validator reports a KVM host's state.
    location_states: dict[str, dict[str, str]] = field(default_factory=dict)

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        if operations and operations[0].module == "provider_config_info":
            self.calls.append(Call(provider, verb, list(operations)))
            return [self._check_config(op) for op in operations]
        # A batch-form call (``operations`` / ``provider_ids``) is recorded as its items, each as
        # the single-form call it stands for, so tests read what was asked per Proxy either way.
        items = [self._items(op) for op in operations]
        self.calls.append(Call(provider, verb, [item for batch in items for item in (batch or [])]
                               + [op for op, batch in zip(operations, items, strict=True) if batch is None]))
        results = []
        for op, batch in zip(operations, items, strict=True):
            if batch is None:
                results.append(self._one(op) if provider == self.provider
                               else OperationResult(ok=True, result={"instances": []}))
                continue
            answers = [self._one(item) if provider == self.provider
                       else OperationResult(ok=True, result={"instances": []}) for item in batch]
            entries = [self._entry(answer) for answer in answers]
            results.append(OperationResult(ok=True, result={"changed": any(e["changed"] for e in entries),
                                                            "results": entries}))
        return results

    @staticmethod
    def _items(op: Operation) -> list[Operation] | None:
        """The single-form calls a batch-form call stands for; None for a single-form call."""
        common = {k: v for k, v in op.args.items() if k not in ("operations", "provider_ids")}
        if "operations" in op.args:
            return [Operation(op.module, {**common, **{k: v for k, v in item.items() if k != "key"}},
                              key=item.get("key") or "") for item in op.args["operations"]]
        if "provider_ids" in op.args:
            keys = op.keys or (op.key,) * len(op.args["provider_ids"])
            return [Operation(op.module, {**common, "provider_id": pid}, key=key)
                    for pid, key in zip(op.args["provider_ids"], keys, strict=True)]
        return None

    @staticmethod
    def _entry(answer: OperationResult) -> dict[str, Any]:
        """A single-form answer as an entry of the batch form's ``results``."""
        if not answer.ok:
            return {"ok": False, "changed": False, "instance": None, "error_class": answer.error_class,
                    "msg": answer.message}
        instance = answer.result.get("instance") or next(iter(answer.result.get("instances") or []), None)
        return {"ok": True, "changed": bool(answer.result.get("changed")), "instance": instance,
                "provider_id": answer.result.get("provider_id"), "error_class": None, "msg": ""}

    def _one(self, op: Operation) -> OperationResult:
        args = op.args
        target = args.get("provider_id") or args.get("name") or ""
        scripted = self.fail.get((op.module, target))
        if scripted:
            return OperationResult.failure(ErrorClass.of(scripted[0]), scripted[1], {"error_class": scripted[0]})
        if op.module.endswith("_info"):
            if "tags" in args:
                if self.list_failure:
                    error_class, message = self.list_failure
                    return OperationResult.failure(ErrorClass.of(error_class), message, result={
                        "instances": list(self.instances.values())})
                wanted = args["tags"] if self.filter_by_tags else {}
                return OperationResult(ok=True, result={"instances": [
                    i for i in self.instances.values() if all(i["tags"].get(k) == v for k, v in wanted.items())]})
            if target in self.instances:
                return OperationResult(ok=True, result={"instances": [self.instances[target]]})
            return OperationResult.failure(ErrorClass.NOT_FOUND, f"{target} does not exist")
        if args.get("state") == "absent":
            existed = self.instances.pop(target, None) is not None
            return OperationResult(ok=True, result={"changed": existed, "provider_id": target})
        provider_id = f"kvm://hosts/h1/domains/{args['name']}"
        instance = self.instances.setdefault(provider_id, {
            "provider_id": provider_id, "name": args["name"], "location": "h1", "state": "running",
            "ip": self.ip, "endpoint": f"{self.ip}:{args.get('port') or 3128}" if self.ip else None,
            "tags": dict(args["tags"]), "created": self.created})
        return OperationResult(ok=True, result={"changed": True, "instance": instance, "provider_id": provider_id})

    def verbs(self) -> list[str]:
        """The verbs of provider calls (the config check is not a provider call)."""
        return [call.verb for call in self.calls if call.verb != "check"]

    def _check_config(self, op: Operation) -> OperationResult:
        """The collection's validator, faked from the file's names and types (the real one runs
        in the end-to-end tests and in tests/integration/test_provider_config_info.py)."""
        document = yaml.safe_load(Path(op.args["provider_config"]).read_text())
        # Not probed unless a test says otherwise: the fake's instances have made-up addresses.
        probe = self.probe if self.probe is not None else ProbeSettings(enabled=False).as_dict()
        asked = bool(op.args.get("check_backends"))
        providers = [{"name": p["name"], "type": p["type"], "valid": p["name"] not in self.invalid_providers,
                      "errors": self.invalid_providers.get(p["name"], []), "probe": dict(probe),
                      "allowed_sources": p.get("allowedSources") or ["10.0.0.0/8"],
                      "backend_errors": self.backend_errors.get(p["name"], []) if asked else [],
                      "allowed_destinations": p.get("allowedDestinations") or [],
                      "location_states": self.location_states.get(p["name"], {})}
                     for p in document["providers"]]
        errors = [e for p in providers for e in p["errors"]]
        return OperationResult(ok=True, result={"valid": not errors, "owner": document["owner"],
                                                "providers": providers, "errors": errors,
                                                "access_policy_version": self.policy_version})


class RecordingRunner:
    """The real AnsibleRunner, remembering which provider and verb each call was for."""

    def __init__(self, inner: AnsibleRunner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str, list[Operation]]] = []

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        # Batch-form calls are recorded as their items, as FakeRunner records them.
        items = [FakeRunner._items(op) or [op] for op in operations]
        self.calls.append((provider, verb, [item for batch in items for item in batch]))
        return self.inner.run(provider, verb, operations)

    def verbs(self) -> list[str]:
        """The verbs of provider calls (the config check is not a provider call)."""
        return [verb for _, verb, _ in self.calls if verb != "check"]


def probe_settings(key_file: Path, **overrides: Any) -> dict[str, Any]:
    """A provider's probe settings as the collection's validator returns them, naming a probe
    target (never contacted: a ``ScriptedProber`` answers) and a key file, written here."""
    if not key_file.exists():
        key_file.write_text("k" * 32 + "\n")
    settings = ProbeSettings(enabled=True, http_url="http://probe.test/generate_204", key_file=str(key_file))
    return {**settings.as_dict(), "connect": None, **overrides}


class ScriptedProber:
    """The prober's interface (``probe_one``, ``check_destination``, ``clock``, ``now``) played
    from a script, by the target's host: ``serving`` (True, or a failure reason), ``private``
    (False: serves without credentials too), ``delay`` (seconds a probe takes); ``target_down``:
    the probe target does not answer the controller directly; ``error``: raised by every probe."""

    def __init__(self, now: datetime.datetime | None = None) -> None:
        self.serving: dict[str, bool | ProbeReason] = {}
        self.private: dict[str, bool] = {}
        self.delay: dict[str, float] = {}
        self.probed: list[tuple[str, bool]] = []  # (host, full)
        self.answered: list[tuple[str, bool]] = []  # (host, whether the monitor said it served last)
        self.targets: list[ProbeTarget] = []
        self.checks = 0
        self.destinations: set[ProbeDestination] = set()
        self.target_down = False
        self.error: Exception | None = None
        self.clock = time.monotonic
        self._now = now

    def now(self) -> datetime.datetime:
        return self._now or datetime.datetime.now(datetime.UTC)

    async def probe_one(self, target: ProbeTarget, *, full: bool = True, answered: bool = False) -> ProbeOutcome:
        if self.error is not None:
            raise self.error
        started = self.now()
        self.probed.append((target.host, full))
        self.answered.append((target.host, answered))
        self.targets.append(target)
        await asyncio.sleep(self.delay.get(target.host, 0.0))
        state = self.serving.get(target.host, True)
        if state is True:
            private = self.private.get(target.host, True) if full else None
            return ProbeOutcome(True, ProbeReason.SERVING, "ok", 0.012, "198.51.100.7" if full else None, private,
                                "scripted" if full else "not checked", started, full)
        reason = state if isinstance(state, ProbeReason) else ProbeReason.TIMEOUT
        return ProbeOutcome(False, reason, f"{reason} at {target.endpoint}", None, None, None, "", started, full)

    async def check_destination(self, destination: ProbeDestination) -> str | None:
        self.checks += 1
        self.destinations.add(destination)
        return "ProbeTargetUnreachable: Timeout: nothing answers" if self.target_down else None
