"""The minimal config of docs/kubernetes-provider.md, through the real command (issue 39 item 7,
Kubernetes), and a Pod's squid refusing its node's addresses (issue 38 row 1).

The ``egress-proxies`` command (a child process, as shipped) reads exactly the YAML block of the
page's "Minimal config" section, its values changed for this test's addresses only, and makes a
Proxy's Pod and LoadBalancer Service on the Kubernetes API emulator. The cluster's data plane is
real, in a network namespace of the test's: the Pod runs as a real squid with its generated
squid.conf (tests/support/netns/squid_kubelet.py), and its Service is served with iptables as
kube-proxy and a cloud load balancer would (tests/support/netns/service_network.py:
loadBalancerSourceRanges enforced, the client's address kept by externalTrafficPolicy Local).
Crawlers live in a second namespace, "the internet", at public addresses; the probe target and a
service on the node's ExternalIP in the cluster's. Nothing is sent anywhere else: the load
balancer's address is one of the namespace's, the emulator makes up none that is dialled.

Shown: the crawler in ``allowedSources`` gets its 204 through the endpoint discovery hands out;
one outside them is dropped before squid (the connection never completes, the firewall counted
it); the controller's own probe passes (discovery lists only proxies whose probe passed); the
proxy refuses the node's ExternalIP (403); the Service has no node port; the Serving verdict says
whether the probe proves the crawlers' path (here not: the controller's source is private).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from support import REPO
from support.collection.provider_config import write_kubeconfig
from support.controller.command import ControllerProcess
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd
from support.netns.internet import CRAWLER, CRAWLERS, NODE_EXTERNAL, STRANGER, cluster_and_internet
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import ProbeTargetProcess
from support.netns.service_network import ServiceNetwork
from support.netns.squid_kubelet import squid_kubelet

# The controller's module runs (ansible-runner) take most of it: seconds on a quiet machine,
# a minute or two at load 10 on 2 cores.
pytestmark = pytest.mark.timeout(420)

DOC = REPO / "docs" / "kubernetes-provider.md"
NAMESPACE, POD_NAMESPACE, NAME = "crawlers", "egress", "eu-1"
OPERATOR_TOKEN, CRAWLER_TOKEN = "operator-token-minimal-config", "crawler-token-minimal-config"
# In the cluster's namespace: a service on the node's ExternalIP, and the probe target at a public
# address (one of TARGETS no other test routes to from the root namespace just now).
NODE_SERVICE_PORT = 9100
TARGETS = [f"198.51.100.{host}" for host in range(160, 250)]


def minimal_config() -> dict[str, Any]:
    """The first YAML block after the page's "### Minimal config" heading, as written there."""
    section = DOC.read_text().split("### Minimal config", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"{DOC} has no YAML block under its Minimal config heading"
    return dict(yaml.safe_load(found.group(1)))


def for_this_test(document: dict[str, Any], probe_target: ProbeTargetProcess, probe_source: str,
                  kubeconfig: Path) -> dict[str, Any]:
    """The documented config with its values set to this test's: the crawlers' network, the probe
    target and key, the controller's source, and the kubeconfig (the controller runs outside the
    cluster). No key is added or removed but ``kubeconfig``."""
    (provider,) = document["providers"]
    keys = {key: set(provider[key]) for key in ("probe", "kubernetes")}
    document["probeSources"] = [probe_source]
    provider["allowedSources"] = [CRAWLERS]
    provider["probe"].update(httpUrl=probe_target.url(), keyFile=str(probe_target.key_file))
    provider["kubernetes"]["kubeconfig"] = str(kubeconfig)
    assert set(provider["probe"]) == keys["probe"]
    assert set(provider["kubernetes"]) == keys["kubernetes"] | {"kubeconfig"}
    return document


def through_proxy(internet: NetworkNamespace, source: str, proxy_url: str, url: str) -> tuple[int, str]:
    """curl from ``source`` in the internet namespace through ``proxy_url``: (exit code, HTTP code)."""
    done = subprocess.run(internet.command(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--interface",
                                            source, "--connect-timeout", "2", "--max-time", "10", "--proxy",
                                            proxy_url, url]), capture_output=True, text=True, check=False)
    return done.returncode, done.stdout


@pytest.fixture(name="cluster_and_internet")
def cluster_and_internet_fixture() -> Iterator[tuple[NetworkNamespace, NetworkNamespace]]:
    with cluster_and_internet() as namespaces:
        yield namespaces


