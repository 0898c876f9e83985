"""The controller end to end: the Kubernetes API emulator, the real ansible-runner, the real
KVM modules, and libvirt's test driver served by a libvirtd.

Every path here goes through the real edges; sweep/test_reconcile.py pins the same decisions
with fakes, including the failure combinations no real backend produces on demand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from egress_proxies.health import SweepHealth
from egress_proxies.leader import LeaseElector
from egress_proxies.loop import Controller, LoopSettings
from egress_proxies.providers.runner import AnsibleRunner, run_temp_dir
from egress_proxies.resources.proxy import FINALIZER, GROUP, PLURAL, VERSION
from egress_proxies.serving.credentials import Credentials
from egress_proxies.sources.kube import KubeLeases, KubeSecrets, KubeStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts
from support.collection.modules import collections_path, run_module
from support.collection.provider_config import OWNER, BaseImage, kvm_host, write_kvm_config
from support.controller.fakes import RecordingRunner
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator
from support.waiting import wait_for

POOL = "default-pool"
NAMESPACE = "crawlers"


@pytest.fixture(autouse=True)
def namespace(kube: KubeEmulator) -> None:
    """The namespace the Proxies live in (the API refuses objects in a missing one)."""
    kube.create_namespace(NAMESPACE)


@pytest.fixture
def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest.fixture
def config(testdriver_config: Path) -> Path:
    return testdriver_config


@pytest.fixture
def runner(tmp_path: Path) -> RecordingRunner:
    os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", collections_path())
    return RecordingRunner(AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=2))


def make_reconciler(api: client.ApiClient, runner: RecordingRunner, config: Path,
                    **settings: Any) -> Reconciler:
    return Reconciler(KubeStore(api), runner, str(config), ReconcileSettings(**settings),
                      parts=SweepParts(backoff=Backoff()))


def create_proxy(objects: client.CustomObjectsApi, name: str, spec: dict[str, Any],
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}}, "spec": spec}
    created = objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    assert isinstance(created, dict)
    return created


def read_proxy(objects: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        found = objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    assert isinstance(found, dict)
    return found


def delete_proxy(objects: client.CustomObjectsApi, name: str) -> None:
    objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)


def domains(daemon: LibvirtTestDaemon) -> set[str]:
    return {d.name() for d in daemon.connection.listAllDomains()} - {"test"}


def event_reasons(api: client.ApiClient, name: str) -> list[str]:
    events = client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items
    ordered = sorted(events, key=lambda e: int(e.metadata.resource_version or 0))
    return [str(e.reason) for e in ordered if e.involved_object.name == name]


SQUID = {"provider": "lab", "cloudInit": "#cloud-config\npackages: [squid]\n"}


def test_create_then_replace_make_before_break(api: client.ApiClient, objects: client.CustomObjectsApi,
                                               runner: RecordingRunner, config: Path,
                                               libvirt_test: LibvirtTestDaemon) -> None:
    create_proxy(objects, "eu-1", SQUID)
    reconciler = make_reconciler(api, runner, config)
    assert reconciler.sweep().ok
    proxy = read_proxy(objects, "eu-1")
    assert proxy is not None
    assert FINALIZER in proxy["metadata"]["finalizers"]
    status = proxy["status"]
    assert status["phase"] == "Ready"
    assert status["ip"] and status["endpoint"] == f"{status['ip']}:3128"
    assert status["conditions"][0]["type"] == "Ready" and status["conditions"][0]["status"] == "True"
    first = status["providerID"]
    assert domains(libvirt_test) == {first.rsplit("/", 1)[1]}
    assert runner.verbs() == ["list", "create"]

    proxy["spec"]["port"] = 8080
    objects.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "eu-1", proxy)
    runner.calls.clear()
    assert reconciler.sweep().ok
    assert runner.verbs() == ["list", "create", "delete"]  # the successor first, then the old one
    (_, _, retired), = [call for call in runner.calls if call[1] == "delete"]
    assert retired[0].args["provider_id"] == first
    replaced = read_proxy(objects, "eu-1")
    assert replaced is not None
    assert replaced["status"]["providerID"] != first
    assert replaced["status"]["endpoint"].endswith(":8080")
    assert replaced["status"]["observedGeneration"] == replaced["metadata"]["generation"] == 2
    assert domains(libvirt_test) == {replaced["status"]["providerID"].rsplit("/", 1)[1]}
    assert event_reasons(api, "eu-1") == ["Created", "Replacing", "Replaced"]

    runner.calls.clear()
    assert reconciler.sweep().ok
    assert runner.verbs() == ["list"]  # steady state: one runner call for the provider


def test_delete_a_ready_proxy_removes_its_instance(api: client.ApiClient, objects: client.CustomObjectsApi,
                                                   runner: RecordingRunner, config: Path,
                                                   libvirt_test: LibvirtTestDaemon) -> None:
    create_proxy(objects, "eu-1", SQUID)
    reconciler = make_reconciler(api, runner, config)
    reconciler.sweep()
    delete_proxy(objects, "eu-1")
    kept = read_proxy(objects, "eu-1")
    assert kept is not None and kept["metadata"]["deletionTimestamp"]  # held by our finalizer
    reconciler.sweep()
    assert read_proxy(objects, "eu-1") is None
    assert domains(libvirt_test) == set()
    assert "Deleted" in event_reasons(api, "eu-1")


def with_finalizer_and_status(objects: client.CustomObjectsApi, name: str, spec: dict[str, Any],
                              status: dict[str, Any], annotations: dict[str, str] | None = None) -> None:
    proxy = create_proxy(objects, name, spec, annotations)
    proxy["metadata"]["finalizers"] = [FINALIZER]
    replaced = objects.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, proxy)
    assert isinstance(replaced, dict)
    if status:
        replaced["status"] = status
        objects.replace_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, PLURAL, name, replaced)


def test_delete_without_provider_id_releases_at_once(api: client.ApiClient, objects: client.CustomObjectsApi,
                                                     runner: RecordingRunner, config: Path) -> None:
    with_finalizer_and_status(objects, "eu-1", SQUID, {})
    delete_proxy(objects, "eu-1")
    make_reconciler(api, runner, config).sweep()
    assert read_proxy(objects, "eu-1") is None
    assert runner.verbs() == ["list"]


def test_skip_cleanup_releases_with_the_provider_gone_from_the_config(
        api: client.ApiClient, objects: client.CustomObjectsApi, runner: RecordingRunner, config: Path) -> None:
    with_finalizer_and_status(objects, "eu-1", {"provider": "removed"},
                              {"providerID": "kvm://hosts/h1/domains/abandoned"},
                              {"crawl.example.com/skip-cleanup": "true"})
    delete_proxy(objects, "eu-1")
    make_reconciler(api, runner, config).sweep()
    assert read_proxy(objects, "eu-1") is None
    assert all(provider == "lab" for provider, verb, _ in runner.calls if verb != "check")  # never "removed"
    assert runner.verbs() == ["list"]
    assert event_reasons(api, "eu-1") == ["Abandoned"]


def test_provider_gone_from_the_config_holds_the_delete_with_a_permanent_condition(
        api: client.ApiClient, objects: client.CustomObjectsApi, runner: RecordingRunner, config: Path) -> None:
    with_finalizer_and_status(objects, "eu-1", {"provider": "removed"},
                              {"providerID": "kvm://hosts/h1/domains/somewhere"})
    delete_proxy(objects, "eu-1")
    make_reconciler(api, runner, config).sweep()
    proxy = read_proxy(objects, "eu-1")
    assert proxy is not None
    condition = proxy["status"]["conditions"][0]
    assert condition["reason"] == "ProviderNotConfigured"
    assert "skip-cleanup" in condition["message"]


def test_delete_when_the_instance_is_already_gone_releases(api: client.ApiClient, objects: client.CustomObjectsApi,
                                                           runner: RecordingRunner, config: Path,
                                                           libvirt_test: LibvirtTestDaemon) -> None:
    create_proxy(objects, "eu-1", SQUID)
    reconciler = make_reconciler(api, runner, config)
    reconciler.sweep()
    (name,) = domains(libvirt_test)
    domain = libvirt_test.connection.lookupByName(name)
    domain.destroy()
    domain.undefine()
    delete_proxy(objects, "eu-1")
    runner.calls.clear()
    reconciler.sweep()
    assert read_proxy(objects, "eu-1") is None
    assert runner.verbs() == ["list", "get"]  # Get said not_found: no Delete needed


def test_delete_when_get_is_permanent_deletes_anyway(api: client.ApiClient, objects: client.CustomObjectsApi,
                                                     runner: RecordingRunner, config: Path) -> None:
    # A host removed from the hosts list: Get stays permanent, Delete is a logged no-op.
    with_finalizer_and_status(objects, "eu-1", SQUID, {"providerID": "kvm://hosts/retired/domains/p-eu-1-abc123"})
    delete_proxy(objects, "eu-1")
    make_reconciler(api, runner, config).sweep()
    assert read_proxy(objects, "eu-1") is None
    assert runner.verbs() == ["list", "get", "delete"]


def test_delete_on_a_transient_failure_backs_off(api: client.ApiClient, objects: client.CustomObjectsApi,
                                                 runner: RecordingRunner, tmp_path: Path, image: BaseImage) -> None:
    dead = "test+unix:///default?socket=" + str(tmp_path / "nobody-listens")
    config = write_kvm_config(tmp_path / "dead.yaml", [kvm_host("h1", dead, pool=POOL)], image)
    with_finalizer_and_status(objects, "eu-1", SQUID, {"providerID": "kvm://hosts/h1/domains/p-eu-1-abc123"})
    delete_proxy(objects, "eu-1")
    # A base far above a sweep's duration: on a loaded machine the second sweep's listing alone
    # took longer than the default 5 s (-20 % jitter), so the backoff had already run out.
    reconciler = Reconciler(KubeStore(api), runner, str(config), ReconcileSettings(),
                            parts=SweepParts(backoff=Backoff(base_seconds=120.0)))
    reconciler.sweep()
    proxy = read_proxy(objects, "eu-1")
    assert proxy is not None
    condition = proxy["status"]["conditions"][0]
    assert condition["reason"] == "DeleteFailed" and condition["message"].startswith("transient:")
    reconciler.sweep()
    assert runner.verbs().count("get") == 1  # backing off, not hammering a dead host


def test_gc_deletes_an_orphan_and_spares_foreign_instances(api: client.ApiClient, runner: RecordingRunner,
                                                           config: Path, libvirt_test: LibvirtTestDaemon,
                                                           tmp_path: Path) -> None:
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    run_module("kvm_proxy", {**base, "name": "orphan", "tags": {
        "crawl.example.com/owner": OWNER, "crawl.example.com/uid": "uid-of-a-deleted-proxy",
        "crawl.example.com/proxy": f"{NAMESPACE}/gone"}})
    run_module("kvm_proxy", {**base, "name": "foreign", "tags": {
        "crawl.example.com/owner": "another-cluster", "crawl.example.com/uid": "whatever"}})
    report = make_reconciler(api, runner, config, gc_grace_seconds=0).sweep()
    assert report.gc == ["kvm://hosts/h1/domains/orphan"]
    assert domains(libvirt_test) == {"foreign"}
    assert event_reasons(api, "gone") == ["GarbageCollected"]


def test_gc_does_nothing_when_a_location_fails(api: client.ApiClient, runner: RecordingRunner,
                                               libvirt_test: LibvirtTestDaemon, tmp_path: Path,
                                               image: BaseImage) -> None:
    dead = "test+unix:///default?socket=" + str(tmp_path / "nobody-listens")
    config = write_kvm_config(tmp_path / "providers.yaml",
                              [kvm_host("h1", libvirt_test.uri, pool=POOL), kvm_host("h2", dead, pool=POOL)], image)
    run_module("kvm_proxy", {"provider_config": str(config), "provider": "lab", "name": "orphan", "location": "h1",
                             "image_cache_dir": str(tmp_path / "cache"),
                             "tags": {"crawl.example.com/owner": OWNER, "crawl.example.com/uid": "deleted"}})
    report = make_reconciler(api, runner, config, gc_grace_seconds=0).sweep()
    assert report.gc == []
    assert domains(libvirt_test) == {"orphan"}


def kubeconfig(kube: KubeEmulator, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": kube.url}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "nobody"}}]}))
    return path


def test_controller_killed_mid_create_leaves_exactly_one_instance(
        kube: KubeEmulator, api: client.ApiClient, objects: client.CustomObjectsApi, config: Path,
        libvirt_test: LibvirtTestDaemon, tmp_path: Path) -> None:
    create_proxy(objects, "eu-1", SQUID)
    kube.create_namespace("egress-proxies")  # the controller's own: its Lease and the credentials' Secrets
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
    controller = subprocess.Popen(
        [str(Path(sys.executable).parent / "egress-proxies"), "--source", "kubernetes", "--kubeconfig",
         str(kubeconfig(kube, tmp_path / "kubeconfig")), "--provider-config", str(config), "--work-dir",
         str(tmp_path / "killed"), "--once"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Kill the whole controller (runner and module included) the moment the domain exists.
        wait_for(lambda: bool(domains(libvirt_test)), 60, "the domain to be defined")
        os.killpg(controller.pid, signal.SIGKILL)
    finally:
        controller.wait(timeout=30)
    killed = domains(libvirt_test)
    temp_dirs = list(filter(None, map(run_temp_dir, (tmp_path / "killed" / "runs").iterdir())))
    # The restarted controller, with the work dir and the credential store the killed one used: its
    # runner removes the killed run's leftovers, the temp dir outside the work dir included.
    runner = AnsibleRunner(tmp_path / "killed", timeout_seconds=120, max_concurrent=2)
    assert list((tmp_path / "killed" / "runs").iterdir()) == []
    assert not [path for path in temp_dirs if path.exists()]
    restarted = Reconciler(KubeStore(api), runner, str(config),
                           parts=SweepParts(backoff=Backoff(),
                                            credentials=Credentials(KubeSecrets(api, "egress-proxies"))))
    restarted.sweep()
    restarted.sweep()
    assert domains(libvirt_test) == killed and len(killed) == 1  # found again, never made twice
    proxy = read_proxy(objects, "eu-1")
    assert proxy is not None and proxy["status"]["phase"] == "Ready"
    assert proxy["status"]["providerID"].endswith("/" + next(iter(domains(libvirt_test))))


def test_a_watch_event_triggers_a_prompt_sweep(api: client.ApiClient, objects: client.CustomObjectsApi,
                                               runner: RecordingRunner, config: Path) -> None:
    store = KubeStore(api)
    controller = Controller(Reconciler(store, runner, str(config)), store, SweepHealth(3600),
                            LoopSettings(interval_seconds=3600, debounce_seconds=0.1, watch_timeout_seconds=5))
    thread = threading.Thread(target=controller.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: controller.sweeps >= 1, 60, "the first sweep")
        create_proxy(objects, "eu-1", SQUID)
        # With an hour between sweeps, only the watch can make this happen in time.
        wait_for(lambda: ((read_proxy(objects, "eu-1") or {}).get("status") or {}).get("phase") == "Ready", 60,
                 "the Proxy to become Ready")
    finally:
        controller.stop()
        thread.join(timeout=60)


def test_leader_election_hands_over_when_the_leader_stops(kube: KubeEmulator, api: client.ApiClient,
                                                          runner: RecordingRunner, config: Path) -> None:
    kube.create_namespace("egress-proxies")  # where the Lease lives (controller/manifests/namespace.yaml)

    def controller(identity: str) -> Controller:
        store = KubeStore(api)
        elector = LeaseElector(KubeLeases(api), "egress-proxies", "leader", identity, lease_seconds=2,
                               renew_seconds=0.2)
        return Controller(Reconciler(store, runner, str(config)), store, SweepHealth(3600),
                          LoopSettings(interval_seconds=0.2, watch=False, renew_seconds=0.2), elector=elector)

    first, second = controller("first"), controller("second")
    threads = [threading.Thread(target=c.run, daemon=True) for c in (first, second)]
    threads[0].start()
    wait_for(lambda: first.sweeps >= 1, 60, "the first controller to lead and sweep")
    threads[1].start()
    time.sleep(1.0)
    assert second.sweeps == 0  # a standby never sweeps
    first.stop()
    threads[0].join(timeout=60)
    try:
        wait_for(lambda: second.sweeps >= 1, 30, "the standby to take over")
    finally:
        second.stop()
        threads[1].join(timeout=60)
