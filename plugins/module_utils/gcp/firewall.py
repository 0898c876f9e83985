# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The VPC firewall rules that let crawlers reach a GCP provider's proxies.

A VPC network denies all ingress unless a rule allows it (the implied rule at priority 65535;
the default network's pre-populated rules open only 22, 3389, ICMP and internal traffic:
"VPC firewall rules", https://cloud.google.com/firewall/docs/firewalls). So with ``firewall:
managed`` (the default) the provider keeps **one rule per opening**: an opening is one proxy port
from one set of IPv4 source ranges (:class:`Opening`; IPv4 only, since the instances' external
address is the one-to-one NAT's IPv4, and a rule may not mix IPv4 and IPv6 ranges), and its rule
(:meth:`FirewallKeeper.rule_name`, named after the provider and the opening) admits exactly that
port from exactly those sources to the instances carrying the network tag of the same name. An
instance carries the tag of its own opening only. So no tenant's sources reach another tenant's
port, and an opening is never wider than what one instance asked for: ``0.0.0.0/0`` only when it
was written (an access policy with users and no sources asks for no address, and is refused on a
managed firewall rather than opened to everyone). Instances with equal openings share a rule,
which admits nothing any of them did not ask for. (Until issue 38 one rule per provider admitted
the union of every instance's ports and sources to all of them; :meth:`FirewallKeeper.settle`
keeps that legacy rule only while an instance still carries its tag.)

Each instance records its opening in its metadata (``egress-proxies-port``,
``egress-proxies-sources``), so the rules can be recomputed from the instances alone:

- a create makes sure its opening's rule exists before the insert (a failure then leaves no
  instance behind) and again after it (:meth:`FirewallKeeper.admit`);
- a delete recomputes the provider's rules from a listing of its instances
  (:meth:`FirewallKeeper.settle`): a rule no remaining instance carries goes. It never changes
  anything on an incomplete listing, and it repeats until a listing and the rules agree, so a
  create racing a delete ends with its rule in place (the create's own check after its insert,
  or the delete's listing after its write, sees the other).

With ``firewall: external`` the operator's rules admit the port (instances carry
``networkTags``); nothing here writes, and the config check (checks.py) verifies a rule does.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import Provider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
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
# How often a keeper re-reads before it gives up on rules that keep changing under it.
ROUNDS = 3
_NETWORK_PROJECT_RE = re.compile(r"(?:^|/)projects/([^/]+)/global/networks/")


@dataclass(frozen=True)
class ProviderIdentity:
    """Who the provider is: its name and owner (its rules belong to them), its default
    ``allowedSources`` (for instances without an access policy of their own) and the config's
    ``probeSources`` (where the controller's probes come from: every opening admits them too)."""

    name: str
    owner: str
    allowed_sources: Tuple[str, ...]
    probe_sources: Tuple[str, ...] = ()

    @classmethod
    def of(cls, provider: Provider, owner: str) -> "ProviderIdentity":
        return cls(provider.name, owner, provider.allowed_sources, provider.probe_sources)


@dataclass(frozen=True)
class Opening:
    """What one instance's rule admits: its proxy port from its IPv4 source ranges."""

    port: int
    sources: FrozenSet[str]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def provider_rule_prefix(identity: ProviderIdentity, network: str) -> str:
    """What every rule of the provider's is named after: stable for one owner, provider and
    network (a network changed in the config gets rules of its own: a rule's network cannot
    change). Alone, it is the name of the provider's legacy rule (one for all its instances)."""
    return RULE_PREFIX + _digest("%s\n%s\n%s" % (identity.owner, identity.name, network))


def ipv4_sources(sources: Iterable[str]) -> Tuple[str, ...]:
    return tuple(sorted({source for source in sources if ipaddress.ip_network(source).version == 4}))


def opening_of(access: Optional[Access], port: int, identity: ProviderIdentity) -> Opening:
    """What one instance needs: its port, from its allowed sources (the provider's defaults
    without a policy) and the controller's probe sources. A policy that lists users and no
    sources asks for none: nothing is implied (not even the probe's sources), and
    :meth:`FirewallKeeper.require` refuses it on a managed firewall."""
    sources = identity.allowed_sources if access is None else access.allowed_sources
    admitted = ipv4_sources((*sources, *identity.probe_sources)) if sources else ()
    return Opening(port, frozenset(admitted))


def opening_metadata(opening: Opening) -> str:
    return ",".join(sorted(opening.sources))


def _recorded_opening(found: GceInstance, identity: ProviderIdentity) -> Opening:
    recorded = found.metadata.get(PORT_METADATA_KEY, "")
    port = int(recorded) if recorded.isdigit() else DEFAULT_PORT
    raw = found.metadata.get(SOURCES_METADATA_KEY)
    if raw is None:  # made before instances recorded their sources: the provider's defaults
        return opening_of(None, port, identity)
    return Opening(port, frozenset(s for s in raw.split(",") if s))


class FirewallKeeper:
    """Keeps the provider's rules in step with its instances (see the module docstring)."""

    def __init__(self, settings: GcpSettings, client: Any, identity: ProviderIdentity) -> None:
        self.settings = settings
        self.client = client
        self.identity = identity
        self.managed = settings.firewall == "managed"
        self.legacy_name = provider_rule_prefix(identity, settings.network)
        match = _NETWORK_PROJECT_RE.search(settings.network)
        # Rules live in the network's project (a Shared VPC's host project).
        self.project = match.group(1) if match else settings.project

    def rule_name(self, opening: Opening) -> str:
        """The rule of ``opening`` and the network tag of the instances it admits: RFC 1035, 40
        characters (at most 63)."""
        return "%s-%s" % (self.legacy_name, _digest("%d\n%s" % (opening.port, opening_metadata(opening))))

    def is_ours(self, rule_name: str) -> bool:
        return rule_name == self.legacy_name or rule_name.startswith(self.legacy_name + "-")

    def require(self, opening: Opening) -> None:
        """Refuse an opening a managed rule cannot admit: one without an IPv4 source (an
        access policy with users and no ``allowed_sources``, or only IPv6 ones) would either
        admit nobody or, implied, everyone."""
        if self.managed and not opening.sources:
            raise Permanent("access.allowed_sources: no IPv4 network to admit to port %d: the provider's managed "
                            "firewall opens each instance only to the sources listed, and the instance is dialled "
                            "at its external IPv4 address; list the crawlers' IPv4 networks (the Proxy's "
                            "allowedSources, or the provider's), 0.0.0.0/0 written out for any address" % opening.port)

    def instance_tags(self, opening: Opening) -> Tuple[str, ...]:
        """The network tags an instance of ``opening`` gets: its rule's (when managed), then the operator's."""
        own = (self.rule_name(opening),) if self.managed else ()
        return own + tuple(tag for tag in self.settings.network_tags if tag not in own)

    def _rule(self, opening: Opening) -> FirewallRule:
        name = self.rule_name(opening)
        return FirewallRule(
            name=name, network=self.settings.network, source_ranges=tuple(sorted(opening.sources)),
            allowed=(("tcp", (str(opening.port),)),), target_tags=(name,),
            description="crawl.egress_proxies: proxy port %d of provider %s (owner %s) from the sources its "
                        "instances tagged %s allow; deleted with the last of them" % (
                            opening.port, self.identity.name, self.identity.owner, name))

    def admit(self, opening: Opening, deadline: float) -> None:
        """Make sure the rule of ``opening`` exists, admitting exactly it."""
        if not self.managed:
            return
        wanted = self._rule(opening)
        for _attempt in range(ROUNDS):
            current = self.client.firewall(self.project, wanted.name)
            if current is not None and _same(current, wanted):
                return
            self.client.put_firewall(self.project, wanted, current is not None, deadline)
        raise Transient("firewall rule %s in project %s kept changing while admitting port %d; will retry" % (
            wanted.name, self.project, opening.port))

    def settle(self, deadline: float) -> None:
        """Make the provider's rules what its instances need: each instance's rule exactly, the
        legacy rule as it is while an instance carries its tag, nothing else. Nothing changes on
        a listing that missed a zone (an instance there may need a rule)."""
        if not self.managed:
            return
        for _attempt in range(ROUNDS):
            listing = self.client.list_instances(OURS_FILTER, self.settings.zones)
            if listing.failed_zones:
                return
            wanted: Dict[str, FirewallRule] = {}
            legacy_kept = False
            for found in listing.instances:
                rule = self._rule(_recorded_opening(found, self.identity))
                if rule.name in found.network_tags:
                    wanted[rule.name] = rule
                legacy_kept = legacy_kept or self.legacy_name in found.network_tags
            present = {rule.name: rule for rule in self.client.firewall_rules(self.project) if self.is_ours(rule.name)}
            stale = [name for name in present if name not in wanted and not (legacy_kept and name == self.legacy_name)]
            missing = [rule for name, rule in sorted(wanted.items())
                       if name not in present or not _same(present[name], rule)]
            if not stale and not missing:
                return
            for rule in missing:
                self.client.put_firewall(self.project, rule, rule.name in present, deadline)
            for name in sorted(stale):
                self.client.delete_firewall(self.project, name, deadline)
        raise Transient("firewall rules of provider %s in project %s kept changing while bringing them in step with "
                        "the instances; will retry" % (self.identity.name, self.project))


def _same(current: FirewallRule, wanted: FirewallRule) -> bool:
    """Whether a rule read back admits what ``wanted`` does, to whom, and nothing else."""
    same_sources = sorted(current.source_ranges) == sorted(wanted.source_ranges)
    same_targets = tuple(current.target_tags) == wanted.target_tags
    admits = current.allowed == wanted.allowed and not current.denied and not current.disabled
    return same_sources and same_targets and admits and current.direction == wanted.direction
