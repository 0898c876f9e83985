# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A running domain's IP: the guest agent first, then DHCP leases, then ARP.

The agent knows best but may not be installed or up yet; leases exist only on
libvirt-managed networks; ARP works for any bridge once the guest has spoken.
Addresses are matched on the domain's own MACs, and loopback and link-local
addresses are skipped. IPv4 is preferred: crawlers connect to ``ip:port``.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable, List, Optional

try:
    import libvirt
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    libvirt = None


def _sources() -> List[int]:
    return [
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
    ]


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


def domain_ip(domain: Any, macs: Iterable[str]) -> Optional[str]:
    """The domain's IP, or None when no source knows one yet."""
    wanted = {mac.lower() for mac in macs}
    for source in _sources():
        try:
            interfaces = domain.interfaceAddresses(source, 0) or {}
        except libvirt.libvirtError:
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
