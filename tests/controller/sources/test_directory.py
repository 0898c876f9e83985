"""The directory source: Proxies from YAML files, with what the API server would keep written beside them.

Real files, real flock(2) (a second store in this process and a second process), real
permissions; the reconciler-level tests drive the real Reconciler with the runner fake of
sweep/test_reconcile.py (tests/support/controller/fakes.py).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import egress_proxies
from egress_proxies.resources.proxy import FINALIZER, SKIP_CLEANUP_ANNOTATION, Proxy
from egress_proxies.sources import directory
from egress_proxies.sources.directory import LOCK_NAME, DirectoryLocked, DirectoryStore
from egress_proxies.sources.store import Conflict, StoreError
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.controller.fakes import FakeRunner

CONTROLLER = Path(egress_proxies.__file__).resolve().parents[1]


def write_proxy(directory: Path, stem: str, spec: Any, name: str = "eu-1",
                annotations: dict[str, str] | None = None, mode: int | None = None) -> Path:
    path = directory / f"{stem}.yaml"
    metadata: dict[str, Any] = {"name": name, "namespace": "crawlers"}
    if annotations is not None:
        metadata["annotations"] = annotations
    path.write_text(yaml.safe_dump({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                    "metadata": metadata, "spec": spec}))
    if mode is not None:
        path.chmod(mode)
    return path


def by_name(proxies: list[Proxy]) -> dict[str, Proxy]:
    assert len({p.name for p in proxies}) == len(proxies), [p.key for p in proxies]
    return {p.name: p for p in proxies}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DirectoryStore]:
    with DirectoryStore(tmp_path) as opened:
        yield opened


def test_first_sight_gives_a_lasting_identity(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (first,), _ = store.list_proxies()
    (again,), _ = store.list_proxies()
    assert first.key == "crawlers/eu-1"  # metadata names it, not the file
    assert first.uid == again.uid and first.uid
    assert (tmp_path / "proxy-a.status.yaml").exists()
    assert first.defect is None


def test_a_spec_change_bumps_the_generation(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm", "port": 8080})
    (changed,), _ = store.list_proxies()
    assert changed.generation == proxy.generation + 1


def test_writes_are_optimistic(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (proxy,), _ = store.list_proxies()
    stale = store.get_proxy("crawlers", "eu-1")
    proxy.status = {"phase": "Ready"}
    store.replace_status(proxy)
    stale.status = {"phase": "Failed"}
    with pytest.raises(Conflict):
        store.replace_status(stale)


def test_removing_the_file_deletes_through_the_finalizer(store: DirectoryStore, tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    proxy = store.replace_metadata(proxy)
    path.unlink()
    (deleting,), _ = store.list_proxies()
    assert deleting.deleting and deleting.uid == proxy.uid
    assert deleting.spec == {"provider": "home-kvm"}  # still known, to delete its instance
    deleting.finalizers.remove(FINALIZER)
    store.replace_metadata(deleting)
    assert store.list_proxies()[0] == []
    assert not (tmp_path / "proxy-a.status.yaml").exists()


def test_an_unreadable_file_keeps_the_last_good_spec(store: DirectoryStore, tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm", "port": 3128, "cloudInit": "#cloud-config\n"})
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    path.write_text("spec: [unclosed")  # a typo must not delete it, nor orphan its instance
    (kept,), _ = store.list_proxies()
    assert kept.uid == proxy.uid and not kept.deleting and kept.finalizers == [FINALIZER]
    assert kept.spec == {"provider": "home-kvm", "port": 3128}  # the last good spec, never its user-data
    # It is defective, so the reconciler creates nothing from that partial spec.
    assert kept.defect and str(path) in kept.defect and "not valid YAML" in kept.defect
    kept.status = {"phase": "Failed"}
    store.replace_status(kept)  # its record is sound: the condition is written, the last good spec kept
    state = yaml.safe_load((tmp_path / "proxy-a.status.yaml").read_text())
    assert state["spec"] == {"provider": "home-kvm", "port": 3128} and state["status"] == {"phase": "Failed"}
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm", "port": 3128, "cloudInit": "#cloud-config\n"})
    (fixed,), _ = store.list_proxies()
    assert fixed.uid == proxy.uid and fixed.defect is None and fixed.spec["cloudInit"] == "#cloud-config\n"


def test_a_missing_directory_fails_the_listing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"), DirectoryStore(tmp_path / "nowhere") as store:
        store.list_proxies()


# -- two controllers on one directory (issue 11: "8 instances for 4 Proxies") -------------------


def test_a_second_store_on_the_same_directory_refuses(tmp_path: Path) -> None:
    first = DirectoryStore(tmp_path)
    with pytest.raises(DirectoryLocked) as refused:
        DirectoryStore(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message and f"pid {os.getpid()}" in message and "\n" not in message
    assert "--proxy-dir" in message
    first.close()
    DirectoryStore(tmp_path).close()  # released: the next one takes it


def test_a_second_controller_process_refuses_and_a_killed_holder_frees_the_directory(tmp_path: Path) -> None:
    script = ("import pathlib, sys\n"
              "from egress_proxies.sources.directory import DirectoryLocked, DirectoryStore\n"
              "try:\n"
              "    store = DirectoryStore(pathlib.Path(sys.argv[1]))\n"
              "except DirectoryLocked as error:\n"
              "    sys.stderr.write(f'{error}\\n')\n"
              "    sys.exit(2)\n"
              "print('holding', flush=True)\n"
              "sys.stdin.readline()\n")
    env = {**os.environ, "PYTHONPATH": str(CONTROLLER)}
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        with pytest.raises(DirectoryLocked, match=f"pid {holder.pid} "):
            DirectoryStore(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel must drop the lock
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()
        assert holder.stdin is not None
        holder.stdin.close()
    with DirectoryStore(tmp_path):
        # And the other way round: while this process holds it, another process is refused.
        refused = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                                 env=env, timeout=60, check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"pid {os.getpid()} " in refused.stderr and str(tmp_path) in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_a_directory_created_later_is_locked_by_the_first_listing(tmp_path: Path) -> None:
    later = tmp_path / "later"
    with DirectoryStore(later) as store:
        with pytest.raises(StoreError, match="does not exist"):
            store.list_proxies()
        later.mkdir()
        assert store.list_proxies()[0] == []
        with pytest.raises(DirectoryLocked):
            DirectoryStore(later)


def test_leftover_temporary_files_are_removed_and_the_lock_file_is_no_proxy(tmp_path: Path) -> None:
    leftover = tmp_path / ".proxy-a.status.yaml.k2j3h4.tmp"
    leftover.write_text("cloudInit: secret\n")
    with DirectoryStore(tmp_path) as store:
        assert not leftover.exists()
        assert store.list_proxies()[0] == []
        assert mode_of(tmp_path / LOCK_NAME) == 0o600


# -- renaming a Proxy file (issue 11: "every later sweep fails, forever") ------------------------


def test_renaming_a_proxy_file_is_a_rename(store: DirectoryStore, tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"}, mode=0o600)
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    proxy = store.replace_metadata(proxy)
    proxy.status = {"phase": "Ready", "providerID": "kvm://hosts/h1/domains/p-1"}
    store.replace_status(proxy)

    path.rename(tmp_path / "renamed.yaml")
    (renamed,), _ = store.list_proxies()
    assert renamed.uid == proxy.uid and renamed.key == proxy.key and not renamed.deleting
    assert renamed.finalizers == [FINALIZER] and renamed.status["providerID"] == "kvm://hosts/h1/domains/p-1"
    assert renamed.defect is None
    assert not (tmp_path / "proxy-a.status.yaml").exists()
    assert mode_of(tmp_path / "renamed.status.yaml") == 0o600
    (again,), _ = store.list_proxies()
    assert again.uid == proxy.uid and again.defect is None
    renamed.status = {"phase": "Ready", "providerID": "kvm://hosts/h1/domains/p-1", "ip": "192.0.2.10"}
    store.replace_status(renamed)  # written where the record now lives
    assert yaml.safe_load((tmp_path / "renamed.status.yaml").read_text())["status"]["ip"] == "192.0.2.10"


def test_a_renamed_file_through_sweeps_keeps_its_instance(tmp_path: Path, config: Path) -> None:
    (tmp_path / "proxies").mkdir()
    write_proxy(tmp_path / "proxies", "a", {"provider": "home-kvm", "cloudInit": "#cloud-config\n"})
    with DirectoryStore(tmp_path / "proxies") as proxies:
        runner = FakeRunner()
        reconciler = Reconciler(proxies, runner, str(config), parts=SweepParts(backoff=Backoff()))
        assert reconciler.sweep().ok
        (instance,) = runner.instances
        (tmp_path / "proxies" / "a.yaml").rename(tmp_path / "proxies" / "b.yaml")
        for _ in range(2):
            report = reconciler.sweep()
            assert report.ok and report.created == 0 and report.deleted == 0, report
        assert list(runner.instances) == [instance]
        (proxy,), _ = proxies.list_proxies()
        assert proxy.status["phase"] == "Ready" and proxy.status["providerID"] == instance


def test_a_new_file_name_without_metadata_name_is_a_new_proxy(store: DirectoryStore, tmp_path: Path) -> None:
    path = tmp_path / "eu-1.yaml"
    path.write_text(yaml.safe_dump({"kind": "Proxy", "spec": {"provider": "home-kvm"}}))
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    path.rename(tmp_path / "eu-2.yaml")  # the file name is its name: another Proxy, as on Kubernetes
    proxies = by_name(store.list_proxies()[0])
    assert proxies["eu-1"].deleting and proxies["eu-1"].uid == proxy.uid
    assert not proxies["eu-2"].deleting and proxies["eu-2"].uid != proxy.uid
    assert all(p.defect is None for p in proxies.values())


def test_changing_metadata_name_deletes_the_old_proxy_and_makes_a_new_one(store: DirectoryStore,
                                                                           tmp_path: Path) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, name="eu-1")
    (old,), _ = store.list_proxies()
    old.finalizers.append(FINALIZER)
    store.replace_metadata(old)
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, name="eu-2")
    proxies = by_name(store.list_proxies()[0])
    assert proxies["eu-1"].deleting and proxies["eu-1"].uid == old.uid and proxies["eu-1"].defect is None
    assert not proxies["eu-2"].deleting and proxies["eu-2"].uid != old.uid and proxies["eu-2"].defect is None
    deleting = proxies["eu-1"]
    deleting.finalizers.remove(FINALIZER)
    store.replace_metadata(deleting)  # its instance is gone: released, its record removed
    assert [p.name for p in store.list_proxies()[0]] == ["eu-2"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a.status.yaml", "a.yaml"]


def test_a_definition_moved_to_another_file_keeps_its_identity(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, name="eu-1")
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    # One edit: a.yaml now holds another Proxy, and eu-1 moved to c.yaml.
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, name="eu-2")
    write_proxy(tmp_path, "c", {"provider": "home-kvm"}, name="eu-1")
    proxies = by_name(store.list_proxies()[0])
    assert set(proxies) == {"eu-1", "eu-2"}
    assert proxies["eu-1"].uid == proxy.uid and not proxies["eu-1"].deleting and proxies["eu-1"].defect is None
    assert yaml.safe_load((tmp_path / "c.status.yaml").read_text())["metadata"]["uid"] == proxy.uid


def test_renaming_onto_the_file_of_a_proxy_being_deleted_keeps_both_apart(store: DirectoryStore,
                                                                          tmp_path: Path) -> None:
    for stem, name in (("a", "eu-1"), ("b", "eu-2")):
        write_proxy(tmp_path, stem, {"provider": "home-kvm"}, name=name)
    for proxy in store.list_proxies()[0]:
        proxy.finalizers.append(FINALIZER)
        store.replace_metadata(proxy)
    uids = {p.name: p.uid for p in store.list_proxies()[0]}
    (tmp_path / "b.yaml").unlink()  # eu-2 is being deleted...
    (tmp_path / "a.yaml").rename(tmp_path / "b.yaml")  # ...and eu-1's file takes its file name
    proxies = by_name(store.list_proxies()[0])
    assert proxies["eu-1"].uid == uids["eu-1"] and not proxies["eu-1"].deleting
    assert proxies["eu-2"].uid == uids["eu-2"] and proxies["eu-2"].deleting
    assert all(p.defect is None for p in proxies.values())


def test_a_record_without_a_file_or_a_finalizer_is_removed(store: DirectoryStore, tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "a", {"provider": "home-kvm"})
    store.list_proxies()  # a record, but no finalizer yet
    path.unlink()
    assert store.list_proxies()[0] == []
    assert not (tmp_path / "a.status.yaml").exists()


def test_recreating_a_file_while_its_proxy_is_deleted_cancels_the_deletion(store: DirectoryStore,
                                                                            tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "a", {"provider": "home-kvm"})
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    path.unlink()
    (deleting,), _ = store.list_proxies()
    deleting.status = {"phase": "Deleting"}
    store.replace_status(deleting)  # the deletion is on record
    write_proxy(tmp_path, "b", {"provider": "home-kvm"})
    (back,), _ = store.list_proxies()
    assert back.uid == proxy.uid and not back.deleting and back.defect is None


# -- one corrupt status file (issue 11: "every sweep fails") ------------------------------------

GOOD_STATE_TEMPLATE = """apiVersion: crawl.example.com/v1alpha1
kind: ProxyState
metadata:
  name: bad
  namespace: crawlers
  uid: 0b5e6f3c-8d4a-4e21-9c7f-2a1b3c4d5e6f
  resourceVersion: '3'
  generation: {generation}
  finalizers: {finalizers}
  annotations: {annotations}
