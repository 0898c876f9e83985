"""The modules' batch form (``operations`` on ``P_proxy``, ``provider_ids`` on ``P_proxy_info``)
through ansible-runner: KVM on libvirt's test driver (served by a libvirtd), Kubernetes on the
API emulator, and the controller's ``ProviderClient`` on top of both.

What only a real module run proves: one run answers every item in order with its own
``error_class``, a failing item leaves the others alone, each item is idempotent and honours
check mode, and a run opens one libvirt connection per host however many items it has. The
connections are counted by libvirt itself: the module's libvirt client library writes its
public-API debug log (``LIBVIRT_LOG_OUTPUTS``, inherited through ansible-runner by the module
process), one ``virConnectOpen`` line per connection opened.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egress_proxies.providers.client import CreateRequest, ProviderClient, ProviderType, Target
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.runner import AnsibleRunner
from support.collection.modules import ModuleRun, collections_path, run_module
from support.collection.provider_config import (
    OWNER,
    OWNER_TAGS,
    BaseImage,
    kvm_host,
    write_kubeconfig,
    write_kubernetes_config,
    write_kvm_config,
)
from support.compute.emulator import ComputeEmulator
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator

POOL = "default-pool"  # the test driver's built-in pool
SECRET_USER_DATA = "#cloud-config\nwrite_files: [{path: /etc/squid/passwd, content: 'crawler:s3cr3t-hash'}]\n"
# libvirt.open() in the module; a daemon started under the same environment logs its own
# internal connection to the driver as virConnectOpenAuth, which is not counted.
CONNECT_LINE = re.compile(r": virConnectOpen:\d+ : name=")


def kvm(config: Path, tmp_path: Path, module: str = "kvm_proxy", check_mode: bool = False,
        **args: Any) -> ModuleRun:
    base: dict[str, Any] = {"provider_config": str(config), "provider": "lab"}
    if module == "kvm_proxy":
        base["image_cache_dir"] = str(tmp_path / "cache")
    return run_module(module, {**base, **args}, check_mode=check_mode)


def our_domains(daemon: LibvirtTestDaemon) -> set[str]:
    return {d.name() for d in daemon.connection.listAllDomains()} - {"test"}


def create(name: str, key: str = "", **extra: Any) -> dict[str, Any]:
    """A create item of ``operations``."""
    return {"name": name, "tags": OWNER_TAGS, "key": key or f"uid-{name}", **extra}


def single(name: str) -> dict[str, Any]:
    """The single-instance options creating ``name``."""
    return {"name": name, "tags": OWNER_TAGS}


@pytest.fixture
def libvirt_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the modules' libvirt client library logs its public API calls (connections opened)."""
    path = tmp_path / "libvirt-client.log"
    monkeypatch.setenv("LIBVIRT_LOG_OUTPUTS", f"1:file:{path}")
    monkeypatch.setenv("LIBVIRT_LOG_FILTERS", "1:libvirt 4:*")
    return path


def connections_opened(log: Path) -> list[str]:
    """The URIs of every libvirt connection opened since the log was last cleared."""
    if not log.exists():
        return []
    return [line.split("name=", 1)[1].strip() for line in log.read_text().splitlines() if CONNECT_LINE.search(line)]


# -- KVM ------------------------------------------------------------------------------------------


