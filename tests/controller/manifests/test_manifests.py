"""The Kubernetes manifests under controller/manifests and the example Proxies.

No API server can run here, so each manifest is validated with kubernetes-validate against the
schemas of fixed Kubernetes versions (strict: unknown fields are errors), and the example Proxies
against the CRD's own openAPIV3Schema. The rest pins what a schema cannot see: least-privilege
RBAC, the Deployment's wiring to the controller (probes, mounts, optional Secrets), and the
example provider config passing the modules' own validator.
"""

from __future__ import annotations

import base64
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import parse_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import build_pod
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from egress_proxies.cli import parse_args
from egress_proxies.resources import proxy as model
from egress_proxies.resources.conditions import READY, condition
from support.kube.admission import pod_security_violation

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "controller" / "manifests"
EXAMPLES = ROOT / "controller" / "examples"
# The oldest and the newest Kubernetes minor the manifests are checked against (kubernetes-validate
# 1.37.0 ships schemas up to 1.37): a field that only exists in newer clusters fails on 1.30.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
NAMESPACE = "egress-proxies"

Obj = dict[str, Any]


def load(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_files() -> list[Path]:
    return sorted(MANIFESTS.glob("*.yaml"))


def example_files() -> list[Path]:
    # ProxyPool examples are checked by tests/controller/scenarios/test_pools_emulators.py.
    return sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("proxypool-"))


def objects() -> Iterator[tuple[str, Obj]]:
    for path in manifest_files():
        for doc in load(path):
            if doc["kind"] != "Kustomization":  # a kustomize file, not an API object
                yield f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc


