"""Where Proxies come from and where their status goes: the interface both sources implement.

``kube.KubeStore`` talks to the Kubernetes API; ``directory.DirectoryStore`` reads YAML
files and writes status beside them. The reconcile logic only knows this interface.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from egress_proxies.resources.proxy import Proxy


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

