"""KVM host networking through the modules against libvirt's test driver (served by a libvirtd):
published ports and source addresses allocated, recorded on the domain, read back, freed; the
endpoint a crawler dials; a host's networking mistakes failing that host's proxies only.

The hook that acts on the recorded metadata is tested for real in
tests/integration/test_kvm_hook_netns.py; the test driver's addresses are made up and never dialled.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import load_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import (
    DomainInfo,
    DomainSpec,
    GuestNetwork,
    build_domain_xml,
    parse_domain_xml,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.networking import (
    CLAIM_ATTEMPTS,
    Reservation,
    claim,
    host_addresses,
)
from support.collection.modules import ModuleRun, run_module
from support.collection.provider_config import OWNER_TAGS, BaseImage, kvm_host, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

POOL = "default-pool"  # the test driver's built-in pool
PUBLIC = "203.0.113.10"  # documentation addresses: written into metadata, never contacted
SOURCES = ["203.0.113.21", "203.0.113.22"]


# The crawlers' networks: a host publishing on a public address needs them named (issue 39).
CRAWLERS = ["198.51.100.0/24"]


def write_config(path: Path, hosts: list[dict[str, Any]], image: BaseImage, **overrides: Any) -> Path:
    return write_kvm_config(path, hosts, image, allowed_sources=CRAWLERS, **overrides)


def published_host(name: str, uri: str, **overrides: Any) -> dict[str, Any]:
    return {**kvm_host(name, uri, pool=POOL), "networkMode": "nat", "publicAddress": PUBLIC,
            "publishPorts": "40000-40002", "sourceAddresses": SOURCES, **overrides}


def proxy(config: Path, tmp_path: Path, **args: Any) -> ModuleRun:
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache"),
            "tags": OWNER_TAGS}
    return run_module("kvm_proxy", {**base, **args})


def listed(config: Path) -> dict[str, dict[str, Any]]:
    found = run_module("kvm_proxy_info", {"provider_config": str(config), "provider": "lab", "tags": OWNER_TAGS})
    assert found.status == "successful", found.result
    return {i["name"]: i for i in found.result["instances"]}


def reservations(daemon: LibvirtTestDaemon) -> dict[str, str]:
    xml = daemon.connection.networkLookupByName("default").XMLDesc(0)
    return {h.get("name", ""): h.get("ip", "") for h in ET.fromstring(xml).findall("ip/dhcp/host")}


def test_published_proxies_get_ports_and_sources_of_their_own(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                              image: BaseImage) -> None:
    config = write_config(tmp_path / "providers.yaml", [published_host("h1", libvirt_test.uri)], image)
    first = proxy(config, tmp_path, name="p-0").result["instance"]
    second = proxy(config, tmp_path, name="p-1").result["instance"]
    assert first["endpoint"] == f"{PUBLIC}:40000" and second["endpoint"] == f"{PUBLIC}:40001"
    # The instance's own address stays its own: the reserved one, not the host's.
    booked = reservations(libvirt_test)
    assert set(booked) == {"p-0", "p-1"} and len(set(booked.values())) == 2
    xml = libvirt_test.connection.lookupByName("p-0").XMLDesc(0)
    assert f"address='{PUBLIC}' port='40000'" in xml.replace('"', "'")
    assert f"<egress:source address='{SOURCES[0]}'" in xml.replace('"', "'")
    assert f"address='{SOURCES[1]}'" in libvirt_test.connection.lookupByName("p-1").XMLDesc(0).replace('"', "'")

    # A repeated create gets the same port; listing reads the endpoints back from the metadata.
    again = proxy(config, tmp_path, name="p-0")
    assert again.result["changed"] is False and again.result["instance"]["endpoint"] == f"{PUBLIC}:40000"
    assert {n: i["endpoint"] for n, i in listed(config).items()} == {
        "p-0": f"{PUBLIC}:40000", "p-1": f"{PUBLIC}:40001"}

    # Delete frees port, source address and reservation: the next proxy gets them.
    deleted = proxy(config, tmp_path, state="absent", provider_id=first["provider_id"])
    assert deleted.result["changed"] is True
    assert set(reservations(libvirt_test)) == {"p-1"}
    third = proxy(config, tmp_path, name="p-2").result["instance"]
    assert third["endpoint"] == f"{PUBLIC}:40000"
    assert f"address='{SOURCES[0]}'" in libvirt_test.connection.lookupByName("p-2").XMLDesc(0).replace('"', "'")


def test_an_exhausted_source_list_fails_that_proxy_only(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                        image: BaseImage) -> None:
    config = write_config(tmp_path / "providers.yaml", [published_host("h1", libvirt_test.uri)], image)
    for n in range(2):
        assert proxy(config, tmp_path, name=f"p-{n}").status == "successful"
    refused = proxy(config, tmp_path, name="p-2")
    assert refused.status == "failed"
    assert "providers[0].kvm.hosts[0].sourceAddresses" in refused.result["msg"], refused.result
    assert "p-2" not in reservations(libvirt_test)  # its reservation went with the failure
    assert {n: i["state"] for n, i in listed(config).items()} == {"p-0": "running", "p-1": "running"}


def test_an_exhausted_port_range_names_the_field(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                 image: BaseImage) -> None:
    host = published_host("h1", libvirt_test.uri, publishPorts="40000-40000")
    del host["sourceAddresses"]
    config = write_config(tmp_path / "providers.yaml", [host], image)
    assert proxy(config, tmp_path, name="p-0").result["instance"]["endpoint"] == f"{PUBLIC}:40000"
    refused = proxy(config, tmp_path, name="p-1")
    assert refused.status == "failed"
    assert "providers[0].kvm.hosts[0].publishPorts" in refused.result["msg"] and "40000-40000" in refused.result["msg"]


def test_a_host_with_bad_networking_fails_its_own_proxies_only(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                               image: BaseImage) -> None:
    with LibvirtTestDaemon() as second:
        config = write_config(tmp_path / "providers.yaml", [
            published_host("h1", libvirt_test.uri, publicAddress="not-an-address"),
            kvm_host("h2", second.uri, pool=POOL)], image)
        # Placement passes the host by; asking for it by name fails, naming the field.
        assert proxy(config, tmp_path, name="p-0").result["instance"]["location"] == "h2"
        refused = proxy(config, tmp_path, name="p-1", location="h1")
        assert refused.status == "failed"
        assert "providers[0].kvm.hosts[0].publicAddress" in refused.result["msg"], refused.result
        assert "not-an-address" in refused.result["msg"]
        assert set(listed(config)) == {"p-0"}


def test_a_mode_the_network_does_not_serve_names_the_field(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                           image: BaseImage) -> None:
    # The test driver's network "default" is libvirt's NAT network.
    config = write_config(tmp_path / "providers.yaml",
                              [{**kvm_host("h1", libvirt_test.uri, pool=POOL), "networkMode": "route"}], image)
    refused = proxy(config, tmp_path, name="p-0")
    assert refused.status == "failed"
    assert "providers[0].kvm.hosts[0].networkMode" in refused.result["msg"], refused.result
    assert "'route'" in refused.result["msg"] and "'nat'" in refused.result["msg"]
    assert {d.name() for d in libvirt_test.connection.listAllDomains()} == {"test"}


def test_a_routed_host_is_dialled_at_the_guest(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                               image: BaseImage) -> None:
    # (bridge mode is not run here: libvirt 9.0's test driver crashes reading the addresses of a
    # domain on a network without <ip>, which a bridge-mode network is.)
    network = libvirt_test.connection.networkDefineXML(
        "<network><name>routed</name><forward mode='route'/><bridge name='vr0'/>"
        "<ip address='198.51.100.1' netmask='255.255.255.0'><dhcp><range start='198.51.100.10' "
        "end='198.51.100.20'/></dhcp></ip></network>")
    network.create()
    # Two host entries naming one hypervisor, one per network.
    config = write_config(tmp_path / "providers.yaml", [
        {**kvm_host("r1", libvirt_test.uri, pool=POOL, network="routed"), "networkMode": "route"},
        published_host("n1", libvirt_test.uri)], image)
    routed = proxy(config, tmp_path, name="p-r1", location="r1").result["instance"]
    assert routed["ip"] and routed["endpoint"] == f"{routed['ip']}:3128", routed
    published = proxy(config, tmp_path, name="p-n1", location="n1").result["instance"]
    assert published["endpoint"] == f"{PUBLIC}:40000" and published["ip"] != PUBLIC
    # Each domain is listed once, under the entry of its network.
    assert {n: (i["location"], i["endpoint"]) for n, i in listed(config).items()} == {
        "p-r1": ("r1", routed["endpoint"]), "p-n1": ("n1", f"{PUBLIC}:40000")}


def test_a_port_taken_meanwhile_by_another_run_is_given_up_and_another_claimed(
        tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage) -> None:
    """Two runs creating on one hypervisor at once can pick the same port: each defines its domain,
    then checks every other domain's. The one that finds its port taken undefines its domain (libvirt
    refuses a second definition of a name without its UUID) and defines one with another port; the
    check is forced to see a collision here, against a real libvirtd."""
    config = write_config(tmp_path / "providers.yaml", [published_host("h1", libvirt_test.uri)], image)
    settings = load_provider_config(str(config)).provider("lab").kvm
    assert settings is not None
    host = settings.hosts[0]
    connection = libvirt_test.connection
    reservation = Reservation(mac="52:54:00:00:00:01", name="p-0", address="192.168.122.50")
    # Another run's domain, as the check sees it once ours is defined: it holds port 40000 and the first
    # source address.
    other = DomainInfo(name="p-other", ours=True, tags={}, created=None, macs=[], guest_network=GuestNetwork(
        address="192.168.122.51", mac="52:54:00:00:00:02", published_address=PUBLIC, published_port=40000,
        source_address=SOURCES[0]))
    checks: list[list[DomainInfo]] = [[], [other], [other]]
    spec = DomainSpec(name="p-0", domain_type="test", vcpus=1, memory_mib=64, overlay_path="/p-0.qcow2",
                      seed_path="/p-0-seed.iso", network="default", tags=dict(OWNER_TAGS))
    uuids: list[str] = []

    def define(guest: GuestNetwork) -> Any:
        domain = connection.defineXML(build_domain_xml(dataclasses.replace(spec, guest_network=guest)))
        uuids.append(domain.UUIDString())
        return domain

    domain, guest = claim(host, reservation, "p-0", lambda: checks.pop(0), define)
    assert (guest.published_port, guest.source_address) != (40000, SOURCES[0])
    assert guest.published_port != 40000 and guest.source_address == SOURCES[1]
    assert len(uuids) == 2 and domain.UUIDString() == uuids[1]  # the first definition was undefined
    assert [d.name() for d in connection.listAllDomains() if d.name() == "p-0"] == ["p-0"]
    stored = parse_domain_xml(connection.lookupByName("p-0").XMLDesc(0))
    assert stored.guest_network == guest


def test_a_claim_that_keeps_colliding_leaves_nothing_defined(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                             image: BaseImage) -> None:
    """Every pick taken (another run each time): transient, and the next attempt finds no domain of
    that name, so it starts afresh instead of starting one that holds another's port."""
    config = write_config(tmp_path / "providers.yaml", [published_host("h1", libvirt_test.uri)], image)
    settings = load_provider_config(str(config)).provider("lab").kvm
    assert settings is not None
    host = settings.hosts[0]
    connection = libvirt_test.connection
    spec = DomainSpec(name="p-0", domain_type="test", vcpus=1, memory_mib=64, overlay_path="/p-0.qcow2",
                      seed_path="/p-0-seed.iso", network="default", tags=dict(OWNER_TAGS))

    def holding_everything(guest: GuestNetwork) -> list[DomainInfo]:
        return [DomainInfo(name="p-other", ours=True, tags={}, created=None, macs=[], guest_network=guest)]

    defined: list[GuestNetwork] = []

    def define(guest: GuestNetwork) -> Any:
        defined.append(guest)
        return connection.defineXML(build_domain_xml(dataclasses.replace(spec, guest_network=guest)))

    with pytest.raises(Transient, match="taken by another run every time"):
        claim(host, Reservation(mac="52:54:00:00:00:01", name="p-0", address="192.168.122.50"), "p-0",
              lambda: holding_everything(defined[-1]) if defined else [], define)
    assert len(defined) == CLAIM_ATTEMPTS
    assert "p-0" not in {d.name() for d in connection.listAllDomains()}


