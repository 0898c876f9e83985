# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Name claims: which run may create a domain of a given name (docs/kvm-provider.md, "Creating
without a duplicate").

libvirt refuses a second domain of one name on one hypervisor, but nothing stops two runs from
defining the same name on two hypervisors. A claim is a volume ``<domain>.claim`` in the pool of
the name's **home host**: the configured hypervisor (by URI) that rendezvous hashing of the name
picks, so every controller with the same host list picks the same one without asking anyone,
and adding or removing a hypervisor moves only the names homed there. libvirt creates a volume of
a given name in a pool at most once (under the pool's lock), so of runs claiming one name at once
exactly one succeeds.

The claim is stamped with its owner: its size in bytes (1 to ``STAMPS``) is one of the two stamps
its owner derives from the name and who it is (``ClaimBook.stamps``: the machine and the cache
directory it runs with), so a run can tell its claim from one that replaced it, and a controller
knows its own claims after a restart, even one that emptied its cache directory. ``ClaimBook``
also remembers, in that directory, when it first saw another's claim with no domain behind it (a
run creating it, or one that died doing so).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    create_volume_once,
    delete_volume,
    find_volume,
    lookup_pool,
    volume_capacity,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.images import volume_xml
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost

# Claim sizes run from 1 byte to this: small beside a pool's overlays (at most 64 KiB a name), and
# many enough that another controller's stamp is one of ours for a name once in 32,768.
STAMPS = 65536


def claim_volume_name(domain: str) -> str:
    return "%s.claim" % domain


def home_host(hosts: Sequence[KvmHost], name: str) -> KvmHost:
    """The host entry whose pool holds ``name``'s claim: of the configured hypervisors (distinct
    URIs), the one scoring highest for the name (rendezvous hashing); its first entry in config
    order when several entries share that URI."""
    if not hosts:
        raise Permanent("kvm.hosts: no host is configured, so no proxy can be created; add one")
    first_entry: Dict[str, KvmHost] = {}
    for host in hosts:
        first_entry.setdefault(host.uri, host)

    def score(uri: str) -> bytes:
        return hashlib.sha256(("%s\0%s" % (uri, name)).encode("utf-8")).digest()

    return first_entry[max(first_entry, key=score)]


class HomePool:
    """The claims of the names homed on one host, over the run's connection to it."""

    def __init__(self, connection: Any, home: KvmHost) -> None:
        self.home = home
        self.pool = lookup_pool(connection, home.pool, "pool %r on host %s" % (home.pool, home.name))

    def take(self, name: str, stamp: int) -> bool:
        """Claim ``name`` with ``stamp``: False when a claim of that name exists already."""
        volume = claim_volume_name(name)
        return create_volume_once(self.pool, volume, volume_xml(volume, stamp, "raw"),
                                  "claiming the name %s on host %s" % (name, self.home.name))

    def stamp(self, name: str) -> Optional[int]:
        """The stamp of ``name``'s claim, or None when it has none."""
        volume = find_volume(self.pool, claim_volume_name(name))
        if volume is None:
            return None
        return volume_capacity(volume, "reading the claim of %s on host %s" % (name, self.home.name))

    def release(self, name: str, stamp: Optional[int] = None) -> None:
        """Remove ``name``'s claim if there is one (and, given ``stamp``, if it carries that stamp)."""
        volume = find_volume(self.pool, claim_volume_name(name))
        if volume is None:
            return
        context = "releasing the name %s on host %s" % (name, self.home.name)
        if stamp is None or volume_capacity(volume, context) == stamp:
            delete_volume(volume, context)


def owner_of(cache_dir: str) -> str:
    """Who a controller is, to its claims: the machine it runs on (in Kubernetes the pod's name)
    and where its module cache directory is, not what that holds. A controller restarted on the
    same machine or in the same pod is the same owner, whatever its cache still holds; two
    controllers (two pods, two machines, two cache directories on one machine) are two owners."""
    return "%s\0%s" % (socket.gethostname(), os.path.realpath(cache_dir))


class ClaimBook:
    """What this controller knows of claims: the stamps its own claims carry (``stamps``), and,
    one small JSON file per name under ``directory`` (in the module's cache directory; None keeps
    nothing), when it first saw each other claim it found with no domain behind it."""

    def __init__(self, directory: Optional[str], owner: str, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.owner = owner
        self.clock = clock

    def stamps(self, name: str) -> Tuple[int, int]:
        """The two stamps this owner's claims of ``name`` carry: a claim is taken with the first,
        a leftover of its own carrying that one is taken over with the second (and the other way
        round), so a run taken over never finds its stamp again."""
        first, second = (1 + int.from_bytes(hashlib.sha256(("%s\0%s\0%d" % (self.owner, name, which)).encode(
            "utf-8")).digest()[:8], "big") % STAMPS for which in (0, 1))
        return first, (second if second != first else first % STAMPS + 1)

    def stamp_for(self, name: str, avoid: Optional[int] = None) -> int:
        """The stamp to claim ``name`` with: this owner's first, unless that is ``avoid``."""
        first, second = self.stamps(name)
        return second if first == avoid else first

    def is_mine(self, name: str, stamp: int) -> bool:
        return stamp in self.stamps(name)

    def _path(self, name: str) -> Optional[str]:
        if self.directory is None:
            return None
        return os.path.join(self.directory, hashlib.sha256(name.encode("utf-8")).hexdigest()[:32] + ".json")

    def _read(self, name: str) -> Dict[str, Any]:
        path = self._path(name)
        try:
            with open(path or "") as handle:
                entry = json.load(handle)
        except (OSError, ValueError):
            return {}
        return entry if isinstance(entry, dict) and entry.get("name") == name else {}

    def _write(self, name: str, entry: Dict[str, Any]) -> None:
        path = self._path(name)
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".claim-", suffix=".tmp")
            with os.fdopen(handle, "w") as out:
                json.dump(dict(entry, name=name), out)
            os.replace(temporary, path)
        except OSError:
            return  # a book that cannot be written only makes a leftover claim wait its patience out

    def waited(self, name: str, stamp: int) -> float:
        """Seconds since this controller first saw ``name`` claimed with ``stamp`` and no domain."""
        entry = self._read(name)
        now = self.clock()
        if entry.get("stamp") != stamp or not isinstance(entry.get("seen"), (int, float)):
            self._write(name, {"stamp": stamp, "seen": now})
            return 0.0
        return max(0.0, now - float(entry["seen"]))

    def forget(self, name: str) -> None:
        path = self._path(name)
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass
