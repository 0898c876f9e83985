# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""providerIDs: the one string that names an instance on its backend.

    kvm://hosts/<host>/domains/<domain>
    gce://<project>/zones/<zone>/instances/<name>
    k8s://namespaces/<namespace>/pods/<name>

Parsing is strict: anything that does not match one of these shapes exactly is a
``Permanent`` error. Guessing would be worse than failing: a providerID read the
wrong way could make the controller rebuild (or delete) the wrong instance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent

_SEGMENT = r"[A-Za-z0-9._-]+"
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PATTERNS = {
    "kvm": re.compile(r"^kvm://hosts/(?P<location>%s)/domains/(?P<name>%s)$" % (_SEGMENT, _SEGMENT)),
    "gce": re.compile(
        r"^gce://(?P<project>[a-z][-a-z0-9.:]{4,61}[a-z0-9])/zones/(?P<location>[a-z0-9-]+)"
        r"/instances/(?P<name>%s)$" % _DNS_LABEL),
    "k8s": re.compile(
        r"^k8s://namespaces/(?P<location>%s)/pods/(?P<name>[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?)$" % _DNS_LABEL),
}
_FORMATS = {
    "kvm": "kvm://hosts/{location}/domains/{name}",
    "gce": "gce://{project}/zones/{location}/instances/{name}",
    "k8s": "k8s://namespaces/{location}/pods/{name}",
}


@dataclass(frozen=True)
class ProviderID:
    """A parsed providerID. ``location`` is the KVM host, GCP zone or namespace."""

    scheme: str
    location: str
    name: str
    project: str = ""

    def __str__(self) -> str:
        return _FORMATS[self.scheme].format(location=self.location, name=self.name, project=self.project)


def format_provider_id(scheme: str, location: str, name: str, project: str = "") -> str:
    """Build a providerID and check it parses back to the same parts."""
    text = str(ProviderID(scheme=scheme, location=location, name=name, project=project))
    if parse_provider_id(text, scheme) != ProviderID(scheme, location, name, project):
        raise Permanent("provider_id: %r cannot be formed from these parts" % text)
    return text


def parse_provider_id(text: str, scheme: str = "") -> ProviderID:
    """Parse ``text``; with ``scheme`` set, any other scheme is rejected too."""
    if not isinstance(text, str):
        raise Permanent("provider_id: must be a string, got %s" % type(text).__name__)
    found = text.split("://", 1)[0] if "://" in text else ""
    if found not in _PATTERNS:
        raise Permanent(
            "provider_id: %r is malformed: expected kvm://hosts/<host>/domains/<domain>, "
            "gce://<project>/zones/<zone>/instances/<name> or k8s://namespaces/<namespace>/pods/<name>" % text)
    if scheme and found != scheme:
        raise Permanent("provider_id: %r is a %s:// providerID, this provider only handles %s://" % (
            text, found, scheme))
    match = _PATTERNS[found].fullmatch(text)
    if match is None:
        raise Permanent("provider_id: %r is malformed: expected %s" % (text, _FORMATS[found].replace(
            "{", "<").replace("}", ">")))
    parts = match.groupdict()
    return ProviderID(scheme=found, location=parts["location"], name=parts["name"],
                      project=parts.get("project") or "")