spec: {spec}
status: {status}
"""


def good_state(**changes: str) -> str:
    fields = {"generation": "1", "finalizers": "[crawl.example.com/cleanup]", "annotations": "{}",
              "spec": "{provider: home-kvm}", "status": "{phase: Ready}", **changes}
    return GOOD_STATE_TEMPLATE.format(**fields)


CORRUPT_STATES = {
    "not YAML": good_state()[:-30] + "  status: {phase: [Ready\n",
    "truncated to nothing": "",
    "a list": "- uid: 0b5e6f3c-8d4a-4e21-9c7f-2a1b3c4d5e6f\n",
    "a string": "lost\n",
    "generation abc": good_state(generation="abc"),
    "finalizers a number": good_state(finalizers="5"),
    "annotations not strings": good_state(annotations="{a: 1}"),
    "spec a list": good_state(spec="[home-kvm]"),
    "status a string": good_state(status="Ready"),
    "metadata a string": "metadata: gone\nspec: {}\n",
    "resourceVersion abc": good_state().replace("resourceVersion: '3'", "resourceVersion: abc"),
}


@pytest.mark.parametrize("text", CORRUPT_STATES.values(), ids=CORRUPT_STATES.keys())
def test_a_corrupt_status_file_fails_only_its_own_proxy(store: DirectoryStore, tmp_path: Path, text: str) -> None:
    write_proxy(tmp_path, "good", {"provider": "home-kvm"}, name="good")
    write_proxy(tmp_path, "bad", {"provider": "home-kvm"}, name="bad")
    corrupt = tmp_path / "bad.status.yaml"
    corrupt.write_text(text)

    proxies = by_name(store.list_proxies()[0])  # never raises for one bad record
    assert proxies["good"].defect is None and proxies["good"].resource_version == "1"
    bad = proxies["bad"]
    assert bad.defect and str(corrupt) in bad.defect and "Fix:" in bad.defect and not bad.deleting
    assert bad.raw is not None and bad.raw["metadata"]["name"] == "bad"
    # Its record is evidence: writes for it leave it exactly as it was.
    bad.finalizers.append(FINALIZER)
    bad.status = {"phase": "Failed", "conditions": [{"type": "Ready", "message": bad.defect}]}
    store.replace_metadata(bad)
    store.replace_status(bad)
    assert corrupt.read_text() == text
    assert store.get_proxy("crawlers", "bad").defect == bad.defect


@pytest.mark.parametrize("text", [CORRUPT_STATES["not YAML"], CORRUPT_STATES["generation abc"]],
                         ids=["not YAML", "generation abc"])
def test_a_corrupt_status_file_still_names_its_uid(store: DirectoryStore, tmp_path: Path, text: str) -> None:
    """So the reconciler can keep garbage collection off the Proxy's instance."""
    write_proxy(tmp_path, "bad", {"provider": "home-kvm"}, name="bad")
    (tmp_path / "bad.status.yaml").write_text(text)
    (bad,), _ = store.list_proxies()
    assert bad.uid == "0b5e6f3c-8d4a-4e21-9c7f-2a1b3c4d5e6f" and bad.defect


