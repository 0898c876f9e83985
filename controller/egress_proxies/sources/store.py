"""Where Proxies and ProxyPools come from and where their status goes: the interfaces both
sources implement, the errors they raise, and the one way to write through them optimistically.

``kube.KubeStore``/``kube.KubePools`` talk to the Kubernetes API; ``directory.DirectoryStore``
and ``directory_pools.DirectoryPools`` read YAML files and write status beside them. The sweep
only knows these interfaces.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from egress_proxies.resources.pool import Pool
from egress_proxies.resources.proxy import Proxy

# Attempts of one optimistic write before the object is left to the next sweep.
CONFLICT_RETRIES = 5

T = TypeVar("T")
R = TypeVar("R")


class StoreError(Exception):
    """Talking to the source failed (any reason); the sweep stops and retries later."""


class Conflict(StoreError):
    """The object changed since it was read (HTTP 409); read it again and retry."""


class Gone(StoreError):
    """The object no longer exists."""


class WatchExpired(StoreError):
    """The watch's resourceVersion is too old (HTTP 410): relist, then watch again."""


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    proxy: Proxy


class ProxyStore(Protocol):
    def list_proxies(self) -> tuple[list[Proxy], str]:
        """Every Proxy, and the list's resourceVersion to watch from."""

    def get_proxy(self, namespace: str, name: str) -> Proxy:
        """A fresh read; raises Gone when it does not exist."""

    def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Changes after ``resource_version``; ends after ``timeout_seconds``; raises WatchExpired."""

    def replace_metadata(self, proxy: Proxy) -> Proxy:
        """Write finalizers and annotations (optimistic: raises Conflict on a stale resourceVersion)."""

    def replace_status(self, proxy: Proxy) -> Proxy:
        """Write the status subresource (optimistic: raises Conflict on a stale resourceVersion)."""

    def record_event(self, proxy: Proxy, event_type: str, reason: str, message: str) -> None:
        """Emit an Event about the Proxy (best effort: never raises)."""

    def namespace_identities(self, namespaces: Collection[str]) -> dict[str, str]:
        """The identity of each of ``namespaces`` that exists, which a namespace deleted and made
        again under the same name does not keep (its uid on Kubernetes); raises StoreError."""


class PoolStore(Protocol):
    """What a source must offer for pools, beside ``ProxyStore`` (both sources implement it)."""

    def list_pools(self) -> list[Pool]:
        """Every ProxyPool (a deleted one that still has members is presented as deleting)."""

    def create_proxy(self, namespace: str, body: dict[str, Any]) -> None:
        """Create a member Proxy; raises Conflict when one of that name exists."""

    def delete_proxy(self, namespace: str, name: str) -> None:
        """Delete a member Proxy (through its finalizer); one already gone is success."""

    def replace_pool_status(self, pool: Pool) -> Pool:
        """Write the pool's status (optimistic: raises Conflict on a stale resourceVersion)."""

    def replace_pool_metadata(self, pool: Pool) -> Pool:
        """Write the pool's annotations and finalizers (optimistic, as above)."""

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, message: str) -> None:
        """Emit an Event about the pool (best effort: never raises)."""


def retry_on_conflict(obj: T, write: Callable[[T], R], reread: Callable[[T], T], what: str) -> R:
    """``write(obj)``; on a 409 (``Conflict``) read the object again with ``reread`` and write the
    change onto that, never a blind overwrite. ``write`` applies its change to the object it is
    given, so a retry re-applies it to what is stored now. After ``CONFLICT_RETRIES`` attempts a
    ``StoreError`` leaves the object to the next sweep."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return write(obj)
        except Conflict:
            obj = reread(obj)
    raise StoreError(f"{what} kept conflicting ({CONFLICT_RETRIES} times); retried next sweep")
