"""providers/client.py: the controller's half of the module contract -- the batch calls a
ProviderClient makes (module names, arguments, one run per batch), the parsing of what comes back
(Instance, Result, Listing), what a create carries (CreateRequest), and check_config. The runner
is a script of answers; the real runner and modules are in test_runner.py."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProbeSettings as CollectionProbeSettings,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import POLICY_VERSION
from egress_proxies.providers.client import (
    AccessRequest,
    ConfigUnreadable,
    CreateRequest,
    Instance,
    Listing,
    ProbeSettings,
    ProviderClient,
    ProviderType,
    Result,
    Target,
    check_config,
)
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.runner import Operation, OperationResult
from egress_proxies.resources.proxy import OWNER_TAG, PROXY_TAG, SPEC_HASH_TAG, UID_TAG, Proxy
from support.controller.fakes import FakeRunner


class Answers:
    """A runner that records each call and answers with the next scripted result."""

    def __init__(self, *answers: OperationResult) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str, list[Operation]]] = []

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        self.calls.append((provider, verb, list(operations)))
        return [self.answers.pop(0)]


def ok_item(name: str, **extra: Any) -> dict[str, Any]:
    return {"ok": True, "changed": True, "instance": {"provider_id": f"kvm://hosts/h1/domains/{name}", "name": name,
                                                      "state": "running", "ip": "192.0.2.10"}, **extra}


def client(runner: Answers, provider_type: ProviderType = ProviderType.KVM) -> ProviderClient:
    return ProviderClient(runner, "/etc/providers.yaml", "lab", provider_type)


def test_an_instance_is_typed_from_the_contracts_dict() -> None:
    instance = Instance.from_result({"provider_id": "kvm://x", "name": "p", "location": "h1", "state": "running",
                                     "ip": "192.0.2.10", "endpoint": "192.0.2.10:3128",
                                     "created": "2026-01-01T00:00:00Z",
                                     "tags": {OWNER_TAG: "o", UID_TAG: "u", PROXY_TAG: "ns/p", SPEC_HASH_TAG: "h"}})
    assert instance.running and (instance.owner, instance.uid, instance.proxy_key, instance.spec_hash) == (
        "o", "u", "ns/p", "h")


@pytest.mark.parametrize(("data", "running"), [
    ({"provider_id": "kvm://x", "state": "running", "ip": ""}, False),
    ({"provider_id": "kvm://x", "state": "stopped", "ip": "192.0.2.10"}, False),
    ({"provider_id": "kvm://x", "tags": ["not", "a", "mapping"]}, False),
])
def test_an_instance_is_running_only_with_an_address(data: dict[str, Any], running: bool) -> None:
    instance = Instance.from_result(data)
    assert instance.running is running and instance.tags == {} and instance.state in ("pending", "running", "stopped")


def test_a_batch_gives_one_result_per_item_in_order() -> None:
    outcome = OperationResult(ok=True, result={"results": [
        ok_item("a"), {"ok": False, "error_class": "not_found", "msg": "no such domain"}, ok_item("c", changed=False)]})
    a, b, c = Result.from_batch(outcome, 3)
    assert a.ok and a.changed and a.instance is not None and a.instance.name == "a"
    assert b.error is not None and b.error.error_class is ErrorClass.NOT_FOUND and b.error.message == "no such domain"
    assert c.ok and not c.changed


def test_a_run_that_failed_as_a_whole_fails_every_item_with_its_class() -> None:
    results = Result.from_batch(OperationResult.failure(ErrorClass.PERMANENT, "config unreadable"), 2)
    assert [(r.error.error_class, r.error.message) for r in results if r.error] == [
        (ErrorClass.PERMANENT, "config unreadable")] * 2


@pytest.mark.parametrize(("result", "got"), [({"results": [ok_item("a")]}, "1"), ({}, "no"),
                                             ({"results": "a"}, "no")])
def test_the_wrong_number_of_results_is_transient(result: dict[str, Any], got: str) -> None:
    results = Result.from_batch(OperationResult(ok=True, result=result), 2)
    assert [str(r.error) for r in results] == [f"transient: the module returned {got} results for 2 items"] * 2


@pytest.mark.parametrize(("item", "expected"), [
    ("not a mapping", "transient: the module returned a result that is not a mapping"),
    ({"ok": False, "error_class": "bogus", "msg": "odd"}, "transient: odd"),  # unclassified: transient
    ({"ok": False, "error_class": "permanent"}, "permanent: failed without a message"),
])
def test_a_failed_item_keeps_its_own_class_and_message(item: Any, expected: str) -> None:
    assert str(Result.from_item(item).error) == expected


def test_a_listing_indexes_instances_by_proxy_uid() -> None:
    mine = [Instance("kvm://a", tags={UID_TAG: "u1"}), Instance("kvm://b", tags={UID_TAG: "u1"})]
    listing = Listing(instances=[*mine, Instance("kvm://c", tags={UID_TAG: "u2"}), Instance("kvm://d")])
    assert listing.complete and listing.of("u1") == mine
    assert [i.provider_id for i in listing.of("")] == ["kvm://d"] and listing.of("u3") == []


def test_list_asks_the_info_module_for_the_owner_tag() -> None:
    runner = Answers(OperationResult(ok=True, result={"instances": [{"provider_id": "k8s://ns/p"}, "junk"]}))
    listing = client(runner, ProviderType.KUBERNETES).list_instances("owner-1")
    [(provider, verb, [operation])] = runner.calls
    assert (provider, verb, operation.module) == ("lab", "list", "k8s_proxy_info")
    assert operation.args == {"provider_config": "/etc/providers.yaml", "provider": "lab",
                              "tags": {OWNER_TAG: "owner-1"}}
    assert listing.complete and [i.provider_id for i in listing.instances] == ["k8s://ns/p"]


def test_a_failed_listing_keeps_what_the_reachable_locations_returned() -> None:
    runner = Answers(OperationResult.failure(ErrorClass.TRANSIENT, "host h2 unreachable",
                                             {"instances": [{"provider_id": "kvm://hosts/h1/domains/a"}]}))
    listing = client(runner).list_instances("owner")
    assert not listing.complete and str(listing.error) == "transient: host h2 unreachable"
    assert [i.provider_id for i in listing.instances] == ["kvm://hosts/h1/domains/a"]


def test_a_listing_that_says_nothing_is_not_an_empty_one() -> None:
    listing = client(Answers(OperationResult(ok=True, result={"changed": False}))).list_instances("owner")
    assert listing.error is not None and listing.error.error_class is ErrorClass.TRANSIENT


def test_get_and_delete_are_one_batch_run_each_with_every_key() -> None:
    runner = Answers(OperationResult(ok=True, result={"results": [ok_item("a"), ok_item("b")]}),
                     OperationResult(ok=True, result={"results": [{"ok": True}, {"ok": True}]}))
    targets = [Target("u1", "kvm://a"), Target("u2", "kvm://b")]
    assert len(client(runner).get(targets)) == 2
    assert all(r.ok for r in client(runner).delete(targets, verb="gc"))
    (_, get_verb, [get]), (_, delete_verb, [delete]) = runner.calls
    assert (get_verb, get.module, get.args["provider_ids"], get.keys) == ("get", "kvm_proxy_info",
                                                                          ["kvm://a", "kvm://b"], ("u1", "u2"))
    assert (delete_verb, delete.module) == ("gc", "kvm_proxy")
    assert delete.args["operations"] == [{"state": "absent", "provider_id": "kvm://a", "key": "u1"},
                                         {"state": "absent", "provider_id": "kvm://b", "key": "u2"}]


def test_an_empty_batch_runs_nothing() -> None:
    runner = Answers()
    assert client(runner).get([]) == [] and client(runner).create([]) == [] and runner.calls == []


@pytest.mark.parametrize(("provider_type", "progress"), [(ProviderType.KVM, "progress_path"), (ProviderType.GCP, "")])
def test_a_create_sends_base64_user_data_and_only_kvm_reports_progress(provider_type: ProviderType,
                                                                       progress: str) -> None:
    proxy = Proxy("crawlers", "eu-1", "uid-1", {"provider": "lab", "cloudInit": "#cloud-config\n{{ x }}"})
    request = CreateRequest.for_proxy(proxy, "owner", "p-crawlers-eu-1-abc", "hash1")
    runner = Answers(OperationResult(ok=True, result={"results": [ok_item("p")]}))
    client(runner, provider_type).create([request])
    [(_, _, [operation])] = runner.calls
    [item] = operation.args["operations"]
    assert operation.module == f"{provider_type.module_prefix}_proxy" and operation.progress_option == progress
    assert base64.b64decode(item["user_data"]).decode() == "#cloud-config\n{{ x }}"
    assert (item["user_data_encoding"], item["port"], item["key"]) == ("base64", 3128, "uid-1")
    assert item["tags"] == {OWNER_TAG: "owner", PROXY_TAG: "crawlers/eu-1", UID_TAG: "uid-1", SPEC_HASH_TAG: "hash1"}
    assert not {"location", "machine_type", "image", "access"} & set(item)


def test_a_create_passes_base64_user_data_and_optional_fields_as_they_are() -> None:
    proxy = Proxy("crawlers", "eu-1", "uid-1", {"cloudInit": "aGk=", "cloudInitEncoding": "base64", "port": 8080,
                                                "location": "h2", "machineType": "e2-small", "image": "debian-12"})
    access = AccessRequest(users=(("crawl-crawlers", "$2b$hash"),), allowed_sources=("10.0.0.0/8",), generation="g1",
                           allowed_destinations=("192.168.122.1/32",), policy_version="2")
    args = CreateRequest.for_proxy(proxy, "owner", "p-x", "hash1", access).arguments()
    assert (args["user_data"], args["port"], args["location"], args["machine_type"], args["image"]) == (
        "aGk=", 8080, "h2", "e2-small", "debian-12")
    assert args["access"] == {"users": [{"name": "crawl-crawlers", "password_hash": "$2b$hash"}],
                              "allowed_sources": ["10.0.0.0/8"], "allowed_destinations": ["192.168.122.1/32"],
                              "open": False}


def test_the_access_fingerprint_changes_with_what_must_replace_an_instance() -> None:
    base = AccessRequest(users=(), allowed_sources=("10.0.0.0/8",), generation="g1")
    others = [AccessRequest(users=(), allowed_sources=("10.0.0.0/8",), generation="g2"),
              AccessRequest(users=(), allowed_sources=("192.0.2.0/24",), generation="g1"),
              AccessRequest(users=(), allowed_sources=("10.0.0.0/8",), open=True, generation="g1"),
              AccessRequest(users=(), allowed_sources=("10.0.0.0/8",), generation="g1",
                            allowed_destinations=("192.168.122.1/32",)),
              # A new access policy in the collection replaces the instances built with the old one.
              AccessRequest(users=(), allowed_sources=("10.0.0.0/8",), generation="g1", policy_version="3")]
    assert len({base.fingerprint, *(o.fingerprint for o in others)}) == 6
    assert AccessRequest(users=(("u", "other-hash"),), allowed_sources=("10.0.0.0/8",),
                         generation="g1").fingerprint == base.fingerprint


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "o", "providers": [
        {"name": "home-kvm", "type": "kvm"}, {"name": "cluster", "type": "kubernetes", "allowedDestinations": [
            "10.128.0.0/20"]}, {"name": "odd", "type": "x"}]}))
    return path


def test_check_config_names_valid_and_invalid_providers_and_reuses_an_unchanged_file(config: Path) -> None:
    runner = FakeRunner(invalid_providers={"cluster": ["providers[1].kubernetes: is required"]})
    providers = check_config(runner, str(config))
    assert providers.owner == "o" and set(providers.types) == {"home-kvm", "cluster"}
    assert providers.invalid == {"cluster": ("providers[1].kubernetes: is required",),
                                 "odd": ("unknown provider type 'x'",)}
    assert set(providers.clients(runner)) == {"home-kvm"} and not providers.valid
    assert providers.destinations == {"home-kvm": (), "cluster": ("10.128.0.0/20",), "odd": ()}
    assert providers.policy_version == POLICY_VERSION
    assert check_config(runner, str(config), providers) is providers and len(runner.calls) == 1
    config.write_text(config.read_text() + "# changed\n")
    assert check_config(runner, str(config), providers) is not providers


def test_an_unusable_config_is_unreadable(tmp_path: Path, config: Path) -> None:
    with pytest.raises(ConfigUnreadable, match="cannot read it"):
        check_config(FakeRunner(), str(tmp_path / "missing.yaml"))
    no_owner = Answers(OperationResult(ok=True, result={"errors": ["owner: is required"], "providers": []}))
    with pytest.raises(ConfigUnreadable, match="owner: is required"):
        check_config(no_owner, str(config))
    with pytest.raises(ConfigUnreadable, match="not YAML"):
        check_config(Answers(OperationResult.failure(ErrorClass.PERMANENT, "not YAML")), str(config))


def test_probe_settings_are_typed_from_the_validators_wire_form() -> None:
    wire = {"enabled": True, "httpUrl": "http://example.test/", "keyFile": "/etc/probe/key", "expectStatus": "200",
            "connect": "", "egressEchoUrl": None, "controlUrl": None, "timeoutSeconds": 5, "unhealthyAfterSeconds": 300,
            "startupSeconds": 900, "concurrency": "50", "roundSeconds": 20, "flapWindow": "40", "flapPercent": 30}
    assert ProbeSettings.from_result(wire) == ProbeSettings(
        enabled=True, http_url="http://example.test/", key_file="/etc/probe/key", expect_status=200, connect=None,
        egress_echo_url=None, control_url=None, timeout_seconds=5.0, unhealthy_after_seconds=300.0,
        startup_seconds=900.0, concurrency=50, round_seconds=20.0, flap_window=40, flap_percent=30)
    # No probe section: no target named, and no default of the controller's own fills one in.
    unnamed = ProbeSettings.from_result({**wire, "httpUrl": None, "keyFile": None})
    assert (unnamed.http_url, unnamed.key_file) == (None, None)


def test_a_provider_whose_probe_settings_are_unusable_is_invalid_naming_the_mismatch(config: Path) -> None:
    answer = OperationResult(ok=True, result={"owner": "o", "errors": [], "providers": [
        {"name": "home-kvm", "type": "kvm", "valid": True, "probe": {"enabled": False}},
        {"name": "cluster", "type": "kubernetes", "valid": True,
         "probe": CollectionProbeSettings(enabled=False).as_dict()}]})
    providers = check_config(Answers(answer), str(config))
    [why] = providers.invalid["home-kvm"]
    assert "returned no usable probe settings" in why and "install matching versions" in why
    assert "cluster" not in providers.invalid and not providers.probes["cluster"].enabled
