"""playbooks/deploy_controller.yml, run by its collection name from the installed collection with
ansible-playbook, against the Kubernetes API emulator.

What a user would check after running it: every object of controller/manifests is in the cluster
with the user's provider config, SSH files, token and image; a second run changes nothing (and
writes nothing); no secret reaches the playbook's output; a new token rolls the controller. The
emulator has no Deployment controller, so ``RolloutStandIn`` plays it: it marks each new
generation of the controller's Deployment rolled out, which the playbook waits for.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml
from kubernetes import client

from support.collection.artifact import InstalledCollection
from support.collection.provider_config import write_kubeconfig
from support.kube.emulator import KubeEmulator

pytestmark = pytest.mark.timeout(240)

PLAYBOOK = "crawl.egress_proxies.deploy_controller"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
NAMESPACE = "egress-proxies"
DEPLOYMENT = "egress-proxies-controller"
MANIFESTS = Path(__file__).resolve().parents[2] / "controller" / "manifests"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TOKEN_VERSION = "crawl.example.com/discovery-token-version"
PRIVATE_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-not-a-real-key-c2VjcmV0\n"
               "-----END OPENSSH PRIVATE KEY-----\n")
KNOWN_HOSTS = "beelink ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfBeelink\n"
TOKEN = "crawler-token-4f8d9a0b1c2d3e4f5a6b7c8d9e0f1a2b"
Obj = dict[str, Any]

# A `{{ ... }}` in a provider config is data (a squid.conf may hold anything): it must reach the
# ConfigMap byte for byte, never templated.
PROVIDER_CONFIG = """\
# {{ not a template }}
owner: prod-cluster-1
providers:
- name: home-kvm
  type: kvm
  kvm:
    ssh: {keyFile: /etc/egress-proxies/kvm-ssh/id_ed25519, knownHostsFile: /etc/egress-proxies/kvm-ssh/known_hosts}
    hosts: [{name: beelink, uri: "qemu+libssh://root@beelink/system"}]
    images: {debian-12: {url: "https://example.invalid/d.qcow2", sha256: "%s", format: qcow2}}
    machineTypes: {small: {vcpus: 1, memoryMiB: 1024, diskGiB: 10}}
- name: cluster
  type: kubernetes
  kubernetes: {namespace: egress, namespaces: [egress-b], image: "ubuntu/squid:6.6-24.04_beta"}
- name: edge
  type: kubernetes
  kubernetes: {namespace: egress-edge, image: "ubuntu/squid:6.6-24.04_beta", exposure: hostNetwork}
- name: elsewhere
  type: kubernetes
  kubernetes: {namespace: remote, image: "ubuntu/squid:6.6-24.04_beta", kubeconfig: /etc/egress-proxies/kube/config}
""" % ("0" * 64)


@dataclass
class Run:
    returncode: int
    output: str

    @property
    def changed(self) -> int:
        match = re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", self.output, re.M)
        assert match, self.output
        return int(match.group(1))


@dataclass
class Deploy:
    """Runs the playbook from the installed collection with the user's files in ``files``."""

    collection: InstalledCollection
    kube: KubeEmulator
    files: Path

    def __call__(self, *, wait: bool = True, **extra: str | bool) -> Run:
        """Run it in ``files``, so relative paths in ``extra`` are relative to the user's directory."""
        variables = {
            "egress_proxies_kubeconfig": str(write_kubeconfig(self.files / "kubeconfig", self.kube.url)),
            "egress_proxies_provider_config": str(self.files / "providers.yaml"),
            "egress_proxies_kvm_ssh_key_file": str(self.files / "id_ed25519"),
            "egress_proxies_kvm_known_hosts_file": str(self.files / "known_hosts"),
            "egress_proxies_image": "registry.example/egress-proxies-controller:0.1.0-test",
            "egress_proxies_wait": wait,
            "egress_proxies_wait_timeout": 60,
            **extra,
        }
        (self.files / "vars.yml").write_text(yaml.safe_dump(variables))
        home = self.files / "home"
        home.mkdir(exist_ok=True)
        # -v prints every task's result: the output the secrets must stay out of is the fullest one.
        done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-v", PLAYBOOK, "-e", f"@{self.files / 'vars.yml'}"],
                              env=self.collection.env(home), cwd=self.files, capture_output=True, text=True,
                              timeout=180, check=False)
        return Run(done.returncode, done.stdout + done.stderr)


