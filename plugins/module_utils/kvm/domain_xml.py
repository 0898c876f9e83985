# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libvirt domain XML of a proxy VM, and reading our metadata back out of it.

Tags live in the domain's ``<metadata>`` under our own XML namespace, so listing by
tag needs nothing but the domain definitions, and a domain without that element is
never ours (garbage collection only ever looks at domains that carry it).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

METADATA_NS = "https://crawl.example.com/egress-proxies/v1alpha1"
METADATA_PREFIX = "egress"
GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
# A tag name in our namespace, as ElementTree spells it.
_QUALIFIED = "{%s}%%s" % METADATA_NS


@dataclass(frozen=True)
class GuestNetwork:
    """What the host's hook (roles/kvm_hypervisor) forwards to and translates for one guest,
    recorded in its metadata: the address reserved for it on the host's network (its MAC gets
    it by DHCP), the host address and port it is published on, the address it leaves from.
    Listing reads them back, so a crawler is told what the hook set up."""

    address: str
    mac: str
    published_address: Optional[str] = None
    published_port: Optional[int] = None
    source_address: Optional[str] = None


@dataclass(frozen=True)
class DomainSpec:
    name: str
    domain_type: str
    vcpus: int
    memory_mib: int
    overlay_path: str
    seed_path: str
    network: str
    machine: Optional[str] = None
    tags: Dict[str, str] = field(default_factory=dict)
    created: str = ""
    port: int = 3128
    guest_network: Optional[GuestNetwork] = None
    # The networks crawlers may connect from (the Proxy's allowed sources): on a published
    # guest, the host's hook forwards the published port from these only.
    clients: Tuple[str, ...] = ()


@dataclass(frozen=True)
class DomainInfo:
    """What we read back from a domain's XML."""

    name: str
    ours: bool
    tags: Dict[str, str]
    created: Optional[str]
    macs: List[str]
    # The libvirt networks its interfaces are attached to (``<source network=...>``):
    # where a listing reads the DHCP leases of its MACs.
    networks: List[str] = field(default_factory=list)
    port: Optional[int] = None
    guest_network: Optional[GuestNetwork] = None

    @property
    def network(self) -> Optional[str]:
        """The libvirt network its (first) interface is on."""
        return self.networks[0] if self.networks else None

    @property
    def published(self) -> Optional[Tuple[str, int]]:
        found = self.guest_network
        if found is None or found.published_address is None or found.published_port is None:
            return None
        return found.published_address, found.published_port


def _sub(parent: ET.Element, tag: str, text: Optional[str] = None, **attrib: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrib)
    if text is not None:
        element.text = text
    return element


def metadata_element(tags: Dict[str, str], created: str, port: int,
                     guest_network: Optional[GuestNetwork] = None, clients: Tuple[str, ...] = ()) -> ET.Element:
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    root = ET.Element("{%s}instance" % METADATA_NS)
    _sub(root, "{%s}created" % METADATA_NS, created)
    _sub(root, "{%s}port" % METADATA_NS, str(port))
    if guest_network is not None:
        _sub(root, "{%s}guest" % METADATA_NS, address=guest_network.address, mac=guest_network.mac)
        if guest_network.published_address is not None and guest_network.published_port is not None:
            _sub(root, "{%s}published" % METADATA_NS, address=guest_network.published_address,
                 port=str(guest_network.published_port))
            for network in clients:
                _sub(root, "{%s}client" % METADATA_NS, network=network)
        if guest_network.source_address is not None:
            _sub(root, "{%s}source" % METADATA_NS, address=guest_network.source_address)
    tags_element = _sub(root, "{%s}tags" % METADATA_NS)
    for key in sorted(tags):
        _sub(tags_element, "{%s}tag" % METADATA_NS, tags[key], key=key)
    return root


