# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's libvirt network as the provider uses it (docs/kvm-provider.md, "Networking").

- Its forward mode is checked against the host's ``networkMode`` before anything is made there.
- On a host that publishes proxies or gives them source addresses, the host's hook
  (roles/kvm_hypervisor) forwards to and translates for each guest by address, when the domain
  starts. So each guest gets an address reserved for its MAC in the network's DHCP (a ``<host>``
  entry named after the domain: libvirt refuses a second entry with the same MAC, name or
  address, which makes the reservation atomic across runs and controllers), a published port
  and a source address, all recorded in the domain's metadata (``domain_xml.GuestNetwork``).
- Ports and source addresses are unique per hypervisor, whichever controller made the domain:
  each run picks from what the domains' metadata shows free, defines its domain, and reads the
  metadata again; a domain that finds another with the same port or address picks again (the
  later of two always sees the earlier one, so at least one of any colliding pair moves). A
  delete frees them with the domain, and its reservation with it.
"""

from __future__ import annotations

import ipaddress
import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlsplit

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, ProxyError, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    add_dhcp_host,
    delete_dhcp_host,
    find_network,
    network_leases,
    network_xml,
    undefine_domain,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import DomainInfo, GuestNetwork
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost

ISOLATED = "isolated"  # a network without <forward>
# Which libvirt forward modes serve each networkMode. An isolated network is what a nat host
# was before the mode existed (guests dialled at their own address, from the host only); it
# cannot publish or translate, so it serves nat only without those.
SERVES = {"nat": ("nat", ISOLATED), "route": ("route",), "bridge": ("bridge",)}
# How often a run picks again after finding its port or address taken by a domain defined at the
# same time by another run, before it gives up (transient: the next attempt starts afresh).
CLAIM_ATTEMPTS = 6
RESERVE_ATTEMPTS = 8


@dataclass(frozen=True)
class Reservation:
    mac: str
    name: str
    address: str

    def xml(self) -> str:
        element = ET.Element("host", mac=self.mac, name=self.name, ip=self.address)
        return ET.tostring(element, encoding="unicode")


@dataclass(frozen=True)
class NetworkFacts:
    """What the provider needs of a libvirt network's XML."""

    name: str
    forward_mode: str
    bridge_address: Optional[str] = None
    dhcp_range: Optional[Tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]] = None
    reservations: Tuple[Reservation, ...] = ()

    def reservation(self, name: str) -> Optional[Reservation]:
        return next((r for r in self.reservations if r.name == name), None)


def parse_network_xml(xml: str) -> NetworkFacts:
    root = ET.fromstring(xml)
    forward = root.find("forward")
    # <forward/> without a mode is libvirt's default, nat.
    mode = ISOLATED if forward is None else forward.get("mode", "nat")
    ipv4 = next((ip for ip in root.findall("ip") if ip.get("family", "ipv4") == "ipv4"), None)
    if ipv4 is None:
        return NetworkFacts(name=root.findtext("name") or "", forward_mode=mode)
    dhcp_range = None
    found = ipv4.find("dhcp/range")
    if found is not None:
        dhcp_range = (ipaddress.IPv4Address(found.get("start", "")), ipaddress.IPv4Address(found.get("end", "")))
    reservations = tuple(Reservation(mac=h.get("mac", "").lower(), name=h.get("name", ""), address=h.get("ip", ""))
                         for h in ipv4.findall("dhcp/host"))
    return NetworkFacts(name=root.findtext("name") or "", forward_mode=mode, bridge_address=ipv4.get("address"),
                        dhcp_range=dhcp_range, reservations=reservations)


def lookup_network(connection: Any, host: KvmHost, name: Optional[str] = None) -> Optional[Any]:
    """The libvirt network ``name`` (default: the host's), or None when it does not exist."""
    return find_network(connection, name or host.network, "network %r on host %s" % (name or host.network, host.name))


def network_facts(network: Any, host: KvmHost) -> NetworkFacts:
    return parse_network_xml(network_xml(network, "reading network %r on host %s" % (network.name(), host.name)))


