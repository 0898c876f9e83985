"""Fault isolation (issue 11): one bad Proxy, provider, file or conflict never stops the rest.

The reconciler's decisions with the fakes of tests/support/controller/fakes.py, then the same rows
through the real command, ansible-runner, the modules and libvirt's test driver (directory source)
and through the Kubernetes API emulator with a CR stored before its schema tightened. Rows owned by
other layers are proven beside them: the directory store (sources/test_directory.py,
test_directory_e2e.py), the command line (test_cli.py), the runner, the HTTP server, the Lease and
the API timeout (providers/test_runner.py, test_http_server.py, test_loop.py, sources/test_kube.py),
provider config sections and URIs (tests/unit/.../test_config.py and .../<type>/test_settings.py,
tests/integration/test_kvm_transport_refused.py, test_provider_config_info.py).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import FINALIZER, GROUP, PLURAL, VERSION, Proxy
from egress_proxies.sources.kube import KubeStore
from egress_proxies.sources.store import Conflict
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts
from support.collection.modules import collections_path
from support.controller.fakes import FakeRunner, MemoryStore, RecordingRunner
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator

GOOD = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")

# Each malformed Proxy of the table, and the field path its condition must name.
MALFORMED: dict[str, tuple[dict[str, Any], str]] = {
    "port-abc": ({"spec": {**GOOD, "port": "abc"}}, "spec.port: must be an integer 1024-65535"),
    "port-zero": ({"spec": {**GOOD, "port": 0}}, "spec.port: must be an integer 1024-65535"),
    "cloudinit-number": ({"spec": {**GOOD, "cloudInit": 12345}}, "spec.cloudInit: must be a string"),
    "location-date": ({"spec": {**GOOD, "location": datetime.date(2024, 1, 1)}}, "spec.location: must be a string"),
    "spec-list": ({"spec": ["provider", "home-kvm"]}, "spec"),
    "metadata-string": ({"metadata": "eu-1"}, "metadata"),
    "encoding-gzip": ({"spec": {**GOOD, "cloudInitEncoding": "gzip"}},
                      "spec.cloudInitEncoding: must be one of plain, base64"),
    "no-provider": ({"spec": {"cloudInit": "x"}}, "spec.provider: is required"),
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "test-owner", "providers": [
        {"name": "home-kvm", "type": "kvm", "kvm": {}}, {"name": "cluster", "type": "kubernetes", "kubernetes": {}}]}))
    return path


def sweep(store: MemoryStore, runner: FakeRunner, config: Path, **settings: Any) -> Reconciler:
    rec = Reconciler(store, runner, str(config), ReconcileSettings(**settings),
                     parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    rec.sweep()
    return rec


def add_raw(store: MemoryStore, name: str, document: dict[str, Any]) -> Proxy:
    """A Proxy as a source would hand over a malformed object (``Proxy.from_object``)."""
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
           "metadata": {"name": name, "namespace": "crawlers", "uid": f"uid-{name}"}, "spec": GOOD, **document}
    proxy = Proxy.from_object(obj)
    proxy.name, proxy.namespace, proxy.uid = name, "crawlers", f"uid-{name}"
    proxy.raw = obj
    proxy.resource_version = "1"
    store.objects[("crawlers", name)] = proxy
    return proxy


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_proxy_fails_alone_naming_its_field(case: str, config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    store.add("good", GOOD)
    document, expected = MALFORMED[case]
    add_raw(store, "bad", document)
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    report = rec.sweep()
    assert report.ok and not report.clean and set(report.proxies_failed) == {"crawlers/bad"}
    assert store.get("good").status["phase"] == "Ready"
    bad = store.get("bad")
    assert bad.status["phase"] == "Failed"
    (ready,) = [c for c in bad.status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] in ("InvalidSpec", "SourceDefect") and expected in ready["message"], ready["message"]
    assert store.reasons("crawlers/bad") == [ready["reason"]]  # one Warning Event
    # Nothing else for it: no finalizer, no create.
    assert FINALIZER not in bad.finalizers
    assert [op.args["name"] for call in runner.calls if call.verb == "create" for op in call.operations] == [
        next(iter(runner.instances.values()))["name"]]
    # The next sweep says nothing new (no Event per sweep while it lasts).
    rec.sweep()
    assert store.reasons("crawlers/bad") == [ready["reason"]]


def test_an_invalid_proxy_keeps_its_instance_from_garbage_collection(config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    proxy = store.add("eu-1", GOOD)
    sweep(store, runner, config)
    (instance,) = runner.instances.values()
    # The Proxy is edited into an invalid one; its source lost even its uid (a corrupt status file).
    stored = store.objects[("crawlers", "eu-1")]
    stored.spec["port"] = "abc"
    stored.raw = {"metadata": {"name": "eu-1"}, "spec": stored.spec}
    stored.uid = "unknown-placeholder"
    report = sweep(store, runner, config, gc_grace_seconds=0).sweep()
    assert report.gc == [] and instance["provider_id"] in runner.instances
    assert proxy.uid != stored.uid


def test_an_unexpected_error_on_one_proxy_is_contained(config: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, runner = MemoryStore(), FakeRunner()
    store.add("good", GOOD)
    store.add("cursed", GOOD)
    original = store.replace_status

    def replace_status(proxy: Proxy) -> Proxy:
        if proxy.name == "cursed" and proxy.status.get("phase") == "Ready":
            raise RuntimeError("a bug on this Proxy")
        return original(proxy)

    store.replace_status = replace_status  # type: ignore[method-assign]
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    report = rec.sweep()
    assert report.ok and "crawlers/cursed" in report.proxies_failed
    assert store.get("good").status["phase"] == "Ready"
    assert store.get("cursed").status["conditions"][0]["reason"] == "InternalError"
    assert caplog.text.count("Traceback") == 1
    rec.sweep()
    assert caplog.text.count("Traceback") == 1  # logged with its traceback once, then in one line


def test_persistent_conflicts_on_one_proxy_fail_only_that_proxy(config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    store.add("good", GOOD)
    store.add("busy", GOOD)
    original = store.replace_status
    conflicts = {"left": 20}

    def replace_status(proxy: Proxy) -> Proxy:
        if proxy.name == "busy" and conflicts["left"] > 0:
            conflicts["left"] -= 1
            raise Conflict("409: the object has been modified")
        return original(proxy)

    store.replace_status = replace_status  # type: ignore[method-assign]
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    reports = [rec.sweep() for _ in range(5)]
    assert all(r.ok for r in reports)
    assert store.get("good").status["phase"] == "Ready"
    assert "crawlers/busy" in reports[0].proxies_failed
    assert store.get("busy").status["phase"] == "Ready"  # retried next sweep, and it got through
    assert len(runner.instances) == 2  # and never a duplicate instance


def test_a_proxy_deleted_between_list_and_write_fails_nothing(config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    store.add("good", GOOD)
    store.add("vanishing", GOOD)
    original = store.list_proxies

    def list_then_delete() -> tuple[list[Proxy], str]:
        listed = original()
        store.objects.pop(("crawlers", "vanishing"), None)
        return listed

    store.list_proxies = list_then_delete  # type: ignore[method-assign]
    report = sweep(store, runner, config).sweep()
    assert report.ok and report.proxies_failed == {}
    assert store.get("good").status["phase"] == "Ready"


def test_one_invalid_provider_section_fails_only_its_own_proxies(config: Path) -> None:
    store = MemoryStore()
    runner = FakeRunner(invalid_providers={"cluster": ["providers[1].kubernetes.namespace: 'Egress' is invalid"]})
    store.add("kvm-1", GOOD)
    store.add("k8s-1", {"provider": "cluster"})
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    report = rec.sweep()
    assert report.ok and not report.clean
    assert report.config_errors == ["providers[1].kubernetes.namespace: 'Egress' is invalid"]
    assert set(report.providers_failed) == {"cluster"}
    assert store.get("kvm-1").status["phase"] == "Ready"
    k8s = store.get("k8s-1")
    assert k8s.status["phase"] == "Failed"
    assert k8s.status["conditions"][0]["reason"] == "ProviderConfigInvalid"
    assert "providers[1].kubernetes.namespace" in k8s.status["conditions"][0]["message"]
    assert {call.provider for call in runner.calls if call.verb != "check"} == {"home-kvm"}  # never listed


def test_the_config_is_checked_again_only_when_it_changes(config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    rec.sweep()
    rec.sweep()
    assert [c.verb for c in runner.calls].count("check") == 1
    config.write_text(config.read_text() + "\n# edited\n")
    rec.sweep()
    assert [c.verb for c in runner.calls].count("check") == 2


def test_a_failed_listing_keeps_ready_proxies_ready_for_a_bounded_time(config: Path) -> None:
    store, runner = MemoryStore(), FakeRunner()
    store.add("eu-1", GOOD)
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    rec.sweep()
    # The host holding the instance cannot be listed: the partial listing does not show it.
    hidden = dict(runner.instances)
    runner.instances.clear()
    runner.list_failure = ("transient", "libvirtd is restarting")
    report = rec.sweep()
    assert report.ok and set(report.providers_failed) == {"home-kvm"}
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Ready" and [p.key for p in rec.discovery.swept] == ["crawlers/eu-1"]
    listed = next(c for c in saved.status["conditions"] if c["type"] == "ProviderListed")
    assert listed["status"] == "False" and "libvirtd is restarting" in listed["message"]
    # Past the bound it is no longer vouched for.
    listed["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    store.objects[("crawlers", "eu-1")].status = saved.status
    rec.sweep()
    assert store.get("eu-1").status["phase"] == "Provisioning"
    assert rec.discovery.swept == [] and runner.verbs().count("create") == 1  # no create on a failed listing
    runner.instances.update(hidden)
    runner.list_failure = None
    rec.sweep()
    assert store.get("eu-1").status["phase"] == "Ready"


def test_a_running_instance_whose_address_cannot_be_read_keeps_its_address(config: Path) -> None:
    """libvirtd restarted: the domains run on, but their leases/agent answer nothing for a while."""
    store, runner = MemoryStore(), FakeRunner()
    store.add("eu-1", GOOD)
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0)))
    rec.sweep()
    for instance in runner.instances.values():
        instance.update(ip=None, endpoint=None)  # a KVM endpoint is its ip:port
    rec.sweep()
    saved = store.get("eu-1")
    assert saved.status["phase"] == "Ready" and saved.status["ip"] == "192.0.2.10"


# -- the real path: the command, ansible-runner, the modules, libvirt's test driver ----------------


def write_proxy(directory: Path, stem: str, spec: Any, metadata: Any = None) -> None:
    document = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": stem, "namespace": "crawlers"} if metadata is None else metadata, "spec": spec}
    (directory / f"{stem}.yaml").write_text(yaml.safe_dump(document))


def test_once_with_malformed_files_and_a_bad_config_section(tmp_path: Path, testdriver_config: Path,
                                                           libvirt_test: LibvirtTestDaemon) -> None:
    """The table's first rows through the real command: every malformed file fails alone, the
    good Proxy goes Ready in the same sweep, an invalid provider section beside the good one
    fails only its Proxies, --once exits 1 without a traceback, --check-config lists every error,
    and a relative --provider-config works."""
    proxies = tmp_path / "proxies"
    proxies.mkdir()
    document = yaml.safe_load(testdriver_config.read_text())
    document["providers"].append({"name": "cluster", "type": "kubernetes",
                                  "kubernetes": {"namespace": "Egress", "image": "squid:6"}})
    (tmp_path / "providers.yaml").write_text(yaml.safe_dump(document))
    good = {"provider": "lab", "cloudInit": "#cloud-config\n"}
    write_proxy(proxies, "good", good)
    write_proxy(proxies, "port-abc", {**good, "port": "abc"})
    write_proxy(proxies, "port-zero", {**good, "port": 0})
    write_proxy(proxies, "cloudinit-number", {**good, "cloudInit": 12345})
    write_proxy(proxies, "spec-list", ["provider", "lab"])
    write_proxy(proxies, "metadata-string", good, metadata="eu-1")
    write_proxy(proxies, "gzip", {**good, "cloudInitEncoding": "gzip"})
    write_proxy(proxies, "on-the-bad-provider", {"provider": "cluster"})
    (proxies / "location-date.yaml").write_text(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: location-date, namespace: crawlers}\n"
        "spec: {provider: lab, location: 2024-01-01}\n")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
    command = [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", "proxies", "--provider-config",
               "providers.yaml", "--work-dir", str(tmp_path / "work")]
    once = subprocess.run([*command, "--once"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert once.returncode == 1, once.stderr
    assert "Traceback" not in once.stderr, once.stderr

    def status(stem: str) -> dict[str, Any]:
        state = yaml.safe_load((proxies / f"{stem}.status.yaml").read_text())
        return dict(state["status"])

    assert status("good")["phase"] == "Ready"
    for stem, path in (("port-abc", "spec.port"), ("port-zero", "spec.port"), ("cloudinit-number", "spec.cloudInit"),
                       ("gzip", "spec.cloudInitEncoding"), ("location-date", "spec.location")):
        assert status(stem)["phase"] == "Failed", stem
        assert path in status(stem)["conditions"][0]["message"], (stem, status(stem))
    for stem in ("spec-list", "metadata-string"):
        assert f"{stem}.yaml" in once.stderr or (proxies / f"{stem}.status.yaml").exists() is False, once.stderr
    bad_provider = status("on-the-bad-provider")
    assert bad_provider["phase"] == "Failed" and bad_provider["conditions"][0]["reason"] == "ProviderConfigInvalid"
    assert "providers[1].kubernetes.namespace" in bad_provider["conditions"][0]["message"]
    assert {d.name() for d in libvirt_test.connection.listAllDomains()} - {"test"} != set()

    check = subprocess.run([*command, "--check-config"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300, check=False)
    assert check.returncode == 1, check.stderr
    assert "provider lab (kvm): ok" in check.stdout and "provider cluster (kubernetes): INVALID" in check.stdout
    assert "providers[1].kubernetes.namespace" in check.stdout


@pytest.mark.usefixtures("libvirt_test")
def test_kubernetes_source_with_a_cr_stored_before_the_schema_tightened(
        kube: KubeEmulator, api: client.ApiClient, testdriver_config: Path, tmp_path: Path) -> None:
    kube.create_namespace("crawlers")
    objects = client.CustomObjectsApi(api)
    good = {"provider": "lab", "cloudInit": "#cloud-config\n"}
    objects.create_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": "good", "namespace": "crawlers"},
        "spec": good})
    kube.store_unvalidated({"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                            "metadata": {"name": "old", "namespace": "crawlers"}, "spec": {**good, "port": "abc"}})
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", collections_path())
    runner = RecordingRunner(AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=2))
    report = Reconciler(KubeStore(api), runner, str(testdriver_config), parts=SweepParts(backoff=Backoff())).sweep()
    assert report.ok and set(report.proxies_failed) == {"crawlers/old"}

    def read(name: str) -> dict[str, Any]:
        found = objects.get_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, name)
        assert isinstance(found, dict)
        return found

    assert read("good")["status"]["phase"] == "Ready"
    old = read("old")["status"]
    assert old["phase"] == "Failed" and "spec.port: must be an integer 1024-65535" in old["conditions"][0]["message"]
