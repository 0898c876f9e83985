"""playbooks/deploy_controller.yml, run by its collection name from the installed collection with
ansible-playbook, against the Kubernetes API emulator.

What a user would check after running it: every object of controller/manifests is in the cluster
with the user's provider config, SSH files, token and image; a second run changes nothing (and
writes nothing); no secret reaches the playbook's output; a new token rolls the controller; every
production knob (issue 40 row 1, 2, 4, 5) lands where the controller reads it; a placeholder image
is refused and an image that cannot be pulled is reported in seconds; and docs/production.md, from
its blocks through the deploy to a crawler on the internet fetching through the proxy discovery
hands it (the controller Pod run from the applied Deployment, tests/support/kube/controller_pod.py;
the proxy Pods and load balancers for real in the test's network namespaces). The emulator has no
Deployment controller or kubelet, so ``RolloutStandIn`` plays them: for each new generation of the
controller's Deployment it replaces the controller Pod (ready, or waiting on a pull that fails)
and marks a ready one's generation rolled out, which the playbook waits for.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from support.collection.artifact import InstalledCollection
from support.collection.provider_config import write_kubeconfig
from support.kube.controller_pod import ClusterAccess, controller_pod
from support.kube.emulator import KubeEmulator
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import ProbeTargetProcess
from support.netns.service_network import ServiceNetwork
from support.netns.squid_kubelet import squid_kubelet
from support.netns.tls_front import TlsFront

pytestmark = pytest.mark.timeout(240)

PLAYBOOK = "crawl.egress_proxies.deploy_controller"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
NAMESPACE = "egress-proxies"
DEPLOYMENT = "egress-proxies-controller"
MANIFESTS = Path(__file__).resolve().parents[2] / "controller" / "manifests"
EXAMPLES = MANIFESTS.parent / "examples"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TOKEN_VERSION = "crawl.example.com/discovery-token-version"
SELECTOR = "app.kubernetes.io/name=egress-proxies-controller"
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

    def __call__(self, *, wait: bool = True, **extra: Any) -> Run:
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
        variables = {name: value for name, value in variables.items() if value is not None}  # None: unset
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
    gets a Pod of its template in place of the last one, ready and the generation marked rolled
    out (what kubernetes.core's wait checks), or, with ``pull_fails``, waiting in ErrImagePull as a
    kubelet reports an image it cannot pull (and never rolled out). ``generations`` lists those seen."""

    def __init__(self, kube: KubeEmulator, api: client.ApiClient, pull_fails: bool = False) -> None:
        self.kube = kube
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.pull_fails = pull_fails
        self.generations: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-stand-in", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            deployment = self.kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
            if deployment is None:
                continue
            generation = deployment["metadata"]["generation"]
            if generation in self.generations:
                continue
            self.generations.append(generation)
            self._replace_pod(deployment, generation)
            if self.pull_fails:
                continue
            replicas = deployment["spec"]["replicas"]
            self.apps.patch_namespaced_deployment_status(DEPLOYMENT, NAMESPACE, {"status": {
                "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
                "readyReplicas": replicas, "availableReplicas": replicas}})

    def _replace_pod(self, deployment: Obj, generation: int) -> None:
        template = deployment["spec"]["template"]
        for old in self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items:
            if old.metadata is not None and old.metadata.name:
                self.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)
        name = f"{DEPLOYMENT}-g{generation}"
        pod: Any = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
                    "metadata": {"name": name, "labels": template["metadata"]["labels"]}}
        self.core.create_namespaced_pod(NAMESPACE, pod)
        (container,) = template["spec"]["containers"]
        state = ({"waiting": {"reason": "ErrImagePull", "message": f'failed to pull image "{container["image"]}": '
                              "not found"}} if self.pull_fails else {"running": {}})
        self.core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
            "phase": "Pending" if self.pull_fails else "Running",
            "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                   "ready": not self.pull_fails, "restartCount": 0, "state": state}]}})

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
    with RolloutStandIn(kube, api) as stand_in:
        yield stand_in


