"""A ProxyPool from the directory source, through the real runner and libvirt's test driver: one
pool file makes member files, the members go Ready, and deleting the pool file deletes them
through the normal finalizer path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sources.directory_pools import DirectoryPools
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.pools import PoolReconciler
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.collection.modules import collections_path


def test_a_pool_file_makes_member_files_and_deleting_it_deletes_them(
        tmp_path: Path, testdriver_config: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = yaml.safe_load(testdriver_config.read_text())
    config["providers"][0]["probe"] = "none"  # the test driver's addresses are made up
    testdriver_config.write_text(yaml.safe_dump(config))
    proxies = tmp_path / "proxies"
    proxies.mkdir()
    (proxies / "pool.yaml").write_text(yaml.safe_dump({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawlers"},
        "spec": {"replicas": 2, "template": {"cloudInit": "#cloud-config\n"}, "placement": [{"provider": "lab"}]}}))
    store = DirectoryStore(proxies)
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=2,
                           collections_path=collections_path())
    rec = Reconciler(store, runner, str(testdriver_config),
                     parts=SweepParts(backoff=Backoff(base_seconds=0, jitter=0),
                                      pools=PoolReconciler(DirectoryPools(store), store)))
    for _ in range(2):
        assert rec.sweep().ok
    members = sorted(p for p in proxies.glob("eu-*.yaml") if not p.name.endswith(".status.yaml"))
    assert len(members) == 2
    assert members[0].read_text().startswith("# Managed by the egress-proxies controller as a member of ProxyPool "
                                             "crawlers/eu")
    listed, _ = store.list_proxies()
    assert [str(p.status.get("phase")) for p in listed] == ["Ready", "Ready"]
    [pool] = DirectoryPools(store).list_pools()
    assert (pool.status["replicas"], pool.status["readyReplicas"], pool.status["phase"]) == (2, 2, "Ready")
    assert (proxies / ".pool.pool.yaml").exists()

    # A pool file that cannot be parsed is not a deleted pool: Failed, its members untouched.
    good = (proxies / "pool.yaml").read_text()
    (proxies / "pool.yaml").write_text("kind: ProxyPool\nspec: [unclosed\n")
    assert rec.sweep().ok
    [pool] = DirectoryPools(store).list_pools()
    assert pool.status["phase"] == "Failed"
    assert "pool.yaml cannot be read or parsed" in pool.status["conditions"][0]["message"]
    assert sorted(p for p in proxies.glob("eu-*.yaml") if not p.name.endswith(".status.yaml")) == members
    (proxies / "pool.yaml").write_text(good)
    assert rec.sweep().ok
    assert DirectoryPools(store).list_pools()[0].status["phase"] == "Ready"

    (proxies / "pool.yaml").unlink()
    for _ in range(3):
        assert rec.sweep().ok
    assert list(proxies.glob("eu-*")) == []  # member files and their status files: gone
    assert not (proxies / ".pool.pool.yaml").exists()
    listed, _ = store.list_proxies()
    assert listed == []
    assert "Deleted" in caplog.text  # each instance went through the deletion path