def test_a_corrupt_status_file_whose_proxy_file_is_gone_is_reported_not_dropped(store: DirectoryStore,
                                                                                 tmp_path: Path) -> None:
    (tmp_path / "bad.status.yaml").write_text(CORRUPT_STATES["not YAML"])
    (bad,), _ = store.list_proxies()
    assert bad.deleting and bad.defect and "bad.status.yaml" in bad.defect
    assert bad.uid == "0b5e6f3c-8d4a-4e21-9c7f-2a1b3c4d5e6f"


def test_deleting_a_corrupt_status_file_starts_the_proxy_over(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "bad", {"provider": "home-kvm"}, name="bad")
    corrupt = tmp_path / "bad.status.yaml"
    corrupt.write_text(CORRUPT_STATES["generation abc"])
    (bad,), _ = store.list_proxies()
    assert bad.defect
    corrupt.unlink()  # the documented way out
    (fresh,), _ = store.list_proxies()
    assert fresh.defect is None and fresh.uid != bad.uid and fresh.resource_version == "1"


def test_a_record_corrupted_after_it_was_read_is_a_conflict_not_overwritten(store: DirectoryStore,
                                                                             tmp_path: Path) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm"})
    (proxy,), _ = store.list_proxies()
    record = tmp_path / "a.status.yaml"
    record.write_text("metadata: {uid: [\n")
    proxy.status = {"phase": "Ready"}
    with pytest.raises(Conflict, match="not valid YAML"):
        store.replace_status(proxy)
    assert record.read_text() == "metadata: {uid: [\n"
    assert store.get_proxy("crawlers", "eu-1").defect  # what the reconciler reads after a conflict