def manifests(name: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def manifest(name: str) -> Obj:
    (only,) = manifests(name)
    return only


# What the API server allocates for a Service (the emulator does too: tests/support/kube/admission.py).
# What the API server allocates or defaults in a Service the manifests leave out (as the real one does).
SERVICE_SERVER_FIELDS = ("clusterIP", "clusterIPs", "ipFamilyPolicy", "ipFamilies")


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


# Three whole deploys (the others run one): 205 s of the module's 240 were seen at load ~5.
@pytest.mark.timeout(480)
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


# -- the production knobs (issue 40 rows 1, 2, 4, 5) ------------------------------------------------

TEAM_TOKENS = "- {name: crawlers, namespaces: [crawlers], sha256: %s}\n" % ("c" * 64)
GCP_KEY = '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nsecret-gcp-key-material"}\n'
GCP_PROVIDER = """\
- name: gcp-eu
  type: gcp
  allowedSources: [192.0.2.0/24]
  gcp:
    project: my-project
    zones: [europe-west1-b]
    machineTypes: {small: e2-small}
    images: {debian-12: projects/debian-cloud/global/images/family/debian-12}
    credentialsFile: /etc/egress-proxies/gcp/key.json
"""
WORKLOAD_IDENTITY = {"iam.gke.io/gcp-service-account": "egress-proxies@my-project.iam.gserviceaccount.com"}
INGRESS = {"host": "discovery.crawl.example.net", "tls_secret_name": "discovery-tls", "class_name": "nginx"}
RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def controller_settings(container: Obj) -> Any:
    """The controller's settings from the container's command, parsed by the controller's own parser."""
    from egress_proxies.cli import build_parser

    variables = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": "pod"}
    words = [re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], word) for word in container["command"][1:]]
    return build_parser().parse_args(words)


def test_every_production_knob_lands_where_the_controller_reads_it(deploy: Deploy, kube: KubeEmulator,
                                                                   rollouts: RolloutStandIn) -> None:
    (deploy.files / "providers.yaml").write_text(PROVIDER_CONFIG + GCP_PROVIDER)
    (deploy.files / "tokens.yaml").write_text(TEAM_TOKENS)
    (deploy.files / "gcp-key.json").write_text(GCP_KEY)
    knobs: dict[str, Any] = {
             "egress_proxies_crawler_tokens_file": "tokens.yaml", "egress_proxies_gcp_credentials_file": "gcp-key.json",
             "egress_proxies_service_account_annotations": WORKLOAD_IDENTITY,
             "egress_proxies_discovery_ingress": INGRESS, "egress_proxies_controller_args": ["--gc-dry-run"],
             "egress_proxies_image_pull_secrets": ["registry-creds"], "egress_proxies_resources": RESOURCES}

    first = deploy(**knobs)

    assert first.returncode == 0, first.output
    assert rollouts.generations == [1]
    assert secret_data(kube, "egress-proxies-tokens") == {"tokens.yaml": TEAM_TOKENS}
    assert secret_data(kube, "gcp-credentials") == {"key.json": GCP_KEY}
    deployment = kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    settings = controller_settings(container)
    assert settings.discovery_tokens == Path("/etc/egress-proxies/tokens/tokens.yaml") and settings.gc_dry_run
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}
    assert mounts[str(settings.discovery_tokens.parent)]["secret"]["secretName"] == "egress-proxies-tokens"
    assert mounts["/etc/egress-proxies/gcp"]["secret"]["secretName"] == "gcp-credentials"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert container["resources"] == RESOURCES
    account = kube.get_object("serviceaccounts", NAMESPACE, pod["serviceAccountName"])
    assert account is not None
    assert without_server_fields(account)["metadata"]["annotations"] == WORKLOAD_IDENTITY
    ingress = kube.get_object("ingresses.networking.k8s.io", NAMESPACE, "egress-proxies-discovery")
    assert ingress is not None
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": [INGRESS["host"]], "secretName": INGRESS["tls_secret_name"]}]
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert (rule["host"], path["path"], path["pathType"]) == (INGRESS["host"], "/v1/", "Prefix")  # never /metrics
    assert path["backend"]["service"] == {"name": "egress-proxies", "port": {"name": "http"}}

    version = kube.resource_version
    second = deploy(**knobs)
    assert second.returncode == 0 and second.changed == 0, second.output
    assert kube.resource_version == version and rollouts.generations == [1]
    for secret in ("secret-gcp-key-material", "c" * 64):
        assert secret not in first.output + second.output


