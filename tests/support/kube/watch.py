# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A watch's events and its watcher's queue."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from support.kube.resources import Obj, ResourceType
from support.kube.selectors import Filter


@dataclass(frozen=True)
class Event:
    rv: int
    rtype: ResourceType
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    previous: Obj | None

    def seen_by(self, flt: Filter) -> tuple[str, Obj] | None:
        """The event as a filtered watch sees it: an object leaving the selection is DELETED
        for that watch and one entering it is ADDED, as with the real server."""
        if self.rtype != flt.rtype:
            return None
        now = flt.matches(self.obj)
        before = self.previous is not None and flt.matches(self.previous)
        if self.type == "MODIFIED" and before != now:
            return ("ADDED", self.obj) if now else ("DELETED", self.obj)
        return (self.type, self.obj) if now else None


@dataclass
class Watcher:
    flt: Filter
    events: queue.Queue[tuple[str, Obj] | None] = field(default_factory=queue.Queue)
