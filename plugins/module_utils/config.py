# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The provider config file: one YAML document, every error reported with its field path.

Each provider section is validated on its own, and every error is collected (not only the
first), each naming the field path (``providers[0].kvm.hosts[2].name``), what is wrong and
how to fix it. Unknown keys are errors too, so a typo (``domaintype``) never silently falls
back to a default.

This module reads the root and what every provider entry has (``name``, ``type``, ``probe``,
``allowedSources``, ``allowedDestinations``); each provider type's section is read by its own ``settings.py``
(``kvm/``, ``gcp/``, ``k8s/``), named once in ``_SECTION_PARSERS``, with the helpers of
``config_reader.py``.

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
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

try:
    import yaml
except ImportError:  # pragma: no cover - reported by the modules via missing_required_lib
    yaml = None  # type: ignore[assignment]
    HAS_YAML = False
else:
    HAS_YAML = True

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import (
    ConfigError,
    Errors,
    Reader,
    joined,
    kind_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings, parse_gcp_section
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import (
    KubernetesSettings,
    parse_kubernetes_section,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmSettings, parse_kvm_section
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_networks import PRIVATE_SOURCES

# Each provider type and the parser of its section (the entry's field named after the type).
# A new provider type is its <type>/settings.py and one entry here; a typed view on Provider
# (as ``Provider.kvm``) only if its modules want one.
_SECTION_PARSERS: Dict[str, Callable[[Reader, Errors], Optional[object]]] = {
    "kvm": parse_kvm_section, "gcp": parse_gcp_section, "kubernetes": parse_kubernetes_section}
PROVIDER_TYPES = tuple(_SECTION_PARSERS)

# The owner id and provider names end up in labels and tags on every backend.
LABEL_VALUE_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")


# What the probe is checked against is the operator's own probe target (``egress-proxies
# probe-target``, docs/operations.md): only it can answer the probe's nonces, with the key both
# sides read from ``keyFile``. No public default can, so a provider without a ``probe`` section has
# no target: its proxies are never Ready until one is named (the controller says so in their
# Serving condition), and nothing else about the provider changes.
PROBE_KEYS = ("httpUrl", "keyFile", "expectStatus", "connect", "egressEchoUrl", "controlUrl", "timeoutSeconds",
              "unhealthyAfterSeconds", "startupSeconds", "concurrency", "roundSeconds", "flapWindow",
              "flapPercent")
HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")
_URL_HOST_RE = re.compile(r"^http://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]+)?(/\S*)?$")
# The control listener answers the proof of a 204 only, never the echo.
_CONTROL_URL_RE = re.compile(r"^(?!\S*/echo(\?\S*)?$)" + _URL_HOST_RE.pattern[1:])
# The HTTPS port a probe target's tunnel listens on: squid tunnels to 443 only (SSL_ports).
PROBE_TUNNEL_PORT = 443
# (default, minimum, maximum) of each numeric probe setting.
PROBE_NUMBERS = {
    "expectStatus": (204, 100, 599),
    # Seconds for one check through the proxy (connecting included).
    "timeoutSeconds": (5, 1, 60),
    "unhealthyAfterSeconds": (300, 30, 86400),
    "startupSeconds": (900, 30, 86400),
    # Probes of this provider in flight at once (its own share: another provider's never wait).
    "concurrency": (200, 1, 10000),
    # How long one round of this provider may start probes; the ones it did not start wait for
    # the next round (their last verdict stands).
    "roundSeconds": (30, 5, 3600),
    # A chronic flapper: at least flapPercent % of the last flapWindow probes of an instance
    # failed, in at least three separate spells; it is replaced (a single outage is not flapping).
    "flapWindow": (30, 6, 1000),
    "flapPercent": (25, 5, 90),
}


# Where crawlers may connect from when neither the provider nor the Proxy says: private, CGNAT
# and unique-local networks. Credentials are required on top; the whole Internet
# (0.0.0.0/0, ::/0) only when someone writes it.
DEFAULT_ALLOWED_SOURCES = PRIVATE_SOURCES


@dataclass(frozen=True)
class ProbeSettings:
    """How the controller checks that this provider's proxies serve (a request through each).

    ``enabled`` False is ``probe: none``: the controller cannot reach the instances (a NAT'd
    network, the libvirt test driver's made-up addresses) and reports them unverified.
    ``http_url`` None (no ``probe`` section): probed, but no probe target is named yet."""

    enabled: bool = True
    http_url: Optional[str] = None
    key_file: Optional[str] = None
    expect_status: int = 204
    connect: Optional[str] = None
    egress_echo_url: Optional[str] = None
    # The probe target's control listener (--control-listen): where the controller asks the target
    # directly, out of strangers' reach; None: it asks httpUrl, the tunnel port and the echo.
    control_url: Optional[str] = None
    timeout_seconds: int = 5
    unhealthy_after_seconds: int = 300
    # How long a new instance may take to serve for the first time (boot, cloud-init installing
    # squid) before "not serving" counts against it: a booting instance is not a dead one.
    startup_seconds: int = 900
    concurrency: int = 200
    round_seconds: int = 30
    flap_window: int = 30
    flap_percent: int = 25

    def as_dict(self) -> Dict[str, Any]:
        return {"enabled": self.enabled, "httpUrl": self.http_url, "keyFile": self.key_file,
                "expectStatus": self.expect_status, "connect": self.connect, "egressEchoUrl": self.egress_echo_url,
                "controlUrl": self.control_url, "timeoutSeconds": self.timeout_seconds,
                "unhealthyAfterSeconds": self.unhealthy_after_seconds,
                "startupSeconds": self.startup_seconds, "concurrency": self.concurrency,
                "roundSeconds": self.round_seconds, "flapWindow": self.flap_window, "flapPercent": self.flap_percent}


@dataclass(frozen=True)
class Provider:
    """One provider entry: its settings when its section is valid, else its ``errors``.

    ``type`` is what the file says (possibly not a known type when ``errors`` says so)."""

    name: str
    type: str
    settings: Optional[object] = None
    """What its section's parser (``_SECTION_PARSERS``) returned; None when ``errors``."""
    errors: Tuple[str, ...] = ()
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    allowed_sources: Tuple[str, ...] = DEFAULT_ALLOWED_SOURCES
    """Networks crawlers may use this provider's proxies from, unless a Proxy says otherwise."""
    allowed_destinations: Tuple[str, ...] = ()
    """Internal networks this provider's proxies may reach, unless a Proxy says otherwise."""
    probe_sources: Tuple[str, ...] = ()
    """The root's ``probeSources``: where the controller's probes arrive from; a provider whose
    proxies are public admits them besides the crawlers' sources."""
    location_errors: Tuple[str, ...] = ()
    """Errors that keep single locations (a KVM host's networking) from new proxies: the provider
    stays usable for the others at run time, but the file is not valid (``ConfigReport.errors``)."""

    @property
    def valid(self) -> bool:
        return not self.errors

    # Typed views of ``settings`` for each type's modules: None for a provider of another type.

    @property
    def kvm(self) -> Optional[KvmSettings]:
        return self.settings if isinstance(self.settings, KvmSettings) else None

    @property
    def gcp(self) -> Optional[GcpSettings]:
        return self.settings if isinstance(self.settings, GcpSettings) else None

    @property
    def kubernetes(self) -> Optional[KubernetesSettings]:
        return self.settings if isinstance(self.settings, KubernetesSettings) else None


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
                        where, name, joined(provider.errors)), provider.errors)
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


