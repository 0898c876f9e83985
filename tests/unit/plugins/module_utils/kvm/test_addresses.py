"""A domain's IP: agent, then leases, then ARP; matched on the domain's MACs; no loopback or link-local.
In a listing, each network's leases once per host, and only the domains they do not cover asked
on their own (agent, then ARP)."""

from __future__ import annotations

from typing import Any

import libvirt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.addresses import (
    domain_ip,
    leased_addresses,
    listed_ip,
    usable_address,
)

AGENT = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT
LEASE = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE
ARP = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP
MAC = "52:54:00:ab:cd:ef"


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        pytest.param([], None, id="nothing"),
        pytest.param(["192.0.2.10"], "192.0.2.10", id="ipv4"),
        pytest.param(["127.0.0.1", "192.0.2.10"], "192.0.2.10", id="skips-v4-loopback"),
        pytest.param(["::1", "2001:db8::10"], "2001:db8::10", id="skips-v6-loopback"),
        pytest.param(["169.254.1.1", "192.0.2.10"], "192.0.2.10", id="skips-v4-link-local"),
        pytest.param(["fe80::5054:ff:feab:cdef", "2001:db8::10"], "2001:db8::10", id="skips-v6-link-local"),
        pytest.param(["fe80::5054:ff:feab:cdef%eth0"], None, id="skips-scoped-link-local"),
        pytest.param(["febf::1"], None, id="skips-top-of-fe80-10"),
        pytest.param(["fec0::1", "2001:db8::1"], "fec0::1", id="fec0-is-outside-fe80-10"),
        pytest.param(["2001:db8::10", "192.0.2.10"], "192.0.2.10", id="prefers-ipv4"),
        pytest.param(["2001:db8::10", "10.0.0.5", "192.0.2.10"], "10.0.0.5", id="first-ipv4-wins"),
        pytest.param(["127.0.0.1", "169.254.0.5", "::1", "fe80::1"], None, id="only-unusable"),
        pytest.param(["0.0.0.0", "224.0.0.1", "not-an-ip", ""], None, id="unspecified-multicast-garbage"),
    ],
)
def test_usable_address(candidates: list[str], expected: str | None) -> None:
    assert usable_address(candidates) == expected


class FakeDomain:
    """Answers interfaceAddresses(source, 0) per source as libvirt does: a dict, or an error."""

    def __init__(self, answers: dict[int, dict[str, Any] | libvirt.libvirtError]) -> None:
        self.answers = answers
        self.asked: list[int] = []

    def interfaceAddresses(self, source: int, flags: int) -> dict[str, Any] | None:
        assert flags == 0
        self.asked.append(source)
        answer = self.answers.get(source)
        if isinstance(answer, libvirt.libvirtError):
            raise answer
        return answer


def interface(mac: str | None, *addresses: str) -> dict[str, Any]:
    return {"hwaddr": mac, "addrs": [{"addr": a, "prefix": 24, "type": 0} for a in addresses]}


def agent_unavailable() -> libvirt.libvirtError:
    error = libvirt.libvirtError("Guest agent is not responding: QEMU guest agent is not connected")
    error.err = (libvirt.VIR_ERR_AGENT_UNRESPONSIVE, libvirt.VIR_FROM_QEMU, str(error), libvirt.VIR_ERR_ERROR,
                 None, None, None, -1, -1)
    return error


def test_the_agent_answer_wins() -> None:
    domain = FakeDomain({
        AGENT: {"lo": interface("00:00:00:00:00:00", "127.0.0.1", "::1"), "eth0": interface(MAC, "192.0.2.10")},
        LEASE: {"vnet0": interface(MAC, "192.0.2.99")},
    })
    assert domain_ip(domain, [MAC]) == "192.0.2.10"
    assert domain.asked == [AGENT]


def test_an_agent_error_falls_back_to_the_lease() -> None:
    domain = FakeDomain({AGENT: agent_unavailable(), LEASE: {"vnet0": interface(MAC, "192.0.2.20")}})
    assert domain_ip(domain, [MAC]) == "192.0.2.20"
    assert domain.asked == [AGENT, LEASE]


def test_an_agent_with_only_link_local_falls_back_to_arp() -> None:
    domain = FakeDomain({
        AGENT: {"eth0": interface(MAC, "fe80::5054:ff:feab:cdef")},
        LEASE: {},
        ARP: {"vnet0": interface(MAC, "192.0.2.30")},
    })
    assert domain_ip(domain, [MAC]) == "192.0.2.30"
    assert domain.asked == [AGENT, LEASE, ARP]


def test_addresses_of_other_macs_are_ignored() -> None:
    domain = FakeDomain({
        AGENT: {"docker0": interface("02:42:00:00:00:01", "172.17.0.1"), "eth0": interface(MAC, "192.0.2.10")},
        LEASE: {"vnet9": interface("52:54:00:99:99:99", "192.0.2.99")},
    })
    assert domain_ip(domain, [MAC]) == "192.0.2.10"


def test_only_foreign_macs_means_no_ip() -> None:
    domain = FakeDomain({
        AGENT: {"docker0": interface("02:42:00:00:00:01", "172.17.0.1")},
        LEASE: {"vnet9": interface("52:54:00:99:99:99", "192.0.2.99")},
        ARP: {"vnet9": interface(None, "192.0.2.98")},
    })
    assert domain_ip(domain, [MAC]) is None
    assert domain.asked == [AGENT, LEASE, ARP]