def test_the_hypervisors_addresses_the_provider_knows_are_what_its_guests_refuse(
        tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage) -> None:
    """Issue 38 row 1: the addresses the KVM boothook's squid policy refuses (``egress_host``):
    the host's public and source addresses, its address on the guests' network (read from the
    live network, the test driver's 192.168.122.1) and the address its URI names."""
    hosts = [published_host("h1", libvirt_test.uri),
             {**kvm_host("h2", "qemu+ssh://root@198.51.100.7/system", pool=POOL), "networkMode": "nat"}]
    config = write_config(tmp_path / "providers.yaml", hosts, image,
                              ssh={"keyFile": "/nonexistent/key", "knownHostsFile": "/nonexistent/known_hosts"})
    settings = load_provider_config(str(config)).provider("lab").kvm
    assert settings is not None
    connection = libvirt_test.connection
    assert host_addresses(connection, settings.hosts[0]) == (PUBLIC, *SOURCES, "192.168.122.1")
    # A host named by address in its URI (its connection here is the test driver's: same network).
    assert host_addresses(connection, settings.hosts[1]) == ("192.168.122.1", "198.51.100.7")


def test_a_public_address_without_named_sources_is_refused_naming_the_field(
        tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage) -> None:
    """Issue 39 item 1: proxies published on a public address with the default sources (the
    private networks) would refuse every crawler on the internet; the provider is refused, naming
    allowedSources and the host's publicAddress, and nothing is made. A private publicAddress (a
    LAN) keeps the default."""
    config = write_kvm_config(tmp_path / "providers.yaml", [published_host("h1", libvirt_test.uri)], image)
    refused = proxy(config, tmp_path, name="p-0")
    assert refused.failed and refused.result["error_class"] == "permanent", refused.result
    assert ("providers[0].allowedSources: required: providers[0].kvm.hosts[0].publicAddress (203.0.113.10) "
            "publishes proxies on a public address") in refused.result["msg"], refused.result["msg"]
    assert "list your crawlers' public networks" in refused.result["msg"]
    assert "the controller's own in the root's probeSources" in refused.result["msg"]
    assert "p-0" not in {domain.name() for domain in libvirt_test.connection.listAllDomains()}
    lan = write_kvm_config(tmp_path / "lan.yaml", [published_host("h1", libvirt_test.uri, publicAddress="10.1.2.3")],
                           image)
    made = proxy(lan, tmp_path, name="p-0")
    assert made.result["instance"]["endpoint"] == "10.1.2.3:40000", made.result
