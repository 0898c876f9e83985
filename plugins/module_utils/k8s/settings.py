# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``kubernetes`` section of a provider entry: its settings and how it is read.

Importable without the kubernetes client: only the standard library and the config reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import Errors, Reader


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
    exposure: str = "none"
    """How crawlers reach a Pod (EXPOSURES): its own IP, a node's address, or a load balancer's."""
    spread_nodes: bool = True
    cpu_request: str = "100m"
    memory_request: str = "128Mi"
    namespaces: Tuple[str, ...] = ()
    """Further namespaces a Proxy may name as its ``location`` (listing covers them all)."""
    ip_families: Tuple[str, ...] = ("IPv4",)
    """The IP families of a Proxy's Service (the cluster's: ``IPv4``, ``IPv6``, or both on a
    dual-stack cluster); its ``loadBalancerSourceRanges`` hold only sources of these families."""

    @property
    def host_network(self) -> bool:
        return self.exposure == "hostNetwork"

    def public_exposure(self) -> Optional[str]:
        """What makes this provider's endpoints reachable from outside the cluster, as the config
        says it (config.py then requires ``allowedSources`` written), or None: a load balancer's
        address, or a NodePort on nodes that may have an ExternalIP (the config cannot know the
        nodes; a NodePort meant for a private network names its sources all the same)."""
        if self.exposure in SERVICE_EXPOSURES:
            return "kubernetes.exposure: %s (its endpoints are reachable from outside the cluster)" % self.exposure
        return None

    @property
    def locations(self) -> Tuple[str, ...]:
        """Every namespace this provider creates Pods in and lists, the default first."""
        return (self.namespace, *(n for n in self.namespaces if n != self.namespace))


# A namespace name is an RFC 1123 label (providerIDs rely on it: k8s://namespaces/<ns>/pods/<name>).
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NAMESPACE_RULE = "is not a valid Kubernetes namespace name (RFC 1123 label: lowercase letters, digits, '-')"
# A Kubernetes resource quantity as requests take it ("100m", "0.5", "128Mi", "1G").
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
QUANTITY_RULE = "is not a Kubernetes quantity such as 100m, 0.5, 128Mi or 1Gi"
# How a Proxy's Pod is reached (docs/kubernetes-provider.md, "Exposure"): its Pod IP (crawlers in
# the cluster or a flat network); a port on its node (hostPort: the Pod's own network namespace;
# hostNetwork: the node's); or a Service per Pod (NodePort: the node's address and an allocated
# node port; LoadBalancer: the cloud load balancer's address).
EXPOSURES = ("none", "hostPort", "hostNetwork", "NodePort", "LoadBalancer")
SERVICE_EXPOSURES = ("NodePort", "LoadBalancer")
# A Service's ipFamilies (k8s.io/api core/v1 IPFamily); two only on a dual-stack cluster.
IP_FAMILIES = ("IPv4", "IPv6")
# squid.conf travels in a Pod annotation (all annotations together are capped at 256 KiB).
SQUID_CONFIG_MAX_BYTES = 64 * 1024
_HTTP_PORT_LINE = re.compile(r"^[ \t]*http_port\b", re.MULTILINE)


def parse_kubernetes_section(reader: Reader, errors: Errors) -> Optional[KubernetesSettings]:
    start = len(errors)
    if reader.has("hostNetwork"):
        errors.add("%s: was replaced by exposure: write exposure: hostNetwork for true, or drop it for false" % (
            reader.at("hostNetwork")))
    reader.only(errors, "namespace", "namespaces", "image", "kubeconfig", "squidConfig", "hostNetwork", "exposure",
                "spreadNodes", "cpuRequest", "memoryRequest", "ipFamilies")
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
    exposure = errors.read(reader.choice, "exposure", EXPOSURES, "none")
    ip_families = _ip_families(reader, errors)
    spread_nodes = errors.read(reader.boolean, "spreadNodes", True)
    cpu_request = errors.read(reader.string, "cpuRequest", "100m", pattern=QUANTITY_RE, rule=QUANTITY_RULE)
    memory_request = errors.read(reader.string, "memoryRequest", "128Mi", pattern=QUANTITY_RE, rule=QUANTITY_RULE)
    if len(errors) > start or namespace is None or image is None or exposure is None or spread_nodes is None \
            or cpu_request is None or memory_request is None:
        return None
    return KubernetesSettings(
        namespace=namespace, image=image, kubeconfig=kubeconfig, squid_config=squid_config,
        exposure=exposure, spread_nodes=spread_nodes, cpu_request=cpu_request,
        memory_request=memory_request, namespaces=tuple(namespaces), ip_families=ip_families)


def _ip_families(reader: Reader, errors: Errors) -> Tuple[str, ...]:
    """``ipFamilies``: IPv4 (the default), IPv6, or both, each once."""
    if reader.data.get("ipFamilies") is None:
        return ("IPv4",)
    families = errors.read(reader.non_empty_list, "ipFamilies") or []
    if any(f not in IP_FAMILIES for f in families) or len(set(families)) != len(families):
        errors.add("%s: %r must list IPv4, IPv6 or both, each once: the IP families of the cluster's Services" % (
            reader.at("ipFamilies"), families))
        return ("IPv4",)
    return tuple(families)