@pytest.mark.parametrize("image", [None, "egress-proxies-controller.invalid/set-your-image:0.1.0"])
def test_no_image_or_the_placeholder_is_refused_before_any_write(deploy: Deploy, kube: KubeEmulator,
                                                                image: str | None) -> None:
    run = deploy(wait=False, egress_proxies_image=image)
    assert run.returncode != 0
    assert "egress_proxies_image" in run.output and ("placeholder" in run.output or "required" in run.output)
    assert kube.requests() == []


def test_an_image_that_cannot_be_pulled_is_reported_in_seconds(deploy: Deploy, kube: KubeEmulator,
                                                              api: client.ApiClient) -> None:
    with RolloutStandIn(kube, api, pull_fails=True):
        started = time.monotonic()
        # A rollout wait of 600 s: the run ends long before (Deploy kills it after 180 s), and says why.
        run = deploy(egress_proxies_wait_timeout=600)
        seconds = time.monotonic() - started
    assert run.returncode != 0 and seconds < 180
    assert "The controller cannot start" in run.output and "ErrImagePull" in run.output, run.output[-3000:]
    assert "registry.example/egress-proxies-controller:0.1.0-test" in run.output
    assert "egress_proxies_image_pull_secrets" in run.output


# -- the production page (docs/production.md) ---------------------------------------------------------

PRODUCTION_PAGE = Path(__file__).resolve().parents[2] / "docs" / "production.md"
PAGE_TEAM_TOKEN = "test"  # what the page's tokens.yaml holds the hash of (its TEAM_TOKEN, for this test)


def page_files() -> dict[str, str]:
    """The page's named code blocks (```yaml NAME), by name: what a reader saves as files."""
    return dict(re.findall(r"^```yaml (\S+)\n(.*?)^```$", PRODUCTION_PAGE.read_text(), re.M | re.S))


@dataclass
class PageWorld:
    """The page's world in network namespaces (needs root): ``cluster`` (its node: the proxy Pods
    and their load balancers), ``internet`` (the crawler at an address of the page's
    ``allowedSources``, the probe target at the page's ``httpUrl`` host, the ingress controller's
    address) and ``pod``, the controller Pod's network, whose traffic to the internet leaves from
    the page's ``probeSources`` address (the cluster's NAT gateway)."""

    cluster: NetworkNamespace
    internet: NetworkNamespace
    pod: NetworkNamespace
    crawler: str
    load_balancer: str

    def curl(self, *args: str, source: str | None = None) -> tuple[int, str]:
        """curl on the internet (from ``source``, else the namespace's own address, which the
        root namespace routes back to): (exit code, body or HTTP code)."""
        interface = ["--interface", source] if source else []
        done = subprocess.run(self.internet.command(["curl", "-sS", *interface, "--connect-timeout", "3", "--max-time",
                                                     "10", *args]),
                              capture_output=True, text=True, timeout=30, check=False)
        return done.returncode, done.stdout or done.stderr


