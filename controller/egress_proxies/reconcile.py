"""One sweep: list every provider once, diff against the Proxies, run batched creates and
deletes, write status. Called by ``loop.Controller`` (periodically and when a watch
event arrives); everything it touches goes through ``store.ProxyStore`` and
``runner.Runner``, so it is tested with fakes of both and, for real, end to end.

Error classes drive every reaction (design.md): ``not_found`` on Get releases a deleting
Proxy, ``permanent`` sets a condition and requeues slowly (and on the delete path still
calls Delete), ``transient`` backs off exponentially per object.
"""

from __future__ import annotations

import base64
import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from egress_proxies import metrics
from egress_proxies.backoff import Backoff
from egress_proxies.model import (
    FINALIZER,
    OWNER_TAG,
    PHASE_DELETING,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_PROVISIONING,
    PHASE_READY,
    PROXY_TAG,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_TAG,
    UID_TAG,
    Proxy,
    instance_name,
    instance_tags,
    ready_condition,
    spec_hash,
)
from egress_proxies.runner import Operation, OperationResult, Runner
from egress_proxies.store import Conflict, Gone, ProxyStore, StoreError

log = logging.getLogger(__name__)

# Module names per provider type (the contract's P_proxy / P_proxy_info).
MODULES = {"kvm": "kvm", "gcp": "gcp", "kubernetes": "k8s"}
CONFLICT_RETRIES = 5


class ConfigUnreadable(Exception):
    """The provider config file cannot be read; the sweep cannot start."""


@dataclass(frozen=True)
class ProviderConfigView:
    """What the controller itself needs from the provider config; the modules validate the rest."""

    path: str
    owner: str
    providers: dict[str, str]  # name -> type

    @classmethod
    def load(cls, path: str) -> ProviderConfigView:
        try:
            document = yaml.safe_load(Path(path).read_text())
            owner = str(document["owner"])
            providers = {str(p["name"]): str(p["type"]) for p in document["providers"]}
        except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
            raise ConfigUnreadable(f"provider config {path}: {error}") from error
        unknown = {name: kind for name, kind in providers.items() if kind not in MODULES}
        if unknown:
            raise ConfigUnreadable(f"provider config {path}: unknown provider types {unknown}")
        return cls(path=path, owner=owner, providers=providers)


@dataclass(frozen=True)
class ReconcileSettings:
    gc_grace_seconds: float = 600.0
    gc_dry_run: bool = False
    batch_size: int = 50
    # Create batches of one provider run side by side; the runner's memory cap still bounds them.
    parallel_batches: int = 4


@dataclass
class Listing:
    """A provider's instances from one info call. ``complete`` is False when any location failed."""

    instances: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True
    error: OperationResult | None = None
    _by_uid: dict[str, list[dict[str, Any]]] | None = field(default=None, repr=False)

    def of(self, uid: str) -> list[dict[str, Any]]:
        """The instances of one Proxy (indexed once: a sweep asks this for every Proxy)."""
        if self._by_uid is None:
            self._by_uid = {}
            for instance in self.instances:
                self._by_uid.setdefault(str((instance.get("tags") or {}).get(UID_TAG)), []).append(instance)
        return self._by_uid.get(uid, [])


@dataclass
class SweepReport:
    ok: bool = True
    runner_calls: int = 0
    created: int = 0
    deleted: int = 0
    released: int = 0
    gc: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Providers are reconciled in parallel threads that all count into one report.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + amount)

    def add_gc(self, provider_id: str) -> None:
        with self._lock:
            self.gc.append(provider_id)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_seconds(created: str | None, now: datetime.datetime) -> float | None:
    if not created:
        return None
    try:
        stamp = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return (now - stamp).total_seconds()


@dataclass
class _Create:
    proxy: Proxy
    name: str
    hash: str


