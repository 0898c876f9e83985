"""The KVM modules through ansible-runner against libvirt's test driver (served by a libvirtd).

Each module run is its own process, as under the controller; the daemon keeps the
test driver's state between them. Volume content is not checked here (the test
driver has no upload); tests/integration/test_kvm_real_libvirt.py covers it.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from support.collection.modules import ModuleRun, run_module
from support.collection.provider_config import OWNER_TAGS, BaseImage, kvm_host, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

POOL = "default-pool"  # the test driver's built-in pool


@pytest.fixture
def config(testdriver_config: Path) -> Path:
    return testdriver_config


def proxy(config: Path, tmp_path: Path, **args: Any) -> ModuleRun:
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    return run_module("kvm_proxy", {**base, **args}, check_mode=bool(args.pop("_check", False)))


def info(config: Path, **args: Any) -> ModuleRun:
    return run_module("kvm_proxy_info", {"provider_config": str(config), "provider": "lab", **args})


def volume_names(daemon: LibvirtTestDaemon) -> set[str]:
    return {v.name() for v in daemon.connection.storagePoolLookupByName(POOL).listAllVolumes()}


def our_domains(daemon: LibvirtTestDaemon) -> set[str]:
    return {d.name() for d in daemon.connection.listAllDomains()} - {"test"}


def test_create_get_list_delete_round_trip(config: Path, tmp_path: Path, libvirt_test: LibvirtTestDaemon) -> None:
    tags = {**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/eu-1"}

    planned = run_module("kvm_proxy", {"provider_config": str(config), "provider": "lab", "name": "eu-1-3f9c2a",
                                       "tags": tags}, check_mode=True)
    assert planned.result["changed"] is True, planned.result
    assert planned.result["provider_id"] == "kvm://hosts/h1/domains/eu-1-3f9c2a"
    assert our_domains(libvirt_test) == set() and "base-debian-12.qcow2" not in volume_names(libvirt_test)

    created = proxy(config, tmp_path, name="eu-1-3f9c2a", tags=tags, user_data="#cloud-config\n")
    assert created.status == "successful", created.result
    instance = created.result["instance"]
    assert created.result["changed"] is True
    assert instance["provider_id"] == "kvm://hosts/h1/domains/eu-1-3f9c2a"
    assert instance["state"] == "running" and instance["location"] == "h1"
    assert instance["ip"]  # the test driver reports an address for every source
    assert instance["tags"] == tags and instance["created"]
    assert {"eu-1-3f9c2a.qcow2", "eu-1-3f9c2a-seed.iso", "base-debian-12.qcow2"} <= volume_names(libvirt_test)
    # Issue 40 day 2: libvirtd starts it again after a host reboot.
    assert libvirt_test.connection.lookupByName("eu-1-3f9c2a").autostart() == 1

    again = proxy(config, tmp_path, name="eu-1-3f9c2a", tags=tags)
    assert again.result["changed"] is False
    assert again.result["provider_id"] == instance["provider_id"]
    assert our_domains(libvirt_test) == {"eu-1-3f9c2a"}

    by_id = info(config, provider_id=instance["provider_id"])
    assert by_id.result["instances"] == [instance]
    by_tags = info(config, tags=OWNER_TAGS)
    assert [i["provider_id"] for i in by_tags.result["instances"]] == [instance["provider_id"]]
    assert by_tags.result["failed_locations"] == {}
    foreign = info(config, tags={"crawl.example.com/owner": "someone-else"})
    assert foreign.status == "successful" and foreign.result["instances"] == []

    would_delete = run_module("kvm_proxy", {"provider_config": str(config), "provider": "lab", "state": "absent",
                                            "provider_id": instance["provider_id"]}, check_mode=True)
    assert would_delete.result["changed"] is True
    assert our_domains(libvirt_test) == {"eu-1-3f9c2a"}

    deleted = proxy(config, tmp_path, state="absent", provider_id=instance["provider_id"])
    assert deleted.result["changed"] is True
    assert our_domains(libvirt_test) == set()
    assert volume_names(libvirt_test) == {"base-debian-12.qcow2"}  # the cached base stays

    deleted_again = proxy(config, tmp_path, state="absent", provider_id=instance["provider_id"])
    assert deleted_again.status == "successful" and deleted_again.result["changed"] is False

    gone = info(config, provider_id=instance["provider_id"])
    assert gone.failed and gone.result["error_class"] == "not_found"


@pytest.mark.usefixtures("libvirt_test")
def test_foreign_domains_are_never_listed(config: Path) -> None:
    # The test driver's own "test" domain has no egress-proxies metadata.
    listed = info(config, tags={})
    assert listed.status == "successful" and listed.result["instances"] == []


GOOD = {"name": "eu-1-3f9c2a", "tags": OWNER_TAGS}


@pytest.mark.parametrize(
    ("module", "args", "field"),
    [
        ("kvm_proxy", {**GOOD, "provider": "nope"}, "provider"),
        ("kvm_proxy", {**GOOD, "image": "windows-95"}, "image"),
        ("kvm_proxy", {**GOOD, "machine_type": "huge"}, "machine_type"),
        ("kvm_proxy", {**GOOD, "location": "no-such-host"}, "location"),
        ("kvm_proxy", {**GOOD, "name": "Bad_Name"}, "name"),
        ("kvm_proxy", {**GOOD, "name": "x" * 64}, "name"),
        ("kvm_proxy", {**GOOD, "port": 70000}, "port"),
        ("kvm_proxy", {**GOOD, "user_data": "not base64!", "user_data_encoding": "base64"}, "user_data"),
        ("kvm_proxy", {**GOOD, "user_data": "#cloud-config\n" + "#" * 70000}, "user_data"),
        ("kvm_proxy", {"state": "absent", "provider_id": "kvm://hosts/h1/vms/x"}, "provider_id"),
        ("kvm_proxy", {"state": "absent", "provider_id": "gce://my-project/zones/z/instances/x"}, "provider_id"),
        ("kvm_proxy_info", {"provider_id": "kvm:/hosts/h1/domains/x"}, "provider_id"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input_fails_permanent_naming_the_field(
    config: Path, libvirt_test: LibvirtTestDaemon, module: str, args: dict[str, Any], field: str
) -> None:
    result = run_module(module, {"provider_config": str(config), "provider": "lab", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == "permanent"
    assert field in result.result["msg"]
    assert our_domains(libvirt_test) == set()
    assert volume_names(libvirt_test) == set()  # nothing created, not even the base image


def test_bad_provider_config_fails_permanent_with_the_field_path(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                                  image: BaseImage) -> None:
    config = write_kvm_config(tmp_path / "providers.yaml", [kvm_host("bee link", libvirt_test.uri, pool=POOL)], image)
    result = run_module("kvm_proxy", {"provider_config": str(config), "provider": "lab", **GOOD})
    assert result.failed and result.result["error_class"] == "permanent"
    assert "providers[0].kvm.hosts[0].name" in result.result["msg"]
    assert "providerID" in result.result["msg"]  # the consequence, not just the rule


@pytest.mark.usefixtures("libvirt_test")
def test_binary_user_data_is_accepted_base64(config: Path, tmp_path: Path) -> None:
    gzip_magic = base64.b64encode(b"\x1f\x8b\x08\x00" + bytes(range(256))).decode()
    result = proxy(config, tmp_path, **GOOD, user_data=gzip_magic, user_data_encoding="base64")
    assert result.status == "successful", result.result
    assert "user_data" not in str(result.result.get("instance"))


@pytest.mark.usefixtures("libvirt_test")
def test_user_data_never_reaches_the_result(config: Path, tmp_path: Path) -> None:
    secret = "#cloud-config\nwrite_files: [{path: /etc/squid/passwd, content: 'crawler:s3cr3t-hash'}]\n"
    result = proxy(config, tmp_path, **GOOD, user_data=secret)
    assert result.status == "successful"
    assert "s3cr3t-hash" not in repr(result.result)


@pytest.mark.usefixtures("libvirt_test")
def test_unconfigured_host_delete_is_a_noop_but_get_stays_permanent(config: Path, tmp_path: Path) -> None:
    provider_id = "kvm://hosts/retired-host/domains/eu-1-3f9c2a"
    deleted = proxy(config, tmp_path, state="absent", provider_id=provider_id)
    assert deleted.status == "successful", deleted.result
    assert deleted.result["changed"] is False
    assert any("retired-host" in warning for warning in deleted.result.get("warnings", []))

    fetched = info(config, provider_id=provider_id)
    assert fetched.failed
    # Never not_found: the live path would rebuild the VM and duplicate it.
    assert fetched.result["error_class"] == "permanent"
    assert "retired-host" in fetched.result["msg"]


def test_delete_from_a_missing_pool_succeeds(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                            image: BaseImage) -> None:
    config = write_kvm_config(tmp_path / "providers.yaml", [kvm_host("h1", libvirt_test.uri, pool="gone")], image)
    deleted = proxy(config, tmp_path, state="absent", provider_id="kvm://hosts/h1/domains/eu-1-3f9c2a")
    assert deleted.status == "successful", deleted.result
    assert deleted.result["changed"] is False


def test_a_host_that_is_not_active_takes_no_new_proxy(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                       image: BaseImage) -> None:
    with LibvirtTestDaemon() as second:
        cordoned = {**kvm_host("h1", libvirt_test.uri, pool=POOL), "state": "cordoned"}
        config = write_kvm_config(tmp_path / "providers.yaml", [cordoned, kvm_host("h2", second.uri, pool=POOL)],
                                  image)
        # h1 has fewer of ours than h2 every time, yet nothing is placed there.
        placed = [proxy(config, tmp_path, name=f"p-{n}", tags=OWNER_TAGS).result["instance"]["location"]
                  for n in range(2)]
        assert placed == ["h2", "h2"] and our_domains(libvirt_test) == set()

        pinned = proxy(config, tmp_path, name="pinned-1", location="h1", tags=OWNER_TAGS)
        assert pinned.failed and pinned.result["error_class"] == "permanent", pinned.result
        assert "providers[0].kvm.hosts[0].state" in pinned.result["msg"], pinned.result["msg"]
        assert our_domains(libvirt_test) == set()

        # No active host left: the error names each host's state field; their proxies are still listed.
        both_out = write_kvm_config(
            tmp_path / "draining.yaml", [{**cordoned, "state": "draining"}, {**kvm_host("h2", second.uri, pool=POOL),
                                                                            "state": "cordoned"}], image)
        refused = proxy(both_out, tmp_path, name="p-9", tags=OWNER_TAGS)
        assert refused.failed and "no host can take a new proxy" in refused.result["msg"], refused.result
        assert "host h1 is draining (providers[0].kvm.hosts[0].state)" in refused.result["msg"]
        listed = info(both_out, tags=OWNER_TAGS)
        assert sorted(i["location"] for i in listed.result["instances"]) == ["h2", "h2"]


def test_placement_spreads_and_never_duplicates(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                image: BaseImage) -> None:
    with LibvirtTestDaemon() as second:
        config = write_kvm_config(
            tmp_path / "providers.yaml",
            [kvm_host("h1", libvirt_test.uri, pool=POOL), kvm_host("h2", second.uri, pool=POOL)], image)
        placed = [proxy(config, tmp_path, name=f"p-{n}", tags=OWNER_TAGS).result["instance"]["location"]
                  for n in range(3)]
        assert placed == ["h1", "h2", "h1"]  # fewest of ours first, config order breaks ties

        # p-1 lives on h2: asking again without a location finds it there instead of placing a twin on h1.
        again = proxy(config, tmp_path, name="p-1", tags=OWNER_TAGS)
        assert again.result["changed"] is False
        assert again.result["provider_id"] == "kvm://hosts/h2/domains/p-1"
        assert our_domains(libvirt_test) == {"p-0", "p-2"} and our_domains(second) == {"p-1"}

        listed = info(config, tags=OWNER_TAGS)
        assert sorted(i["provider_id"] for i in listed.result["instances"]) == [
            "kvm://hosts/h1/domains/p-0", "kvm://hosts/h1/domains/p-2", "kvm://hosts/h2/domains/p-1"]


def test_a_stopped_instance_is_started_again(config: Path, tmp_path: Path, libvirt_test: LibvirtTestDaemon) -> None:
    created = proxy(config, tmp_path, **GOOD)
    libvirt_test.connection.lookupByName(GOOD["name"]).destroy()
    assert info(config, provider_id=created.result["provider_id"]).result["instances"][0]["state"] == "stopped"
    restarted = proxy(config, tmp_path, **GOOD)
    assert restarted.result["changed"] is True
    assert restarted.result["instance"]["state"] == "running"