@contextmanager
def page_world(providers: Obj) -> Iterator[PageWorld]:
    """The namespaces and routes for the page's addresses: nothing else routes them."""
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces, iptables, mounts); run the tests as root, as CI does",
                    pytrace=False)
    (nat_gateway,) = [ipaddress.ip_network(source)[0] for source in providers["probeSources"]]
    (cluster_provider,) = [p for p in providers["providers"] if p["type"] == "kubernetes"]
    crawler = str(ipaddress.ip_network(cluster_provider["allowedSources"][0])[20])
    target = urlsplit(cluster_provider["probe"]["httpUrl"]).hostname
    assert target is not None
    load_balancer = "198.51.100.60"  # the cloud's address for the Proxy's load balancer: public, the test's own
    with NetworkNamespace() as cluster, NetworkNamespace() as internet, NetworkNamespace() as pod:
        cluster.link(internet, "100.127.254.1", "100.127.254.2")
        pod.link(internet, "100.127.253.1", "100.127.253.2")
        for network in (cluster_provider["allowedSources"][0], f"{nat_gateway}/32", f"{target}/32"):
            cluster.route(network, "100.127.254.2")
        for network in (f"{load_balancer}/32", cluster.network):  # the proxy Pods fetch from their own addresses
            internet.route(network, "100.127.254.1")
        pod.route("default", "100.127.253.2")
        for address in (crawler, target):
            internet.add_address(address)
        to_cluster = f"egpl{cluster.slot}x{internet.slot}p"  # the internet's end of cluster.link(internet)
        for command in (["sysctl", "-qw", "net.ipv4.ip_forward=1"],
                        ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "100.127.253.1", "-o", to_cluster, "-j",
                         "SNAT", "--to-source", str(nat_gateway)]):
            subprocess.run(internet.command(command), check=True, capture_output=True)
        yield PageWorld(cluster, internet, pod, crawler, load_balancer)


# The deploy, then the controller's module runs (ansible-runner): a minute on a quiet machine, several
# at load 10 on 2 cores.
@pytest.mark.timeout(600)
def test_the_production_page_deploys_as_written_and_serves_a_crawler_on_the_internet(
        deploy: Deploy, kube: KubeEmulator, rollouts: RolloutStandIn,
        installed_collection: InstalledCollection) -> None:
    """The page's providers.yaml, tokens.yaml and deploy-vars.yml, saved as a reader would, through
    the deploy playbook: every knob it sets reaches the cluster. Then what the page promises: the
    Deployment's controller Pod, run as a kubelet would (tests/support/kube/controller_pod.py) with
    the probe-key Secret the page creates, makes the page's Proxy example Ready on the page's
    Kubernetes provider (real squid Pods and load balancers in the test's namespaces), and a crawler
    on the internet asks discovery through the Ingress (TLS) with the team token of the page's
    tokens.yaml and fetches through the proxy it is handed: 204 from the probe target."""
    blocks = page_files()
    assert set(blocks) == {"providers.yaml", "tokens.yaml", "deploy-vars.yml"}
    for name in ("providers.yaml", "tokens.yaml"):
        (deploy.files / name).write_text(blocks[name])
    (deploy.files / "kvm-ssh").mkdir()
    (deploy.files / "kvm-ssh" / "id_ed25519").write_text(PRIVATE_KEY)
    (deploy.files / "kvm-ssh" / "known_hosts").write_text(KNOWN_HOSTS)
    (deploy.files / "gcp-key.json").write_text(GCP_KEY)
    page_vars = yaml.safe_load(blocks["deploy-vars.yml"])

    run = deploy(**page_vars)

    assert run.returncode == 0, run.output
    assert rollouts.generations == [1]
    config_map = kube.get_object("configmaps", NAMESPACE, "egress-proxies-providers")
    assert config_map is not None and config_map["data"] == {"providers.yaml": blocks["providers.yaml"]}
    assert secret_data(kube, "egress-proxies-tokens") == {"tokens.yaml": blocks["tokens.yaml"]}
    deployment = kube.get_object("deployments.apps", NAMESPACE, DEPLOYMENT)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == page_vars["egress_proxies_image"]
    settings = controller_settings(container)
    assert settings.discovery_tokens is not None and settings.gc_dry_run
    ingress = kube.get_object("ingresses.networking.k8s.io", NAMESPACE, "egress-proxies-discovery")
    assert ingress is not None
    assert ingress["spec"]["tls"][0]["hosts"] == [page_vars["egress_proxies_discovery_ingress"]["host"]]
    # The probe's egress address is admitted everywhere, as the page says it must be: the root's
    # probeSources, which every provider admits beside its allowedSources.
    providers = yaml.safe_load(blocks["providers.yaml"])
    assert providers["probeSources"] == ["198.51.100.7/32"]

    with page_world(providers) as world:
        serve_a_crawler(deploy, kube, world, installed_collection, page_vars, ingress, container, blocks["tokens.yaml"])