def test_kvm_batch_answers_every_item_in_order_and_one_failure_stays_its_own(
        testdriver_config: Path, tmp_path: Path, libvirt_test: LibvirtTestDaemon, libvirt_log: Path) -> None:
    old = kvm(testdriver_config, tmp_path, **single("old-1")).result["provider_id"]
    libvirt_log.unlink()

    items = [create("new-1"), create("bad-1", image="windows-95"),
             {"state": "absent", "provider_id": old, "key": "k-old"},
             create("new-2", user_data=SECRET_USER_DATA), {"state": "absent", "name": "never-was", "key": "k-none"},
             {"state": "absent", "provider_id": "kvm://hosts/h1/vms/x", "key": "k-malformed"}]
    batch = kvm(testdriver_config, tmp_path, operations=items)

    assert batch.status == "successful", batch.result  # every item was tried
    results = batch.result["results"]
    assert [r["key"] for r in results] == [i["key"] for i in items]
    assert [r["ok"] for r in results] == [True, False, True, True, True, False]
    assert [r["changed"] for r in results] == [True, False, True, True, False, False]
    assert batch.result["changed"] is True
    new_1, bad, deleted, new_2, never, malformed = results
    assert new_1["provider_id"] == "kvm://hosts/h1/domains/new-1" and new_1["instance"]["state"] == "running"
    assert new_1["error_class"] is None and new_1["msg"] == ""
    assert bad["error_class"] == "permanent" and bad["instance"] is None
    assert bad["msg"].startswith("operations[1]: ") and "image" in bad["msg"]
    assert deleted["provider_id"] == old and never["provider_id"] == "kvm://hosts/h1/domains/never-was"
    assert malformed["error_class"] == "permanent" and "operations[5]: provider_id" in malformed["msg"]
    assert new_2["instance"]["tags"] == OWNER_TAGS
    assert "s3cr3t-hash" not in repr(batch.result)  # user-data is no_log in every item too
    assert our_domains(libvirt_test) == {"new-1", "new-2"}
    # Six items, one host: one connection, opened once for the whole run.
    assert connections_opened(libvirt_log) == [libvirt_test.uri]


def test_kvm_batch_items_are_idempotent_and_honour_check_mode(
        testdriver_config: Path, tmp_path: Path, libvirt_test: LibvirtTestDaemon) -> None:
    kvm(testdriver_config, tmp_path, **single("keep-1"))
    doomed = kvm(testdriver_config, tmp_path, **single("gone-1")).result["provider_id"]
    items = [create("plan-1"), create("keep-1"), {"state": "absent", "provider_id": doomed, "key": "k-del"}]

    planned = kvm(testdriver_config, tmp_path, check_mode=True, operations=items)
    assert planned.status == "successful", planned.result
    assert [(r["ok"], r["changed"]) for r in planned.result["results"]] == [(True, True), (True, False), (True, True)]
    assert planned.result["results"][0]["instance"]["state"] == "pending"
    assert our_domains(libvirt_test) == {"keep-1", "gone-1"}  # check mode wrote nothing

    done = kvm(testdriver_config, tmp_path, operations=items)
    assert [(r["ok"], r["changed"]) for r in done.result["results"]] == [(True, True), (True, False), (True, True)]
    assert our_domains(libvirt_test) == {"plan-1", "keep-1"}

    again = kvm(testdriver_config, tmp_path, operations=items)
    assert [(r["ok"], r["changed"]) for r in again.result["results"]] == [(True, False)] * 3
    assert again.result["results"][0]["provider_id"] == done.result["results"][0]["provider_id"]
    assert our_domains(libvirt_test) == {"plan-1", "keep-1"}


def test_kvm_items_naming_one_instance_run_in_their_order(
        testdriver_config: Path, tmp_path: Path, libvirt_test: LibvirtTestDaemon) -> None:
    items = [create("twice-1"), {"state": "absent", "name": "twice-1"}, create("twice-1", key="again"),
             create("other-1")]
    batch = kvm(testdriver_config, tmp_path, operations=items)
    assert [(r["ok"], r["changed"]) for r in batch.result["results"]] == [(True, True)] * 4, batch.result
    assert our_domains(libvirt_test) == {"twice-1", "other-1"}


def test_kvm_batch_opens_one_connection_per_host_and_spreads_its_creates(
        tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage, libvirt_log: Path) -> None:
    with LibvirtTestDaemon() as second:
        config = write_kvm_config(
            tmp_path / "providers.yaml",
            [kvm_host("h1", libvirt_test.uri, pool=POOL), kvm_host("h2", second.uri, pool=POOL)], image)
        batch = kvm(config, tmp_path, operations=[create(f"p-{n}") for n in range(8)])
        assert batch.status == "successful", batch.result
        assert all(r["ok"] for r in batch.result["results"]), batch.result
        # Items placed side by side still spread: the run counts each host once and adds its own.
        assert Counter(r["instance"]["location"] for r in batch.result["results"]) == {"h1": 4, "h2": 4}
        assert len(our_domains(libvirt_test)) == 4 and len(our_domains(second)) == 4
        assert sorted(connections_opened(libvirt_log)) == sorted([libvirt_test.uri, second.uri])

        # Deleting by name without a location looks on every host; one connection each again.
        libvirt_log.unlink()
        gone = kvm(config, tmp_path, operations=[{"state": "absent", "name": f"p-{n}"} for n in range(8)])
        assert [r["changed"] for r in gone.result["results"]] == [True] * 8, gone.result
        assert our_domains(libvirt_test) == set() and our_domains(second) == set()
        assert sorted(connections_opened(libvirt_log)) == sorted([libvirt_test.uri, second.uri])


