"""What crawlers are handed: the one home of discovery's state, and the one rule for it.

``handed_out`` is the rule for one Proxy; ``handed_out_of`` applies it to a whole list, pool
floors included (a quarantined member its pool still needs for ``minReady`` stays listed while
it serves). ``DiscoveryView`` holds the set a process hands out and is the only place it
changes: the sweep publishes to it (``reconcile.Reconciler``), a probe verdict written between
sweeps updates it (``live.LivePath``), a stored read loads it on a standby or a leader new in
its term (``loop.Controller``), the watch withdraws deleted Proxies, and a crawler's quarantine
hides one (``quarantine.Quarantine``). ``loop`` and ``http_server`` only read it; ``proxy_entry``
is the shape crawlers see of each.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egress_proxies.resources import reasons
from egress_proxies.resources.conditions import PRIVATE, SERVING, find_condition
from egress_proxies.resources.pool import controller_of, pool_of, quarantined
from egress_proxies.resources.proxy import PHASE_READY, Proxy

# (namespace, pool name) -> its floor.
Floors = Mapping[tuple[str, str], "PoolFloor"]


@dataclass(frozen=True)
class PoolFloor:
    """What discovery needs of a pool to keep its floor: its uid (members are those it controls)
    and how many members must stay discoverable (its ``minReady``)."""

    uid: str
    floor: int


def serves(status: Mapping[str, Any]) -> bool:
    """Whether the instance the status describes serves crawlers, whatever its phase says (a
    quarantined one may: its pool keeps it listed while it needs it, ``kept_listed``):
    running with an address and, where probed, passing the probes without being open to strangers."""
    serving = find_condition(status, SERVING)
    if not status.get("endpoint") or find_condition(status, PRIVATE).get("reason") == reasons.NOT_PRIVATE:
        return False
    return serving.get("status") == "True" or serving.get("reason") == reasons.UNVERIFIED


def handed_out(proxy: Proxy, kept_for_floor: bool = False) -> bool:
    """The one rule for what crawlers are handed. A deleting Proxy never (its instance is going,
    whatever its last phase). A quarantined one only where its pool keeps it for its floor
    (``kept_for_floor``) and only while it serves (its phase says Quarantined, or still Ready
    when its provider could not be listed). Any other only while Ready."""
    if proxy.deleting:
        return False
    ready = proxy.status.get("phase") == PHASE_READY
    if quarantined(proxy):
        return kept_for_floor and (ready or serves(proxy.status))
    return ready


def kept_listed(floor: int, serving: int, quarantined_serving: Sequence[str]) -> list[str]:
    """The quarantined members discovery still lists: as many as the pool needs to keep ``floor``
    (its ``minReady``) discoverable beside the ``serving`` ones, by name (stable from sweep to
    sweep, so one leaves discovery for good once its replacement serves). A quarantine never
    takes a pool's discoverable members below its floor: a burst of them from one crawler
    replaces the members make-before-break instead of emptying the pool."""
    return sorted(quarantined_serving)[:max(0, floor - serving)]


def kept_for_floors(proxies: Iterable[Proxy], floors: Floors) -> set[str]:
    """The uids of the quarantined members discovery still lists: per pool, as many as it needs to
    keep its floor (``kept_listed``) of those that would be handed out if kept."""
    serving: dict[tuple[str, str], int] = {}
    candidates: dict[tuple[str, str], dict[str, Proxy]] = {}
    for proxy in proxies:
        key = _pool_key(proxy)
        floor = floors.get(key)
        if floor is None or controller_of(proxy) != floor.uid:
            continue
        if quarantined(proxy):
            if handed_out(proxy, kept_for_floor=True):
                candidates.setdefault(key, {})[proxy.name] = proxy
        elif handed_out(proxy):
            serving[key] = serving.get(key, 0) + 1
    return {found[name].uid for key, found in candidates.items()
            for name in kept_listed(floors[key].floor, serving.get(key, 0), list(found))}


def handed_out_of(proxies: Sequence[Proxy], floors: Floors) -> list[Proxy]:
    """The Proxies crawlers are handed of ``proxies``, in their order, by ``handed_out``."""
    kept = kept_for_floors(proxies, floors)
    return [p for p in proxies if handed_out(p, kept_for_floor=p.uid in kept)]


def _pool_key(proxy: Proxy) -> tuple[str, str]:
    """(namespace, pool name): the key of its pool's floor ("" for a bare Proxy)."""
    return proxy.namespace, pool_of(proxy) or ""


