# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each domain's XML said, kept between module runs, so a listing reads a domain's XML once
and not at every sweep (docs/kvm-provider.md, "Listing").

libvirt has no call that returns many domains' XML, and our tags live only there: without this,
listing N domains costs N round trips to their hypervisors at every sweep (10,000 domains on
102 hosts: most of a steady sweep). What the provider reads from the XML (``DomainInfo``: name,
tags, MACs, networks, port, published port and source address) is written once, when the domain
is defined, and never changed by this collection: a claim that loses its port undefines the
domain and defines a new one, which has a new UUID. So an entry is keyed by the hypervisor's URI
and the domain's UUID (both known without a round trip from the listing's one
``getAllDomainStats`` call) and checked against the domain's name.

What the key cannot see is a domain edited in place by hand (``virsh edit`` keeps its UUID): each
entry is therefore read again after ``max_age`` seconds at the latest (the provider config's
``kvm.domainCacheSeconds``, 0 turning the cache off), at a random point of the second half of
that age so that the re-reads of a fleet spread over the sweeps instead of all falling due at
once.

One JSON file per hypervisor URI, replaced whole (write and rename), owner-only. Module runs side
by side (a fill's create runs) each load the file at their start and save at their end: a save
first merges in what the file holds now (the entries another run saved meanwhile, less the
domains this run saw gone), so one run's save does not drop the other's new domains and make the
next run read all their XML again. Two saves at the very same moment can still lose one's
entries; they are only read again. A file that cannot be read or parsed is an empty cache; one
that cannot be written leaves the cache as it was. Nothing here is secret (names, tags,
addresses, ports).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Set

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import DomainInfo, GuestNetwork

FORMAT = 1


def _info_from(data: Any) -> Optional[DomainInfo]:
    """The DomainInfo an entry holds, or None when it is not one (an older or damaged file)."""
    try:
        guest = data.get("guest_network")
        fields = {k: v for k, v in data.items() if k != "guest_network"}
        return DomainInfo(guest_network=GuestNetwork(**guest) if guest is not None else None, **fields)
    except (AttributeError, TypeError):
        return None


class HostDomainCache:
    """The entries of one hypervisor (one URI), shared by the threads of one module run."""

    def __init__(self, path: Optional[str], uri: str, max_age: float, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.uri = uri
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: Dict[str, Dict[str, Any]] = {}
        self._gone: Set[str] = set()  # UUIDs a listing of this run found gone: never merged back
        self._changed = False
        if path is not None and max_age > 0:
            self._entries = self._load(path, uri)

    @staticmethod
    def _load(path: str, uri: str) -> Dict[str, Dict[str, Any]]:
        try:
            with open(path) as handle:
                document = json.load(handle)
        except (OSError, ValueError):
            return {}
        if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("uri") != uri:
            return {}
        entries = document.get("domains")
        return entries if isinstance(entries, dict) else {}

    def get(self, uuid: str, name: str) -> Optional[DomainInfo]:
        """The cached info of the domain ``uuid``, unless it is due to be read again."""
        with self._lock:
            entry = self._entries.get(uuid)
        if not isinstance(entry, dict) or not isinstance(entry.get("expires"), (int, float)):
            return None
        if entry["expires"] <= self.clock():
            return None
        info = _info_from(entry.get("info"))
        return info if info is not None and info.name == name else None

    def put(self, uuid: str, info: DomainInfo) -> None:
        if self.max_age <= 0:
            return
        expires = self.clock() + self.max_age * random.uniform(0.5, 1.0)
        with self._lock:
            self._entries[uuid] = {"expires": expires, "info": dataclasses.asdict(info)}
            self._changed = True

    def keep_only(self, uuids: Iterable[str]) -> None:
        """Forget the domains that are gone (after a complete listing of the hypervisor)."""
        present = set(uuids)
        with self._lock:
            gone = [uuid for uuid in self._entries if uuid not in present]
            for uuid in gone:
                del self._entries[uuid]
            self._gone.update(gone)
            self._changed = self._changed or bool(gone)

    def save(self) -> None:
        with self._lock:
            if self.path is None or not self._changed:
                return
            # What another run saved since this one loaded the file (entries are immutable by UUID).
            for uuid, entry in self._load(self.path, self.uri).items():
                if uuid not in self._gone:
                    self._entries.setdefault(uuid, entry)
            document = {"format": FORMAT, "uri": self.uri, "domains": self._entries}
            directory = os.path.dirname(self.path)
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)
                handle, temporary = tempfile.mkstemp(dir=directory, prefix=".domains-", suffix=".tmp")
                try:
                    with os.fdopen(handle, "w") as out:
                        json.dump(document, out, separators=(",", ":"))
                    os.replace(temporary, self.path)
                except BaseException:
                    os.unlink(temporary)
                    raise
            except OSError:
                return  # a cache that cannot be written is only slower
            self._changed = False


class DomainCache:
    """The per-hypervisor caches of one module run, under ``directory`` (None: no cache)."""

    def __init__(self, directory: Optional[str], max_age: float) -> None:
        self.directory = directory
        self.max_age = max_age
        self._lock = threading.Lock()
        self._hosts: Dict[str, HostDomainCache] = {}

    def save(self) -> None:
        """Write every hypervisor's cache that changed in this run (the domains a create added)."""
        with self._lock:
            hosts = list(self._hosts.values())
        for host in hosts:
            host.save()

    def for_uri(self, uri: str) -> HostDomainCache:
        with self._lock:
            found = self._hosts.get(uri)
            if found is None:
                path = None
                if self.directory is not None:
                    path = os.path.join(self.directory, hashlib.sha256(uri.encode()).hexdigest()[:24] + ".json")
                found = self._hosts[uri] = HostDomainCache(path, uri, self.max_age)
            return found
