"""Self-healing through the emulators (issue 12, points 2-4): an instance that dies the way the
real platform kills it is replaced make-before-break, once.

- Kubernetes: the kubelet stand-in evicts the proxy Pod (``Failed``/``Evicted``, the Pod object
  kept with its IP, as the real kubelet leaves it).
- GCP: the Compute emulator preempts the instance (``TERMINATED``, its ephemeral IP released).

Both go through the real reconciler, the real ``AnsibleRunner`` and the collection's modules
against the emulators on 127.0.0.1. The emulators' addresses are made up, so both providers say
``probe: none`` (nothing is ever sent to them); a dead instance is lost whether or not anything
probes it. ``unhealthyAfter`` passes when the test says so (``Reconciler._seconds_since``), not
by sleeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import TERMINATION_GRACE_SECONDS
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import GROUP, PLURAL, REPLACEMENTS_ANNOTATION, VERSION
from egress_proxies.serving.monitor import ServingMonitor
from egress_proxies.serving.probe import Prober
from egress_proxies.sources.kube import KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, write_kubeconfig
from support.compute.emulator import ComputeEmulator
from support.kube.emulator import KubeEmulator

NAMESPACE = "crawlers"
POD_NAMESPACE = "egress"
ZONE = "europe-west1-b"
PROJECT = "test-project"
# probe: none carries no settings: the default unhealthyAfter applies to lost instances.
UNHEALTHY_AFTER = 300.0


class Clock:
    """Every condition is ``age`` seconds old, as far as the reconciler can tell."""

    def __init__(self) -> None:
        self.age = 0.0

    def seconds_since(self, stamp: str) -> float:
        return self.age if stamp else 0.0


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(ZONE,)) as emulator:
        yield emulator


def reconciler(api: client.ApiClient, config: Path, work: Path, clock: Clock) -> Reconciler:
    runner = AnsibleRunner(work, timeout_seconds=120, max_concurrent=2, collections_path=collections_path())
    # A monitor as the command has one; probe: none gives it nothing to probe, and its prober
    # would refuse anything but loopback if it ever did.
    monitor = ServingMonitor(Prober(allowed_networks=["127.0.0.0/8"]))
    rec = Reconciler(KubeStore(api), runner, str(config),
                     parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0), monitor=monitor))
    rec._seconds_since = clock.seconds_since  # type: ignore[method-assign]
    return rec


def create_proxy(objects: client.CustomObjectsApi, name: str, provider: str) -> None:
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"provider": provider}})


def get_proxy(objects: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    found = objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    assert isinstance(found, dict)
    return found


def condition(proxy: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (proxy.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def events(core: client.CoreV1Api, name: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in core.list_namespaced_event(NAMESPACE).items
            if e.involved_object.name == name and e.reason == reason]


def expect_lost(objects: client.CustomObjectsApi, name: str, reason: str, old_id: str) -> None:
    """Out of Ready (and so out of discovery) at once, saying why, still naming the dead instance."""
    proxy = get_proxy(objects, name)
    assert proxy["status"]["phase"] == "Provisioning"
    assert proxy["status"]["providerID"] == old_id
    serving = condition(proxy, "Serving")
    assert (serving["status"], serving["reason"]) == ("False", reason), serving
    assert condition(proxy, "Ready")["status"] == "False"


def expect_replaced(objects: client.CustomObjectsApi, core: client.CoreV1Api, name: str, old_id: str) -> str:
    """One replacement, recorded before its create, with the InstanceLost Warning naming the old
    instance; returns the new instance's providerID."""
    proxy = get_proxy(objects, name)
    new_id = str(proxy["status"]["providerID"])
    assert new_id != old_id
    assert proxy["metadata"]["annotations"][REPLACEMENTS_ANNOTATION].endswith(":1")
    lost = events(core, name, "InstanceLost")
    assert [e.type for e in lost] == ["Warning"], lost
    assert old_id in str(lost[0].message)
    assert events(core, name, "NotServing") == []
    return new_id


