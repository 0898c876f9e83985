"""Provider config files and base images for tests."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmSettings

OWNER = "test-owner"
OWNER_TAGS = {"crawl.example.com/owner": OWNER}


@dataclass(frozen=True)
class BaseImage:
    path: Path
    sha256: str

    @property
    def url(self) -> str:
        return self.path.as_uri()


def make_base_image(directory: Path, size: str = "64M") -> BaseImage:
    """A real (empty) qcow2 image, as a cloud image would be, with its checksum."""
    path = directory / "base.qcow2"
    if not path.exists():
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True)
    return BaseImage(path, hashlib.sha256(path.read_bytes()).hexdigest())


def kvm_host(name: str, uri: str, pool: str = "default", network: str = "default",
             domain_type: str = "qemu") -> dict[str, Any]:
    return {"name": name, "uri": uri, "pool": pool, "network": network, "domainType": domain_type}


def write_kvm_config(path: Path, hosts: Sequence[dict[str, Any]], image: BaseImage,
                     ssh: dict[str, str] | None = None, extra_providers: Sequence[dict[str, Any]] = (),
                     probe: Any = "none", allowed_destinations: Sequence[str] = (), allowed_sources: Sequence[str] = (),
                     **kvm_overrides: Any) -> Path:
    """A provider config with one KVM provider named ``lab`` (plus any extra providers).

    ``probe`` is ``none`` unless a test says otherwise: the libvirt test driver's addresses are
    made up, and nothing may ever be sent to them (a test that probes gives its own settings,
    aimed at hosts inside its own network namespace, which are internal addresses: the proxies
    reach them only when ``allowed_destinations`` opens them)."""
    kvm: dict[str, Any] = {
        "hosts": list(hosts),
        "images": {"debian-12": {"url": image.url, "sha256": image.sha256, "format": "qcow2"}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}},
        "defaultMachineType": "small",
        "defaultImage": "debian-12",
    }
    if ssh is not None:
        kvm["ssh"] = ssh
    kvm.update(kvm_overrides)
    provider: dict[str, Any] = {"name": "lab", "type": "kvm", "probe": probe, "kvm": kvm}
    if allowed_sources:
        provider["allowedSources"] = list(allowed_sources)
    if allowed_destinations:
        provider["allowedDestinations"] = list(allowed_destinations)
    document = {"owner": OWNER, "providers": [provider, *extra_providers]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def kvm_settings(path: Path, uris: Sequence[str], image: BaseImage, pool: str = "default") -> KvmSettings:
    """The ``lab`` provider's parsed KVM section over hosts ``h0``, ``h1``... at ``uris``, written to
    ``path`` first (the module code under test reads settings, not files)."""
    # Imported here: scripts/demo.py imports this module (through guest_image) without the
    # collection on its path.
    from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import load_provider_config

    config = write_kvm_config(path, [kvm_host(f"h{index}", uri, pool=pool) for index, uri in enumerate(uris)], image)
    loaded = load_provider_config(str(config)).provider("lab", "kvm").kvm
    assert loaded is not None
    return loaded


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig pointing at ``server`` (the emulator's URL) with a bearer token."""
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_kubernetes_config(path: Path, kubeconfig: Path | None, namespace: str = "egress",
                            probe: Any = "none", allowed_destinations: Sequence[str] = (),
                            allowed_sources: Sequence[str] = (), **kubernetes_overrides: Any) -> Path:
    """A provider config with one Kubernetes provider named ``cluster`` (``probe: none``: the
    emulator's Pod addresses are made up); ``allowed_destinations`` opens internal networks (a
    test's namespace) to its proxies; ``allowed_sources`` names the crawlers' networks (required
    with a public exposure)."""
    kubernetes: dict[str, Any] = {"namespace": namespace, "image": "ubuntu/squid:6.6-24.04_beta"}
    if kubeconfig is not None:
        kubernetes["kubeconfig"] = str(kubeconfig)
    kubernetes.update(kubernetes_overrides)
    provider: dict[str, Any] = {"name": "cluster", "type": "kubernetes", "probe": probe}
    if allowed_destinations:
        provider["allowedDestinations"] = list(allowed_destinations)
    if allowed_sources:
        provider["allowedSources"] = list(allowed_sources)
    document = {"owner": OWNER, "providers": [{**provider, "kubernetes": kubernetes}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
