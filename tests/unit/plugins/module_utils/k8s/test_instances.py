"""The Kubernetes provider's decisions, in-process, with the real client against the emulator.

The module runs in tests/integration/test_k8s_modules.py cost two seconds each; here every
API error and every bad input of the tables costs milliseconds, through the same code below
the module wrapper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NOT_FOUND,
    PERMANENT,
    TRANSIENT,
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s import client as kube_client
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.client import KubeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.instances import K8sProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    TAGS_ANNOTATION,
    TERMINATION_GRACE_SECONDS,
    build_pod,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access
from support.collection.provider_config import write_kubeconfig
from support.kube.emulator import KubeEmulator

OWNER = {"crawl.example.com/owner": "prod-cluster-1"}
TAGS = {**OWNER, "crawl.example.com/proxy": "crawlers/eu-1"}
REQUEST = InstanceRequest(name="eu-1", user_data=b"", tags=TAGS)
PROVIDER_ID = "k8s://namespaces/egress/pods/eu-1"


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """The cluster: the provider's two namespaces exist (the API refuses Pods in a missing one)."""
    with KubeEmulator(namespaces=["egress", "crawl-b"]) as emulator:
        yield emulator


@pytest.fixture
def provider(tmp_path: Path, kube: KubeEmulator) -> Iterator[K8sProvider]:
    settings = KubernetesSettings(namespace="egress", image="squid", namespaces=("crawl-b",),
                                  kubeconfig=str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)))
    provider = K8sProvider(settings, KubeClient(settings))
    yield provider
    provider.close()


def methods(kube: KubeEmulator) -> list[str]:
    return [method for method, _ in kube.requests()]


def put_pod(kube_provider: K8sProvider, name: str, labels: dict[str, str], annotations: dict[str, str],
            namespace: str = "egress") -> dict[str, Any]:
    """A Pod made behind the provider's back, through the same API."""
    manifest = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    return kube_provider.client.create_pod(namespace, manifest)


# -- create ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"user_data": b"#cloud-config\n"}, "user_data"),
        ({"machine_type": "small"}, "machine_type"),
        ({"image": "debian-12"}, "image"),
        ({"location": "kube-system"}, "location"),
        ({"tags": {**TAGS, "app.kubernetes.io/name": "x"}}, "tags.app.kubernetes.io/name"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_a_pod_cannot_honour_is_permanent_naming_the_field(provider: K8sProvider, kube: KubeEmulator,
                                                                change: dict[str, Any], field: str) -> None:
    with pytest.raises(Permanent) as caught:
        provider.create(dataclasses.replace(REQUEST, **change), check_mode=False)
    assert str(caught.value).startswith(f"{field}: ")
    assert kube.requests() == []  # refused before any API call


def test_create_is_idempotent_by_name_and_check_mode_writes_nothing(provider: K8sProvider,
                                                                     kube: KubeEmulator) -> None:
    assert provider.create(REQUEST, check_mode=True)[0] is True
    assert methods(kube) == ["GET"]
    changed, instance = provider.create(dataclasses.replace(REQUEST, location="crawl-b"), check_mode=False)
    assert changed is True and instance.provider_id == "k8s://namespaces/crawl-b/pods/eu-1"
    again = provider.create(dataclasses.replace(REQUEST, location="crawl-b"), check_mode=False)
    assert again == (False, instance)
    assert provider.create(dataclasses.replace(REQUEST, location="crawl-b"), check_mode=True) == (False, instance)


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_pod_of_that_name_that_is_not_ours_is_permanent_naming_name(provider: K8sProvider, kube: KubeEmulator,
                                                                       check_mode: bool) -> None:
    put_pod(provider, "eu-1", {"app.kubernetes.io/managed-by": "egress-proxies",
                               "crawl.example.com/owner": "other-cluster"}, {})
    with pytest.raises(Permanent, match=r"^name: a pod egress/eu-1 already exists"):
        provider.create(REQUEST, check_mode=check_mode)
    assert methods(kube).count("DELETE") == 0


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(401, PERMANENT), (403, PERMANENT), (422, PERMANENT), (429, TRANSIENT), (500, TRANSIENT), (503, TRANSIENT)],
)
def test_create_errors(provider: K8sProvider, kube: KubeEmulator, status: int, error_class: str) -> None:
    kube.fail_next("POST", r"/pods$", status, count=5)
    with pytest.raises(ProxyError) as caught:
        provider.create(REQUEST, check_mode=False)
    assert caught.value.error_class == error_class
    assert methods(kube) == ["POST"]  # one request: nothing retried inside the call


