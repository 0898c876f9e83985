"""The Kubernetes modules through ansible-runner against the Kubernetes API emulator.

Each module run is its own process talking to the emulator over HTTP with the official
client, as under the controller. The emulator has no kubelet: tests play it by writing the
Pod's status (phase, Ready, podIP) through the status subresource.

Every module run costs about two seconds, so this file proves what only a real module run
can (options, results, check mode, idempotency, error_class in the result); the full tables
of API errors and bad input run in-process against the same emulator in
tests/unit/plugins/module_utils/k8s/test_instances.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from support.collection.modules import ModuleRun, run_module
from support.collection.provider_config import OWNER, OWNER_TAGS, write_kubeconfig, write_kubernetes_config
from support.kube.emulator import KubeEmulator

NAMESPACE = "egress"
NAME = "crawlers-eu-1-3f9c2a"
PROVIDER_ID = f"k8s://namespaces/{NAMESPACE}/pods/{NAME}"
TAGS = {**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/eu-1", "crawl.example.com/uid": "0f6c-11",
        "crawl.example.com/spec-hash": "3f9c2a"}


@pytest.fixture(autouse=True)
def namespaces(kube: KubeEmulator) -> None:
    """The provider's namespaces exist, as the cluster operator made them (the API refuses Pods
    in a missing one)."""
    for namespace in (NAMESPACE, "crawl-b"):
        kube.create_namespace(namespace)


@pytest.fixture
def core(kube: KubeEmulator) -> client.CoreV1Api:
    return client.CoreV1Api(client.ApiClient(client.Configuration(host=kube.url)))


@pytest.fixture
def kubeconfig(tmp_path: Path, kube: KubeEmulator) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url)


@pytest.fixture
def config(tmp_path: Path, kubeconfig: Path) -> Path:
    return write_kubernetes_config(tmp_path / "providers.yaml", kubeconfig, namespaces=[NAMESPACE, "crawl-b"])


def proxy(config: Path, check_mode: bool = False, **args: Any) -> ModuleRun:
    return run_module("k8s_proxy", {"provider_config": str(config), "provider": "cluster", **args},
                      check_mode=check_mode)


def info(config: Path, **args: Any) -> ModuleRun:
    return run_module("k8s_proxy_info", {"provider_config": str(config), "provider": "cluster", **args})


def be_the_kubelet(kube: KubeEmulator, name: str = NAME, namespace: str = NAMESPACE, ready: bool = True) -> None:
    """The Pod scheduled to a node, its container running and (if ``ready``) its readiness
    probe passed, as the scheduler and kubelet would report it."""
    kube.kubelet_run(namespace, name, pod_ip="10.244.1.7", host_ip="192.0.2.21", ready=ready)


def test_create_get_list_delete_round_trip(config: Path, kube: KubeEmulator) -> None:
    planned = proxy(config, check_mode=True, name=NAME, tags=TAGS)
    assert planned.status == "successful", planned.result
    assert planned.result["changed"] is True
    assert planned.result["provider_id"] == PROVIDER_ID
    assert kube.get_object("pods", NAMESPACE, NAME) is None  # check mode wrote nothing

    created = proxy(config, name=NAME, tags=TAGS, port=8080, user_data="")
    assert created.status == "successful", created.result
    assert created.result["changed"] is True
    instance = created.result["instance"]
    assert instance["provider_id"] == PROVIDER_ID
    assert (instance["name"], instance["location"], instance["state"], instance["ip"]) == (
        NAME, NAMESPACE, "pending", None)
    assert instance["tags"] == TAGS and instance["created"]

    pod = kube.get_object("pods", NAMESPACE, NAME)
    assert pod is not None
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels == {"app.kubernetes.io/name": "egress-proxy", "app.kubernetes.io/managed-by": "egress-proxies",
                      "app.kubernetes.io/instance": NAME,
                      "crawl.example.com/owner": OWNER, "crawl.example.com/uid": "0f6c-11",
                      "crawl.example.com/spec-hash": "3f9c2a"}  # the proxy tag "ns/name" is no label value
    assert json.loads(annotations["crawl.example.com/tags"]) == TAGS
    assert annotations["crawl.example.com/squid-conf"].startswith("http_port 8080\n")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "ubuntu/squid:6.6-24.04_beta"
    assert container["command"] == ["squid", "-N", "-f", "/etc/egress-proxy/squid.conf"]
    assert container["ports"] == [{"name": "proxy", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "proxy"}
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
    assert "hostNetwork" not in spec
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "egress-proxies",
                                                       "crawl.example.com/owner": OWNER}}

    again = proxy(config, name=NAME, tags=TAGS, port=8080)
    assert again.status == "successful", again.result
    assert again.result["changed"] is False
    assert again.result["provider_id"] == PROVIDER_ID
    assert [m for m, _ in kube.requests()].count("POST") == 2  # the re-create met a 409 and read the Pod back

    be_the_kubelet(kube)
    by_id = info(config, provider_id=PROVIDER_ID)
    assert by_id.status == "successful", by_id.result
    (running,) = by_id.result["instances"]
    assert (running["state"], running["ip"], running["tags"]) == ("running", "10.244.1.7", TAGS)
    assert running["endpoint"] == "10.244.1.7:8080"  # exposure none: the Pod IP and its port

    by_tags = info(config, tags={**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/eu-1"})
    assert by_tags.status == "successful", by_tags.result
    assert by_tags.result["instances"] == [running]
    assert by_tags.result["failed_locations"] == {}
    lists = [path for method, path in kube.requests() if method == "GET" and "labelSelector=" in path]
    # One label-selected list per configured namespace (side by side), never an all-namespaces list.
    assert sorted(path.split("?")[0] for path in lists) == ["/api/v1/namespaces/crawl-b/pods",
                                                            f"/api/v1/namespaces/{NAMESPACE}/pods"]
    foreign = info(config, tags={"crawl.example.com/owner": "someone-else"})
    assert foreign.status == "successful" and foreign.result["instances"] == []

    would_delete = proxy(config, check_mode=True, state="absent", provider_id=PROVIDER_ID)
    assert would_delete.result["changed"] is True
    assert kube.get_object("pods", NAMESPACE, NAME) is not None

    kube.freeze_clock()  # module runs take seconds here: the grace period ends only by advance()
    deleted = proxy(config, state="absent", provider_id=PROVIDER_ID)
    assert deleted.status == "successful", deleted.result
    assert deleted.result["changed"] is True
    # A running Pod is deleted gracefully: terminating (and read as stopped) for its grace period.
    terminating = kube.get_object("pods", NAMESPACE, NAME)
    assert terminating is not None and terminating["metadata"]["deletionGracePeriodSeconds"] == 10
    (stopping,) = info(config, provider_id=PROVIDER_ID).result["instances"]
    assert stopping["state"] == "stopped"
    deleted_again = proxy(config, state="absent", provider_id=PROVIDER_ID)
    assert deleted_again.status == "successful" and deleted_again.result["changed"] is False

    kube.advance(10)
    assert kube.get_object("pods", NAMESPACE, NAME) is None
    gone = info(config, provider_id=PROVIDER_ID)
    assert gone.failed and gone.result["error_class"] == "not_found"


def test_host_network_without_spreading_reports_the_node_ip(tmp_path: Path, kubeconfig: Path,
                                                              kube: KubeEmulator) -> None:
    config = write_kubernetes_config(tmp_path / "providers.yaml", kubeconfig, exposure="hostNetwork", spreadNodes=False,
                                     cpuRequest="250m", memoryRequest="64Mi", namespaces=["crawl-b"],
                                     squidConfig="http_access allow all\n")
    created = proxy(config, name=NAME, tags=TAGS, location="crawl-b")
    assert created.status == "successful", created.result
    assert created.result["provider_id"] == f"k8s://namespaces/crawl-b/pods/{NAME}"
    pod = kube.get_object("pods", "crawl-b", NAME)
    assert pod is not None
    spec = pod["spec"]
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "topologySpreadConstraints" not in spec
    (container,) = spec["containers"]
    assert container["ports"] == [{"name": "proxy", "containerPort": 3128, "hostPort": 3128, "protocol": "TCP"}]
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "64Mi"}}
    assert pod["metadata"]["annotations"]["crawl.example.com/squid-conf"] == "http_port 3128\nhttp_access allow all\n"

    be_the_kubelet(kube, namespace="crawl-b")
    (instance,) = info(config, provider_id=f"k8s://namespaces/crawl-b/pods/{NAME}").result["instances"]
    assert (instance["state"], instance["ip"], instance["endpoint"]) == ("running", "192.0.2.21", "192.0.2.21:3128")


def test_a_load_balancer_exposed_pod_hands_out_the_load_balancers_address(tmp_path: Path, kubeconfig: Path,
                                                                          kube: KubeEmulator) -> None:
    """Crawlers outside the cluster cannot reach a Pod IP: with exposure LoadBalancer each Pod gets
    a Service, and the instance's endpoint is the load balancer's address once the cloud gave one
    (pending until then); its ip stays the Pod's own. Deleting removes both."""
    config = write_kubernetes_config(tmp_path / "providers.yaml", kubeconfig, exposure="LoadBalancer",
                                     allowed_sources=["198.51.100.0/24"])
    created = proxy(config, name=NAME, tags=TAGS, access={"open": True, "allowed_sources": ["198.51.100.0/24"]})
    assert created.status == "successful", created.result
    service = kube.get_object("services", NAMESPACE, NAME)
    assert service is not None and service["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    be_the_kubelet(kube)
    kube.provision_load_balancer(NAMESPACE, NAME, ip="198.51.100.20")
    (instance,) = info(config, tags=OWNER_TAGS).result["instances"]
    assert (instance["state"], instance["ip"], instance["endpoint"]) == ("running", "10.244.1.7", "198.51.100.20:3128")
    deleted = proxy(config, state="absent", provider_id=PROVIDER_ID)
    assert deleted.status == "successful", deleted.result
    assert kube.get_object("services", NAMESPACE, NAME) is None


def test_an_evicted_pod_is_reported_in_error_and_deleted_at_once(config: Path, kube: KubeEmulator) -> None:
    """The kubelet evicts the Pod (phase Failed, reason Evicted): both modules report ``error``
    so the controller replaces it, and deleting it takes no grace period (nothing runs)."""
    assert proxy(config, name=NAME, tags=TAGS).status == "successful"
    be_the_kubelet(kube)
    kube.kubelet_evict(NAMESPACE, NAME)

    (by_id,) = info(config, provider_id=PROVIDER_ID).result["instances"]
    (by_tags,) = info(config, tags=OWNER_TAGS).result["instances"]
    assert (by_id["state"], by_id["ip"]) == ("error", "10.244.1.7")
    assert by_tags == by_id
    deleted = proxy(config, state="absent", provider_id=PROVIDER_ID)
    assert deleted.status == "successful" and deleted.result["changed"] is True
    assert kube.get_object("pods", NAMESPACE, NAME) is None


def test_a_namespace_that_does_not_exist_is_permanent_naming_location(tmp_path: Path, kubeconfig: Path) -> None:
    config = write_kubernetes_config(tmp_path / "providers.yaml", kubeconfig, namespace="not-created")
    created = proxy(config, name=NAME, tags=TAGS)
    assert created.failed and created.result["error_class"] == "permanent"
    assert created.result["msg"].startswith("location: namespace not-created does not exist")
    assert 'namespaces "not-created" not found' in created.result["msg"]
    listed = info(config, tags=OWNER_TAGS)  # the real server lists a missing namespace as empty
    assert listed.status == "successful" and listed.result["instances"] == []


def test_a_foreign_pod_of_that_name_is_never_touched(config: Path, kube: KubeEmulator,
                                                     core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NAMESPACE, client.V1Pod(
        metadata=client.V1ObjectMeta(name=NAME, labels={"app": "web"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="nginx")])))
    created = proxy(config, name=NAME, tags=TAGS)
    assert created.failed and created.result["error_class"] == "permanent"
    assert created.result["msg"].startswith("name: ")
    deleted = proxy(config, state="absent", provider_id=PROVIDER_ID)
    assert deleted.failed and deleted.result["error_class"] == "permanent"
    pod = kube.get_object("pods", NAMESPACE, NAME)
    assert pod is not None and pod["metadata"]["labels"] == {"app": "web"}
    assert "DELETE" not in {method for method, _ in kube.requests()}


