"""sources/directory_pools.py: ProxyPools from pool files, their hidden records, and the member
files the controller writes (and only those it deletes)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from egress_proxies.resources.pool import POOL_LABEL
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sources.directory_pools import MEMBER_HEADER, DirectoryPools
from egress_proxies.sources.store import Conflict, StoreError

POOL = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu", "namespace": "crawlers"},
        "spec": {"replicas": 2, "template": {}, "placement": [{"provider": "lab"}]}}


def member(name: str) -> dict[str, object]:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "crawlers", "labels": {POOL_LABEL: "eu"}},
            "spec": {"provider": "lab"}}


@pytest.fixture
def pools(tmp_path: Path) -> DirectoryPools:
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(POOL))
    return DirectoryPools(DirectoryStore(tmp_path))


def test_a_pool_file_is_a_pool_with_a_record_of_its_own(pools: DirectoryPools) -> None:
    [pool] = pools.list_pools()
    assert (pool.namespace, pool.name, pool.spec["replicas"]) == ("crawlers", "eu", 2)
    record = pools.directory / ".pool.pool.yaml"
    assert yaml.safe_load(record.read_text())["metadata"]["uid"] == pool.uid
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    # Read again: the same identity.
    assert pools.list_pools()[0].uid == pool.uid


def test_status_writes_are_optimistic(pools: DirectoryPools) -> None:
    [pool] = pools.list_pools()
    pool.status = {"phase": "Ready"}
    written = pools.replace_pool_status(pool)
    assert pools.list_pools()[0].status == {"phase": "Ready"}
    written.resource_version = "1"  # stale
    with pytest.raises(Conflict):
        pools.replace_pool_status(written)


def test_member_files_carry_the_header_and_only_those_are_deleted(pools: DirectoryPools) -> None:
    pools.create_proxy("crawlers", member("eu-1"))
    path = pools.directory / "eu-1.yaml"
    assert path.read_text().startswith(MEMBER_HEADER.format(namespace="crawlers", pool="eu", file="eu-1.yaml"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(Conflict):
        pools.create_proxy("crawlers", member("eu-1"))
    (pools.directory / "mine.yaml").write_text(yaml.safe_dump(member("mine")))
    with pytest.raises(StoreError, match="not a pool member file the controller wrote"):
        pools.delete_proxy("crawlers", "mine")
    assert (pools.directory / "mine.yaml").exists()
    pools.delete_proxy("crawlers", "eu-1")
    pools.delete_proxy("crawlers", "eu-1")  # gone already: what was asked
    assert not path.exists()


@pytest.mark.parametrize("name", ["../eu-1", "../../x", "a/b", "UPPER", ""])
def test_a_member_name_that_is_no_kubernetes_name_names_no_file(pools: DirectoryPools, name: str) -> None:
    before = sorted(p.name for p in pools.directory.parent.rglob("*"))
    with pytest.raises(StoreError, match="DNS-1123 subdomain"):
        pools.create_proxy("crawlers", member(name))
    with pytest.raises(StoreError, match="DNS-1123 subdomain"):
        pools.delete_proxy("crawlers", name)
    assert sorted(p.name for p in pools.directory.parent.rglob("*")) == before


def test_a_removed_pool_file_is_a_deleting_pool_until_its_finalizer_goes(pools: DirectoryPools) -> None:
    [pool] = pools.list_pools()
    pool.finalizers = ["crawl.example.com/cleanup"]
    pools.replace_pool_metadata(pool)
    (pools.directory / "pool.yaml").unlink()
    [deleting] = pools.list_pools()
    assert deleting.deleting and deleting.uid == pool.uid
    deleting.finalizers = []
    pools.replace_pool_metadata(deleting)
    assert pools.list_pools() == []
    assert not (pools.directory / ".pool.pool.yaml").exists()
