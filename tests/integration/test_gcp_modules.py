"""The GCP modules through ansible-runner against the Compute REST emulator.

Each module run is its own process driving the real google-cloud-compute client, as
under the controller; the emulator (tests/support/compute_emulator.py) keeps the state
between runs and records every request, so tests can count API calls. A run costs about
2.5 s, so the finer cases (every bad field, operation errors, foreign instances,
credentials) run in-process against the same emulator in
tests/unit/plugins/module_utils/gcp/test_instances.py.
"""

from __future__ import annotations

import base64
import gzip
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import TAGS_METADATA_KEY, encode_tags
from support.ansible_modules import ModuleRun, run_module
from support.compute_emulator import ComputeEmulator
from support.provider_config import OWNER, OWNER_TAGS

PROJECT = "test-project"
ZONES = ("europe-west1-b", "europe-west4-a")
UNCONFIGURED_ZONE = "us-central1-a"  # exists in the project, not in the provider config
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
TAGS = {**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/eu-1", "crawl.example.com/uid": "0b6f4c1e-9d1a-4f2e",
        "crawl.example.com/spec-hash": "3f9c2a0d11e4b7aa"}
NAME = "crawlers-eu-1-3f9c2a"


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(*ZONES, UNCONFIGURED_ZONE)) as running:
        yield running


def write_config(path: Path, emulator: ComputeEmulator, **overrides: Any) -> Path:
    gcp: dict[str, Any] = {
        "project": PROJECT, "zones": list(ZONES),
        "machineTypes": {"small": "e2-small", "big": "zones/europe-west1-b/machineTypes/n2-standard-2"},
        "images": {"debian-12": IMAGE}, "defaultMachineType": "small", "defaultImage": "debian-12",
        "apiEndpoint": emulator.endpoint, **overrides,
    }
    document = {"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp", "gcp": gcp}]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture
def config(tmp_path: Path, emulator: ComputeEmulator) -> Path:
    return write_config(tmp_path / "providers.yaml", emulator)


def proxy(config: Path, check_mode: bool = False, **args: Any) -> ModuleRun:
    return run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", **args},
                      check_mode=check_mode)


def info(config: Path, **args: Any) -> ModuleRun:
    return run_module("gcp_proxy_info", {"provider_config": str(config), "provider": "cloud", **args})


def seed(emulator: ComputeEmulator, zone: str, name: str, tags: dict[str, str]) -> None:
    """An instance of ours made by an earlier run, with the labels and metadata the provider writes."""
    labels, tags_json = encode_tags(tags)
    emulator.add_instance(zone, name, labels=labels, metadata={TAGS_METADATA_KEY: tags_json})


def provider_id(zone: str, name: str) -> str:
    return f"gce://{PROJECT}/zones/{zone}/instances/{name}"


def test_create_get_list_delete_round_trip(config: Path, emulator: ComputeEmulator) -> None:
    planned = proxy(config, check_mode=True, name=NAME, tags=TAGS, location=ZONES[0])
    assert planned.result["changed"] is True, planned.result
    assert planned.result["provider_id"] == provider_id(ZONES[0], NAME)
    assert emulator.instances == {}

    # A Jinja-templated cloud-config: Ansible must not template it, the instance gets it unchanged.
    cloud_config = ("## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}-proxy\n"
                    "packages: [squid]\nwrite_files:\n- {path: /etc/motd, content: 'hé'}\n")
    created = proxy(config, name=NAME, tags=TAGS, location=ZONES[0], user_data=cloud_config)
    assert created.status == "successful", created.result
    instance = created.result["instance"]
    assert created.result["changed"] is True
    assert instance["provider_id"] == provider_id(ZONES[0], NAME)
    assert (instance["state"], instance["location"], instance["tags"]) == ("running", ZONES[0], TAGS)
    assert instance["ip"].startswith("203.0.113.")  # the NAT IP, not the internal one
    assert instance["created"].endswith("Z")
    live = emulator.instances[(ZONES[0], NAME)]
    assert live["labels"] == {"egress_proxies": "v1", "egress_proxies_owner": OWNER,
                              "egress_proxies_uid": TAGS["crawl.example.com/uid"],
                              "egress_proxies_spec_hash": TAGS["crawl.example.com/spec-hash"]}
    metadata = emulator.metadata(ZONES[0], NAME)
    assert metadata["user-data"] == cloud_config and "user-data-encoding" not in metadata
    assert json.loads(metadata[TAGS_METADATA_KEY]) == TAGS
    assert live["machineType"] == f"zones/{ZONES[0]}/machineTypes/e2-small"
    assert live["disks"][0]["initializeParams"]["sourceImage"] == IMAGE
    assert live["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"

    again = proxy(config, name=NAME, tags=TAGS, location=ZONES[0])
    assert again.result["changed"] is False
    assert again.result["provider_id"] == instance["provider_id"]
    assert len(emulator.requests_to("POST", r"/instances$")) == 1

    by_id = info(config, provider_id=instance["provider_id"])
    assert by_id.result["instances"] == [instance]

    seed(emulator, UNCONFIGURED_ZONE, "elsewhere", TAGS)  # ours, but in a zone not configured
    emulator.add_instance(ZONES[1], "foreign", labels={"egress_proxies_owner": OWNER})  # no marker: not ours
    emulator.requests.clear()
    by_tags = info(config, tags=OWNER_TAGS)
    assert by_tags.status == "successful", by_tags.result
    assert [i["provider_id"] for i in by_tags.result["instances"]] == [instance["provider_id"]]
    assert by_tags.result["failed_locations"] == {}
    # The whole sweep is one aggregatedList, filtered server-side on the marker and the owner.
    assert [(r.method, r.path) for r in emulator.requests] == [("GET", (f"/compute/v1/projects/{PROJECT}/aggregated"
                                                                       "/instances"))]
    assert emulator.requests[0].query["filter"] == [(f'(labels.egress_proxies = "v1") '
                                                    f'(labels.egress_proxies_owner = "{OWNER}")')]

    deleted = proxy(config, state="absent", provider_id=instance["provider_id"])
    assert deleted.result["changed"] is True, deleted.result
    assert (ZONES[0], NAME) not in emulator.instances
    deleted_again = proxy(config, state="absent", provider_id=instance["provider_id"])
    assert deleted_again.status == "successful" and deleted_again.result["changed"] is False


def test_binary_user_data_goes_base64_with_its_encoding(config: Path, emulator: ComputeEmulator) -> None:
    gzipped = gzip.compress(b"#cloud-config\npackages: [squid]\n", mtime=0)
    # Wrapped at 76 columns as base64(1) does; the metadata gets the canonical text.
    wrapped = "\n".join(textwrap.wrap(base64.b64encode(gzipped + bytes(range(256))).decode(), 76))
    created = proxy(config, name=NAME, tags=TAGS, location=ZONES[1], user_data=wrapped, user_data_encoding="base64")
    assert created.status == "successful", created.result
    metadata = emulator.metadata(ZONES[1], NAME)
    assert metadata["user-data-encoding"] == "base64"
    assert base64.b64decode(metadata["user-data"], validate=True) == gzipped + bytes(range(256))
    assert wrapped not in repr(created.result)  # no_log: never in the result


def test_placement_picks_the_zone_with_fewest_of_ours_and_never_duplicates(config: Path,
                                                                           emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0], "p-0", TAGS)
    for index in range(2):  # another controller's instances do not count against ours
        seed(emulator, ZONES[1], f"x-{index}", {"crawl.example.com/owner": "other-owner"})

    placed = proxy(config, name="p-1", tags=TAGS)
    assert placed.result["instance"]["location"] == ZONES[1], placed.result
    assert len(emulator.requests_to("GET", r"/aggregated/instances$")) == 1

    # p-0 lives in the first zone: asking again without a location finds it there.
    again = proxy(config, name="p-0", tags=TAGS)
    assert again.result["changed"] is False
    assert again.result["provider_id"] == provider_id(ZONES[0], "p-0")
    assert emulator.zones_of("p-0") == [ZONES[0]]


