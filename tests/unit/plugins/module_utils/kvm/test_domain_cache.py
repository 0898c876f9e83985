"""The domain cache: an entry stands for its domain (same UUID, same name) until it is due, the
domains gone are forgotten, the file is private and written whole, and a damaged file or an
unwritable directory only costs reads."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_cache import (
    DomainCache,
    HostDomainCache,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import DomainInfo, GuestNetwork

URI = "qemu+libssh://root@hv1/system"
PUBLISHED = DomainInfo(name="p-a", ours=True, tags={"crawl.example.com/owner": "o"}, created="2026-12-06T00:00:00Z",
                       macs=["52:54:00:00:00:01"], networks=["default"], port=3128,
                       guest_network=GuestNetwork(address="192.168.122.10", mac="52:54:00:00:00:01",
                                                  published_address="203.0.113.10", published_port=40000,
                                                  source_address="203.0.113.21"))
FOREIGN = DomainInfo(name="someone-elses", ours=False, tags={}, created=None, macs=[])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def cache_at(tmp_path: Path, clock: Clock, max_age: float = 600) -> HostDomainCache:
    return HostDomainCache(str(tmp_path / "domains" / "hv1.json"), URI, max_age, clock)


def test_an_entry_survives_the_run_and_stands_for_its_domain_until_due(tmp_path: Path) -> None:
    clock = Clock()
    first = cache_at(tmp_path, clock)
    first.put("uuid-a", PUBLISHED)
    first.put("uuid-f", FOREIGN)
    first.save()

    again = cache_at(tmp_path, clock)  # the next module run
    assert again.get("uuid-a", "p-a") == PUBLISHED
    assert again.get("uuid-f", "someone-elses") == FOREIGN
    clock.now += 299  # due at a random point of the second half of the age: not yet
    assert again.get("uuid-a", "p-a") == PUBLISHED
    clock.now += 302
    assert again.get("uuid-a", "p-a") is None


def test_another_name_or_uuid_is_a_miss(tmp_path: Path) -> None:
    cache = cache_at(tmp_path, Clock())
    cache.put("uuid-a", PUBLISHED)
    assert cache.get("uuid-a", "p-renamed") is None
    assert cache.get("uuid-b", "p-a") is None


def test_domains_gone_are_forgotten_and_the_file_is_private(tmp_path: Path) -> None:
    clock = Clock()
    cache = cache_at(tmp_path, clock)
    cache.put("uuid-a", PUBLISHED)
    cache.put("uuid-f", FOREIGN)
    cache.keep_only(["uuid-f"])
    cache.save()
    path = tmp_path / "domains" / "hv1.json"
    assert set(json.loads(path.read_text())["domains"]) == {"uuid-f"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["hv1.json"]  # no temporary file left


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"format": 1, "uri": "qemu:///other",
                                                                    "domains": {"uuid-a": {}}}),
                                     json.dumps({"format": 1, "uri": URI, "domains": {
                                         "uuid-a": {"expires": 2e9, "info": {"name": "p-a", "unknown": 1}}}})])
def test_a_damaged_or_foreign_file_is_an_empty_cache(tmp_path: Path, content: str) -> None:
    path = tmp_path / "domains" / "hv1.json"
    path.parent.mkdir()
    path.write_text(content)
    assert cache_at(tmp_path, Clock()).get("uuid-a", "p-a") is None


def test_an_unwritable_directory_only_costs_reads(tmp_path: Path) -> None:
    (tmp_path / "domains").write_text("a file where the directory should be")
    cache = cache_at(tmp_path, Clock())
    cache.put("uuid-a", PUBLISHED)
    cache.save()  # no exception: the listing goes on
    assert cache.get("uuid-a", "p-a") == PUBLISHED


def test_age_zero_turns_it_off(tmp_path: Path) -> None:
    clock = Clock()
    cache = cache_at(tmp_path, clock, max_age=0)
    cache.put("uuid-a", PUBLISHED)
    cache.save()
    assert cache.get("uuid-a", "p-a") is None
    assert not (tmp_path / "domains").exists()


def test_one_file_per_hypervisor(tmp_path: Path) -> None:
    caches = DomainCache(str(tmp_path / "domains"), 600)
    assert caches.for_uri(URI) is caches.for_uri(URI)
    caches.for_uri(URI).put("uuid-a", PUBLISHED)
    caches.for_uri("qemu+libssh://root@hv2/system").put("uuid-b", FOREIGN)
    for uri in (URI, "qemu+libssh://root@hv2/system"):
        caches.for_uri(uri).save()
    assert len(os.listdir(tmp_path / "domains")) == 2


def test_runs_side_by_side_keep_each_others_new_domains(tmp_path: Path) -> None:
    # Two create runs of a fill load the file at their start and save at their end: the second
    # save keeps what the first saved meanwhile, so the next listing reads none of it again.
    clock = Clock()
    seen_by_both = cache_at(tmp_path, clock)
    seen_by_both.put("uuid-old", FOREIGN)
    seen_by_both.save()
    first, second = cache_at(tmp_path, clock), cache_at(tmp_path, clock)
    first.put("uuid-a", PUBLISHED)
    first.save()
    second.put("uuid-b", dataclasses.replace(PUBLISHED, name="p-b"))
    second.keep_only(["uuid-b"])  # its listing found uuid-old gone (uuid-a was made after it listed)
    second.save()

    following = cache_at(tmp_path, clock)
    assert following.get("uuid-a", "p-a") == PUBLISHED
    assert following.get("uuid-b", "p-b") is not None
    assert following.get("uuid-old", "someone-elses") is None  # gone stays gone
