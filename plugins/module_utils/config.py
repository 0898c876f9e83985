# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The provider config file: one YAML document, every error reported with its field path.

Each provider section is validated on its own, and every error is collected (not only the
first), each naming the field path (``providers[0].kvm.hosts[2].name``), what is wrong and
how to fix it. Unknown keys are errors too, so a typo (``domaintype``) never silently falls
back to a default.

Two kinds of error:
- *root* errors make the whole file unusable (it is not a mapping, a bad or missing
  ``owner``, ``providers`` not a non-empty list, an entry that is not a mapping or has no
  usable or a duplicate ``name``): ``parse_provider_config`` raises for them, listing every
  error of the file;
- *section* errors belong to one provider: the file still parses, that provider carries its
  errors, and only ``ProviderConfig.provider(<that name>)`` fails. A module asked for a
  provider whose section is valid works whatever is wrong in another provider's section.

``config_errors`` returns every error, root and section, for ``check-config`` style callers
(the ``provider_config_info`` module).

A bad config is a ``Permanent`` error: retrying cannot fix it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import unquote, urlsplit

try:
    import yaml
except ImportError:  # pragma: no cover - reported by the modules via missing_required_lib
    yaml = None  # type: ignore[assignment]
    HAS_YAML = False
else:
    HAS_YAML = True

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent

PROVIDER_TYPES = ("kvm", "gcp", "kubernetes")
DOMAIN_TYPES = ("kvm", "qemu")
IMAGE_FORMATS = ("qcow2", "raw")

# Names that become parts of identifiers: providerIDs are split on "/", cached base
# volumes are named base-<key>.<format> and the image-cache lock key embeds both.
IDENTIFIER_RE = re.compile(r"^[A-Za-z0-9._-]+$")
IDENTIFIER_RULE = "may contain only letters, digits, '.', '-' and '_'"
# The owner id and provider names end up in labels and tags on every backend.
LABEL_VALUE_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SAFE_PATH_RE = re.compile(r"[^\s'\"]+")
# Paths inside the file are opened by the modules, whose working directory is a private
# run directory of ansible-runner, never the operator's: a relative path would silently
# name a file somewhere else (or nowhere).
ABSOLUTE_PATH_RULE = ("must be an absolute path (starting with /): the modules run in a working directory of "
                      "their own, not the one you wrote the file in")

T = TypeVar("T")


class ConfigError(Permanent):
    """The provider config is invalid; the message names the field path(s).

    ``errors`` holds each error on its own (the message joins them), so callers that
    print a report can list them one per line.
    """

    def __init__(self, message: str, errors: Optional[Sequence[str]] = None) -> None:
        super().__init__(message)
        self.errors: List[str] = list(errors) if errors else [message]


def _joined(errors: Sequence[str]) -> str:
    """One message for several errors; numbered, because the errors themselves contain ';'."""
    if len(errors) == 1:
        return errors[0]
    return "%d errors: %s" % (len(errors), " ".join("(%d) %s;" % (n, e) for n, e in enumerate(errors, 1))[:-1])


@dataclass(frozen=True)
class SshSettings:
    key_file: str
    known_hosts_file: str


@dataclass(frozen=True)
class KvmHost:
    name: str
    uri: str
    pool: str = "default"
    network: str = "default"
    domain_type: str = "kvm"


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

    def host(self, name: str) -> Optional[KvmHost]:
        for host in self.hosts:
            if host.name == name:
                return host
        return None


@dataclass(frozen=True)
class GcpSettings:
    project: str
    zones: Tuple[str, ...]
    machine_types: Dict[str, str]
    images: Dict[str, str]
    default_machine_type: str
    default_image: str
    network: str = "global/networks/default"
    credentials_file: Optional[str] = None
    external_ip: bool = True
    api_endpoint: Optional[str] = None
    subnetwork: Optional[str] = None
    """``regions/<region>/subnetworks/<name>`` or a full/partial URL; None = the network's own."""


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str
    """Where a Proxy without ``location`` gets its Pod."""
    image: str
    """The squid container image; it must have ``squid`` on its PATH."""
    kubeconfig: Optional[str] = None
    """Path of a kubeconfig file; None = in-cluster config (KUBERNETES_SERVICE_HOST)."""
    squid_config: Optional[str] = None
    """A squid.conf without ``http_port`` (the module adds one per Proxy); None = the built-in default."""
    host_network: bool = False
    spread_nodes: bool = True
    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    namespaces: Tuple[str, ...] = ()
    """Further namespaces a Proxy may name as its ``location`` (listing covers them all)."""

    @property
    def locations(self) -> Tuple[str, ...]:
        """Every namespace this provider creates Pods in and lists, the default first."""
        return (self.namespace, *(n for n in self.namespaces if n != self.namespace))