class RolloutStandIn:
    """The Deployment controller and kubelet: each new generation of the controller's Deployment
    is marked rolled out (what kubernetes.core's wait checks). ``generations`` lists those seen."""

    def __init__(self, kube: KubeEmulator, apps: client.AppsV1Api) -> None:
        self.kube = kube
        self.apps = apps
        self.generations: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-stand-in", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            deployment = self.kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
            if deployment is None:
                continue
            generation = deployment["metadata"]["generation"]
            if (deployment.get("status") or {}).get("observedGeneration") == generation:
                continue
            replicas = deployment["spec"]["replicas"]
            self.apps.patch_namespaced_deployment_status(DEPLOYMENT, NAMESPACE, {"status": {
                "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
                "readyReplicas": replicas, "availableReplicas": replicas}})
            self.generations.append(generation)

    def __enter__(self) -> RolloutStandIn:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """A cluster before the deploy: only the system namespaces, no Proxy CRD yet (the playbook
    installs it, and the kind is served from then on)."""
    with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "providers.yaml").write_text(PROVIDER_CONFIG)
    (tmp_path / "id_ed25519").write_text(PRIVATE_KEY)
    (tmp_path / "known_hosts").write_text(KNOWN_HOSTS)
    (tmp_path / "token").write_text(TOKEN + "\n")
    return tmp_path


@pytest.fixture
def deploy(installed_collection: InstalledCollection, kube: KubeEmulator, files: Path) -> Deploy:
    return Deploy(installed_collection, kube, files)


@pytest.fixture
def rollouts(kube: KubeEmulator, api: client.ApiClient) -> Iterator[RolloutStandIn]:
    with RolloutStandIn(kube, client.AppsV1Api(api)) as stand_in:
        yield stand_in


