"""How a proxy is chosen for a request: round robin, random, least recently used, or sticky per site.

Each policy holds the usable proxies (``update``) and picks one in constant time (``pick``); the
client calls both under its lock, so a policy needs none of its own. ``sticky`` computes a
site's proxy by rendezvous hashing once and remembers it: when a proxy goes, only the sites it
served move, each to its next-best proxy, and a process restart maps every site as before.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from egress_proxies_client.proxy import Proxy


class Policy(Protocol):
    def update(self, proxies: Sequence[Proxy]) -> None:
        """The proxies to choose from from now on (possibly none)."""

    def pick(self, site: str | None) -> Proxy | None:
        """One of them, or None when there are none."""


class RoundRobin:
    def __init__(self) -> None:
        self._proxies: tuple[Proxy, ...] = ()
        self._next = 0

    def update(self, proxies: Sequence[Proxy]) -> None:
        self._proxies = tuple(proxies)

    def pick(self, site: str | None) -> Proxy | None:  # noqa: ARG002 -- the same for every site
        if not self._proxies:
            return None
        self._next = (self._next + 1) % len(self._proxies)
        return self._proxies[self._next]


class RandomChoice:
    def __init__(self, rng: random.Random) -> None:
        self._proxies: tuple[Proxy, ...] = ()
        self._rng = rng

    def update(self, proxies: Sequence[Proxy]) -> None:
        self._proxies = tuple(proxies)

    def pick(self, site: str | None) -> Proxy | None:  # noqa: ARG002 -- the same for every site
        return self._rng.choice(self._proxies) if self._proxies else None


class LeastRecentlyUsed:
    """The proxy used longest ago; a proxy new to the list counts as never used."""

    def __init__(self) -> None:
        self._order: OrderedDict[tuple[str, str, str], Proxy] = OrderedDict()

    def update(self, proxies: Sequence[Proxy]) -> None:
        current = {proxy.instance: proxy for proxy in proxies}
        kept = [(key, current[key]) for key in self._order if key in current]
        fresh = [(key, proxy) for key, proxy in current.items() if key not in self._order]
        self._order = OrderedDict(fresh + kept)

    def pick(self, site: str | None) -> Proxy | None:  # noqa: ARG002 -- the same for every site
        if not self._order:
            return None
        key, proxy = next(iter(self._order.items()))
        self._order.move_to_end(key)
        return proxy


class StickyPerSite:
    """The same proxy for every request to one site (a host name) while that proxy is usable.
    Requests without a site are spread round robin."""

    # Sites remembered; beyond, the memory starts over (recomputing a site costs one hash per proxy).
    MAX_SITES = 100_000

    def __init__(self) -> None:
        self._by_instance: dict[tuple[str, str, str], Proxy] = {}
        self._sites: dict[str, tuple[str, str, str]] = {}
        self._round_robin = RoundRobin()

    def update(self, proxies: Sequence[Proxy]) -> None:
        self._by_instance = {proxy.instance: proxy for proxy in proxies}
        self._round_robin.update(proxies)

    def pick(self, site: str | None) -> Proxy | None:
        if site is None:
            return self._round_robin.pick(None)
        found = self._by_instance.get(self._sites.get(site, ("", "", "")))
        if found is not None:
            return found
        if not self._by_instance:
            return None
        if len(self._sites) >= self.MAX_SITES:
            self._sites.clear()
        chosen = max(self._by_instance.values(), key=lambda proxy: _score(site, proxy))
        self._sites[site] = chosen.instance
        return chosen


def _score(site: str, proxy: Proxy) -> bytes:
    """Rendezvous weight of ``proxy`` for ``site``: stable across processes and restarts."""
    return hashlib.blake2b(f"{site}\0{proxy.key}".encode(), digest_size=8).digest()


POLICIES = ("round_robin", "random", "least_recently_used", "sticky")


def make_policy(name: str, rng: random.Random) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice(rng)
    if name == "least_recently_used":
        return LeastRecentlyUsed()
    if name == "sticky":
        return StickyPerSite()
    raise ValueError(f"policy: {name!r} is not one of {', '.join(POLICIES)}")
