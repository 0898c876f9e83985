"""The directory source: Proxies from YAML files, with what the API server would keep written beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from egress_proxies.directory import DirectoryStore
from egress_proxies.model import FINALIZER
from egress_proxies.store import Conflict, StoreError


def write_proxy(directory: Path, stem: str, spec: dict[str, object], name: str = "eu-1") -> Path:
    path = directory / f"{stem}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                    "metadata": {"name": name, "namespace": "crawlers"}, "spec": spec}))
    return path


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    return DirectoryStore(tmp_path)


def test_first_sight_gives_a_lasting_identity(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    (first,), _ = store.list_proxies()
    (again,), _ = store.list_proxies()
    assert first.key == "crawlers/eu-1"  # metadata names it, not the file
    assert first.uid == again.uid and first.uid
    assert (tmp_path / "proxy-a.status.yaml").exists()


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
    path = write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm", "port": 3128})
    (proxy,), _ = store.list_proxies()
    proxy.finalizers.append(FINALIZER)
    store.replace_metadata(proxy)
    path.write_text("spec: [unclosed")  # a typo must not delete it, nor orphan its instance
    (kept,), _ = store.list_proxies()
    assert kept.uid == proxy.uid and not kept.deleting
    assert kept.spec == {"provider": "home-kvm", "port": 3128}


def test_two_files_naming_one_proxy_fail_the_listing(store: DirectoryStore, tmp_path: Path) -> None:
    write_proxy(tmp_path, "proxy-a", {"provider": "home-kvm"})
    write_proxy(tmp_path, "proxy-b", {"provider": "home-kvm"})
    with pytest.raises(StoreError, match="crawlers/eu-1"):
        store.list_proxies()


def test_a_missing_directory_fails_the_listing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        DirectoryStore(tmp_path / "nowhere").list_proxies()