def test_create_in_a_namespace_that_does_not_exist_is_permanent_naming_location(tmp_path: Path,
                                                                                kube: KubeEmulator) -> None:
    # The emulator answers as NamespaceLifecycle admission does: 404 'namespaces "gone" not found'.
    settings = KubernetesSettings(namespace="gone", image="squid",
                                  kubeconfig=str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)))
    missing = K8sProvider(settings, KubeClient(settings))
    try:
        with pytest.raises(Permanent, match=r'^location: namespace gone does not exist.*namespaces "gone" not found'):
            missing.create(REQUEST, check_mode=False)
        # The real server lists a namespace that does not exist as empty.
        assert (missing.list(dict(OWNER)).instances, missing.list(dict(OWNER)).failed_locations) == ([], {})
    finally:
        missing.close()


def test_a_409_whose_pod_vanished_before_the_read_is_transient(provider: K8sProvider, kube: KubeEmulator) -> None:
    kube.fail_next("POST", r"/pods$", 409, reason="AlreadyExists")
    with pytest.raises(Transient, match="was being replaced"):
        provider.create(REQUEST, check_mode=False)
    assert methods(kube) == ["POST", "GET"]


# -- get / delete ----------------------------------------------------------------------------


def test_get_of_a_missing_pod_or_namespace_is_not_found(provider: K8sProvider) -> None:
    for provider_id in (PROVIDER_ID, "k8s://namespaces/deleted-namespace/pods/eu-1"):
        with pytest.raises(NotFound):
            provider.get(provider_id)


@pytest.mark.parametrize(("status", "error_class"), [(403, PERMANENT), (500, TRANSIENT), (404, NOT_FOUND)])
def test_get_errors(provider: K8sProvider, kube: KubeEmulator, status: int, error_class: str) -> None:
    provider.create(REQUEST, check_mode=False)
    kube.fail_next("GET", r"/pods/eu-1$", status)
    with pytest.raises(ProxyError) as caught:
        provider.get(PROVIDER_ID)
    assert caught.value.error_class == error_class


def test_a_foreign_pod_is_never_read_as_ours_nor_deleted(provider: K8sProvider, kube: KubeEmulator) -> None:
    put_pod(provider, "eu-1", {"app": "web"}, {})
    with pytest.raises(Permanent, match=r"^provider_id: pod egress/eu-1 exists but is not an egress-proxies"):
        provider.get(PROVIDER_ID)
    with pytest.raises(Permanent):
        provider.delete(PROVIDER_ID, check_mode=False)
    assert "DELETE" not in methods(kube)


def test_delete_is_idempotent_and_check_mode_deletes_nothing(provider: K8sProvider, kube: KubeEmulator) -> None:
    provider.create(REQUEST, check_mode=False)
    assert provider.delete(PROVIDER_ID, check_mode=True) is True
    assert kube.get_object("pods", "egress", "eu-1") is not None
    assert provider.delete(PROVIDER_ID, check_mode=False) is True
    assert kube.get_object("pods", "egress", "eu-1") is None
    assert provider.delete(PROVIDER_ID, check_mode=False) is False
    assert provider.delete("k8s://namespaces/deleted-namespace/pods/eu-1", check_mode=False) is False


