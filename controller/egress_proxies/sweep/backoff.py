"""Per-object retry timing: exponential backoff with jitter for transient errors, a slow
requeue for permanent ones. Called by the reconciler; keyed by Proxy uid."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Entry:
    failures: int
    not_before: float


class Backoff:
    def __init__(self, base_seconds: float = 5.0, cap_seconds: float = 300.0, permanent_seconds: float = 600.0,
                 jitter: float = 0.2, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random) -> None:
        self.base = base_seconds
        self.cap = cap_seconds
        self.permanent = permanent_seconds
        self.jitter = jitter
        self.clock = clock
        self.rng = rng
        self._entries: dict[str, _Entry] = {}

    def due(self, key: str) -> bool:
        """Whether ``key`` may be worked on now."""
        entry = self._entries.get(key)
        return entry is None or self.clock() >= entry.not_before

    def failed(self, key: str, error_class: str) -> float:
        """Record a failure; returns the delay before the next attempt."""
        entry = self._entries.get(key) or _Entry(0, 0.0)
        entry.failures += 1
        exponential = min(self.cap, self.base * 2 ** (entry.failures - 1))
        delay = self.permanent if error_class == "permanent" else exponential
        # Jitter spreads retries of many objects that failed together (a host went down).
        delay *= 1 + self.jitter * (2 * self.rng() - 1)
        entry.not_before = self.clock() + delay
        self._entries[key] = entry
        return delay

    def succeeded(self, key: str) -> None:
        self._entries.pop(key, None)

    def forget(self, keys: set[str]) -> None:
        """Drop entries of objects that no longer exist."""
        for key in set(self._entries) - keys:
            del self._entries[key]
