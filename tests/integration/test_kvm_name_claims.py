"""Creating without a duplicate (docs/kvm-provider.md, "Creating without a duplicate"), against
libvirt's test driver served by one libvirtd per host.

Two KvmProviders with cache directories of their own stand for two controllers that both believe
they lead; their creates run side by side in threads, each over its own connections to the
daemons. Where a test needs the two to meet at one moment, a wrapper around ``HomePool.take``
holds a thread there (the claim itself is libvirt's: nothing is faked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import load_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import instances, name_claims
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import parse_domain_xml
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.instances import KvmProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost, KvmSettings
from support.collection.provider_config import OWNER_TAGS, BaseImage, kvm_host, kvm_settings, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

HOSTS = 3
POOL = "default-pool"  # the test driver's built-in pool
NAME = "p-race"


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[LibvirtTestDaemon]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(LibvirtTestDaemon()) for _ in range(HOSTS)]


@pytest.fixture
def settings(daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path) -> KvmSettings:
    for daemon in daemons:
        daemon.reset()
    return kvm_settings(tmp_path / "providers.yaml", [daemon.uri for daemon in daemons], image, POOL)


@contextlib.contextmanager
def controller(settings: KvmSettings, cache: Path) -> Iterator[KvmProvider]:
    """One module run of a controller whose cache directory is ``cache``."""
    provider = KvmProvider(settings, str(cache), log=lambda _message: None)
    try:
        yield provider
    finally:
        provider.close()


def request(name: str = NAME) -> InstanceRequest:
    return InstanceRequest(name=name, user_data=b"#cloud-config\n", tags=dict(OWNER_TAGS))


def domains_named(daemons: list[LibvirtTestDaemon], name: str) -> list[int]:
    """The hosts (by index) holding a domain called ``name``."""
    return [index for index, daemon in enumerate(daemons) if name in daemon.connection.listDefinedDomains()
            + [daemon.connection.lookupByID(i).name() for i in daemon.connection.listDomainsID()]]


def volumes_of(daemons: list[LibvirtTestDaemon], name: str) -> dict[int, list[str]]:
    found = {}
    for index, daemon in enumerate(daemons):
        names = sorted(v for v in daemon.connection.storagePoolLookupByName(POOL).listVolumes() if v.startswith(name))
        if names:
            found[index] = names
    return found


def home_index(settings: KvmSettings, name: str = NAME) -> int:
    return [h.name for h in settings.hosts].index(name_claims.home_host(settings.hosts, name).name)


def test_two_controllers_creating_one_name_at_once_make_one_domain(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Both listed every host (no NAME anywhere) before either claims; the winner then waits until
    # the loser is done, so the loser finds the claim taken and no domain yet: the window in
    # which two runs asking every host would each have made one.
    both_listed = threading.Barrier(2, timeout=60)
    loser_done = threading.Event()
    take = name_claims.HomePool.take

    def meeting_take(self: name_claims.HomePool, name: str, stamp: int) -> bool:
        both_listed.wait()
        taken = take(self, name, stamp)
        if taken:
            assert loser_done.wait(60)
        return taken
    monkeypatch.setattr(name_claims.HomePool, "take", meeting_take)

    outcomes: dict[str, Any] = {}

    def create(who: str) -> None:
        with controller(settings, tmp_path / who) as provider:
            try:
                outcomes[who] = provider.create(request(), check_mode=False)
            except Transient as error:
                outcomes[who] = error
                loser_done.set()

    threads = [threading.Thread(target=create, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    errors = [o for o in outcomes.values() if isinstance(o, Transient)]
    made = [o for o in outcomes.values() if not isinstance(o, Exception)]
    assert len(errors) == 1 and len(made) == 1, outcomes
    assert "claimed on host" in str(errors[0]) and "will retry" in str(errors[0])
    changed, instance = made[0]
    assert changed is True
    assert domains_named(daemons, NAME) == [int(instance.location[1:])]

    # The loser's retry (its next run) finds the winner's domain in its listing.
    loser = next(who for who, o in outcomes.items() if isinstance(o, Transient))
    monkeypatch.setattr(name_claims.HomePool, "take", take)
    with controller(settings, tmp_path / loser) as provider:
        again_changed, again = provider.create(request(), check_mode=False)
    assert (again_changed, again.provider_id) == (False, instance.provider_id)
    assert domains_named(daemons, NAME) == [int(instance.location[1:])]
    # Volumes only where the domain is, and the claim in the home host's pool.
    expected = {int(instance.location[1:]): [f"{NAME}-seed.iso", f"{NAME}.qcow2"]}
    expected[home_index(settings)] = sorted([*expected.get(home_index(settings), []), f"{NAME}.claim"])
    assert volumes_of(daemons, NAME) == expected


def leftover_claim(settings: KvmSettings, cache: Path) -> int:
    """A claim of NAME taken by a run of the controller whose cache is ``cache``, which then died
    before defining anything; its stamp."""
    with controller(settings, cache) as dead_run:
        stamp = dead_run.claims.stamp_for(NAME)
        assert dead_run._home(NAME).take(NAME, stamp)
    return stamp


@pytest.mark.parametrize("cache_kept", [True, False], ids=["cache kept", "restarted with an empty cache"])
def test_a_claim_left_by_this_controllers_dead_run_is_taken_over_at_once(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path, cache_kept: bool) -> None:
    stamp = leftover_claim(settings, tmp_path / "a")
    if not cache_kept:
        # The controller restarted with an empty cache directory (same machine, same path): its own
        # claim is still known by its stamp, not waited for as another's for CLAIM_PATIENCE_SECONDS.
        shutil.rmtree(tmp_path / "a", ignore_errors=True)
        assert not (tmp_path / "a").exists()
    with controller(settings, tmp_path / "a") as provider:
        changed, instance = provider.create(request(), check_mode=False)
        assert provider._home(NAME).stamp(NAME) not in (None, stamp)  # a new stamp: the old run cannot match it
    assert changed is True
    assert domains_named(daemons, NAME) == [int(instance.location[1:])]


def test_another_controllers_claim_is_waited_for_then_taken_over(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    leftover_claim(settings, tmp_path / "b")  # b claimed NAME and never made it

    with controller(settings, tmp_path / "a") as provider, pytest.raises(Transient, match="claimed on host h"):
        provider.create(request(), check_mode=False)
    assert domains_named(daemons, NAME) == []

    # Past its patience (counted from a's first sighting, kept in a's cache), b's claim is a leftover.
    monkeypatch.setattr(instances, "CLAIM_PATIENCE_SECONDS", 0)
    with controller(settings, tmp_path / "a") as provider:
        changed, instance = provider.create(request(), check_mode=False)
    assert changed is True
    assert domains_named(daemons, NAME) == [int(instance.location[1:])]


def test_a_run_whose_claim_was_taken_over_leaves_nothing(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    check_networking = KvmProvider._check_networking

    def taken_over_meanwhile(self: KvmProvider, host: KvmHost) -> None:
        check_networking(self, host)
        # Another controller took this run for dead: it replaced the claim with its own stamp.
        with controller(settings, tmp_path / "b") as other:
            home = other._home(NAME)
            home.release(NAME)
            assert home.take(NAME, other.claims.stamp_for(NAME))
    monkeypatch.setattr(KvmProvider, "_check_networking", taken_over_meanwhile)

    with controller(settings, tmp_path / "a") as provider, pytest.raises(Transient, match="taken over"):
        provider.create(request(), check_mode=False)
    assert domains_named(daemons, NAME) == []
    # Nothing of a's is left; the claim is b's, still there.
    assert volumes_of(daemons, NAME) == {home_index(settings): [f"{NAME}.claim"]}


def test_a_delete_releases_the_claim_and_a_failed_create_keeps_none(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path) -> None:
    with controller(settings, tmp_path / "a") as provider:
        _changed, instance = provider.create(request(), check_mode=False)
        assert f"{NAME}.claim" in volumes_of(daemons, NAME)[home_index(settings)]
        assert provider.delete(instance.provider_id, check_mode=False) is True
    assert volumes_of(daemons, NAME) == {}

    # A create that fails after taking the claim (no such network on the host it placed) releases it.
    no_network = dataclasses.replace(settings,
                                     hosts=tuple(dataclasses.replace(h, network="gone") for h in settings.hosts))
    with controller(no_network, tmp_path / "a") as provider, pytest.raises(Permanent, match="network 'gone'"):
        provider.create(request(), check_mode=False)
    assert volumes_of(daemons, NAME) == {}


def test_a_run_taken_over_leaves_the_published_domain_of_the_run_that_took_it_whole(
        daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run taken for dead while another makes the name's domain, on a host that publishes
    proxies: it stops before it touches a volume of that name, and its failure removes nothing
    the other's domain uses. Before (issue 39 item 5), it took the other's overlay and seed for
    stale volumes and replaced them, and its clean-up removed by name the volumes and the DHCP
    reservation: a published guest left without a disk, or without the DHCP entry that gives it
    the address its published port forwards to."""
    published = published_settings(daemons, image, tmp_path)
    check_networking = KvmProvider._check_networking
    other: dict[str, Any] = {}

    def taken_over_meanwhile(self: KvmProvider, host: KvmHost) -> None:
        check_networking(self, host)
        if other:
            return  # the other run's own check
        other["run"] = "b"
        # Another controller takes this run for dead and makes the domain, published, reserved.
        with controller(published, tmp_path / "b") as provider:
            provider._home(NAME).release(NAME)
            other["instance"] = provider.create(request_at("h0"), check_mode=False)[1]
    monkeypatch.setattr(KvmProvider, "_check_networking", taken_over_meanwhile)

    with controller(published, tmp_path / "a") as provider, pytest.raises(Transient, match="taken over"):
        provider.create(request_at("h0"), check_mode=False)
    assert other["instance"].location == "h0"
    assert_whole(daemons[0].connection)