@pytest.mark.parametrize(
    ("module", "method", "status", "error_class"),
    [
        ("k8s_proxy", "POST", 403, "permanent"),
        ("k8s_proxy_info", "GET", 500, "transient"),
    ],
    ids=lambda value: str(value),
)
def test_api_errors_reach_the_result_classified(config: Path, kube: KubeEmulator, module: str, method: str, status: int,
                                   error_class: str) -> None:
    kube.fail_next(method, r"/pods", status, count=10, message=f"injected {status}")
    args: dict[str, Any] = {"name": NAME, "tags": TAGS} if module == "k8s_proxy" else {"provider_id": PROVIDER_ID}
    result = run_module(module, {"provider_config": str(config), "provider": "cluster", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == error_class
    assert f"injected {status}" in result.result["msg"]
    assert kube.get_object("pods", NAMESPACE, NAME) is None


def test_a_namespace_that_cannot_be_listed_fails_the_listing_with_what_was_seen(config: Path,
                                                                                 kube: KubeEmulator) -> None:
    assert proxy(config, name=NAME, tags=TAGS).status == "successful"
    kube.fail_next("GET", r"/namespaces/crawl-b/pods\?", 500)
    listed = info(config, tags=OWNER_TAGS)
    assert listed.failed and listed.result["error_class"] == "transient"
    assert [i["provider_id"] for i in listed.result["instances"]] == [PROVIDER_ID]
    assert set(listed.result["failed_locations"]) == {"crawl-b"}
    assert listed.result["failed_locations"]["crawl-b"]["error_class"] == "transient"


GOOD: dict[str, Any] = {"name": NAME, "tags": TAGS}


@pytest.mark.parametrize(
    ("module", "args", "field"),
    [
        ("k8s_proxy", {**GOOD, "user_data": "#cloud-config\n"}, "user_data"),
        ("k8s_proxy", {"state": "absent", "provider_id": "kvm://hosts/h1/domains/x"}, "provider_id"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input_fails_permanent_naming_the_field(config: Path, kube: KubeEmulator, module: str,
                                                    args: dict[str, Any], field: str) -> None:
    result = run_module(module, {"provider_config": str(config), "provider": "cluster", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == "permanent"
    assert result.result["msg"].startswith(field), result.result
    assert "POST" not in {method for method, _ in kube.requests()}


def test_a_bad_provider_config_fails_permanent_with_the_field_path(tmp_path: Path, kubeconfig: Path) -> None:
    config = write_kubernetes_config(tmp_path / "providers.yaml", kubeconfig, squidConfig="http_port 80\n")
    result = proxy(config, **GOOD)
    assert result.failed and result.result["error_class"] == "permanent"
    assert "providers[0].kubernetes.squidConfig: must not contain http_port" in result.result["msg"]


def test_a_kubeconfig_not_there_yet_is_transient(tmp_path: Path) -> None:
    config = write_kubernetes_config(tmp_path / "providers.yaml", tmp_path / "not-mounted-yet")
    result = info(config, tags=OWNER_TAGS)
    assert result.failed and result.result["error_class"] == "transient"
    assert "kubernetes.kubeconfig" in result.result["msg"]
