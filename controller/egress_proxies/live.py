"""The live path of one provider in one sweep: which Proxies need an instance, batched creates,
status from what the provider reports, and make-before-break retirement of replaced instances.

Called by ``reconcile.Reconciler`` once per provider per sweep (providers side by side). Every
Proxy is handled on its own: an exception while handling one is contained to it (logged with its
traceback, a condition and an Event) and the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from egress_proxies import metrics
from egress_proxies.model import (
    PHASE_PROVISIONING,
    PHASE_READY,
    SPEC_HASH_ANNOTATION,
    Proxy,
    instance_name,
    spec_hash,
)
from egress_proxies.providers import CreateRequest, Instance, Listing, ProviderClient, Result, Target
from egress_proxies.status import ProxyWriter, find_condition

log = logging.getLogger(__name__)

LISTED = "ProviderListed"


@dataclass
class _Create:
    proxy: Proxy
    request: CreateRequest
    hash: str


@dataclass(frozen=True)
class LiveSettings:
    batch_size: int = 50
    # Create batches of one provider run side by side; the runner's memory cap still bounds them.
    parallel_batches: int = 4
    # A Ready Proxy whose provider cannot be listed stays Ready (and in discovery) this long,
    # with a condition saying so; after it, it is no longer vouched for.
    stale_listing_seconds: float = 600.0


class LivePath:
    def __init__(self, writer: ProxyWriter, settings: LiveSettings, owner: str,
                 contain: Callable[[Proxy, Callable[[], object]], None], count: Callable[[str, int], None],
                 seconds_since: Callable[[str], float]) -> None:
        self.writer = writer
        self.settings = settings
        self.owner = owner
        self.contain = contain
        self.count = count
        self.seconds_since = seconds_since

    def reconcile(self, client: ProviderClient, proxies: Sequence[Proxy], listing: Listing) -> None:
        creates: list[_Create] = []
        retire: list[tuple[Proxy, Instance]] = []
        for proxy in proxies:
            self.contain(proxy, partial(self._decide, proxy, listing, creates, retire))

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
                for create, result in zip(chunk, results, strict=True):
                    self.contain(create.proxy, partial(self._created, create, result, listing, retire))
        self._retire(client, retire)

    def _decide(self, proxy: Proxy, listing: Listing, creates: list[_Create],
                retire: list[tuple[Proxy, Instance]]) -> None:
        desired = spec_hash(proxy.spec)
        mine = listing.of(proxy.uid)
        current = next((i for i in mine if i.spec_hash == desired), None)
        if current is None:
            if listing.error is not None and not mine:
                self._unlisted(proxy, listing)
                return
            if self.writer.backoff.due(proxy.uid):
                name = instance_name(proxy, desired)
                creates.append(_Create(proxy, CreateRequest.for_proxy(proxy, self.owner, name, desired), desired))
            return
        self.writer.backoff.succeeded(proxy.uid)  # its provider answers again: no stale backoff
        proxy = self.observe(proxy, current, desired)
        if current.running:
            retire.extend((proxy, old) for old in mine if old is not current)

    def _unlisted(self, proxy: Proxy, listing: Listing) -> None:
        """The provider could not be listed where this Proxy's instance may live."""
        assert listing.error is not None
        since = self.seconds_since(find_condition(proxy, LISTED).get("lastTransitionTime") or "")
        if proxy.status.get("phase") == PHASE_READY and since < self.settings.stale_listing_seconds:
            # Nothing says the instance stopped: a listing failure (libvirtd restarting, an API
            # blip) must not take a serving proxy out of discovery. Say so, for a bounded time.
            message = (f"the provider could not be listed ({listing.error}); last known state kept for at most "
                       f"{self.settings.stale_listing_seconds:.0f} s")
            ready = find_condition(proxy, "Ready")
            self.writer.write_status(proxy, self.writer.status(
                proxy, PHASE_READY, "True", str(ready.get("reason") or "InstanceRunning"),
                str(ready.get("message") or ""), conditions={LISTED: ("False", "ListFailed", message)}))
            return
        self.writer.failed(proxy, listing.error, "ListFailed")

    def _created(self, create: _Create, result: Result, listing: Listing,
                 retire: list[tuple[Proxy, Instance]]) -> None:
        if result.error is not None:
            self.writer.failed(create.proxy, result.error, "CreateFailed")
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
        if instance.running:
            retire.extend((proxy, old) for old in listing.of(proxy.uid) if old.provider_id != instance.provider_id)

    def observe(self, proxy: Proxy, instance: Instance, desired: str) -> Proxy:
        """Status from what the provider reports about the instance built from ``desired``."""
        ip = instance.ip
        recorded = proxy.status.get("ip")
        if (instance.state == "running" and not ip and recorded and proxy.status.get("providerID") ==
                instance.provider_id and proxy.status.get("phase") == PHASE_READY):
            # Running, but its address could not be read this time (a hypervisor's daemon just
            # restarted, a lease file rotated): the address of a running instance does not change.
            ip = str(recorded)
        listed = {LISTED: None}
        if instance.state == "running" and ip:
            endpoint = f"{ip}:{proxy.port}"
            status = self.writer.status(proxy, PHASE_READY, "True", "InstanceRunning",
                                        f"instance {instance.provider_id} is running at {endpoint}",
                                        conditions=listed, providerID=instance.provider_id, ip=ip, endpoint=endpoint)
            if proxy.annotations.get(SPEC_HASH_ANNOTATION) != desired:
                proxy = self.writer.update_metadata(
                    proxy, lambda p: p.annotations.__setitem__(SPEC_HASH_ANNOTATION, desired))
        else:
            status = self.writer.status(proxy, PHASE_PROVISIONING, "False", "Provisioning",
                                        f"instance {instance.provider_id} is {instance.state}, waiting for it to "
                                        "run with an IP", conditions=listed, providerID=instance.provider_id)
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
                    metrics.ERRORS.labels(error_class=result.error.error_class.value).inc()
                    log.warning("%s: deleting replaced instance %s failed (%s)", proxy.key, old.provider_id,
                                result.error)


T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items), max(1, size))]
