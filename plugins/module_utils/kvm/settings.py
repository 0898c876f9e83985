# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``kvm`` section of a provider entry: its settings and how it is read.

Also the rules for libvirt host URIs, which the connection layer applies again to what it
opens. Importable without libvirt: only the standard library and the config reader.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import (
    Errors,
    Reader,
    default_key,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import MIN_PORT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_networks import is_public

DOMAIN_TYPES = ("kvm", "qemu")
IMAGE_FORMATS = ("qcow2", "raw")
# How a host's libvirt network reaches the world (docs/kvm-provider.md, "Networking"): behind the
# host's address (nat), routed to it (route), or on a bridge to its LAN (bridge).
NETWORK_MODES = ("nat", "route", "bridge")
# A host's maintenance state (docs/operations.md, "Draining a KVM host"): active takes new proxies;
# cordoned takes none (its running ones stay); draining takes none and the controller replaces
# each of its instances, make before break, on the other hosts.
HOST_ACTIVE = "active"
HOST_CORDONED = "cordoned"
HOST_DRAINING = "draining"
HOST_STATES = (HOST_ACTIVE, HOST_CORDONED, HOST_DRAINING)
# kvm.domainCacheSeconds' default: a domain edited in place by hand is seen within 10 minutes.
DOMAIN_CACHE_SECONDS = 600
PORT_RANGE_RE = re.compile(r"^([0-9]{1,5})-([0-9]{1,5})$")

# Names that become parts of identifiers: providerIDs are split on "/", cached base
# volumes are named base-<key>.<format> and the image-cache lock key embeds both.
IDENTIFIER_RE = re.compile(r"^[A-Za-z0-9._-]+$")
IDENTIFIER_RULE = "may contain only letters, digits, '.', '-' and '_'"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SAFE_PATH_RE = re.compile(r"[^\s'\"]+")


@dataclass(frozen=True)
class SshSettings:
    key_file: str
    known_hosts_file: str


@dataclass(frozen=True)
class HostNetworking:
    """How a host's network reaches the world, and so what a crawler dials and where a proxy's
    requests leave from (docs/kvm-provider.md, "Networking").

    ``publish_ports`` (nat only): each guest is published on ``public_address`` at a port of this
    range, by the host's hook (roles/kvm_hypervisor); ``source_addresses`` (nat only): each guest
    leaves from one of these host addresses instead of the host's own."""

    mode: str = "nat"
    public_address: Optional[str] = None
    publish_ports: Optional[Tuple[int, int]] = None
    source_addresses: Tuple[str, ...] = ()

    @property
    def fixes_guest_addresses(self) -> bool:
        """The host's hook forwards to (or translates for) each guest by address, so the provider
        reserves one per guest on the network, and records it on the domain."""
        return self.publish_ports is not None or bool(self.source_addresses)


@dataclass(frozen=True)
class KvmHost:
    name: str
    uri: str
    pool: str = "default"
    network: str = "default"
    domain_type: str = "kvm"
    networking: HostNetworking = field(default_factory=HostNetworking)
    networking_errors: Tuple[str, ...] = ()
    """What is wrong with this host's networking fields: only this host cannot take new
    proxies (its running ones are listed and deleted as ever)."""
    path: str = field(default="", compare=False)
    """Its field path in the provider config (``providers[0].kvm.hosts[1]``), for messages."""
    state: str = HOST_ACTIVE
    """``hosts[].state``: only an active host takes new proxies (``HOST_STATES``)."""

    @property
    def takes_new_proxies(self) -> bool:
        return self.state == HOST_ACTIVE and not self.networking_errors

    def at(self, key: str) -> str:
        return "%s.%s" % (self.path, key) if self.path else key


@dataclass(frozen=True)
class KvmImage:
    key: str
    url: str
    sha256: str
    format: str = "qcow2"

    @property
    def volume_name(self) -> str:
        """Name of the cached base volume in each host's pool."""
        return "base-%s.%s" % (self.key, self.format)


@dataclass(frozen=True)
class KvmMachineType:
    vcpus: int
    memory_mib: int
    disk_gib: int
    machine: Optional[str] = None  # libvirt's <os><type machine=...>, e.g. "q35"; None = host default


@dataclass(frozen=True)
class KvmSettings:
    hosts: Tuple[KvmHost, ...]
    images: Dict[str, KvmImage]
    machine_types: Dict[str, KvmMachineType]
    default_machine_type: str
    default_image: str
    ssh: Optional[SshSettings] = None
    vendor_data: Optional[str] = None
    install_guest_agent: bool = True
    # How long a domain's XML, once read, stands for it (kvm/domain_cache.py); 0: read at every listing.
    domain_cache_seconds: int = DOMAIN_CACHE_SECONDS

    def host(self, name: str) -> Optional[KvmHost]:
        for host in self.hosts:
            if host.name == name:
                return host
        return None

    @property
    def published_addresses(self) -> Tuple[Tuple[str, str], ...]:
        """(field path, address) of every host's ``publicAddress``: what crawlers dial. The
        provider config refuses one outside the private networks unless ``allowedSources`` is
        written (``public_exposure``; issue 39: public exposure is explicit)."""
        return tuple((host.at("publicAddress"), host.networking.public_address) for host in self.hosts
                     if host.networking.public_address is not None)

    def public_exposure(self) -> Optional[str]:
        """What makes this provider's proxies public (config.py then requires ``allowedSources``
        written), or None: a host publishing on an address outside the private networks."""
        public = [(where, address) for where, address in self.published_addresses if is_public(address)]
        if not public:
            return None
        return "%s (%s) publishes proxies on a public address" % public[0]

    @property
    def location_errors(self) -> Tuple[str, ...]:
        """Errors that make single hosts unusable for new proxies, not the whole section."""
        return tuple(error for host in self.hosts for error in host.networking_errors)

    @property
    def location_states(self) -> Dict[str, str]:
        """The hosts that are not active (cordoned or draining), by name. With no host left to take
        new proxies a draining host is reported cordoned: its proxies have nowhere to go."""
        somewhere = any(host.takes_new_proxies for host in self.hosts)
        return {host.name: host.state if somewhere else HOST_CORDONED for host in self.hosts
                if host.state != HOST_ACTIVE}


# --- KVM host URIs: host keys can never be switched off ---------------------------------------
#
# libvirt's remote driver picks the transport from the URI scheme's "+<transport>" part and
# compares it case-insensitively, as it does query parameter names (libvirt docs/uri.rst;
# remote_driver.c's STRCASEEQ), so every comparison here is case-insensitive too. Only
# transports whose host identity this provider pins are accepted; every query parameter
# that could switch verification off, run a command, or override the key material the
# module pins itself is refused (allowlist: anything not named below is refused as well).

LIBVIRT_DRIVERS = ("qemu", "test")
"""``qemu`` for real hosts; ``test`` is libvirt's test driver, which the suite serves from a
libvirtd of its own (``test+unix:///default?socket=...``): no hypervisor, no network."""
SSH_TRANSPORTS = ("ssh", "libssh", "libssh2")
LOCAL_TRANSPORTS = ("", "unix")
_REFUSED_TRANSPORTS = {
    "tcp": "sends libvirt's protocol unencrypted and unauthenticated: nothing verifies the host",
    "tls": "verifies the host against an x509 CA that this provider neither configures nor pins (and "
           "no_verify=1 switches even that off); host identity here is kvm.ssh.knownHostsFile",
    "ext": "runs a command named in the URI to carry the connection: nothing verifies the host",
}
_REFUSED_PARAMETERS = {
    "no_verify": "switches host-key (or certificate) verification off",
    "known_hosts_verify": "can switch host-key verification off (ignore) or accept any new host key (auto)",
    "command": "runs a command of the URI's choosing in place of ssh",
    "netcat": "names a command to run on the host",
    "keyfile": "is set by the module from kvm.ssh.keyFile; a value here would override it",
    "known_hosts": "is set by the module from kvm.ssh.knownHostsFile; a value here would override it",
    "sshauth": "is set by the module (privkey only); a value here would override it",
    "name": "would pick the driver on the far side; name the driver in the URI's scheme instead",
    "pkipath": "belongs to the tls transport, which is refused",
    "tls_priority": "belongs to the tls transport, which is refused",
}
_PARAMETER_CHOICES = {"mode": ("auto", "direct", "legacy"), "proxy": ("auto", "netcat", "native")}
_ALLOWED_PARAMETERS = {"ssh": ("socket", "mode", "proxy"), "unix": ("socket", "mode")}
# socket= travels into the command line run on the host (``virt-ssh-helper``/``nc -U <socket>``).
_SOCKET_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")
# A host name that ssh cannot mistake for an option (a leading '-' would be read as one).
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*)$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_ALLOWED_URIS = ("qemu+libssh://user@host/system (recommended), qemu+libssh2://, qemu+ssh://, or a local "
                 "qemu:///system or qemu+unix:///system?socket=...")