def test_kvm_a_host_that_cannot_be_reached_fails_only_its_items(
        tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage) -> None:
    config = write_kvm_config(
        tmp_path / "providers.yaml",
        [kvm_host("h1", libvirt_test.uri, pool=POOL),
         kvm_host("down", f"test+unix:///default?socket={tmp_path / 'no-such-socket'}", pool=POOL)], image)
    batch = kvm(config, tmp_path, operations=[create("on-h1", location="h1"), create("on-down", location="down"),
                                              {"state": "absent", "provider_id": "kvm://hosts/down/domains/x"}])
    assert batch.status == "successful", batch.result
    ok, down, delete_down = batch.result["results"]
    assert ok["ok"] and ok["provider_id"] == "kvm://hosts/h1/domains/on-h1"
    for failed in (down, delete_down):
        assert failed["ok"] is False and failed["error_class"] == "transient"
        assert "down" in failed["msg"]
    assert our_domains(libvirt_test) == {"on-h1"}


def test_kvm_a_whole_run_problem_fails_the_run_with_its_class(testdriver_config: Path) -> None:
    batch = run_module("kvm_proxy", {"provider_config": str(testdriver_config), "provider": "nope",
                                     "operations": [create("a-1")]})
    assert batch.failed and batch.result["error_class"] == "permanent"
    assert "results" not in batch.result


def test_kvm_operations_exclude_the_single_instance_options(testdriver_config: Path, tmp_path: Path) -> None:
    mixed = kvm(testdriver_config, tmp_path, name="a-1", operations=[create("a-2")])
    assert mixed.failed and "mutually exclusive" in mixed.result["msg"]


@pytest.mark.usefixtures("libvirt_test")
def test_kvm_single_form_deletes_by_name(testdriver_config: Path, tmp_path: Path,
                                         libvirt_test: LibvirtTestDaemon) -> None:
    kvm(testdriver_config, tmp_path, **single("by-name"))
    deleted = kvm(testdriver_config, tmp_path, state="absent", name="by-name")
    assert deleted.status == "successful", deleted.result
    assert deleted.result["changed"] is True
    assert deleted.result["provider_id"] == "kvm://hosts/h1/domains/by-name"
    assert our_domains(libvirt_test) == set()
    again = kvm(testdriver_config, tmp_path, state="absent", name="by-name", location="h1")
    assert again.status == "successful" and again.result["changed"] is False
    neither = kvm(testdriver_config, tmp_path, state="absent")
    assert neither.failed and neither.result["error_class"] == "permanent" and "provider_id" in neither.result["msg"]


def test_kvm_info_looks_up_many_in_one_run(testdriver_config: Path, tmp_path: Path,
                                           libvirt_log: Path) -> None:
    there = kvm(testdriver_config, tmp_path, **single("there-1")).result["provider_id"]
    libvirt_log.unlink()
    looked = kvm(testdriver_config, tmp_path, module="kvm_proxy_info",
                 provider_ids=[there, "kvm://hosts/h1/domains/missing", "kvm://hosts/elsewhere/domains/x"])
    assert looked.status == "successful", looked.result
    found, missing, unconfigured = looked.result["results"]
    assert found["ok"] and found["instance"]["provider_id"] == there and found["instance"]["ip"]
    assert missing["ok"] is False and missing["error_class"] == "not_found"
    assert missing["msg"].startswith("provider_ids[1]: ")
    assert unconfigured["error_class"] == "permanent"  # never not_found: see kvm_proxy_info
    assert len(connections_opened(libvirt_log)) == 1