def test_a_corrupt_status_file_or_a_duplicate_beside_a_good_proxy_does_not_fail_the_sweep(
        tmp_path: Path, config: Path) -> None:
    proxies_dir = tmp_path / "proxies"
    proxies_dir.mkdir()
    write_proxy(proxies_dir, "good", {"provider": "home-kvm"}, name="good")
    write_proxy(proxies_dir, "bad", {"provider": "home-kvm"}, name="bad")
    (proxies_dir / "bad.status.yaml").write_text(CORRUPT_STATES["generation abc"])
    write_proxy(proxies_dir, "twin-1", {"provider": "home-kvm"}, name="twin")
    write_proxy(proxies_dir, "twin-2", {"provider": "home-kvm"}, name="twin")
    with DirectoryStore(proxies_dir) as proxies:
        runner = FakeRunner()
        report = Reconciler(proxies, runner, str(config), parts=SweepParts(backoff=Backoff())).sweep()
        assert report.ok, report.errors
        (good,) = [p for p in proxies.list_proxies()[0] if p.name == "good"]
        assert good.status["phase"] == "Ready" and good.defect is None
    assert (proxies_dir / "bad.status.yaml").read_text() == CORRUPT_STATES["generation abc"]


# -- malformed Proxy files (issue 11, first row) ------------------------------------------------

