"""The live path of one provider in one sweep: which Proxies need an instance, batched creates,
status from what the provider reports, and make-before-break retirement of replaced instances.

Called by ``reconcile.Reconciler`` once per provider per sweep (providers side by side). Every
Proxy is handled on its own: an exception while handling one is contained to it (logged with its
traceback, a condition and an Event) and the others go on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial

from egress_proxies import metrics
from egress_proxies.providers.client import (
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
from egress_proxies.resources.conditions import PROVIDER_LISTED, READY, SERVING, find_condition
from egress_proxies.resources.pool import (
    QUARANTINE_ANNOTATION,
    QUARANTINE_REPLACEMENTS,
    QUARANTINED,
    controller_of,
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
from egress_proxies.serving.monitor import ServingMonitor, probe_target
from egress_proxies.serving.probe import ProbeTarget
from egress_proxies.sweep.batches import chunked
from egress_proxies.sweep.verdict import (
    AWAITING,
    INSTANCE_FIELDS,
    LOST_REASONS,
    UNVERIFIED,
    Observation,
    Verdict,
    judge,
    with_known_address,
)
from egress_proxies.sweep.writer import ProxyWriter

log = logging.getLogger(__name__)

# Fewer probed instances than this never count as a provider-wide outage.
OUTAGE_MINIMUM = 3


@dataclass(frozen=True)
class _Unhealthy:
    proxy: Proxy
    instance: Instance
    hash: str
    replacements: int
    reason: str
    message: str


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
    # A Ready Proxy whose provider cannot be listed stays Ready (and in discovery) this long,
    # with a condition saying so; after it, it is no longer vouched for.
    stale_listing_seconds: float = 600.0
    # At most this share of a provider's Proxies get a replacement in one sweep (at least one).
    replacement_budget: float = 0.1
    # After this many replacements of one spec's instance, the Proxy goes Failed.
    max_replacements: int = 5


class LivePath:
    def __init__(self, writer: ProxyWriter, settings: LiveSettings, owner: str,
                 contain: Callable[[Proxy, Callable[[], object]], None], count: Callable[[str, int], None],
                 seconds_since: Callable[[str], float], plan: ProbeSettings,
                 monitor: ServingMonitor | None = None,
                 targets: dict[str, tuple[str, ProbeTarget]] | None = None,
                 access: AccessPolicy | None = None) -> None:
        self.writer = writer
        self.settings = settings
        self.owner = owner
        self.contain = contain
        self.count = count
        self.seconds_since = seconds_since
        # Without a monitor nothing is probed (tests of the decisions, the libvirt test driver):
        # running with an address is Ready, reported unverified.
        self.plan = plan if monitor is not None else dataclasses.replace(plan, enabled=False)
        self.monitor = monitor
        self.targets = targets if targets is not None else {}
        # None: instances are built without an ``access`` option (open as their user-data makes them).
        self.access = access

    def _build(self, proxy: Proxy) -> tuple[str, AccessRequest | None]:
        """The hash an instance of this Proxy is built from (its spec, and who may use it: a
        rotated credential or other sources replace the instance) and the access it gets."""
        request = self.access.request(proxy) if self.access is not None else None
        base = spec_hash(proxy.spec)
        if request is None:
            return base, None
        return hashlib.sha256(f"{base}/{request.fingerprint}".encode()).hexdigest()[:16], request

    def reconcile(self, client: ProviderClient, proxies: Sequence[Proxy], listing: Listing) -> None:
        creates: list[_Create] = []
        retire: list[tuple[Proxy, Instance]] = []
        unhealthy: list[_Unhealthy] = []
        for proxy in proxies:
            self.contain(proxy, partial(self._decide, proxy, listing, creates, retire, unhealthy))
        for item in self._within_budget(client.name, proxies, unhealthy):
            self.contain(item.proxy, partial(self._replace, client.name, item, creates))

        def create_batch(chunk: list[_Create]) -> tuple[list[_Create], list[Result]]:
            return chunk, client.create([c.request for c in chunk])

        # Batches run side by side (the runner's memory cap bounds how many at once); each
        # batch's results are recorded as soon as it returns, so a providerID is never lost
        # to a slower batch.
        chunks = chunked(creates, self.settings.batch_size)
        with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), self.settings.parallel_batches))) as pool:
            done = [pool.submit(create_batch, chunk) for chunk in chunks]
            for future in as_completed(done):
                chunk, results = future.result()
                self.count("runner_calls", 1)
                provider_delay = self._batch_outcome(client.name, results)
                for create, result in zip(chunk, results, strict=True):
                    transient = result.error is not None and result.error.error_class is ErrorClass.TRANSIENT
                    delay = provider_delay if transient else None
                    self.contain(create.proxy, partial(self._created, create, result, listing, retire, delay))
        self._retire(client, retire)

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

    def _decide(self, proxy: Proxy, listing: Listing, creates: list[_Create],
                retire: list[tuple[Proxy, Instance]], unhealthy: list[_Unhealthy]) -> None:
        desired, request = self._build(proxy)
        replacements = replacement_count(proxy.annotations, desired)
        name = instance_name(proxy, desired, replacements)
        mine = listing.of(proxy.uid)
        current = next((i for i in mine if i.name == name), None)
        if current is None:
            if listing.error is not None and not mine:
                self._unlisted(proxy, listing)
                return
            if self._due(proxy):
                creates.append(_Create(proxy, CreateRequest.for_proxy(proxy, self.owner, name, desired, request),
                                       desired))
            return
        self.writer.backoff.succeeded(proxy.uid)  # its provider answers again: no stale backoff
        if (current.state == "stopped" and proxy.status.get("readyProviderID") != current.provider_id
                and self._due(proxy)):
            # Defined but never Ready: a create cut off between defining and starting it. The
            # create (idempotent by name) finishes the job by starting it; one that was Ready
            # and then stopped is a lost instance, replaced below.
            creates.append(_Create(proxy, CreateRequest.for_proxy(proxy, self.owner, name, desired, request),
                                   desired))
            return
        proxy = self.observe(proxy, current, desired)
        if quarantined(proxy) and controller_of(proxy) is None:
            # A crawler reported this instance unusable (banned): replaced like a dead one, at once.
            # A pool member is replaced by its pool instead (a new member), not here; a Proxy that
            # only carries a pool's label is no member (``pool.owned_by``): replaced here.
            unhealthy.append(_Unhealthy(proxy, current, desired, replacements, QUARANTINED,
                                        f"a crawler quarantined instance {current.provider_id}"))
            return
        if self._ready(proxy):
            retire.extend((proxy, old) for old in mine if old is not current)
            return
        serving = find_condition(proxy.status, SERVING)
        if serving.get("status") != "False" or serving.get("reason") in (AWAITING, UNVERIFIED):
            return
        # Unhealthy continuously since the Serving condition turned False; each replacement
        # waits twice as long as the one before (a Proxy whose replacements keep failing backs off).
        threshold = self.plan.unhealthy_after_seconds * 2 ** min(replacements, 4)
        served = (proxy.status.get("probe") or {}).get("servedProviderID") == current.provider_id
        if serving.get("reason") not in LOST_REASONS and not served:
            # Never served yet: it is booting or installing squid, not dead. It gets the start-up
            # allowance before "not serving" counts (still bounded: a cloud-init that never brings
            # squid up ends in ReplacementsExhausted, not in waiting forever).
            threshold = max(threshold, self.plan.startup_seconds)
        if self.seconds_since(str(serving.get("lastTransitionTime") or "")) >= threshold:
            unhealthy.append(_Unhealthy(proxy, current, desired, replacements, str(serving.get("reason")),
                                        str(serving.get("message") or "")))

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
            return ("False", "AuthDisabled", message)
        return ("True", "CredentialsRequired", f"requests need the {proxy.namespace} credentials, from {sources}")

    @staticmethod
    def _ready(proxy: Proxy) -> bool:
        return proxy.status.get("phase") == PHASE_READY

    def _within_budget(self, provider: str, proxies: Sequence[Proxy],
                       unhealthy: list[_Unhealthy]) -> list[_Unhealthy]:
        """Never churn: a replacement budget per provider and sweep, and no replacements for not
        serving while every probed instance of the provider fails (an outage of the provider or
        of the probe target, which new instances would not fix)."""
        probed = [p for p in proxies if find_condition(p.status, SERVING).get("status") in ("True", "False")
                  and find_condition(p.status, SERVING).get("reason") not in (AWAITING, UNVERIFIED)]
        outage = len(probed) >= OUTAGE_MINIMUM and all(
            find_condition(p.status, SERVING).get("status") == "False" for p in probed)
        chosen = []
        for item in unhealthy:
            if outage and item.reason not in (*LOST_REASONS, QUARANTINED):
                log.warning("%s: not serving, but no probe of provider %s succeeds: replacements paused",
                            item.proxy.key, provider)
                continue
            chosen.append(item)
        budget = max(1, math.floor(len(proxies) * self.settings.replacement_budget))
        if len(chosen) > budget:
            log.info("provider %s: %d instances to replace, %d this sweep (budget)", provider, len(chosen), budget)
        return chosen[:budget]

    def _replace(self, provider: str, item: _Unhealthy, creates: list[_Create]) -> None:
        quarantines = quarantine_replacements(item.proxy.annotations, item.hash)
        if item.replacements - quarantines >= self.settings.max_replacements and item.reason != QUARANTINED:
            message = (f"instance {item.instance.provider_id} is {item.reason} ({item.message}) after "
                       f"{item.replacements} replacements; fix the cause (image, cloudInit, probe target), then "
                       "change the spec or delete the annotation crawl.example.com/replacements to try again")
            self.writer.invalid(item.proxy, "ReplacementsExhausted", message)
            return
        count = item.replacements + 1
        # Recorded before the create: a crash in between finds the same name again.
        def record(p: Proxy) -> None:
            p.annotations[REPLACEMENTS_ANNOTATION] = f"{item.hash}:{count}"
            if item.reason == QUARANTINED:  # not counted toward ReplacementsExhausted
                p.annotations[QUARANTINE_REPLACEMENTS] = f"{item.hash}:{quarantines + 1}"
        proxy = self.writer.update_metadata(item.proxy, record)
        reason = item.reason if item.reason == QUARANTINED else (
            "InstanceLost" if item.reason in LOST_REASONS else "NotServing")
        metrics.REPLACEMENTS.labels(provider=provider, reason=reason).inc()
        why = item.message if item.message.startswith(item.reason) else f"{item.reason}: {item.message}"
        self.writer.store.record_event(proxy, "Warning", reason,
                                       f"replacing instance {item.instance.provider_id}: {why}")
        name = instance_name(proxy, item.hash, count)
        _, request = self._build(proxy)
        creates.append(_Create(proxy, CreateRequest.for_proxy(proxy, self.owner, name, item.hash, request), item.hash))

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
                proxy, PHASE_READY, "True", str(ready.get("reason") or "InstanceRunning"),
                str(ready.get("message") or ""), conditions={PROVIDER_LISTED: ("False", "ListFailed", message)}))
            return
        # The provider's failure, not this Proxy's: it is listed again every sweep. Growing each
        # Proxy's backoff per failed listing would leave Proxies waiting minutes after their host
        # answers again.
        self.writer.failed(proxy, listing.error, "ListFailed", delay=0.0)

    def _created(self, create: _Create, result: Result, listing: Listing,
                 retire: list[tuple[Proxy, Instance]], provider_delay: float | None = None) -> None:
        if result.error is not None:
            self.writer.failed(create.proxy, result.error, "CreateFailed", delay=provider_delay)
            return
        self.count("created", 1)
        instance = result.instance or Instance(provider_id="")
        previous = create.proxy.status.get("providerID")
        if previous and previous != instance.provider_id and not any(
                i.provider_id == previous for i in listing.of(create.proxy.uid)):
            # The instance the status named is gone: that is a loss to report, not a routine change.
            self.writer.store.record_event(create.proxy, "Warning", "InstanceLost",
                                           f"instance {previous} is gone; replaced by {instance.provider_id}")
        else:
            self.writer.store.record_event(create.proxy, "Normal", "Replacing" if previous else "Created",
                                           f"instance {instance.provider_id} created")
        self.writer.backoff.succeeded(create.proxy.uid)
        proxy = self.observe(create.proxy, instance, create.hash)
        if self._ready(proxy):
            retire.extend((proxy, old) for old in listing.of(proxy.uid) if old.provider_id != instance.provider_id)

    def observe(self, proxy: Proxy, instance: Instance, desired: str) -> Proxy:
        """Status from what the provider reports about the instance built from ``desired`` and,
        when it runs, from the latest probe through it (``verdict.judge`` decides, this writes)."""
        instance = with_known_address(proxy.status, instance)
        outcome = None
        if self.plan.enabled and instance.running:
            credentials = (self.access.probe_credentials(proxy, self._generation(proxy))
                           if self.access is not None else None)
            target = probe_target(self.plan, proxy, instance, credentials)
            self.targets[target.key] = (proxy.provider, target)
            outcome = self.monitor.outcome(target.key) if self.monitor is not None else None
        generation = (self._generation(proxy) if self.access is not None and proxy.spec.get("auth") != "none"
                      else None)
        seen = Observation(instance, proxy.port, probed=self.plan.enabled, outcome=outcome,
                           built_private=self._private(proxy), credential_generation=generation,
                           quarantined=proxy.annotations.get(QUARANTINE_ANNOTATION) == instance.provider_id)
        return self._apply(proxy, judge(proxy.status, seen, self.writer.now()), desired)

    def _apply(self, proxy: Proxy, verdict: Verdict, desired: str) -> Proxy:
        if verdict.new_instance:
            # Another instance now: nothing recorded of its predecessor (address, probe) stays.
            proxy.status = {k: v for k, v in proxy.status.items() if k not in INSTANCE_FIELDS}
        for event_type, reason, message in verdict.events:
            self.writer.store.record_event(proxy, event_type, reason, message)
        status = self.writer.status(proxy, verdict.phase, *verdict.ready, conditions=verdict.conditions,
                                    **verdict.fields)
        if verdict.phase == PHASE_READY and proxy.annotations.get(SPEC_HASH_ANNOTATION) != desired:
            proxy = self.writer.update_metadata(
                proxy, lambda p: p.annotations.__setitem__(SPEC_HASH_ANNOTATION, desired))
        return self.writer.write_status(proxy, status)

    def _retire(self, client: ProviderClient, retire: Sequence[tuple[Proxy, Instance]]) -> None:
        """Make-before-break: delete instances replaced by a Ready successor."""
        for chunk in chunked(list(retire), self.settings.batch_size):
            results = client.delete([Target(proxy.uid, old.provider_id) for proxy, old in chunk])
            self.count("runner_calls", 1)
            for (proxy, old), result in zip(chunk, results, strict=True):
                if result.error is None:
                    self.count("deleted", 1)
                    self.writer.store.record_event(
                        proxy, "Normal", "Replaced",
                        f"old instance {old.provider_id} deleted after its successor became ready")
                else:
                    metrics.ERRORS.labels(provider=client.name, error_class=result.error.error_class.value).inc()
                    log.warning("%s: deleting replaced instance %s failed (%s)", proxy.key, old.provider_id,
                                result.error)

