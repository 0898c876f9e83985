"""One sweep: check the provider config, read and validate every Proxy, list every provider once,
then hand each part its decisions (``live``: instances for live Proxies; ``deletion``: releasing
deleting ones; ``garbage``: orphans), and report. Called by ``loop.Controller`` (periodically and
when a watch event arrives); everything it touches goes through ``store.ProxyStore`` and the
typed provider clients of ``providers`` (behind ``runner.Runner``), so it is tested with fakes of
both and, for real, end to end.

Fault isolation is the rule of this module: one bad thing degrades only itself. An invalid Proxy
goes Failed alone; an exception while handling one Proxy is contained to it; a Proxy that keeps
conflicting or vanishes mid-sweep is retried next sweep; an invalid provider section fails only
that provider's Proxies; a provider that cannot be listed stops nothing but itself. Only an
unusable config file or an unreadable Proxy source fails the whole sweep.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from egress_proxies import metrics
from egress_proxies.providers.client import ConfigUnreadable, Listing, ProviderClient, ProviderSet, check_config
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.providers.runner import Runner
from egress_proxies.resources import reasons, times
from egress_proxies.resources.conditions import SERVING, find_condition
from egress_proxies.resources.proxy import (
    FINALIZER,
    PHASE_DELETING,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_PROVISIONING,
    PHASE_QUARANTINED,
    PHASE_READY,
    Proxy,
)
from egress_proxies.resources.schema import ValidationMemo
from egress_proxies.serving.credentials import AccessPolicy, Credentials
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.serving.monitor import ServingMonitor, Watched
from egress_proxies.sources.store import ProxyStore, StoreError
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.containment import Containment
from egress_proxies.sweep.deletion import DeletePath
from egress_proxies.sweep.garbage import GarbageCollector, GarbageSettings
from egress_proxies.sweep.live import LiveParts, LivePath, LiveSettings, SweepPass
from egress_proxies.sweep.locations import LocationReport
from egress_proxies.sweep.pools import PoolReconciler, ProviderHealth
from egress_proxies.sweep.writer import ProxyWriter

log = logging.getLogger(__name__)

# Runs one Proxy's step so that whatever goes wrong stays with that Proxy (``_contain``).
Contain = Callable[[Proxy, Callable[[], object]], None]


@dataclass(frozen=True)
class ReconcileSettings:
    gc_grace_seconds: float = 600.0
    gc_dry_run: bool = False
    # The live path's settings (see LiveSettings for what each means).
    batch_size: int = LiveSettings.batch_size
    parallel_batches: int = LiveSettings.parallel_batches
    stale_listing_seconds: float = LiveSettings.stale_listing_seconds


@dataclass
class SweepReport:
    """What one sweep did. ``ok``: the sweep ran (the config was usable and the Proxies could be
    read); ``clean``: and nothing in it failed (no invalid config section, no failed provider
    listing, no failed Proxy)."""

    ok: bool = True
    runner_calls: int = 0
    created: int = 0
    deleted: int = 0
    released: int = 0
    gc: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    config_errors: list[str] = field(default_factory=list)
    providers_failed: dict[str, str] = field(default_factory=dict)
    proxies_failed: dict[str, str] = field(default_factory=dict)  # Proxy key -> why
    # Providers are reconciled in parallel threads that all count into one report.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + amount)

    def add_gc(self, provider_id: str) -> None:
        with self._lock:
            self.gc.append(provider_id)

    @property
    def clean(self) -> bool:
        return self.ok and not (self.config_errors or self.providers_failed or self.proxies_failed)

    def summary(self) -> str:
        if not self.ok:
            return "FAILED: " + "; ".join(self.errors)
        problems = []
        if self.config_errors:
            problems.append(f"provider config invalid ({len(self.config_errors)} error(s))")
        if self.providers_failed:
            names = ", ".join(sorted(self.providers_failed))
            problems.append(f"{len(self.providers_failed)} provider(s) failing: {names}")
        if self.proxies_failed:
            problems.append(f"{len(self.proxies_failed)} Proxy(ies) failing")
        return "ok" if not problems else "ok with problems: " + "; ".join(problems)


@dataclass(frozen=True)
class SweepParts:
    """What a sweep works with besides the store, the runner and the provider config. Each
    default is what a test of the decisions runs with; the command passes every part."""

    backoff: Backoff = field(default_factory=Backoff)
    # The clock status stamps are written with.
    now: Callable[[], str] = times.stamp
    # Removes the runner's artifacts of Proxies that are gone (None: nothing to remove).
    purge: Callable[[set[str]], int] | None = None
    # None: nothing is probed, and running with an address is Ready (unverified).
    monitor: ServingMonitor | None = None
    # None: instances get no ``access`` (as open as their user-data makes them): the decision
    # tests. The command always passes the credential store: private by default.
    credentials: Credentials | None = None
    # None: no pools (a source without them, the decision tests). Reconciled first in a sweep.
    pools: PoolReconciler | None = None
    # What crawlers are handed: each sweep publishes to it, the probe's verdicts update it.
    discovery: DiscoveryView = field(default_factory=DiscoveryView)


class Reconciler:
    def __init__(self, store: ProxyStore, runner: Runner, config_path: str, settings: ReconcileSettings | None = None,
                 parts: SweepParts | None = None) -> None:
        parts = parts or SweepParts()
        self.store = store
        self.pools = parts.pools
        # Since when (time.monotonic) each provider's listing has failed, sweep after sweep: a
        # pool's placement there is degraded once that lasts its failoverAfter.
        self._failing_since: dict[str, float] = {}
        self.credentials = parts.credentials
        self.monitor = parts.monitor
        self.discovery = parts.discovery
        self.runner = runner
        self.config_path = config_path
        self.settings = settings or ReconcileSettings()
        self.backoff = parts.backoff
        self.writer = ProxyWriter(store, self.backoff, parts.now, parts.purge)
        self.validation = ValidationMemo()
        self.providers: ProviderSet | None = None
        self.containment = Containment("Proxy")
        # What each location holds, and whether a draining host is drained (gauges, log lines).
        self.locations = LocationReport()

    # -- the sweep -----------------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        report = SweepReport()
        with metrics.SWEEP_SECONDS.time():
            try:
                self._sweep(report, time.monotonic())
            except (ConfigUnreadable, StoreError) as error:
                report.ok = False
                report.errors.append(str(error))
                log.error("sweep failed: %s", error)
        metrics.SWEEPS.labels(result="ok" if report.ok else "failed").inc()
        if report.ok:
            metrics.LAST_SUCCESSFUL_SWEEP.set_to_current_time()
        return report

    def provider_set(self) -> ProviderSet:
        """The provider config, checked by the collection's validator; checked again only when the
        file's content changes (one runner call then, none otherwise)."""
        self.providers = check_config(self.runner, self.config_path, previous=self.providers)
        return self.providers

    def _sweep(self, report: SweepReport, started: float) -> None:
        config = self._checked_config(report)
        clients = config.clients(self.runner)
        # The instances are listed while the Proxies are read: neither needs the other, and the
        # listing (a runner call per provider) is most of a steady sweep. Listed before the pools
        # run, so a pool sees this sweep's listing failures.
        with ThreadPoolExecutor(max_workers=1) as side:
            listed = side.submit(self._list_all, clients, report)
            proxies, _ = self.store.list_proxies()
            listings = listed.result()
        proxies = self._after_pools(config, proxies, self._failing_for(listings))
        self._start_pass(proxies)
        contain: Contain = partial(self._contain, report=report)
        usable, unreconciled = self._admit_all(proxies, contain)
        unusable = {name: f"provider {name!r} cannot be used: its section of the provider config is invalid: "
                          + "; ".join(errors) for name, errors in config.invalid.items()}
        access = self._access(config, proxies)
        targets = self._reconcile_live(config, clients, listings, self._live(usable, access), unusable, report,
                                       contain, access)
        deleting = [p for p in usable if p.deleting and FINALIZER in p.finalizers]
        DeletePath(self.writer, self.settings.batch_size, contain, report.add).reconcile(deleting, clients, unusable)
        GarbageCollector(self.store, GarbageSettings(self.settings.gc_grace_seconds, self.settings.gc_dry_run),
                         config.owner, report.add, report.add_gc).collect(usable, unreconciled, clients, listings)
        self._finish(report, config, listings, unusable, targets)
        self._publish(list(self.writer.latest.values()), started)

    def _checked_config(self, report: SweepReport) -> ProviderSet:
        config = self.provider_set()
        if config.errors:
            report.config_errors.extend(config.errors)
            log.warning("provider config %s has %d error(s): %s", config.path, len(config.errors),
                        "; ".join(config.errors))
        return config

    def _after_pools(self, config: ProviderSet, proxies: list[Proxy],
                     failing: Mapping[str, tuple[str, float]]) -> list[Proxy]:
        """The pools' turn; every Proxy, read again when they made or removed members (those they
        created get instances in this same sweep). ``failing``: the providers whose listing fails,
        and for how long."""
        if self.pools is not None:
            health = ProviderHealth(list(config.types), {name: "; ".join(errors) for name, errors in
                                                         config.invalid.items()}, failing)
            if self.pools.reconcile(proxies, health):
                proxies, _ = self.store.list_proxies()
        return proxies

    def _start_pass(self, proxies: Sequence[Proxy]) -> None:
        """Forget what belongs to Proxies that are gone; start the sweep's record of every Proxy."""
        self.backoff.forget({p.uid for p in proxies})
        self.validation.retain(p.uid for p in proxies)
        self.writer.latest = {p.uid: p for p in proxies}
        self.writer.failures = {}

    def _admit_all(self, proxies: Sequence[Proxy], contain: Contain) -> tuple[list[Proxy], list[Proxy]]:
        """(usable, unreconciled): a valid Proxy gets our finalizer and is usable; an invalid or
        defective one goes Failed and is only protected (its instance stays)."""
        usable: list[Proxy] = []
        unreconciled: list[Proxy] = []
        for proxy in proxies:
            problems = [proxy.defect] if proxy.defect else self.validation.errors(proxy)
            if problems and not (proxy.deleting and not proxy.defect):
                unreconciled.append(proxy)
                reason = reasons.SOURCE_DEFECT if proxy.defect else reasons.INVALID_SPEC
                contain(proxy, partial(self.writer.invalid, proxy, reason, "; ".join(problems)))
                continue
            # An invalid spec does not hold up a deletion: it needs only the providerID and the
            # provider's name, and a Proxy that cannot be deleted would wedge its finalizer.
            contain(proxy, partial(self._admit, proxy, usable))
        return usable, unreconciled

    def _access(self, config: ProviderSet, proxies: Sequence[Proxy]) -> AccessPolicy | None:
        """Who may use each instance, with the credentials refreshed for this sweep: bound to the
        identity of each namespace that has a Proxy now (read from the source; a failure fails the
        sweep, as listing the Proxies does), and retired where none is left."""
        if self.credentials is None:
            return None
        self.credentials.refresh(self.store.namespace_identities({p.namespace for p in proxies}))
        return AccessPolicy(self.credentials, config.sources, config.destinations, config.policy_version)

    @staticmethod
    def _live(usable: Sequence[Proxy], access: AccessPolicy | None) -> list[Proxy]:
        """The usable Proxies not being deleted whose namespace is known: one that was not listed
        (deleted between the two reads, so its Proxies are going too) gets nothing this sweep."""
        live = [p for p in usable if not p.deleting]
        if access is None:
            return live
        waiting = sorted({p.namespace for p in live if not access.credentials.knows(p.namespace)})
        if waiting:
            log.info("namespace(s) %s not found: their Proxies wait for the next sweep", ", ".join(waiting))
        return [p for p in live if p.namespace not in waiting]

    def _reconcile_live(self, config: ProviderSet, clients: Mapping[str, ProviderClient],
                        listings: Mapping[str, Listing], live: Sequence[Proxy], unusable: Mapping[str, str],
                        report: SweepReport, contain: Contain,
                        access: AccessPolicy | None) -> dict[str, Watched]:
        """Every live Proxy's instance, providers side by side; returns the endpoints to probe."""
        by_provider: dict[str, list[Proxy]] = {}
        for proxy in live:
            by_provider.setdefault(proxy.provider, []).append(proxy)
        live_settings = LiveSettings(batch_size=self.settings.batch_size,
                                     parallel_batches=self.settings.parallel_batches,
                                     stale_listing_seconds=self.settings.stale_listing_seconds)
        parts = LiveParts(self.writer, self._seconds_since, self.monitor, self.discovery)
        sweep = SweepPass(config.owner, contain, report.add, access=access)

        def reconcile_provider(name: str) -> None:
            live_path = LivePath(live_settings, parts, sweep, config.probes[name], config.states(name))
            try:
                live_path.reconcile(clients[name], by_provider.get(name, []), listings[name])
            except Exception as error:  # a bug must not take the other providers' sweep with it
                log.exception("provider %s: reconcile failed", name)
                report.providers_failed[name] = f"reconcile failed: {error!r}"

        with ThreadPoolExecutor(max_workers=max(1, len(clients))) as pool:
            list(pool.map(reconcile_provider, [name for name in clients if by_provider.get(name)]))
        for name, group in by_provider.items():
            if name not in clients:
                for proxy in group:
                    contain(proxy, partial(self._provider_unusable, proxy, config, unusable.get(name)))
        return sweep.targets

    def _provider_unusable(self, proxy: Proxy, config: ProviderSet, why: str | None) -> None:
        """A live Proxy whose provider has an invalid section (``why``) or is not configured."""
        if why is not None:
            self.writer.failed(proxy, ProviderError(ErrorClass.PERMANENT, why), reasons.PROVIDER_CONFIG_INVALID)
        else:
            self._provider_missing(proxy, config)

    def _finish(self, report: SweepReport, config: ProviderSet, listings: Mapping[str, Listing],
                unusable: Mapping[str, str], targets: Mapping[str, Watched]) -> None:
        """The sweep's report, what each location holds (gauges), and the endpoints to probe from now on."""
        for name, listing in listings.items():
            if listing.error is not None:
                report.providers_failed.setdefault(name, str(listing.error))
        for name in config.invalid:
            report.providers_failed.setdefault(name, unusable[name])
        report.proxies_failed.update(self.writer.failures)
        if self.pools is not None:
            report.proxies_failed.update({f"pool {key}": why for key, why in self.pools.failed.items()})
        self.locations.publish(config.location_states, listings)
        if self.monitor is not None:
            self.monitor.watch(targets, config.probes)

    def _admit(self, proxy: Proxy, usable: list[Proxy]) -> None:
        usable.append(self.writer.ensure_finalizer(proxy))

    def _publish(self, final: list[Proxy], started: float) -> None:
        """The phase and serving gauges; and discovery's view, with the pools' floors (the members
        a pool still needs for its minReady stay listed: ``discovery.handed_out``)."""
        phases: dict[str, int] = {}
        serving: dict[str, int] = {"True": 0, "False": 0, "Unknown": 0}
        for proxy in final:
            phase = str(proxy.status.get("phase") or PHASE_PENDING)
            phases[phase] = phases.get(phase, 0) + 1
            state = str(find_condition(proxy.status, SERVING).get("status") or "Unknown")
            serving[state] = serving.get(state, 0) + 1
        for phase in (PHASE_PENDING, PHASE_PROVISIONING, PHASE_READY, PHASE_QUARANTINED, PHASE_DELETING,
                      PHASE_FAILED):
            metrics.PROXIES.labels(phase=phase).set(phases.get(phase, 0))
        for state, count in serving.items():
            metrics.SERVING.labels(serving=state).set(count)
        self.discovery.publish(final, self.pools.floors if self.pools is not None else {}, started)

    def _contain(self, proxy: Proxy, action: Callable[[], object], *, report: SweepReport) -> None:
        """Run one Proxy's step; whatever goes wrong stays with that Proxy."""
        def failed(why: str) -> None:
            report.proxies_failed[proxy.key] = why

        def record_crash(signature: str) -> None:
            self.writer.invalid(proxy, reasons.INTERNAL_ERROR,
                                f"the controller failed on this Proxy ({signature}); see its log")

        self.containment.run(proxy.key, proxy.uid, action, failed=failed, record_crash=record_crash,
                             gone=lambda: self.writer.forget(proxy))

    @staticmethod
    def _seconds_since(stamp: str) -> float:
        age = times.seconds_since(stamp)
        return 0.0 if age is None else age

    # -- listing -------------------------------------------------------------------------------

    def _failing_for(self, listings: Mapping[str, Listing]) -> dict[str, tuple[str, float]]:
        """The providers whose listing failed in this sweep: why, and for how many seconds in a
        row (since the first of the failed sweeps)."""
        now = time.monotonic()
        self._failing_since = {name: self._failing_since.get(name, now) for name, listing in listings.items()
                               if listing.error is not None}
        return {name: (str(listings[name].error), now - since) for name, since in self._failing_since.items()}

    def _list_all(self, clients: Mapping[str, ProviderClient], report: SweepReport) -> dict[str, Listing]:
        """One info call per provider, all providers in parallel."""
        owner = self.providers.owner if self.providers else ""

        def list_one(client: ProviderClient) -> Listing:
            try:
                listing = client.list_instances(owner)
            except Exception as error:  # never from the runner; a bug here fails this provider only
                log.exception("listing provider %s crashed", client.name)
                listing = Listing(error=ProviderError(ErrorClass.TRANSIENT, f"listing crashed: {error!r}"))
            report.add("runner_calls")
            if listing.error is not None:
                metrics.ERRORS.labels(provider=client.name, error_class=listing.error.error_class.value).inc()
                log.warning("listing provider %s failed (%s)", client.name, listing.error,
                            extra={"provider": client.name})
            return listing

        if not clients:
            return {}
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            return dict(zip(clients, pool.map(list_one, clients.values()), strict=True))

    def _provider_missing(self, proxy: Proxy, config: ProviderSet) -> None:
        message = (f"provider {proxy.provider!r} is not in the provider config (configured: "
                   f"{', '.join(sorted(config.types)) or 'none'}); fix spec.provider")
        self.writer.invalid(proxy, reasons.PROVIDER_NOT_CONFIGURED, message)
