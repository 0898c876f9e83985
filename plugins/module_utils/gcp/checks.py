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
  that a deny of higher precedence shadows still counts (the probe finds that out);
- ``externalIP: false``: each configured zone's region has a Cloud NAT on the network that
  translates the instances' subnetwork, or the instances have no way out at all (the
  startup-script cannot install squid, no crawler's request leaves).

:func:`reachability` says, from the config alone, what will be reachable from where (``--check-config``
prints it per provider).
"""

from __future__ import annotations

import ipaddress
import re
from typing import List

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import ProxyError
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import (
    HAS_GOOGLE,
    CloudNat,
    ComputeClient,
    FirewallRule,
    region_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import (
    FirewallKeeper,
    ProviderIdentity,
    ipv4_sources,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import OURS_FILTER
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import DEFAULT_PORT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_networks import within_internal


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
        return _firewall_problems(client, settings, identity) + _way_out_problems(client, settings, identity)
    finally:
        client.close()


def _network_key(reference: str, project: str) -> str:
    """``<project>/<name>`` of a network reference (a URL or ``[projects/<p>/]global/networks/<n>``)."""
    match = re.search(r"(?:projects/([^/]+)/)?global/networks/([^/]+)$", reference)
    return "%s/%s" % (match.group(1) or project, match.group(2)) if match else reference


def _nat_serves(nat: CloudNat, settings: GcpSettings, project: str, region: str) -> bool:
    """Whether ``nat`` translates the instances of ``region``: same network and region, and all
    subnetworks, or the configured one by name (an auto-mode network's subnetwork is named like it)."""
    if nat.region != region or _network_key(nat.network, project) != _network_key(settings.network, project):
        return False
    if nat.ranges.startswith("ALL_SUBNETWORKS"):
        return True
    return (settings.subnetwork or settings.network).rsplit("/", 1)[-1] in nat.subnetworks


def _way_out_problems(client: ComputeClient, settings: GcpSettings, identity: ProviderIdentity) -> List[str]:
    """``externalIP: false``: the regions whose instances would have no way out (no Cloud NAT)."""
    if settings.external_ip:
        return []
    project = FirewallKeeper(settings, client, identity).project  # routers live in the network's project
    try:
        nats = client.cloud_nats(project)
    except ProxyError as error:
        return ["gcp.externalIP: false, and the Cloud Routers of project %s cannot be listed to find a Cloud NAT "
                "(%s); grant compute.routers.list" % (project, error)]
    regions = sorted({region_of(zone) for zone in settings.zones})
    missing = [region for region in regions if not any(_nat_serves(nat, settings, project, region) for nat in nats)]
    if not missing:
        return []
    network = settings.network.rsplit("/", 1)[-1]
    return ["gcp.externalIP: false, but network %s has no Cloud NAT in region(s) %s: instances there would have no "
            "way out to the internet (the startup-script cannot install squid, and no crawler request can leave). "
            "Set externalIP: true, or add a Cloud NAT per region (gcloud compute routers create egress-nat "
            "--network=%s --region=REGION && gcloud compute routers nats create egress-nat --router=egress-nat "
            "--region=REGION --auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges); every proxy of a region "
            "then leaves from the NAT's addresses" % (network, ", ".join(missing), network)]


def reachability(settings: GcpSettings, identity: ProviderIdentity) -> List[str]:
    """What will be reachable from where, from the config alone, one line each."""
    sources = ipv4_sources(identity.allowed_sources)
    ipv6 = [source for source in identity.allowed_sources if ipaddress.ip_network(source).version == 6]
    admitter = ("the managed firewall rule and squid admit exactly these" if settings.firewall == "managed" else
                "squid admits these; your firewall rules must too (firewall: external)")
    if settings.external_ip:
        lines = ["proxies: at their external IPv4 addresses, each on its Proxy's port (default %d), from the "
                 "internet" % DEFAULT_PORT]
        private = [source for source in sources if within_internal(source)]
        if private:
            lines.append("never reached from %s: private networks do not reach an external address (remove them, "
                         "or set externalIP: false for crawlers inside the VPC)" % ", ".join(private))
    else:
        lines = ["proxies: at their internal addresses in network %s (externalIP: false), reachable only from inside "
                 "it or networks connected to it; they leave through the region's Cloud NAT, all from its "
                 "addresses" % settings.network]
    lines.append("crawlers from: %s (allowedSources, or a Proxy's own spec.allowedSources; %s)" % (
        "anywhere (0.0.0.0/0 is written)" if "0.0.0.0/0" in sources else ", ".join(sources) or "nowhere", admitter))
    if ipv6:
        lines.append("not admitted: %s (IPv6: the instances are dialled at an IPv4 address)" % ", ".join(ipv6))
    probe = ipv4_sources(identity.probe_sources)
    lines.append("the controller's probe from: %s" % (
        "%s (probeSources; admitted on every instance besides the crawlers' sources)" % ", ".join(probe) if probe else
        "not named (no probeSources): it passes only if the controller leaves from an address in the crawlers' "
        "sources"))
    return lines


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