def test_a_failed_create_whose_domain_stays_defined_keeps_what_it_uses_and_the_retry_starts_it(
        daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start fails (a dropped connection, libvirt's own error) and so does the undefine after
    it: the domain stays defined. It keeps its volumes and its DHCP reservation, and the retry (the
    next sweep's create of the same name) finds it and starts it. Before, the clean-up removed
    both: the retry started a published guest without a disk and without its reservation."""
    published = published_settings(daemons, image, tmp_path)
    for edge in "start_domain", "undefine_domain":
        def refused(*_args: Any, _edge: str = edge) -> None:
            raise Transient(f"{_edge}: the connection dropped")
        monkeypatch.setattr(instances, edge, refused)
    with controller(published, tmp_path / "a") as provider, pytest.raises(Transient, match="start_domain"):
        provider.create(request_at("h0"), check_mode=False)
    monkeypatch.undo()
    assert NAME in daemons[0].connection.listDefinedDomains()
    assert_whole(daemons[0].connection)

    with controller(published, tmp_path / "a") as provider:
        changed, instance = provider.create(request_at("h0"), check_mode=False)
    assert changed is True and instance.state == "running"
    assert daemons[0].connection.lookupByName(NAME).isActive()
    assert_whole(daemons[0].connection)


def published_settings(daemons: list[LibvirtTestDaemon], image: BaseImage, tmp_path: Path) -> KvmSettings:
    """Hosts ``h0``... that publish their proxies (nat with a public address, ports and source
    addresses): each proxy's address is reserved in the network's DHCP."""
    for daemon in daemons:
        daemon.reset()
    hosts = [{**kvm_host(f"h{index}", daemon.uri, pool=POOL), "networkMode": "nat", "publicAddress": "203.0.113.10",
              "publishPorts": "40000-40002", "sourceAddresses": ["203.0.113.21", "203.0.113.22"]}
             for index, daemon in enumerate(daemons)]
    config = write_kvm_config(tmp_path / "providers.yaml", hosts, image, allowed_sources=["198.51.100.0/24"])
    published = load_provider_config(str(config)).provider("lab", "kvm").kvm
    assert published is not None
    return published


def assert_whole(connection: libvirt.virConnect) -> None:
    """The domain NAME has its volumes and its reservation: the MAC and address its metadata
    records, what the network's DHCP hands its guest (and what its published port forwards to)."""
    guest = parse_domain_xml(connection.lookupByName(NAME).XMLDesc(0)).guest_network
    assert guest is not None
    pool = connection.storagePoolLookupByName(POOL)
    assert {f"{NAME}.qcow2", f"{NAME}-seed.iso"} <= set(pool.listVolumes())
    network = ET.fromstring(connection.networkLookupByName("default").XMLDesc(0))
    assert [(h.get("name"), h.get("mac"), h.get("ip")) for h in network.findall("ip/dhcp/host")] == [
        (NAME, guest.mac, guest.address)]


def request_at(location: str) -> InstanceRequest:
    return InstanceRequest(name=NAME, user_data=b"#cloud-config\n", tags=dict(OWNER_TAGS), location=location)


class CountedConnection:
    """A connection whose method calls are counted by method, and passed through."""

    def __init__(self, target: Any, calls: Counter[str]) -> None:
        self._target = target
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] += 1
            return attribute(*args, **kwargs)
        return call


def test_creates_without_a_location_list_each_host_once_and_ask_no_host_per_create(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path) -> None:
    creates = 6
    with controller(settings, tmp_path / "a") as provider:
        calls: Counter[str] = Counter()
        opened = provider.connections.open
        provider.connections.open = lambda host: CountedConnection(opened(host), calls)  # type: ignore[method-assign]
        made = [provider.create(request(f"p-{n}"), check_mode=False)[1] for n in range(creates)]
    assert sorted(Counter(i.location for i in made).values()) == [2, 2, 2]  # spread as before
    assert calls["getAllDomainStats"] == HOSTS  # one listing of each host for the whole run
    assert calls["lookupByName"] == 0  # no host is asked per create whether the name exists
    with pytest.raises(libvirt.libvirtError):
        daemons[0].connection.lookupByName("p-never-made")


def test_a_name_made_since_the_runs_listing_is_found_through_its_claim(
        settings: KvmSettings, daemons: list[LibvirtTestDaemon], tmp_path: Path) -> None:
    # A fill's run of 1,000 creates uses the listing it took at its first create for all of them:
    # by its last create that listing is minutes old. A name another controller created since is
    # not in it, but was claimed (every create claims), so this run loses the claim, asks every
    # host as every create once did, and finds that domain instead of making a second one.
    with controller(settings, tmp_path / "a") as run:
        run.create(request("p-first"), check_mode=False)  # the run's listing is taken here
        with controller(settings, tmp_path / "b") as other:
            _changed, theirs = other.create(request(), check_mode=False)
        changed, found = run.create(request(), check_mode=False)
    assert (changed, found.provider_id) == (False, theirs.provider_id)
    assert domains_named(daemons, NAME) == [int(theirs.location[1:])]