def route_probe_target(cluster: NetworkNamespace) -> str:
    """An address of TARGETS routed from the root namespace into ``cluster`` (the controller asks
    the probe target directly too) and given to it; the route goes with the namespace's veth. One
    another test routes already is skipped, never taken over."""
    for address in TARGETS:
        added = subprocess.run(["ip", "route", "add", f"{address}/32", "via", cluster.address], capture_output=True,
                               text=True, check=False)
        if added.returncode == 0:
            cluster.add_address(address)
            return address
    raise AssertionError(f"every probe target address of {TARGETS[0]}-{TARGETS[-1]} is routed elsewhere")


def test_the_documented_minimal_config_serves_a_crawler_on_the_internet_and_drops_a_stranger(
        tmp_path: Path, cluster_and_internet: tuple[NetworkNamespace, NetworkNamespace]) -> None:
    cluster, internet = cluster_and_internet
    load_balancer = cluster.network.rsplit(".", 1)[0] + ".200"
    with ProbeTargetProcess(cluster, route_probe_target(cluster), http_port=80, tunnel_port=443) as target, \
            ProbeTargetProcess(cluster, NODE_EXTERNAL, http_port=NODE_SERVICE_PORT, tunnel_port=9101), \
            KubeEmulator(crds=[proxy_crd()], namespaces=[NAMESPACE, POD_NAMESPACE, "egress-proxies"]) as kube:
        kube.add_node("node-1", cluster.address, external_ip=NODE_EXTERNAL)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        config = tmp_path / "providers.yaml"
        config.write_text(yaml.safe_dump(for_this_test(minimal_config(), target, f"{cluster.gateway}/32", kubeconfig)))
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text(yaml.safe_dump([{"name": "crawlers", "namespaces": [NAMESPACE],
                                           "sha256": hashlib.sha256(CRAWLER_TOKEN.encode()).hexdigest()}]))
        with squid_kubelet(kube, cluster, POD_NAMESPACE) as kubelet, \
                ServiceNetwork(kube, cluster, POD_NAMESPACE, [load_balancer]) as network, \
                ControllerProcess(["--source", "kubernetes", "--kubeconfig", str(kubeconfig), "--provider-config",
                                   str(config), "--work-dir", str(tmp_path / "controller"), "--listen", "127.0.0.1:0",
                                   "--interval", "2", "--probe-interval", "1", "--probe-allow", cluster.network,
                                   "--discovery-tokens", str(tokens)], env={"DISCOVERY_TOKEN": OPERATOR_TOKEN},
                                  work_dir=tmp_path / "controller") as controller, \
                client.ApiClient(client.Configuration(host=kube.url)) as api:
            client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": NAME},
                "spec": {"provider": "cluster"}})

            def discovered() -> list[dict[str, Any]]:
                code, answer = controller.http("GET", f"/v1/namespaces/{NAMESPACE}/proxies", token=CRAWLER_TOKEN)
                return list(answer["proxies"]) if code == 200 else []

            # Listed only once the controller's own probe passed through the load balancer.
            controller.wait_for(discovered, 360, "the Proxy in discovery (its probe passed)")
            assert kubelet.errors == [] and network.errors == [] and network.refused == set()
            (entry,) = discovered()
            assert entry["endpoint"] == f"{load_balancer}:3128" and entry["serving"] == "True"
            service = kube.get_object("services", POD_NAMESPACE, entry["providerID"].rsplit("/", 1)[1])
            assert service is not None
            assert service["spec"]["loadBalancerSourceRanges"] == [CRAWLERS, f"{cluster.gateway}/32"]
            assert "nodePort" not in service["spec"]["ports"][0]  # no way around the ranges (issue 38 row 9)

            # The crawler on the internet, in allowedSources: its 204 through the handed-out endpoint.
            assert through_proxy(internet, CRAWLER, entry["url"], target.url()) == (0, "204")
            # A stranger: dropped before squid (the connection never completes, the firewall counted it).
            dropped = network.dropped()
            code, status = through_proxy(internet, STRANGER, entry["url"], target.url())
            assert (code, status) == (28, "000"), (code, status)  # curl: connect timeout
            assert network.dropped() > dropped
            # The node's own service on its ExternalIP, through the proxy: refused (issue 38 row 1).
            node_url = f"http://{NODE_EXTERNAL}:{NODE_SERVICE_PORT}/generate_204"
            assert through_proxy(internet, CRAWLER, entry["url"], node_url) == (0, "403")
            # The verdict says whether the probe proves the crawlers' path: this controller's source is
            # a private address, which an in-cluster probe could have too, so it does not, and says how.
            stored = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
            status = cast(dict[str, Any], stored)["status"]
            assert status["exposure"].startswith(f"LoadBalancer that admits private sources ({cluster.gateway}/32)")
            (serving,) = [c for c in status["conditions"] if c["type"] == "Serving"]
            assert serving["status"] == "True"
            assert "outside path is not verified; to verify it, probe from outside the cluster" in serving["message"]