# What "serving" is checked against when a provider says nothing: a generate_204 URL and an
# HTTPS CONNECT to a well-known host, the checks crawler teams use themselves. Every one of them
# can be pointed at a self-hosted target; nothing in the controller depends on these hosts.
DEFAULT_PROBE_HTTP_URL = "http://connectivitycheck.gstatic.com/generate_204"
DEFAULT_PROBE_CONNECT = "www.google.com:443"
PROBE_KEYS = ("httpUrl", "expectStatus", "connect", "egressEchoUrl", "timeoutSeconds", "unhealthyAfterSeconds",
              "startupSeconds")
HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")


# Where crawlers may connect from when neither the provider nor the Proxy says: private, CGNAT
# and unique-local networks. Credentials are required on top; the whole Internet
# (0.0.0.0/0, ::/0) only when someone writes it.
DEFAULT_ALLOWED_SOURCES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")


@dataclass(frozen=True)
class ProbeSettings:
    """How the controller checks that this provider's proxies serve (a request through each).

    ``enabled`` False is ``probe: none``: the controller cannot reach the instances (a NAT'd
    network, the libvirt test driver's made-up addresses) and reports them unverified."""

    enabled: bool = True
    http_url: str = DEFAULT_PROBE_HTTP_URL
    expect_status: int = 204
    connect: Optional[str] = DEFAULT_PROBE_CONNECT
    egress_echo_url: Optional[str] = None
    timeout_seconds: int = 5
    unhealthy_after_seconds: int = 300
    # How long a new instance may take to serve for the first time (boot, cloud-init installing
    # squid) before "not serving" counts against it: a booting instance is not a dead one.
    startup_seconds: int = 900

    def as_dict(self) -> Dict[str, Any]:
        return {"enabled": self.enabled, "httpUrl": self.http_url, "expectStatus": self.expect_status,
                "connect": self.connect, "egressEchoUrl": self.egress_echo_url,
                "timeoutSeconds": self.timeout_seconds, "unhealthyAfterSeconds": self.unhealthy_after_seconds,
                "startupSeconds": self.startup_seconds}


