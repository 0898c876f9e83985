"""The machine-wide caches the image helpers build into (guest images, the container base and
wheelhouse, package repositories), under ``/var/cache/egress-proxies-tests``: one lock per cache,
each build staged under ``BUILDING_PREFIX`` and renamed into place, unused keys pruned.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A key no caller has used for this long is removed by the next build into its cache.
PRUNE_AFTER = 24 * 3600.0
# A build's staging directory: renamed to its key when done, so what is left is a dead build's.
BUILDING_PREFIX = ".building-"
_LOCK_NAME = ".lock"


@contextmanager
def locked(cache_root: Path) -> Iterator[None]:
    """Hold ``cache_root``'s lock (made on first use): one builder per cache, across processes."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / _LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prune(cache_root: Path, keep: Path) -> None:
    """Remove the keys (other than ``keep``) that no caller has used for PRUNE_AFTER seconds."""
    horizon = time.time() - PRUNE_AFTER
    for entry in cache_root.iterdir():
        if entry != keep and not entry.name.startswith(".") and entry.is_dir() and entry.stat().st_mtime < horizon:
            shutil.rmtree(entry)
