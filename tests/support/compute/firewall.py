"""VPC firewall rules as the Compute emulator keeps and applies them (tests/support/compute/emulator.py).

What holds on the real API, each rule with its source:

- Every VPC network has two implied rules that no rule list shows: allow all egress and **deny all
  ingress**, both at priority 65535 ("VPC firewall rules", https://cloud.google.com/firewall/docs/firewalls,
  "Implied rules"). So nothing from outside reaches an instance's port unless a rule allows it.
- The ``default`` network of a new project comes with four more ingress rules at priority 65534:
  ``default-allow-internal`` (tcp/udp 0-65535 and icmp from 10.128.0.0/9), ``default-allow-ssh``
  (tcp:22 from 0.0.0.0/0), ``default-allow-rdp`` (tcp:3389) and ``default-allow-icmp`` (same page,
  "Pre-populated rules in the default network"; the bodies as ``gcloud compute firewall-rules list
  --format=json`` shows them in public gists). Port 3128 is not among them.
- A rule applies to the instances of its network whose network tags (``Instance.tags.items``)
  include one of its ``targetTags``, or to all of them when it has none; ingress rules match the
  source by ``sourceRanges`` (CIDRs); ``allowed``/``denied`` list ``IPProtocol`` and optional
  ``ports`` (single ports or ``a-b`` ranges; none: every port). The rule with the lowest priority
  number that matches decides; at equal priority a deny beats an allow; a disabled rule is
  ignored (Firewall resource, REST reference: priority "Lower value indicates higher precedence
  ... 0-65535, default 1000", targetTags, sourceRanges, allowed[].ports, disabled).
- "A firewall rule can contain either IPv4 or IPv6 ranges, but not both" (Use VPC firewall
  rules); names are RFC 1035 labels of at most 63 characters and unique in the project.

Service-account targets and source tags (which match only traffic from inside the network) are
not modelled: nothing the provider sends uses them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

RFC1035_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_PRIORITY = 1000
IMPLIED_PRIORITY = 65535
PROTOCOLS = frozenset(("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all"))


class FirewallError(ValueError):
    """A rule the API refuses (400 invalid); the message is the emulator's own wording."""


def default_network_rules(project: str) -> list[dict[str, Any]]:
    """The rules a new project's ``default`` network has (see the module docstring)."""
    network = f"projects/{project}/global/networks/default"

    def rule(name: str, description: str, allowed: list[dict[str, Any]], source: str) -> dict[str, Any]:
        return {"name": name, "description": description, "network": network, "direction": "INGRESS",
                "priority": 65534, "sourceRanges": [source], "allowed": allowed, "disabled": False}

    all_ports = ["0-65535"]
    return [
        rule("default-allow-internal", "Allow internal traffic on the default network",
             [{"IPProtocol": "tcp", "ports": all_ports}, {"IPProtocol": "udp", "ports": all_ports},
              {"IPProtocol": "icmp"}], "10.128.0.0/9"),
        rule("default-allow-ssh", "Allow SSH from anywhere", [{"IPProtocol": "tcp", "ports": ["22"]}], "0.0.0.0/0"),
        rule("default-allow-rdp", "Allow RDP from anywhere", [{"IPProtocol": "tcp", "ports": ["3389"]}],
             "0.0.0.0/0"),
        rule("default-allow-icmp", "Allow ICMP from anywhere", [{"IPProtocol": "icmp"}], "0.0.0.0/0"),
    ]


