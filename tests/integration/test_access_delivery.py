"""The ``access`` option through real module runs (ansible-runner), as the controller calls them:
what each provider delivers, and that the user's own document is untouched.

- GCP, on the Compute emulator: the ``startup-script`` metadata item is the generated install
  script followed by the squid installer (gcp/startup.py), ``user-data`` is the Proxy's byte for byte.
- Kubernetes, on the API emulator: the Pod's squid.conf annotation has the operator's policy
  around the provider's squidConfig (its rules right after ``http_port``), the password file
  annotation holds the hashes and is projected next to squid.conf; a squidConfig with
  ``http_access allow all`` is refused naming the field.
- Every provider: no hash ever reaches the module's result (``no_log``), and a bad ``access``
  fails permanent naming the field path, also inside ``operations``.

The KVM seed ISO is checked in tests/integration/test_kvm_real_libvirt.py (it needs the real
libvirtd: the test driver cannot upload volume content); the policy itself runs through real
squid in tests/integration/test_squid_access.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from kubernetes import client

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.startup import startup_script
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import POD_PATHS
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access, render_policy
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import POLICY_DIR, install_script
from support.collection.modules import ModuleRun, run_module
from support.collection.provider_config import OWNER, OWNER_TAGS, write_kubeconfig, write_kubernetes_config
from support.compute.emulator import ComputeEmulator
from support.kube.emulator import KubeEmulator

# Real hashes of test passwords, in both formats the policy takes (cost 4: only their shape matters here).
BCRYPT_HASH = bcrypt.hashpw(b"test-password-one", bcrypt.gensalt(rounds=4)).decode()
SHA512_HASH = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input="test-password-two\n", capture_output=True,
                             text=True, check=True).stdout.strip()
ACCESS = {"users": [{"name": "crawlers", "password_hash": BCRYPT_HASH},
                    {"name": "legacy", "password_hash": SHA512_HASH}],
          "allowed_sources": ["10.0.0.0/8", "fd00::/8"], "allowed_destinations": ["192.168.122.1/32"]}
CLOUD_CONFIG = (Path(__file__).resolve().parents[2] / "controller" / "examples" / "proxy-kvm-squid.yaml")
USER_DATA = yaml.safe_load(CLOUD_CONFIG.read_text())["spec"]["cloudInit"]
TAGS = {**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/eu-1"}
NAME = "crawlers-eu-1-3f9c2a"


def no_hash_in(run: ModuleRun) -> None:
    text = json.dumps(run.result)
    assert BCRYPT_HASH not in text and SHA512_HASH not in text, text


# -- GCP ------------------------------------------------------------------------------------------

PROJECT = "test-project"
ZONE = "europe-west1-b"


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(ZONE,)) as running:
        yield running


def gcp(tmp_path: Path, emulator: ComputeEmulator, **args: Any) -> ModuleRun:
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": {
        "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
        "defaultMachineType": "small", "defaultImage": "debian-12", "apiEndpoint": emulator.endpoint}}]}))
    return run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", **args})


def test_gcp_startup_script_carries_the_policy_and_user_data_is_untouched(tmp_path: Path,
                                                                          compute: ComputeEmulator) -> None:
    created = gcp(tmp_path, compute, name=NAME, tags=TAGS, user_data=USER_DATA, access=ACCESS)
    assert created.status == "successful", created.result
    no_hash_in(created)
    metadata = compute.metadata(ZONE, NAME)
    assert metadata["user-data"] == USER_DATA
    access = parse_access(ACCESS)
    assert access is not None
    # The squid installer, then the policy script, whole (tests/integration/test_gcp_startup_script.py).
    assert metadata["startup-script"] == startup_script(access, 3128)
    assert install_script(access).decode().split("\n", 1)[1] in metadata["startup-script"]
    assert BCRYPT_HASH in metadata["startup-script"]
    assert "# Clients outside 10.0.0.0/8, fd00::/8." in metadata["startup-script"]
    assert "opened by allowed_destinations (192.168.122.1/32)" in metadata["startup-script"]


def test_gcp_without_access_gets_only_the_squid_installer(tmp_path: Path, compute: ComputeEmulator) -> None:
    created = gcp(tmp_path, compute, name=NAME, tags=TAGS, user_data=USER_DATA)
    assert created.status == "successful", created.result
    script = compute.metadata(ZONE, NAME)["startup-script"]
    assert script == startup_script(None, 3128) and POLICY_DIR not in script


# -- Kubernetes -----------------------------------------------------------------------------------

NAMESPACE = "egress"


@pytest.fixture
def k8s_config(tmp_path: Path, kube: KubeEmulator) -> Path:
    kube.create_namespace(NAMESPACE)
    return write_kubernetes_config(tmp_path / "providers.yaml", write_kubeconfig(tmp_path / "kubeconfig", kube.url))


def k8s(config: Path, **args: Any) -> ModuleRun:
    return run_module("k8s_proxy", {"provider_config": str(config), "provider": "cluster", **args})


def test_k8s_pod_has_the_rules_first_and_the_password_file_projected(k8s_config: Path, kube: KubeEmulator) -> None:
    created = k8s(k8s_config, name=NAME, tags=TAGS, access=ACCESS)
    assert created.status == "successful", created.result
    no_hash_in(created)
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=kube.url)))
    response: Any = core.read_namespaced_pod(NAME, NAMESPACE, _preload_content=False)  # the raw urllib3 response
    pod = json.loads(response.data)
    annotations = pod["metadata"]["annotations"]
    access = parse_access(ACCESS)
    assert access is not None
    conf = annotations["crawl.example.com/squid-conf"]
    policy = render_policy(access, POD_PATHS)
    assert conf.startswith("http_port 3128\n" + policy.head) and conf.endswith(policy.tail)
    assert "http_access allow localnet" in conf  # the default squidConfig in between, never reached
    assert annotations["crawl.example.com/squid-passwd"] == f"crawlers:{BCRYPT_HASH}\nlegacy:{SHA512_HASH}\n"
    items = pod["spec"]["volumes"][0]["downwardAPI"]["items"]
    assert [(item["path"], item.get("mode"), item["fieldRef"]["fieldPath"]) for item in items] == [
        ("squid.conf", None, "metadata.annotations['crawl.example.com/squid-conf']"),
        ("passwd", 0o444, "metadata.annotations['crawl.example.com/squid-passwd']")]


def test_k8s_squid_config_allowing_all_is_refused_naming_the_field(tmp_path: Path, kube: KubeEmulator) -> None:
    kube.create_namespace(NAMESPACE)
    config = write_kubernetes_config(tmp_path / "providers.yaml", write_kubeconfig(tmp_path / "kubeconfig", kube.url),
                                     squidConfig="acl a src all\nhttp_access allow all\n")
    refused = k8s(config, name=NAME, tags=TAGS, access=ACCESS)
    assert refused.failed and refused.result["error_class"] == "permanent", refused.result
    assert refused.result["msg"].startswith("squidConfig (the Kubernetes provider's config): contains 'http_access "
                                            "allow all'"), refused.result
    no_hash_in(refused)


@pytest.mark.parametrize(("access", "message"), [
    pytest.param({"users": [{"name": "crawlers", "password_hash": "hunter2hunter2"}]},
                 "access.users[0].password_hash: is not a bcrypt ($2b$) or SHA-512-crypt ($6$) hash", id="password"),
    pytest.param({"open": True}, "access.allowed_sources: required when access.users is empty", id="open-no-sources"),
    pytest.param({"users": [{"name": "crawlers", "password_hash": BCRYPT_HASH}], "allowed_sources": ["10.0.0.1/8"]},
                 "access.allowed_sources[0]: '10.0.0.1/8' is not a CIDR", id="host-bits"),
    pytest.param({"users": [{"name": "crawlers", "password_hash": BCRYPT_HASH}],
                  "allowed_destinations": ["192.168.122.1/24"]},
                 "access.allowed_destinations[0]: '192.168.122.1/24' is not a CIDR", id="destination"),
])
def test_bad_access_is_permanent_naming_the_field(k8s_config: Path, access: dict[str, Any], message: str) -> None:
    single = k8s(k8s_config, name=NAME, tags=TAGS, access=access)
    assert single.failed and single.result["error_class"] == "permanent", single.result
    assert single.result["msg"].startswith(message), single.result
    assert "hunter2hunter2" not in json.dumps(single.result)
    batch = k8s(k8s_config, operations=[{"name": NAME, "tags": TAGS, "access": access, "key": "a"}])
    assert batch.status == "successful", batch.result
    (item,) = batch.result["results"]
    assert item["error_class"] == "permanent" and item["msg"].startswith("operations[0]: " + message), item
    assert "hunter2hunter2" not in json.dumps(batch.result)