def proxy_entry(proxy: Proxy) -> dict[str, Any]:
    """One proxy as crawlers see it."""
    probe = proxy.status.get("probe") or {}
    serving = find_condition(proxy.status, SERVING)
    return {
        "name": proxy.name,
        "namespace": proxy.namespace,
        "provider": proxy.provider,
        "location": proxy.spec.get("location"),
        "ip": proxy.status.get("ip"),
        "port": proxy.port,
        "endpoint": proxy.status.get("endpoint"),
        "providerID": proxy.status.get("providerID"),
        "egressIP": proxy.status.get("egressIP"),
        # True: a request through it worked at lastProbeTime; Unknown: its provider is not probed.
        "serving": serving.get("status", "Unknown"),
        "latencySeconds": probe.get("latencySeconds"),
        "lastProbeTime": probe.get("lastProbeTime"),
    }


@dataclass(frozen=True)
class Hiding:
    """What a quarantine did to discovery: ``hidden`` (it left at once), or the pool ``floor`` that
    keeps it listed, with the pool's ``others`` (its discoverable members without it)."""

    hidden: bool
    floor: PoolFloor | None = None
    others: int = 0


class DiscoveryView:
    """The Proxies this process hands out, and everything that changes them.

    Two sources: the last sweep's set (``publish``, then ``follow`` per probe verdict), served
    while this process leads and has swept in its current term (``serve_sweeps``); else the set
    read from the store (``load_stored``), so a standby, or a leader that has just taken over,
    never answers with an empty list by accident. Both are made by ``handed_out_of``. On top:
    Proxies the watch saw deleted or deleting (``withdraw``) and instances a crawler quarantined
    (``hide``) leave at once, until a view read later knows of them. Thread-safe: written by the
    sweep, the probe's verdict thread, the watch and the HTTP workers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._swept: dict[str, Proxy] = {}  # by uid
        self._swept_list: list[Proxy] | None = []  # the same, until it changes
        self._stored: list[Proxy] = []
        self._serving_sweeps = False
        # uid -> when the watch saw it deleted or deleting (monotonic): out of discovery at once, not
        # after the sweep in flight (which may be deleting its instance while discovery hands it out).
        self._withdrawn: dict[str, float] = {}
        # (namespace, name) -> the providerID quarantined here since the view last showed it.
        self._hidden: dict[tuple[str, str], str] = {}
        self._floors: Floors = {}
        # A sweep published or the store was read: the floors name every pool there is (knows_pool).
        self._pools_read = False
        # The sweeps that published: a sweep that failed before its end leaves the view as it was.
        self.published = 0

    # -- writers -------------------------------------------------------------------------------

    def publish(self, proxies: Sequence[Proxy], floors: Floors, started: float) -> None:
        """A sweep's end: ``proxies`` as it left them, each pool's floor, and when it began
        (``time.monotonic``): it knows of the deletions withdrawn before that."""
        chosen = handed_out_of(proxies, floors)
        with self._lock:
            self._swept = {p.uid: p for p in chosen}
            self._swept_list = None
            self._floors = floors
            self._pools_read = True
            self.published += 1
            self._forget_withdrawn(started)

    def follow(self, proxy: Proxy) -> None:
        """A probe's verdict was written between sweeps: the sweep's set follows it at once. A
        quarantined Proxy stays only where the last sweep kept it for its pool's floor."""
        with self._lock:
            listed = proxy.uid in self._swept
            if handed_out(proxy, kept_for_floor=listed):
                self._swept[proxy.uid] = proxy
            elif listed:
                del self._swept[proxy.uid]
            else:
                return
            self._swept_list = None

    def load_stored(self, proxies: Sequence[Proxy], floors: Floors, started: float) -> None:
        """The Proxies as stored, read from ``started`` (monotonic) on: what is served while no
        sweep of this term has published. The floors are the ones a sweep would use."""
        chosen = handed_out_of(proxies, floors)
        with self._lock:
            self._stored = chosen
            if not self._serving_sweeps:
                self._floors = floors
            self._pools_read = True
            self._forget_withdrawn(started)

    def serve_sweeps(self, serving: bool) -> None:
        """True: this process leads and its sweep has published in this term; False: serve the
        stored set (the leadership was lost)."""
        with self._lock:
            self._serving_sweeps = serving

    def withdraw(self, uid: str, seen: float) -> None:
        """The watch saw the Proxy deleted or deleting at ``seen`` (monotonic)."""
        with self._lock:
            self._withdrawn[uid] = seen

    def hide(self, proxy: Proxy) -> Hiding:
        """A crawler quarantined the Proxy's current instance: it leaves discovery at once, but a
        pool member only while its pool keeps its floor discoverable without it."""
        key = (proxy.namespace, proxy.name)
        provider_id = str(proxy.status.get("providerID") or "")
        with self._lock:
            floor = self._floors.get(_pool_key(proxy))
            if floor is None or controller_of(proxy) != floor.uid:
                self._hidden[key] = provider_id
                return Hiding(True)
            others = sum(1 for p in self._listed() if _pool_key(p) == _pool_key(proxy)
                         and controller_of(p) == floor.uid and p.name != proxy.name)
            if others >= floor.floor:
                self._hidden[key] = provider_id
                return Hiding(True, floor, others)
            return Hiding(False, floor, others)

    # -- readers -------------------------------------------------------------------------------

    def handed_out(self) -> list[Proxy]:
        """What crawlers are handed now (the HTTP server's discovery routes)."""
        with self._lock:
            return self._listed()

    @property
    def swept(self) -> list[Proxy]:
        """The last sweep's set as verdicts changed it since (the same list until it changes)."""
        with self._lock:
            return self._swept_now()

    @property
    def serving_sweeps(self) -> bool:
        with self._lock:
            return self._serving_sweeps

    def knows_pool(self, namespace: str, name: str) -> bool:
        """False only when the pools have been read and this one is not among them (a valid pool
        not being deleted): discovery answers 404 for it instead of an empty list (issue 41)."""
        with self._lock:
            return not self._pools_read or (namespace, name) in self._floors

    @property
    def floors(self) -> Floors:
        """Each pool's floor as of the last sweep (or stored read, on a standby)."""
        with self._lock:
            return self._floors

    # -- under the lock ------------------------------------------------------------------------

    def _swept_now(self) -> list[Proxy]:
        if self._swept_list is None:
            self._swept_list = list(self._swept.values())
        return self._swept_list

    def _listed(self) -> list[Proxy]:
        """The source served now without the withdrawn and hidden ones. The hidden are forgotten
        once the source has caught up with them: the Proxy gone, or on another instance now."""
        source = self._swept_now() if self._serving_sweeps else self._stored
        listed = [p for p in source if p.uid not in self._withdrawn] if self._withdrawn else list(source)
        if not self._hidden:  # the common case: every crawler's poll, nothing quarantined lately
            return listed
        current = {(p.namespace, p.name): p.status.get("providerID") for p in listed}
        self._hidden = {key: provider_id for key, provider_id in self._hidden.items()
                        if current.get(key) == provider_id}
        return [p for p in listed if (p.namespace, p.name) not in self._hidden]

    def _forget_withdrawn(self, before: float) -> None:
        """A view read after ``before`` knows of deletions seen before it (it leaves deleting
        Proxies out itself)."""
        self._withdrawn = {uid: seen for uid, seen in self._withdrawn.items() if seen >= before}
