"""The GCP provider in-process: the real client against the Compute emulator, no Ansible.

The module-level runs (tests/integration/test_gcp_modules.py) cost seconds each; the
finer cases of the same behaviour run here in milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.oauth2.credentials import Credentials as OAuthCredentials

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    DEFAULT_ALLOWED_SOURCES,
    parse_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import NotFound, Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp import client as client_module
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.checks import check_backend
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import ComputeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import ProviderIdentity
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.instances import (
    GcpProvider,
    state_of,
    utc_created,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import TAGS_METADATA_KEY, encode_tags
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access
from support.compute.emulator import DEFAULT_VM_SCOPES, ComputeEmulator

ZONES = ("europe-west1-b", "europe-west4-a")
TAGS = {"crawl.example.com/owner": "test-owner", "crawl.example.com/proxy": "crawlers/eu-1"}
NAME = "crawlers-eu-1-3f9c2a"
IDENTITY = ProviderIdentity("cloud", "test-owner", DEFAULT_ALLOWED_SOURCES)


def gcp_settings(endpoint: str, **gcp: Any) -> GcpSettings:
    document = {"owner": "test-owner", "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": {
        "project": "test-project", "zones": list(ZONES), "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"}, "apiEndpoint": endpoint,
        **gcp}}]}
    settings = parse_provider_config(document).providers[0].gcp
    assert settings is not None
    return settings


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(zones=(*ZONES, "us-central1-a")) as running:
        yield running


@pytest.fixture
def warnings() -> list[str]:
    return []


@pytest.fixture
def provider(emulator: ComputeEmulator, warnings: list[str]) -> Iterator[GcpProvider]:
    settings = gcp_settings(emulator.endpoint)
    made = GcpProvider(settings, ComputeClient(settings), IDENTITY, warnings.append)
    yield made
    made.close()


def provider_for(emulator: ComputeEmulator, warnings: list[str] | None = None, **gcp: Any) -> GcpProvider:
    settings = gcp_settings(emulator.endpoint, **gcp)
    return GcpProvider(settings, ComputeClient(settings), IDENTITY, None if warnings is None else warnings.append)


def request(**overrides: Any) -> InstanceRequest:
    values: dict[str, Any] = {"name": NAME, "user_data": b"#cloud-config\n", "tags": TAGS, **overrides}
    return InstanceRequest(**values)


def seed(emulator: ComputeEmulator, zone: str, name: str = NAME, tags: dict[str, str] = TAGS) -> None:
    labels, tags_json = encode_tags(tags)
    emulator.add_instance(zone, name, labels=labels, metadata={TAGS_METADATA_KEY: tags_json})


def pid(zone: str, name: str = NAME, project: str = "test-project") -> str:
    return f"gce://{project}/zones/{zone}/instances/{name}"


@pytest.mark.parametrize(
    ("action", "field"),
    [
        (lambda p: p.create(request(machine_type="huge"), False), "machine_type"),
        (lambda p: p.create(request(image="windows-95"), False), "image"),
        (lambda p: p.create(request(location="us-central1-a"), False), "location"),
        (lambda p: p.create(request(tags={"crawl.example.com/owner": "A B"}), False),
         "tags.crawl.example.com/owner"),
        (lambda p: p.get(pid(ZONES[0], project="other-project")), "provider_id"),
        (lambda p: p.delete(pid(ZONES[0], project="other-project"), False), "provider_id"),
        (lambda p: p.get("kvm://hosts/h1/domains/x"), "provider_id"),
        (lambda p: p.get(pid("Europe West")), "provider_id"),
    ],
    ids=["machine_type", "image", "unconfigured-zone", "owner-not-a-label", "other-project-get",
         "other-project-delete", "kvm-provider-id", "malformed-zone"],
)
def test_bad_input_is_permanent_naming_the_field_before_any_call(provider: GcpProvider, emulator: ComputeEmulator,
                                                                 action: Any, field: str) -> None:
    with pytest.raises(Permanent) as caught:
        action(provider)
    assert str(caught.value).startswith(field + ":")
    assert emulator.requests == []


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [("ZONE_RESOURCE_POOL_EXHAUSTED", 503, Transient), ("QUOTA_EXCEEDED", 403, Transient),
     ("RESOURCE_NOT_FOUND", 404, Permanent), ("INVALID_FIELD_VALUE", 400, Permanent)],
)
def test_a_failed_operation_is_classified_and_leaves_nothing(provider: GcpProvider, emulator: ComputeEmulator,
                                                             code: str, status: int, expected: type) -> None:
    emulator.fail_next_operation(code, "the operation failed", status)
    with pytest.raises(expected, match=code):
        provider.create(request(location=ZONES[0]), False)
    assert emulator.instances == {}


def test_an_operation_that_does_not_finish_in_time_is_transient(emulator: ComputeEmulator,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    provider = provider_for(emulator, firewall="external")  # only the insert's operation
    monkeypatch.setattr(client_module, "OPERATION_TIMEOUT_SECONDS", 0.0)
    with pytest.raises(Transient, match="still not done"):
        provider.create(request(location=ZONES[0]), False)
    # The retry finds it by name instead of making a second one.
    changed, found = provider.create(request(location=ZONES[0]), False)
    assert (changed, found.name) == (False, NAME)


def test_an_unreachable_endpoint_is_transient(emulator: ComputeEmulator) -> None:
    endpoint = emulator.endpoint
    emulator.__exit__(None, None, None)  # nothing listens there any more
    settings = gcp_settings(endpoint)
    with pytest.raises(Transient, match="ConnectionError"):
        GcpProvider(settings, ComputeClient(settings), IDENTITY).get(pid(ZONES[0]))


def test_a_conflict_on_insert_means_it_exists(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0])
    emulator.fail_next("GET", NAME + "$", 404)  # made by a concurrent run between our get and our insert
    changed, found = provider.create(request(location=ZONES[0]), False)
    assert (changed, found.provider_id) == (False, pid(ZONES[0]))


def test_a_foreign_instance_is_neither_adopted_nor_deleted(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    emulator.add_instance(ZONES[0], NAME)
    with pytest.raises(Permanent, match=r"^name: .*not made by egress-proxies"):
        provider.create(request(location=ZONES[0]), False)
    with pytest.raises(Permanent, match=r"^provider_id: .*refusing to touch it"):
        provider.delete(pid(ZONES[0]), False)
    assert (ZONES[0], NAME) in emulator.instances


def test_check_mode_deletes_nothing(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0])
    assert provider.delete(pid(ZONES[0]), check_mode=True) is True
    assert provider.delete(pid(ZONES[1]), check_mode=True) is False
    assert (ZONES[0], NAME) in emulator.instances
    assert emulator.requests_to("DELETE", ".") == []


def test_check_mode_creates_nothing(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    changed, planned = provider.create(request(), check_mode=True)
    assert (changed, planned.provider_id, planned.state) == (True, pid(ZONES[0]), "pending")
    assert emulator.requests_to("POST", ".") == []


def test_deleting_in_a_retired_zone_succeeds(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    emulator.retire_zone(ZONES[1])
    assert provider.delete(pid(ZONES[1]), False) is False


def test_placement_refuses_when_a_zone_cannot_be_listed(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    emulator.set_unreachable(ZONES[1])
    with pytest.raises(Transient, match=f"cannot place {NAME}: listing failed in zone.*{ZONES[1]}"):
        provider.create(request(), False)
    assert emulator.instances == {}


def test_listing_matches_the_other_tags_client_side(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0], "p-0")
    seed(emulator, ZONES[1], "p-1", {**TAGS, "crawl.example.com/proxy": "crawlers/other"})
    listed = provider.list({**TAGS, "crawl.example.com/proxy": "crawlers/other"})
    assert [i.provider_id for i in listed.instances] == [pid(ZONES[1], "p-1")]
    assert listed.failed_locations == {}
    assert len(emulator.requests) == 1


def test_an_owner_that_cannot_be_a_label_lists_nothing_without_asking(provider: GcpProvider,
                                                                      emulator: ComputeEmulator) -> None:
    assert provider.list({"crawl.example.com/owner": "Not A Label"}).instances == []
    assert emulator.requests == []


def test_the_internal_ip_is_used_without_a_nat(emulator: ComputeEmulator) -> None:
    settings = gcp_settings(emulator.endpoint)
    without_nat = GcpSettings(**{**settings.__dict__, "external_ip": False})
    provider = GcpProvider(without_nat, ComputeClient(without_nat), IDENTITY)
    _, created = provider.create(request(location=ZONES[0]), False)
    assert created.ip is not None and created.ip.startswith("10.128.")
    assert "accessConfigs" not in str(emulator.requests_to("POST", "/instances$")[0].body)


@pytest.mark.parametrize(
    ("status", "state"),
    # Every value of Instance.Status in the Compute API (compute.proto); see STATES for why.
    [("PROVISIONING", "pending"), ("STAGING", "pending"), ("PENDING", "pending"), ("REPAIRING", "pending"),
     ("RUNNING", "running"), ("STOPPING", "stopped"), ("PENDING_STOP", "stopped"), ("STOPPED", "stopped"),
     ("SUSPENDING", "stopped"), ("SUSPENDED", "stopped"), ("TERMINATED", "stopped"),
     ("DEPROVISIONING", "stopped"), ("SOMETHING_NEW", "error")],
)
def test_status_maps_to_state(status: str, state: str) -> None:
    assert state_of(status) == state


@pytest.mark.parametrize(
    ("stamp", "utc"),
    [("2026-01-02T03:04:05.678-08:00", "2026-01-02T11:04:05Z"), ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05Z"),
     ("garbage", "garbage"), (None, None)],
)
def test_creation_time_is_reported_in_utc(stamp: str | None, utc: str | None) -> None:
    assert utc_created(stamp) == utc


# -- issue 14: the provider against the real Compute API's behaviour ----------------------------


def scale_time(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """Every time constant of the client scaled by ``factor`` (the emulator's hold is scaled
    alike by the test), so minutes of real API time take seconds here."""
    for name in dir(client_module):
        value = getattr(client_module, name)
        if name.endswith("_SECONDS") and isinstance(value, float):
            monkeypatch.setattr(client_module, name, value * factor)


def test_an_operation_longer_than_one_wait_hold_is_waited_out(emulator: ComputeEmulator,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # zoneOperations.wait holds each call up to 2 minutes; an insert taking 3 minutes spans two
    # wait calls. Scaled 1:60 (hold 2 s, operation 3 s): a client whose per-call timeout is
    # below the hold (the old 90 s) times out on the first call instead of being answered.
    scale_time(monkeypatch, 1 / 60)
    emulator.wait_hold_seconds = 120 / 60
    emulator.operation_seconds = 180 / 60
    provider = provider_for(emulator, firewall="external")  # only the insert's operation
    changed, created = provider.create(request(location=ZONES[0]), False)
    assert (changed, created.state) == (True, "running")
    waits = emulator.requests_to("POST", r"/operations/[^/]+/wait$")
    assert len(waits) == 2  # the first held to its end and answered RUNNING, the second DONE


def test_a_slow_delete_is_retried_while_still_deleting(emulator: ComputeEmulator,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    provider = provider_for(emulator, firewall="external")  # only the instance's operations
    provider.create(request(location=ZONES[0]), False)
    emulator.operation_seconds = 1.5
    emulator.wait_hold_seconds = 0.2
    monkeypatch.setattr(client_module, "OPERATION_TIMEOUT_SECONDS", 0.3)
    with pytest.raises(Transient, match="still not done"):
        provider.delete(pid(ZONES[0]), False)
    # The retry comes while GCE is still deleting: 400 resourceNotReady is transient, not permanent.
    with pytest.raises(Transient, match="in transition"):
        provider.delete(pid(ZONES[0]), False)
    assert emulator.instances[(ZONES[0], NAME)]["status"] == "STOPPING"
    time.sleep(1.5)
    assert provider.delete(pid(ZONES[0]), False) is False  # gone meanwhile
    assert emulator.instances == {}


def test_a_stock_out_moves_the_insert_to_the_next_zone_and_says_so(provider: GcpProvider, emulator: ComputeEmulator,
                                                                   warnings: list[str]) -> None:
    emulator.stock_out(ZONES[0])  # the least-loaded zone, so placement picks it first
    changed, created = provider.create(request(), False)
    assert (changed, created.location, created.state) == (True, ZONES[1], "running")
    inserts = emulator.requests_to("POST", r"/instances$")
    assert [r.path.split("/")[6] for r in inserts] == [ZONES[0], ZONES[1]]
    assert emulator.zones_of(NAME) == [ZONES[1]]
    assert len(warnings) == 1
    assert f"placed in zone {ZONES[1]} because zone {ZONES[0]} was out of capacity" in warnings[0]
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in warnings[0]


def test_a_stock_out_where_the_instance_cannot_move_is_transient_and_says_why(provider: GcpProvider,
                                                                              emulator: ComputeEmulator) -> None:
    emulator.stock_out(ZONES[0], "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    with pytest.raises(Transient, match=f"out of capacity: .*location pins it to zone {ZONES[0]}"):
        provider.create(request(location=ZONES[0]), False)
    emulator.stock_out(ZONES[1])
    with pytest.raises(Transient, match=r"out of capacity: .*every zone it may go to .* was tried; will retry"):
        provider.create(request(), False)
    assert emulator.instances == {}
    emulator.restock(ZONES[1])
    assert provider.create(request(), False)[1].location == ZONES[1]


@pytest.mark.parametrize(
    ("break_it", "field", "answer"),
    [(lambda e: e.images.clear(), "image", ("404 ", ("The resource 'projects/debian-cloud/global/images/family/"
                                                   "debian-12' was not found"))),
     (lambda e: e.machine_types[ZONES[0]].discard("e2-small"), "machine_type",
      ("400 ", f"Machine type with name 'e2-small' does not exist in zone '{ZONES[0]}'."))],
    ids=["image", "machine_type"],
)
def test_a_missing_image_or_machine_type_on_insert_is_permanent_naming_the_field(
        provider: GcpProvider, emulator: ComputeEmulator, break_it: Any, field: str, answer: tuple[str, str]) -> None:
    break_it(emulator)
    with pytest.raises(Permanent) as caught:
        provider.create(request(location=ZONES[0]), False)
    message = str(caught.value)
    assert message.startswith(field + ":"), message
    assert all(part in message for part in answer), message
    assert emulator.instances == {}
    assert emulator.requests_to("POST", r"/zones/.*/operations/") == []  # refused synchronously, no operation


def test_a_zone_that_does_not_exist_is_not_found_for_get_and_delete(provider: GcpProvider,
                                                                    emulator: ComputeEmulator) -> None:
    emulator.retire_zone(ZONES[1])  # the API answers 400 invalid "Unknown zone", not 404
    with pytest.raises(NotFound, match="Unknown zone"):
        provider.get(pid(ZONES[1]))
    assert provider.delete(pid(ZONES[1]), False) is False


def test_a_configured_zone_that_does_not_exist_fails_alone_and_permanently(provider: GcpProvider,
                                                                           emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0])
    emulator.retire_zone(ZONES[1])
    listed = provider.list(TAGS)
    assert [i.provider_id for i in listed.instances] == [pid(ZONES[0])]
    assert list(listed.failed_locations) == [ZONES[1]]
    failure = listed.failed_locations[ZONES[1]]
    assert isinstance(failure, Permanent) and "Unknown zone" in str(failure) and "gcp.zones" in str(failure)


def test_one_unreachable_zone_fails_only_that_zone(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0])
    emulator.set_unreachable(ZONES[1])
    listed = provider.list(TAGS)
    assert [i.provider_id for i in listed.instances] == [pid(ZONES[0])]
    assert list(listed.failed_locations) == [ZONES[1]]
    assert isinstance(listed.failed_locations[ZONES[1]], Transient)
    # The aggregated call failed whole (no returnPartialSuccess), then one list per zone, side by side.
    asked = [r.path.rsplit("/", 2)[-2] for r in emulator.requests]
    assert asked[0] == "aggregated" and sorted(asked[1:]) == sorted(ZONES)


def test_listing_follows_every_page(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    for index in range(501):  # one more than a page holds (maxResults is at most 500)
        seed(emulator, ZONES[index % 2], f"p-{index}")
    listed = provider.list(TAGS)
    assert len(listed.instances) == 501 and listed.failed_locations == {}
    pages = emulator.requests_to("GET", "/aggregated/instances$")
    assert len(pages) == 2 and "pageToken" in pages[1].query
    assert all(page.query["maxResults"] == ["500"] for page in pages)


def test_a_pinned_machine_type_is_refused_in_another_zone_before_the_api(emulator: ComputeEmulator) -> None:
    provider = provider_for(emulator, defaultMachineType="small", machineTypes={
        "small": "e2-small", "big": f"zones/{ZONES[0]}/machineTypes/n2-standard-2"})
    with pytest.raises(Permanent, match=rf"^machine_type: .*pinned to zone {ZONES[0]} .*zone {ZONES[1]}"):
        provider.create(request(machine_type="big", location=ZONES[1]), False)
    assert emulator.requests == []
    # Without a location it goes to its zone, although placement would prefer the emptier other one.
    seed(emulator, ZONES[0], "p-0")
    _, created = provider.create(request(machine_type="big"), False)
    assert created.location == ZONES[0]
    assert emulator.instances[(ZONES[0], NAME)]["machineType"] == f"zones/{ZONES[0]}/machineTypes/n2-standard-2"
    # A bare name is resolved in whichever zone the instance goes to.
    _, other = provider.create(request(name="p-1", location=ZONES[1]), False)
    assert emulator.instances[(ZONES[1], "p-1")]["machineType"] == f"zones/{ZONES[1]}/machineTypes/e2-small"
    assert other.location == ZONES[1]


def test_a_custom_mode_network_gets_the_subnetwork(emulator: ComputeEmulator) -> None:
    emulator.add_network("crawl-vpc", {"europe-west1": {"egress"}})
    without = provider_for(emulator, zones=[ZONES[0]], network="global/networks/crawl-vpc")
    with pytest.raises(Permanent, match="Subnetwork should be specified for custom subnetmode network"):
        without.create(request(), False)
    subnetwork = "regions/europe-west1/subnetworks/egress"
    provider = provider_for(emulator, zones=[ZONES[0]], network="global/networks/crawl-vpc", subnetwork=subnetwork)
    _, created = provider.create(request(), False)
    assert created.state == "running"
    nic = emulator.instances[(ZONES[0], NAME)]["networkInterfaces"][0]
    assert (nic["network"], nic["subnetwork"]) == ("global/networks/crawl-vpc", subnetwork)


def test_a_subnetwork_that_does_not_exist_is_permanent_naming_it(emulator: ComputeEmulator) -> None:
    emulator.add_network("crawl-vpc", {"europe-west1": {"egress"}})
    provider = provider_for(emulator, zones=[ZONES[0]], network="global/networks/crawl-vpc",
                            subnetwork="regions/europe-west1/subnetworks/typo")
    with pytest.raises(Permanent, match=r"^gcp\.subnetwork: not found: .*subnetworks/typo"):
        provider.create(request(), False)


def test_without_an_external_ip_no_ip_is_reported_and_a_warning_says_why(provider: GcpProvider,
                                                                         emulator: ComputeEmulator,
                                                                         warnings: list[str]) -> None:
    labels, tags_json = encode_tags(TAGS)
    emulator.add_instance(ZONES[0], NAME, labels=labels, metadata={TAGS_METADATA_KEY: tags_json}, nat_ip=False)
    found = provider.get(pid(ZONES[0]))
    assert (found.state, found.ip) == ("running", None)  # never the internal 10.128.x.y
    assert len(warnings) == 1 and "without an external IP" in warnings[0] and "gcp.externalIP" in warnings[0]


def test_a_terminated_instance_is_reported_stopped_for_self_healing(provider: GcpProvider,
                                                                    emulator: ComputeEmulator) -> None:
    # Preemption and host errors leave an instance TERMINATED; it does not come back by itself.
    labels, tags_json = encode_tags(TAGS)
    emulator.add_instance(ZONES[0], NAME, labels=labels, metadata={TAGS_METADATA_KEY: tags_json}, status="TERMINATED")
    changed, found = provider.create(request(), False)
    assert (changed, found.state, found.location) == (False, "stopped", ZONES[0])
    assert [i.state for i in provider.list(TAGS).instances] == ["stopped"]


# -- what a stock image runs (issue 29, GCP row 1) -------------------------------------------------


def test_on_a_stock_debian_image_the_startup_script_installs_squid_since_user_data_never_runs(
        provider: GcpProvider, emulator: ComputeEmulator) -> None:
    # Debian's GCE image runs the startup-script and no user-data (the emulator's ImageKind):
    # a cloudInit installing squid does nothing there, so the provider's own script must.
    cloud_config = b"#cloud-config\npackages: [squid]\n"
    provider.create(request(location=ZONES[0], user_data=cloud_config), False)
    boot = emulator.boot(ZONES[0], NAME)
    assert boot.user_data is None
    script = boot.startup_script
    assert script is not None and script.startswith("#!/bin/sh\n")
    assert "apt-get" in script and "install squid" in script and "cloud-init status --wait" in script
    assert emulator.metadata(ZONES[0], NAME)["user-data"] == cloud_config.decode()  # still the user's, untouched


def test_where_cloud_init_exists_the_user_data_runs_and_the_script_waits_for_it(emulator: ComputeEmulator) -> None:
    ubuntu = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
    provider = provider_for(emulator, images={"ubuntu": ubuntu})
    provider.create(request(location=ZONES[0]), False)
    boot = emulator.boot(ZONES[0], NAME)
    assert boot.user_data == "#cloud-config\n" and boot.startup_script is not None


# -- the firewall (row 2) -------------------------------------------------------------------------

CRAWLER = "198.51.100.7"
# A user as the controller hands it to the module (a bcrypt-shaped hash; nothing checks it here).
USER = {"name": "crawlers", "password_hash": "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"}


def our_rules(emulator: ComputeEmulator) -> list[dict[str, Any]]:
    return [rule for rule in emulator.firewalls.values() if rule["name"].startswith("egress-proxies-")]


def firewall_writes(emulator: ComputeEmulator) -> int:
    return len([r for r in emulator.requests if "/global/firewalls" in r.path and r.method != "GET"])


def test_each_opening_gets_a_rule_of_its_own_which_goes_with_its_last_instance(
        provider: GcpProvider, emulator: ComputeEmulator) -> None:
    # The default VPC admits nothing on the proxy port from outside (implied deny ingress); the
    # provider keeps one rule per opening (port, IPv4 sources) for the instances tagged with it.
    crawlers = parse_access({"open": True, "allowed_sources": ["198.51.100.0/24", "fd00::/8"]})
    others = parse_access({"open": True, "allowed_sources": ["192.0.2.0/24"]})
    provider.create(request(location=ZONES[0], access=crawlers, port=8080), False)
    assert emulator.reachable(CRAWLER, ZONES[0], NAME, 8080)
    assert not emulator.reachable("203.0.113.9", ZONES[0], NAME, 8080)  # not an allowed source
    assert not emulator.reachable(CRAWLER, ZONES[0], NAME, 3128)  # not its port
    provider.create(request(name="p-2", location=ZONES[1], access=others), False)
    provider.create(request(name="p-3", location=ZONES[1], access=others), False)
    rules = {tuple(rule["targetTags"]): (rule["sourceRanges"], rule["allowed"]) for rule in our_rules(emulator)}
    assert sorted(rules.values()) == [(["192.0.2.0/24"], [{"IPProtocol": "tcp", "ports": ["3128"]}]),
                                      (["198.51.100.0/24"], [{"IPProtocol": "tcp", "ports": ["8080"]}])]
    # Each instance carries its own opening's tag only; p-2 and p-3 share theirs (the same opening).
    tags = {name: emulator.instances[(zone, name)]["tags"]["items"]
            for zone, name in ((ZONES[0], NAME), (ZONES[1], "p-2"), (ZONES[1], "p-3"))}
    assert all(len(items) == 1 and (items[0],) in rules for items in tags.values())
    assert tags["p-2"] == tags["p-3"] != tags[NAME]
    # Idempotent: the same create again writes nothing.
    writes = firewall_writes(emulator)
    assert provider.create(request(location=ZONES[0], access=crawlers, port=8080), False)[0] is False
    assert firewall_writes(emulator) == writes
    # Kept in step: a rule stays while an instance carries its tag, and goes with the last one.
    assert provider.delete(pid(ZONES[1], "p-2"), False) is True
    assert len(our_rules(emulator)) == 2
    assert provider.delete(pid(ZONES[1], "p-3"), False) is True
    (rule,) = our_rules(emulator)
    assert (rule["sourceRanges"], rule["allowed"]) == (["198.51.100.0/24"], [{"IPProtocol": "tcp", "ports": ["8080"]}])
    assert provider.delete(pid(ZONES[0]), False) is True
    assert our_rules(emulator) == []
    assert {r["name"] for r in emulator.firewalls.values()} >= {"default-allow-ssh", "default-allow-internal"}


def test_one_tenants_sources_never_reach_another_tenants_proxy(provider: GcpProvider,
                                                               emulator: ComputeEmulator) -> None:
    # Issue 38 row 3: tenant A on port 8080 from its own range, B on 3128 from another. One rule
    # for the provider admitted both ranges to both ports on every instance: B's address reached
    # A's port 8080. Now each instance is reachable from its own sources on its own port only.
    tenant_a = parse_access({"users": [USER], "allowed_sources": ["203.0.113.0/24"]})
    tenant_b = parse_access({"users": [USER], "allowed_sources": ["198.51.100.0/24"]})
    provider.create(request(name="tenant-a", location=ZONES[0], access=tenant_a, port=8080), False)
    provider.create(request(name="tenant-b", location=ZONES[0], access=tenant_b), False)
    a_address, b_address = "203.0.113.9", CRAWLER
    assert emulator.reachable(a_address, ZONES[0], "tenant-a", 8080)
    assert emulator.reachable(b_address, ZONES[0], "tenant-b", 3128)
    for source, name, port in ((b_address, "tenant-a", 8080), (b_address, "tenant-a", 3128),
                               (a_address, "tenant-b", 3128), (a_address, "tenant-b", 8080)):
        assert not emulator.reachable(source, ZONES[0], name, port), (source, name, port)
    # No rule of the provider's opens anything but a proxy port to a listed source.
    assert all(rule["sourceRanges"] != ["0.0.0.0/0"] and rule["allowed"][0]["ports"] != ["22"]
               for rule in our_rules(emulator))
    # A tenant with users and no sources asks for no address: refused, not opened to everyone.
    users_only = parse_access({"users": [USER]})
    with pytest.raises(Permanent, match=r"^access\.allowed_sources: no IPv4 network to admit to port 3128: .*"
                                        r"0\.0\.0\.0/0 written out for any address"):
        provider.create(request(name="tenant-c", location=ZONES[0], access=users_only), False)
    assert (ZONES[0], "tenant-c") not in emulator.instances
    # Written out, the whole Internet is what that tenant gets, on its own instance only.
    anywhere = parse_access({"users": [USER], "allowed_sources": ["0.0.0.0/0"]})
    provider.create(request(name="tenant-d", location=ZONES[0], access=anywhere, port=9090), False)
    assert emulator.reachable(a_address, ZONES[0], "tenant-d", 9090)
    assert not emulator.reachable("192.0.2.1", ZONES[0], "tenant-a", 8080)
    assert not emulator.reachable("192.0.2.1", ZONES[0], "tenant-b", 3128)


def test_the_legacy_provider_rule_stays_while_an_instance_carries_its_tag_and_goes_with_the_last(
        provider: GcpProvider, emulator: ComputeEmulator) -> None:
    # Before issue 38 every instance carried the provider's one tag and its union rule. Those
    # instances keep it until they are gone; no new instance gets the tag, nothing widens it.
    legacy = provider.firewall.legacy_name
    seed(emulator, ZONES[0], "old-1")
    emulator.instances[(ZONES[0], "old-1")]["tags"] = {"items": [legacy]}
    emulator.firewalls[("test-project", legacy)] = {
        "name": legacy, "network": "projects/test-project/global/networks/default", "direction": "INGRESS",
        "priority": 1000, "sourceRanges": ["10.0.0.0/8"], "targetTags": [legacy],
        "allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}]}
    provider.create(request(location=ZONES[0]), False)
    assert emulator.instances[(ZONES[0], NAME)]["tags"]["items"] != [legacy]
    provider.delete(pid(ZONES[0]), False)
    assert [rule["name"] for rule in our_rules(emulator)] == [legacy]
    provider.delete(pid(ZONES[0], "old-1"), False)
    assert our_rules(emulator) == []


def test_a_failed_listing_never_shrinks_the_rule(provider: GcpProvider, emulator: ComputeEmulator) -> None:
    provider.create(request(location=ZONES[0]), False)
    provider.create(request(name="p-2", location=ZONES[1]), False)
    emulator.set_unreachable(ZONES[1])
    provider.delete(pid(ZONES[0]), False)
    assert len(our_rules(emulator)) == 1  # p-2 may still need its rule: nothing said otherwise
    emulator.clear_faults()
    provider.delete(pid(ZONES[1], "p-2"), False)
    assert our_rules(emulator) == []


def test_with_an_external_firewall_the_provider_only_tags_the_instances(emulator: ComputeEmulator) -> None:
    provider = provider_for(emulator, firewall="external", networkTags=["proxies"])
    provider.create(request(location=ZONES[0]), False)
    assert emulator.instances[(ZONES[0], NAME)]["tags"]["items"] == ["proxies"]
    assert our_rules(emulator) == [] and firewall_writes(emulator) == 0
    assert not emulator.reachable("10.1.2.3", ZONES[0], NAME, 3128)  # closed until the operator opens it


def test_a_firewall_the_provider_may_not_write_fails_the_create_before_any_instance(
        provider: GcpProvider, emulator: ComputeEmulator) -> None:
    emulator.fail_next("POST", r"/global/firewalls$", 403, reason="forbidden")
    rule = r"creating firewall rule egress-proxies-[0-9a-f]{12}-[0-9a-f]{12} in project test-project: 403"
    with pytest.raises(Permanent, match=rule):
        provider.create(request(location=ZONES[0]), False)
    assert emulator.instances == {}


# -- a zone without the machine type (row 3) ----------------------------------------------------


def test_a_zone_without_the_machine_type_is_passed_over_for_the_next(provider: GcpProvider, emulator: ComputeEmulator,
                                                                     warnings: list[str]) -> None:
    # The emptiest zone sorts first; it cannot take e2-small (a 400 invalid on the real API).
    emulator.machine_types[ZONES[0]].discard("e2-small")
    seed(emulator, ZONES[1], "p-0")
    changed, created = provider.create(request(), False)
    assert (changed, created.location) == (True, ZONES[1])
    assert [r.path.split("/")[6] for r in emulator.requests_to("POST", r"/zones/[^/]+/instances$")] == list(ZONES)
    assert len(warnings) == 1 and f"zone {ZONES[0]} does not offer the machine type" in warnings[0]


def test_when_no_zone_offers_the_machine_type_the_failure_names_machine_types(provider: GcpProvider,
                                                                               emulator: ComputeEmulator) -> None:
    for zone in ZONES:
        emulator.machine_types[zone].discard("e2-small")
    with pytest.raises(Permanent) as caught:
        provider.create(request(), False)
    message = str(caught.value)
    assert message.startswith(f"machine_type: 'e2-small' (machineTypes.small) does not exist in zone(s) "
                              f"{ZONES[0]}, {ZONES[1]}: "), message
    assert "fix machineTypes.small" in message and emulator.instances == {}


# -- credentials without the Compute scope (row 4) --------------------------------------------------


def test_a_token_without_the_compute_scope_is_permanent_and_says_what_to_grant(
        emulator: ComputeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    # Application Default Credentials of a VM or GKE node created with the default access scopes:
    # a real token, refused 403 "insufficient authentication scopes" whatever the IAM roles.
    emulator.token_scopes["narrow-token"] = DEFAULT_VM_SCOPES
    monkeypatch.setattr(client_module, "load_credentials",
                        lambda _settings: OAuthCredentials(token="narrow-token"))  # type: ignore[no-untyped-call]
    provider = provider_for(emulator)
    listed = provider.list(TAGS)
    assert set(listed.failed_locations) == set(ZONES)
    failure = listed.failed_locations[ZONES[0]]
    assert isinstance(failure, Permanent), failure
    message = str(failure)
    assert "insufficient authentication scopes" in message
    assert "https://www.googleapis.com/auth/cloud-platform" in message and "Workload Identity" in message
    assert "gcp.credentialsFile" in message


# -- regional quotas (row 5) ------------------------------------------------------------------------


def test_a_regional_quota_moves_the_insert_to_another_region_and_names_the_quota(warnings: list[str]) -> None:
    zones = ("europe-west1-b", "europe-west1-c", "europe-west4-a")
    with ComputeEmulator(zones=zones) as emulator:
        emulator.set_quota("CPUS", 0.0, region="europe-west1")
        provider = provider_for(emulator, warnings, zones=list(zones))
        changed, created = provider.create(request(), False)
        inserts = [r.path.split("/")[6] for r in emulator.requests_to("POST", r"/zones/[^/]+/instances$")]
    assert (changed, created.location) == (True, "europe-west4-a")
    assert inserts == ["europe-west1-b", "europe-west4-a"]  # the region's other zone is not tried
    assert len(warnings) == 1 and "quota CPUS is used up in region europe-west1 (limit 0.0)" in warnings[0]


def test_when_every_region_is_out_of_quota_the_failure_is_transient_and_names_it() -> None:
    zones = ("europe-west1-b", "europe-west4-a")
    with ComputeEmulator(zones=zones) as emulator:
        emulator.set_quota("IN_USE_ADDRESSES", 0.0, region="europe-west1")
        emulator.set_quota("IN_USE_ADDRESSES", 0.0, region="europe-west4")
        provider = provider_for(emulator, zones=list(zones))
        with pytest.raises(Transient) as caught:
            provider.create(request(), False)
        emulator.set_quota("CPUS", 0.0)  # project-wide: the first refusal ends the attempt
        emulator.set_quota("IN_USE_ADDRESSES", 10.0, region="europe-west1")
        with pytest.raises(Transient) as project_wide:
            provider.create(request(), False)
    message = str(caught.value)
    assert message.startswith("quota exceeded: ")
    assert "quota IN_USE_ADDRESSES is used up in region europe-west1" in message
    assert "quota IN_USE_ADDRESSES is used up in region europe-west4" in message
    assert "quota CPUS_ALL_REGIONS is used up in the project (all regions)" in str(project_wide.value)
    assert "no other zone can help" in str(project_wide.value)


# -- polling an operation whose wait answers early (row 6) ------------------------------------------


def test_a_wait_that_answers_early_is_polled_with_backoff(emulator: ComputeEmulator) -> None:
    # zoneOperations.wait may "return after zero seconds" when the server is loaded: without a
    # pause the client would hammer the API until the operation is done.
    emulator.wait_returns_early = True
    emulator.operation_seconds = 1.0
    provider = provider_for(emulator, firewall="external")
    started = time.monotonic()
    assert provider.create(request(location=ZONES[0]), False)[1].state == "running"
    waits = emulator.requests_to("POST", r"/zones/[^/]+/operations/[^/]+/wait$")
    assert 2 <= len(waits) <= 4, len(waits)  # 0 s, 0.5 s, 1.5 s: paused 0.5 s, then 1 s
    assert time.monotonic() - started < 5


# -- the config check (rows 2 and 4) -------------------------------------------------------------


def test_the_config_check_of_an_external_firewall_wants_a_rule_admitting_the_proxy_port(
        emulator: ComputeEmulator) -> None:
    settings = gcp_settings(emulator.endpoint, firewall="external", networkTags=["proxies"])
    (problem,) = check_backend(settings, IDENTITY)
    assert problem.startswith("gcp.firewall: external, but no enabled ingress rule of network global/networks/default "
                              "admits tcp:3128 from 10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.168.0.0/16 to "
                              "instances tagged proxies"), problem
    assert "--target-tags=proxies" in problem and "firewall: managed" in problem
    # The operator's rule for the tag, from the sources, on the port: nothing left to say.
    emulator.firewalls[("test-project", "proxies-in")] = {
        "name": "proxies-in", "network": "projects/test-project/global/networks/default", "direction": "INGRESS",
        "priority": 1000, "sourceRanges": ["0.0.0.0/0"], "targetTags": ["proxies"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["3000-3200"]}]}
    assert check_backend(settings, IDENTITY) == []
    assert check_backend(gcp_settings(emulator.endpoint), IDENTITY) == []  # managed: the rules can be read


def test_the_config_check_says_what_to_grant_for_credentials_without_the_compute_scope(
        emulator: ComputeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator.token_scopes["narrow-token"] = DEFAULT_VM_SCOPES
    monkeypatch.setattr(client_module, "load_credentials",
                        lambda _settings: OAuthCredentials(token="narrow-token"))  # type: ignore[no-untyped-call]
    (problem,) = check_backend(gcp_settings(emulator.endpoint), IDENTITY)
    assert problem.startswith("gcp: listing instances (aggregated): 403 ") and "cloud-platform" in problem


# -- issue 39: quotas read from their structured details (row 3) -----------------------------------


@pytest.mark.parametrize("wording", ["legacy", "bare"])
def test_a_regional_quota_is_found_in_either_wording(wording: str, warnings: list[str]) -> None:
    # The older answer names region and limit in its message; the newer one ("Quota 'N2_CPUS'
    # exceeded.") only in errorDetails[].quotaInfo, which is read first. Either way the insert
    # moves to another region, and the message names the region and the limit.
    zones = ("europe-west1-b", "europe-west4-a")
    with ComputeEmulator(zones=zones, quota_wording=wording) as emulator:
        emulator.set_quota("CPUS", 0.0, region="europe-west1")
        provider = provider_for(emulator, warnings, zones=list(zones))
        changed, created = provider.create(request(), False)
    assert (changed, created.location) == (True, "europe-west4-a")
    assert len(warnings) == 1 and "quota CPUS is used up in region europe-west1 (limit 0.0)" in warnings[0], warnings


def test_a_project_wide_quota_in_the_newer_wording_ends_the_attempt() -> None:
    # quotaInfo without a region dimension, named *_ALL_REGIONS: no other region helps.
    with ComputeEmulator(zones=ZONES, quota_wording="bare") as emulator:
        emulator.set_quota("CPUS", 0.0)
        provider = provider_for(emulator)
        with pytest.raises(Transient, match="quota CPUS_ALL_REGIONS is used up in the project"):
            provider.create(request(), False)
        assert len(emulator.requests_to("POST", r"/zones/[^/]+/instances$")) == 1


def test_a_quota_error_naming_no_region_is_taken_as_the_tried_zones_region() -> None:
    # A 403 quotaExceeded on the insert itself carries no quotaInfo; in the newer wording its
    # message names no region either. The documented choice: the tried zone's region is out, the
    # next region is tried (one insert lost if it was project-wide after all).
    with ComputeEmulator(zones=ZONES, quota_wording="bare") as emulator:
        emulator.set_quota("IN_USE_ADDRESSES", 0.0, region="europe-west1")
        provider = provider_for(emulator)
        changed, created = provider.create(request(), False)
    assert (changed, created.location) == (True, "europe-west4-a")
    failure = client_module.quota_exceeded("creating: 403 Quota 'IN_USE_ADDRESSES' exceeded.", "europe-west1")
    assert failure.region == "europe-west1" and "taken as the tried zone's" in str(failure)


# -- issue 39: concurrent creates never lose a rule (row 4) ------------------------------------------


def test_concurrent_creates_admitting_different_sources_lose_nothing(emulator: ComputeEmulator) -> None:
    # The Firewall resource has no fingerprint to make a read-modify-write safe (compute_v1
    # Firewall: no fingerprint field, unlike Instance.tags or metadata), so no rule is ever
    # read-modified-written: each opening (port, sources) has a rule of its own whose whole
    # content follows from its name, so two writers of one rule write the same thing, and
    # writers of different openings never touch each other's rule.
    emulator.operation_seconds = 0.2  # the creates' firewall writes overlap
    openings = [(f"p-{index}", parse_access({"open": True, "allowed_sources": [f"198.51.{index}.0/24"]}), port)
                for index, port in ((1, 3128), (2, 8080), (3, 3128), (4, 8080))]
    failures: list[BaseException] = []

    def create(name: str, access: Any, port: int) -> None:
        made = provider_for(emulator)
        try:
            made.create(request(name=name, location=ZONES[0], access=access, port=port), False)
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)
        finally:
            made.close()

    threads = [threading.Thread(target=create, args=opening) for opening in openings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    for index, (name, _access, port) in enumerate(openings, start=1):
        assert emulator.reachable(f"198.51.{index}.7", ZONES[0], name, port), name
        others = [f"198.51.{other}.7" for other in range(1, 5) if other != index]
        assert not any(emulator.reachable(source, ZONES[0], name, port) for source in others), name


# -- issue 39: the controller's probe sources (item 1) ------------------------------------------------


def test_probe_sources_are_admitted_besides_the_crawlers_and_nothing_else(emulator: ComputeEmulator) -> None:
    probe = "192.0.2.10"
    identity = ProviderIdentity("cloud", "test-owner", ("198.51.100.0/24",), (f"{probe}/32",))
    settings = gcp_settings(emulator.endpoint)
    provider = GcpProvider(settings, ComputeClient(settings), identity, None)
    try:
        provider.create(request(location=ZONES[0], access=parse_access(
            {"users": [USER], "allowed_sources": ["198.51.100.0/24"]})), False)
        with pytest.raises(Permanent, match=r"^access\.allowed_sources: "):  # users only: nothing implied
            provider.create(request(name="p-2", location=ZONES[0], access=parse_access({"users": [USER]})), False)
    finally:
        provider.close()
    assert emulator.reachable(CRAWLER, ZONES[0], NAME, 3128) and emulator.reachable(probe, ZONES[0], NAME, 3128)
    assert not emulator.reachable("192.0.2.11", ZONES[0], NAME, 3128)
    # squid's source check admits the probe too (else its 403 would fail every probe).
    script = emulator.metadata(ZONES[0], NAME)["startup-script"]
    assert f"{probe}/32" in script


# -- issue 39: no instance without a way out (row 2) --------------------------------------------------


def test_the_config_check_finds_a_region_without_a_way_out(emulator: ComputeEmulator) -> None:
    settings = gcp_settings(emulator.endpoint, externalIP=False)
    (problem,) = check_backend(settings, IDENTITY)
    assert problem.startswith("gcp.externalIP: false, but network default has no Cloud NAT in region(s) "
                              "europe-west1, europe-west4: instances there would have no way out"), problem
    assert "gcloud compute routers nats create" in problem
    emulator.add_cloud_nat("europe-west1", ("198.51.100.20",))
    (problem,) = check_backend(settings, IDENTITY)
    assert "in region(s) europe-west4:" in problem
    emulator.add_cloud_nat("europe-west4", ("198.51.100.30",), name="nat-4")
    assert check_backend(settings, IDENTITY) == []
    assert check_backend(gcp_settings(emulator.endpoint), IDENTITY) == []  # external addresses: no NAT needed
