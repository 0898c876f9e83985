"""A namespace's proxy credential through the real ``egress-proxies`` command (issue 26, rows 9 and
10): it belongs to the namespace, not to its name, and it ends with it.

- Row 9: a Proxy (or ProxyPool) whose namespace or name is no Kubernetes name (``../../x``) fails
  alone, naming the field, and nothing is written for it: no credential file outside the store,
  no existing file replaced, no member file anywhere.
- Row 10: on Kubernetes a namespace deleted and made again under its name (a new uid) is never
  handed the old namespace's password; on the directory source, where a namespace is only a name,
  the credential is removed a grace period after the last Proxy of the namespace has gone, and the
  next Proxy there gets a new one.

The controller runs against libvirt's test driver (a libvirtd) and, for Kubernetes, the API
emulator, which keeps namespaces as the real API server does (a uid each, Terminating until
their content is gone).
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from support.collection.provider_config import write_kubeconfig
from support.controller.command import ControllerProcess, proxy_document, recorded_status, run_refused
from support.kube.emulator import KubeEmulator

pytestmark = pytest.mark.timeout(300)

GROUP, VERSION, PLURAL = "crawl.example.com", "v1alpha1", "proxies"
TOKEN = "crawlers-token-0123456789abcdef0123456789abcdef"


def tokens_file(path: Path) -> Path:
    path.write_text(yaml.safe_dump([{"name": "crawlers", "namespaces": ["crawlers"],
                                     "sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]))
    return path


def handed_out(controller: ControllerProcess) -> str:
    """The password discovery hands the crawlers' token (one Ready proxy)."""
    code, body = controller.http("GET", "/v1/proxies.txt", authorization=f"Bearer {TOKEN}")
    found = re.fullmatch(r"http://crawlers-[0-9a-f]{16}:([^@]+)@[0-9.]+:3128\n", body)
    assert code == 200 and found is not None, (code, body)
    return found.group(1)


# -- row 9 ----------------------------------------------------------------------------------------


def outside(base: Path) -> list[str]:
    """Every file under ``base`` but in the Proxy directory and the work directory."""
    return sorted(str(relative) for relative in (p.relative_to(base) for p in base.rglob("*"))
                  if relative.parts[0] not in ("proxies", "work"))


def test_a_namespace_or_name_that_is_no_kubernetes_name_fails_alone_and_writes_nothing(
        tmp_path: Path, testdriver_config: Path) -> None:
    proxies, work = tmp_path / "proxies", tmp_path / "work"
    proxies.mkdir()
    # Where `../../x` leads from the credential store (work/credentials): someone's file.
    (tmp_path / "x.yaml").write_text("mine: true\n")
    (proxies / "evil.yaml").write_text(yaml.safe_dump(proxy_document("eu-1", "../../x")))
    (proxies / "sneaky.yaml").write_text(yaml.safe_dump(proxy_document("../../../y", "crawlers")))
    (proxies / "pool.yaml").write_text(yaml.safe_dump({
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ProxyPool",
        "metadata": {"name": "../../pool", "namespace": "crawlers"},
        "spec": {"replicas": 1, "template": {"cloudInit": "#cloud-config\n"}, "placement": [{"provider": "lab"}]}}))
    (proxies / "good.yaml").write_text(yaml.safe_dump(proxy_document("eu-2", "crawlers")))
    before = outside(tmp_path)

    once = run_refused(["--source", "directory", "--proxy-dir", str(proxies), "--provider-config",
                        str(testdriver_config), "--work-dir", str(work), "--once"], timeout=240)

    assert once.returncode == 1, once.stderr  # a Proxy failed, the sweep went on
    assert (tmp_path / "x.yaml").read_text() == "mine: true\n"
    assert outside(tmp_path) == before  # nothing new beside the Proxy directory and the work directory
    assert sorted(p.name for p in (work / "credentials").iterdir()) == ["crawlers.yaml"]
    assert recorded_status(proxies, "good")["phase"] == "Ready"
    for stem, field in (("evil", "metadata.namespace: must be a DNS-1123 label"),
                        ("sneaky", "metadata.name: must be a DNS-1123 subdomain")):
        status = recorded_status(proxies, stem)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (status["phase"], ready["reason"]) == ("Failed", "InvalidSpec") and field in ready["message"], status
    pool = yaml.safe_load((proxies / ".pool.pool.yaml").read_text())["status"]
    assert pool["phase"] == "Failed" and "metadata.name: must be a DNS-1123 subdomain" in str(pool["conditions"])
    assert sorted(p.name for p in proxies.iterdir() if not p.name.startswith(".")) == [
        "evil.status.yaml", "evil.yaml", "good.status.yaml", "good.yaml", "pool.yaml", "sneaky.status.yaml",
        "sneaky.yaml"]  # no member file of the pool, here or anywhere else


