# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A running domain's IP: from the guest agent, DHCP leases or ARP.

One domain (``domain_ip``, for get and create): the agent first, then its leases, then ARP. The
agent knows best but may not be installed or up yet; leases exist only on libvirt-managed
networks; ARP works for any bridge once the guest has spoken.

A host's listing (``listed_ip``): the leases of each network its domains use are read once per
host and network (``leased_addresses``: one call answers for every domain on it) and matched by
MAC; only a domain no lease covers is asked on its own, agent first, then ARP (asking its leases
again would get the same answer). A lease is what the network's DHCP server handed that MAC, so
for a guest on DHCP it is the address the agent would report; a guest with a static address has
no lease and is asked. Addresses are matched on the domain's own MACs, and loopback and
link-local addresses are skipped. IPv4 is preferred: crawlers connect to ``ip:port``.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    ADDRESS_SOURCES,
    interface_addresses,
    named_network_leases,
)

SOURCES_BESIDES_LEASES = ("agent", "arp")


def usable_address(candidates: Iterable[str]) -> Optional[str]:
    """The first routable address, IPv4 before IPv6."""
    usable = []
    for text in candidates:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            continue
        if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
            continue
        usable.append(address)
    usable.sort(key=lambda a: a.version)
    return str(usable[0]) if usable else None


def domain_ip(domain: Any, macs: Iterable[str], sources: Sequence[str] = ADDRESS_SOURCES) -> Optional[str]:
    """The domain's IP from ``sources`` in turn (default: agent, leases, ARP), or None when none
    knows one yet."""
    wanted = {mac.lower() for mac in macs}
    for source in sources:
        interfaces = interface_addresses(domain, source)
        if interfaces is None:
            continue  # agent not connected, no lease support on this network, ...: try the next source
        candidates = [
            entry["addr"]
            for interface in interfaces.values()
            if (interface.get("hwaddr") or "").lower() in wanted
            for entry in (interface.get("addrs") or [])
            if entry.get("addr")
        ]
        found = usable_address(candidates)
        if found:
            return found
    return None


def leased_addresses(connection: Any, networks: Iterable[str]) -> Dict[str, List[str]]:
    """The DHCP leases of these libvirt networks on one host, as MAC (lower case) -> addresses:
    one lookup and one lease call per network. A network that cannot answer (not defined there,
    not started, no DHCP, a driver without leases) adds nothing: its domains are asked one by one."""
    by_mac: Dict[str, List[str]] = {}
    for name in sorted(set(networks)):
        for lease in named_network_leases(connection, name) or []:
            mac, address = (lease.get("mac") or "").lower(), lease.get("ipaddr")
            if mac and address:
                by_mac.setdefault(mac, []).append(address)
    return by_mac


def listed_ip(domain: Any, macs: Iterable[str], leases: Mapping[str, List[str]]) -> Optional[str]:
    """A listed domain's IP: its leases' (``leased_addresses`` of its host), else its own
    agent's, else ARP's."""
    macs = list(macs)
    leased = usable_address(address for mac in macs for address in leases.get(mac.lower(), ()))
    return leased or domain_ip(domain, macs, SOURCES_BESIDES_LEASES)