def serve_a_crawler(deploy: Deploy, kube: KubeEmulator, world: PageWorld, installed_collection: InstalledCollection,
                    page_vars: Obj, ingress: Obj, container: Obj, tokens: str) -> None:
    """The page's sections 5 to 7 in ``world``, after the deploy: the probe target and its Secret,
    the controller Pod, the crawlers' namespace and the Proxy example, discovery and the fetch."""
    (cluster_provider,) = [p for p in yaml.safe_load((deploy.files / "providers.yaml").read_text())["providers"]
                           if p["type"] == "kubernetes"]
    target = urlsplit(cluster_provider["probe"]["httpUrl"]).hostname
    (team,) = yaml.safe_load(tokens)
    assert hashlib.sha256(PAGE_TEAM_TOKEN.encode()).hexdigest() == team["sha256"]  # the page's example hash
    host = page_vars["egress_proxies_discovery_ingress"]["host"]
    # Where the Ingress sends /v1/: its Service's port, by the target port's name, on the container.
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    service = kube.get_object("services", NAMESPACE, backend["name"])
    assert service is not None
    (port,) = [port for port in service["spec"]["ports"] if port["name"] == backend["port"]["name"]]
    (backend_port,) = [item["containerPort"] for item in container["ports"] if item["name"] == port["targetPort"]]
    emulator_port = int(urlsplit(kube.url).port or 0)
    with ProbeTargetProcess(world.internet, target, http_port=80, tunnel_port=443) as probe_target, \
            TlsFront(deploy.files / "apiserver-tls", world.pod.gateway, ("127.0.0.1", emulator_port),
                     names=["kubernetes.default.svc"]) as apiserver, \
            TlsFront(deploy.files / "ingress-tls", world.internet.gateway, (world.pod.address, backend_port),
                     names=[host]) as ingress_controller, \
            squid_kubelet(kube, world.cluster, cluster_provider["kubernetes"]["namespace"]) as kubelet, \
            ServiceNetwork(kube, world.cluster, cluster_provider["kubernetes"]["namespace"],
                           [world.load_balancer]) as network:
        kube.add_node("node-1", world.cluster.address)
        # The page's `kubectl -n egress-proxies create secret generic probe-key --from-file=key=probe.key`.
        kube.create("secrets", NAMESPACE, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe-key"},
                                           "data": {"key": base64.b64encode(probe_target.key).decode()}})
        pod = controller_pod(kube, NAMESPACE, DEPLOYMENT, world.pod,
                             ClusterAccess(world.pod.gateway, apiserver.port, apiserver.ca_file),
                             installed_collection.collections_path, deploy.files / "pod")
        with pod:
            # The page's `kubectl create namespace crawlers`, `kubectl apply -f controller/examples/proxy-minimal.yaml`.
            kube.create_namespace("crawlers")
            example = yaml.safe_load((EXAMPLES / "proxy-minimal.yaml").read_text())
            assert example["spec"]["provider"] == cluster_provider["name"]
            kube.create("proxies.crawl.example.com", "crawlers", example)

            def proxies_txt() -> str:
                code, body = world.curl("--cacert", str(ingress_controller.ca_file), "--connect-to",
                                        f"{host}:443:{ingress_controller.host}:{ingress_controller.port}",
                                        "-H", f"Authorization: Bearer {PAGE_TEAM_TOKEN}", f"https://{host}/v1/proxies.txt")
                return body.strip() if code == 0 and body.startswith("http://") else ""

            # Listed once the controller's own probe passed, from the NAT gateway's address.
            pod.wait_for(proxies_txt, 300, "the page's Proxy in discovery (its probe passed)")
            assert kubelet.errors == [] and network.errors == [] and network.refused == set()
            (url,) = proxies_txt().splitlines()
            assert url.endswith(f"@{world.load_balancer}:3128"), url
            assert world.curl("-o", "/dev/null", "-w", "%{http_code}", "--proxy", url, probe_target.url(),
                              source=world.crawler) == (0, "204")
            password = urlsplit(url).password
            assert password and password not in pod.output() and probe_target.key.decode() not in pod.output()