@dataclass(frozen=True)
class Provider:
    """One provider entry: its settings when its section is valid, else its ``errors``.

    ``type`` is what the file says (possibly not a known type when ``errors`` says so)."""

    name: str
    type: str
    kvm: Optional[KvmSettings] = None
    gcp: Optional[GcpSettings] = None
    kubernetes: Optional[KubernetesSettings] = None
    errors: Tuple[str, ...] = ()
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    allowed_sources: Tuple[str, ...] = DEFAULT_ALLOWED_SOURCES
    """Networks crawlers may use this provider's proxies from, unless a Proxy says otherwise."""

    @property
    def valid(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class ProviderConfig:
    """A provider config whose root is valid; each provider may still carry section errors."""

    owner: str
    providers: Tuple[Provider, ...] = field(default_factory=tuple)
    path: Optional[str] = field(default=None, compare=False)
    """The file it was loaded from, for messages (None when parsed from a document)."""

    @property
    def errors(self) -> List[str]:
        """Every section error, in document order (a ProviderConfig has no root errors)."""
        return [error for provider in self.providers for error in provider.errors]

    @property
    def valid(self) -> bool:
        return not self.errors

    def provider(self, name: str, expected_type: Optional[str] = None) -> Provider:
        """The named provider, or a Permanent error naming the field and the choices.

        A provider whose own section is invalid fails here with every error of that section;
        errors in other providers' sections do not matter to it."""
        where = "provider config %s: " % self.path if self.path else ""
        for provider in self.providers:
            if provider.name != name:
                continue
            if provider.errors:
                raise ConfigError(
                    "%sprovider %r cannot be used until its section is fixed: %s" % (
                        where, name, _joined(provider.errors)), provider.errors)
            if expected_type is not None and provider.type != expected_type:
                raise ConfigError(
                    "provider: %r is a %s provider, not %s; use a %s module for it"
                    % (name, provider.type, expected_type, provider.type)
                )
            return provider
        known = ", ".join(p.name for p in self.providers) or "none"
        raise ConfigError(
            "provider: %r is not in the provider config (configured: %s); "
            "fix the Proxy's spec.provider or add the provider" % (name, known)
        )


@dataclass(frozen=True)
class ConfigReport:
    """Everything validation found in one document: what ``provider_config_info`` returns."""

    owner: Optional[str]
    """The owner, when it is valid."""
    providers: Tuple[Provider, ...]
    """Every entry with a usable, unique name, valid or not, in document order."""
    root_errors: Tuple[str, ...]
    """Errors that make the whole file unusable."""
    errors: Tuple[str, ...]
    """Every error, root and section, in document order."""

    @property
    def valid(self) -> bool:
        return not self.errors


class _Errors:
    """Collects errors instead of stopping at the first: each field is read through ``read``."""

    def __init__(self) -> None:
        self.messages: List[str] = []

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, message: str) -> None:
        self.messages.append(message)

    def read(self, reader: Callable[..., T], *args: Any, **kwargs: Any) -> Optional[T]:
        """``reader(*args, **kwargs)``, or None with its error recorded."""
        try:
            return reader(*args, **kwargs)
        except ConfigError as error:
            self.messages.extend(error.errors)
            return None


