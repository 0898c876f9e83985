"""Operations go to the providers in batches: one module run acts for up to ``batch_size`` items
(``LiveSettings.batch_size``), so a sweep spawns few runner processes however many Proxies move."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """``items`` in order, in lists of at most ``size`` (``itertools.batched`` from Python 3.12)."""
    items, size = list(items), max(1, size)
    return [items[i:i + size] for i in range(0, len(items), size)]
