"""What a batch of creates asks the hypervisors (docs/performance.md, "Fill 10,000 from empty"),
against libvirt's test driver served by one libvirtd per host.

The provider runs as the module runs it (one KvmProvider per run, its items side by side through
``run_items``); the libvirt calls are real, only counted on their way through.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import instances
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.instances import (
    KvmProvider,
    overlay_volume_name,
    seed_volume_name,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_items
from support.collection.provider_config import OWNER_TAGS, BaseImage, kvm_settings
from support.hosts.libvirt_daemon import LibvirtTestDaemon

HOSTS = 2
POOL = "default-pool"  # the test driver's built-in pool
CREATES = 8


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[LibvirtTestDaemon]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(LibvirtTestDaemon()) for _ in range(HOSTS)]


@pytest.fixture
def settings(daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path) -> KvmSettings:
    for daemon in daemons:
        daemon.reset()
    return kvm_settings(tmp_path / "providers.yaml", [daemon.uri for daemon in daemons], image, POOL)


def request(number: int, location: str | None = None) -> InstanceRequest:
    return InstanceRequest(name=f"p-cost-{number}", user_data=b"#cloud-config\n", tags=dict(OWNER_TAGS),
                           location=location)


def counted(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], *names: str) -> None:
    """Count each call of ``instances.<name>`` (the real function, called through)."""
    for name in names:
        real = getattr(instances, name)

        def counting(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(instances, name, counting)


def create_batch(settings: KvmSettings, cache: Path, requests: list[InstanceRequest]) -> list[dict[str, Any]]:
    """One module run's batch of creates, its items side by side as the module runs them."""
    provider = KvmProvider(settings, str(cache), log=lambda _message: None)
    try:
        return run_items(requests, lambda _index, item: {"instance": provider.create(item, False)[1]},
                         lambda _index, _item, error: {"error": error}, lambda item: item.name)
    finally:
        provider.close()


def test_a_batch_looks_up_each_hosts_pool_base_volume_and_network_once(
        settings: KvmSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    counted(monkeypatch, calls, "lookup_pool", "ensure_base_volume", "lookup_network", "volume_capacity")

    results = create_batch(settings, tmp_path / "cache", [request(n) for n in range(CREATES)])

    assert [r.get("error") for r in results] == [None] * CREATES
    assert Counter(r["instance"].location for r in results) == {"h0": CREATES // 2, "h1": CREATES // 2}
    assert all(r["instance"].state == "running" for r in results)
    # Once per host for the whole batch; each create asked all three itself before (8 of each).
    assert calls["lookup_pool"] == HOSTS
    assert calls["ensure_base_volume"] == HOSTS
    assert calls["lookup_network"] == HOSTS
    assert calls["volume_capacity"] == HOSTS  # the base's, which every overlay is at least as large as


def test_volumes_a_killed_run_left_behind_are_replaced(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path) -> None:
    # A run killed mid-create, when even its clean-up could not reach libvirt: its overlay and seed
    # stay in the pool, no domain was defined. Both are in the way of the next create of the name.
    pool = daemons[1].connection.storagePoolLookupByName(POOL)
    name = request(0).name
    for leftover in (overlay_volume_name(name), seed_volume_name(name)):
        pool.createXML(f"<volume><name>{leftover}</name><capacity unit='bytes'>7</capacity>"
                       "<target><format type='raw'/></target></volume>", 0)

    (result,) = create_batch(settings, tmp_path / "cache", [request(0, location="h1")])

    assert result.get("error") is None and result["instance"].state == "running"
    pool.refresh(0)
    overlay = pool.storageVolLookupByName(overlay_volume_name(name))
    seed = pool.storageVolLookupByName(seed_volume_name(name))
    assert overlay.info()[1] == settings.machine_types["small"].disk_gib * instances.GIB  # made anew, not the 7 bytes
    assert seed.info()[1] != 7
    domain = daemons[1].connection.lookupByName(name)
    assert overlay.path() in domain.XMLDesc(0) and seed.path() in domain.XMLDesc(0)


def xml_reads_of_a_listing(settings: KvmSettings, cache: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """List every domain made by the ``CREATES`` requests (asserted) and say how many domain XMLs
    the listing read (the domain cache should answer for all of them)."""
    calls: Counter[str] = Counter()
    counted(monkeypatch, calls, "domain_xml")
    provider = KvmProvider(settings, str(cache), log=lambda _message: None)
    try:
        listed = provider.list(dict(OWNER_TAGS))
    finally:
        provider.close()
    assert sorted(i.name for i in listed.instances) == sorted(request(n).name for n in range(CREATES))
    return calls["domain_xml"]


def test_the_listing_after_a_batch_reads_none_of_its_domains_xml(
        settings: KvmSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    create_batch(settings, tmp_path / "cache", [request(n) for n in range(CREATES)])
    assert xml_reads_of_a_listing(settings, tmp_path / "cache", monkeypatch) == 0  # each create kept its XML


def test_after_two_batches_side_by_side_the_listing_reads_none_of_their_xml(
        settings: KvmSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fill runs its create batches side by side: each run loads the domain cache at its start
    # and saves it at its end. The later save used to drop the earlier run's new domains, and the
    # next run's listing read their XML again (a batch's worth in every run of a fill).
    both_listed = threading.Barrier(2, timeout=60)
    list_fleet = KvmProvider._list_fleet

    def listing_together(self: KvmProvider) -> Any:
        listed = list_fleet(self)
        both_listed.wait()  # neither run saves before the other has loaded the cache
        return listed
    monkeypatch.setattr(KvmProvider, "_list_fleet", listing_together)
    batches = [[request(n) for n in range(first, first + CREATES // 2)] for first in (0, CREATES // 2)]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda batch: create_batch(settings, tmp_path / "cache", batch), batches))
    assert [r.get("error") for batch in outcomes for r in batch] == [None] * CREATES
    monkeypatch.setattr(KvmProvider, "_list_fleet", list_fleet)
    assert xml_reads_of_a_listing(settings, tmp_path / "cache", monkeypatch) == 0
