"""A KVM listing across several hosts, against libvirt's test driver served by one libvirtd per host.

What a listing costs and what it returns: the hosts are read side by side, each with a few calls
for the host and one XML read per domain the domain cache does not hold (plus, for a running
domain no DHCP lease covers, its own address call: the test driver has no leases, so every running
domain here is one); a host that
fails in the middle of a listing is reported in ``failed_locations`` and the other hosts' instances
are still there. The calls are counted on the real connections, by a wrapper that passes every
call through to libvirt.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import load_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import DomainSpec, build_domain_xml
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.instances import KvmProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost
from support.collection.provider_config import OWNER, OWNER_TAGS, BaseImage, kvm_host, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

HOSTS = 3
RUNNING = 4  # our running domains per host
STOPPED = 2  # our defined, shut-off domains per host
# What a virDomain answers from what it holds, without a round trip to libvirtd: not counted.
LOCAL_ACCESSORS = {"name", "UUIDString"}


class Counted:
    """A libvirt object whose method calls are counted (by host and method; interfaceAddresses
    also by source) and passed through; the domains and networks it hands out are counted too."""

    def __init__(self, target: Any, host: str, calls: Counter[tuple[str, str]]) -> None:
        self._target = target
        self._host = host
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute) or name in LOCAL_ACCESSORS:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls[(self._host, f"{name}({args[0]})" if name == "interfaceAddresses" else name)] += 1
            return self._wrap(attribute(*args, **kwargs))
        return call

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, libvirt.virDomain | libvirt.virNetwork):
            return Counted(value, self._host, self._calls)
        if isinstance(value, list):
            return [self._wrap(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self._wrap(item) for item in value)
        return value


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[LibvirtTestDaemon]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(LibvirtTestDaemon()) for _ in range(HOSTS)]


def define(daemon: LibvirtTestDaemon, name: str, tags: dict[str, str], start: bool) -> None:
    xml = build_domain_xml(DomainSpec(name=name, domain_type="test", vcpus=1, memory_mib=256,
                                      overlay_path=f"/pool/{name}.qcow2", seed_path=f"/pool/{name}-seed.iso",
                                      network="default", tags=tags, created="2026-12-06T00:00:00Z"))
    domain = daemon.connection.defineXML(xml)
    if start:
        domain.create()


@pytest.fixture
def provider(daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path) -> Iterator[KvmProvider]:
    """A KVM provider over the daemons (hosts h0, h1, h2), each holding our running and stopped
    domains, one of another owner and the test driver's own domain ``test``."""
    for index, daemon in enumerate(daemons):
        daemon.reset()
        for number in range(RUNNING + STOPPED):
            define(daemon, f"p-h{index}-{number}", {**OWNER_TAGS, "crawl.example.com/uid": f"u-{index}-{number}"},
                   start=number < RUNNING)
        define(daemon, f"other-h{index}", {"crawl.example.com/owner": "someone-else"}, start=True)
    config = write_kvm_config(tmp_path / "providers.yaml",
                              [kvm_host(f"h{index}", daemon.uri, pool="default-pool")
                               for index, daemon in enumerate(daemons)], image)
    settings = load_provider_config(str(config)).provider("lab", "kvm").kvm
    assert settings is not None
    kvm = KvmProvider(settings, str(tmp_path / "cache"), log=lambda _message: None)
    yield kvm
    kvm.close()


def count_calls(provider: KvmProvider) -> Counter[tuple[str, str]]:
    calls: Counter[tuple[str, str]] = Counter()
    opened = provider.connections.open

    def open_counted(host: KvmHost) -> Any:
        return Counted(opened(host), host.name, calls)
    provider.connections.open = open_counted  # type: ignore[method-assign]
    return calls


def test_a_listing_costs_a_few_calls_per_host_and_one_xml_read_per_domain(provider: KvmProvider) -> None:
    calls = count_calls(provider)
    listing = provider.list(OWNER_TAGS)

    assert listing.failed_locations == {}
    assert [i.location for i in listing.instances] == [f"h{h}" for h in range(HOSTS) for _ in range(RUNNING + STOPPED)]
    agent = f"interfaceAddresses({libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT})"
    domains = RUNNING + STOPPED + 2  # ours, another owner's, the test driver's own
    for host in (f"h{h}" for h in range(HOSTS)):
        per_host = {method: count for (where, method), count in calls.items() if where == host}
        # One call lists every domain with its state; each network's leases are asked once (the
        # test driver has none), so each running domain of ours is asked for its address.
        assert per_host == {"getAllDomainStats": 1, "XMLDesc": domains, "networkLookupByName": 1,
                            "DHCPLeases": 1, agent: RUNNING}, host


