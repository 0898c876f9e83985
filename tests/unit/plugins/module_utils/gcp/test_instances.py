"""The GCP provider in-process: the real client against the Compute emulator, no Ansible.

The module-level runs (tests/integration/test_gcp_modules.py) cost seconds each; the
finer cases of the same behaviour run here in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import GcpSettings, parse_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp import client as client_module
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import ComputeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.instances import (
    GcpProvider,
    state_of,
    utc_created,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import TAGS_METADATA_KEY, encode_tags
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from support.compute_emulator import ComputeEmulator

ZONES = ("europe-west1-b", "europe-west4-a")
TAGS = {"crawl.example.com/owner": "test-owner", "crawl.example.com/proxy": "crawlers/eu-1"}
NAME = "crawlers-eu-1-3f9c2a"


def gcp_settings(endpoint: str) -> GcpSettings:
    document = {"owner": "test-owner", "providers": [{"name": "cloud", "type": "gcp", "gcp": {
        "project": "test-project", "zones": list(ZONES), "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"}, "apiEndpoint": endpoint}}]}
    settings = parse_provider_config(document).providers[0].gcp
    assert settings is not None
    return settings


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(zones=(*ZONES, "us-central1-a")) as running:
        yield running


@pytest.fixture
def provider(emulator: ComputeEmulator) -> Iterator[GcpProvider]:
    settings = gcp_settings(emulator.endpoint)
    made = GcpProvider(settings, ComputeClient(settings))
    yield made
    made.close()


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


def test_an_operation_that_does_not_finish_in_time_is_transient(provider: GcpProvider,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
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
        GcpProvider(settings, ComputeClient(settings)).get(pid(ZONES[0]))


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
    provider = GcpProvider(without_nat, ComputeClient(without_nat))
    _, created = provider.create(request(location=ZONES[0]), False)
    assert created.ip is not None and created.ip.startswith("10.128.")
    assert "accessConfigs" not in str(emulator.requests_to("POST", "/instances$")[0].body)


@pytest.mark.parametrize(
    ("status", "state"),
    [("PROVISIONING", "pending"), ("STAGING", "pending"), ("REPAIRING", "pending"), ("RUNNING", "running"),
     ("STOPPING", "stopped"), ("STOPPED", "stopped"), ("SUSPENDING", "stopped"), ("SUSPENDED", "stopped"),
     ("TERMINATED", "stopped"), ("SOMETHING_NEW", "error")],
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