def test_an_evicted_pod_is_replaced_once(kube: KubeEmulator, api: client.ApiClient, tmp_path: Path) -> None:
    for namespace in (NAMESPACE, POD_NAMESPACE):
        kube.create_namespace(namespace)
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [
        {"name": "cluster", "type": "kubernetes", "probe": "none", "kubernetes": {
            "namespace": POD_NAMESPACE, "image": "ubuntu/squid:6.6-24.04_beta",
            "kubeconfig": str(write_kubeconfig(tmp_path / "kubeconfig", kube.url))}}]}))
    objects, core, clock = client.CustomObjectsApi(api), client.CoreV1Api(api), Clock()
    rec = reconciler(api, config, tmp_path / "work", clock)

    def pods() -> list[str]:
        return sorted(str(p.metadata.name) for p in core.list_namespaced_pod(POD_NAMESPACE).items if p.metadata)

    create_proxy(objects, "k8s-1", "cluster")
    assert rec.sweep().ok
    [first] = pods()
    kube.kubelet_run(POD_NAMESPACE, first, pod_ip="10.244.1.7")
    assert rec.sweep().ok
    proxy = get_proxy(objects, "k8s-1")
    assert proxy["status"]["phase"] == "Ready" and condition(proxy, "Serving")["reason"] == "Unverified"
    old_id = str(proxy["status"]["providerID"])

    kube.kubelet_evict(POD_NAMESPACE, first)
    assert rec.sweep().ok
    expect_lost(objects, "k8s-1", "InstanceError", old_id)
    clock.age = UNHEALTHY_AFTER - 1
    assert rec.sweep().ok
    assert pods() == [first]  # not before unhealthyAfter

    clock.age = UNHEALTHY_AFTER
    assert rec.sweep().ok
    new_id = expect_replaced(objects, core, "k8s-1", old_id)
    [second] = [p for p in pods() if p != first]
    assert pods() == sorted([first, second])  # make-before-break: the evicted Pod stays for now
    clock.age = 0.0  # the successor's conditions are new

    kube.kubelet_run(POD_NAMESPACE, second, pod_ip="10.244.1.8")
    assert rec.sweep().ok
    proxy = get_proxy(objects, "k8s-1")
    assert (proxy["status"]["phase"], proxy["status"]["providerID"], proxy["status"]["ip"]) == (
        "Ready", new_id, "10.244.1.8")
    assert events(core, "k8s-1", "Replaced")
    # The evicted Pod is deleted once its successor is Ready (gracefully: gone after its grace).
    kube.advance(TERMINATION_GRACE_SECONDS)
    assert pods() == [second]

    # No duplicate, however many sweeps follow (and even with every condition old).
    clock.age = 10 * UNHEALTHY_AFTER
    for _ in range(2):
        assert rec.sweep().ok
    assert pods() == [second]
    assert len(events(core, "k8s-1", "InstanceLost")) == 1


def test_a_preempted_gce_instance_is_replaced_once(kube: KubeEmulator, api: client.ApiClient,
                                                   compute: ComputeEmulator, tmp_path: Path) -> None:
    kube.create_namespace(NAMESPACE)
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [
        {"name": "gcp-eu", "type": "gcp", "probe": "none", "allowedSources": ["198.51.100.0/24"], "gcp": {
            "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "apiEndpoint": compute.endpoint}}]}))
    objects, core, clock = client.CustomObjectsApi(api), client.CoreV1Api(api), Clock()
    rec = reconciler(api, config, tmp_path / "work", clock)

    def instances() -> dict[str, str]:
        return {name: str(body["status"]) for (zone, name), body in compute.instances.items()}

    create_proxy(objects, "gcp-1", "gcp-eu")
    assert rec.sweep().ok
    assert rec.sweep().ok  # the insert operation is done by now: RUNNING with its NAT IP
    proxy = get_proxy(objects, "gcp-1")
    assert proxy["status"]["phase"] == "Ready", proxy["status"]
    old_id = str(proxy["status"]["providerID"])
    [first] = instances()

    compute.preempt(ZONE, first)
    assert rec.sweep().ok
    expect_lost(objects, "gcp-1", "InstanceStopped", old_id)
    clock.age = UNHEALTHY_AFTER - 1
    assert rec.sweep().ok
    assert instances() == {first: "TERMINATED"}  # not before unhealthyAfter

    clock.age = UNHEALTHY_AFTER
    assert rec.sweep().ok
    new_id = expect_replaced(objects, core, "gcp-1", old_id)
    [second] = [name for name in instances() if name != first]
    # The insert's operation was done when the module read the instance back: the successor
    # runs with its address at once, so it is Ready (unverified: probe none) in this very sweep,
    # and only then is the preempted one deleted (make-before-break).
    proxy = get_proxy(objects, "gcp-1")
    assert (proxy["status"]["phase"], proxy["status"]["providerID"]) == ("Ready", new_id)
    assert instances()[second] == "RUNNING"
    assert instances().get(first) in (None, "STOPPING")
    assert events(core, "gcp-1", "Replaced")
    clock.age = 0.0

    assert rec.sweep().ok  # the delete operation is done by now
    assert instances() == {second: "RUNNING"}

    clock.age = 10 * UNHEALTHY_AFTER
    for _ in range(2):
        assert rec.sweep().ok
    assert instances() == {second: "RUNNING"}
    assert len(events(core, "gcp-1", "InstanceLost")) == 1