def xml_reads(calls: Counter[tuple[str, str]]) -> dict[str, int]:
    return {where: count for (where, method), count in calls.items() if method == "XMLDesc"}


def next_run(provider: KvmProvider, **settings: Any) -> KvmProvider:
    """The provider of the next module run: new connections, the same cache directory."""
    return KvmProvider(dataclasses.replace(provider.settings, **settings), provider.cache_dir,
                       log=lambda _message: None)


def test_the_next_run_reads_the_xml_of_new_domains_only(provider: KvmProvider,
                                                       daemons: list[LibvirtTestDaemon]) -> None:
    first = provider.list(OWNER_TAGS)
    define(daemons[0], "p-h0-new", {**OWNER_TAGS, "crawl.example.com/uid": "u-new"}, start=True)
    # Undefined and defined again under its name with other tags: a new UUID, read afresh.
    daemons[2].connection.lookupByName("p-h2-5").undefine()
    define(daemons[2], "p-h2-5", {**OWNER_TAGS, "crawl.example.com/uid": "u-again"}, start=False)

    second_run = next_run(provider)
    calls = count_calls(second_run)
    try:
        second = second_run.list(OWNER_TAGS)
    finally:
        second_run.close()
    assert xml_reads(calls) == {"h0": 1, "h2": 1}
    by_name = {i.name: i.to_dict() for i in second.instances}
    assert by_name.pop("p-h0-new")["tags"]["crawl.example.com/uid"] == "u-new"
    assert by_name["p-h2-5"]["tags"]["crawl.example.com/uid"] == "u-again"
    # Everything else is listed as the run that read the XML listed it.
    assert {k: v for k, v in by_name.items() if k != "p-h2-5"} == {
        i.name: i.to_dict() for i in first.instances if i.name != "p-h2-5"}


def test_a_cache_of_zero_seconds_reads_every_xml_at_every_listing(provider: KvmProvider) -> None:
    uncached = next_run(provider, domain_cache_seconds=0)
    uncached.list(OWNER_TAGS)
    again = next_run(provider, domain_cache_seconds=0)
    calls = count_calls(again)
    try:
        again.list(OWNER_TAGS)
    finally:
        uncached.close()
        again.close()
    assert xml_reads(calls) == {f"h{h}": RUNNING + STOPPED + 2 for h in range(HOSTS)}


def test_a_listing_reports_what_reading_each_instance_reports(provider: KvmProvider) -> None:
    listing = provider.list(OWNER_TAGS)
    states = Counter(instance.state for instance in listing.instances)
    assert states == {"running": HOSTS * RUNNING, "stopped": HOSTS * STOPPED}
    assert all(bool(i.ip) == (i.state == "running") for i in listing.instances)
    for instance in listing.instances:
        assert provider.get(instance.provider_id).to_dict() == instance.to_dict()


def test_a_host_that_fails_during_the_listing_is_reported_and_the_others_are_listed(
        provider: KvmProvider, daemons: list[LibvirtTestDaemon]) -> None:
    for host in provider.settings.hosts:
        provider.connections.open(host)  # connected: the host fails mid-listing, not at connect
    daemons[1].stop()
    try:
        listing = provider.list(OWNER_TAGS)
    finally:
        daemons[1].start()
    assert list(listing.failed_locations) == ["h1"]
    assert isinstance(listing.failed_locations["h1"], Transient), listing.failed_locations
    assert {i.location for i in listing.instances} == {"h0", "h2"}
    assert len(listing.instances) == 2 * (RUNNING + STOPPED)
    with pytest.raises(Transient, match="listing failed on KVM host"):
        listing.to_result("KVM host(s)")


def test_the_owner_of_a_listing_is_the_one_asked_for(provider: KvmProvider) -> None:
    assert {i.tags["crawl.example.com/owner"] for i in provider.list(OWNER_TAGS).instances} == {OWNER}
    others = provider.list({"crawl.example.com/owner": "someone-else"}).instances
    assert sorted(i.name for i in others) == [f"other-h{h}" for h in range(HOSTS)]
