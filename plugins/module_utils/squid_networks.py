# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The networks a proxy refuses as destinations, and the set arithmetic behind its ACLs.

Three lists, each network with the reason it is there (docs/architecture.md, "Security model"):

- :data:`METADATA`: every cloud's instance metadata and credential endpoints, in one list;
- :data:`LOOPBACK`: loopback, unspecified and IPv4-compatible addresses (this host);
- :data:`INTERNAL`: private, shared, unique-local and link-local networks.

The first two, the instance's own addresses and the addresses of the machine it runs on (the
hypervisor's, the node's: :func:`host_networks`) are refused whatever an operator opens;
:data:`INTERNAL` is refused unless opened (``allowed_destinations``). Each IPv4 network is refused
in its NAT64 form too (``64:ff9b::/96``, RFC 6052), which a NAT64 gateway translates back.

Squid keeps every address as IPv6, an IPv4 one as IPv4-mapped (``::ffff:a.b.c.d``): an IPv4 ACL
entry matches both spellings (measured with squid 5.7), and an IPv6 entry that covers
``::ffff:0:0/96`` (such as ``::/0``) would match every IPv4 address too, so :func:`complement`
never emits one.

Every list is rendered as what is *refused* (complements where the option says what is allowed),
because squid appends the values of an ``acl`` line to an earlier one of the same name and type:
written this way, such a line in a user's configuration can only refuse more. And every list is
collapsed, no two entries overlapping: squid 5.7 keeps an ``src``/``dst`` ACL in a splay tree
and *ignores* an entry that overlaps one already in it, the larger one included ("WARNING: ...
is a subnetwork of ... is ignored", measured), so an entry of ours inside an earlier one of ours
would be lost, and a later line of a user's never displaces one of ours.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, List, Sequence, Tuple, Union

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

# Private, CGNAT and unique-local networks: where crawlers may connect from when nothing says
# otherwise (config.DEFAULT_ALLOWED_SOURCES), and what is *not* a public address for a provider
# deciding whether its endpoints are public (they must then name their sources).
PRIVATE_SOURCES: Tuple[str, ...] = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")


def is_public(address: str) -> bool:
    """Whether ``address`` lies outside ``PRIVATE_SOURCES`` (a client there is on the internet)."""
    return not any(ipaddress.ip_address(address) in ipaddress.ip_network(network) for network in PRIVATE_SOURCES)


# (network, whose): the metadata and credential endpoints of instances and Pods.
METADATA: Tuple[Tuple[str, str], ...] = (
    ("169.254.169.254/32", "AWS, GCP, Azure, OpenStack, Oracle, IBM, DigitalOcean, Hetzner"),
    ("169.254.170.2/32", "AWS ECS task credentials"),
    ("169.254.170.23/32", "AWS EKS Pod Identity"),
    ("100.100.100.200/32", "Alibaba Cloud"),
    ("168.63.129.16/32", "Azure host endpoint (WireServer)"),
    ("fd00:ec2::254/128", "AWS IPv6"),
    ("fd00:ec2::23/128", "AWS EKS Pod Identity IPv6"),
    ("fd20:ce::254/128", "GCP IPv6"),
    ("fe80::a9fe:a9fe/128", "OpenStack IPv6"),
)
LOOPBACK: Tuple[Tuple[str, str], ...] = (
    ("127.0.0.0/8", "loopback"),
    ("0.0.0.0/8", "this host (0.0.0.0 reaches it)"),
    ("::/96", "loopback ::1, unspecified :: and IPv4-compatible (deprecated, RFC 4291)"),
)
INTERNAL: Tuple[Tuple[str, str], ...] = (
    ("10.0.0.0/8", "RFC 1918"),
    ("172.16.0.0/12", "RFC 1918"),
    ("192.168.0.0/16", "RFC 1918"),
    ("100.64.0.0/10", "shared address space (RFC 6598, carrier-grade NAT)"),
    ("169.254.0.0/16", "link-local"),
    ("192.0.0.0/24", "IETF protocol assignments (DS-Lite, NAT64 discovery)"),
    ("198.18.0.0/15", "benchmarking, used as private space"),
    ("240.0.0.0/4", "reserved, used as private space (GKE class E ranges)"),
    ("fc00::/7", "unique local (RFC 4193)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated, still routed on some networks)"),
    ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_EVERY_IPV4 = ipaddress.IPv4Network("0.0.0.0/0")
_EVERY_IPV6 = ipaddress.IPv6Network("::/0")


def networks(table: Iterable[Tuple[str, str]]) -> List[Network]:
    return [ipaddress.ip_network(cidr) for cidr, _why in table]


def overlaps_internal(network: str) -> bool:
    """Whether ``network`` (a CIDR or an address) overlaps the internal or loopback networks: some
    client there may be inside (a Pod, the controller), not on the internet."""
    parsed = ipaddress.ip_network(network, strict=False)
    return any(parsed.overlaps(internal) for internal in networks(INTERNAL + LOOPBACK)
               if internal.version == parsed.version)


def within_internal(network: str) -> bool:
    """Whether ``network`` lies wholly inside one internal or loopback network: no client there is
    on the internet (so none reaches a public address)."""
    parsed = ipaddress.ip_network(network, strict=False)
    return any(parsed.subnet_of(internal) for internal in networks(INTERNAL + LOOPBACK)  # type: ignore[arg-type]
               if internal.version == parsed.version)


def nat64(nets: Iterable[Network]) -> List[Network]:
    """The NAT64 (``64:ff9b::/96``) form of each IPv4 network."""
    base = int(NAT64.network_address)
    return [ipaddress.IPv6Network((base + int(net.network_address), 96 + net.prefixlen))
            for net in nets if isinstance(net, ipaddress.IPv4Network)]


def subtract(nets: Iterable[Network], removed: Iterable[Network]) -> List[Network]:
    """``nets`` without the addresses of ``removed``, collapsed, IPv4 first."""
    remaining = list(nets)
    for cut in removed:
        kept: List[Network] = []
        for net in remaining:
            if net.version != cut.version or not net.overlaps(cut):
                kept.append(net)
            elif not net.subnet_of(cut):  # type: ignore[arg-type]  # same version, checked above
                kept.extend(net.address_exclude(cut))  # type: ignore[arg-type]
        remaining = kept
    return _collapsed(remaining)


def complement(allowed: Sequence[Network]) -> List[Network]:
    """Every address not in ``allowed``: IPv4, and IPv6 outside the IPv4-mapped block."""
    return subtract([_EVERY_IPV4, _EVERY_IPV6], [*allowed, IPV4_MAPPED])


def _collapsed(nets: Iterable[Network]) -> List[Network]:
    v4 = [net for net in nets if isinstance(net, ipaddress.IPv4Network)]
    v6 = [net for net in nets if isinstance(net, ipaddress.IPv6Network)]
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def never() -> List[Network]:
    """Refused whatever is opened: loopback, metadata and their NAT64 forms (the instance's own
    addresses join them where it runs)."""
    fixed = networks(LOOPBACK) + networks(METADATA)
    return _collapsed(fixed + nat64(fixed))


def host_networks(addresses: Iterable[str]) -> List[Network]:
    """The addresses of the machine a proxy runs on (the provider knows them: a KVM hypervisor's
    public, source and bridge addresses, a node's addresses, a GCP instance's external address),
    each as a single-address network, collapsed, with the NAT64 forms of the IPv4 ones."""
    hosts = [ipaddress.ip_network(address) for address in addresses]
    return _collapsed(hosts + nat64(hosts))


def closed(opened: Sequence[Network]) -> List[Network]:
    """The internal networks (and their NAT64 forms) that ``opened`` leaves refused."""
    internal = networks(INTERNAL)
    return subtract(internal + nat64(internal), [*opened, *nat64(opened)])


def acl_lines(name: str, acl_type: str, values: Sequence[object], per_line: int = 8) -> List[str]:
    """``acl name type v1 v2 ...`` in lines of ``per_line`` values (squid appends them all)."""
    return ["acl %s %s %s" % (name, acl_type, " ".join(str(v) for v in values[i:i + per_line]))
            for i in range(0, len(values), per_line)]
