"""status.location: where the provider placed a Proxy's instance, which `kubectl get proxies -o wide`
shows in the CRD's Location column.

Through the real edges: the Kubernetes API emulator (validating status against the CRD's schema),
the real ansible-runner and KVM module, and libvirt's test driver served by a libvirtd. The Proxy
names no location, so the only source of the value is the instance the module reports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from egress_proxies.sources.kube import KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support import REPO
from support.collection.modules import collections_path
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator

NAMESPACE = "crawlers"
CRD = REPO / "controller" / "manifests" / "crd.yaml"


def printer_column(crd: dict[str, Any], name: str) -> str:
    """The jsonPath of one of the served version's additionalPrinterColumns."""
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    (column,) = [c for c in version["additionalPrinterColumns"] if c["name"] == name]
    path: str = column["jsonPath"]
    return path


def resolve(obj: dict[str, Any], json_path: str) -> Any:
    """A plain `.a.b` jsonPath (the Location column's form) evaluated as the API server does."""
    value: Any = obj
    for key in json_path.lstrip(".").split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def test_the_location_the_provider_chose_is_in_status_and_the_wide_column(
        kube: KubeEmulator, api: client.ApiClient, testdriver_config: Path, libvirt_test: LibvirtTestDaemon,
        tmp_path: Path) -> None:
    kube.create_namespace(NAMESPACE)
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "anywhere", "namespace": NAMESPACE},
        "spec": {"provider": "lab", "cloudInit": "#cloud-config\n"}})
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", collections_path())
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=2)

    assert Reconciler(KubeStore(api), runner, str(testdriver_config), parts=SweepParts(backoff=Backoff())).sweep().ok

    proxy = objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "anywhere")
    assert isinstance(proxy, dict)
    assert "location" not in proxy["spec"]
    assert proxy["status"]["phase"] == "Ready"
    # The provider config's only KVM host is h1: the module placed the domain there.
    assert proxy["status"]["location"] == "h1"
    (domain,) = {d.name() for d in libvirt_test.connection.listAllDomains()} - {"test"}
    assert proxy["status"]["providerID"] == f"kvm://hosts/h1/domains/{domain}"
    crd = yaml.safe_load(CRD.read_text())
    assert resolve(proxy, printer_column(crd, "Location")) == "h1"