def libvirt_transport(uri: str) -> str:
    """``qemu+LibSSH://...`` -> ``libssh``; ``qemu:///system`` -> ``""`` (lower-cased, as libvirt compares it)."""
    scheme = uri.split("://", 1)[0]
    return scheme.split("+", 1)[1].lower() if "+" in scheme else ""


def is_ssh_uri(uri: str) -> bool:
    return libvirt_transport(uri) in SSH_TRANSPORTS


def uri_query_parameters(query: str) -> List[Tuple[str, str]]:
    """The query as libvirt reads it: split on '&' and ';', names and values %-unescaped
    (virURIParseParams); names lower-cased, as libvirt compares them."""
    parameters = []
    for item in re.split(r"[&;]", query):
        if not item:
            continue
        name, _separator, value = item.partition("=")
        parameters.append((unquote(name).lower(), unquote(value)))
    return parameters


def libvirt_uri_problem(uri: str) -> Optional[str]:
    """Why ``uri`` is refused (to follow its field path and the URI), or None when it is accepted."""
    if any(char.isspace() or not char.isprintable() for char in uri):
        # Python's URL parser drops tabs and newlines that libvirt's keeps: never let the two disagree.
        return "contains whitespace or control characters; remove them"
    if "://" not in uri:
        return "is not a libvirt URI; use %s" % _ALLOWED_URIS
    scheme = uri.split("://", 1)[0]
    driver = scheme.split("+", 1)[0].lower()
    transport = libvirt_transport(uri)
    if driver not in LIBVIRT_DRIVERS:
        return "names the libvirt driver %r; this provider drives qemu (use %s)" % (driver, _ALLOWED_URIS)
    if transport in _REFUSED_TRANSPORTS:
        return "uses the %s transport, which is refused: it %s; use %s" % (
            transport, _REFUSED_TRANSPORTS[transport], _ALLOWED_URIS)
    if transport not in SSH_TRANSPORTS and transport not in LOCAL_TRANSPORTS:
        return "uses the transport %r, which is not one of %s; use %s" % (
            transport, ", ".join((*SSH_TRANSPORTS, "unix")), _ALLOWED_URIS)
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as error:
        return "is not a valid URI (%s)" % error
    del port  # only parsed to be checked
    if parts.fragment:
        return "has a '#' fragment, which is no part of a libvirt URI; remove it"
    host = parts.hostname or ""
    if transport in LOCAL_TRANSPORTS and host:
        if transport == "":
            return ("names the host %r without a transport, which libvirt connects to over TLS (refused: it %s); "
                    "write qemu+libssh://user@%s/system" % (host, _REFUSED_TRANSPORTS["tls"], host))
        return "names the host %r, but the unix transport reaches this machine only; remove the host" % host
    if host and not _HOST_NAME_RE.fullmatch(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return "names the host %r, which is not a host name or an IP address" % host
    if parts.username is not None and not _USER_RE.fullmatch(unquote(parts.username)):
        return "names the user %r, which is not a user name" % parts.username
    if parts.password is not None:
        return "carries a password; SSH logs in with kvm.ssh.keyFile only, remove it"
    allowed = _ALLOWED_PARAMETERS["ssh" if transport in SSH_TRANSPORTS else "unix"]
    for name, value in uri_query_parameters(parts.query):
        if name in _REFUSED_PARAMETERS:
            return "sets the query parameter %r, which is refused: it %s; remove it" % (
                name, _REFUSED_PARAMETERS[name])
        if name not in allowed:
            return "sets the query parameter %r, which is not allowed here (allowed: %s); remove it" % (
                name, ", ".join(allowed))
        if name in _PARAMETER_CHOICES and value not in _PARAMETER_CHOICES[name]:
            return "sets %s=%s; it must be one of %s" % (name, value, ", ".join(_PARAMETER_CHOICES[name]))
        if name == "socket" and not _SOCKET_RE.fullmatch(value):
            return ("sets socket=%s; it must be an absolute path of letters, digits, '.', '_', '-' and '/' (it "
                    "becomes part of a command line on the host)" % value)
    return None


# --- The section: every field is read, and None is returned when any was bad -----------------


def parse_kvm_section(reader: Reader, errors: Errors) -> Optional[KvmSettings]:
    start = len(errors)
    reader.only(errors, "ssh", "hosts", "images", "machineTypes", "defaultMachineType", "defaultImage",
                "vendorData", "installGuestAgent", "domainCacheSeconds")
    ssh = _ssh(reader, errors)
    hosts = _hosts(reader, errors)
    _check_somewhere_to_drain_to(hosts, errors)
    images = _images(reader, errors)
    machine_types = _machine_types(reader, errors)
    # A default is checked against the keys as written, even when one of their entries is bad.
    default_machine_type = errors.read(default_key, reader, "defaultMachineType",
                                       reader.keys_as_written("machineTypes"), "machineTypes")
    default_image = errors.read(default_key, reader, "defaultImage", reader.keys_as_written("images"), "images")
    vendor_data = reader.data.get("vendorData")
    if vendor_data is not None and not isinstance(vendor_data, str):
        errors.add("%s: must be a string (a cloud-init document) or null" % reader.at("vendorData"))
    install_guest_agent = errors.read(reader.boolean, "installGuestAgent", True)
    domain_cache_seconds = DOMAIN_CACHE_SECONDS
    if reader.data.get("domainCacheSeconds") is not None:
        # None only with an error recorded, which fails the section just below.
        domain_cache_seconds = errors.read(reader.integer, "domainCacheSeconds", 0) or 0
    if len(errors) > start or default_machine_type is None or default_image is None or install_guest_agent is None:
        return None
    return KvmSettings(
        hosts=tuple(hosts), images=images, machine_types=machine_types,
        default_machine_type=default_machine_type, default_image=default_image,
        ssh=ssh, vendor_data=vendor_data, install_guest_agent=install_guest_agent,
        domain_cache_seconds=domain_cache_seconds)


def _ssh(reader: Reader, errors: Errors) -> Optional[SshSettings]:
    ssh_reader = errors.read(reader.mapping, "ssh") if reader.has("ssh") else None
    if ssh_reader is None:
        return None
    ssh_reader.only(errors, "keyFile", "knownHostsFile")
    # Paths end up in ssh options (the qemu+ssh wrapper), where whitespace and quotes split them.
    path_rule = "must be a path without whitespace or quotes (ssh splits option values on them)"
    key_file = errors.read(ssh_reader.absolute_path, "keyFile", True, SAFE_PATH_RE, path_rule)
    known_hosts = errors.read(ssh_reader.absolute_path, "knownHostsFile", True, SAFE_PATH_RE, path_rule)
    if key_file is None or known_hosts is None:
        return None
    return SshSettings(key_file, known_hosts)


def _hosts(reader: Reader, errors: Errors) -> List[KvmHost]:
    hosts: List[KvmHost] = []
    for index, raw in enumerate(errors.read(reader.non_empty_list, "hosts") or []):
        host = errors.read(Reader, raw, "%s[%d]" % (reader.at("hosts"), index))
        if host is None:
            continue
        host.only(errors, "name", "uri", "pool", "network", "domainType", "state", *NETWORKING_FIELDS)
        name = errors.read(
            host.string, "name", pattern=IDENTIFIER_RE,
            rule=IDENTIFIER_RULE + ", because it becomes part of providerIDs (kvm://hosts/<name>/domains/...); "
            "rename the host")
        if name is not None and any(h.name == name for h in hosts):
            errors.add("%s: duplicate host name %r; host names must be unique" % (host.at("name"), name))
            name = None
        uri = errors.read(host.string, "uri")
        if uri is not None:
            problem = libvirt_uri_problem(uri)
            if problem is not None:
                errors.add("%s: %r %s" % (host.at("uri"), uri, problem))
                uri = None
            elif is_ssh_uri(uri) and not reader.has("ssh"):
                errors.add("%s: is an SSH URI, so %s is required (keyFile and knownHostsFile)" % (
                    host.at("uri"), reader.at("ssh")))
                uri = None
        pool = errors.read(host.string, "pool", "default")
        network = errors.read(host.string, "network", "default")
        domain_type = errors.read(host.choice, "domainType", DOMAIN_TYPES, "kvm")
        state = errors.read(host.choice, "state", HOST_STATES, HOST_ACTIVE)
        networking_errors = Errors()
        networking = _networking(host, networking_errors)
        errors.locations.extend(networking_errors.messages)
        if name is not None and uri is not None and pool is not None and network is not None \
                and domain_type is not None and state is not None:
            hosts.append(KvmHost(name=name, uri=uri, pool=pool, network=network, domain_type=domain_type,
                                 networking=networking, networking_errors=tuple(networking_errors.messages),
                                 path=host.path, state=state))
    return hosts


def _check_somewhere_to_drain_to(hosts: List[KvmHost], errors: Errors) -> None:
    """A draining host needs another that takes new proxies, or every replacement would fail (and
    each Proxy with it) while the old instances still serve. A location error: placement stays as
    it is, and ``location_states`` reports such a host as cordoned, so nothing is replaced."""
    if any(host.takes_new_proxies for host in hosts):
        return
    for host in hosts:
        if host.state == HOST_DRAINING:
            errors.locations.append(
                "%s: draining needs another host that takes new proxies (state active, networking valid) to move "
                "this host's proxies to; set one active, or set this one cordoned" % host.at("state"))


NETWORKING_FIELDS = ("networkMode", "publicAddress", "publishPorts", "sourceAddresses")


def _networking(host: Reader, errors: Errors) -> HostNetworking:
    """A host's networking fields. Their errors are the host's own (``KvmHost.networking_errors``):
    a mistake here keeps new proxies off this host only, and touches nothing that runs."""
    mode = errors.read(host.choice, "networkMode", NETWORK_MODES, "nat") or "nat"
    public = _address(errors, host.data["publicAddress"], host.at("publicAddress")) if host.has(
        "publicAddress") else None
    ports = _port_range(host, errors) if host.has("publishPorts") else None
    sources = _source_addresses(host, errors) if host.has("sourceAddresses") else ()
    for key in ("publicAddress", "publishPorts", "sourceAddresses"):
        if host.has(key) and mode != "nat":
            errors.add("%s: only with networkMode nat (this host's is %s, where every guest has an address of its "
                       "own that crawlers dial and requests leave from); remove it" % (host.at(key), mode))
    if mode == "nat" and host.has("publishPorts") != host.has("publicAddress"):
        missing, given = ("publicAddress", "publishPorts") if host.has("publishPorts") else (
            "publishPorts", "publicAddress")
        errors.add("%s: required with %s (publishing needs the host's public address and a port range, as the "
                   "kvm_hypervisor role's hook has them)" % (host.at(missing), given))
    return HostNetworking(mode=mode, public_address=public, publish_ports=ports, source_addresses=sources)


def _address(errors: Errors, value: Any, where: str) -> Optional[str]:
    """An IPv4 address of the host (what crawlers dial, or what requests leave from)."""
    try:
        address = ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        address = None
    if not isinstance(address, ipaddress.IPv4Address) or address.is_loopback or address.is_multicast \
            or address.is_unspecified or address.is_link_local:
        errors.add("%s: %r is not an IPv4 address of the host (such as 203.0.113.10); the hook forwards and "
                   "translates IPv4 only" % (where, value))
        return None
    return str(address)


def _source_addresses(host: Reader, errors: Errors) -> Tuple[str, ...]:
    sources: List[str] = []
    for index, value in enumerate(errors.read(host.non_empty_list, "sourceAddresses") or []):
        where = "%s[%d]" % (host.at("sourceAddresses"), index)
        found = _address(errors, value, where)
        if found is not None and found in sources:
            errors.add("%s: %s is listed twice; each proxy gets an address of its own" % (where, found))
        elif found is not None:
            sources.append(found)
    return tuple(sources)


def _port_range(host: Reader, errors: Errors) -> Optional[Tuple[int, int]]:
    value = host.data["publishPorts"]
    found = PORT_RANGE_RE.fullmatch(value) if isinstance(value, str) else None
    first, last = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    if not found or not MIN_PORT <= first <= last <= 65535:
        errors.add("%s: %r is not a port range first-last within %d-65535 (such as \"40000-40999\"; below %d are the "
                   "host's own services, such as sshd on 22), as the role's kvm_hypervisor_publish_ports" % (
                       host.at("publishPorts"), value, MIN_PORT, MIN_PORT))
        return None
    return first, last


def _images(reader: Reader, errors: Errors) -> Dict[str, KvmImage]:
    images: Dict[str, KvmImage] = {}
    for key, raw in (errors.read(reader.non_empty_mapping, "images") or {}).items():
        path = "%s.%s" % (reader.at("images"), key)
        if not isinstance(key, str) or not IDENTIFIER_RE.fullmatch(key):
            errors.add("%s: image key %r %s, because it names the cached volume base-<key>.<format> "
                       "and its download lock; rename the key" % (path, key, IDENTIFIER_RULE))
            continue
        image = errors.read(Reader, raw, path)
        if image is None:
            continue
        image.only(errors, "url", "sha256", "format")
        url = errors.read(image.string, "url")
        sha = errors.read(image.string, "sha256", pattern=SHA256_RE,
                          rule="must be 64 lowercase hex digits (sha256sum's output)")
        image_format = errors.read(image.choice, "format", IMAGE_FORMATS, "qcow2")
        if url is not None and sha is not None and image_format is not None:
            images[key] = KvmImage(key=key, url=url, sha256=sha, format=image_format)
    return images


def _machine_types(reader: Reader, errors: Errors) -> Dict[str, KvmMachineType]:
    machine_types: Dict[str, KvmMachineType] = {}
    for key, raw in (errors.read(reader.non_empty_mapping, "machineTypes") or {}).items():
        machine = errors.read(Reader, raw, "%s.%s" % (reader.at("machineTypes"), key))
        if machine is None:
            continue
        machine.only(errors, "vcpus", "memoryMiB", "diskGiB", "machine")
        vcpus = errors.read(machine.integer, "vcpus", 1)
        memory = errors.read(machine.integer, "memoryMiB", 64)
        disk = errors.read(machine.integer, "diskGiB", 1)
        machine_name = errors.read(machine.optional_string, "machine")
        if vcpus is not None and memory is not None and disk is not None:
            machine_types[str(key)] = KvmMachineType(vcpus=vcpus, memory_mib=memory, disk_gib=disk,
                                                     machine=machine_name)
    return machine_types
