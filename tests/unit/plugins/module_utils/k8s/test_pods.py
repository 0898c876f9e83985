"""The proxy Pod's manifest, the label encoding of tags, and reading state and IP back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    DEFAULT_SQUID_CONFIG,
    PASSWD_ANNOTATION,
    POD_PATHS,
    SQUID_CONF_ANNOTATION,
    TAGS_ANNOTATION,
    build_pod,
    build_service,
    is_label_key,
    is_label_value,
    is_managed,
    is_ours,
    label_selector,
    pod_instance,
    pod_ip,
    pod_state,
    pod_tags,
    squid_conf,
    tag_labels,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access, render_policy
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import container_command

SETTINGS = KubernetesSettings(namespace="egress", image="ubuntu/squid:6.6-24.04_beta")
TAGS = {
    "crawl.example.com/owner": "prod-cluster-1",
    "crawl.example.com/proxy": "crawlers/eu-1",
    "crawl.example.com/uid": "8d4f1c2e-0000-4000-8000-000000000001",
    "crawl.example.com/spec-hash": "3f9c2a",
}
REQUEST = InstanceRequest(name="crawlers-eu-1-3f9c2a", user_data=b"", tags=TAGS, port=3128)
BCRYPT = "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"
ACCESS = parse_access({"users": [{"name": "crawlers", "password_hash": BCRYPT}], "allowed_sources": ["10.0.0.0/8"]})
WITH_ACCESS = dataclasses.replace(REQUEST, access=ACCESS)
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")


def pod(settings: KubernetesSettings = SETTINGS, request: InstanceRequest = REQUEST) -> dict[str, Any]:
    return build_pod(settings, request, "egress")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "settings",
    [SETTINGS,
     dataclasses.replace(SETTINGS, exposure="hostNetwork", spread_nodes=False, squid_config="acl a src all\n"),
     dataclasses.replace(SETTINGS, exposure="hostPort")],
    ids=["default", "host-network", "host-port"],
)
@pytest.mark.parametrize("request_", [REQUEST, WITH_ACCESS], ids=["", "access"])
def test_the_manifest_is_a_valid_pod(settings: KubernetesSettings, version: str, request_: InstanceRequest) -> None:
    """Strict schema validation: a misspelled field would fail here, not on a real cluster."""
    manifest = pod(settings, request_)
    assert kubernetes_validate.validate(manifest, version, strict=True) == version.rsplit(".", 1)[0]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("exposure", ["NodePort", "LoadBalancer"])
def test_the_service_manifest_is_a_valid_service(exposure: str, version: str) -> None:
    settings = dataclasses.replace(SETTINGS, exposure=exposure)
    created = dict(pod(settings), metadata=dict(pod(settings)["metadata"], uid="5f0c-11"))
    access = parse_access({"open": True, "allowed_sources": ["198.51.100.0/24"]})
    service = build_service(settings, dataclasses.replace(REQUEST, access=access), created)
    assert kubernetes_validate.validate(service, version, strict=True) == version.rsplit(".", 1)[0]


def test_the_manifest_runs_squid_on_the_port_with_probe_and_requests() -> None:
    manifest = pod(dataclasses.replace(SETTINGS, cpu_request="250m", memory_request="64Mi"),
                   dataclasses.replace(REQUEST, port=8080))
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert container["image"] == SETTINGS.image
    assert container["command"] == ["squid", "-N", "-f", "/etc/egress-proxy/squid.conf"]
    assert container["ports"] == [{"name": "proxy", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "proxy"}
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "64Mi"}}
    assert spec["automountServiceAccountToken"] is False
    # The restricted Pod Security Standard: non-root, no escalation, no capabilities, seccomp.
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 13, "runAsGroup": 13,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                            "capabilities": {"drop": ["ALL"]}}
    # squid.conf reaches the container from the Pod's own annotation: one object, one call.
    assert container["volumeMounts"] == [{"name": "squid-conf", "mountPath": "/etc/egress-proxy", "readOnly": True}]
    (volume,) = spec["volumes"]
    assert volume["downwardAPI"]["items"] == [{
        "path": "squid.conf", "fieldRef": {"fieldPath": "metadata.annotations['crawl.example.com/squid-conf']"}}]
    assert manifest["metadata"]["annotations"][SQUID_CONF_ANNOTATION] == "http_port 8080\n" + DEFAULT_SQUID_CONFIG


def test_spreading_and_host_network() -> None:
    spread = pod()["spec"]
    assert "hostNetwork" not in spread
    assert spread["topologySpreadConstraints"] == [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "egress-proxies",
                                          "crawl.example.com/owner": "prod-cluster-1"}}}]
    host = pod(dataclasses.replace(SETTINGS, exposure="hostNetwork", spread_nodes=False))["spec"]
    assert (host["hostNetwork"], host["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert host["containers"][0]["ports"][0]["hostPort"] == 3128
    assert "topologySpreadConstraints" not in host
    port = pod(dataclasses.replace(SETTINGS, exposure="hostPort"))["spec"]
    assert "hostNetwork" not in port and port["containers"][0]["ports"][0]["hostPort"] == 3128


def test_a_port_below_1024_is_refused_naming_port() -> None:
    # squid runs unprivileged (restricted): it cannot bind a privileged port.
    with pytest.raises(Permanent, match=r"^port: 80 is below 1024"):
        pod(request=dataclasses.replace(REQUEST, port=80))


def test_squid_conf_puts_the_port_first_and_keeps_the_configured_text() -> None:
    configured = dataclasses.replace(SETTINGS, squid_config="http_access allow all")
    assert squid_conf(configured, 3129) == "http_port 3129\nhttp_access allow all\n"
    assert squid_conf(SETTINGS, 3128).startswith("http_port 3128\nacl localnet src 10.0.0.0/8 ")
    assert "http_access deny all" in DEFAULT_SQUID_CONFIG  # the default is never an open proxy


def test_tags_are_labels_where_they_can_be_and_all_of_them_in_the_annotation() -> None:
    metadata = pod()["metadata"]
    assert metadata["labels"] == {
        "app.kubernetes.io/name": "egress-proxy", "app.kubernetes.io/managed-by": "egress-proxies",
        "app.kubernetes.io/instance": "crawlers-eu-1-3f9c2a",
        "crawl.example.com/owner": "prod-cluster-1", "crawl.example.com/uid": TAGS["crawl.example.com/uid"],
        "crawl.example.com/spec-hash": "3f9c2a"}
    assert json.loads(metadata["annotations"][TAGS_ANNOTATION]) == TAGS
    assert pod_tags(pod()) == TAGS  # reversible: exactly the tags that went in


@pytest.mark.parametrize(
    ("key", "valid"),
    [("crawl.example.com/owner", True), ("owner", True), ("a.b/C_d-e.f", True), ("Crawl.example.com/x", False),
     ("/x", False), ("a/b/c", False), ("x" * 63, True), ("x" * 64, False), ("-x", False), ("", False),
     ("%s/x" % ("a" * 254), False)],
)
def test_label_keys(key: str, valid: bool) -> None:
    assert is_label_key(key) is valid


@pytest.mark.parametrize(
    ("value", "valid"),
    [("prod-cluster-1", True), ("", True), ("A.b_c", True), ("crawlers/eu-1", False), ("x" * 63, True),
     ("x" * 64, False), ("-x", False), ("x-", False), ("a b", False)],
)
def test_label_values(value: str, valid: bool) -> None:
    assert is_label_value(value) is valid


def test_tag_labels_leave_out_what_is_not_a_label() -> None:
    assert tag_labels({"crawl.example.com/proxy": "ns/name", "bad key!": "x", "ok": "yes"}) == {"ok": "yes"}


def test_a_tag_on_a_label_the_provider_sets_is_rejected_naming_tags() -> None:
    with pytest.raises(Permanent, match=r"^tags\.app\.kubernetes\.io/managed-by: "):
        pod(request=dataclasses.replace(REQUEST, tags={"app.kubernetes.io/managed-by": "me"}))


def test_the_selector_asks_for_our_pods_and_the_label_safe_tags() -> None:
    assert label_selector(TAGS) == (
        "app.kubernetes.io/managed-by=egress-proxies,app.kubernetes.io/name=egress-proxy,"
        "crawl.example.com/owner=prod-cluster-1,crawl.example.com/spec-hash=3f9c2a,"
        "crawl.example.com/uid=8d4f1c2e-0000-4000-8000-000000000001")
    assert label_selector({}) == "app.kubernetes.io/managed-by=egress-proxies,app.kubernetes.io/name=egress-proxy"


@pytest.mark.parametrize(
    ("annotation", "tags"),
    [(None, {}), ("not json", {}), ("[1, 2]", {}), ('{"a": "b", "n": 1}', {"a": "b"})],
    ids=["missing", "not-json", "not-an-object", "non-string-dropped"],
)
def test_a_broken_tags_annotation_reads_as_no_tags(annotation: str | None, tags: dict[str, str]) -> None:
    manifest = pod()
    if annotation is None:
        del manifest["metadata"]["annotations"][TAGS_ANNOTATION]
    else:
        manifest["metadata"]["annotations"][TAGS_ANNOTATION] = annotation
    assert pod_tags(manifest) == tags


def test_ours_means_our_label_and_the_same_owner() -> None:
    manifest = pod()
    assert is_managed(manifest) and is_ours(manifest, TAGS)
    assert not is_ours(manifest, {"crawl.example.com/owner": "other-cluster"})
    assert not is_ours(manifest, {})  # an ownerless request never adopts an owned Pod
    manifest["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    assert not is_managed(manifest) and not is_ours(manifest, TAGS)


def with_status(status: dict[str, Any], deleting: bool = False, exposure: str = "none") -> dict[str, Any]:
    manifest = pod(dataclasses.replace(SETTINGS, exposure=exposure))
    manifest["status"] = status
    if deleting:
        manifest["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    return manifest


def ready(value: str, containers: str | None = None) -> list[dict[str, str]]:
    """The Pod's conditions: Ready as given, ContainersReady as given or alike (the kubelet sets both)."""
    return [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": value},
            {"type": "ContainersReady", "status": containers or value}]