def validate_rule(body: Mapping[str, Any]) -> None:
    """The checks of firewalls.insert/patch on the fields a rule is made of."""
    name = str(body.get("name", ""))
    if not RFC1035_RE.fullmatch(name):
        raise FirewallError(f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    if body.get("direction", "INGRESS") not in ("INGRESS", "EGRESS"):
        raise FirewallError(f"Invalid value for field 'resource.direction': '{body.get('direction')}'")
    priority = body.get("priority", DEFAULT_PRIORITY)
    if not isinstance(priority, int) or not 0 <= priority <= IMPLIED_PRIORITY:
        raise FirewallError(f"Invalid value for field 'resource.priority': '{priority}'")
    versions = set()
    for index, source in enumerate(body.get("sourceRanges") or []):
        try:
            versions.add(ipaddress.ip_network(str(source), strict=False).version)
        except ValueError:
            raise FirewallError(f"Invalid value for field 'resource.sourceRanges[{index}]': '{source}'. "
                                "Must be a CIDR address range.") from None
    if len(versions) > 1:
        raise FirewallError("Invalid value for field 'resource.sourceRanges': a firewall rule can contain either "
                            "IPv4 or IPv6 ranges, but not both.")
    for index, tag in enumerate(body.get("targetTags") or []):
        if not RFC1035_RE.fullmatch(str(tag)):
            raise FirewallError(f"Invalid value for field 'resource.targetTags[{index}]': '{tag}'")
    entries = list(body.get("allowed") or []) + list(body.get("denied") or [])
    if not entries:
        raise FirewallError("Invalid value for field 'resource': a rule needs allowed or denied")
    for entry in entries:
        if str(entry.get("IPProtocol", "")).lower() not in PROTOCOLS:
            raise FirewallError(f"Invalid value for field 'resource.allowed[].IPProtocol': '{entry.get('IPProtocol')}'")
        for port in entry.get("ports") or []:
            if not re.fullmatch(r"[0-9]{1,5}(-[0-9]{1,5})?", str(port)):
                raise FirewallError(f"Invalid value for field 'resource.allowed[].ports': '{port}'")


def _covers(ports: Iterable[str] | None, port: int) -> bool:
    listed = list(ports or [])
    if not listed:
        return True
    for item in listed:
        low, _, high = str(item).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _matches(entries: Iterable[Mapping[str, Any]], port: int) -> bool:
    return any(str(e.get("IPProtocol", "")).lower() in ("tcp", "all") and _covers(e.get("ports"), port)
               for e in entries)


def decisions(rules: Iterable[Mapping[str, Any]], network: str, instance_tags: Iterable[str],
              port: int) -> list[tuple[bool, tuple[str, ...]]]:
    """The ingress rules that decide TCP ``port`` of an instance on ``network`` carrying
    ``instance_tags``, in the order they are weighed (priority, then deny before allow): each as
    (allows, its source ranges). The first whose ranges hold a source decides; none: the implied
    deny. (tests/support/compute/guests.py writes them as a real packet filter in this order.)"""
    tags = set(instance_tags)
    weighed: list[tuple[int, int, bool, tuple[str, ...]]] = []  # (priority, deny first, allows, ranges)
    for rule in rules:
        if rule.get("disabled") or rule.get("direction", "INGRESS") != "INGRESS":
            continue
        if rule.get("network") != network:  # both as projects/<p>/global/networks/<n>
            continue
        targets = set(rule.get("targetTags") or [])
        if targets and not targets & tags:
            continue
        ranges = tuple(str(r) for r in rule.get("sourceRanges") or [])
        priority = int(rule.get("priority", DEFAULT_PRIORITY))
        if _matches(rule.get("denied") or [], port):
            weighed.append((priority, 0, False, ranges))
        if _matches(rule.get("allowed") or [], port):
            weighed.append((priority, 1, True, ranges))
    return [(allows, ranges) for _, _, allows, ranges in sorted(weighed, key=lambda item: item[:2])]


def admits(rules: Iterable[Mapping[str, Any]], network: str, instance_tags: Iterable[str], source: str,
           port: int) -> bool:
    """Whether a TCP connection from ``source`` to ``port`` of an instance on ``network`` carrying
    ``instance_tags`` passes the network's ingress rules (the implied deny when none matches)."""
    address = ipaddress.ip_address(source)
    for allows, ranges in decisions(rules, network, instance_tags, port):
        networks = [ipaddress.ip_network(r, strict=False) for r in ranges]
        if any(address.version == n.version and address in n for n in networks):
            return allows
    return False