# -- the controller's client on the batch form ----------------------------------------------------


def test_provider_client_runs_a_batch_as_one_module_run(testdriver_config: Path, tmp_path: Path,
                                                         libvirt_test: LibvirtTestDaemon) -> None:
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=300, max_concurrent=1,
                           collections_path=collections_path())
    client = ProviderClient(runner, str(testdriver_config), "lab", ProviderType.KVM)
    encoded = "I2Nsb3VkLWNvbmZpZwo="  # "#cloud-config\n"
    requests = [CreateRequest(key=f"uid-{n}", name=f"c-{n}", user_data_base64=encoded, port=3128,
                              tags=OWNER_TAGS) for n in range(3)]
    requests.append(CreateRequest(key="uid-bad", name="c-bad", user_data_base64=encoded, port=3128,
                                  tags=OWNER_TAGS, machine_type="huge"))
    created = client.create(requests)
    assert [r.ok for r in created] == [True, True, True, False]
    assert created[3].error is not None and created[3].error.error_class is ErrorClass.PERMANENT
    assert [r.instance.name for r in created[:3] if r.instance] == ["c-0", "c-1", "c-2"]
    # One module run for the batch: one artifact directory, indexed under every item's key.
    assert len(list((tmp_path / "work" / "artifacts").iterdir())) == 1

    targets = [Target(key=f"uid-{n}", provider_id=f"kvm://hosts/h1/domains/c-{n}") for n in range(3)]
    got = client.get([*targets, Target(key="uid-x", provider_id="kvm://hosts/h1/domains/nope")])
    assert [r.ok for r in got] == [True, True, True, False]
    assert got[3].error is not None and got[3].error.error_class is ErrorClass.NOT_FOUND

    deleted = client.delete(targets)
    assert [(r.ok, r.changed) for r in deleted] == [(True, True)] * 3
    assert our_domains(libvirt_test) == set()
    # Purging one Proxy's artifacts finds every run that acted for it, batch or not.
    assert runner.purge_artifacts({"uid-1"}) == 3

    # A whole-run failure fails every item with the run's class.
    broken = ProviderClient(runner, str(testdriver_config), "nope", ProviderType.KVM)
    assert [r.error.error_class if r.error else None for r in broken.delete(targets)] == [ErrorClass.PERMANENT] * 3


# -- Kubernetes -----------------------------------------------------------------------------------

NAMESPACE = "egress"


@pytest.fixture
def kube_config(tmp_path: Path, kube: KubeEmulator) -> Path:
    for namespace in (NAMESPACE, "crawl-b"):
        kube.create_namespace(namespace)
    return write_kubernetes_config(tmp_path / "providers.yaml", write_kubeconfig(tmp_path / "kubeconfig", kube.url),
                                   namespaces=[NAMESPACE, "crawl-b"])


def k8s(config: Path, check_mode: bool = False, **args: Any) -> ModuleRun:
    return run_module("k8s_proxy", {"provider_config": str(config), "provider": "cluster", **args},
                      check_mode=check_mode)


def test_k8s_batch_answers_every_item_and_one_failure_stays_its_own(kube_config: Path, kube: KubeEmulator) -> None:
    old = k8s(kube_config, **single("old-1")).result["provider_id"]
    kube.fail_next("POST", r"/namespaces/crawl-b/pods", 500, message="injected 500")
    items = [create("new-1"), create("new-b", location="crawl-b"), create("bad-1", user_data="#cloud-config\n"),
             {"state": "absent", "provider_id": old, "key": "k-old"}, create("new-2")]
    batch = k8s(kube_config, operations=items)

    assert batch.status == "successful", batch.result
    results = batch.result["results"]
    assert [r["key"] for r in results] == [i["key"] for i in items]
    assert [(r["ok"], r["error_class"]) for r in results] == [
        (True, None), (False, "transient"), (False, "permanent"), (True, None), (True, None)]
    assert "injected 500" in results[1]["msg"] and results[2]["msg"].startswith("operations[2]: user_data")
    assert kube.get_object("pods", NAMESPACE, "new-1") is not None
    assert kube.get_object("pods", NAMESPACE, "new-2") is not None
    assert kube.get_object("pods", "crawl-b", "new-b") is None
    assert kube.get_object("pods", NAMESPACE, "bad-1") is None
    old_pod = kube.get_object("pods", NAMESPACE, "old-1")
    assert old_pod is None or old_pod["metadata"].get("deletionTimestamp")  # deleted (gracefully)