def waiting(reason: str) -> list[dict[str, Any]]:
    return [{"name": "squid", "state": {"waiting": {"reason": reason}}}]


@pytest.mark.parametrize(
    ("status", "deleting", "state"),
    [
        ({}, False, "pending"),
        ({"phase": "Pending"}, False, "pending"),
        ({"phase": "Pending", "containerStatuses": waiting("ContainerCreating")}, False, "pending"),
        ({"phase": "Pending", "containerStatuses": waiting("ImagePullBackOff")}, False, "error"),
        ({"phase": "Running", "conditions": ready("True")}, False, "running"),
        ({"phase": "Running", "conditions": ready("False")}, False, "pending"),
        ({"phase": "Running"}, False, "pending"),
        ({"phase": "Running", "conditions": ready("False"), "containerStatuses": waiting("CrashLoopBackOff")},
         False, "error"),
        ({"phase": "Running", "conditions": ready("True")}, True, "stopped"),
        ({"phase": "Succeeded"}, False, "stopped"),
        ({"phase": "Failed"}, False, "error"),
        ({"phase": "Unknown"}, False, "error"),
        # A node that stopped reporting: the node lifecycle controller marks the Pod not Ready and
        # nothing else (its containers still say ready); then the Pod is evicted, terminating.
        ({"phase": "Running", "conditions": ready("False", containers="True")}, False, "error"),
        ({"phase": "Running", "conditions": ready("False", containers="True")}, True, "stopped"),
    ],
    ids=["no-status", "pending", "creating", "image-pull", "ready", "not-ready", "no-conditions", "crashloop",
         "terminating", "succeeded", "failed", "unknown", "node-lost", "node-lost-evicted"],
)
def test_state_from_phase_readiness_and_waiting_reasons(status: dict[str, Any], deleting: bool, state: str) -> None:
    assert pod_state(with_status(status, deleting)) == state


