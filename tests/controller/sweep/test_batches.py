"""sweep/batches.py: operations in batches of the configured size, in order."""

from __future__ import annotations

from egress_proxies.sweep.batches import chunked


def test_chunked_splits_in_order() -> None:
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunked((1, 2), 5) == [[1, 2]]
    assert chunked([], 3) == []
    # A size below one is one: never an endless loop, never an empty batch.
    assert chunked([1, 2], 0) == [[1], [2]]