MALFORMED = {
    "spec a list": ({"kind": "Proxy", "metadata": {"name": "bad", "namespace": "crawlers"}, "spec": ["x"]}, True),
    "metadata a string": ({"kind": "Proxy", "metadata": "bad", "spec": {"provider": "home-kvm"}}, True),
    "name a number": ({"kind": "Proxy", "metadata": {"name": 5, "namespace": "crawlers"}, "spec": {}}, True),
    # Field-level faults are the CRD schema's to find (the reconciler validates Proxy.raw);
    # the store must only pass them on without raising.
    "port abc": ({"kind": "Proxy", "metadata": {"name": "bad", "namespace": "crawlers"},
                  "spec": {"provider": "home-kvm", "port": "abc"}}, False),
    "cloudInit a number": ({"kind": "Proxy", "metadata": {"name": "bad", "namespace": "crawlers"},
                            "spec": {"provider": "home-kvm", "cloudInit": 12345}}, False),
}


@pytest.mark.parametrize(("document", "structural"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_proxy_file_never_stops_the_listing(store: DirectoryStore, tmp_path: Path,
                                                        document: dict[str, Any], structural: bool) -> None:
    write_proxy(tmp_path, "good", {"provider": "home-kvm"}, name="good")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(document))
    proxies, _ = store.list_proxies()
    good = next(p for p in proxies if p.name == "good")
    bad = next(p for p in proxies if p.name != "good")
    assert good.defect is None and good.resource_version == "1"
    assert bad.raw == document  # what the file says, for the CRD-schema validation
    assert (bad.defect is not None) == structural
    if structural:
        assert bad.defect is not None and str(tmp_path / "bad.yaml") in bad.defect


def test_a_yaml_date_in_a_spec_is_passed_on_not_raised(store: DirectoryStore, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("kind: Proxy\nmetadata: {name: bad, namespace: crawlers}\n"
                                       "spec: {provider: home-kvm, location: 2026-12-03}\n")
    (bad,), _ = store.list_proxies()
    assert bad.raw is not None and str(bad.raw["spec"]["location"]) == "2026-12-03"
    bad.status = {"phase": "Failed"}
    store.replace_status(bad)
    (again,), _ = store.list_proxies()
    assert again.uid == bad.uid and again.generation == bad.generation  # its digest is stable


def test_a_never_parsed_file_gets_no_record(store: DirectoryStore, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("kind: Proxy\nspec: [unclosed\n")
    (bad,), _ = store.list_proxies()
    assert bad.defect and "not valid YAML" in bad.defect and bad.name == "bad"
    bad.status = {"phase": "Failed"}
    store.replace_status(bad)
    assert not (tmp_path / "bad.status.yaml").exists()
    (again,), _ = store.list_proxies()
    assert again.uid == bad.uid  # stable while it lasts, without a record


def test_other_yaml_files_are_ignored(store: DirectoryStore, tmp_path: Path) -> None:
    (tmp_path / "providers.yaml").write_text(yaml.safe_dump({"owner": "x", "providers": []}))
    assert store.list_proxies()[0] == []
    assert not (tmp_path / "providers.status.yaml").exists()


# -- two files defining one Proxy --------------------------------------------------------------


def test_two_files_naming_one_proxy_fail_only_that_proxy(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "other", {"provider": "home-kvm"}, name="other")
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (first,) = [p for p in store.list_proxies()[0] if p.name == "eu-1"]
    write_proxy(tmp_path, "proxy-b", {"provider": "home-kvm", "port": 8080})

    proxies, _ = store.list_proxies()
    assert [p.defect for p in proxies if p.name == "other"] == [None]
    twins = [p for p in proxies if p.key == "crawlers/eu-1"]
    assert len(twins) == 2
    for twin in twins:
        assert twin.defect and "proxy-a.yaml" in twin.defect and "proxy-b.yaml" in twin.defect
    # The one with a record keeps it and can show the condition; the newcomer gets none.
    for twin in twins:
        twin.status = {"phase": "Failed"}
        store.replace_status(twin)
    assert yaml.safe_load((tmp_path / "proxy-a.status.yaml").read_text())["status"] == {"phase": "Failed"}
    assert not (tmp_path / "proxy-b.status.yaml").exists()

    (tmp_path / "proxy-b.yaml").unlink()
    eu1 = by_name(store.list_proxies()[0])["eu-1"]
    assert eu1.uid == first.uid and eu1.defect is None


# -- annotations, user-data and modes -----------------------------------------------------------


def test_annotations_in_the_proxy_file_win_over_stored_ones(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, annotations={SKIP_CLEANUP_ANNOTATION: "false"})
    (proxy,), _ = store.list_proxies()
    proxy.annotations["crawl.example.com/spec-hash"] = "abc"  # the controller's own
    store.replace_metadata(proxy)
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, annotations={SKIP_CLEANUP_ANNOTATION: "true"})
    (changed,), _ = store.list_proxies()
    assert changed.skip_cleanup and changed.annotations["crawl.example.com/spec-hash"] == "abc"
    store.replace_metadata(changed)
    write_proxy(tmp_path, "a", {"provider": "home-kvm"}, annotations={})  # removed from the file: gone
    (removed,), _ = store.list_proxies()
    assert not removed.skip_cleanup and removed.annotations == {"crawl.example.com/spec-hash": "abc"}


@pytest.mark.parametrize(("spec_mode", "status_mode"), [(0o600, 0o600), (0o640, 0o640), (0o666, 0o644),
                                                        (0o604, 0o604), (0o400, 0o600)],
                         ids=["0600", "0640", "0666", "0604", "0400"])
def test_status_files_hold_no_user_data_and_no_wider_access(store: DirectoryStore, tmp_path: Path,
                                                            spec_mode: int, status_mode: int) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm", "location": "h1", "port": 3129,
                                "cloudInit": "#cloud-config\npassword: hunter2\n"}, mode=spec_mode)
    (proxy,), _ = store.list_proxies()
    proxy.status = {"phase": "Ready"}
    store.replace_status(proxy)
    path = tmp_path / "a.status.yaml"
    assert "hunter2" not in path.read_text()
    assert yaml.safe_load(path.read_text())["spec"] == {"provider": "home-kvm", "location": "h1", "port": 3129}
    assert mode_of(path) == status_mode


