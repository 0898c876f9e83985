"""The live path of one provider in one sweep: which Proxies need an instance, batched creates,
status from what the provider reports, replacement of instances that do not serve or flap
chronically (``flapping``), and make-before-break retirement of replaced instances.

Called by ``reconcile.Reconciler`` once per provider per sweep (providers side by side). Every
Proxy is handled on its own: an exception while handling one is contained to it (logged with its
traceback, a condition and an Event) and the others go on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import Any

from egress_proxies import metrics
from egress_proxies.providers.client import (
    DRAINING,
    AccessRequest,
    CreateRequest,
    Instance,
    Listing,
    ProbeSettings,
    ProviderClient,
    Result,
    Target,
)
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.resources import reasons, times
from egress_proxies.resources.conditions import PROVIDER_LISTED, READY, REPLACING, SERVING, Wanted, find_condition
from egress_proxies.resources.pool import (
    QUARANTINE_ANNOTATION,
    QUARANTINE_REPLACEMENTS,
    controller_of,
    pool_of,
    quarantine_replacements,
    quarantined,
)
from egress_proxies.resources.proxy import (
    PHASE_READY,
    REPLACEMENTS_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    Proxy,
    instance_name,
    replacement_count,
    spec_hash,
)
from egress_proxies.serving.credentials import AccessPolicy
from egress_proxies.serving.discovery import DiscoveryView
from egress_proxies.serving.monitor import ServingMonitor, Watched, instance_identity, probe_target, target_key
from egress_proxies.serving.probe import ProbeOutcome, ProbeReason, unknown_outcome
from egress_proxies.serving.proof import read_key
from egress_proxies.sweep import flapping
from egress_proxies.sweep.batches import chunked, create_batch_size
from egress_proxies.sweep.verdict import (
    INSTANCE_FIELDS,
    LOST_REASONS,
    Observation,
    Pinned,
    judge,
    with_known_address,
)
from egress_proxies.sweep.writer import ProxyWriter

log = logging.getLogger(__name__)

# Replacements that say nothing about the spec: counted in QUARANTINE_REPLACEMENTS, never
# toward ReplacementsExhausted.
NOT_THE_SPECS_FAULT = (reasons.QUARANTINED, reasons.HOST_DRAINING)

# Part of every build hash: instances carry the probe's per-instance identity user
# (monitor.instance_identity), so one built without it is replaced, make before break.
IDENTITY_MARK = "probe-identity"


@dataclass(frozen=True)
class _Unhealthy:
    proxy: Proxy
    instance: Instance
    hash: str
    replacements: int
    reason: str
    message: str
    # The Proxy's other instances: deleted before a successor is created, so a Proxy never has
    # more than the one being replaced and its successor.
    others: tuple[Instance, ...] = ()


@dataclass
class _Create:
    proxy: Proxy
    request: CreateRequest
    hash: str


@dataclass(frozen=True)
class LiveSettings:
    # Operations per module run. 50 keeps one cut or timed-out run's loss, and one run's length on
    # real hosts, small; a fill from empty spawns fewer processes with more (250 meets the
    # 100x-fewer-spawns figure in docs/performance.md), a setting for fleets that fill in bulk.
    batch_size: int = 50
    # Create batches of one provider run side by side; the runner's memory cap still bounds them.
    parallel_batches: int = 4
    # A sweep with more creates than parallel_batches batches of batch_size hold (a fill from empty)
    # makes its create batches larger, up to this many (never smaller than batch_size): every runner
    # call costs ~1.3 s of CPU before its first create (ansible-playbook's start) and a listing of
    # every host (placement, existence), which a fill of 10,000 paid 200 times at 50 and 40 times
    # at 250; at 1,000 it pays them 10 times (docs/performance.md, "Fill 10,000 from empty"). A
    # fill's run already touched every host at 250 (placement spreads it), so a larger one waits
    # for no more base image uploads; it adds only creates, ~11 libvirt calls each, 8 at a time.
    fill_batch_size: int = 1000
    # A Ready Proxy whose provider cannot be listed stays Ready (and in discovery) this long,
    # with a condition saying so; after it, it is no longer vouched for.
    stale_listing_seconds: float = 600.0
    # At most this share of a provider's Proxies get a replacement in one sweep (at least one).
    replacement_budget: float = 0.1
    # After this many replacements of one spec's instance, the Proxy goes Failed.
    max_replacements: int = 5


@dataclass(frozen=True)
class LiveParts:
    """What every live path works with, sweep after sweep: the writer; ``seconds_since`` a stamp
    (the clock); the monitor (None: nothing is probed, and running with an address is Ready,
    reported unverified: the decision tests, the libvirt test driver); and the discovery view the
    probe's verdicts update at once (a view of their own when nobody reads it)."""

    writer: ProxyWriter
    seconds_since: Callable[[str], float]
    monitor: ServingMonitor | None = None
    discovery: DiscoveryView = dataclasses.field(default_factory=DiscoveryView)