def test_delete_of_a_terminating_pod_changes_nothing(provider: K8sProvider, kube: KubeEmulator) -> None:
    manifest = build_pod(provider.settings, REQUEST, "egress")
    manifest["metadata"]["finalizers"] = ["example.com/hold"]  # keeps it terminating in the emulator
    provider.client.create_pod("egress", manifest)
    assert provider.delete(PROVIDER_ID, check_mode=False) is True
    assert provider.get(PROVIDER_ID).state == "stopped"
    assert provider.delete(PROVIDER_ID, check_mode=False) is False
    assert methods(kube).count("DELETE") == 1


def test_a_running_pod_is_deleted_gracefully_and_reads_stopped_until_gone(provider: K8sProvider,
                                                                         kube: KubeEmulator) -> None:
    """A scheduled Pod is not gone when DELETE answers: it keeps its deletionTimestamp for the
    grace period (ours: TERMINATION_GRACE_SECONDS) and is still read and listed, as ``stopped``;
    deleting it again changes nothing, creating it again waits (transient) until it is gone."""
    provider.create(REQUEST, check_mode=False)
    kube.kubelet_run("egress", "eu-1", pod_ip="10.244.0.7")
    assert (provider.get(PROVIDER_ID).state, provider.get(PROVIDER_ID).ip) == ("running", "10.244.0.7")

    assert provider.delete(PROVIDER_ID, check_mode=False) is True
    pod = kube.get_object("pods", "egress", "eu-1")
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == TERMINATION_GRACE_SECONDS
    assert provider.get(PROVIDER_ID).state == "stopped"
    assert [(i.name, i.state) for i in provider.list(dict(OWNER)).instances] == [("eu-1", "stopped")]
    assert provider.delete(PROVIDER_ID, check_mode=False) is False
    with pytest.raises(Transient, match="still terminating"):
        provider.create(REQUEST, check_mode=False)

    kube.advance(TERMINATION_GRACE_SECONDS)
    with pytest.raises(NotFound):
        provider.get(PROVIDER_ID)
    assert provider.list(dict(OWNER)).instances == []
    assert provider.create(REQUEST, check_mode=False)[0] is True
    assert methods(kube).count("DELETE") == 1


def test_an_evicted_pod_reads_as_error_and_is_deleted_at_once(provider: K8sProvider, kube: KubeEmulator) -> None:
    """The kubelet evicts a Pod: phase Failed, its dead IP still in status. The contract's state
    is ``error`` (so the controller replaces it), and a Failed Pod has nothing left to stop, so
    the API server deletes it without a grace period."""
    provider.create(REQUEST, check_mode=False)
    kube.kubelet_run("egress", "eu-1", pod_ip="10.244.0.7")

    kube.kubelet_evict("egress", "eu-1")

    instance = provider.get(PROVIDER_ID)
    assert (instance.state, instance.ip) == ("error", "10.244.0.7")
    assert [(i.name, i.state) for i in provider.list(dict(OWNER)).instances] == [("eu-1", "error")]
    assert provider.delete(PROVIDER_ID, check_mode=False) is True
    assert kube.get_object("pods", "egress", "eu-1") is None


def test_delete_errors_are_classified(provider: K8sProvider, kube: KubeEmulator) -> None:
    provider.create(REQUEST, check_mode=False)
    kube.fail_next("DELETE", r"/pods/eu-1$", 403)
    with pytest.raises(Permanent):
        provider.delete(PROVIDER_ID, check_mode=False)
    kube.fail_next("DELETE", r"/pods/eu-1$", 500)
    with pytest.raises(Transient):
        provider.delete(PROVIDER_ID, check_mode=False)
    kube.fail_next("DELETE", r"/pods/eu-1$", 404)  # gone between our read and our delete
    assert provider.delete(PROVIDER_ID, check_mode=False) is False


# -- list ------------------------------------------------------------------------------------


