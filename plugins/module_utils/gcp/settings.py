# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``gcp`` section of a provider entry: its settings and how it is read.

Importable without the Google Cloud libraries: only the standard library and the config reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import (
    ConfigError,
    Errors,
    Reader,
    default_key,
)


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
    firewall: str = "managed"
    """``managed``: the provider keeps one ingress rule for its instances' proxy ports (firewall.py);
    ``external``: the operator's rules admit them (the config check verifies one does)."""
    network_tags: Tuple[str, ...] = ()
    """Network tags every instance carries besides the provider's own (for the operator's rules)."""

    def public_exposure(self) -> Optional[str]:
        """Why the instances are dialled at public addresses (config.py then requires
        ``allowedSources`` written), None when they are not."""
        if not self.external_ip:
            return None
        return ("gcp.externalIP is true (the default): every proxy is dialled at its external address, which only "
                "public sources reach")


FIREWALL_MODES = ("managed", "external")
# A network tag: "Each tag within the list must comply with RFC1035" (Tags.items, REST reference).
NETWORK_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


# A subnetwork as the Compute API takes it: regions/<region>/subnetworks/<name>, optionally
# preceded by projects/<project>/ and by the API's own URL prefix.
GCP_SUBNETWORK_RE = re.compile(
    r"^(?:https://[A-Za-z0-9.-]+(?::[0-9]+)?/compute/(?:v1|beta|alpha)/)?"
    r"(?:projects/[a-z][-a-z0-9.:]*[a-z0-9]/)?"
    r"regions/(?P<region>[a-z0-9-]+)/subnetworks/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def parse_gcp_section(reader: Reader, errors: Errors) -> Optional[GcpSettings]:
    start = len(errors)
    reader.only(errors, "project", "zones", "machineTypes", "images", "defaultMachineType", "defaultImage",
                "network", "subnetwork", "credentialsFile", "externalIP", "apiEndpoint", "firewall", "networkTags")
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
    default_machine_type = errors.read(default_key, reader, "defaultMachineType",
                                       reader.keys_as_written("machineTypes"), "machineTypes")
    default_image = errors.read(default_key, reader, "defaultImage", reader.keys_as_written("images"), "images")
    network = errors.read(reader.string, "network", "global/networks/default")
    subnetwork = errors.read(_gcp_subnetwork, reader, zones)
    credentials_file = errors.read(reader.absolute_path, "credentialsFile", False)
    external_ip = errors.read(reader.boolean, "externalIP", True)
    api_endpoint = errors.read(_gcp_api_endpoint, reader)
    firewall = errors.read(reader.choice, "firewall", FIREWALL_MODES, "managed")
    network_tags: List[str] = []
    for index, tag in enumerate(errors.read(reader.non_empty_list, "networkTags") or []
                                if reader.data.get("networkTags") is not None else []):
        if not isinstance(tag, str) or not NETWORK_TAG_RE.fullmatch(tag):
            errors.add("%s[%d]: %r is not a network tag (RFC 1035: 1-63 lowercase letters, digits and '-', starting "
                       "with a letter)" % (reader.at("networkTags"), index, tag))
        else:
            network_tags.append(tag)
    if len(errors) > start or project is None or default_machine_type is None or default_image is None \
            or network is None or external_ip is None or firewall is None:
        return None
    return GcpSettings(
        project=project, zones=tuple(zones), machine_types=tables["machineTypes"], images=tables["images"],
        default_machine_type=default_machine_type, default_image=default_image, network=network,
        credentials_file=credentials_file, external_ip=external_ip, api_endpoint=api_endpoint,
        subnetwork=subnetwork, firewall=firewall, network_tags=tuple(network_tags))


def _gcp_subnetwork(reader: Reader, zones: List[str]) -> Optional[str]:
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


def _gcp_api_endpoint(reader: Reader) -> Optional[str]:
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