def test_the_temporary_file_is_0600_before_the_rename(store: DirectoryStore, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}, mode=0o600)
    seen: list[int] = []
    real_replace = os.replace

    def replace(source: str, target: Path) -> None:
        seen.append(mode_of(Path(source)))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)  # the one os module the store uses
    previous = os.umask(0)  # the widest umask: the mode must not come from it
    try:
        store.list_proxies()
    finally:
        os.umask(previous)
    assert seen == [0o600]


def test_an_edited_file_is_validated_again_and_an_unchanged_one_is_not(tmp_path: Path, config: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps remember each Proxy's validation (schema.ValidationMemo) by content: a file edited
    into an invalid spec and back is seen both times, though the directory source's
    resourceVersion does not move with the file; a sweep over unchanged Proxies validates none."""
    from egress_proxies.resources import schema

    validated: list[str] = []
    real = schema.validation_errors

    def counting(proxy: Proxy) -> list[str]:
        validated.append(proxy.name)
        return real(proxy)

    monkeypatch.setattr(schema, "validation_errors", counting)
    (tmp_path / "proxies").mkdir()
    good = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
    write_proxy(tmp_path / "proxies", "a", good)
    write_proxy(tmp_path / "proxies", "b", good, name="eu-2")
    with DirectoryStore(tmp_path / "proxies") as proxies:
        reconciler = Reconciler(proxies, FakeRunner(), str(config), parts=SweepParts(backoff=Backoff()))
        assert reconciler.sweep().ok and sorted(validated) == ["eu-1", "eu-2"]
        validated.clear()
        reconciler.sweep()
        reconciler.sweep()
        assert validated == []  # Ready and unchanged: nothing validated again

        write_proxy(tmp_path / "proxies", "a", {**good, "port": "abc"})
        reconciler.sweep()
        assert validated == ["eu-1"]
        eu1 = by_name(proxies.list_proxies()[0])["eu-1"]
        assert eu1.status["phase"] == "Failed" and "spec.port" in eu1.status["conditions"][0]["message"]
        write_proxy(tmp_path / "proxies", "a", {**good, "port": 0})
        reconciler.sweep()
        eu1 = by_name(proxies.list_proxies()[0])["eu-1"]
        assert eu1.status["phase"] == "Failed" and "(got 0)" in eu1.status["conditions"][0]["message"]

        write_proxy(tmp_path / "proxies", "a", good)
        reconciler.sweep()
        eu1 = by_name(proxies.list_proxies()[0])["eu-1"]
        assert eu1.status["phase"] == "Ready", eu1.status
        write_proxy(tmp_path / "proxies", "b", good, name="eu-3")  # eu-2 goes, then eu-3 comes
        reconciler.sweep()
        reconciler.sweep()
        assert sorted(p.name for p in proxies.list_proxies()[0]) == ["eu-1", "eu-3"]
        assert set(reconciler.validation._known) == {p.uid for p in proxies.list_proxies()[0]}


def test_a_namespace_is_a_name_in_this_directory_its_identity_the_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with DirectoryStore(tmp_path / "a") as first, DirectoryStore(tmp_path / "b") as second:
        identities = first.namespace_identities({"crawlers", "team-b"})
        assert identities == {"crawlers": f"directory:{(tmp_path / 'a').resolve()}",
                              "team-b": f"directory:{(tmp_path / 'a').resolve()}"}
        # A work directory reused for another Proxy directory: not the same namespaces.
        assert second.namespace_identities({"crawlers"}) != {"crawlers": identities["crawlers"]}


# -- listing only what changed (issue 30: 10,000 Proxies, 20,000 files) --------------------------


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the store parses (Proxy files and status files), in order."""
    seen: list[str] = []
    real = directory.load_yaml

    def counting(text: str) -> Any:
        seen.append(text)
        return real(text)

    monkeypatch.setattr(directory, "load_yaml", counting)
    return seen


@pytest.mark.usefixtures("settled")
def test_a_listing_parses_only_the_files_changed_since_the_last(store: DirectoryStore, tmp_path: Path,
                                                                parses: list[str]) -> None:
    for stem in ("a", "b", "c"):
        write_proxy(tmp_path, stem, {"provider": "home-kvm"}, name=f"eu-{stem}")
    first = by_name(store.list_proxies()[0])
    assert len(parses) == 3  # the Proxy files; their records are written after the listing read
    store.list_proxies()
    assert len(parses) == 3 + 3  # the records, once
    parses.clear()
    again = by_name(store.list_proxies()[0])
    assert parses == []
    assert {name: p.uid for name, p in again.items()} == {name: p.uid for name, p in first.items()}
    write_proxy(tmp_path, "a", {"provider": "home-kvm", "port": 8080}, name="eu-a")  # in place
    (tmp_path / "c.yaml").unlink()
    changed = by_name(store.list_proxies()[0])
    assert len(parses) == 1 and changed["eu-a"].spec["port"] == 8080 and changed["eu-a"].generation == 2
    assert set(changed) == {"eu-a", "eu-b"}  # eu-c held no finalizer: gone, with its record
    assert set(store._proxy_files._entries) == {tmp_path / "a.yaml", tmp_path / "b.yaml"}  # c.yaml forgotten


def test_a_proxy_file_rewritten_in_place_within_the_same_second_is_seen(store: DirectoryStore,
                                                                        tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "a", {"provider": "home-kvm", "port": 3128})
    (proxy,), _ = store.list_proxies()
    before = path.stat()
    path.write_text(path.read_text().replace("3128", "3129"))  # same inode, same size...
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ...same mtime: the racy case
    (edited,), _ = store.list_proxies()
    assert edited.spec["port"] == 3129 and edited.generation == proxy.generation + 1


@pytest.mark.usefixtures("settled")
def test_a_proxy_file_replaced_by_a_rename_is_seen(store: DirectoryStore, tmp_path: Path) -> None:
    path = write_proxy(tmp_path, "a", {"provider": "home-kvm", "port": 3128})
    store.list_proxies()
    before = path.stat()
    (tmp_path / "staging").mkdir()
    replacement = write_proxy(tmp_path / "staging", "a", {"provider": "home-kvm", "port": 3129})
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size and mtime, another inode
    os.replace(replacement, path)
    (replaced,), _ = store.list_proxies()
    assert replaced.spec["port"] == 3129


BROKEN_PROXY_FILES = {
    "not YAML": b"kind: Proxy\nspec: [unclosed\n",
    "not UTF-8": b"kind: Proxy\nspec: {provider: caf\xe9}\n",
    "not a Proxy": b"kind: ConfigMap\n",
}


@pytest.mark.usefixtures("settled")
@pytest.mark.parametrize("content", BROKEN_PROXY_FILES.values(), ids=BROKEN_PROXY_FILES.keys())
def test_a_broken_file_is_parsed_once_and_seen_when_fixed(store: DirectoryStore, tmp_path: Path,
                                                          parses: list[str], content: bytes) -> None:
    (tmp_path / "bad.yaml").write_bytes(content)
    proxies, _ = store.list_proxies()
    parses.clear()
    assert store.list_proxies()[0] == proxies and parses == []  # the same defect, or none, from memory
    write_proxy(tmp_path, "bad", {"provider": "home-kvm"}, name="bad")  # fixed in place
    (fixed,), _ = store.list_proxies()
    assert fixed.defect is None and fixed.spec == {"provider": "home-kvm"}


@pytest.mark.usefixtures("settled")
def test_a_corrupt_status_file_repaired_is_seen(store: DirectoryStore, tmp_path: Path, parses: list[str]) -> None:
    write_proxy(tmp_path, "bad", {"provider": "home-kvm"}, name="bad")
    record = tmp_path / "bad.status.yaml"
    record.write_text(CORRUPT_STATES["not YAML"])
    (corrupt,), _ = store.list_proxies()
    parses.clear()
    assert store.list_proxies()[0] == [corrupt] and parses == []
    record.write_text(good_state())  # repaired in place
    (repaired,), _ = store.list_proxies()
    assert repaired.defect is None and repaired.uid == "0b5e6f3c-8d4a-4e21-9c7f-2a1b3c4d5e6f"


@pytest.mark.usefixtures("settled")
def test_the_stores_own_writes_are_read_back_at_the_next_listing(store: DirectoryStore, tmp_path: Path) -> None:
    """A record is written whole and renamed into place (write_file: another inode), moved beside
    a renamed Proxy file (a rename) or narrowed (chmod: another ctime). With every parse trusted
    at once, the stamp alone must show each of them to the next listing."""
    path = write_proxy(tmp_path, "a", {"provider": "home-kvm"}, mode=0o600)
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    proxy = store.replace_metadata(proxy)
    proxy.status = {"phase": "Ready"}
    store.replace_status(proxy)
    (written,), _ = store.list_proxies()
    assert (written.resource_version, written.finalizers, written.status) == ("3", [FINALIZER], {"phase": "Ready"})
    (tmp_path / "a.status.yaml").chmod(0o644)  # wider than its Proxy file: the listing narrows it
    store.list_proxies()
    assert mode_of(tmp_path / "a.status.yaml") == 0o600
    path.rename(tmp_path / "b.yaml")  # its record follows it
    (moved,), _ = store.list_proxies()
    moved.status = {"phase": "Ready", "ip": "192.0.2.10"}
    store.replace_status(moved)
    (last,), _ = store.list_proxies()
    assert last.uid == proxy.uid and last.resource_version == "4" and last.status["ip"] == "192.0.2.10"


@pytest.mark.usefixtures("settled")
def test_a_listing_hands_out_copies_of_what_it_keeps(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "a", {"provider": "home-kvm", "allowedSources": ["10.0.0.0/8"]})
    (proxy,), _ = store.list_proxies()
    proxy.status = {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}
    store.replace_status(proxy)
    (first,), _ = store.list_proxies()
    first.spec["allowedSources"].append("0.0.0.0/0")  # a caller changing nested values in place
    first.status["conditions"][0]["status"] = "False"
    assert first.raw is not None
    first.raw["metadata"]["name"] = "changed"
    (second,), _ = store.list_proxies()
    assert second.spec["allowedSources"] == ["10.0.0.0/8"] and second.status["conditions"][0]["status"] == "True"
    assert second.raw is not None and second.raw["metadata"]["name"] == "eu-1"