def test_the_ip_is_the_pods_or_with_host_network_the_nodes() -> None:
    addresses = {"phase": "Running", "podIP": "10.244.1.7", "hostIP": "192.0.2.21"}
    assert pod_ip(with_status(addresses)) == "10.244.1.7"
    assert pod_ip(with_status(addresses, exposure="hostNetwork")) == "192.0.2.21"
    assert pod_ip(with_status({"phase": "Pending"})) is None
    assert pod_ip(with_status({"phase": "Pending", "podIP": ""})) is None


def test_an_instance_from_a_stored_pod() -> None:
    stored = with_status({"phase": "Running", "podIP": "10.244.1.7", "conditions": ready("True")})
    stored["metadata"]["creationTimestamp"] = "2026-01-02T03:04:05Z"
    assert pod_instance(stored).to_dict() == {
        "provider_id": "k8s://namespaces/egress/pods/crawlers-eu-1-3f9c2a", "name": "crawlers-eu-1-3f9c2a",
        "location": "egress", "state": "running", "ip": "10.244.1.7", "endpoint": "10.244.1.7:3128", "tags": TAGS,
        "created": "2026-01-02T03:04:05Z"}


RUNNING = {"phase": "Running", "podIP": "10.244.1.7", "hostIP": "192.0.2.21", "conditions": ready("True")}


def node_port_service(node_port: int = 31234) -> dict[str, Any]:
    return {"spec": {"type": "NodePort", "ports": [{"port": 3128, "nodePort": node_port}]}}


def load_balancer(ingress: list[dict[str, str]]) -> dict[str, Any]:
    return {"spec": {"type": "LoadBalancer", "ports": [{"port": 3128, "nodePort": 31234}]},
            "status": {"loadBalancer": {"ingress": ingress}}}