def one(kind: str, name: str | None = None) -> Obj:
    found = [obj for _, obj in objects() if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def proxy_schema() -> Obj:
    (version,) = one("CustomResourceDefinition", f"{model.PLURAL}.{model.GROUP}")["spec"]["versions"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


def proxy_validator() -> Any:
    # Structural OpenAPI v3 schemas are a subset of JSON Schema draft 4 (boolean exclusiveMinimum,
    # no $schema); the x-kubernetes-* keywords are unknown to jsonschema and ignored.
    return jsonschema.Draft4Validator(proxy_schema())


def schema_errors(obj: Obj) -> list[str]:
    return [f"{'.'.join(map(str, error.path))}: {error.message}" for error in proxy_validator().iter_errors(obj)]


# -- every manifest ----------------------------------------------------------------------------


def test_manifests_exist_and_kustomization_lists_them_all() -> None:
    names = {path.name for path in manifest_files()}
    assert {"crd.yaml", "rbac.yaml", "deployment.yaml", "service.yaml", "configmap-example.yaml"} <= names
    (kustomization,) = load(MANIFESTS / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(names - {"kustomization.yaml"})
    # Order matters to `kubectl apply -f`-style tools: the namespace and the CRD first.
    assert kustomization["resources"][:2] == ["namespace.yaml", "crd.yaml"]


@pytest.mark.parametrize("path", manifest_files() + example_files(), ids=lambda path: path.name)
def test_every_file_parses_into_named_objects(path: Path) -> None:
    docs = load(path)
    assert docs
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc["apiVersion"]
        assert doc["kind"]
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("label", "obj"), list(objects()), ids=[label for label, _ in objects()])
def test_manifests_validate_against_kubernetes(label: str, obj: Obj, version: str) -> None:
    assert label
    assert kubernetes_validate.validate(obj, version, strict=True) == version.rsplit(".", 1)[0]


def test_kubernetes_validate_rejects_a_typo() -> None:
    """The validation above is strict: an unknown field (a typo) fails it."""
    deployment = copy.deepcopy(one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


# -- the CRD -----------------------------------------------------------------------------------


def test_crd_matches_the_controller_model() -> None:
    crd = one("CustomResourceDefinition", f"{model.PLURAL}.{model.GROUP}")
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{model.PLURAL}.{model.GROUP}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"], spec["scope"]) == (
        model.GROUP, model.KIND, model.PLURAL, "Namespaced")
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (model.VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column for column in version["additionalPrinterColumns"]}
    assert list(columns) == ["Provider", "Endpoint", "Phase", "Ready", "Reason", "Age", "Location"]
    assert [name for name, column in columns.items() if column.get("priority", 0) > 0] == ["Location"]  # -o wide
    assert columns["Location"]["jsonPath"] == ".status.location"  # where it is, also when the provider chose
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    properties = proxy_schema()["properties"]
    # Every field the controller hashes is in the schema, and nothing else is in spec but probe
    # (it changes how an instance is checked, not the instance: no replacement).
    assert set(properties["spec"]["properties"]) == {*model.SPEC_FIELDS, "probe"}
    assert properties["spec"]["properties"]["port"]["default"] == model.DEFAULT_PORT
    assert properties["status"]["properties"]["phase"]["enum"] == [
        model.PHASE_PENDING, model.PHASE_PROVISIONING, model.PHASE_READY, model.PHASE_QUARANTINED,
        model.PHASE_DELETING, model.PHASE_FAILED]


def test_crd_defaults_satisfy_their_own_schema() -> None:
    """The API server rejects a CRD whose default does not validate; check each one the same way."""
    fields = proxy_schema()["properties"]["spec"]["properties"]
    defaults = {name: field for name, field in fields.items() if "default" in field}
    assert set(defaults) == {"port", "cloudInitEncoding", "auth"}
    for field in defaults.values():
        jsonschema.Draft4Validator(field).validate(field["default"])


@pytest.mark.parametrize("path", example_files(), ids=lambda path: path.name)
def test_example_proxies_are_valid(path: Path) -> None:
    (proxy,) = load(path)
    assert (proxy["apiVersion"], proxy["kind"]) == (model.API_VERSION, model.KIND)
    assert schema_errors(proxy) == []


def test_examples_cover_packages_a_jinja_template_and_the_minimum() -> None:
    proxies = {path.name: load(path)[0] for path in example_files()}
    assert len(proxies) in (2, 3)
    cloud_inits = [proxy["spec"].get("cloudInit") for proxy in proxies.values()]
    assert None in cloud_inits
    jinja = [text for text in cloud_inits if text and text.startswith("## template: jinja\n")]
    assert jinja
    assert "{{" in jinja[0]
    (squid,) = [text for text in cloud_inits if text and text.startswith("#cloud-config\n")]
    document = yaml.safe_load(squid)
    assert "squid" in document["packages"]
    assert any(entry["path"].startswith("/etc/squid/") for entry in document["write_files"])


def test_examples_name_providers_and_hosts_of_the_example_config() -> None:
    config = parse_provider_config(yaml.safe_load(one("ConfigMap")["data"]["providers.yaml"]))
    providers = {provider.name: provider for provider in config.providers}
    for path in example_files():
        spec = load(path)[0]["spec"]
        provider = providers[spec["provider"]]
        if "location" in spec and provider.kvm is not None:
            assert spec["location"] in {host.name for host in provider.kvm.hosts}


def a_proxy(**spec: Any) -> Obj:
    return {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": "p", "namespace": "crawlers"},
            "spec": {"provider": "home-kvm", **spec}}


def test_a_status_as_the_controller_writes_it_is_valid() -> None:
    proxy = a_proxy(port=3128)
    proxy["status"] = {
        "phase": model.PHASE_READY, "providerID": "kvm://hosts/beelink/domains/p-crawlers-p-abcdef",
        "ip": "192.0.2.10", "endpoint": "192.0.2.10:3128", "observedGeneration": 3,
        "conditions": [condition(READY, "True", "InstanceRunning", "instance is running", "2026-01-02T03:04:05Z", 3)],
    }
    assert schema_errors(proxy) == []
    proxy["status"]["phase"] = "Running"
    phases = "['Pending', 'Provisioning', 'Ready', 'Quarantined', 'Deleting', 'Failed']"
    assert schema_errors(proxy) == [f"status.phase: 'Running' is not one of {phases}"]


def test_base64_of_64_kib_binary_user_data_fits() -> None:
    encoded = base64.b64encode(os.urandom(64 * 1024)).decode()
    assert len(encoded) == 87384
    assert schema_errors(a_proxy(cloudInit=encoded, cloudInitEncoding="base64")) == []


@pytest.mark.parametrize(("spec", "error"), [
    ({"provider": None}, "spec: 'provider' is a required property"),
    ({"provider": ""}, "spec.provider: '' should be non-empty"),
    ({"port": 70000}, "spec.port: 70000 is greater than the maximum of 65535"),
    ({"port": 22}, "spec.port: 22 is less than the minimum of 1024"),
    ({"port": "3128"}, "spec.port: '3128' is not of type 'integer'"),
    ({"cloudInitEncoding": "gzip"}, "spec.cloudInitEncoding: 'gzip' is not one of ['plain', 'base64']"),
    ({"cloudInit": "#" * 90001}, "spec.cloudInit: '###"),
], ids=["missing-provider", "empty-provider", "port-70000", "port-22", "port-string", "bad-encoding",
        "oversized-cloudinit"])
def test_invalid_proxies_are_rejected(spec: Obj, error: str) -> None:
    proxy = a_proxy(**{key: value for key, value in spec.items() if value is not None})
    if spec.get("provider", "") is None:
        del proxy["spec"]["provider"]
    errors = schema_errors(proxy)
    assert len(errors) == 1
    assert errors[0].startswith(error)


def test_a_proxy_without_spec_is_rejected() -> None:
    proxy = a_proxy()
    del proxy["spec"]
    assert schema_errors(proxy) == [": 'spec' is a required property"]


# -- RBAC ----------------------------------------------------------------------------------------


def rules(kind: str, name: str | None = None) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(group, resource, tuple(rule["verbs"]))
            for rule in one(kind, name)["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}


OWN_ROLE = "egress-proxies-own-namespace"
PODS_ROLE = "egress-proxies-pods"
# The Kubernetes provider's namespace in the manifests (a provider config's `namespace`).
PODS_NAMESPACE = "egress"


def test_rbac_is_least_privilege() -> None:
    assert rules("ClusterRole") == {
        ("crawl.example.com", "proxies", ("get", "list", "watch", "create", "update", "patch", "delete")),
        ("crawl.example.com", "proxies/status", ("get", "update", "patch")),
        ("crawl.example.com", "proxypools", ("get", "list", "watch", "update", "patch")),
        ("crawl.example.com", "proxypools/status", ("get", "update", "patch")),
        ("", "events", ("create", "patch")),
        ("", "namespaces", ("get", "list")),  # their uids: credentials are bound to a namespace's identity
        ("", "nodes", ("get", "list")),  # the Kubernetes provider: their addresses (refused; a NodePort's ExternalIP)
    }
    assert one("Role", OWN_ROLE)["metadata"]["namespace"] == NAMESPACE
    # In the controller's own namespace: the Lease, and the proxies' credentials (Secrets only there).
    assert rules("Role", OWN_ROLE) == {("coordination.k8s.io", "leases", ("get", "create", "update")),
                                       ("", "secrets", ("get", "list", "create", "update", "delete"))}
    # The Kubernetes provider's Pods, in its namespace only: no update/patch/watch, no exec or logs.
    assert one("Role", PODS_ROLE)["metadata"]["namespace"] == PODS_NAMESPACE
    # A Pod, and its Service with exposure NodePort or LoadBalancer: made, read, listed, deleted.
    assert rules("Role", PODS_ROLE) == {("", "pods", ("get", "list", "create", "delete")),
                                        ("", "services", ("get", "list", "create", "delete"))}
    roles = [one("ClusterRole"), one("Role", OWN_ROLE), one("Role", PODS_ROLE)]
    assert len([obj for _, obj in objects() if obj["kind"] in ("ClusterRole", "Role")]) == len(roles)
    for role in roles:
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no nonResourceURLs, no resourceNames tricks
            for value in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
                assert "*" not in value
            assert "configmaps" not in rule["resources"]
            if role["metadata"]["name"] != OWN_ROLE:  # Secrets only in the controller's own namespace
                assert "secrets" not in rule["resources"]
            if role["metadata"]["name"] != PODS_ROLE:
                assert "pods" not in rule["resources"]


def test_the_pods_namespace_exists_and_admits_squid() -> None:
    # The strictest Pod Security level, and the provider's Pod passes it (the emulator's PodSecurity
    # admission, tests/support/kube/admission.py).
    namespace = one("Namespace", PODS_NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    request = InstanceRequest(name="eu-1", user_data=b"", tags={"crawl.example.com/owner": "o"})
    pod = build_pod(KubernetesSettings(namespace=PODS_NAMESPACE, image="squid"), request, PODS_NAMESPACE)
    assert pod_security_violation(namespace, pod) is None


def test_bindings_grant_the_roles_to_the_controller_service_account() -> None:
    account = one("ServiceAccount")
    assert account["metadata"]["namespace"] == NAMESPACE
    bindings = [(one("ClusterRoleBinding"), one("ClusterRole")),
                (one("RoleBinding", OWN_ROLE), one("Role", OWN_ROLE)),
                (one("RoleBinding", PODS_ROLE), one("Role", PODS_ROLE))]
    for binding, role in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"],
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": NAMESPACE}]
        assert binding["metadata"].get("namespace") == role["metadata"].get("namespace")
    assert len([obj for _, obj in objects() if obj["kind"] in ("ClusterRoleBinding", "RoleBinding")]) == 3
    assert one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


# -- the Deployment ------------------------------------------------------------------------------


def container() -> Obj:
    (only,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    result: Obj = only
    return result


def test_deployment_runs_the_controller_against_kubernetes() -> None:
    deployment = one("Deployment")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 1
    main = container()
    # A placeholder that can never be pulled (.invalid never resolves); the deploy playbook refuses it.
    assert main["image"] == "egress-proxies-controller.invalid/set-your-image:0.1.0"
    command = main["command"]
    assert command[:3] == ["egress-proxies", "--source", "kubernetes"]
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--provider-config"] == "/etc/egress-proxies/providers.yaml"
    assert options["--work-dir"] == "/var/lib/egress-proxies"
    # The provider config comes from the example ConfigMap's only key.
    assert set(one("ConfigMap")["data"]) == {"providers.yaml"}


def test_deployment_command_is_accepted_by_the_cli() -> None:
    """The command line drifts with the CLI; parse it with the real parser, $(VAR)s expanded as
    the kubelet does (only variables the container defines)."""
    main = container()
    env = {item["name"]: f"<{item['name']}>" for item in main["env"]}
    args = []
    for arg in main["command"][1:]:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        assert "$(" not in arg, f"{arg}: not a variable the container defines"
        args.append(arg)
    settings = parse_args(args)
    assert (settings.source, settings.listen) == ("kubernetes", ("0.0.0.0", 8080))
    assert settings.metrics_listen == ("0.0.0.0", 9090)
    assert (settings.lease_namespace, settings.identity) == ("<POD_NAMESPACE>", "<POD_NAME>")
    sources = {item["name"]: item.get("valueFrom") for item in main["env"]}
    assert sources["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert sources["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_deployment_probes_and_ports() -> None:
    """Discovery (and the kubelet's probes) on one port and Service, /metrics on another of each:
    exposing discovery never exposes the metrics."""
    main = container()
    assert main["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                             {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    (port,) = one("Service", "egress-proxies")["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (8080, "http")
    (port,) = one("Service", "egress-proxies-metrics")["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9090, "metrics")
    for name in ("egress-proxies", "egress-proxies-metrics"):
        assert one("Service", name)["spec"]["selector"] == one("Deployment")["spec"]["selector"]["matchLabels"]


def test_deployment_mounts_and_optional_secrets() -> None:
    main = container()
    pod = one("Deployment")["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in main["volumeMounts"]}
    assert mounts["/etc/egress-proxies"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    # The controller must start without the SSH Secret (KVM Proxies wait, the others run).
    assert mounts["/etc/egress-proxies/kvm-ssh"]["secret"] == {"secretName": "kvm-ssh", "optional": True,
                                                              "defaultMode": 0o440}
    assert "emptyDir" in mounts["/var/lib/egress-proxies"]
    assert "emptyDir" in mounts["/tmp"]
    env = {item["name"]: item for item in main["env"]}
    assert env["DISCOVERY_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "egress-proxies-discovery", "key": "token", "optional": True}}


def test_deployment_is_locked_down() -> None:
    main = container()
    pod = one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert main["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                       "capabilities": {"drop": ["ALL"]}}
    assert main["resources"]["limits"]["memory"] == "1Gi"
    assert main["resources"]["requests"]["memory"]


def test_the_readmes_kubectl_get_columns_are_the_crds() -> None:
    """Issue 40 row 8: what README shows `kubectl get proxies` printing is what the CRD prints
    (NAME, then every column without a priority, upper-cased)."""
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("kubectl get proxies -n crawlers --watch", 1)[1].split("NAME ", 1)[1].splitlines()[0]
    columns = one("CustomResourceDefinition", f"{model.PLURAL}.{model.GROUP}")["spec"]["versions"][0][
        "additionalPrinterColumns"]
    assert ["NAME", *shown.split()] == ["NAME", *(c["name"].upper() for c in columns if not c.get("priority"))]
