"""Three providers in one controller: a real libvirtd over SSH (KVM), the Compute emulator (GCP)
and the Kubernetes API emulator (Pods, and the Proxies themselves), through the real runner.

This is the predecessor's negative check, automated: one provider failing (its SSH key
missing, or its API answering 503) degrades only its own Proxies, the sweep and the process
stay up, and restoring it heals them with no restart.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml
from kubernetes import client

from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import TERMINATION_GRACE_SECONDS
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from egress_proxies.sources.kube import KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, make_base_image, write_kubeconfig
from support.compute.emulator import ComputeEmulator
from support.controller.fakes import RecordingRunner
from support.hosts.hypervisor_host import HypervisorHost
from support.kube.emulator import KubeEmulator

NAMESPACE = "crawlers"
ZONE = "europe-west1-b"
PROJECT = "test-project"


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(ZONE,)) as emulator:
        yield emulator


def provider_config(path: Path, host: HypervisorHost, ssh_dir: Path, compute: ComputeEmulator, kubeconfig: Path,
                    image_dir: Path, with_gcp: bool = True) -> Path:
    image = make_base_image(image_dir)
    providers: list[dict[str, Any]] = [
        {"name": "home-kvm", "type": "kvm", "kvm": {
            "ssh": {"keyFile": str(ssh_dir / "id_ed25519"), "knownHostsFile": str(ssh_dir / "known_hosts")},
            "hosts": [{"name": "beelink", "uri": f"qemu+libssh://root@{host.address}/system", "domainType": "qemu"}],
            "images": {"debian-12": {"url": image.url, "sha256": image.sha256}},
            "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}}}},
        {"name": "cluster", "type": "kubernetes", "kubernetes": {
            "namespace": "egress", "image": "ubuntu/squid:6.6-24.04_beta", "kubeconfig": str(kubeconfig)}},
    ]
    if with_gcp:
        providers.insert(1, {"name": "gcp-eu", "type": "gcp", "allowedSources": ["198.51.100.0/24"], "gcp": {
            "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "apiEndpoint": compute.endpoint}})
    path.write_text(yaml.safe_dump({"owner": OWNER, "providers": providers}, sort_keys=False))
    return path


def phase_and_reason(objects: client.CustomObjectsApi, name: str) -> tuple[str, str, str]:
    proxy = objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    assert isinstance(proxy, dict)
    status = proxy.get("status") or {}
    condition = (status.get("conditions") or [{}])[0]
    return str(status.get("phase")), str(condition.get("reason")), str(condition.get("message"))


def condition_of(objects: client.CustomObjectsApi, name: str, kind: str) -> dict[str, str]:
    proxy = objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    assert isinstance(proxy, dict)
    return next((c for c in (proxy.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def be_the_kubelet(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    """Every proxy Pod scheduled, running and Ready, as the scheduler and kubelet report it."""
    for pod in core.list_namespaced_pod("egress").items:
        assert pod.metadata is not None and pod.metadata.name
        kube.kubelet_run("egress", pod.metadata.name, pod_ip="10.244.1.7", host_ip="192.0.2.21")


def test_three_providers_one_sweep_and_one_failing_provider_degrades_only_its_own(
        kube: KubeEmulator, api: client.ApiClient, compute: ComputeEmulator, hypervisor_host: HypervisorHost,
        tmp_path: Path) -> None:
    ssh_dir = tmp_path / "kvm-ssh"
    ssh_dir.mkdir()
    shutil.copy(hypervisor_host.key_file, ssh_dir / "id_ed25519")
    shutil.copy(hypervisor_host.known_hosts_file, ssh_dir / "known_hosts")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    config = provider_config(tmp_path / "providers.yaml", hypervisor_host, ssh_dir, compute, kubeconfig, tmp_path)

    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    for namespace in (NAMESPACE, "egress"):  # the Proxies' and the proxy Pods' (the API refuses a missing one)
        kube.create_namespace(namespace)
    for name, provider in (("kvm-1", "home-kvm"), ("gcp-1", "gcp-eu"), ("k8s-1", "cluster")):
        objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"provider": provider}})
    runner = RecordingRunner(AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=3,
                                          collections_path=collections_path()))
    # Immediate retries, so the recovery shows in the very next sweep.
    reconciler = Reconciler(KubeStore(api), runner, str(config),
                            parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))

    try:
        assert reconciler.sweep().ok
        be_the_kubelet(kube, core)
        runner.calls.clear()
        assert reconciler.sweep().ok
        # Every provider listed exactly once per sweep; nothing else needed in steady state.
        assert sorted((provider, verb) for provider, verb, _ in runner.calls) == [
            ("cluster", "list"), ("gcp-eu", "list"), ("home-kvm", "list")]
        assert phase_and_reason(objects, "gcp-1")[0] == "Ready"
        assert phase_and_reason(objects, "k8s-1")[0] == "Ready"
        # The KVM guest has no OS here (empty base image): it runs, without an IP.
        assert phase_and_reason(objects, "kvm-1")[:2] == ("Provisioning", "Provisioning")

        # Break two providers: the KVM key Secret goes away, the Compute API answers 503.
        (ssh_dir / "id_ed25519").unlink()
        # Every listing path: after a failed aggregatedList the provider lists each zone on its own.
        compute.fail_next("GET", r"/instances$", 503, count=100)
        report = reconciler.sweep()
        assert report.ok  # the sweep (and the process) stay up
        _, kvm_reason, kvm_message = phase_and_reason(objects, "kvm-1")
        assert kvm_reason == "ListFailed" and "transient" in kvm_message and "keyFile" in kvm_message
        # A Ready Proxy whose provider cannot be listed stays Ready (and in discovery) for a
        # bounded time, with a condition saying its state is not current.
        assert phase_and_reason(objects, "gcp-1")[0] == "Ready"
        listed = condition_of(objects, "gcp-1", "ProviderListed")
        assert listed["status"] == "False" and listed["reason"] == "ListFailed"
        assert "transient" in listed["message"] and "at most 600 s" in listed["message"]
        assert set(report.providers_failed) == {"home-kvm", "gcp-eu"} and not report.clean
        assert phase_and_reason(objects, "k8s-1")[0] == "Ready"  # untouched
        assert report.gc == []  # and no garbage collection on a partial view

        # Restore both, no restart: the next sweep heals them, without duplicates.
        shutil.copy(hypervisor_host.key_file, ssh_dir / "id_ed25519")
        compute.clear_faults()
        assert reconciler.sweep().ok
        assert phase_and_reason(objects, "gcp-1")[0] == "Ready"
        assert condition_of(objects, "gcp-1", "ProviderListed") == {}  # current again
        assert phase_and_reason(objects, "k8s-1")[0] == "Ready"
        assert phase_and_reason(objects, "kvm-1")[:2] == ("Provisioning", "Provisioning")
        assert len(hypervisor_host.connection.listAllDomains()) == 1
        assert len(compute.instances) == 1

        # The GCP provider is removed from the config: its Proxy fails permanently, naming it,
        # and only the skip-cleanup annotation lets it go.
        provider_config(config, hypervisor_host, ssh_dir, compute, kubeconfig, tmp_path, with_gcp=False)
        assert reconciler.sweep().ok
        assert phase_and_reason(objects, "gcp-1")[:2] == ("Failed", "ProviderNotConfigured")
        assert "gcp-eu" in phase_and_reason(objects, "gcp-1")[2]
        objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gcp-1")
        reconciler.sweep()
        assert phase_and_reason(objects, "gcp-1")[:2] == ("Deleting", "ProviderNotConfigured")
        objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gcp-1", {
            "metadata": {"annotations": {"crawl.example.com/skip-cleanup": "true"}}})
        reconciler.sweep()
        with pytest.raises(client.ApiException) as gone:
            objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "gcp-1")
        assert gone.value.status == 404
        assert len(compute.instances) == 1  # abandoned, as asked
    finally:
        for name in ("kvm-1", "k8s-1"):
            try:
                objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            except client.ApiException:
                pass
        shutil.copy(hypervisor_host.key_file, ssh_dir / "id_ed25519")
        reconciler.sweep()
        for domain in hypervisor_host.connection.listAllDomains():  # only if a step above failed
            if domain.isActive():
                domain.destroy()
            domain.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
    # A running Pod is deleted gracefully: it terminates for its grace period, then is gone.
    assert all(p.metadata and p.metadata.deletion_timestamp for p in core.list_namespaced_pod("egress").items)
    kube.advance(TERMINATION_GRACE_SECONDS)
    assert core.list_namespaced_pod("egress").items == []