@pytest.mark.parametrize(
    ("exposure", "service", "state", "endpoint"),
    [("none", None, "running", "10.244.1.7:3128"),
     ("hostPort", None, "running", "192.0.2.21:3128"),
     ("hostNetwork", None, "running", "192.0.2.21:3128"),
     ("NodePort", node_port_service(), "running", "192.0.2.21:31234"),
     ("LoadBalancer", load_balancer([{"ip": "198.51.100.20"}]), "running", "198.51.100.20:3128"),
     ("LoadBalancer", load_balancer([{"hostname": "lb.example.net"}]), "running", "lb.example.net:3128"),
     ("LoadBalancer", load_balancer([]), "pending", None),  # the cloud has not given it an address yet
     ("NodePort", None, "error", None)],  # its Service is gone: crawlers cannot reach it
    ids=["pod-ip", "host-port", "host-network", "node-port", "lb-ip", "lb-hostname", "lb-waiting", "no-service"],
)
def test_the_endpoint_is_what_a_crawler_dials_for_each_exposure(exposure: str, service: dict[str, Any] | None,
                                                                 state: str, endpoint: str | None) -> None:
    instance = pod_instance(with_status(RUNNING, exposure=exposure), exposure, service)
    assert (instance.state, instance.endpoint) == (state, endpoint)
    assert instance.ip == ("192.0.2.21" if exposure == "hostNetwork" else "10.244.1.7")  # its own address


@pytest.mark.parametrize(
    ("exposure", "service", "node", "note"),
    [("none", None, None, None),
     ("NodePort", node_port_service(), None,
      ("NodePort on the node's InternalIP 192.0.2.21 (the node has no ExternalIP): reachable from the cluster's "
      "network only")),
     ("NodePort", node_port_service(), {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.21"},
                                                                 {"type": "ExternalIP", "address": "198.51.100.11"}]}},
      "NodePort on the node's ExternalIP 198.51.100.11, no firewall in front: the outside path is not verified"),
     ("LoadBalancer", dict(load_balancer([{"ip": "198.51.100.20"}]), spec={"loadBalancerSourceRanges": [
         "203.0.113.0/24", "198.51.100.7/32"]}), None,
      ("LoadBalancer admitting 203.0.113.0/24, 198.51.100.7/32 only, none inside the private networks: a passing "
      "probe came from outside the cluster, the crawlers' way (outside path verified)")),
     ("LoadBalancer", dict(load_balancer([{"ip": "198.51.100.20"}]), spec={"loadBalancerSourceRanges": [
         "203.0.113.0/24", "10.0.0.0/8"]}), None,
      ("LoadBalancer that admits private sources (10.0.0.0/8): a probe from inside the cluster passes without "
      "crossing the load balancer, so the outside path is not verified; to verify it, probe from outside")),
     ("LoadBalancer", load_balancer([{"ip": "198.51.100.20"}]), None,
      "LoadBalancer that admits every source (no source ranges)")],
    ids=["pod-ip", "node-port-internal", "node-port-external", "lb-public-ranges", "lb-private-range", "lb-open"])
def test_the_instance_says_how_crawlers_outside_reach_it_and_whether_a_probe_proves_it(
        exposure: str, service: dict[str, Any] | None, node: dict[str, Any] | None, note: str | None) -> None:
    found = pod_instance(with_status(RUNNING, exposure=exposure), exposure, service, node).exposure
    assert found == note if note is None else (found or "").startswith(note)


def test_the_service_selects_its_pod_and_keeps_the_client_address() -> None:
    settings = dataclasses.replace(SETTINGS, exposure="LoadBalancer")
    created = pod(settings)
    created["metadata"]["uid"] = "5f0c-11"
    # fc00::/7 cannot be a range of an IPv4 load balancer: the cloud would refuse the whole list.
    access = parse_access({"open": True, "allowed_sources": ["198.51.100.0/24", "fc00::/7"]})
    service = build_service(settings, dataclasses.replace(REQUEST, access=access), created)
    assert service["metadata"]["name"] == created["metadata"]["name"]
    assert service["metadata"]["labels"] == created["metadata"]["labels"]  # listed and cleaned up alike
    assert service["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod",
                                                       "name": "crawlers-eu-1-3f9c2a", "uid": "5f0c-11"}]
    assert service["spec"] == {
        "type": "LoadBalancer", "externalTrafficPolicy": "Local", "loadBalancerSourceRanges": ["198.51.100.0/24"],
        "ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"],
        # No node ports: nodeIP:nodePort would bypass loadBalancerSourceRanges (issue 38 row 9).
        "allocateLoadBalancerNodePorts": False,
        "selector": {"app.kubernetes.io/managed-by": "egress-proxies",
                     "app.kubernetes.io/instance": "crawlers-eu-1-3f9c2a"},
        "ports": [{"name": "proxy", "port": 3128, "targetPort": "proxy", "protocol": "TCP"}]}