def _parse_provider(item: Reader, name: str, probe_sources: Tuple[str, ...] = ()) -> Provider:
    """One provider entry, its section validated on its own."""
    errors = Errors()
    raw_type = item.data.get("type")
    provider_type = errors.read(item.choice, "type", PROVIDER_TYPES)
    if provider_type is None:
        # Without a known type there is no section to read; its errors would only be noise.
        return Provider(name, raw_type if isinstance(raw_type, str) else "", errors=tuple(errors.messages))
    item.only(errors, "name", "type", "probe", "allowedSources", "allowedDestinations", provider_type)
    section = errors.read(item.mapping, provider_type)
    settings = _SECTION_PARSERS[provider_type](section, errors) if section is not None else None
    probe = _parse_probe(item, errors)
    # allowedSources: CIDRs crawlers may connect from; allowedDestinations: internal networks the
    # proxies may reach on purpose (squid_access.py refuses every other internal destination).
    sources = _parse_networks(item, errors, "allowedSources", DEFAULT_ALLOWED_SOURCES)
    destinations = _parse_networks(item, errors, "allowedDestinations", ())
    _require_public_sources(item, errors, settings)
    locations = tuple(errors.locations)
    if errors.messages or settings is None or probe is None:
        return Provider(name, provider_type, errors=tuple(errors.messages), location_errors=locations)
    return Provider(name, provider_type, settings, probe=probe, allowed_sources=sources,
                    allowed_destinations=destinations, probe_sources=probe_sources,
                    location_errors=locations)