def check_mode(host: KvmHost, facts: NetworkFacts) -> None:
    """Permanent, naming ``networkMode``, when the host's network cannot do what its config says."""
    mode = host.networking.mode
    served = SERVES[mode]
    if host.networking.fixes_guest_addresses:
        served = ("nat",)
    if facts.forward_mode in served:
        return
    needs = " with publishPorts or sourceAddresses" if host.networking.fixes_guest_addresses else ""
    live = "is isolated (no <forward>)" if facts.forward_mode == ISOLATED else "forwards in mode %r" % (
        facts.forward_mode)
    raise Permanent(
        "%s: %r%s needs a libvirt network in forward mode %s, but the network %r on host %s %s; set networkMode to "
        "what the network is, or name in %s a network the kvm_hypervisor role defined with "
        "kvm_hypervisor_network_forward_mode %s" % (
            host.at("networkMode"), mode, needs, " or ".join(repr(m) for m in served if m != ISOLATED),
            facts.name, host.name, live, host.at("network"), mode))


def host_addresses(connection: Any, host: KvmHost) -> Tuple[str, ...]:
    """The hypervisor's addresses this provider knows, which its guests' squid refuses (issue 38):
    its ``publicAddress``, its ``sourceAddresses``, its address on the guests' network (the
    network's ``<ip>``: nat and route) and the address its URI names, when it names one. The
    host's other addresses are the role's: its hook drops guest traffic to every host address
    but the bridge's (roles/kvm_hypervisor, "defence in depth")."""
    network = lookup_network(connection, host)
    bridge = network_facts(network, host).bridge_address if network is not None else None
    candidates = [host.networking.public_address, *host.networking.source_addresses, bridge,
                  urlsplit(host.uri).hostname]
    return tuple(dict.fromkeys(address for address in candidates if address and _is_address(address)))


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False  # a host name: not resolved here (the guest's squid would resolve it anew anyway)
    return True


# --- guest addresses: reserved in the network's DHCP ------------------------------------------


def _leased(network: Any) -> Set[str]:
    # None from a driver without leases (libvirt's test driver): the reservations say enough.
    return {lease["ipaddr"] for lease in network_leases(network) or [] if lease.get("ipaddr")}


def _free_addresses(facts: NetworkFacts, leased: Set[str]) -> List[str]:
    if facts.dhcp_range is None:
        return []
    taken = {r.address for r in facts.reservations} | leased | {facts.bridge_address or ""}
    first, last = (int(a) for a in facts.dhcp_range)
    return [str(ipaddress.IPv4Address(n)) for n in range(first, last + 1)
            if str(ipaddress.IPv4Address(n)) not in taken]


def reserve_address(network: Any, host: KvmHost, name: str) -> Reservation:
    """The address reserved for domain ``name`` on ``network``: its existing reservation (a create
    repeated after a crash), else the first free one of the DHCP range, for a new MAC."""
    failed: Set[str] = set()
    for _attempt in range(RESERVE_ATTEMPTS):
        facts = network_facts(network, host)
        existing = facts.reservation(name)
        if existing is not None:
            return existing
        free = [a for a in _free_addresses(facts, _leased(network)) if a not in failed]
        if not free:
            raise Permanent(
                "%s: no address left to reserve in the DHCP range of the network %r on host %s (each proxy that is "
                "published or has a source address holds one); widen the range with the kvm_hypervisor role or "
                "delete proxies" % (host.at("network"), facts.name, host.name))
        host_part = random.randrange(1 << 24)  # a MAC in QEMU's locally administered 52:54:00 prefix
        wanted = Reservation(mac="52:54:00:%02x:%02x:%02x" % (host_part >> 16, (host_part >> 8) & 255, host_part & 255),
                             name=name, address=free[0])
        if add_dhcp_host(network, wanted.xml(), "reserving %s on network %r of host %s" % (
                wanted.address, facts.name, host.name)):
            return wanted
        failed.add(wanted.address)  # taken meanwhile by another run: read again, take the next
    raise Transient("reserving an address on network %r of host %s: every try was taken by another run at the "
                    "same time; the next attempt starts afresh" % (host.network, host.name))