def test_list_selects_by_label_and_decides_by_the_tags_annotation(provider: K8sProvider, kube: KubeEmulator) -> None:
    provider.create(REQUEST, check_mode=False)
    provider.create(InstanceRequest(name="eu-2", user_data=b"", location="crawl-b",
                                    tags={**OWNER, "crawl.example.com/proxy": "crawlers/eu-2"}), check_mode=False)
    provider.create(InstanceRequest(name="other", user_data=b"", tags={"crawl.example.com/owner": "other"}),
                    check_mode=False)
    # Ours by label, but its tags annotation is broken: no tag filter can match it.
    put_pod(provider, "broken", {"app.kubernetes.io/managed-by": "egress-proxies",
                                 "app.kubernetes.io/name": "egress-proxy", **OWNER}, {TAGS_ANNOTATION: "{"})
    # Carries our owner label but not our managed-by label: never listed.
    put_pod(provider, "foreign", dict(OWNER), {TAGS_ANNOTATION: '{"crawl.example.com/owner": "prod-cluster-1"}'})

    owned = provider.list(dict(OWNER))
    assert sorted(i.provider_id for i in owned.instances) == [
        "k8s://namespaces/crawl-b/pods/eu-2", PROVIDER_ID]
    assert owned.failed_locations == {}
    # "crawlers/eu-1" is no label value: the selector cannot carry it, the annotation decides.
    one = provider.list({"crawl.example.com/proxy": "crawlers/eu-1"})
    assert [i.name for i in one.instances] == ["eu-1"]
    lists = [path for method, path in kube.requests() if method == "GET" and "labelSelector=" in path]
    assert len(lists) == 4  # one per configured namespace per listing, never all namespaces
    assert all(path.startswith(("/api/v1/namespaces/egress/pods?", "/api/v1/namespaces/crawl-b/pods?"))
               for path in lists)


def make_pods(provider: K8sProvider, count: int, first: int = 0) -> list[str]:
    names = [f"eu-{index:02d}" for index in range(first, first + count)]
    for name in names:
        provider.create(InstanceRequest(name=name, user_data=b"", tags={**OWNER, "crawl.example.com/proxy": name}),
                        check_mode=False)
    return names


def list_requests(kube: KubeEmulator, namespace: str = "egress") -> list[str]:
    return [path for method, path in kube.requests() if method == "GET" and path.startswith(
        f"/api/v1/namespaces/{namespace}/pods?")]


def test_a_listing_reads_pods_in_pages(provider: K8sProvider, kube: KubeEmulator,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "LIST_PAGE_SIZE", 2)
    names = make_pods(provider, 5)
    listed = provider.list(dict(OWNER))
    assert sorted(i.name for i in listed.instances) == names and listed.failed_locations == {}
    pages = list_requests(kube)
    assert len(pages) == 3 and all("limit=2" in path for path in pages)
    assert ["continue=" in path for path in pages] == [False, True, True]