def _require_public_sources(item: Reader, errors: Errors, settings: Optional[object]) -> None:
    """Public exposure is explicit: a provider whose proxies are dialled at public addresses (its
    section's ``public_exposure()`` says why) must name the crawlers' sources, since the default
    ones (private networks) never reach a public address. ``0.0.0.0/0`` only when written."""
    exposure = getattr(settings, "public_exposure", None)
    reason = exposure() if callable(exposure) else None
    if reason and item.data.get("allowedSources") is None:
        errors.add("%s: required: %s, and without allowedSources only private networks would be admitted, which never "
                   "get there; list your crawlers' public networks (for example [198.51.100.0/24]; 0.0.0.0/0 written "
                   "out for any address), and the controller's own in the root's probeSources" % (
                       item.at("allowedSources"), reason))


def _parse_networks(item: Reader, errors: Errors, key: str, default: Tuple[str, ...]) -> Tuple[str, ...]:
    """A non-empty list of CIDRs (host bits clear) at ``key``; ``default`` when absent."""
    if item.data.get(key) is None:
        return default
    raw = errors.read(item.non_empty_list, key)
    parsed: List[str] = []
    for index, value in enumerate(raw or []):
        where = "%s[%d]" % (item.at(key), index)
        if not isinstance(value, str):
            errors.add("%s: must be a CIDR string, got %s" % (where, kind_of(value)))
            continue
        try:
            parsed.append(str(ipaddress.ip_network(value, strict=True)))
        except ValueError as error:
            errors.add("%s: %r is not a network in CIDR form such as 10.0.0.0/8 (%s)" % (where, value, error))
    return tuple(parsed)


def _parse_probe(item: Reader, errors: Errors) -> Optional[ProbeSettings]:
    """``probe``: absent (no target named yet), ``none`` (unverified), or a mapping of PROBE_KEYS."""
    value = item.data.get("probe")
    if value is None:
        return ProbeSettings()
    if value == "none":
        return ProbeSettings(enabled=False)
    before = len(errors)
    reader = errors.read(Reader, value, item.at("probe"))
    if reader is None:
        errors.messages[-1] += " or the string none (the instances cannot be reached to check them)"
        return None
    reader.only(errors, *PROBE_KEYS)
    url_rule = "must be an http:// URL (the check sends a plain-HTTP request through the proxy)"
    http_url = errors.read(reader.string, "httpUrl", pattern=_URL_HOST_RE,
                           rule=url_rule + "; name your probe target (egress-proxies probe-target)")
    key_file = errors.read(reader.absolute_path, "keyFile", True)
    echo = None
    if reader.has("egressEchoUrl"):
        echo = errors.read(reader.string, "egressEchoUrl", pattern=_URL_HOST_RE, rule=url_rule)
    control = None
    if reader.has("controlUrl"):
        control = errors.read(reader.string, "controlUrl", pattern=_CONTROL_URL_RE,
                              rule="must be an http:// URL of the probe target's --control-listen address, "
                              "not an /echo path (the controller asks it for the 204's proof)")
    connect = _probe_connect(reader, errors, http_url)
    numbers = {key: _probe_number(reader, errors, key) for key in PROBE_NUMBERS}
    if control is not None and numbers["expectStatus"] != 204:
        errors.add("%s: the control listener answers 204, so expectStatus must be 204 (got %d): leave controlUrl "
                   "out for a probe target of another kind" % (reader.at("controlUrl"), numbers["expectStatus"]))
    if numbers["roundSeconds"] < numbers["timeoutSeconds"]:
        errors.add("%s: must be at least timeoutSeconds (%d), got %d: a round must have time for one check" % (
            reader.at("roundSeconds"), numbers["timeoutSeconds"], numbers["roundSeconds"]))
    if len(errors) > before or http_url is None or key_file is None:
        return None
    return ProbeSettings(enabled=True, http_url=http_url, key_file=key_file, expect_status=numbers["expectStatus"],
                         connect=connect, egress_echo_url=echo, control_url=control,
                         timeout_seconds=numbers["timeoutSeconds"],
                         unhealthy_after_seconds=numbers["unhealthyAfterSeconds"],
                         startup_seconds=numbers["startupSeconds"], concurrency=numbers["concurrency"],
                         round_seconds=numbers["roundSeconds"], flap_window=numbers["flapWindow"],
                         flap_percent=numbers["flapPercent"])


