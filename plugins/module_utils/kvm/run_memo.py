# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a module run looks up on a host once and reuses for all its creates (docs/performance.md,
"Fill 10,000 from empty").

A batch of 250 creates used to ask each host, per create, for the same storage pool, the same
base image volume (its capacity and path) and the same network (its XML, for the networking
check): 7 of the 21 libvirt calls of a create, each a round trip the hypervisor serves too. None
of these changes under a run in a way the per-create lookups would have caught: a base volume or
pool removed mid-run fails the create that uses it either way (libvirt refuses the overlay or the
volume), and a network redefined mid-run was never re-checked between the check and the define.

Only values are remembered, never failures: a create that failed to look something up does not
fail the next one of the run, which asks again, as it did before.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, TypeVar

T = TypeVar("T")
_MISSING: Any = object()


class RunMemo:
    """Values computed once per key for the rest of one module run, shared by its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[Hashable, Any] = {}
        self._computing: Dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value remembered for ``key``, else ``compute()``'s, remembered when it returns. Threads
        missing one key at once wait for the first to compute it (a batch's first creates on a host
        all want its base volume at the same moment); when that one raises, the next one computes."""
        with self._lock:
            if key in self._values:
                found: T = self._values[key]
                return found
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            with self._lock:
                remembered: T = self._values.get(key, _MISSING)
            if remembered is not _MISSING:
                return remembered
            value = compute()
            with self._lock:
                self._values[key] = value
            return value

    def clear(self) -> None:
        """Forget everything (the run's libvirt handles go before their connections close)."""
        with self._lock:
            self._values.clear()
            self._computing.clear()