def test_a_continue_token_that_expired_between_pages_starts_the_list_again(
        provider: K8sProvider, kube: KubeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's 410 Expired for a token whose snapshot is gone (tests/contract/
    test_kube_emulator.py): the pages read so far belong to that snapshot, so the list is read
    again from its first page instead of being continued from another one."""
    monkeypatch.setattr(kube_client, "LIST_PAGE_SIZE", 2)
    names = make_pods(provider, 5)
    real_list = provider.client.core.list_namespaced_pod
    compacted: list[bool] = []

    def compact_after_the_first_page(*args: Any, **kwargs: Any) -> Any:
        answer = real_list(*args, **kwargs)
        if not compacted:
            compacted.append(True)
            make_pods(provider, 1, first=5)  # a write after the first page
            kube.compact()
        return answer
    monkeypatch.setattr(provider.client.core, "list_namespaced_pod", compact_after_the_first_page)

    listed = provider.list(dict(OWNER))
    assert sorted(i.name for i in listed.instances) == [*names, "eu-05"]
    pages = list_requests(kube)
    # The first page, the 410 for its token, then the whole list again (three pages of six).
    assert ["continue=" in path for path in pages] == [False, True, False, True, True]


def test_a_list_that_expires_every_time_fails_transient(provider: K8sProvider, kube: KubeEmulator,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "LIST_PAGE_SIZE", 2)
    make_pods(provider, 3)
    kube.fail_next("GET", r"/namespaces/egress/pods\?.*continue=", 410, count=kube_client.LIST_ATTEMPTS,
                   reason="Expired", message="The provided continue parameter is too old")
    listed = provider.list(dict(OWNER))
    assert list(listed.failed_locations) == ["egress"]
    failure = listed.failed_locations["egress"]
    assert failure.error_class == TRANSIENT and "expired before its last page, 3 times" in str(failure)
    assert len(list_requests(kube)) == 2 * kube_client.LIST_ATTEMPTS


@pytest.mark.parametrize(
    ("faults", "error_class"),
    [({"egress": 500}, TRANSIENT), ({"egress": 403, "crawl-b": 403}, PERMANENT),
     ({"egress": 403, "crawl-b": 503}, TRANSIENT)],
    ids=["one-transient", "all-permanent", "mixed"],
)
def test_a_namespace_that_cannot_be_listed_fails_the_listing(provider: K8sProvider, kube: KubeEmulator,
                                                             faults: dict[str, int], error_class: str) -> None:
    provider.create(REQUEST, check_mode=False)
    provider.create(dataclasses.replace(REQUEST, name="eu-2", location="crawl-b"), check_mode=False)
    for namespace, status in faults.items():
        kube.fail_next("GET", rf"/namespaces/{namespace}/pods\?", status)
    listed = provider.list(dict(OWNER))
    assert set(listed.failed_locations) == set(faults)
    assert len(listed.instances) == 2 - len(faults)
    with pytest.raises(ProxyError) as caught:
        listed.to_result("namespace(s)")
    assert caught.value.error_class == error_class
    assert set(caught.value.details["failed_locations"]) == set(faults)


def test_a_namespace_that_does_not_exist_lists_as_empty(provider: K8sProvider, kube: KubeEmulator) -> None:
    kube.fail_next("GET", r"/namespaces/crawl-b/pods\?", 404)
    listed = provider.list(dict(OWNER))
    assert (listed.instances, listed.failed_locations) == ([], {})


# -- issue 29: restricted namespaces, exposure, quotas, lost nodes --------------------------------


def provider_in(tmp_path: Path, kube: KubeEmulator, **settings: Any) -> K8sProvider:
    made = KubernetesSettings(namespace="egress", image="squid",
                              kubeconfig=str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)), **settings)
    return K8sProvider(made, KubeClient(made))


def test_the_pod_is_admitted_where_the_namespace_enforces_the_restricted_standard(tmp_path: Path) -> None:
    # Pod Security admission refuses a Pod without securityContext in a restricted namespace
    # with 403 (permanent): every proxy Pod. Ours passes; hostNetwork/hostPort need privileged.
    with KubeEmulator() as kube:
        for namespace, level in (("egress", "restricted"), ("edge", "baseline")):
            kube.create_namespace(namespace, {"pod-security.kubernetes.io/enforce": level})
        changed, created = provider_in(tmp_path, kube).create(REQUEST, check_mode=False)
        assert changed and created.state == "pending"
        host = provider_in(tmp_path, kube, exposure="hostPort", namespaces=("edge",))
        with pytest.raises(Permanent, match=r'violates PodSecurity "baseline:latest": hostPort'):
            host.create(dataclasses.replace(REQUEST, name="eu-2", location="edge"), check_mode=False)


def test_a_full_resource_quota_is_transient_and_names_the_quota(provider: K8sProvider) -> None:
    # ResourceQuota admission: 403 "exceeded quota: ...": quota frees up as Pods go, unlike the
    # other 403s (RBAC, Pod Security), so it is retried with backoff, and the quota is named.
    provider.client.core.create_namespaced_resource_quota("egress", client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="proxies"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})))
    provider.create(REQUEST, check_mode=False)
    with pytest.raises(Transient) as caught:
        provider.create(dataclasses.replace(REQUEST, name="eu-2"), check_mode=False)
    message = str(caught.value)
    assert "exceeded quota: proxies, requested: pods=1, used: pods=1, limited: pods=1" in message
    assert "ResourceQuota proxies is used up" in message


def test_a_quota_not_counted_yet_is_transient_and_the_create_passes_once_it_is(provider: K8sProvider,
                                                                               kube: KubeEmulator) -> None:
    # Issue 39 row 7: 403 "status unknown for quota" (the quota controller has not synced a new
    # ResourceQuota yet) was permanent: the Proxy went Failed. It heals by itself at the sync.
    provider.client.core.create_namespaced_resource_quota("egress", client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="proxies"), spec=client.V1ResourceQuotaSpec(hard={"pods": "5"})))
    kube.quota_unsynced("egress", "proxies")
    with pytest.raises(Transient) as caught:
        provider.create(REQUEST, check_mode=False)
    message = str(caught.value)
    assert "status unknown for quota: proxies, resources: pods" in message
    assert "has not counted the namespace's ResourceQuota proxies yet" in message
    kube.quota_synced("egress", "proxies")
    changed, created = provider.create(REQUEST, check_mode=False)
    assert changed and created.state == "pending"


def test_a_pod_on_a_node_that_stopped_reporting_is_in_error_then_stopped(provider: K8sProvider,
                                                                        kube: KubeEmulator) -> None:
    # Running + Ready=False from the node lifecycle controller: not serving, replaced like a dead
    # one (not "pending", which the controller would wait on); evicted, it stays terminating.
    kube.freeze_clock()
    provider.create(REQUEST, check_mode=False)
    kube.kubelet_run("egress", "eu-1", node="worker-3")
    assert provider.get(PROVIDER_ID).state == "running"
    kube.node_lost("worker-3")
    assert provider.get(PROVIDER_ID).state == "error"
    kube.advance(300 + 3600)
    assert provider.get(PROVIDER_ID).state == "stopped"
    assert [i.state for i in provider.list(TAGS).instances] == ["stopped"]
    assert provider.delete(PROVIDER_ID, check_mode=False) is False  # already terminating: nothing to do


@pytest.mark.parametrize(("exposure", "external_ip"),
                         [("NodePort", None), ("NodePort", "198.51.100.11"), ("LoadBalancer", "198.51.100.11")])
def test_a_service_exposed_pod_hands_out_the_address_crawlers_dial(tmp_path: Path, kube: KubeEmulator,
                                                                   exposure: str, external_ip: str | None) -> None:
    # Issue 39 row 6: a NodePort is handed out on its node's ExternalIP where the node has one
    # (crawlers outside the cluster route there), else on the InternalIP (the Pod's hostIP).
    # Issue 38 row 9: a LoadBalancer gets no node port (one would bypass its source ranges).
    kube.add_node("worker-1", "192.0.2.21", external_ip=external_ip)
    provider = provider_in(tmp_path, kube, exposure=exposure)
    _, _created = provider.create(REQUEST, check_mode=False)
    service = kube.get_object("services", "egress", "eu-1")
    assert service is not None and service["spec"]["type"] == exposure
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    pod = kube.get_object("pods", "egress", "eu-1")
    assert pod is not None and service["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    node_port = service["spec"]["ports"][0].get("nodePort")
    assert (node_port is None) == (exposure == "LoadBalancer")
    kube.kubelet_run("egress", "eu-1", pod_ip="10.244.1.7", node="worker-1")
    if exposure == "LoadBalancer":
        assert (provider.get(PROVIDER_ID).state, provider.get(PROVIDER_ID).endpoint) == ("pending", None)
        kube.provision_load_balancer("egress", "eu-1", ip="198.51.100.20")
    wanted = f"{external_ip or '192.0.2.21'}:{node_port}" if exposure == "NodePort" else "198.51.100.20:3128"
    got = provider.get(PROVIDER_ID)
    assert (got.state, got.ip, got.endpoint) == ("running", "10.244.1.7", wanted)
    assert [(i.endpoint, i.ip) for i in provider.list(TAGS).instances] == [(wanted, "10.244.1.7")]
    # The same create again finds both; deleting removes both (the Service also when the Pod is gone).
    assert provider.create(REQUEST, check_mode=False)[0] is False
    assert provider.delete(PROVIDER_ID, check_mode=False) is True
    assert kube.get_object("services", "egress", "eu-1") is None


def test_the_pods_squid_refuses_every_address_of_every_node(provider: K8sProvider, kube: KubeEmulator) -> None:
    # Issue 38 row 1: a Pod's squid refused its own IPs and its node's hostIP only; a node's
    # ExternalIP (and the other nodes', where the scheduler may put it) reached the node's services.
    kube.add_node("worker-1", "10.0.0.11", external_ip="198.51.100.11")
    kube.add_node("worker-2", "10.0.0.12", external_ip="198.51.100.12")
    access = parse_access({"open": True, "allowed_sources": ["203.0.113.0/24"]})
    provider.create(dataclasses.replace(REQUEST, access=access), check_mode=False)
    pod = kube.get_object("pods", "egress", "eu-1")
    assert pod is not None
    conf = pod["metadata"]["annotations"]["crawl.example.com/squid-conf"]
    acl = [line for line in conf.splitlines() if line.startswith("acl egress_host dst ")]
    refused = {address for line in acl for address in line.split()[3:]}
    assert {"10.0.0.11/32", "10.0.0.12/32", "198.51.100.11/32", "198.51.100.12/32"} <= refused
    assert "http_access deny egress_host" in conf.splitlines()


def test_the_controllers_probe_sources_are_admitted_beside_the_crawlers(tmp_path: Path, kube: KubeEmulator) -> None:
    # Issue 39 item 1: probe.sources, named once, reach squid's allowlist and the load balancer's
    # ranges, so the controller's own probe takes the crawlers' way and is not refused on it.
    settings = KubernetesSettings(namespace="egress", image="squid", exposure="LoadBalancer",
                                  kubeconfig=str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)))
    provider = K8sProvider(settings, KubeClient(settings), probe_sources=("192.0.2.5/32",))
    access = parse_access({"open": True, "allowed_sources": ["203.0.113.0/24"]})
    provider.create(dataclasses.replace(REQUEST, access=access), check_mode=False)
    service = kube.get_object("services", "egress", "eu-1")
    assert service is not None and service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24", "192.0.2.5/32"]
    pod = kube.get_object("pods", "egress", "eu-1")
    assert pod is not None
    conf = pod["metadata"]["annotations"]["crawl.example.com/squid-conf"]
    assert "# Clients outside 203.0.113.0/24, 192.0.2.5/32." in conf


def test_a_node_port_without_the_grant_to_read_nodes_names_the_fix(tmp_path: Path, kube: KubeEmulator) -> None:
    provider = provider_in(tmp_path, kube, exposure="NodePort")
    provider.create(REQUEST, check_mode=False)
    kube.kubelet_run("egress", "eu-1", node="worker-1")
    kube.fail_next("GET", r"/api/v1/nodes", 403, reason="Forbidden",
                   message='nodes is forbidden: User "system:serviceaccount:egress-proxies:x" cannot list resource')
    with pytest.raises(Permanent, match=r"listing nodes \(the provider reads the nodes' addresses: its service "
                                        r"account needs get and list on nodes.*rbac.yaml"):
        provider.list(TAGS)


def test_a_service_left_behind_is_made_again_and_removed_with_the_pod(tmp_path: Path, kube: KubeEmulator) -> None:
    provider = provider_in(tmp_path, kube, exposure="NodePort")
    provider.create(REQUEST, check_mode=False)
    provider.client.delete_service("egress", "eu-1")  # someone deleted it
    kube.kubelet_run("egress", "eu-1", host_ip="192.0.2.21")
    assert provider.get(PROVIDER_ID).state == "error"  # unreachable: replaced
    _, again = provider.create(REQUEST, check_mode=False)  # the retry of a half-done create makes it again
    assert again.state == "running" and kube.get_object("services", "egress", "eu-1") is not None
    kube.kubelet_evict("egress", "eu-1")
    provider.client.delete_pod("egress", "eu-1", None)  # the Pod went by itself: the Service still goes
    assert provider.delete(PROVIDER_ID, check_mode=False) is False
    assert kube.get_object("services", "egress", "eu-1") is None