@dataclass(frozen=True)
class SweepPass:
    """What one sweep hands every provider's live path: the owner its instances are tagged with,
    how a Proxy's step is contained and a counter counted (the sweep's report), the endpoints to
    probe (filled in as Proxies are observed), and who may use each instance (None: instances are
    built without an ``access`` option, open as their user-data makes them)."""

    owner: str
    contain: Callable[[Proxy, Callable[[], object]], None]
    count: Callable[[str, int], None]
    targets: dict[str, Watched] = dataclasses.field(default_factory=dict)
    access: AccessPolicy | None = None


class LivePath:
    def __init__(self, settings: LiveSettings, parts: LiveParts, sweep: SweepPass, plan: ProbeSettings,
                 location_states: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        # The provider's locations taken out of placement (a KVM host's state: cordoned, draining):
        # a Proxy pinned to one is told so (HostActive); the instances on a draining one move.
        self.location_states = dict(location_states or {})
        self.draining = frozenset(loc for loc, state in self.location_states.items() if state == DRAINING)
        self.writer = parts.writer
        self.seconds_since = parts.seconds_since
        self.monitor = parts.monitor
        self.discovery = parts.discovery
        self.owner = sweep.owner
        self.contain = sweep.contain
        self.count = sweep.count
        self.targets = sweep.targets
        self.access = sweep.access
        # Without a monitor nothing is probed: the provider's plan is not used.
        self.plan = plan if parts.monitor is not None else dataclasses.replace(plan, enabled=False)
        self._probe_key: bytes | str | None = None  # the probe target's key, or why it cannot be read

    def _build(self, proxy: Proxy) -> tuple[str, AccessRequest | None]:
        """The hash an instance of this Proxy is built from (its spec, and who may use it: a
        rotated credential or other sources replace the instance) and the access it gets."""
        request = self.access.request(proxy) if self.access is not None else None
        base = spec_hash(proxy.spec)
        if request is None:
            return base, None
        mark = "" if request.open else f"/{IDENTITY_MARK}"
        return hashlib.sha256(f"{base}/{request.fingerprint}{mark}".encode()).hexdigest()[:16], request

    @staticmethod
    def _with_identity(request: AccessRequest | None, name: str) -> AccessRequest | None:
        """The access an instance named ``name`` is built with: its namespace's user, and the
        probe's identity user for this instance alone (the same password hash)."""
        if request is None or request.open or not request.users:
            return request
        return dataclasses.replace(request, users=(*request.users, (instance_identity(name), request.users[0][1])))

    def _create(self, proxy: Proxy, name: str, desired: str, request: AccessRequest | None) -> _Create:
        return _Create(proxy, CreateRequest.for_proxy(proxy, self.owner, name, desired,
                                                      self._with_identity(request, name)), desired)

    def reconcile(self, client: ProviderClient, proxies: Sequence[Proxy], listing: Listing) -> None:
        creates: list[_Create] = []
        # clear: deleted before the creates (room for a successor: at most two instances per
        # Proxy at any moment); retire: deleted after them (replaced by a Ready successor).
        clear: list[tuple[Proxy, Instance]] = []
        retire: list[tuple[Proxy, Instance]] = []
        unhealthy: list[_Unhealthy] = []
        for proxy in proxies:
            self.contain(proxy, partial(self._decide, proxy, listing, creates, clear, retire, unhealthy))
        for item in self._within_budget(client.name, proxies, unhealthy):
            self.contain(item.proxy, partial(self._replace, client.name, item, creates, clear))
        crowded = self._retire(client, clear, "a further successor is created (at most two instances per Proxy)")
        # A Proxy whose other instance could not be deleted gets its successor next sweep.
        creates = [c for c in creates if c.proxy.uid not in crowded]

        outcome = threading.Lock()

        def create_batch(chunk: list[_Create]) -> None:
            results = client.create([c.request for c in chunk])
            self.count("runner_calls", 1)
            with outcome:  # the provider's backoff: one batch's outcome at a time
                provider_delay = self._batch_outcome(client.name, results)
            for create, result in zip(chunk, results, strict=True):
                transient = result.error is not None and result.error.error_class is ErrorClass.TRANSIENT
                delay = provider_delay if transient else None
                self.contain(create.proxy, partial(self._created, create, result, listing, retire, delay))

        # Batches run side by side (the runner's memory cap bounds how many at once); each
        # batch's results are recorded as soon as it returns, so a providerID is never lost
        # to a slower batch, and in the batch's own thread: one thread writing every batch's
        # Events and statuses one after another (two API writes per create) was a fill's
        # critical path, still writing minutes after the last create had returned.
        size = create_batch_size(len(creates), self.settings.batch_size, self.settings.parallel_batches,
                                 self.settings.fill_batch_size)
        chunks = chunked(creates, size)
        with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), self.settings.parallel_batches))) as pool:
            for future in as_completed([pool.submit(create_batch, chunk) for chunk in chunks]):
                future.result()
        self._retire(client, retire, "a successor replaces it")

    def _batch_outcome(self, provider: str, results: Sequence[Result]) -> float | None:
        """The provider's share of a create batch. Any item created clears its backoff. Two or
        more items failing transient in one batch is the provider's failure (the host or API
        unreachable, a connection dropped mid-run, the run killed; each item's message names the
        item, so they are counted rather than compared): backed off once for the
        batch, and the delay is returned so those items' own backoffs stay as they were. One
        item failing alone is that Proxy's (None)."""
        errors = [r.error for r in results if r.error is not None]
        if len(errors) < len(results):
            self.writer.provider_backoff.succeeded(provider)
        if sum(1 for e in errors if e.error_class is ErrorClass.TRANSIENT) < 2:
            return None
        return self.writer.provider_backoff.failed(provider, ErrorClass.TRANSIENT.value)

    def _due(self, proxy: Proxy) -> bool:
        return self.writer.backoff.due(proxy.uid) and self.writer.provider_backoff.due(proxy.provider)

    def _decide(self, proxy: Proxy, listing: Listing, creates: list[_Create], clear: list[tuple[Proxy, Instance]],
                retire: list[tuple[Proxy, Instance]], unhealthy: list[_Unhealthy]) -> None:
        desired, request = self._build(proxy)
        replacements = replacement_count(proxy.annotations, desired)
        name = instance_name(proxy, desired, replacements)
        mine = listing.of(proxy.uid)
        current = next((i for i in mine if i.name == name), None)
        if current is None:
            if listing.error is not None:
                # A location did not answer: the wanted instance may be there. Not listed is not
                # gone: neither made again nor its predecessor cleared (a serving one, mid make
                # before break) until a complete listing says so.
                if not mine:
                    self._unlisted(proxy, listing)
                return
            if self._due(proxy):
                creates.append(self._create(proxy, name, desired, request))
                # Besides the successor, only the instance the status names stays (make before break).
                clear.extend((proxy, old) for old in mine if old.provider_id != proxy.status.get("providerID"))
            return
        self.writer.backoff.succeeded(proxy.uid)  # its provider answers again: no stale backoff
        if (current.state == "stopped" and proxy.status.get("readyProviderID") != current.provider_id
                and self._due(proxy)):
            # Defined but never Ready: a create cut off between defining and starting it. The
            # create (idempotent by name) finishes the job by starting it; one that was Ready
            # and then stopped is a lost instance, replaced below.
            creates.append(self._create(proxy, name, desired, request))
            return
        others = tuple(i for i in mine if i is not current)
        predecessor = self._serving_predecessor(proxy, current, others, desired)
        if predecessor is not None:
            # Make before break for crawlers too: the status (and discovery) stays on the
            # instance that serves until its successor does; both are probed.
            self.observe(proxy, predecessor, predecessor.spec_hash or desired)
            return
        proxy = self.observe(proxy, current, desired)
        replaced_now = self._replaced_now(proxy, current)
        if replaced_now is not None:
            unhealthy.append(_Unhealthy(proxy, current, desired, replacements, *replaced_now, others))
            return
        if self._ready(proxy):
            retire.extend((proxy, old) for old in mine if old is not current)
            return
        serving = find_condition(proxy.status, SERVING)
        if serving.get("status") != "False" or serving.get("reason") in (reasons.AWAITING_PROBE, reasons.UNVERIFIED):
            return
        # Unhealthy without a single success for the threshold; each replacement waits twice as
        # long as the one before (a Proxy whose replacements keep failing backs off).
        threshold = self.plan.unhealthy_after_seconds * 2 ** min(replacements, 4)
        served = (proxy.status.get("probe") or {}).get("servedProviderID") == current.provider_id
        if serving.get("reason") not in LOST_REASONS and not served:
            # Never served yet: it is booting or installing squid, not dead. It gets the start-up
            # allowance before "not serving" counts (still bounded: a cloud-init that never brings
            # squid up ends in ReplacementsExhausted, not in waiting forever).
            threshold = max(threshold, self.plan.startup_seconds)
        since = self._failing_since(proxy, current, serving)
        if since is not None and self.seconds_since(since) >= threshold:
            unhealthy.append(_Unhealthy(proxy, current, desired, replacements, str(serving.get("reason")),
                                        str(serving.get("message") or ""), others))

    def _serving_predecessor(self, proxy: Proxy, successor: Instance, others: Sequence[Instance],
                             desired: str) -> Instance | None:
        """The instance the status still names while it keeps the Proxy Ready and ``successor``
        (the wanted instance: a spec change's, a drain's, a flapper's) has not served yet; None
        when the status moves to the successor. A crawler then keeps a proxy that serves through
        a replacement instead of losing it for the successor's boot. Bounded by the successor's
        start-up allowance (``probe.startupSeconds`` from its creation): a successor that never
        serves is judged on its own after that, as before. Probes the successor (its verdict
        is written once it serves, ``_describes``)."""
        named = proxy.status.get("providerID")
        if not self._ready(proxy) or not named or named == successor.provider_id:
            return None
        predecessor = next((i for i in others if i.provider_id == named and i.running), None)
        if predecessor is None or not successor.created:
            return None
        if self.seconds_since(successor.created) >= self.plan.startup_seconds:
            return None
        return None if self._would_serve(proxy, successor, desired) else predecessor

    def _would_serve(self, proxy: Proxy, instance: Instance, desired: str, watch: bool = True) -> bool:
        """Whether the Proxy would be Ready on ``instance`` (its latest probe outcome), without
        writing anything; ``watch``: and have it probed from now on."""
        seen = self._seen(proxy, instance, desired, watch)
        return judge(proxy.status, seen(), self.writer.now()).phase == PHASE_READY

    def _describes(self, proxy: Proxy, instance: Instance, desired: str) -> bool:
        """Whether a probe verdict on ``instance`` may be written into the Proxy's status: always
        for the instance the status names; for the wanted successor once it serves or once the
        named one is not Ready (``_serving_predecessor``); never for another (one being retired,
        whose late verdict would name it again)."""
        if instance.provider_id == proxy.status.get("providerID"):
            return True
        wanted, _ = self._build(proxy)  # the spec's now (a predecessor was built from another)
        if instance.name != instance_name(proxy, wanted, replacement_count(proxy.annotations, wanted)):
            return False
        return not self._ready(proxy) or self._would_serve(proxy, instance, desired, watch=False)

    def _replaced_now(self, proxy: Proxy, current: Instance) -> tuple[str, str] | None:
        """Why the instance is replaced whatever its failure clock says (reason, message), or None."""
        if quarantined(proxy) and controller_of(proxy) is None:
            # A crawler reported this instance unusable (banned): replaced like a dead one, at once.
            # A pool member is replaced by its pool instead (a new member), not here; a Proxy that
            # only carries a pool's label is no member (``pool.owned_by``): replaced here.
            return reasons.QUARANTINED, f"a crawler quarantined instance {current.provider_id}"
        chronic = self._chronic(proxy, current)
        if chronic is not None:
            # Serving now and then is not serving: crawlers would see it fail for ever.
            return reasons.FLAPPING, chronic
        if self._moving(proxy, current):
            return reasons.HOST_DRAINING, f"host {current.location} is draining"
        return None

    def _moving(self, proxy: Proxy, current: Instance) -> bool:
        """Whether the instance is on a draining location and can move: a Proxy pinned there by
        its spec.location cannot (it stays, its HostActive condition says so and what to do, and
        the host is not reported drained)."""
        return current.location in self.draining and proxy.spec.get("location") != current.location

    def _pinned(self, proxy: Proxy) -> Pinned | None:
        """Whether spec.location pins the Proxy to a location out of placement (set by its pool's
        placement for a pool member: the fix is the pool's)."""
        location = proxy.spec.get("location")
        state = self.location_states.get(location) if isinstance(location, str) else None
        if state is None:
            return None
        return Pinned(str(location), state, pool_of(proxy) if controller_of(proxy) is not None else None)

    def _chronic(self, proxy: Proxy, current: Instance) -> str | None:
        """Why the instance is a chronic flapper by its probes' recent verdicts (None: it is not)."""
        if self.monitor is None or not self.plan.enabled:
            return None
        record = self.monitor.record(target_key(with_known_address(proxy.status, current)))
        if record is None:
            return None
        return flapping.chronic(record.recent, self.plan.flap_window, self.plan.flap_percent)

    def _failing_since(self, proxy: Proxy, current: Instance, serving: dict[str, Any]) -> str | None:
        """Since when the instance has failed without a single success (a stamp; None: it has not):
        the probe's own record (a flapping proxy's every success resets it), or, when this process
        has not seen it serve, the Serving condition's transition (written per probe verdict, and
        kept across restarts). A lost instance is not probed: the condition's transition it is."""
        record = None
        if self.monitor is not None and serving.get("reason") not in LOST_REASONS:
            record = self.monitor.record(target_key(with_known_address(proxy.status, current)))
        if record is not None and record.last_success is not None:
            return times.stamp(record.failing_since) if record.failing_since is not None else None
        return str(serving.get("lastTransitionTime") or "")

    def _generation(self, proxy: Proxy) -> str:
        _, request = self._build(proxy)
        return request.generation if request is not None else ""

    def _private(self, proxy: Proxy) -> tuple[str, str, str] | None:
        """The Private condition as built (the probe may still find it open: NotPrivate)."""
        if self.access is None:
            return None
        request = self.access.request(proxy)
        sources = ", ".join(request.allowed_sources) or "none"
        if request.open:
            message = f"spec.auth is none: anyone from {sources} who reaches it can use this proxy"
            return ("False", reasons.AUTH_DISABLED, message)
        required = f"requests need the {proxy.namespace} credentials, from {sources}"
        return ("True", reasons.CREDENTIALS_REQUIRED, required)

    @staticmethod
    def _ready(proxy: Proxy) -> bool:
        return proxy.status.get("phase") == PHASE_READY

    def _within_budget(self, provider: str, proxies: Sequence[Proxy],
                       unhealthy: list[_Unhealthy]) -> list[_Unhealthy]:
        """Never churn: a replacement budget per provider and sweep, and no replacements for not
        serving while every probe of the provider fails at once (for at most unhealthyAfterSeconds:
        a provider-wide failure, which new instances would not fix). While the probe target does
        not answer, nothing is known of any proxy (Serving Unknown), so nothing is unhealthy."""
        since = self.monitor.provider_failing_since(provider) if self.monitor is not None else None
        paused = since is not None and self.seconds_since(times.stamp(since)) < self.plan.unhealthy_after_seconds
        chosen = []
        for item in unhealthy:
            if paused and item.reason not in (*LOST_REASONS, reasons.QUARANTINED):
                log.warning("%s: not serving, but every probe of provider %s fails at once: replacements paused",
                            item.proxy.key, provider)
                continue
            chosen.append(item)
        budget = max(1, math.floor(len(proxies) * self.settings.replacement_budget))
        if len(chosen) > budget:
            log.info("provider %s: %d instances to replace, %d this sweep (budget)", provider, len(chosen), budget)
        return chosen[:budget]

    def _replace(self, provider: str, item: _Unhealthy, creates: list[_Create],
                 clear: list[tuple[Proxy, Instance]]) -> None:
        quarantines = quarantine_replacements(item.proxy.annotations, item.hash)
        if item.replacements - quarantines >= self.settings.max_replacements and item.reason not in NOT_THE_SPECS_FAULT:
            message = (f"instance {item.instance.provider_id} is {item.reason} ({item.message}) after "
                       f"{item.replacements} replacements; fix the cause (image, cloudInit, probe target), then "
                       "change the spec or delete the annotation crawl.example.com/replacements to try again")
            self.writer.invalid(item.proxy, reasons.REPLACEMENTS_EXHAUSTED, message)
            return
        count = item.replacements + 1
        # Recorded before the create: a crash in between finds the same name again.
        def record(p: Proxy) -> None:
            p.annotations[REPLACEMENTS_ANNOTATION] = f"{item.hash}:{count}"
            if item.reason in NOT_THE_SPECS_FAULT:  # not counted toward ReplacementsExhausted
                p.annotations[QUARANTINE_REPLACEMENTS] = f"{item.hash}:{quarantines + 1}"
        proxy = self.writer.update_metadata(item.proxy, record)
        reason = item.reason if item.reason in (*NOT_THE_SPECS_FAULT, reasons.FLAPPING) else (
            reasons.INSTANCE_LOST if item.reason in LOST_REASONS else reasons.NOT_SERVING)
        metrics.REPLACEMENTS.labels(provider=provider, reason=reason).inc()
        why = item.message if item.message.startswith(item.reason) else f"{item.reason}: {item.message}"
        kind = "Normal" if reason == reasons.HOST_DRAINING else "Warning"  # maintenance, not a fault
        self.writer.store.record_event(proxy, kind, reason,
                                       f"replacing instance {item.instance.provider_id}: {why}")
        name = instance_name(proxy, item.hash, count)
        replacing = ("True", reason, (f"instance {item.instance.provider_id} is being replaced by {name} "
                                      f"({why}); it is deleted once {name} serves"))
        proxy = self._say_replacing(proxy, replacing)
        _, request = self._build(proxy)
        creates.append(self._create(proxy, name, item.hash, request))
        # At most two instances: the one being replaced and its successor (the others go first).
        clear.extend((proxy, old) for old in item.others)

    def _say_replacing(self, proxy: Proxy, replacing: Wanted) -> Proxy:
        """The Replacing condition on the Proxy, the rest of its status as it is."""
        def status_of(current: Proxy) -> dict[str, Any]:
            ready = find_condition(current.status, READY)
            return self.writer.status(current, str(current.status.get("phase") or ""), str(ready.get("status")),
                                      str(ready.get("reason")), str(ready.get("message") or ""),
                                      conditions={REPLACING: replacing})
        return self.writer.write_status(proxy, status_of)

    def _unlisted(self, proxy: Proxy, listing: Listing) -> None:
        """The provider could not be listed where this Proxy's instance may live."""
        assert listing.error is not None
        since = self.seconds_since(find_condition(proxy.status, PROVIDER_LISTED).get("lastTransitionTime") or "")
        if proxy.status.get("phase") == PHASE_READY and since < self.settings.stale_listing_seconds:
            # Nothing says the instance stopped: a listing failure (libvirtd restarting, an API
            # blip) must not take a serving proxy out of discovery. Say so, for a bounded time.
            message = (f"the provider could not be listed ({listing.error}); last known state kept for at most "
                       f"{self.settings.stale_listing_seconds:.0f} s")
            ready = find_condition(proxy.status, READY)
            self.writer.write_status(proxy, self.writer.status(
                proxy, PHASE_READY, "True", str(ready.get("reason") or reasons.INSTANCE_RUNNING),
                str(ready.get("message") or ""), conditions={PROVIDER_LISTED: ("False", reasons.LIST_FAILED, message)}))
            return
        # The provider's failure, not this Proxy's: it is listed again every sweep. Growing each
        # Proxy's backoff per failed listing would leave Proxies waiting minutes after their host
        # answers again.
        self.writer.failed(proxy, listing.error, reasons.LIST_FAILED, delay=0.0)

    def _created(self, create: _Create, result: Result, listing: Listing,
                 retire: list[tuple[Proxy, Instance]], provider_delay: float | None = None) -> None:
        if result.error is not None:
            self.writer.failed(create.proxy, result.error, reasons.CREATE_FAILED, delay=provider_delay)
            return
        self.count("created", 1)
        instance = result.instance or Instance(provider_id="")
        previous = create.proxy.status.get("providerID")
        if previous and previous != instance.provider_id and not any(
                i.provider_id == previous for i in listing.of(create.proxy.uid)):
            # The instance the status named is gone: that is a loss to report, not a routine change.
            self.writer.store.record_event(create.proxy, "Warning", reasons.INSTANCE_LOST,
                                           f"instance {previous} is gone; replaced by {instance.provider_id}")
        else:
            self.writer.store.record_event(create.proxy, "Normal", reasons.REPLACING if previous else reasons.CREATED,
                                           f"instance {instance.provider_id} created")
        self.writer.backoff.succeeded(create.proxy.uid)
        if self._serving_predecessor(create.proxy, instance, listing.of(create.proxy.uid), create.hash):
            return  # the status stays on the instance that serves until this one does (probed from now)
        proxy = self.observe(create.proxy, instance, create.hash)
        if self._ready(proxy):
            retire.extend((proxy, old) for old in listing.of(proxy.uid) if old.provider_id != instance.provider_id)

    def observe(self, proxy: Proxy, instance: Instance, desired: str) -> Proxy:
        """Status from what the provider reports about the instance built from ``desired`` and,
        when it runs, from the latest probe through it (``verdict.judge`` decides, this writes)."""
        return self._apply(proxy, self._seen(proxy, instance, desired), desired)

    def _seen(self, proxy: Proxy, instance: Instance, desired: str, watch: bool = True) -> Callable[[], Observation]:
        """What is known of ``instance`` now, read again at each call (the probe's verdict thread
        writes too); ``watch``: a running one is probed from now on."""
        instance = with_known_address(proxy.status, instance)
        generation = self._built_generation(proxy, instance)
        running = self.plan.enabled and instance.running
        outcome = self._probed(proxy, instance, desired, generation, watch) if running else _nothing
        private = self._private(proxy)
        quarantined = proxy.annotations.get(QUARANTINE_ANNOTATION) == instance.provider_id
        pinned = self._pinned(proxy)

        def seen() -> Observation:
            since = self.monitor.provider_failing_since(proxy.provider) if self.monitor is not None else None
            return Observation(instance, proxy.port, probed=self.plan.enabled, outcome=outcome(),
                               built_private=private, credential_generation=generation,
                               provider_failing_since=times.stamp(since) if since is not None else None,
                               hold_seconds=self.plan.unhealthy_after_seconds, quarantined=quarantined,
                               pinned=pinned)
        return seen

    def _built_generation(self, proxy: Proxy, instance: Instance) -> str | None:
        """The credential generation ``instance`` was built with (None: built open, or no access
        policy): the status's record for the instance it names (a predecessor kept serving through
        a rotation's replacement has the previous credential, which is what the probe and
        discovery must use for it), the namespace's current one for any other."""
        if self.access is None or proxy.spec.get("auth") == "none":
            return None
        recorded = proxy.status.get("credentialGeneration")
        if recorded and instance.provider_id == proxy.status.get("providerID"):
            return str(recorded)
        return self._generation(proxy)

    def _probed(self, proxy: Proxy, instance: Instance, desired: str, generation: str | None,
                watch: bool = True) -> Callable[[], ProbeOutcome | None]:
        """Where this instance's outcome comes from: the monitor, once its target is watched (with
        what writes its verdict when the outcome changes; ``watch``: have it watched); or, when it
        cannot be probed at all (no probe target named, its key unreadable), an outcome that says so."""
        if self.plan.http_url is None:
            why = (f"the provider config names no probe target for provider {proxy.provider}: run egress-proxies "
                   "probe-target and set probe.httpUrl and probe.keyFile (docs/operations.md), or say probe: none")
            return _unknown(ProbeReason.PROBE_NOT_CONFIGURED, why)
        key = self._key()
        if isinstance(key, str):
            return _unknown(ProbeReason.PROBE_TARGET_UNREACHABLE, key)
        credentials = (self.access.probe_credentials(proxy, generation)
                       if self.access is not None else None)
        target = probe_target(self.plan, proxy, instance, key, credentials)

        def write_verdict() -> None:
            latest = self.writer.latest.get(proxy.uid, proxy)
            if not latest.deleting and self._describes(latest, instance, desired):
                self.discovery.follow(self.observe(latest, instance, desired))

        if watch:
            served = (proxy.status.get("probe") or {}).get("servedProviderID") == instance.provider_id
            self.targets[target.key] = Watched(proxy.provider, target, write_verdict, served)
        monitor = self.monitor
        return (lambda: monitor.outcome(target.key)) if monitor is not None else (lambda: None)

    def _key(self) -> bytes | str:
        """The probe target's key (read once per sweep), or why it cannot be read."""
        if self._probe_key is None:
            try:
                self._probe_key = read_key(str(self.plan.key_file))
            except (OSError, ValueError) as error:
                why = error.strerror if isinstance(error, OSError) else str(error)
                self._probe_key = (f"the probe key file {self.plan.key_file} cannot be used ({why}): nothing the "
                                   "probes find can be verified; fix probe.keyFile")
                log.warning("%s", self._probe_key)
        return self._probe_key

    def _apply(self, proxy: Proxy, seen: Callable[[], Observation], desired: str) -> Proxy:
        now = self.writer.now()
        verdict = judge(proxy.status, seen(), now)
        for event_type, reason, message in verdict.events:
            self.writer.store.record_event(proxy, event_type, reason, message)
        if verdict.phase == PHASE_READY and proxy.annotations.get(SPEC_HASH_ANNOTATION) != desired:
            proxy = self.writer.update_metadata(
                proxy, lambda p: p.annotations.__setitem__(SPEC_HASH_ANNOTATION, desired))

        def status_of(current: Proxy) -> dict[str, Any]:
            # Decided again from what is stored now (the probe's verdict thread writes too), with
            # the latest outcome.
            observation = seen()
            fresh = judge(current.status, observation, now)
            if fresh.new_instance:
                # Another instance now: nothing recorded of its predecessor (address, probe) stays.
                current.status = {k: v for k, v in current.status.items() if k not in INSTANCE_FIELDS}
            conditions = fresh.conditions
            replacing = str(find_condition(current.status, REPLACING).get("message") or "")
            if (replacing and fresh.phase == PHASE_READY
                    and not replacing.startswith(f"instance {observation.instance.provider_id} ")):
                conditions = {**conditions, REPLACING: None}  # the successor serves: the replacement is done
            return self.writer.status(current, fresh.phase, *fresh.ready, conditions=conditions, **fresh.fields)
        return self.writer.write_status(proxy, status_of)

    def _retire(self, client: ProviderClient, retire: Sequence[tuple[Proxy, Instance]], because: str) -> set[str]:
        """Delete instances that a successor replaces (each once), ``because`` says why; the uids of
        the Proxies one of whose instances could not be deleted."""
        unique = list({old.provider_id: (proxy, old) for proxy, old in retire}.values())
        failed: set[str] = set()
        for chunk in chunked(unique, self.settings.batch_size):
            results = client.delete([Target(proxy.uid, old.provider_id) for proxy, old in chunk])
            self.count("runner_calls", 1)
            for (proxy, old), result in zip(chunk, results, strict=True):
                if result.error is None:
                    self.count("deleted", 1)
                    self.writer.store.record_event(
                        proxy, "Normal", reasons.REPLACED, f"old instance {old.provider_id} deleted: {because}")
                else:
                    failed.add(proxy.uid)
                    metrics.ERRORS.labels(provider=client.name, error_class=result.error.error_class.value).inc()
                    log.warning("%s: deleting replaced instance %s failed (%s)", proxy.key, old.provider_id,
                                result.error)
        return failed


def _nothing() -> None:
    """The outcome of an instance that is not probed (not running, or probe: none)."""


def _unknown(reason: ProbeReason, why: str) -> Callable[[], ProbeOutcome | None]:
    """The outcome of an instance no probe can say anything about, and why."""
    outcome = unknown_outcome(reason, f"{reason}: {why}", times.now())
    return lambda: outcome