def test_macs_match_case_insensitively() -> None:
    domain = FakeDomain({AGENT: {"eth0": interface(MAC.upper(), "192.0.2.10")}})
    assert domain_ip(domain, [MAC]) == "192.0.2.10"
    domain = FakeDomain({AGENT: {"eth0": interface(MAC, "192.0.2.10")}})
    assert domain_ip(domain, [MAC.upper()]) == "192.0.2.10"


def test_every_source_failing_means_no_ip_yet() -> None:
    domain = FakeDomain({AGENT: agent_unavailable(), LEASE: agent_unavailable(), ARP: None})
    assert domain_ip(domain, [MAC]) is None


def test_a_second_nic_is_used_when_the_first_has_no_address() -> None:
    second = "52:54:00:00:00:02"
    domain = FakeDomain({LEASE: {"vnet0": interface(MAC), "vnet1": interface(second, "192.0.2.40")},
                         AGENT: agent_unavailable()})
    assert domain_ip(domain, [MAC, second]) == "192.0.2.40"


def test_interfaces_without_addresses_are_tolerated() -> None:
    domain = FakeDomain({AGENT: {"eth0": {"hwaddr": MAC, "addrs": None}, "eth1": {"hwaddr": MAC}},
                         LEASE: {"vnet0": {"hwaddr": MAC, "addrs": [{"addr": None}, {"addr": "192.0.2.50"}]}}})
    assert domain_ip(domain, [MAC]) == "192.0.2.50"


def unsupported() -> libvirt.libvirtError:
    error = libvirt.libvirtError("this function is not supported by the connection driver: virNetworkGetDHCPLeases")
    error.err = (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_FROM_NETWORK, str(error), libvirt.VIR_ERR_ERROR,
                 None, None, None, -1, -1)
    return error


class FakeNetwork:
    def __init__(self, leases: list[dict[str, Any]] | libvirt.libvirtError) -> None:
        self.leases = leases
        self.calls = 0

    def DHCPLeases(self) -> list[dict[str, Any]]:
        self.calls += 1
        if isinstance(self.leases, libvirt.libvirtError):
            raise self.leases
        return self.leases


class FakeConnection:
    """Answers networkLookupByName as libvirt does: the network, or VIR_ERR_NO_NETWORK."""

    def __init__(self, networks: dict[str, FakeNetwork]) -> None:
        self.networks = networks
        self.looked_up: list[str] = []

    def networkLookupByName(self, name: str) -> FakeNetwork:
        self.looked_up.append(name)
        if name not in self.networks:
            error = libvirt.libvirtError(f"Network not found: no network with matching name '{name}'")
            error.err = (libvirt.VIR_ERR_NO_NETWORK, libvirt.VIR_FROM_NETWORK, str(error), libvirt.VIR_ERR_ERROR,
                         None, None, None, -1, -1)
            raise error
        return self.networks[name]


def lease(mac: str | None, address: str) -> dict[str, Any]:
    """One entry of virNetworkGetDHCPLeases, as the Python binding returns it."""
    return {"iface": "virbr0", "expirytime": 1767225600, "type": 0, "mac": mac, "iaid": None, "ipaddr": address,
            "prefix": 24, "hostname": None, "clientid": None}


def test_each_network_is_asked_once_for_every_lease_on_it() -> None:
    default = FakeNetwork([lease(MAC.upper(), "192.0.2.10"), lease(MAC, "2001:db8::10"),
                           lease("52:54:00:00:00:02", "192.0.2.11"), lease(None, "2001:db8::99")])
    proxies = FakeNetwork([lease("52:54:00:00:00:03", "192.0.2.12")])
    connection = FakeConnection({"default": default, "proxies": proxies})
    leases = leased_addresses(connection, ["default", "proxies", "default", "default"])
    assert connection.looked_up == ["default", "proxies"] and default.calls == 1
    assert leases == {MAC: ["192.0.2.10", "2001:db8::10"], "52:54:00:00:00:02": ["192.0.2.11"],
                      "52:54:00:00:00:03": ["192.0.2.12"]}


def test_a_network_without_leases_adds_nothing() -> None:
    """Not defined on the host, or a driver without lease support (libvirt's test driver): its
    domains are asked one by one instead; the listing does not fail."""
    connection = FakeConnection({"default": FakeNetwork(unsupported())})
    assert leased_addresses(connection, ["default", "gone"]) == {}


def test_a_leased_domain_is_not_asked() -> None:
    domain = FakeDomain({AGENT: {"eth0": interface(MAC, "192.0.2.99")}})
    leases = {MAC: ["2001:db8::10", "192.0.2.10"], "52:54:00:00:00:02": ["192.0.2.11"]}
    assert listed_ip(domain, [MAC.upper()], leases) == "192.0.2.10"
    assert domain.asked == []


def test_a_domain_no_lease_covers_is_asked_agent_then_arp_never_its_leases_again() -> None:
    domain = FakeDomain({AGENT: agent_unavailable(), LEASE: {"vnet0": interface(MAC, "192.0.2.99")},
                         ARP: {"vnet0": interface(MAC, "192.0.2.30")}})
    assert listed_ip(domain, [MAC], {"52:54:00:00:00:02": ["192.0.2.11"]}) == "192.0.2.30"
    assert domain.asked == [AGENT, ARP]


def test_a_lease_with_only_unusable_addresses_is_no_answer() -> None:
    domain = FakeDomain({AGENT: {"eth0": interface(MAC, "192.0.2.10")}})
    assert listed_ip(domain, [MAC], {MAC: ["169.254.3.3", "fe80::1"]}) == "192.0.2.10"
    assert domain.asked == [AGENT]