def test_an_instance_in_a_retired_zone_is_not_found(config: Path, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[1], NAME, TAGS)
    emulator.retire_zone(ZONES[1])
    fetched = info(config, provider_id=provider_id(ZONES[1], NAME))
    assert fetched.failed and fetched.result["error_class"] == "not_found", fetched.result
    assert f"zones/{ZONES[1]}" in fetched.result["msg"]


@pytest.mark.parametrize(
    ("method", "path", "status", "module", "args", "error_class"),
    [
        pytest.param("GET", r"/instances/" + NAME + "$", 429, "gcp_proxy_info",
                     {"provider_id": provider_id(ZONES[0], NAME)}, "transient", id="429-get"),
        pytest.param("GET", r"/aggregated/instances$", 503, "gcp_proxy_info", {"tags": OWNER_TAGS}, "transient",
                     id="503-aggregated"),
        pytest.param("POST", r"/zones/[^/]+/instances$", 403, "gcp_proxy",
                     {"name": "p-new", "tags": TAGS, "location": ZONES[0]}, "permanent", id="403-insert"),
    ],
)
def test_api_errors_are_classified(config: Path, emulator: ComputeEmulator, method: str, path: str, status: int,
                                   module: str, args: dict[str, Any], error_class: str) -> None:
    seed(emulator, ZONES[0], NAME, TAGS)
    # Twice: google-api-core retries get and aggregatedList on 503 by itself unless told not to.
    emulator.fail_next(method, path, status, count=2)
    result = run_module(module, {"provider_config": str(config), "provider": "cloud", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == error_class
    assert str(status) in result.result["msg"]
    assert len(emulator.requests_to(method, path)) == 1  # no hidden retries
    assert set(emulator.instances) == {(ZONES[0], NAME)}
    if module == "gcp_proxy_info" and "tags" in args:
        assert set(result.result["failed_locations"]) == set(ZONES)


def test_an_unreachable_zone_fails_the_listing_but_returns_the_rest(config: Path, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0], NAME, TAGS)
    emulator.set_unreachable(ZONES[1])
    listed = info(config, tags=OWNER_TAGS)
    assert listed.failed and listed.result["error_class"] == "transient", listed.result
    assert [i["provider_id"] for i in listed.result["instances"]] == [provider_id(ZONES[0], NAME)]
    assert list(listed.result["failed_locations"]) == [ZONES[1]]
    assert listed.result["failed_locations"][ZONES[1]]["error_class"] == "transient"
    assert "UNREACHABLE" in listed.result["failed_locations"][ZONES[1]]["msg"]


GOOD = {"name": NAME, "tags": TAGS}


@pytest.mark.parametrize(
    ("module", "args", "field"),
    [
        ("gcp_proxy", {**GOOD, "image": "windows-95"}, "image"),
        ("gcp_proxy", {**GOOD, "tags": {"crawl.example.com/owner": "Prod Cluster"}}, "tags.crawl.example.com/owner"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_input_fails_permanent_naming_the_field(config: Path, emulator: ComputeEmulator, module: str,
                                                    args: dict[str, Any], field: str) -> None:
    result = run_module(module, {"provider_config": str(config), "provider": "cloud", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == "permanent"
    assert result.result["msg"].startswith(field + ":"), result.result["msg"]
    assert emulator.requests == []  # refused before any API call