# -- row 10, Kubernetes ------------------------------------------------------------------------------


def ready(objects: client.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        found = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except client.ApiException:
        return False
    return isinstance(found, dict) and (found.get("status") or {}).get("phase") == "Ready"


def credential_secret(core: client.CoreV1Api) -> dict[str, str]:
    secret = core.read_namespaced_secret("egress-proxies-credentials-crawlers", "egress-proxies")
    return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}


def namespace_gone(core: client.CoreV1Api, name: str) -> bool:
    return name not in [n.metadata.name for n in core.list_namespace().items if n.metadata]


def test_a_namespace_made_again_under_its_name_is_never_handed_the_old_password(
        tmp_path: Path, kube: KubeEmulator, api: client.ApiClient, testdriver_config: Path) -> None:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    kube.create_namespace("egress-proxies")  # the controller's own: its Lease and the credentials' Secrets
    first_uid = kube.create_namespace("crawlers")["metadata"]["uid"]
    objects.create_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, proxy_document("eu-1", "crawlers"))
    with ControllerProcess(["--source", "kubernetes", "--kubeconfig",
                            str(write_kubeconfig(tmp_path / "kubeconfig", kube.url)), "--provider-config",
                            str(testdriver_config), "--work-dir", str(tmp_path / "work"), "--interval", "1",
                            # The credential grace stays the default (600 s), far longer than this
                            # test: only the namespace's identity tells the two namespaces apart.
                            "--discovery-tokens", str(tokens_file(tmp_path / "tokens.yaml")),
                            "--listen", "127.0.0.1:0"]) as controller:
        controller.wait_for(lambda: ready(objects, "crawlers", "eu-1"), 120, "eu-1 Ready")
        old_password = handed_out(controller)
        first_secret = credential_secret(core)

        # The team leaves: its namespace goes (Terminating until the controller has deleted the
        # instance and released the Proxy), and another team makes one of the same name.
        objects.delete_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, "eu-1")
        core.delete_namespace("crawlers")
        controller.wait_for(lambda: namespace_gone(core, "crawlers"), 120, "the namespace to be gone")
        second_uid = kube.create_namespace("crawlers")["metadata"]["uid"]
        objects.create_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, proxy_document("eu-1", "crawlers"))
        controller.wait_for(lambda: ready(objects, "crawlers", "eu-1"), 120, "the new eu-1 Ready")

        new_password = handed_out(controller)
        assert new_password != old_password
        stored = credential_secret(core)
        assert old_password not in stored.values()  # not even kept as the previous credential
        assert (first_secret["namespaceIdentity"], stored["namespaceIdentity"]) == (first_uid, second_uid)
    assert old_password not in controller.output() and new_password not in controller.output()


# -- row 10, the directory source ------------------------------------------------------------------


def test_on_the_directory_source_a_credential_ends_a_grace_period_after_the_namespaces_last_proxy(
        tmp_path: Path, testdriver_config: Path) -> None:
    proxies, stored = tmp_path / "proxies", tmp_path / "work" / "credentials" / "crawlers.yaml"
    proxies.mkdir()
    (proxies / "eu-1.yaml").write_text(yaml.safe_dump(proxy_document("eu-1", "crawlers")))
    with ControllerProcess(["--source", "directory", "--proxy-dir", str(proxies), "--provider-config",
                            str(testdriver_config), "--work-dir", str(tmp_path / "work"), "--interval", "1",
                            "--credential-grace", "2",
                            "--discovery-tokens", str(tokens_file(tmp_path / "tokens.yaml")),
                            "--listen", "127.0.0.1:0"]) as controller:
        controller.wait_for(lambda: recorded_status(proxies, "eu-1").get("phase") == "Ready", 120, "eu-1 Ready")
        old_password = handed_out(controller)
        # The namespace's identity here is the Proxy directory: a namespace is a name in it.
        assert yaml.safe_load(stored.read_text())["namespaceIdentity"] == f"directory:{proxies.resolve()}"

        (proxies / "eu-1.yaml").unlink()  # the namespace's last Proxy
        controller.wait_for(lambda: not (proxies / "eu-1.status.yaml").exists(), 120, "eu-1 deleted")
        controller.wait_for(lambda: not stored.exists(), 30, "the credential to be removed after the grace period")

        (proxies / "eu-1.yaml").write_text(yaml.safe_dump(proxy_document("eu-1", "crawlers")))
        controller.wait_for(lambda: recorded_status(proxies, "eu-1").get("phase") == "Ready", 120, "eu-1 Ready again")
        assert handed_out(controller) != old_password
    assert "credentials of namespace crawlers removed: no Proxy there for 2 s" in controller.log()
