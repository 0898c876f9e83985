# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the config check asks the Compute API about a GCP provider (``provider_config_info``
with ``check_backends``), each problem as ``<field>: <what is wrong and the fix>``:

- the credentials work for Compute: one listing of the provider's instances in its first zone.
  A token without a Compute OAuth scope (a VM's or GKE node's default access scopes) is refused
  with 403 "insufficient authentication scopes" whatever IAM grants, and the message says which
  scope to grant; a missing permission names the role;
- ``firewall: managed``: the firewall rules of the network's project can be listed (the
  provider writes one; ``roles/compute.securityAdmin`` covers it);
- ``firewall: external``: some enabled ingress rule of the network admits TCP on the default
  proxy port 3128 from each of the provider's IPv4 ``allowedSources`` to instances carrying its
  ``networkTags`` (or to all instances). Deny rules and priorities are not weighed: an allow
  that a deny of higher precedence shadows still counts (the probe finds that out).
"""

from __future__ import annotations

import ipaddress
from typing import List

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import ProxyError
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import (
    HAS_GOOGLE,
    ComputeClient,
    FirewallRule,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import (
    FirewallKeeper,
    ProviderIdentity,
    ipv4_sources,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import OURS_FILTER
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import DEFAULT_PORT


def _same_network(rule: FirewallRule, network: str) -> bool:
    def key(reference: str) -> str:
        return reference.rsplit("/global/networks/", 1)[-1] if "/global/networks/" in reference else \
            reference.rsplit("/", 1)[-1]
    return key(rule.network) == key(network)


def rule_admits(rule: FirewallRule, network: str, tags: List[str], source: str, port: int) -> bool:
    """Whether ``rule`` allows TCP ``port`` from all of ``source`` (an IPv4 CIDR) to instances of
    ``network`` carrying ``tags``."""
    if rule.disabled or rule.direction != "INGRESS" or not _same_network(rule, network):
        return False
    if rule.target_tags and not set(rule.target_tags) & set(tags):
        return False
    wanted = ipaddress.IPv4Network(source)
    ranges = [ipaddress.ip_network(r, strict=False) for r in rule.source_ranges]
    if not any(isinstance(r, ipaddress.IPv4Network) and wanted.subnet_of(r) for r in ranges):
        return False
    for protocol, ports in rule.allowed:
        if protocol not in ("tcp", "all"):
            continue
        if not ports or any(int(p.split("-")[0]) <= port <= int(p.split("-")[-1]) for p in ports):
            return True
    return False


def check_backend(settings: GcpSettings, identity: ProviderIdentity) -> List[str]:
    """Every problem the Compute API shows with this provider's section, as ``field: message``."""
    if not HAS_GOOGLE:
        return ["gcp: google-cloud-compute is not installed where the modules run; install it to check"]
    try:
        client = ComputeClient(settings)
    except ProxyError as error:
        return ["gcp.credentialsFile: %s" % error]
    try:
        listing = client.list_instances(OURS_FILTER, settings.zones[:1])
        problems = ["gcp: %s" % error for error in listing.failed_zones.values()]
        if problems:
            return problems  # the credentials do not work: the firewall check would say the same
        return _firewall_problems(client, settings, identity)
    finally:
        client.close()


def _firewall_problems(client: ComputeClient, settings: GcpSettings, identity: ProviderIdentity) -> List[str]:
    keeper = FirewallKeeper(settings, client, identity)
    try:
        rules = client.firewall_rules(keeper.project)
    except ProxyError as error:
        fix = ("grant the service account roles/compute.securityAdmin in project %s (the provider keeps a firewall "
               "rule for its proxy ports), or manage the rule yourself with firewall: external" % keeper.project
               if settings.firewall == "managed" else "grant compute.firewalls.list so the rule can be checked")
        return ["gcp.firewall: %s; %s" % (error, fix)]
    if settings.firewall == "managed":
        return []
    tags = list(settings.network_tags)
    missing = [source for source in ipv4_sources(identity.allowed_sources)
               if not any(rule_admits(rule, settings.network, tags, source, DEFAULT_PORT) for rule in rules)]
    if not missing:
        return []
    target = "instances tagged %s" % ", ".join(tags) if tags else "all instances"
    return ["gcp.firewall: external, but no enabled ingress rule of network %s admits tcp:%d from %s to %s: crawlers "
            "and the controller's probe cannot reach the proxies. Add one (gcloud compute firewall-rules create "
            "NAME --network=%s --allow=tcp:%d --source-ranges=%s%s) or set firewall: managed" % (
                settings.network, DEFAULT_PORT, ", ".join(missing), target, settings.network.rsplit("/", 1)[-1],
                DEFAULT_PORT, ",".join(missing), " --target-tags=%s" % ",".join(tags) if tags else "")]
