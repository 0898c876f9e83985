"""Kubernetes Services as a crawler on the internet meets them, for real in network namespaces: the
data plane of tests/support/netns/service_network.py (kube-proxy's and a cloud load balancer's
semantics with iptables) in front of a backend that answers each caller's address (the probe
target's ``/echo``), the Pod a Service selects.

- ``externalTrafficPolicy: Local`` keeps the client's address; ``Cluster`` shows the node's
  InternalIP instead (what made squid's source allowlist see a node and not the crawler);
- a LoadBalancer Service with node ports (what the provider made before issue 38 row 9): a source
  outside ``loadBalancerSourceRanges`` is dropped at the load balancer's address but walks in
  through the node's ExternalIP and the node port; the provider's Service now has no node port,
  so the same stranger has no way in.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import build_pod, build_service
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access
from support.kube.emulator import KubeEmulator
from support.netns.internet import CRAWLER, CRAWLERS, NODE_EXTERNAL, STRANGER, cluster_and_internet
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import HTTP_PORT, ProbeTargetProcess
from support.netns.service_network import ServiceNetwork

pytestmark = pytest.mark.timeout(120)

NS = "egress"
SETTINGS = KubernetesSettings(namespace=NS, image="squid", exposure="LoadBalancer")
REQUEST = InstanceRequest(name="eu-1", user_data=b"", tags={"crawl.example.com/owner": "prod-cluster-1"},
                          port=HTTP_PORT, access=parse_access({"open": True, "allowed_sources": [CRAWLERS]}))


@dataclass
class Lab:
    cluster: NetworkNamespace
    internet: NetworkNamespace
    kube: KubeEmulator
    network: ServiceNetwork
    backend: str  # the Pod's address: the echo

    def service(self, name: str, **spec: Any) -> dict[str, Any]:
        """A Service selecting the Pod, as created (its node port allocated), once it is served."""
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"selector": {"app.kubernetes.io/instance": "eu-1"},
                         "ports": [{"name": "proxy", "port": HTTP_PORT, "targetPort": "proxy", "protocol": "TCP"}],
                         **spec}}
        return self.served(self.kube.create("services", NS, body))

    def served(self, created: dict[str, Any]) -> dict[str, Any]:
        """``created`` as stored once the data plane serves it (a load balancer's address given)."""
        self.network.sync()
        return self.kube.get_object("services", NS, created["metadata"]["name"]) or {}

    def seen_as(self, source: str, address: str, port: int) -> str | None:
        """The address the backend saw ``source`` come from, through ``address:port``; None when
        the connection never completed (dropped)."""
        done = subprocess.run(self.internet.command(
            ["curl", "-s", "--interface", source, "--connect-timeout", "1", "--max-time", "5",
             f"http://{address}:{port}/echo"]), capture_output=True, text=True, check=False)
        return str(json.loads(done.stdout)["ip"]) if done.returncode == 0 else None


@pytest.fixture
def lab() -> Iterator[Lab]:
    with cluster_and_internet() as (cluster, internet):
        base = cluster.network.rsplit(".", 1)[0]
        with ProbeTargetProcess(cluster) as backend, KubeEmulator(namespaces=[NS]) as kube:
            kube.add_node("node-1", cluster.address, external_ip=NODE_EXTERNAL)
            # The provider's own Pod, its port the backend's; the kubelet stand-in reports the backend's address.
            kube.create("pods", NS, build_pod(SETTINGS, REQUEST, NS))
            kube.kubelet_run(NS, "eu-1", pod_ip=backend.address, node="node-1")
            # Synced by the test itself (poll: never by itself), so each check sees what it just made.
            with ServiceNetwork(kube, cluster, NS, [f"{base}.200", f"{base}.201"], poll=3600) as network:
                yield Lab(cluster, internet, kube, network, backend.address)


def node_port(service: dict[str, Any]) -> int:
    return int(service["spec"]["ports"][0]["nodePort"])


def test_local_keeps_the_crawlers_address_and_cluster_shows_a_node(lab: Lab) -> None:
    local = lab.service("local", type="NodePort", externalTrafficPolicy="Local")
    cluster = lab.service("cluster", type="NodePort", externalTrafficPolicy="Cluster")
    assert lab.seen_as(CRAWLER, NODE_EXTERNAL, node_port(local)) == CRAWLER
    assert lab.seen_as(CRAWLER, NODE_EXTERNAL, node_port(cluster)) == lab.cluster.address  # the node's InternalIP
    assert lab.seen_as(CRAWLER, lab.cluster.address, node_port(local)) == CRAWLER  # on every node address


def test_a_node_port_walked_around_the_source_ranges_and_the_providers_service_has_none(lab: Lab) -> None:
    # Issue 38 row 9, the attack: the stranger is outside loadBalancerSourceRanges.
    before = lab.service("before", type="LoadBalancer", externalTrafficPolicy="Local",
                         loadBalancerSourceRanges=[CRAWLERS])
    balancer = before["status"]["loadBalancer"]["ingress"][0]["ip"]
    assert lab.seen_as(CRAWLER, balancer, HTTP_PORT) == CRAWLER
    assert lab.seen_as(STRANGER, balancer, HTTP_PORT) is None  # dropped at the load balancer
    assert lab.seen_as(STRANGER, NODE_EXTERNAL, node_port(before)) == STRANGER  # ...and in by the node port
    # The provider's Service (pods.build_service, as the module creates it): no node port at all,
    # so the load balancer's ranges are the only way to its Pod.
    pod = lab.kube.get_object("pods", NS, "eu-1")
    assert pod is not None
    made = lab.served(lab.kube.create("services", NS, build_service(SETTINGS, REQUEST, pod)))
    assert [port.get("nodePort") for port in made["spec"]["ports"]] == [None]
    address = made["status"]["loadBalancer"]["ingress"][0]["ip"]
    assert lab.seen_as(CRAWLER, address, HTTP_PORT) == CRAWLER
    assert lab.seen_as(STRANGER, address, HTTP_PORT) is None
