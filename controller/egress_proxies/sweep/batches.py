"""Operations go to the providers in batches: one module run acts for up to ``batch_size`` items
(``LiveSettings.batch_size``), so a sweep spawns few runner processes however many Proxies move;
a sweep with many creates makes larger create batches (``create_batch_size``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """``items`` in order, in lists of at most ``size`` (``itertools.batched`` from Python 3.12)."""
    items, size = list(items), max(1, size)
    return [items[i:i + size] for i in range(0, len(items), size)]


def create_batch_size(creates: int, batch_size: int, parallel_batches: int, largest: int) -> int:
    """The size of a sweep's create batches: ``batch_size``, unless the ``creates`` would need more
    than ``parallel_batches`` batches of it (a fill from empty); then as few batches as run side by
    side, each at most ``largest`` (and never less than ``batch_size``)."""
    return max(batch_size, min(largest, -(-creates // max(1, parallel_batches))))