def build_domain_xml(spec: DomainSpec) -> str:
    domain = ET.Element("domain", type=spec.domain_type)
    _sub(domain, "name", spec.name)
    metadata = _sub(domain, "metadata")
    metadata.append(metadata_element(spec.tags, spec.created, spec.port, spec.guest_network, spec.clients))
    _sub(domain, "memory", str(spec.memory_mib), unit="MiB")
    _sub(domain, "vcpu", str(spec.vcpus))
    os_element = _sub(domain, "os")
    os_type = _sub(os_element, "type", "hvm", arch="x86_64")
    if spec.machine:
        os_type.set("machine", spec.machine)
    _sub(os_element, "boot", dev="hd")
    features = _sub(domain, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    # Guests are cattle: power off ends them, a crash leaves them for us to see as "error".
    _sub(domain, "on_poweroff", "destroy")
    _sub(domain, "on_reboot", "restart")
    _sub(domain, "on_crash", "destroy")
    devices = _sub(domain, "devices")

    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2")
    _sub(disk, "source", file=spec.overlay_path)
    _sub(disk, "target", dev="vda", bus="virtio")

    # The NoCloud seed: cloud-init finds it by its "cidata" label. SATA, because
    # IDE is missing on q35 and virtio cdroms are not supported.
    seed = _sub(devices, "disk", type="file", device="cdrom")
    _sub(seed, "driver", name="qemu", type="raw")
    _sub(seed, "source", file=spec.seed_path)
    _sub(seed, "target", dev="sda", bus="sata")
    _sub(seed, "readonly")

    interface = _sub(devices, "interface", type="network")
    if spec.guest_network is not None:
        _sub(interface, "mac", address=spec.guest_network.mac)  # what its address is reserved for
    _sub(interface, "source", network=spec.network)
    _sub(interface, "model", type="virtio")

    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    _sub(devices, "serial", type="pty")
    _sub(devices, "console", type="pty")
    _sub(devices, "rng", model="virtio").append(_backend_random())
    return ET.tostring(domain, encoding="unicode")


def _backend_random() -> ET.Element:
    backend = ET.Element("backend", model="random")
    backend.text = "/dev/urandom"
    return backend


def parse_domain_xml(xml: str) -> DomainInfo:
    # Child by child with plain tag names: ElementTree answers those in C, where a path
    # expression goes through ElementPath in Python (a listing parses one XML per domain).
    root = ET.fromstring(xml)
    name = root.findtext("name") or ""
    macs: List[str] = []
    networks: List[str] = []
    devices = root.find("devices")
    for interface in devices.findall("interface") if devices is not None else ():
        mac = interface.find("mac")
        if mac is not None:
            macs.append(mac.get("address", "").lower())
        # By its source's network, whatever its type: a running domain's XML on a network in
        # forward mode bridge says <interface type='bridge'> with <source network=... bridge=...>.
        source = interface.find("source")
        if source is not None and source.get("network"):
            networks.append(source.get("network", ""))
    metadata = root.find("metadata")
    instance = metadata.find(_QUALIFIED % "instance") if metadata is not None else None
    if instance is None:
        return DomainInfo(name=name, ours=False, tags={}, created=None, macs=macs, networks=networks)
    tags_element = instance.find(_QUALIFIED % "tags")
    tagged = tags_element.findall(_QUALIFIED % "tag") if tags_element is not None else []
    tags = {tag.get("key", ""): tag.text or "" for tag in tagged}
    port = instance.findtext(_QUALIFIED % "port") or ""
    return DomainInfo(name=name, ours=True, tags=tags, created=instance.findtext(_QUALIFIED % "created"),
                      macs=macs, networks=networks, port=int(port) if port.isdigit() else None,
                      guest_network=_guest_network(instance))


def _guest_network(instance: ET.Element) -> Optional[GuestNetwork]:
    guest = instance.find(_QUALIFIED % "guest")
    if guest is None or not guest.get("address") or not guest.get("mac"):
        return None
    published = instance.find(_QUALIFIED % "published")
    port = published.get("port", "") if published is not None else ""
    source = instance.find(_QUALIFIED % "source")
    return GuestNetwork(
        address=guest.get("address", ""), mac=guest.get("mac", "").lower(),
        published_address=published.get("address") if published is not None and port.isdigit() else None,
        published_port=int(port) if port.isdigit() else None,
        source_address=source.get("address") if source is not None else None)