@pytest.mark.parametrize(
    ("families", "sources", "ranges"),
    [(("IPv4",), ["198.51.100.0/24", "2001:db8::/32"], ["198.51.100.0/24"]),
     (("IPv6",), ["198.51.100.0/24", "2001:db8::/32"], ["2001:db8::/32"]),
     (("IPv4", "IPv6"), ["198.51.100.0/24", "2001:db8::/32"], ["198.51.100.0/24", "2001:db8::/32"]),
     (("IPv4",), ["2001:db8::/32"], None)])
def test_source_ranges_are_split_by_the_services_ip_families(families: tuple[str, ...], sources: list[str],
                                                             ranges: list[str] | None) -> None:
    settings = dataclasses.replace(SETTINGS, exposure="LoadBalancer", ip_families=families)
    created = dict(pod(settings), metadata=dict(pod(settings)["metadata"], uid="5f0c-11"))
    request = dataclasses.replace(REQUEST, access=parse_access({"open": True, "allowed_sources": sources}))
    if ranges is None:  # an empty list would open the load balancer to everyone
        with pytest.raises(Permanent, match=r"access.allowed_sources: none of 2001:db8::/32 is IPv4.*ipFamilies"):
            build_service(settings, request, created)
        return
    spec = build_service(settings, request, created)["spec"]
    assert (spec["loadBalancerSourceRanges"], spec["ipFamilies"]) == (ranges, list(families))
    assert spec["ipFamilyPolicy"] == ("RequireDualStack" if len(families) > 1 else "SingleStack")


# -- with the access option --------------------------------------------------------------------------


def test_without_access_the_pod_is_as_before() -> None:
    manifest = pod()
    assert PASSWD_ANNOTATION not in manifest["metadata"]["annotations"]
    assert manifest["metadata"]["annotations"][SQUID_CONF_ANNOTATION] == "http_port 3128\n" + DEFAULT_SQUID_CONFIG
    assert [v["name"] for v in manifest["spec"]["volumes"]] == ["squid-conf"]
    assert "env" not in manifest["spec"]["containers"][0]


def test_the_policy_is_around_the_squid_config_and_the_hashes_are_projected() -> None:
    manifest = pod(request=WITH_ACCESS)
    assert ACCESS is not None
    annotations = manifest["metadata"]["annotations"]
    assert annotations[SQUID_CONF_ANNOTATION] == "http_port 3128\n" + render_policy(ACCESS, POD_PATHS).around(
        DEFAULT_SQUID_CONFIG)
    assert annotations[PASSWD_ANNOTATION] == f"crawlers:{BCRYPT}\n"
    conf, run = manifest["spec"]["volumes"]
    assert conf["downwardAPI"]["items"][1] == {
        "path": "passwd", "mode": 0o444, "fieldRef": {"fieldPath": f"metadata.annotations['{PASSWD_ANNOTATION}']"}}
    assert run == {"name": "egress-proxy-run", "emptyDir": {"sizeLimit": "1Mi"}}


def test_the_container_writes_its_own_addresses_from_the_downward_api_then_runs_squid() -> None:
    (container,) = pod(request=WITH_ACCESS)["spec"]["containers"]
    assert container["command"] == container_command("/run/egress-proxy", ["POD_IPS", "NODE_IP"],
                                                     ["squid", "-N", "-f", "/etc/egress-proxy/squid.conf"])
    assert container["env"] == [
        {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    assert container["volumeMounts"][1] == {"name": "egress-proxy-run", "mountPath": "/run/egress-proxy"}


def test_an_open_policy_projects_no_password_file() -> None:
    open_access = parse_access({"open": True, "allowed_sources": ["10.0.0.0/8"]})
    manifest = pod(request=dataclasses.replace(REQUEST, access=open_access))
    assert PASSWD_ANNOTATION not in manifest["metadata"]["annotations"]


def test_a_squid_config_allowing_all_is_refused_only_with_access() -> None:
    settings = dataclasses.replace(SETTINGS, squid_config="http_access allow all\n")
    assert squid_conf(settings, 3128).endswith("http_access allow all\n")  # no access: as before
    with pytest.raises(Permanent, match=r"^squidConfig \(the Kubernetes provider's config\): contains"):
        pod(settings, WITH_ACCESS)
