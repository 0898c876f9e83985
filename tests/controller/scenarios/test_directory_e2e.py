"""The directory source end to end: the real controller command and Reconciler, the real
ansible-runner and KVM modules, libvirt's test driver served by a libvirtd (issue 11, the rows
about the directory source: two controllers on one directory, renaming a Proxy file, a Proxy
file at mode 0600)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.collection.modules import collections_path
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.waiting import wait_for

CLOUD_INIT = "#cloud-config\npassword: not-in-any-status-file\n"
EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")


def write_proxy(directory: Path, stem: str, name: str, mode: int = 0o644) -> Path:
    path = directory / f"{stem}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                    "metadata": {"name": name, "namespace": "crawlers"},
                                    "spec": {"provider": "lab", "cloudInit": CLOUD_INIT}}))
    path.chmod(mode)
    return path


def domains(daemon: LibvirtTestDaemon) -> set[str]:
    return {d.name() for d in daemon.connection.listAllDomains()} - {"test"}


def phase(directory: Path, stem: str) -> str | None:
    try:
        state = yaml.safe_load((directory / f"{stem}.status.yaml").read_text())
    except FileNotFoundError:
        return None
    return ((state or {}).get("status") or {}).get("phase")


def test_a_second_controller_on_one_directory_refuses_to_start(tmp_path: Path, testdriver_config: Path,
                                                               libvirt_test: LibvirtTestDaemon) -> None:
    proxies = tmp_path / "proxies"
    proxies.mkdir()
    stems = [f"p{i}" for i in range(4)]
    for stem in stems:
        write_proxy(proxies, stem, f"eu-{stem}", mode=0o600)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}

    def controller(work: str, *extra: str) -> list[str]:
        return [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(proxies), "--provider-config",
                str(testdriver_config), "--work-dir", str(tmp_path / work), "--listen", "127.0.0.1:0", *extra]

    first = subprocess.Popen(controller("first", "--interval", "3600"), env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: all(phase(proxies, stem) == "Ready" for stem in stems), 180, "4 Proxies Ready")
        second = subprocess.run(controller("second", "--once"), env=env, capture_output=True, text=True,
                                timeout=180, check=False)
        assert second.returncode == 2, second.stderr
        assert str(proxies) in second.stderr and f"pid {first.pid} " in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert len(domains(libvirt_test)) == 4  # not 8
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
    for stem in stems:
        status = proxies / f"{stem}.status.yaml"
        assert stat.S_IMODE(status.stat().st_mode) == 0o600  # as its Proxy file, never 0644
        assert "not-in-any-status-file" not in status.read_text()


def test_renaming_a_proxy_file_keeps_its_instance(tmp_path: Path, testdriver_config: Path,
                                                  libvirt_test: LibvirtTestDaemon) -> None:
    proxies = tmp_path / "proxies"
    proxies.mkdir()
    write_proxy(proxies, "old-name", "eu-1")
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=120, collections_path=collections_path())
    with DirectoryStore(proxies) as store:
        reconciler = Reconciler(store, runner, str(testdriver_config), parts=SweepParts(backoff=Backoff()))
        assert reconciler.sweep().ok
        (before,), _ = store.list_proxies()
        assert before.status["phase"] == "Ready"
        (domain,) = domains(libvirt_test)

        (proxies / "old-name.yaml").rename(proxies / "new-name.yaml")
        for _ in range(2):
            report = reconciler.sweep()
            assert report.ok and report.created == 0 and report.deleted == 0, report
        (after,), _ = store.list_proxies()
    assert after.uid == before.uid and after.status["phase"] == "Ready"
    assert after.status["providerID"] == before.status["providerID"]
    assert domains(libvirt_test) == {domain}
    assert sorted(p.name for p in proxies.iterdir() if not p.name.startswith(".")) == [
        "new-name.status.yaml", "new-name.yaml"]