def _probe_connect(reader: Reader, errors: Errors, http_url: Optional[str]) -> Optional[str]:
    """``connect``: host:port of the CONNECT check, ``none``, or (absent) the httpUrl's host on 443."""
    if "connect" in reader.data and reader.data["connect"] in (None, "none"):
        return None
    if reader.has("connect"):
        return errors.read(reader.string, "connect", pattern=HOST_PORT_RE,
                           rule="must be host:port (the HTTPS CONNECT check's target), or none")
    match = _URL_HOST_RE.fullmatch(http_url or "")
    return "%s:%d" % (match.group(1), PROBE_TUNNEL_PORT) if match else None


def _probe_number(reader: Reader, errors: Errors, key: str) -> int:
    default, minimum, maximum = PROBE_NUMBERS[key]
    if not reader.has(key):
        return default
    found = errors.read(reader.integer, key, minimum)
    if found is not None and found > maximum:
        errors.add("%s: must be at most %d, got %d" % (reader.at(key), maximum, found))
        return default
    return found if found is not None else default


def validate_provider_config(document: Any) -> ConfigReport:
    """Validate a loaded YAML document and report every error; never raises for a bad document."""
    errors = Errors()  # every error, in document order
    root = Errors()
    root_reader = root.read(Reader, document, "")
    if root_reader is None:
        return ConfigReport(owner=None, providers=(), root_errors=tuple(root.messages),
                            errors=tuple(root.messages))
    root_reader.only(root, "owner", "providers", "probeSources")
    owner = root.read(root_reader.string, "owner", pattern=LABEL_VALUE_RE,
                      rule="must be 1-63 lowercase letters, digits, '-' or '_', starting and ending with a "
                      "letter or digit, because it is written into labels on every backend")
    entries = root.read(root_reader.non_empty_list, "providers") or []
    # probeSources: where the controller's probes come from (its public egress addresses), named
    # once for every provider that must admit them.
    probe_sources = _parse_networks(root_reader, root, "probeSources", ())
    errors.messages.extend(root.messages)
    providers: List[Provider] = []
    for index, raw in enumerate(entries):
        before = len(root)
        item = root.read(Reader, raw, "providers[%d]" % index)
        name = None
        if item is not None:
            name = root.read(item.string, "name", pattern=LABEL_VALUE_RE,
                             rule="must be 1-63 lowercase letters, digits, '-' or '_' (it is used in labels)")
            if name is not None and any(p.name == name for p in providers):
                root.add("%s: duplicate provider name %r; names must be unique" % (item.at("name"), name))
                name = None
        errors.messages.extend(root.messages[before:])
        if item is not None and name is not None:
            provider = _parse_provider(item, name, probe_sources)
            errors.messages.extend(provider.errors + provider.location_errors)
            providers.append(provider)
    return ConfigReport(owner=owner, providers=tuple(providers), root_errors=tuple(root.messages),
                        errors=tuple(errors.messages))


def parse_provider_config(document: Any) -> ProviderConfig:
    """Validate a loaded YAML document.

    Root errors raise ConfigError listing every error of the document; section errors do
    not: the provider carries them and only ``ProviderConfig.provider`` for it fails."""
    report = validate_provider_config(document)
    if report.root_errors or report.owner is None:
        raise ConfigError(joined(report.errors), report.errors)
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
