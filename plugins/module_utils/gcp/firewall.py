# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The VPC firewall rule that lets crawlers reach a GCP provider's proxies.

A VPC network denies all ingress unless a rule allows it (the implied rule at priority 65535;
the default network's pre-populated rules open only 22, 3389, ICMP and internal traffic:
"VPC firewall rules", https://cloud.google.com/firewall/docs/firewalls). So with ``firewall:
managed`` (the default) the provider keeps **one rule per provider**, named like the network tag
every instance of the provider carries (:func:`rule_name`): ingress, TCP on the union of its
instances' proxy ports, from the union of their allowed sources (IPv4 only: the instances'
external address is the one-to-one NAT's IPv4, and a rule may not mix IPv4 and IPv6 ranges).
Each instance records its own opening in its metadata (``egress-proxies-port``,
``egress-proxies-sources``), so the rule can be recomputed from the instances alone:

- a create makes sure the rule admits its port and sources before the insert (a failure then
  leaves no instance behind) and again after it (:meth:`FirewallKeeper.admit`), only ever adding;
- a delete recomputes the rule from a listing of the provider's instances
  (:meth:`FirewallKeeper.settle`): it shrinks to what the remaining ones need, and goes with the
  last one. It never shrinks on an incomplete listing, and it repeats until a listing and the
  rule agree, so a create racing a delete ends with its opening in the rule (the create's own
  check after its insert, or the delete's listing after its write, sees the other).

With ``firewall: external`` the operator's rules admit the port (instances carry
``networkTags``); nothing here writes, and the config check (checks.py) verifies a rule does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterable, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import FirewallRule, GceInstance
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import (
    OURS_FILTER,
    PORT_METADATA_KEY,
    SOURCES_METADATA_KEY,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import DEFAULT_PORT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import Access

RULE_PREFIX = "egress-proxies-"
# How often a keeper re-reads before it gives up on a rule that keeps changing under it.
ROUNDS = 3
_NETWORK_PROJECT_RE = re.compile(r"(?:^|/)projects/([^/]+)/global/networks/")


@dataclass(frozen=True)
class ProviderIdentity:
    """Who the provider is: its name and owner (the rule belongs to them) and its default
    ``allowedSources`` (for instances without an access policy of their own)."""

    name: str
    owner: str
    allowed_sources: Tuple[str, ...]


@dataclass(frozen=True)
class Opening:
    """Ports and IPv4 source ranges a rule admits."""

    ports: FrozenSet[int] = frozenset()
    sources: FrozenSet[str] = frozenset()

    def __or__(self, other: "Opening") -> "Opening":
        return Opening(self.ports | other.ports, self.sources | other.sources)

    def covers(self, other: "Opening") -> bool:
        return other.ports <= self.ports and other.sources <= self.sources


def rule_name(identity: ProviderIdentity, network: str) -> str:
    """The rule's name and the network tag of the provider's instances: RFC 1035, at most 63
    characters, stable for one owner, provider and network (a network changed in the config
    gets a rule of its own: a rule's network cannot change)."""
    digest = hashlib.sha256(("%s\n%s\n%s" % (identity.owner, identity.name, network)).encode()).hexdigest()
    return RULE_PREFIX + digest[:12]


def ipv4_sources(sources: Iterable[str]) -> Tuple[str, ...]:
    return tuple(sorted({source for source in sources if ipaddress.ip_network(source).version == 4}))


def opening_of(access: Optional[Access], port: int, identity: ProviderIdentity) -> Opening:
    """What one instance needs: its port, from its allowed sources (any source that authenticates
    when its policy lists users and no sources; the provider's defaults without a policy)."""
    if access is None:
        sources: Iterable[str] = identity.allowed_sources
    else:
        sources = access.allowed_sources or ("0.0.0.0/0",)
    return Opening(frozenset((port,)), frozenset(ipv4_sources(sources)))


def opening_metadata(opening: Opening) -> str:
    return ",".join(sorted(opening.sources))


def _recorded_opening(found: GceInstance, identity: ProviderIdentity) -> Opening:
    port = found.metadata.get(PORT_METADATA_KEY, "")
    raw = found.metadata.get(SOURCES_METADATA_KEY)
    sources = [s for s in raw.split(",") if s] if raw is not None else ipv4_sources(identity.allowed_sources)
    return Opening(frozenset((int(port) if port.isdigit() else DEFAULT_PORT,)), frozenset(sources))


def _opening_of_rule(rule: FirewallRule) -> Opening:
    ports = {int(port) for protocol, listed in rule.allowed if protocol == "tcp" for port in listed if port.isdigit()}
    return Opening(frozenset(ports), frozenset(rule.source_ranges))


class FirewallKeeper:
    """Keeps the provider's rule in step with its instances (see the module docstring)."""

    def __init__(self, settings: GcpSettings, client: Any, identity: ProviderIdentity) -> None:
        self.settings = settings
        self.client = client
        self.identity = identity
        self.managed = settings.firewall == "managed"
        self.name = rule_name(identity, settings.network)
        match = _NETWORK_PROJECT_RE.search(settings.network)
        # Rules live in the network's project (a Shared VPC's host project).
        self.project = match.group(1) if match else settings.project

    @property
    def instance_tags(self) -> Tuple[str, ...]:
        """The network tags every instance gets: the rule's (when managed), then the operator's."""
        own = (self.name,) if self.managed else ()
        return own + tuple(tag for tag in self.settings.network_tags if tag not in own)

    def _rule(self, opening: Opening) -> FirewallRule:
        return FirewallRule(
            name=self.name, network=self.settings.network, source_ranges=tuple(sorted(opening.sources)),
            allowed=(("tcp", tuple(str(port) for port in sorted(opening.ports))),), target_tags=(self.name,),
            description="crawl.egress_proxies: the proxy ports of provider %s (owner %s) from their allowed sources, "
                        "for instances tagged %s; kept in step with them, deleted with the last one" % (
                            self.identity.name, self.identity.owner, self.name))

    def admit(self, opening: Opening, deadline: float) -> None:
        """Make sure the rule admits ``opening`` (adding to it, never taking away)."""
        if not self.managed or not opening.sources:
            return
        for _attempt in range(ROUNDS):
            current = self.client.firewall(self.project, self.name)
            have = _opening_of_rule(current) if current is not None else Opening()
            if current is not None and have.covers(opening):
                return
            self.client.put_firewall(self.project, self._rule(have | opening), current is not None, deadline)
        raise Transient("firewall rule %s in project %s kept changing while adding port(s) %s; will retry" % (
            self.name, self.project, ", ".join(str(p) for p in sorted(opening.ports))))

    def settle(self, deadline: float) -> None:
        """Make the rule what the provider's instances need, or remove it when none is left.
        Nothing changes on a listing that missed a zone (an instance there may need the rule)."""
        if not self.managed:
            return
        for _attempt in range(ROUNDS):
            listing = self.client.list_instances(OURS_FILTER, self.settings.zones)
            if listing.failed_zones:
                return
            wanted = Opening()
            for found in listing.instances:
                if self.name in found.network_tags:
                    wanted = wanted | _recorded_opening(found, self.identity)
            current = self.client.firewall(self.project, self.name)
            if not wanted.sources:
                if current is None:
                    return
                self.client.delete_firewall(self.project, self.name, deadline)
                continue
            if current is not None and _opening_of_rule(current) == wanted:
                return
            self.client.put_firewall(self.project, self._rule(wanted), current is not None, deadline)
        raise Transient("firewall rule %s in project %s kept changing while bringing it in step with the instances; "
                        "will retry" % (self.name, self.project))
