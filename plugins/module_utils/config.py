# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The provider config file: one YAML document, validated whole at load.

Validation is first-error-wins and every message names the field path
(``providers[0].kvm.hosts[2].name``), what is wrong and how to fix it. Unknown keys
are errors too, so a typo (``domaintype``) never silently falls back to a default.
All three provider types are validated here, whichever provider a module asks for,
so a broken file fails the same way everywhere.

A bad config is a ``Permanent`` error: retrying cannot fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

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


class ConfigError(Permanent):
    """The provider config is invalid; the message names the field path."""


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


@dataclass(frozen=True)
class Provider:
    name: str
    type: str
    kvm: Optional[KvmSettings] = None
    gcp: Optional[GcpSettings] = None
    kubernetes: Optional[KubernetesSettings] = None


@dataclass(frozen=True)
class ProviderConfig:
    owner: str
    providers: Tuple[Provider, ...] = field(default_factory=tuple)

    def provider(self, name: str, expected_type: Optional[str] = None) -> Provider:
        """The named provider, or a Permanent error naming the field and the choices."""
        for provider in self.providers:
            if provider.name == name:
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


class _Reader:
    """Typed access to one mapping of the YAML document, with its field path."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError("%s: must be a mapping, got %s" % (path or "<document>", _kind(data)))
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return "%s.%s" % (self.path, key) if self.path else key

    def only(self, *allowed: str) -> None:
        for key in self.data:
            if key not in allowed:
                raise ConfigError(
                    "%s: unknown field; allowed fields here are %s" % (self.at(str(key)), ", ".join(allowed))
                )

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


def _parse_kvm(reader: _Reader) -> KvmSettings:
    reader.only("ssh", "hosts", "images", "machineTypes", "defaultMachineType", "defaultImage",
                "vendorData", "installGuestAgent")
    ssh = None
    if reader.has("ssh"):
        ssh_reader = reader.mapping("ssh")
        ssh_reader.only("keyFile", "knownHostsFile")
        # Paths end up in ssh options (the qemu+ssh wrapper), where whitespace and quotes split them.
        path_rule = "must be a path without whitespace or quotes (ssh splits option values on them)"
        ssh = SshSettings(ssh_reader.string("keyFile", pattern=SAFE_PATH_RE, rule=path_rule),
                          ssh_reader.string("knownHostsFile", pattern=SAFE_PATH_RE, rule=path_rule))

    hosts: List[KvmHost] = []
    for index, raw in enumerate(reader.non_empty_list("hosts")):
        host = _Reader(raw, "%s[%d]" % (reader.at("hosts"), index))
        host.only("name", "uri", "pool", "network", "domainType")
        name = host.string(
            "name", pattern=IDENTIFIER_RE,
            rule=IDENTIFIER_RULE + ", because it becomes part of providerIDs (kvm://hosts/<name>/domains/...); "
            "rename the host")
        if any(h.name == name for h in hosts):
            raise ConfigError("%s: duplicate host name %r; host names must be unique" % (host.at("name"), name))
        uri = host.string("uri")
        if "://" not in uri:
            raise ConfigError("%s: %r is not a libvirt URI such as qemu+libssh://root@host/system" % (
                host.at("uri"), uri))
        if _is_ssh_uri(uri) and ssh is None:
            raise ConfigError("%s: is an SSH URI, so %s is required (keyFile and knownHostsFile)" % (
                host.at("uri"), reader.at("ssh")))
        hosts.append(KvmHost(
            name=name, uri=uri, pool=host.string("pool", "default"), network=host.string("network", "default"),
            domain_type=host.choice("domainType", DOMAIN_TYPES, "kvm")))

    images: Dict[str, KvmImage] = {}
    for key, raw in reader.non_empty_mapping("images").items():
        path = "%s.%s" % (reader.at("images"), key)
        if not isinstance(key, str) or not IDENTIFIER_RE.fullmatch(key):
            raise ConfigError(
                "%s: image key %r %s, because it names the cached volume base-<key>.<format> "
                "and its download lock; rename the key" % (path, key, IDENTIFIER_RULE))
        image = _Reader(raw, path)
        image.only("url", "sha256", "format")
        sha = image.string("sha256", pattern=SHA256_RE, rule="must be 64 lowercase hex digits (sha256sum's output)")
        images[key] = KvmImage(key=key, url=image.string("url"), sha256=sha,
                               format=image.choice("format", IMAGE_FORMATS, "qcow2"))

    machine_types: Dict[str, KvmMachineType] = {}
    for key, raw in reader.non_empty_mapping("machineTypes").items():
        machine = _Reader(raw, "%s.%s" % (reader.at("machineTypes"), key))
        machine.only("vcpus", "memoryMiB", "diskGiB", "machine")
        machine_types[str(key)] = KvmMachineType(
            vcpus=machine.integer("vcpus", 1), memory_mib=machine.integer("memoryMiB", 64),
            disk_gib=machine.integer("diskGiB", 1), machine=machine.optional_string("machine"))

    default_machine_type = _default_key(reader, "defaultMachineType", machine_types, "machineTypes")
    default_image = _default_key(reader, "defaultImage", images, "images")
    vendor_data = reader.data.get("vendorData")
    if vendor_data is not None and not isinstance(vendor_data, str):
        raise ConfigError("%s: must be a string (a cloud-init document) or null" % reader.at("vendorData"))
    return KvmSettings(
        hosts=tuple(hosts), images=images, machine_types=machine_types,
        default_machine_type=default_machine_type, default_image=default_image,
        ssh=ssh, vendor_data=vendor_data, install_guest_agent=reader.boolean("installGuestAgent", True))


def _parse_gcp(reader: _Reader) -> GcpSettings:
    reader.only("project", "zones", "machineTypes", "images", "defaultMachineType", "defaultImage", "network",
                "credentialsFile", "externalIP", "apiEndpoint")
    # Fields are checked in the order design.md documents them, so the first error reported
    # is the first one a reader of the file meets.
    project = reader.string("project", pattern=re.compile(r"[a-z][-a-z0-9.:]{4,61}[a-z0-9]"),
                            rule="is not a GCP project id")
    zones = reader.non_empty_list("zones")
    for index, zone in enumerate(zones):
        if not isinstance(zone, str) or not re.fullmatch(r"[a-z0-9-]+", zone):
            raise ConfigError("%s[%d]: %r is not a zone name such as europe-west1-b" % (
                reader.at("zones"), index, zone))
    machine_types = {str(k): v for k, v in reader.non_empty_mapping("machineTypes").items()}
    images = {str(k): v for k, v in reader.non_empty_mapping("images").items()}
    for what, table in (("machineTypes", machine_types), ("images", images)):
        for key, value in table.items():
            if not isinstance(value, str) or not value:
                raise ConfigError("%s.%s: must be a non-empty string" % (reader.at(what), key))
    return GcpSettings(
        project=project, zones=tuple(zones), machine_types=machine_types, images=images,
        default_machine_type=_default_key(reader, "defaultMachineType", machine_types, "machineTypes"),
        default_image=_default_key(reader, "defaultImage", images, "images"),
        network=reader.string("network", "global/networks/default"),
        credentials_file=reader.optional_string("credentialsFile"),
        external_ip=reader.boolean("externalIP", True), api_endpoint=_gcp_api_endpoint(reader))


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


def _parse_kubernetes(reader: _Reader) -> KubernetesSettings:
    reader.only("namespace", "namespaces", "image", "kubeconfig", "squidConfig", "hostNetwork", "spreadNodes",
                "cpuRequest", "memoryRequest")
    namespace = reader.string("namespace", pattern=NAMESPACE_RE, rule=NAMESPACE_RULE)
    namespaces: List[str] = []
    if reader.data.get("namespaces") is not None:
        for index, item in enumerate(reader.non_empty_list("namespaces")):
            if not isinstance(item, str) or not NAMESPACE_RE.fullmatch(item):
                raise ConfigError("%s[%d]: %r %s" % (reader.at("namespaces"), index, item, NAMESPACE_RULE))
            namespaces.append(item)
    image = reader.string("image")
    if any(char.isspace() for char in image):
        raise ConfigError("%s: %r is not a container image reference (it contains whitespace)" % (
            reader.at("image"), image))
    squid_config = reader.optional_string("squidConfig")
    if squid_config is not None:
        if len(squid_config.encode("utf-8")) > SQUID_CONFIG_MAX_BYTES:
            raise ConfigError("%s: is longer than %d bytes; it travels in a Pod annotation" % (
                reader.at("squidConfig"), SQUID_CONFIG_MAX_BYTES))
        if _HTTP_PORT_LINE.search(squid_config):
            raise ConfigError("%s: must not contain http_port: the module adds 'http_port <port>' from each "
                              "Proxy's port; remove the line" % reader.at("squidConfig"))
    return KubernetesSettings(
        namespace=namespace, image=image, kubeconfig=reader.optional_string("kubeconfig"),
        squid_config=squid_config, host_network=reader.boolean("hostNetwork", False),
        spread_nodes=reader.boolean("spreadNodes", True),
        cpu_request=reader.string("cpuRequest", "100m", pattern=QUANTITY_RE, rule=QUANTITY_RULE),
        memory_request=reader.string("memoryRequest", "128Mi", pattern=QUANTITY_RE, rule=QUANTITY_RULE),
        namespaces=tuple(namespaces))


def _is_ssh_uri(uri: str) -> bool:
    scheme = uri.split("://", 1)[0]
    return scheme.split("+", 1)[-1] in ("ssh", "libssh", "libssh2") if "+" in scheme else False


def parse_provider_config(document: Any) -> ProviderConfig:
    """Validate a loaded YAML document; raises ConfigError at the first bad field."""
    root = _Reader(document, "")
    root.only("owner", "providers")
    owner = root.string("owner", pattern=LABEL_VALUE_RE,
                        rule="must be 1-63 lowercase letters, digits, '-' or '_', starting and ending with a "
                        "letter or digit, because it is written into labels on every backend")
    providers: List[Provider] = []
    for index, raw in enumerate(root.non_empty_list("providers")):
        item = _Reader(raw, "providers[%d]" % index)
        name = item.string("name", pattern=LABEL_VALUE_RE,
                           rule="must be 1-63 lowercase letters, digits, '-' or '_' (it is used in labels)")
        if any(p.name == name for p in providers):
            raise ConfigError("%s: duplicate provider name %r; names must be unique" % (item.at("name"), name))
        kind = item.choice("type", PROVIDER_TYPES)
        item.only("name", "type", kind)
        section = item.mapping(kind)
        if kind == "kvm":
            providers.append(Provider(name, kind, kvm=_parse_kvm(section)))
        elif kind == "gcp":
            providers.append(Provider(name, kind, gcp=_parse_gcp(section)))
        else:
            providers.append(Provider(name, kind, kubernetes=_parse_kubernetes(section)))
    return ProviderConfig(owner=owner, providers=tuple(providers))


def load_provider_config(path: str) -> ProviderConfig:
    """Read and validate the provider config file at ``path``."""
    if yaml is None:
        raise ConfigError("PyYAML is required to read the provider config; install it")
    try:
        with open(path, "rb") as handle:
            document = yaml.safe_load(handle)
    except OSError as error:
        raise ConfigError("provider_config: cannot read %s: %s" % (path, error.strerror)) from error
    except yaml.YAMLError as error:
        raise ConfigError("provider_config: %s is not valid YAML: %s" % (path, error)) from error
    try:
        return parse_provider_config(document)
    except ConfigError as error:
        raise ConfigError("provider config %s: %s" % (path, error)) from error
