"""The delete path (docs/contract.md, "Deletion"): release a deleting Proxy's finalizer once its
instance is gone, in the order the predecessor learned the hard way.

Called by ``reconcile.Reconciler`` with every deleting Proxy that still carries our finalizer.
Each Proxy is handled on its own; one that cannot be decided never holds up the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from egress_proxies import metrics
from egress_proxies.providers.client import ProviderClient, Result, Target
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.resources import reasons
from egress_proxies.resources.proxy import PHASE_DELETING, Proxy
from egress_proxies.sweep.batches import chunked
from egress_proxies.sweep.writer import ProxyWriter

log = logging.getLogger(__name__)


class DeletePath:
    def __init__(self, writer: ProxyWriter, batch_size: int, contain: Callable[[Proxy, Callable[[], object]], None],
                 count: Callable[[str, int], None]) -> None:
        self.writer = writer
        self.batch_size = batch_size
        self.contain = contain
        self.count = count

    def reconcile(self, proxies: Sequence[Proxy], clients: Mapping[str, ProviderClient],
                  unusable: Mapping[str, str]) -> None:
        """``clients``: the usable providers; ``unusable``: configured providers that cannot be
        used this sweep (invalid section), with why."""
        pending: dict[str, list[Proxy]] = {}
        for proxy in proxies:
            self.contain(proxy, partial(self._decide, proxy, clients, unusable, pending))
        for name, group in pending.items():
            client = clients[name]
            for chunk in chunked(group, self.batch_size):
                self._delete_chunk(client, chunk)

    def _decide(self, proxy: Proxy, clients: Mapping[str, ProviderClient], unusable: Mapping[str, str],
                pending: dict[str, list[Proxy]]) -> None:
        provider_id = proxy.status.get("providerID")
        if not provider_id:  # 1. nothing was created
            self._release(proxy)
        elif proxy.skip_cleanup:  # 2. checked before the provider is looked up
            log.info("%s: skip-cleanup set; abandoning instance %s", proxy.key, provider_id)
            self.writer.store.record_event(proxy, "Normal", reasons.ABANDONED,
                                           f"instance {provider_id} abandoned (skip-cleanup annotation)")
            self._release(proxy)
        elif proxy.provider in unusable:
            self.writer.failed(proxy, ProviderError(ErrorClass.PERMANENT, unusable[proxy.provider]),
                               reasons.PROVIDER_CONFIG_INVALID, phase=PHASE_DELETING)
        elif proxy.provider not in clients:  # 3. the annotation is the way out
            message = (f"provider {proxy.provider!r} is not in the provider config, so instance {provider_id} "
                       f"cannot be deleted; set the annotation crawl.example.com/skip-cleanup: \"true\" "
                       f"to release this Proxy and remove the instance by hand")
            metrics.ERRORS.labels(provider=proxy.provider, error_class="permanent").inc()
            self.writer.write_status(proxy, self.writer.status(proxy, PHASE_DELETING, "False",
                                                               reasons.PROVIDER_NOT_CONFIGURED, message))
        elif self.writer.backoff.due(proxy.uid):
            pending.setdefault(proxy.provider, []).append(proxy)

    def _release(self, proxy: Proxy) -> None:
        self.writer.release(proxy)
        self.count("released", 1)

    def _delete_chunk(self, client: ProviderClient, chunk: list[Proxy]) -> None:
        targets = [Target(p.uid, str(p.status["providerID"])) for p in chunk]
        gets = client.get(targets)
        self.count("runner_calls", 1)
        to_delete = []
        for proxy, target, got in zip(chunk, targets, gets, strict=True):
            if got.error is None or got.error.error_class is ErrorClass.PERMANENT:  # 4. permanent: Delete anyway
                to_delete.append((proxy, target, got))
            elif got.error.error_class is ErrorClass.NOT_FOUND:
                self.contain(proxy, partial(self._release, proxy))
            else:
                failed = partial(self.writer.failed, proxy, got.error, reasons.DELETE_FAILED, PHASE_DELETING)
                self.contain(proxy, failed)
        if not to_delete:
            return
        deletes = client.delete([target for _, target, _ in to_delete])
        self.count("runner_calls", 1)
        for (proxy, target, got), deleted in zip(to_delete, deletes, strict=True):
            self.contain(proxy, partial(self._deleted, proxy, target, got, deleted))

    def _deleted(self, proxy: Proxy, target: Target, got: Result, deleted: Result) -> None:
        if deleted.error is None:
            self.count("deleted", 1)
            self.writer.store.record_event(proxy, "Normal", reasons.DELETED, f"instance {target.provider_id} deleted")
            self._release(proxy)
        elif got.error is None:
            self.writer.failed(proxy, deleted.error, reasons.DELETE_FAILED, phase=PHASE_DELETING)
        else:  # both failed: report both, the Delete's class decides the retry
            joined = ProviderError(deleted.error.error_class,
                                   f"get failed ({got.error}); delete failed ({deleted.error})")
            self.writer.failed(proxy, joined, reasons.DELETE_FAILED, phase=PHASE_DELETING)