def test_k8s_batch_items_are_idempotent_and_honour_check_mode(kube_config: Path, kube: KubeEmulator) -> None:
    items = [create("pod-1"), create("pod-2", location="crawl-b")]
    planned = k8s(kube_config, check_mode=True, operations=items)
    assert [(r["ok"], r["changed"]) for r in planned.result["results"]] == [(True, True)] * 2, planned.result
    assert kube.get_object("pods", NAMESPACE, "pod-1") is None

    done = k8s(kube_config, operations=items)
    assert [(r["ok"], r["changed"]) for r in done.result["results"]] == [(True, True)] * 2, done.result
    again = k8s(kube_config, operations=items)
    assert [(r["ok"], r["changed"]) for r in again.result["results"]] == [(True, False)] * 2
    assert [r["provider_id"] for r in again.result["results"]] == [
        "k8s://namespaces/egress/pods/pod-1", "k8s://namespaces/crawl-b/pods/pod-2"]


def test_k8s_single_form_deletes_by_name(kube_config: Path) -> None:
    k8s(kube_config, **single("by-name"))
    deleted = k8s(kube_config, state="absent", name="by-name")
    assert deleted.status == "successful", deleted.result
    assert deleted.result["changed"] is True
    assert deleted.result["provider_id"] == "k8s://namespaces/egress/pods/by-name"
    elsewhere = k8s(kube_config, state="absent", name="by-name", location="crawl-b")
    assert elsewhere.status == "successful" and elsewhere.result["changed"] is False


# -- GCP ------------------------------------------------------------------------------------------

GCP_PROJECT = "test-project"
GCP_ZONES = ("europe-west1-b", "europe-west4-a")


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=GCP_PROJECT, zones=GCP_ZONES) as running:
        yield running


@pytest.fixture
def gcp_config(tmp_path: Path, compute: ComputeEmulator) -> Path:
    document = {"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": {
        "project": GCP_PROJECT, "zones": list(GCP_ZONES), "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
        "defaultMachineType": "small", "defaultImage": "debian-12", "apiEndpoint": compute.endpoint}}]}
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def gcp(config: Path, check_mode: bool = False, **args: Any) -> ModuleRun:
    return run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", **args},
                      check_mode=check_mode)


def test_gcp_batch_answers_every_item_and_one_failure_stays_its_own(gcp_config: Path,
                                                                    compute: ComputeEmulator) -> None:
    compute.stock_out(GCP_ZONES[1])
    items = [create("g-1", location=GCP_ZONES[0]), create("g-out", location=GCP_ZONES[1]),
             create("g-2", location=GCP_ZONES[0]), create("g-bad", machine_type="huge")]
    planned = gcp(gcp_config, check_mode=True, operations=items)
    assert [r["changed"] for r in planned.result["results"]] == [True, True, True, False], planned.result
    assert compute.instances == {}

    batch = gcp(gcp_config, operations=items)
    assert batch.status == "successful", batch.result
    results = batch.result["results"]
    assert [(r["ok"], r["error_class"]) for r in results] == [
        (True, None), (False, "transient"), (True, None), (False, "permanent")]
    assert results[3]["msg"].startswith("operations[3]: machine_type")
    assert set(compute.instances) == {(GCP_ZONES[0], "g-1"), (GCP_ZONES[0], "g-2")}

    again = gcp(gcp_config, operations=[items[0], items[2]])
    assert [(r["ok"], r["changed"]) for r in again.result["results"]] == [(True, False)] * 2

    # Deleting by name without a location looks in every configured zone.
    gone = gcp(gcp_config, operations=[{"state": "absent", "name": "g-1"}, {"state": "absent", "name": "g-2"}])
    assert [(r["ok"], r["changed"]) for r in gone.result["results"]] == [(True, True)] * 2, gone.result
    assert compute.instances == {}