class Reconciler:
    def __init__(self, store: ProxyStore, runner: Runner, config_path: str, settings: ReconcileSettings | None = None,
                 backoff: Backoff | None = None, now: Callable[[], str] = utc_now,
                 purge: Callable[[set[str]], int] | None = None) -> None:
        self.store = store
        self.runner = runner
        self.config_path = config_path
        self.settings = settings or ReconcileSettings()
        self.backoff = backoff or Backoff()
        self.now = now
        self.purge = purge
        self.last_ready: list[Proxy] = []
        # Every Proxy as last read or written in this sweep: the sweep's end state, without
        # listing them all again.
        self._latest: dict[str, Proxy] = {}

    # -- the sweep -----------------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        report = SweepReport()
        with metrics.SWEEP_SECONDS.time():
            try:
                self._sweep(report)
            except (ConfigUnreadable, StoreError) as error:
                report.ok = False
                report.errors.append(str(error))
                log.error("sweep failed: %s", error)
        metrics.SWEEPS.labels(result="ok" if report.ok else "failed").inc()
        return report

    def _sweep(self, report: SweepReport) -> None:
        config = ProviderConfigView.load(self.config_path)
        proxies, _ = self.store.list_proxies()
        self.backoff.forget({p.uid for p in proxies})
        self._latest = {p.uid: p for p in proxies}
        proxies = [self._ensure_finalizer(p) for p in proxies]
        listings = self._list_all(config, report)

        live = [p for p in proxies if not p.deleting]
        deleting = [p for p in proxies if p.deleting and FINALIZER in p.finalizers]
        by_provider: dict[str, list[Proxy]] = {}
        for proxy in live:
            by_provider.setdefault(proxy.provider, []).append(proxy)

        with ThreadPoolExecutor(max_workers=max(1, len(config.providers) + 1)) as pool:
            futures = [pool.submit(self._reconcile_provider, config, name, by_provider.get(name, []),
                                   listings.get(name), report) for name in config.providers]
            for future in futures:
                future.result()
        for name, group in by_provider.items():
            if name not in config.providers:
                for proxy in group:
                    self._provider_missing(proxy, config)
        self._delete_proxies(config, deleting, report)
        self._collect_garbage(config, proxies, listings, report)

        final = list(self._latest.values())
        phases: dict[str, int] = {}
        for proxy in final:
            phase = proxy.status.get("phase") or PHASE_PENDING
            phases[phase] = phases.get(phase, 0) + 1
        for phase in (PHASE_PENDING, PHASE_PROVISIONING, PHASE_READY, PHASE_DELETING, PHASE_FAILED):
            metrics.PROXIES.labels(phase=phase).set(phases.get(phase, 0))
        self.last_ready = [p for p in final if p.status.get("phase") == PHASE_READY]

    # -- listing -------------------------------------------------------------------------------

    def _list_all(self, config: ProviderConfigView, report: SweepReport) -> dict[str, Listing]:
        """One info call per provider, all providers in parallel."""
        def list_one(name: str) -> Listing:
            kind = MODULES[config.providers[name]]
            result = self.runner.run(name, "list", [Operation(f"{kind}_proxy_info", {
                "provider_config": config.path, "provider": name, "tags": {OWNER_TAG: config.owner}})])[0]
            report.add("runner_calls")
            if result.ok:
                return Listing(instances=list(result.result.get("instances") or []))
            metrics.ERRORS.labels(error_class=result.error_class or "transient").inc()
            log.warning("listing provider %s failed (%s): %s", name, result.error_class, result.message)
            return Listing(instances=list(result.result.get("instances") or []), complete=False, error=result)

        with ThreadPoolExecutor(max_workers=max(1, len(config.providers))) as pool:
            return dict(zip(config.providers, pool.map(list_one, config.providers), strict=True))

    # -- the live path -------------------------------------------------------------------------

    def _reconcile_provider(self, config: ProviderConfigView, name: str, proxies: list[Proxy],
                            listing: Listing | None, report: SweepReport) -> None:
        if not proxies or listing is None:
            return
        kind = MODULES[config.providers[name]]
        creates: list[_Create] = []
        retire: list[tuple[Proxy, dict[str, Any]]] = []
        for proxy in proxies:
            desired = spec_hash(proxy.spec)
            mine = listing.of(proxy.uid)
            current = next((i for i in mine if i.get("tags", {}).get(SPEC_HASH_TAG) == desired), None)
            if current is None:
                if not listing.complete and listing.error is not None and not mine:
                    # The instance may live where we could not look; the create (idempotent by
                    # name) would tell, but a listing failure is the clearer message.
                    self._failed(proxy, listing.error, "ListFailed")
                    continue
                if self.backoff.due(proxy.uid):
                    creates.append(_Create(proxy, instance_name(proxy, desired), desired))
                continue
            self.backoff.succeeded(proxy.uid)  # its provider answers again: no stale backoff
            proxy = self._observe(proxy, current, desired)
            if self._is_ready(current):
                retire.extend((proxy, old) for old in mine if old is not current)

        def create_batch(chunk: list[_Create]) -> tuple[list[_Create], list[OperationResult]]:
            operations = [Operation(f"{kind}_proxy", self._create_args(config, name, c), key=c.proxy.uid)
                          for c in chunk]
            return chunk, self.runner.run(name, "create", operations)

        # Batches run side by side (the runner's memory cap bounds how many at once); each
        # batch's results are recorded as soon as it returns, so a providerID is never lost
        # to a slower batch.
        chunks = _chunks(creates, self.settings.batch_size)
        with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), self.settings.parallel_batches))) as pool:
            done = [pool.submit(create_batch, chunk) for chunk in chunks]
            for future in as_completed(done):
                chunk, results = future.result()
                report.add("runner_calls")
                self._record_creates(chunk, results, listing, retire, report)
        self._retire(kind, name, config, retire, report)

    def _record_creates(self, chunk: list[_Create], results: list[OperationResult], listing: Listing,
                        retire: list[tuple[Proxy, dict[str, Any]]], report: SweepReport) -> None:
        for create, result in zip(chunk, results, strict=True):
            if result.ok:
                report.add("created")
                instance = result.result.get("instance") or {}
                replaced = bool(create.proxy.status.get("providerID"))
                self.store.record_event(create.proxy, "Normal", "Replacing" if replaced else "Created",
                                        f"instance {instance.get('provider_id')} created")
                self.backoff.succeeded(create.proxy.uid)
                proxy = self._observe(create.proxy, instance, create.hash)
                if self._is_ready(instance):
                    retire.extend((proxy, old) for old in listing.of(proxy.uid)
                                  if old.get("provider_id") != instance.get("provider_id"))
            else:
                self._failed(create.proxy, result, "CreateFailed")

    def _create_args(self, config: ProviderConfigView, provider: str, create: _Create) -> dict[str, Any]:
        spec = create.proxy.spec
        raw = spec.get("cloudInit") or ""
        # base64 on the wire whatever the Proxy says: binary-safe, and never a template.
        encoded = raw if spec.get("cloudInitEncoding") == "base64" else base64.b64encode(raw.encode()).decode()
        args: dict[str, Any] = {
            "provider_config": config.path, "provider": provider, "state": "present", "name": create.name,
            "user_data": encoded, "user_data_encoding": "base64", "port": create.proxy.port,
            "tags": instance_tags(config.owner, create.proxy, create.hash),
        }
        for spec_key, arg in (("location", "location"), ("machineType", "machine_type"), ("image", "image")):
            if spec.get(spec_key):
                args[arg] = spec[spec_key]
        return args

    @staticmethod
    def _is_ready(instance: dict[str, Any]) -> bool:
        return instance.get("state") == "running" and bool(instance.get("ip"))

    def _observe(self, proxy: Proxy, instance: dict[str, Any], desired: str) -> Proxy:
        """Status from what the provider reports about the instance built from ``desired``."""
        provider_id = instance.get("provider_id")
        if self._is_ready(instance):
            endpoint = f"{instance['ip']}:{proxy.port}"
            status = self._status(proxy, PHASE_READY, "True", "InstanceRunning",
                                  f"instance {provider_id} is running at {endpoint}",
                                  providerID=provider_id, ip=instance["ip"], endpoint=endpoint)
            if proxy.annotations.get(SPEC_HASH_ANNOTATION) != desired:
                proxy = self._update_metadata(proxy, lambda p: p.annotations.__setitem__(SPEC_HASH_ANNOTATION,
                                                                                         desired))
        else:
            state = instance.get("state") or "pending"
            status = self._status(proxy, PHASE_PROVISIONING, "False", "Provisioning",
                                  f"instance {provider_id} is {state}, waiting for it to run with an IP",
                                  providerID=provider_id)
        return self._write_status(proxy, status)

    def _retire(self, kind: str, provider: str, config: ProviderConfigView,
                retire: Sequence[tuple[Proxy, dict[str, Any]]], report: SweepReport) -> None:
        """Make-before-break: delete instances replaced by a Ready successor."""
        for chunk in _chunks(list(retire), self.settings.batch_size):
            operations = [Operation(f"{kind}_proxy", {"provider_config": config.path, "provider": provider,
                                                      "state": "absent", "provider_id": old["provider_id"]},
                                    key=proxy.uid) for proxy, old in chunk]
            results = self.runner.run(provider, "delete", operations)
            report.add("runner_calls")
            for (proxy, old), result in zip(chunk, results, strict=True):
                if result.ok:
                    report.add("deleted")
                    message = f"old instance {old['provider_id']} deleted after its successor became ready"
                    self.store.record_event(proxy, "Normal", "Replaced", message)
                else:
                    metrics.ERRORS.labels(error_class=result.error_class or "transient").inc()
                    log.warning("%s: deleting replaced instance %s failed (%s): %s", proxy.key, old["provider_id"],
                                result.error_class, result.message)

    def _provider_missing(self, proxy: Proxy, config: ProviderConfigView) -> None:
        message = (f"provider {proxy.provider!r} is not in the provider config (configured: "
                   f"{', '.join(sorted(config.providers)) or 'none'}); fix spec.provider")
        metrics.ERRORS.labels(error_class="permanent").inc()
        if proxy.status.get("phase") != PHASE_FAILED:
            self.store.record_event(proxy, "Warning", "ProviderNotConfigured", message)
        self._write_status(proxy, self._status(proxy, PHASE_FAILED, "False", "ProviderNotConfigured", message))

    def _failed(self, proxy: Proxy, result: OperationResult, reason: str, phase: str | None = None) -> None:
        error_class = result.error_class or "transient"
        metrics.ERRORS.labels(error_class=error_class).inc()
        delay = self.backoff.failed(proxy.uid, error_class)
        message = f"{error_class}: {result.message} (next attempt in {delay:.0f} s)"
        log.warning("%s: %s: %s", proxy.key, reason, message)
        previous: dict[str, Any] = next(
            (c for c in proxy.status.get("conditions") or [] if c.get("type") == "Ready"), {})
        if previous.get("reason") != reason or not str(previous.get("message", "")).startswith(
                f"{error_class}: {result.message}"):
            # One Event when a failure starts or changes, not one per sweep while it lasts.
            self.store.record_event(proxy, "Warning", reason, message)
        if phase is None:
            phase = PHASE_FAILED if error_class == "permanent" else (
                PHASE_PROVISIONING if proxy.status.get("providerID") else PHASE_PENDING)
        self._write_status(proxy, self._status(proxy, phase, "False", reason, message))

    # -- the delete path (design.md, "Deletion") ----------------------------------------------

    def _delete_proxies(self, config: ProviderConfigView, proxies: list[Proxy], report: SweepReport) -> None:
        pending: dict[str, list[Proxy]] = {}
        for proxy in proxies:
            provider_id = proxy.status.get("providerID")
            if not provider_id:  # 1. nothing was created
                self._release(proxy, report)
            elif proxy.skip_cleanup:  # 2. checked before the provider is looked up
                log.info("%s: skip-cleanup set; abandoning instance %s", proxy.key, provider_id)
                self.store.record_event(proxy, "Normal", "Abandoned",
                                        f"instance {provider_id} abandoned (skip-cleanup annotation)")
                self._release(proxy, report)
            elif proxy.provider not in config.providers:  # 3. the annotation is the way out
                message = (f"provider {proxy.provider!r} is not in the provider config, so instance {provider_id} "
                           f"cannot be deleted; set the annotation crawl.example.com/skip-cleanup: \"true\" "
                           f"to release this Proxy and remove the instance by hand")
                metrics.ERRORS.labels(error_class="permanent").inc()
                self._write_status(proxy, self._status(proxy, PHASE_DELETING, "False", "ProviderNotConfigured",
                                                       message))
            elif self.backoff.due(proxy.uid):
                pending.setdefault(proxy.provider, []).append(proxy)
        for provider, group in pending.items():
            self._delete_group(config, provider, group, report)

    def _delete_group(self, config: ProviderConfigView, provider: str, proxies: list[Proxy],
                      report: SweepReport) -> None:
        kind = MODULES[config.providers[provider]]
        common = {"provider_config": config.path, "provider": provider}
        for chunk in _chunks(proxies, self.settings.batch_size):
            gets = self.runner.run(provider, "get", [
                Operation(f"{kind}_proxy_info", {**common, "provider_id": p.status["providerID"]}, key=p.uid)
                for p in chunk])
            report.add("runner_calls")
            to_delete: list[tuple[Proxy, OperationResult]] = []
            for proxy, got in zip(chunk, gets, strict=True):
                if got.ok or got.error_class == "permanent":  # 4. permanent: call Delete anyway
                    to_delete.append((proxy, got))
                elif got.error_class == "not_found":
                    self._release(proxy, report)
                else:
                    self._failed(proxy, got, "DeleteFailed", phase=PHASE_DELETING)
            if not to_delete:
                continue
            deletes = self.runner.run(provider, "delete", [
                Operation(f"{kind}_proxy", {**common, "state": "absent", "provider_id": p.status["providerID"]},
                          key=p.uid) for p, _ in to_delete])
            report.add("runner_calls")
            for (proxy, got), deleted in zip(to_delete, deletes, strict=True):
                if deleted.ok:
                    report.add("deleted")
                    self.store.record_event(proxy, "Normal", "Deleted",
                                            f"instance {proxy.status['providerID']} deleted")
                    self._release(proxy, report)
                elif got.ok:
                    self._failed(proxy, deleted, "DeleteFailed", phase=PHASE_DELETING)
                else:  # both failed: report both, the Delete's class decides the retry
                    joined = OperationResult.failure(
                        deleted.error_class or "transient",
                        f"get failed ({got.error_class}): {got.message}; delete failed ({deleted.error_class}): "
                        f"{deleted.message}")
                    self._failed(proxy, joined, "DeleteFailed", phase=PHASE_DELETING)

    def _release(self, proxy: Proxy, report: SweepReport) -> None:
        """Remove our finalizer so the API can finish deleting the Proxy."""
        def drop(p: Proxy) -> None:
            p.finalizers = [f for f in p.finalizers if f != FINALIZER]
        try:
            self._update_metadata(proxy, drop)
        except Gone:
            pass
        self._latest.pop(proxy.uid, None)  # no longer ours to report
        report.add("released")
        self.backoff.succeeded(proxy.uid)
        if self.purge is not None:
            self.purge({proxy.uid})

    # -- garbage collection --------------------------------------------------------------------

    def _collect_garbage(self, config: ProviderConfigView, proxies: list[Proxy], listings: dict[str, Listing],
                         report: SweepReport) -> None:
        """Delete our instances whose Proxy is gone, older than the grace period.

        Never when any listing failed (a partial view could make a live instance look
        orphaned), and never anything without our owner tag.
        """
        if not all(listing.complete for listing in listings.values()):
            log.info("garbage collection skipped: not every provider could be listed")
            return
        uids = {p.uid for p in proxies}
        now = datetime.datetime.now(datetime.UTC)
        for provider, listing in listings.items():
            orphans = []
            for instance in listing.instances:
                tags = instance.get("tags") or {}
                age = _age_seconds(instance.get("created"), now)
                if tags.get(OWNER_TAG) != config.owner or tags.get(UID_TAG) in uids:
                    continue
                if age is None or age < self.settings.gc_grace_seconds:
                    continue
                orphans.append(instance)
            if not orphans:
                continue
            dry = "true" if self.settings.gc_dry_run else "false"
            for instance in orphans:
                log.info("garbage collection%s: %s (Proxy %s, uid %s, no longer exists)",
                         " (dry run, not deleting)" if self.settings.gc_dry_run else "", instance["provider_id"],
                         instance["tags"].get(PROXY_TAG), instance["tags"].get(UID_TAG))
                report.add_gc(instance["provider_id"])
            if self.settings.gc_dry_run:
                metrics.GC_DELETIONS.labels(provider=provider, dry_run=dry).inc(len(orphans))
                continue
            kind = MODULES[config.providers[provider]]
            results = self.runner.run(provider, "gc", [
                Operation(f"{kind}_proxy", {"provider_config": config.path, "provider": provider, "state": "absent",
                                            "provider_id": i["provider_id"]}, key=i["tags"].get(UID_TAG, ""))
                for i in orphans])
            report.add("runner_calls")
            for instance, result in zip(orphans, results, strict=True):
                if result.ok:
                    metrics.GC_DELETIONS.labels(provider=provider, dry_run=dry).inc()
                    self.store.record_event(_ghost(instance), "Normal", "GarbageCollected",
                                            f"orphaned instance {instance['provider_id']} deleted")
                else:
                    log.warning("garbage collection of %s failed (%s): %s", instance["provider_id"],
                                result.error_class, result.message)

    # -- writes --------------------------------------------------------------------------------

    def _ensure_finalizer(self, proxy: Proxy) -> Proxy:
        if proxy.deleting or FINALIZER in proxy.finalizers:
            return proxy
        return self._update_metadata(proxy, lambda p: p.finalizers.append(FINALIZER))

    def _update_metadata(self, proxy: Proxy, change: Callable[[Proxy], None]) -> Proxy:
        """Apply ``change`` and write it; on a 409, read again and re-apply (never blind-overwrite)."""
        for _ in range(CONFLICT_RETRIES):
            change(proxy)
            try:
                return self._remember(self.store.replace_metadata(proxy))
            except Conflict:
                proxy = self.store.get_proxy(proxy.namespace, proxy.name)
        raise StoreError(f"{proxy.key}: metadata update kept conflicting")

    def _status(self, proxy: Proxy, phase: str, ready: str, reason: str, message: str,
                **fields: Any) -> dict[str, Any]:
        status = {key: value for key, value in proxy.status.items() if key != "conditions"}
        status.update({key: value for key, value in fields.items() if value is not None})
        if phase in (PHASE_PENDING, PHASE_FAILED) and not status.get("providerID"):
            status.pop("ip", None)
            status.pop("endpoint", None)
        if phase not in (PHASE_READY, PHASE_PROVISIONING):
            status.pop("endpoint", None)
        status["phase"] = phase
        status["observedGeneration"] = proxy.generation
        previous = next((c for c in proxy.status.get("conditions") or [] if c.get("type") == "Ready"), None)
        transition = previous["lastTransitionTime"] if previous and previous.get("status") == ready else self.now()
        status["conditions"] = [ready_condition(ready, reason, message, transition, proxy.generation)]
        return status

    def _remember(self, proxy: Proxy) -> Proxy:
        self._latest[proxy.uid] = proxy
        return proxy

    def _write_status(self, proxy: Proxy, status: dict[str, Any]) -> Proxy:
        for _ in range(CONFLICT_RETRIES):
            if proxy.status == status:
                return proxy
            proxy.status = status
            try:
                return self._remember(self.store.replace_status(proxy))
            except Conflict:
                proxy = self.store.get_proxy(proxy.namespace, proxy.name)
                status = {**status, "observedGeneration": proxy.generation}
            except Gone:
                self._latest.pop(proxy.uid, None)
                return proxy
        raise StoreError(f"{proxy.key}: status update kept conflicting")


def _ghost(instance: dict[str, Any]) -> Proxy:
    """A stand-in for the deleted Proxy an orphan belonged to, to hang its Event on."""
    tags = instance.get("tags") or {}
    namespace, _, name = str(tags.get(PROXY_TAG) or "/").partition("/")
    return Proxy(namespace=namespace or "default", name=name or instance.get("name", ""),
                 uid=str(tags.get(UID_TAG) or ""), spec={})


def _chunks(items: Sequence[Any] | Iterable[Any], size: int) -> list[list[Any]]:
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), max(1, size))]
