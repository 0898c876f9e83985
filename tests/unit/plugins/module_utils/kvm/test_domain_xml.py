"""The proxy VM's domain XML, and reading our metadata back from what libvirt returns."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from typing import Any

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import (
    GUEST_AGENT_CHANNEL,
    METADATA_NS,
    DomainSpec,
    GuestNetwork,
    build_domain_xml,
    parse_domain_xml,
)

TAGS = {
    "crawl.example.com/owner": "prod-cluster-1",
    "crawl.example.com/proxy": "crawlers/eu-1",
    "crawl.example.com/uid": "8d4f1c2e-0000-4000-8000-000000000001",
    "crawl.example.com/spec-hash": "3f9c2a",
}
CREATED = "2026-01-02T03:04:05Z"


SPEC = DomainSpec(
    name="crawlers-eu-1-3f9c2a", domain_type="qemu", vcpus=2, memory_mib=512,
    overlay_path="/var/lib/libvirt/images/crawlers-eu-1-3f9c2a.qcow2",
    seed_path="/var/lib/libvirt/images/crawlers-eu-1-3f9c2a-seed.iso", network="default",
    tags=TAGS, created=CREATED, port=8080,
)


def spec(**changes: Any) -> DomainSpec:
    return dataclasses.replace(SPEC, **changes)


def one(parent: ET.Element, path: str) -> ET.Element:
    """The element at ``path``, which must exist."""
    found = parent.find(path)
    assert found is not None, path
    return found


def with_mac(xml: str, mac: str) -> str:
    """What libvirt hands back after defining the domain: the interface has its MAC."""
    root = ET.fromstring(xml)
    ET.SubElement(one(root, "./devices/interface"), "mac", address=mac)
    return ET.tostring(root, encoding="unicode")


def test_build_then_parse_round_trips_our_metadata() -> None:
    xml = build_domain_xml(spec())
    info = parse_domain_xml(xml)
    assert info.name == "crawlers-eu-1-3f9c2a"
    assert info.ours is True
    assert info.tags == TAGS
    assert info.created == CREATED
    assert info.macs == []


def test_the_port_is_kept_in_our_metadata() -> None:
    # parse_domain_xml does not return the port; it is read from our namespace directly.
    root = ET.fromstring(build_domain_xml(spec(port=8080)))
    assert root.findtext(f"./metadata/{{{METADATA_NS}}}instance/{{{METADATA_NS}}}port") == "8080"


def test_a_published_guest_records_the_networks_its_crawlers_come_from() -> None:
    """What the host's hook forwards the published port from (issue 39 item 7); an unpublished
    guest records none (nothing forwards to it)."""
    published = GuestNetwork(address="192.168.122.10", mac="52:54:00:00:00:01", published_address="203.0.113.10",
                             published_port=40000)
    clients = ("198.51.100.0/24", "fc00::/7")
    instance = f"./metadata/{{{METADATA_NS}}}instance"
    root = ET.fromstring(build_domain_xml(spec(guest_network=published, clients=clients)))
    assert [c.get("network") for c in root.findall(f"{instance}/{{{METADATA_NS}}}client")] == list(clients)
    unpublished = dataclasses.replace(published, published_address=None, published_port=None)
    root = ET.fromstring(build_domain_xml(spec(guest_network=unpublished, clients=clients)))
    assert root.findall(f"{instance}/{{{METADATA_NS}}}client") == []


def test_macs_are_read_and_lowercased() -> None:
    info = parse_domain_xml(with_mac(build_domain_xml(spec()), "52:54:00:AB:CD:EF"))
    assert info.macs == ["52:54:00:ab:cd:ef"]


def test_the_networks_of_its_network_interfaces_are_read() -> None:
    """Where a listing reads the leases of its MACs: the network each interface's source names;
    a bridge or direct interface of its own names none."""
    assert parse_domain_xml(build_domain_xml(spec())).networks == ["default"]
    mixed = (
        "<domain type='kvm'><name>two-nics</name><devices>"
        "<interface type='bridge'><mac address='52:54:00:00:00:01'/><source bridge='br0'/></interface>"
        "<interface type='network'><mac address='52:54:00:00:00:02'/><source network='proxies'/></interface>"
        "<interface type='network'><mac address='52:54:00:00:00:03'/></interface>"
        "</devices></domain>"
    )
    info = parse_domain_xml(mixed)
    assert info.networks == ["proxies"]
    assert info.macs == ["52:54:00:00:00:01", "52:54:00:00:00:02", "52:54:00:00:00:03"]


def test_a_running_domain_on_a_bridge_mode_network_is_on_that_network() -> None:
    """libvirt 9.0's XML of a running domain whose interface is on a network in forward mode
    bridge (measured): ``type='bridge'``, the network still named by its source. Read as a bridge
    without a network, the domain was listed under the first host entry of its URI, not its
    network's (issue 39 item 5: the real-guest test's bridged successor)."""
    running = (
        "<domain type='qemu'><name>bridged</name><devices><interface type='bridge'>"
        "<mac address='52:54:00:c6:7d:7f'/>"
        "<source network='bridged' portid='22d03eb9-e199-43af-a9c3-ac74317a0221' bridge='lan0'/>"
        "<target dev='vnet0'/></interface></devices></domain>"
    )
    assert parse_domain_xml(running).networks == ["bridged"]


def test_a_domain_without_our_metadata_is_not_ours() -> None:
    foreign = (
        "<domain type='kvm'><name>someone-elses-vm</name>"
        "<metadata><other:thing xmlns:other='https://other.example/'>x</other:thing></metadata>"
        "<devices><interface type='network'><mac address='52:54:00:00:00:01'/></interface></devices>"
        "</domain>"
    )
    info = parse_domain_xml(foreign)
    assert (info.name, info.ours, info.tags, info.created) == ("someone-elses-vm", False, {}, None)
    assert info.macs == ["52:54:00:00:00:01"]


def test_a_domain_without_any_metadata_is_not_ours() -> None:
    info = parse_domain_xml("<domain type='kvm'><name>plain</name></domain>")
    assert (info.ours, info.tags) == (False, {})


def test_the_domain_has_the_devices_a_proxy_needs() -> None:
    root = ET.fromstring(build_domain_xml(spec(machine="q35")))
    assert root.get("type") == "qemu"
    assert root.findtext("vcpu") == "2"
    assert (one(root, "memory").text, one(root, "memory").get("unit")) == ("512", "MiB")
    assert one(root, "./os/type").get("machine") == "q35"

    disks = {disk.get("device"): disk for disk in root.findall("./devices/disk")}
    assert set(disks) == {"disk", "cdrom"}
    disk = disks["disk"]
    assert one(disk, "source").get("file") == SPEC.overlay_path
    assert one(disk, "target").attrib == {"dev": "vda", "bus": "virtio"}
    assert one(disk, "driver").get("type") == "qcow2"
    cdrom = disks["cdrom"]
    assert one(cdrom, "source").get("file") == SPEC.seed_path
    assert one(cdrom, "target").get("bus") == "sata"
    assert one(cdrom, "driver").get("type") == "raw"
    one(cdrom, "readonly")

    interfaces = root.findall("./devices/interface")
    assert len(interfaces) == 1
    assert interfaces[0].get("type") == "network"
    assert one(interfaces[0], "source").get("network") == "default"
    assert one(interfaces[0], "model").get("type") == "virtio"

    channels = root.findall("./devices/channel")
    assert [one(channel, "target").attrib for channel in channels] == [
        {"type": "virtio", "name": "org.qemu.guest_agent.0"}]
    assert GUEST_AGENT_CHANNEL == "org.qemu.guest_agent.0"


def test_without_a_machine_the_host_default_is_used() -> None:
    os_type = one(ET.fromstring(build_domain_xml(spec(machine=None))), "./os/type")
    assert "machine" not in os_type.attrib


def test_xml_special_characters_in_tags_survive() -> None:
    tags = {"crawl.example.com/proxy": "<ns>/a&b", "quote\"key'&<>": "it's \"quoted\" & <tagged>\u00fc"}
    info = parse_domain_xml(build_domain_xml(spec(tags=tags)))
    assert info.tags == tags


def test_names_and_paths_are_escaped() -> None:
    root = ET.fromstring(build_domain_xml(spec(overlay_path="/images/a&b<c>.qcow2", network="net'\"&")))
    assert one(root, "./devices/disk[@device='disk']/source").get("file") == "/images/a&b<c>.qcow2"
    assert one(root, "./devices/interface/source").get("network") == "net'\"&"
