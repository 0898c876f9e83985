"""squid_networks.py: the refused networks and the arithmetic that writes them as squid ACLs.

Squid keeps src/dst ACLs in a splay tree and ignores an entry that overlaps one already there
(the larger one too), so every list must be free of overlaps; and an IPv6 entry covering
``::ffff:0:0/96`` would match every IPv4 address. Both are checked here for what the policy
renders; the effect through squid is tests/integration/test_squid_access.py's.
"""

from __future__ import annotations

import ipaddress
import itertools
import random

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils import squid_networks as nets


def disjoint(networks: list[nets.Network]) -> bool:
    return not any(a.version == b.version and a.overlaps(b) for a, b in itertools.combinations(networks, 2))


def contains(networks: list[nets.Network], address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip.version == n.version and ip in n for n in networks)


ALLOWED = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "fd00::/8", "192.0.2.7/32")]


def test_the_complement_is_exactly_what_is_not_allowed() -> None:
    foreign = nets.complement(ALLOWED)
    assert disjoint(foreign)
    samples = ["10.1.2.3", "172.31.255.255", "172.32.0.0", "192.0.2.7", "192.0.2.8", "0.0.0.0", "255.255.255.255",
               "127.0.0.1", "fd12::1", "fe80::1", "2001:db8::1", "::1", "ffff::"]
    rng = random.Random(26)
    samples += [str(ipaddress.IPv4Address(rng.getrandbits(32))) for _ in range(300)]
    samples += [str(ipaddress.IPv6Address(rng.getrandbits(128))) for _ in range(300)]
    for address in samples:
        assert contains(foreign, address) is not contains(ALLOWED, address), address


def test_the_complement_never_covers_the_ipv4_mapped_block() -> None:
    """squid keeps an IPv4 client as ::ffff:a.b.c.d: an IPv6 entry over that block would refuse
    every IPv4 client, the allowed ones included."""
    assert not any(n.overlaps(nets.IPV4_MAPPED) for n in nets.complement(ALLOWED) if n.version == 6)
    assert not any(n.overlaps(nets.IPV4_MAPPED) for n in nets.complement([]) if n.version == 6)
    assert nets.complement([ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]) == []


def test_nat64_embeds_each_ipv4_network() -> None:
    assert nets.nat64([ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("10.0.0.0/8"),
                       ipaddress.ip_network("fd00::/8")]) == [
        ipaddress.ip_network("64:ff9b::a9fe:a9fe/128"), ipaddress.ip_network("64:ff9b::a00:0/104")]


def test_never_holds_loopback_metadata_and_their_nat64_forms_without_overlaps() -> None:
    never = nets.never()
    assert disjoint(never)
    for address in ("127.0.0.1", "0.0.0.0", "::1", "::", "169.254.169.254", "fd20:ce::254", "fd00:ec2::254",
                    "100.100.100.200", "168.63.129.16", "fe80::a9fe:a9fe", "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1"):
        assert contains(never, address), address
    assert not contains(never, "169.254.1.1")  # link-local, but not metadata: internal, openable


@pytest.mark.parametrize(("opened", "still_closed", "now_open"), [
    ([], ["10.99.0.5", "192.168.1.1", "fd00::1", "fe80::1", "100.64.0.1", "64:ff9b::a63:5", "240.0.0.1"], []),
    (["10.99.0.0/16"], ["10.98.0.1", "10.100.0.1", "64:ff9b::a62:1"], ["10.99.0.5", "64:ff9b::a63:5"]),
    (["0.0.0.0/0"], ["fd00::1"], ["10.0.0.1", "169.254.1.1"]),
])
def test_closed_is_the_internal_networks_without_the_opened(opened: list[str], still_closed: list[str],
                                                           now_open: list[str]) -> None:
    closed = nets.closed([ipaddress.ip_network(n) for n in opened])
    assert disjoint(closed)
    for address in still_closed:
        assert contains(closed, address), address
    for address in now_open:
        assert not contains(closed, address), address


def test_the_lists_are_documented_networks() -> None:
    for table in (nets.METADATA, nets.LOOPBACK, nets.INTERNAL):
        for cidr, why in table:
            assert str(ipaddress.ip_network(cidr)) == cidr and why


def test_acl_lines_split_long_lists() -> None:
    assert nets.acl_lines("a", "port", ["1", "2", "3"], per_line=2) == ["acl a port 1 2", "acl a port 3"]