class _Reader:
    """Typed access to one mapping of the YAML document, with its field path.

    The typed getters raise ConfigError for their one field; callers read each field
    through ``_Errors.read`` so one bad field never hides the next."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError("%s: must be a mapping, got %s" % (path or "<document>", _kind(data)))
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return "%s.%s" % (self.path, key) if self.path else key

    def only(self, errors: _Errors, *allowed: str) -> None:
        """Every unknown key is an error of its own."""
        for key in self.data:
            if key not in allowed:
                errors.add("%s: unknown field; allowed fields here are %s" % (self.at(str(key)), ", ".join(allowed)))

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str, default: Optional[str] = None, pattern: Optional[re.Pattern[str]] = None,
               rule: str = "") -> str:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError("%s: required field is missing" % self.at(key))
        if not isinstance(value, str) or not value:
            raise ConfigError("%s: must be a non-empty string, got %s" % (self.at(key), _kind(value)))
        if pattern is not None and not pattern.fullmatch(value):
            raise ConfigError("%s: %r %s" % (self.at(key), value, rule))
        return value

    def optional_string(self, key: str) -> Optional[str]:
        if self.data.get(key) is None:
            return None
        return self.string(key)

    def absolute_path(self, key: str, required: bool, pattern: Optional[re.Pattern[str]] = None,
                      rule: str = "") -> Optional[str]:
        """A file path the modules open: absolute, because their working directory is not yours."""
        if not required and self.data.get(key) is None:
            return None
        value = self.string(key, pattern=pattern, rule=rule)
        if not value.startswith("/"):
            raise ConfigError("%s: %r %s" % (self.at(key), value, ABSOLUTE_PATH_RULE))
        return value

    def choice(self, key: str, choices: Tuple[str, ...], default: Optional[str] = None) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise ConfigError("%s: %r is not one of %s" % (self.at(key), value, ", ".join(choices)))
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError("%s: must be true or false, got %s" % (self.at(key), _kind(value)))
        return value

    def integer(self, key: str, minimum: int) -> int:
        value = self.data.get(key)
        if value is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError("%s: must be an integer >= %d, got %r" % (self.at(key), minimum, value))
        return value

    def mapping(self, key: str) -> "_Reader":
        if key not in self.data or self.data[key] is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        return _Reader(self.data[key], self.at(key))

    def non_empty_mapping(self, key: str) -> Dict[Any, Any]:
        reader = self.mapping(key)
        if not reader.data:
            raise ConfigError("%s: must have at least one entry" % self.at(key))
        return dict(reader.data)

    def non_empty_list(self, key: str) -> List[Any]:
        value = self.data.get(key)
        if value is None:
            raise ConfigError("%s: required field is missing" % self.at(key))
        if not isinstance(value, list) or not value:
            raise ConfigError("%s: must be a non-empty list, got %s" % (self.at(key), _kind(value)))
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return "%s %r" % (type(value).__name__, value) if isinstance(value, (int, float, str, bool)) else type(
        value).__name__


def _default_key(reader: _Reader, key: str, keys: Dict[str, Any], what: str) -> str:
    """A default* field must name one of the keys it picks from."""
    if not reader.has(key):
        if len(keys) == 1:
            return next(iter(keys))
        raise ConfigError("%s: required when more than one %s is configured" % (reader.at(key), what))
    value = reader.string(key)
    if value not in keys:
        raise ConfigError(
            "%s: %r is not a key of %s (keys: %s)" % (reader.at(key), value, what, ", ".join(sorted(keys)))
        )
    return value


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


# --- Provider sections: each reads every field and returns None when any was bad -------------


def _parse_kvm(reader: _Reader, errors: _Errors) -> Optional[KvmSettings]:
    start = len(errors)
    reader.only(errors, "ssh", "hosts", "images", "machineTypes", "defaultMachineType", "defaultImage",
                "vendorData", "installGuestAgent")
    ssh = None
    ssh_reader = errors.read(reader.mapping, "ssh") if reader.has("ssh") else None
    if ssh_reader is not None:
        ssh_reader.only(errors, "keyFile", "knownHostsFile")
        # Paths end up in ssh options (the qemu+ssh wrapper), where whitespace and quotes split them.
        path_rule = "must be a path without whitespace or quotes (ssh splits option values on them)"
        key_file = errors.read(ssh_reader.absolute_path, "keyFile", True, SAFE_PATH_RE, path_rule)
        known_hosts = errors.read(ssh_reader.absolute_path, "knownHostsFile", True, SAFE_PATH_RE, path_rule)
        if key_file is not None and known_hosts is not None:
            ssh = SshSettings(key_file, known_hosts)

    hosts: List[KvmHost] = []
    for index, raw in enumerate(errors.read(reader.non_empty_list, "hosts") or []):
        host = errors.read(_Reader, raw, "%s[%d]" % (reader.at("hosts"), index))
        if host is None:
            continue
        host.only(errors, "name", "uri", "pool", "network", "domainType")
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
        if name is not None and uri is not None and pool is not None and network is not None \
                and domain_type is not None:
            hosts.append(KvmHost(name=name, uri=uri, pool=pool, network=network, domain_type=domain_type))

    images: Dict[str, KvmImage] = {}
    for key, raw in (errors.read(reader.non_empty_mapping, "images") or {}).items():
        path = "%s.%s" % (reader.at("images"), key)
        if not isinstance(key, str) or not IDENTIFIER_RE.fullmatch(key):
            errors.add("%s: image key %r %s, because it names the cached volume base-<key>.<format> "
                       "and its download lock; rename the key" % (path, key, IDENTIFIER_RULE))
            continue
        image = errors.read(_Reader, raw, path)
        if image is None:
            continue
        image.only(errors, "url", "sha256", "format")
        url = errors.read(image.string, "url")
        sha = errors.read(image.string, "sha256", pattern=SHA256_RE,
                          rule="must be 64 lowercase hex digits (sha256sum's output)")
        image_format = errors.read(image.choice, "format", IMAGE_FORMATS, "qcow2")
        if url is not None and sha is not None and image_format is not None:
            images[key] = KvmImage(key=key, url=url, sha256=sha, format=image_format)

    machine_types: Dict[str, KvmMachineType] = {}
    for key, raw in (errors.read(reader.non_empty_mapping, "machineTypes") or {}).items():
        machine = errors.read(_Reader, raw, "%s.%s" % (reader.at("machineTypes"), key))
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

    # A default is checked against the keys as written, even when one of their entries is bad.
    default_machine_type = errors.read(_default_key, reader, "defaultMachineType",
                                       _keys(reader, "machineTypes"), "machineTypes")
    default_image = errors.read(_default_key, reader, "defaultImage", _keys(reader, "images"), "images")
    vendor_data = reader.data.get("vendorData")
    if vendor_data is not None and not isinstance(vendor_data, str):
        errors.add("%s: must be a string (a cloud-init document) or null" % reader.at("vendorData"))
    install_guest_agent = errors.read(reader.boolean, "installGuestAgent", True)
    if len(errors) > start or default_machine_type is None or default_image is None or install_guest_agent is None:
        return None
    return KvmSettings(
        hosts=tuple(hosts), images=images, machine_types=machine_types,
        default_machine_type=default_machine_type, default_image=default_image,
        ssh=ssh, vendor_data=vendor_data, install_guest_agent=install_guest_agent)


def _keys(reader: _Reader, key: str) -> Dict[str, Any]:
    """The keys of a mapping field as written (empty when it is missing or not a mapping)."""
    value = reader.data.get(key)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


# A subnetwork as the Compute API takes it: regions/<region>/subnetworks/<name>, optionally
# preceded by projects/<project>/ and by the API's own URL prefix.
GCP_SUBNETWORK_RE = re.compile(
    r"^(?:https://[A-Za-z0-9.-]+(?::[0-9]+)?/compute/(?:v1|beta|alpha)/)?"
    r"(?:projects/[a-z][-a-z0-9.:]*[a-z0-9]/)?"
    r"regions/(?P<region>[a-z0-9-]+)/subnetworks/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def _parse_gcp(reader: _Reader, errors: _Errors) -> Optional[GcpSettings]:
    start = len(errors)
    reader.only(errors, "project", "zones", "machineTypes", "images", "defaultMachineType", "defaultImage",
                "network", "subnetwork", "credentialsFile", "externalIP", "apiEndpoint")
    # Fields are checked in the order docs/gcp-provider.md documents them, so errors are listed in the
    # order a reader of the file meets them.
    project = errors.read(reader.string, "project", pattern=re.compile(r"[a-z][-a-z0-9.:]{4,61}[a-z0-9]"),
                          rule="is not a GCP project id")
    zones: List[str] = []
    for index, zone in enumerate(errors.read(reader.non_empty_list, "zones") or []):
        if not isinstance(zone, str) or not re.fullmatch(r"[a-z0-9-]+", zone):
            errors.add("%s[%d]: %r is not a zone name such as europe-west1-b" % (reader.at("zones"), index, zone))
        else:
            zones.append(zone)
    tables: Dict[str, Dict[str, str]] = {}
    for what in ("machineTypes", "images"):
        table = errors.read(reader.non_empty_mapping, what)
        tables[what] = {}
        for key, value in (table or {}).items():
            if not isinstance(value, str) or not value:
                errors.add("%s.%s: must be a non-empty string" % (reader.at(what), key))
            else:
                tables[what][str(key)] = value
    default_machine_type = errors.read(_default_key, reader, "defaultMachineType", _keys(reader, "machineTypes"),
                                       "machineTypes")
    default_image = errors.read(_default_key, reader, "defaultImage", _keys(reader, "images"), "images")
    network = errors.read(reader.string, "network", "global/networks/default")
    subnetwork = errors.read(_gcp_subnetwork, reader, zones)
    credentials_file = errors.read(reader.absolute_path, "credentialsFile", False)
    external_ip = errors.read(reader.boolean, "externalIP", True)
    api_endpoint = errors.read(_gcp_api_endpoint, reader)
    if len(errors) > start or project is None or default_machine_type is None or default_image is None \
            or network is None or external_ip is None:
        return None
    return GcpSettings(
        project=project, zones=tuple(zones), machine_types=tables["machineTypes"], images=tables["images"],
        default_machine_type=default_machine_type, default_image=default_image, network=network,
        credentials_file=credentials_file, external_ip=external_ip, api_endpoint=api_endpoint,
        subnetwork=subnetwork)


def _gcp_subnetwork(reader: _Reader, zones: List[str]) -> Optional[str]:
    """A subnetwork belongs to one region: every zone must be in it, or inserts there would fail."""
    subnetwork = reader.optional_string("subnetwork")
    if subnetwork is None:
        return None
    match = GCP_SUBNETWORK_RE.fullmatch(subnetwork)
    if match is None:
        raise ConfigError("%s: %r is not a subnetwork such as regions/europe-west1/subnetworks/egress (or its "
                          "full URL, https://www.googleapis.com/compute/v1/projects/<project>/regions/<region>/"
                          "subnetworks/<name>)" % (reader.at("subnetwork"), subnetwork))
    region = match.group("region")
    outside = [zone for zone in zones if zone.rsplit("-", 1)[0] != region]
    if outside:
        raise ConfigError("%s: is in region %s, but zones %s are not; a subnetwork serves one region, so list "
                          "only that region's zones (or drop subnetwork)" % (
                              reader.at("subnetwork"), region, ", ".join(outside)))
    return subnetwork


def _gcp_api_endpoint(reader: _Reader) -> Optional[str]:
    """``https://`` anywhere; plain ``http://`` only on loopback (a local emulator), because a
    token sent over plain HTTP to anywhere else would be readable on the way."""
    endpoint = reader.optional_string("apiEndpoint")
    if endpoint is None:
        return None
    parts = urlsplit(endpoint)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    if not parts.hostname or parts.scheme not in ("http", "https") or (parts.scheme == "http" and not loopback):
        raise ConfigError("%s: %r must be an https:// URL, or http:// on 127.0.0.1, localhost or [::1] for a "
                          "local emulator" % (reader.at("apiEndpoint"), endpoint))
    return endpoint


# A namespace name is an RFC 1123 label (providerIDs rely on it: k8s://namespaces/<ns>/pods/<name>).
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NAMESPACE_RULE = "is not a valid Kubernetes namespace name (RFC 1123 label: lowercase letters, digits, '-')"
# A Kubernetes resource quantity as requests take it ("100m", "0.5", "128Mi", "1G").
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
QUANTITY_RULE = "is not a Kubernetes quantity such as 100m, 0.5, 128Mi or 1Gi"
# squid.conf travels in a Pod annotation (all annotations together are capped at 256 KiB).
SQUID_CONFIG_MAX_BYTES = 64 * 1024
_HTTP_PORT_LINE = re.compile(r"^[ \t]*http_port\b", re.MULTILINE)


def _parse_kubernetes(reader: _Reader, errors: _Errors) -> Optional[KubernetesSettings]:
    start = len(errors)
    reader.only(errors, "namespace", "namespaces", "image", "kubeconfig", "squidConfig", "hostNetwork",
                "spreadNodes", "cpuRequest", "memoryRequest")
    namespace = errors.read(reader.string, "namespace", pattern=NAMESPACE_RE, rule=NAMESPACE_RULE)
    namespaces: List[str] = []
    if reader.data.get("namespaces") is not None:
        for index, item in enumerate(errors.read(reader.non_empty_list, "namespaces") or []):
            if not isinstance(item, str) or not NAMESPACE_RE.fullmatch(item):
                errors.add("%s[%d]: %r %s" % (reader.at("namespaces"), index, item, NAMESPACE_RULE))
            else:
                namespaces.append(item)
    image = errors.read(reader.string, "image")
    if image is not None and any(char.isspace() for char in image):
        errors.add("%s: %r is not a container image reference (it contains whitespace)" % (reader.at("image"), image))
    kubeconfig = errors.read(reader.absolute_path, "kubeconfig", False)
    squid_config = errors.read(reader.optional_string, "squidConfig")
    if squid_config is not None:
        if len(squid_config.encode("utf-8")) > SQUID_CONFIG_MAX_BYTES:
            errors.add("%s: is longer than %d bytes; it travels in a Pod annotation" % (
                reader.at("squidConfig"), SQUID_CONFIG_MAX_BYTES))
        elif _HTTP_PORT_LINE.search(squid_config):
            errors.add("%s: must not contain http_port: the module adds 'http_port <port>' from each "
                       "Proxy's port; remove the line" % reader.at("squidConfig"))
    host_network = errors.read(reader.boolean, "hostNetwork", False)
    spread_nodes = errors.read(reader.boolean, "spreadNodes", True)
    cpu_request = errors.read(reader.string, "cpuRequest", "100m", pattern=QUANTITY_RE, rule=QUANTITY_RULE)
    memory_request = errors.read(reader.string, "memoryRequest", "128Mi", pattern=QUANTITY_RE, rule=QUANTITY_RULE)
    if len(errors) > start or namespace is None or image is None or host_network is None or spread_nodes is None \
            or cpu_request is None or memory_request is None:
        return None
    return KubernetesSettings(
        namespace=namespace, image=image, kubeconfig=kubeconfig, squid_config=squid_config,
        host_network=host_network, spread_nodes=spread_nodes, cpu_request=cpu_request,
        memory_request=memory_request, namespaces=tuple(namespaces))


_SECTION_PARSERS: Dict[str, Callable[[_Reader, _Errors], Any]] = {
    "kvm": _parse_kvm, "gcp": _parse_gcp, "kubernetes": _parse_kubernetes}


def _parse_provider(item: _Reader, name: str) -> Provider:
    """One provider entry, its section validated on its own."""
    errors = _Errors()
    raw_type = item.data.get("type")
    provider_type = errors.read(item.choice, "type", PROVIDER_TYPES)
    if provider_type is None:
        # Without a known type there is no section to read; its errors would only be noise.
        return Provider(name, raw_type if isinstance(raw_type, str) else "", errors=tuple(errors.messages))
    item.only(errors, "name", "type", "probe", "allowedSources", provider_type)
    section = errors.read(item.mapping, provider_type)
    settings = _SECTION_PARSERS[provider_type](section, errors) if section is not None else None
    probe = _parse_probe(item, errors)
    sources = _parse_sources(item, errors)
    if errors.messages or settings is None or probe is None:
        return Provider(name, provider_type, errors=tuple(errors.messages))
    return Provider(name, provider_type, probe=probe, allowed_sources=sources, **{provider_type: settings})


def _parse_sources(item: _Reader, errors: _Errors) -> Tuple[str, ...]:
    """``allowedSources``: CIDRs crawlers may connect from (a squid ``src`` ACL on every proxy)."""
    if item.data.get("allowedSources") is None:
        return DEFAULT_ALLOWED_SOURCES
    raw = errors.read(item.non_empty_list, "allowedSources")
    sources: List[str] = []
    for index, value in enumerate(raw or []):
        where = "%s[%d]" % (item.at("allowedSources"), index)
        if not isinstance(value, str):
            errors.add("%s: must be a CIDR string, got %s" % (where, _kind(value)))
            continue
        try:
            sources.append(str(ipaddress.ip_network(value, strict=True)))
        except ValueError as error:
            errors.add("%s: %r is not a network in CIDR form such as 10.0.0.0/8 (%s)" % (where, value, error))
    return tuple(sources)


def _parse_probe(item: _Reader, errors: _Errors) -> Optional[ProbeSettings]:
    """``probe``: absent (the defaults), ``none`` (unverified), or a mapping of PROBE_KEYS."""
    value = item.data.get("probe")
    if value is None:
        return ProbeSettings()
    if value == "none":
        return ProbeSettings(enabled=False)
    before = len(errors)
    reader = errors.read(_Reader, value, item.at("probe"))
    if reader is None:
        errors.messages[-1] += " or the string none (the instances cannot be reached to check them)"
        return None
    reader.only(errors, *PROBE_KEYS)
    url_rule = "must be an http:// URL (the check sends a plain-HTTP request through the proxy)"
    http_url = errors.read(reader.string, "httpUrl", DEFAULT_PROBE_HTTP_URL, pattern=re.compile(r"^http://\S+$"),
                           rule=url_rule)
    echo = None
    if reader.has("egressEchoUrl"):
        echo = errors.read(reader.string, "egressEchoUrl", pattern=re.compile(r"^http://\S+$"), rule=url_rule)
    connect: Optional[str] = DEFAULT_PROBE_CONNECT
    if "connect" in reader.data and reader.data["connect"] in (None, "none"):
        connect = None
    elif reader.has("connect"):
        connect = errors.read(reader.string, "connect", pattern=HOST_PORT_RE,
                              rule="must be host:port (the HTTPS CONNECT check's target), or none")

    def number(key: str, default: int, minimum: int, maximum: int) -> int:
        if not reader.has(key):
            return default
        found = errors.read(reader.integer, key, minimum)
        if found is not None and found > maximum:
            errors.add("%s: must be at most %d, got %d" % (reader.at(key), maximum, found))
        return found if found is not None else default

    status = number("expectStatus", 204, 100, 599)
    timeout = number("timeoutSeconds", 5, 1, 60)
    unhealthy = number("unhealthyAfterSeconds", 300, 30, 86400)
    startup = number("startupSeconds", 900, 30, 86400)
    if len(errors) > before or http_url is None:
        return None
    return ProbeSettings(enabled=True, http_url=http_url, expect_status=status, connect=connect,
                         egress_echo_url=echo, timeout_seconds=timeout, unhealthy_after_seconds=unhealthy,
                         startup_seconds=startup)


def validate_provider_config(document: Any) -> ConfigReport:
    """Validate a loaded YAML document and report every error; never raises for a bad document."""
    errors = _Errors()  # every error, in document order
    root = _Errors()
    root_reader = root.read(_Reader, document, "")
    if root_reader is None:
        return ConfigReport(owner=None, providers=(), root_errors=tuple(root.messages),
                            errors=tuple(root.messages))
    root_reader.only(root, "owner", "providers")
    owner = root.read(root_reader.string, "owner", pattern=LABEL_VALUE_RE,
                      rule="must be 1-63 lowercase letters, digits, '-' or '_', starting and ending with a "
                      "letter or digit, because it is written into labels on every backend")
    entries = root.read(root_reader.non_empty_list, "providers") or []
    errors.messages.extend(root.messages)
    providers: List[Provider] = []
    for index, raw in enumerate(entries):
        before = len(root)
        item = root.read(_Reader, raw, "providers[%d]" % index)
        name = None
        if item is not None:
            name = root.read(item.string, "name", pattern=LABEL_VALUE_RE,
                             rule="must be 1-63 lowercase letters, digits, '-' or '_' (it is used in labels)")
            if name is not None and any(p.name == name for p in providers):
                root.add("%s: duplicate provider name %r; names must be unique" % (item.at("name"), name))
                name = None
        errors.messages.extend(root.messages[before:])
        if item is not None and name is not None:
            provider = _parse_provider(item, name)
            errors.messages.extend(provider.errors)
            providers.append(provider)
    return ConfigReport(owner=owner, providers=tuple(providers), root_errors=tuple(root.messages),
                        errors=tuple(errors.messages))


def parse_provider_config(document: Any) -> ProviderConfig:
    """Validate a loaded YAML document.

    Root errors raise ConfigError listing every error of the document; section errors do
    not: the provider carries them and only ``ProviderConfig.provider`` for it fails."""
    report = validate_provider_config(document)
    if report.root_errors or report.owner is None:
        raise ConfigError(_joined(report.errors), report.errors)
    return ProviderConfig(owner=report.owner, providers=report.providers)


def config_errors(document_or_config: Union[ProviderConfig, Any]) -> List[str]:
    """Every error, root and section, of a loaded document or a parsed config."""
    if isinstance(document_or_config, ProviderConfig):
        return document_or_config.errors
    return list(validate_provider_config(document_or_config).errors)


def read_provider_config_document(path: str) -> Any:
    """The YAML document at ``path``; ConfigError when it cannot be read or is not YAML."""
    if yaml is None:
        raise ConfigError("PyYAML is required to read the provider config; install it")
    try:
        with open(path, "rb") as handle:
            return yaml.safe_load(handle)
    except OSError as error:
        raise ConfigError("provider_config: cannot read %s: %s" % (path, error.strerror)) from error
    except yaml.YAMLError as error:
        raise ConfigError("provider_config: %s is not valid YAML: %s" % (path, error)) from error


def load_provider_config(path: str) -> ProviderConfig:
    """Read and validate the provider config file at ``path`` (see ``parse_provider_config``)."""
    document = read_provider_config_document(path)
    try:
        config = parse_provider_config(document)
    except ConfigError as error:
        raise ConfigError("provider config %s: %s" % (path, error), error.errors) from error
    return ProviderConfig(owner=config.owner, providers=config.providers, path=path)