def release_address(connection: Any, host: KvmHost, name: str, network_name: Optional[str]) -> bool:
    """Remove domain ``name``'s reservation, if there is one. True when one was removed."""
    network = lookup_network(connection, host, network_name)
    if network is None:
        return False
    reservation = network_facts(network, host).reservation(name)
    if reservation is None:
        return False
    delete_dhcp_host(network, reservation.xml(), "removing the reservation of %s on network %r of host %s" % (
        name, network.name(), host.name))
    return True


# --- published ports and source addresses: unique per hypervisor -------------------------------


def _taken(recorded: Iterable[DomainInfo], name: str) -> Tuple[Set[Tuple[str, int]], Set[str]]:
    """The published (address, port) pairs and source addresses other domains hold."""
    ports: Set[Tuple[str, int]] = set()
    sources: Set[str] = set()
    for info in recorded:
        if info.name == name or info.guest_network is None:
            continue
        if info.published is not None:
            ports.add(info.published)
        if info.guest_network.source_address is not None:
            sources.add(info.guest_network.source_address)
    return ports, sources


def collides(guest: GuestNetwork, recorded: Iterable[DomainInfo], name: str) -> bool:
    """Whether another domain holds ``guest``'s published port or source address."""
    ports, sources = _taken(recorded, name)
    published = (guest.published_address, guest.published_port)
    return published in ports or (guest.source_address is not None and guest.source_address in sources)


def choose(host: KvmHost, reservation: Reservation, recorded: Sequence[DomainInfo], name: str,
           pick: Callable[[Sequence[Any]], Any] = lambda free: free[0]) -> GuestNetwork:
    """A published port and a source address no other domain holds, for ``reservation``'s guest.
    ``pick`` takes one of the free ones (the lowest at first; at random after a collision)."""
    ports, sources = _taken(recorded, name)
    networking = host.networking
    published_address, port = networking.public_address, None
    if networking.publish_ports is not None and published_address is not None:
        first, last = networking.publish_ports
        free_ports = [p for p in range(first, last + 1) if (published_address, p) not in ports]
        if not free_ports:
            raise Permanent(
                "%s: every port of %d-%d on %s is published already (%d proxies on host %s's hypervisor); widen "
                "the range here and in the role's kvm_hypervisor_publish_ports, or delete proxies" % (
                    host.at("publishPorts"), first, last, published_address, last - first + 1, host.name))
        port = pick(free_ports)
    source = None
    if networking.source_addresses:
        free_sources = [a for a in networking.source_addresses if a not in sources]
        if not free_sources:
            raise Permanent(
                "%s: every one of the %d source addresses is held by a proxy on host %s's hypervisor; add addresses "
                "here and in the role's kvm_hypervisor_source_addresses, or delete proxies" % (
                    host.at("sourceAddresses"), len(networking.source_addresses), host.name))
        source = pick(free_sources)
    return GuestNetwork(address=reservation.address, mac=reservation.mac,
                        published_address=published_address if port is not None else None,
                        published_port=port, source_address=source)


def claim(host: KvmHost, reservation: Reservation, name: str, recorded: Callable[[], List[DomainInfo]],
          define: Callable[[GuestNetwork], Any]) -> Tuple[Any, GuestNetwork]:
    """Define domain ``name`` with a port and source address of its own: defined, then checked
    against every other domain of the hypervisor, and undefined and defined anew with others while
    another domain holds them. Returns the domain and what it holds; on failure nothing of it is
    left defined."""
    guest = choose(host, reservation, recorded(), name)
    for _attempt in range(CLAIM_ATTEMPTS):
        domain = define(guest)
        try:
            others = recorded()
        except ProxyError:
            _undefine(domain, host, name)
            raise
        if not collides(guest, others, name):
            return domain, guest
        # Undefined, not redefined: libvirt refuses a definition of an existing name that does not
        # carry its UUID, and a domain left defined with a taken port would be started as it is
        # by the next attempt (it finds the domain and only starts it).
        _undefine(domain, host, name)
        guest = choose(host, reservation, others, name, pick=random.choice)
    raise Transient("host %s: the published port or source address of %s was taken by another run every time; "
                    "the next attempt starts afresh" % (host.name, name))


def _undefine(domain: Any, host: KvmHost, name: str) -> None:
    """Undefine a domain ``claim`` defined and never started."""
    undefine_domain(domain, "undefining domain %s on host %s" % (name, host.name))