def manifests(name: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def manifest(name: str) -> Obj:
    (only,) = manifests(name)
    return only


# What the API server allocates for a Service (the emulator does too: tests/support/kube/admission.py).
SERVICE_SERVER_FIELDS = ("clusterIP", "clusterIPs")


def without_server_fields(obj: Obj) -> Obj:
    """An object as the playbook meant it: no server-set metadata or spec, no last-applied annotation,
    no addresses the server allocated."""
    meta = {key: value for key, value in obj["metadata"].items()
            if key not in ("uid", "resourceVersion", "generation", "creationTimestamp")}
    annotations = {key: value for key, value in (meta.pop("annotations", None) or {}).items() if key != LAST_APPLIED}
    if annotations:
        meta["annotations"] = annotations
    meant = {**{key: value for key, value in obj.items() if key != "status"}, "metadata": meta}
    if obj.get("kind") == "Namespace" and obj.get("spec") == {"finalizers": ["kubernetes"]}:
        del meant["spec"]  # the namespace controller's finalizer, which the API server adds
    if obj.get("kind") == "Service":
        meant["spec"] = {key: value for key, value in obj["spec"].items() if key not in SERVICE_SERVER_FIELDS}
    return meant


def secret_data(kube: KubeEmulator, name: str) -> dict[str, str]:
    secret = kube.get_object("secrets", NAMESPACE, name)
    assert secret is not None, name
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def writes(kube: KubeEmulator, since: int) -> list[tuple[str, str]]:
    return [(method, path) for method, path in kube.requests()[since:] if method != "GET"]


def test_deploys_everything_then_a_second_run_changes_nothing(deploy: Deploy, kube: KubeEmulator,
                                                             rollouts: RolloutStandIn) -> None:
    first = deploy(egress_proxies_discovery_token_file=str(deploy.files / "token"))
    assert first.returncode == 0, first.output
    assert first.changed > 0
    assert rollouts.generations == [1]  # the playbook waited for this rollout

    for name in ("crd.yaml", "namespace.yaml", "service.yaml", "service-metrics.yaml"):
        expected = manifest(name)
        resource = {"CustomResourceDefinition": "customresourcedefinitions.apiextensions.k8s.io",
                    "Namespace": "namespaces", "Service": "services"}[expected["kind"]]
        stored = kube.get_object(resource, expected["metadata"].get("namespace"), expected["metadata"]["name"])
        assert stored is not None and without_server_fields(stored) == expected, name
    for rbac in manifests("rbac.yaml"):
        resource = {"ServiceAccount": "serviceaccounts", "Namespace": "namespaces"}.get(
            rbac["kind"], f"{rbac['kind'].lower()}s.rbac.authorization.k8s.io")
        stored = kube.get_object(resource, rbac["metadata"].get("namespace"), rbac["metadata"]["name"])
        assert stored is not None and without_server_fields(stored) == rbac, rbac["metadata"]

    config_map = kube.get_object("configmaps", NAMESPACE, "egress-proxies-providers")
    assert config_map is not None
    assert config_map["data"] == {"providers.yaml": PROVIDER_CONFIG}  # byte for byte, not templated
    assert secret_data(kube, "kvm-ssh") == {"id_ed25519": PRIVATE_KEY, "known_hosts": KNOWN_HOSTS}
    assert secret_data(kube, "egress-proxies-discovery") == {"token": TOKEN}

    deployment = kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
    assert deployment is not None
    expected = manifest("deployment.yaml")
    template = expected["spec"]["template"]
    template["spec"]["containers"][0]["image"] = "registry.example/egress-proxies-controller:0.1.0-test"
    discovery = kube.get_object("secrets", NAMESPACE, "egress-proxies-discovery")
    assert discovery is not None
    template["metadata"]["annotations"] = {TOKEN_VERSION: discovery["metadata"]["resourceVersion"]}
    assert without_server_fields(deployment) == expected

    version = kube.resource_version
    second = deploy(egress_proxies_discovery_token_file=str(deploy.files / "token"))
    assert second.returncode == 0, second.output
    assert second.changed == 0, second.output
    # Nothing in the cluster changed. (Client-side apply still sends patches: kubernetes.core
    # always resends lists it has no merge key for, which the server finds to be no-ops.)
    assert kube.resource_version == version
    assert rollouts.generations == [1]

    for secret in (PRIVATE_KEY.splitlines()[1], TOKEN, base64.b64encode(TOKEN.encode()).decode()):
        assert secret not in first.output + second.output


def operator_crd(plural: str, kind: str) -> Obj:
    """What the Prometheus Operator installs for ``kind`` (its schema left open: only the kind matters here)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_monitoring_is_installed_on_request_with_the_metrics_listener_and_runbook_links(
        deploy: Deploy, kube: KubeEmulator) -> None:
    """Issue 40 row 11 (the playbook never installed monitoring) and issue 38 row 7 (metrics on a
    listener of their own, its address a variable): the ServiceMonitor scrapes the metrics Service,
    every alert links its runbook section under the base given, the dashboard is a labelled ConfigMap."""
    refused = deploy(wait=False, egress_proxies_monitoring=True)  # no Prometheus Operator yet
    assert refused.returncode != 0
    assert "servicemonitors.monitoring.coreos.com and prometheusrules.monitoring.coreos.com" in refused.output
    for plural, kind in (("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule")):
        kube.install_crd(operator_crd(plural, kind))

    run = deploy(wait=False, egress_proxies_monitoring=True, egress_proxies_metrics_listen="0.0.0.0:9464",
                 egress_proxies_runbook_base_url="https://git.example/ops/egress-proxies/-/blob/main/")
    assert run.returncode == 0, run.output

    deployment = kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    at = container["command"].index("--metrics-listen")
    assert container["command"][at + 1] == "0.0.0.0:9464"
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    service = kube.get_object("services", NAMESPACE, "egress-proxies-metrics")
    assert service is not None and service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = kube.get_object("servicemonitors.monitoring.coreos.com", NAMESPACE, "egress-proxies")
    assert monitor is not None and monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    rule = kube.get_object("prometheusrules.monitoring.coreos.com", NAMESPACE, "egress-proxies")
    assert rule is not None
    links = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert links["EgressProxiesPoolBelowDesired"] == (
        "https://git.example/ops/egress-proxies/-/blob/main/docs/operations.md#egressproxiespoolbelowdesired")
    assert all(link.startswith("https://git.example/ops/egress-proxies/-/blob/main/docs/operations.md#")
               for link in links.values()), links
    dashboard = kube.get_object("configmaps", NAMESPACE, "egress-proxies-dashboard")
    assert dashboard is not None and dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (MANIFESTS / "monitoring" / "grafana-dashboard.json").read_text()
    assert dashboard["data"]["grafana-dashboard.json"] == shipped

    again = deploy(wait=False, egress_proxies_monitoring=True, egress_proxies_metrics_listen="0.0.0.0:9464",
                   egress_proxies_runbook_base_url="https://git.example/ops/egress-proxies/-/blob/main/")
    assert again.returncode == 0 and again.changed == 0, again.output

    bad = deploy(wait=False, egress_proxies_metrics_listen="9464")
    assert bad.returncode != 0 and "egress_proxies_metrics_listen must be HOST:PORT" in bad.output


def test_the_pod_roles_follow_the_kubernetes_providers_of_this_cluster(deploy: Deploy, kube: KubeEmulator) -> None:
    """One Namespace, Role and RoleBinding per namespace an in-cluster Kubernetes provider uses;
    hostNetwork needs Pod Security "privileged", the others get the restricted level the proxy Pods pass; a
    provider with its own kubeconfig gets none."""
    run = deploy(wait=False)
    assert run.returncode == 0, run.output

    (pods_role,) = [doc for doc in manifests("rbac.yaml")
                    if doc["kind"] == "Role" and doc["metadata"]["namespace"] == "egress"]
    levels = {}
    for namespace in ("egress", "egress-b", "egress-edge"):
        stored = kube.get_object("roles.rbac.authorization.k8s.io", namespace, pods_role["metadata"]["name"])
        assert stored is not None and stored["rules"] == pods_role["rules"], namespace
        assert kube.get_object("rolebindings.rbac.authorization.k8s.io", namespace, "egress-proxies-pods")
        ns = kube.get_object("namespaces", None, namespace)
        assert ns is not None
        levels[namespace] = ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    assert levels == {"egress": "restricted", "egress-b": "restricted", "egress-edge": "privileged"}
    assert kube.get_object("namespaces", None, "remote") is None
    assert kube.get_object("roles.rbac.authorization.k8s.io", "remote", "egress-proxies-pods") is None


def test_a_generated_token_is_kept_and_a_new_token_rolls_the_controller(deploy: Deploy, kube: KubeEmulator,
                                                                       rollouts: RolloutStandIn) -> None:
    first = deploy()  # no token file: one is made
    generated = secret_data(kube, "egress-proxies-discovery")["token"]
    assert first.returncode == 0, first.output
    assert re.fullmatch(r"[A-Za-z0-9]{43}", generated)
    assert generated not in first.output

    again = deploy()
    assert again.changed == 0, again.output
    assert secret_data(kube, "egress-proxies-discovery")["token"] == generated

    rotated = deploy(egress_proxies_discovery_token_file="token")  # relative to where it runs
    assert rotated.returncode == 0, rotated.output
    assert secret_data(kube, "egress-proxies-discovery")["token"] == TOKEN
    assert rollouts.generations == [1, 2]  # the Pod template changed: a rollout, waited for
    assert TOKEN not in rotated.output and generated not in rotated.output


def test_ssh_paths_the_deployment_does_not_mount_are_refused_before_any_write(deploy: Deploy,
                                                                             kube: KubeEmulator) -> None:
    config = PROVIDER_CONFIG.replace("/etc/egress-proxies/kvm-ssh/id_ed25519", "/root/.ssh/id_ed25519")
    (deploy.files / "providers.yaml").write_text(config)

    run = deploy(wait=False)

    assert run.returncode != 0
    assert "/etc/egress-proxies/kvm-ssh/id_ed25519" in run.output and "/root/.ssh/id_ed25519" in run.output
    assert writes(kube, 0) == []


@pytest.mark.parametrize("missing", ["providers.yaml", "id_ed25519", "token"])
def test_a_missing_file_is_named_before_any_write(deploy: Deploy, kube: KubeEmulator, missing: str) -> None:
    """The Secret tasks are no_log, which would hide which file is missing: checked up front."""
    (deploy.files / missing).unlink()

    run = deploy(wait=False, egress_proxies_discovery_token_file="token")

    assert run.returncode != 0
    assert f"{deploy.files / missing}" in run.output
    assert writes(kube, 0) == []


def test_an_invalid_provider_config_is_refused_with_every_error_before_the_cluster_is_touched(
        deploy: Deploy, kube: KubeEmulator) -> None:
    """The collection's own validator (provider_config_info) runs first: an unknown field and a
    malformed sha256 both pass the playbook's own shape checks, and both must be reported, each
    with its field path, before a single request reaches the cluster."""
    config = (PROVIDER_CONFIG.replace(f'sha256: "{"0" * 64}"', 'sha256: "abc123"')
              .replace("exposure: hostNetwork}", "exposure: hostNetwork, replicaz: 2}"))
    assert config.count("abc123") == 1 and config.count("replicaz") == 1
    (deploy.files / "providers.yaml").write_text(config)

    run = deploy(wait=False)

    assert run.returncode != 0
    assert "providers[0].kvm.images.debian-12.sha256: 'abc123' must be 64 lowercase hex digits" in run.output
    assert "providers[2].kubernetes.replicaz: unknown field" in run.output
    assert "2 error(s)" in run.output
    assert kube.requests() == []  # not even a read: the deploy stopped before any Kubernetes task
