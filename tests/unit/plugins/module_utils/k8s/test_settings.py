"""The kubernetes section: its settings, their defaults, and every bad field."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import config_errors, parse_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from support.collection.config_documents import DELETE, K8S, assert_bad_field, changed, paths, valid_document


def test_kubernetes_settings_and_their_defaults() -> None:
    minimal = parse_provider_config(valid_document()).providers[2].kubernetes
    assert minimal is not None
    assert minimal == KubernetesSettings(namespace="egress", image="ubuntu/squid:latest", kubeconfig=None,
                                         squid_config=None, exposure="none", spread_nodes=True,
                                         cpu_request="100m", memory_request="128Mi", namespaces=(),
                                         ip_families=("IPv4",))
    assert minimal.locations == ("egress",)
    document = changed(((*K8S, "namespaces"), ["crawl-a", "egress"]), ((*K8S, "kubeconfig"), "/etc/kube/config"),
                       ((*K8S, "squidConfig"), "# https_port is fine\nhttp_access allow all\n"),
                       ((*K8S, "exposure"), "hostNetwork"), ((*K8S, "spreadNodes"), False),
                       ((*K8S, "cpuRequest"), "0.5"), ((*K8S, "memoryRequest"), "1Gi"))
    full = parse_provider_config(document).providers[2].kubernetes
    assert full is not None
    assert full.locations == ("egress", "crawl-a")  # the default first, never twice
    assert (full.kubeconfig, full.exposure, full.spread_nodes, full.cpu_request, full.memory_request) == (
        "/etc/kube/config", "hostNetwork", False, "0.5", "1Gi")
    assert full.host_network
    assert full.squid_config == "# https_port is fine\nhttp_access allow all\n"


BAD_FIELDS = [
    pytest.param(changed(((*K8S, "namespace"), "Egress")), "providers[2].kubernetes.namespace: 'Egress'",
                 id="kubernetes-namespace-invalid"),
    pytest.param(changed(((*K8S, "namespaces"), ["crawl-a", "Crawl_B"])),
                 "providers[2].kubernetes.namespaces[1]: 'Crawl_B' is not a valid Kubernetes namespace name",
                 id="kubernetes-namespaces-entry-invalid"),
    pytest.param(changed(((*K8S, "namespaces"), [])), "providers[2].kubernetes.namespaces: must be a non-empty list",
                 id="kubernetes-namespaces-empty"),
    pytest.param(changed(((*K8S, "image"), "ubuntu/squid latest")),
                 "providers[2].kubernetes.image: 'ubuntu/squid latest' is not a container image reference",
                 id="kubernetes-image-with-space"),
    pytest.param(changed(((*K8S, "squidConfig"), "acl a src all\n  http_port 8080\n")),
                 "providers[2].kubernetes.squidConfig: must not contain http_port: the module adds",
                 id="kubernetes-squid-config-with-http-port"),
    pytest.param(changed(((*K8S, "squidConfig"), "#" * (64 * 1024 + 1))),
                 "providers[2].kubernetes.squidConfig: is longer than 65536 bytes", id="kubernetes-squid-config-huge"),
    pytest.param(changed(((*K8S, "cpuRequest"), "half")),
                 "providers[2].kubernetes.cpuRequest: 'half' is not a Kubernetes quantity",
                 id="kubernetes-cpu-request"),
    pytest.param(changed(((*K8S, "memoryRequest"), "128MB")),
                 "providers[2].kubernetes.memoryRequest: '128MB' is not a Kubernetes quantity",
                 id="kubernetes-memory-request"),
    pytest.param(changed(((*K8S, "hostNetwork"), True)),
                 "providers[2].kubernetes.hostNetwork: was replaced by exposure: write exposure: hostNetwork",
                 id="kubernetes-host-network-replaced"),
    pytest.param(changed(((*K8S, "exposure"), "Ingress")),
                 "providers[2].kubernetes.exposure: 'Ingress' is not one of none, hostPort, hostNetwork, NodePort, "
                 "LoadBalancer", id="kubernetes-exposure"),
    pytest.param(changed(((*K8S, "hostnetwork"), True)), "providers[2].kubernetes.hostnetwork: unknown field",
                 id="kubernetes-typo"),
    pytest.param(changed(((*K8S, "ipFamilies"), ["IPv4", "IPv4"])),
                 "providers[2].kubernetes.ipFamilies: ['IPv4', 'IPv4'] must list IPv4, IPv6 or both, each once",
                 id="kubernetes-ip-families"),
    # Issue 39 row 5: a public exposure with the private default sources shut out crawlers on the
    # internet; the sources must be named (0.0.0.0/0 only when written).
    pytest.param(changed(((*K8S, "exposure"), "LoadBalancer")),
                 "providers[2].allowedSources: required with kubernetes.exposure: LoadBalancer (its endpoints are "
                 "reachable from outside the cluster): name the crawlers' networks (allowedSources: "
                 "[203.0.113.0/24]), or 0.0.0.0/0 and ::/0 to serve anyone; name the controller's own once in "
                 "probe.sources", id="kubernetes-load-balancer-without-sources"),
    pytest.param(changed(((*K8S, "exposure"), "NodePort")),
                 "providers[2].allowedSources: required with kubernetes.exposure: NodePort",
                 id="kubernetes-node-port-without-sources"),
]


def test_a_public_exposure_with_named_sources_and_probe_sources_is_valid() -> None:
    document = changed(((*K8S, "exposure"), "LoadBalancer"), ((*K8S, "ipFamilies"), ["IPv4", "IPv6"]),
                       (("providers", 2, "allowedSources"), ["203.0.113.0/24"]))
    provider = parse_provider_config(document).providers[2]
    assert provider.kubernetes is not None and provider.kubernetes.ip_families == ("IPv4", "IPv6")
    assert provider.allowed_sources == ("203.0.113.0/24",)


@pytest.mark.parametrize(("document", "expected"), BAD_FIELDS)
def test_a_bad_field_is_reported_with_its_path(document: dict[str, Any], expected: str) -> None:
    assert_bad_field(document, expected)


def test_every_unknown_key_and_every_bad_field_of_one_section_is_reported() -> None:
    document = changed(((*K8S, "hostnetwork"), True), ((*K8S, "cpu"), "1"), ((*K8S, "memoryRequest"), "lots"),
                       ((*K8S, "namespace"), DELETE))
    assert paths(config_errors(document)) == [
        "providers[2].kubernetes.hostnetwork", "providers[2].kubernetes.cpu", "providers[2].kubernetes.namespace",
        "providers[2].kubernetes.memoryRequest"]
