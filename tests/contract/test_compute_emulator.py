# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Contract tests: each Compute API rule the GCP provider depends on, proved against the
emulator with plain HTTP, so that tests built on the emulator see what the real API would
do. Every test cites the document the rule comes from; docs/gcp-provider.md ("Validated
against") lists them. References:

- REST reference: https://cloud.google.com/compute/docs/reference/rest/v1/ (instances,
  instances/insert, instances/aggregatedList, zoneOperations/wait; the Instance, Metadata and
  NetworkInterface fields);
- https://cloud.google.com/compute/docs/labeling-resources (label limits);
- https://cloud.google.com/compute/api-quota and
  https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-operation-limits (403s);
- https://cloud.google.com/compute/docs/resource-error (stock-outs);
- public reports of real responses where the reference gives no body (cited per test).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from support.compute_emulator import ComputeEmulator

pytestmark = pytest.mark.timeout(60)

PROJECT = "test-project"
ZONES = ("europe-west1-b", "europe-west4-a")
IMAGE = "projects/debian-cloud/global/images/family/debian-12"


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=ZONES) as running:
        yield running


class Api:
    """Plain HTTP against the emulator, as the REST transport sends it."""

    def __init__(self, emulator: ComputeEmulator) -> None:
        self.base = f"{emulator.endpoint}/compute/v1/projects/{PROJECT}"
        self.session = requests.Session()

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> tuple[int, dict[str, Any]]:
        response = self.session.request(method, self.base + path, json=body, params=params, timeout=30)
        return response.status_code, response.json()

    def insert(self, zone: str, name: str = "p-1", **overrides: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", f"/zones/{zone}/instances", instance(zone, name, **overrides))


@pytest.fixture
def api(emulator: ComputeEmulator) -> Iterator[Api]:
    made = Api(emulator)
    yield made
    made.session.close()


def instance(zone: str, name: str, **overrides: Any) -> dict[str, Any]:
    return {"name": name, "machineType": f"zones/{zone}/machineTypes/e2-small",
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": IMAGE}}],
            "networkInterfaces": [{"network": "global/networks/default"}], **overrides}


def reason(body: dict[str, Any]) -> str:
    return str(body["error"]["errors"][0]["reason"])


def test_wait_holds_until_done_or_its_deadline_and_get_does_not(emulator: ComputeEmulator, api: Api) -> None:
    # zoneOperations.wait: "Waits for the specified Operation resource to return as DONE or for
    # the request to approach the 2 minute deadline ... might be DONE or still in progress."
    # zoneOperations.get answers at once. (Hold scaled to 0.7 s here; WAIT_HOLD_SECONDS is 120.)
    emulator.operation_seconds, emulator.wait_hold_seconds = 1.0, 0.7
    _, operation = api.insert(ZONES[0])
    path = f"/zones/{ZONES[0]}/operations/{operation['name']}"
    started = time.monotonic()
    assert api.call("GET", path)[1]["status"] == "RUNNING"
    assert time.monotonic() - started < 0.3
    held = api.call("POST", path + "/wait")[1]
    assert held["status"] == "RUNNING" and time.monotonic() - started >= 0.7
    assert api.call("POST", path + "/wait")[1]["status"] == "DONE"
    assert 1.0 <= time.monotonic() - started < 1.4  # answered when it finished, not at the hold's end


def test_a_stock_out_fails_the_operation_in_that_zone_only(emulator: ComputeEmulator, api: Api) -> None:
    # A zone out of capacity accepts the insert; its operation ends DONE with error code
    # ZONE_RESOURCE_POOL_EXHAUSTED ("The zone '...' does not have enough resources available to
    # fulfill the request. Try a different zone, or try again later.", httpErrorStatusCode 503;
    # https://cloud.google.com/compute/docs/resource-error) and no instance is left.
    emulator.stock_out(ZONES[0])
    status, operation = api.insert(ZONES[0])
    assert status == 200
    done = api.call("POST", f"/zones/{ZONES[0]}/operations/{operation['name']}/wait")[1]
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert done["httpErrorStatusCode"] == 503 and "Try a different zone" in done["error"]["errors"][0]["message"]
    assert api.call("GET", f"/zones/{ZONES[0]}/instances/p-1")[0] == 404
    # Another zone has capacity.
    _, other = api.insert(ZONES[1])
    assert "error" not in api.call("POST", f"/zones/{ZONES[1]}/operations/{other['name']}/wait")[1]


@pytest.mark.parametrize(
    ("overrides", "missing"),
    [({"disks": [{"boot": True, "initializeParams": {
        "sourceImage": "projects/debian-cloud/global/images/family/debian-13"}}]},
      "projects/debian-cloud/global/images/family/debian-13"),
     ({"machineType": f"zones/{ZONES[0]}/machineTypes/e2-huge"},
      f"projects/{PROJECT}/zones/{ZONES[0]}/machineTypes/e2-huge"),
     ({"networkInterfaces": [{"network": "global/networks/nope"}]}, f"projects/{PROJECT}/global/networks/nope")],
    ids=["image", "machine-type", "network"],
)
def test_an_insert_referencing_something_missing_is_a_synchronous_404(emulator: ComputeEmulator, api: Api,
                                                                      overrides: dict[str, Any], missing: str) -> None:
    # instances.insert checks what the resource references before accepting it: the answer is
    # 404 notFound "The resource '<path>' was not found", not an operation.
    status, body = api.insert(ZONES[0], **overrides)
    assert (status, reason(body)) == (404, "notFound")
    assert body["error"]["message"] == f"The resource '{missing}' was not found"
    assert emulator.instances == {}


@pytest.mark.parametrize(("method", "path"), [("GET", "/instances/p-1"), ("DELETE", "/instances/p-1"),
                                              ("GET", "/instances"), ("POST", "/instances")])
def test_a_zone_that_does_not_exist_is_a_400_invalid(emulator: ComputeEmulator, api: Api, method: str,
                                                     path: str) -> None:
    # Not a 404: the real body, as reported in https://github.com/inspec/inspec-gcp/issues/301:
    # {"code": 400, "message": "Invalid value for field 'zone': 'us-east1'. Unknown zone.",
    #  "errors": [{"domain": "global", "reason": "invalid"}]}. A retired zone answers the same.
    emulator.retire_zone(ZONES[1])
    for zone in ("us-east1", ZONES[1]):
        body = instance(zone, "p-1") if method == "POST" else None
        status, answer = api.call(method, f"/zones/{zone}{path}", body)
        assert (status, reason(answer)) == (400, "invalid")
        assert answer["error"]["message"] == f"Invalid value for field 'zone': '{zone}'. Unknown zone."


def test_a_machine_type_must_be_of_the_instances_zone(api: Api) -> None:
    # Instance.machineType: "Full or partial URL of the machine type resource to use for this
    # instance, in the format: zones/zone/machineTypes/machine-type"; machine types are zonal
    # resources (machineTypes.get takes a zone), so one of another zone is refused.
    status, body = api.insert(ZONES[1], machineType=f"zones/{ZONES[0]}/machineTypes/e2-small")
    assert (status, reason(body)) == (400, "invalid")
    assert "resource.machineType" in body["error"]["message"]
    assert api.insert(ZONES[1], machineType="e2-small")[0] == 400  # a bare name is no URL


def test_a_custom_mode_network_requires_a_subnetwork_of_the_region(emulator: ComputeEmulator, api: Api) -> None:
    # NetworkInterface.subnetwork: "If the network is in auto subnet mode, specifying the
    # subnetwork is optional. If the network is in custom subnet mode, specifying the subnetwork
    # is required." The real 400 text as reported in
    # https://github.com/GoogleCloudDataproc/bdutil/issues/88. A subnetwork is regional: it
    # must be in the instance's region.
    emulator.add_network("vpc", {"europe-west1": {"egress"}})
    status, body = api.insert(ZONES[0], networkInterfaces=[{"network": "global/networks/vpc"}])
    assert (status, reason(body)) == (400, "invalid")
    assert body["error"]["message"] == ("Invalid value for field 'resource.networkInterfaces[0]': ''. Subnetwork "
                                        "should be specified for custom subnetmode network")
    wrong_region = api.insert(ZONES[1], networkInterfaces=[{
        "network": "global/networks/vpc", "subnetwork": "regions/europe-west1/subnetworks/egress"}])
    assert wrong_region[0] == 400
    right = api.insert(ZONES[0], networkInterfaces=[{
        "network": "global/networks/vpc", "subnetwork": "regions/europe-west1/subnetworks/egress"}])
    assert right[0] == 200
    # Shared VPC: the host project's network and subnetwork.
    emulator.add_network("shared", {"europe-west1": {"proxies"}}, project="host-project")
    shared = api.insert(ZONES[0], "p-2", networkInterfaces=[{
        "network": "projects/host-project/global/networks/shared",
        "subnetwork": "projects/host-project/regions/europe-west1/subnetworks/proxies"}])
    assert shared[0] == 200


def test_aggregated_list_fails_whole_without_return_partial_success(emulator: ComputeEmulator, api: Api) -> None:
    # instances.aggregatedList, returnPartialSuccess: "Opt-in for partial success behavior which
    # provides partial results in case of failure. The default value is false." With it, the
    # failed scopes are listed in "unreachables".
    emulator.add_instance(ZONES[0], "p-0")
    emulator.set_unreachable(ZONES[1])
    assert api.call("GET", "/aggregated/instances")[0] == 503
    status, partial = api.call("GET", "/aggregated/instances", returnPartialSuccess="true")
    assert status == 200 and partial["unreachables"] == [f"zones/{ZONES[1]}"]
    assert [i["name"] for i in partial["items"][f"zones/{ZONES[0]}"]["instances"]] == ["p-0"]
    # Each zone's own list fails alone.
    assert api.call("GET", f"/zones/{ZONES[0]}/instances")[0] == 200
    assert api.call("GET", f"/zones/{ZONES[1]}/instances")[0] == 503


@pytest.mark.parametrize("path", ["/aggregated/instances", f"/zones/{ZONES[0]}/instances"])
def test_lists_page_with_max_results_and_page_token(emulator: ComputeEmulator, api: Api, path: str) -> None:
    # maxResults: "The maximum number of results per page that should be returned. If the number
    # of available results is larger than maxResults, Compute Engine returns a nextPageToken ...
    # Acceptable values are 0 to 500, inclusive. (Default: 500)"; pageToken: "Set pageToken to
    # the nextPageToken returned by a previous list request to get the next page of results."
    for index in range(5):
        emulator.add_instance(ZONES[0], f"p-{index}")
    names: list[str] = []
    token = None
    pages = 0
    while True:
        params = {"maxResults": 2, **({"pageToken": token} if token else {})}
        status, page = api.call("GET", path, **params)
        assert status == 200
        pages += 1
        scoped = page["items"][f"zones/{ZONES[0]}"] if "aggregated" in path else {"instances": page.get("items", [])}
        names += [i["name"] for i in scoped.get("instances", [])]
        token = page.get("nextPageToken")
        if not token:
            break
    assert (pages, names) == (3, [f"p-{index}" for index in range(5)])
    assert api.call("GET", path, maxResults=501)[0] == 400
    assert len(api.call("GET", path)[1].get("items", {})) > 0  # default 500: one page


def pages_of(api: Api, path: str, **params: Any) -> tuple[list[str], list[str]]:
    """Every page's instance names (zone ZONES[0]) and the tokens that led to them."""
    names: list[str] = []
    tokens: list[str] = []
    while True:
        status, page = api.call("GET", path, **params, **({"pageToken": tokens[-1]} if tokens else {}))
        assert status == 200, page
        scoped = page["items"][f"zones/{ZONES[0]}"] if "aggregated" in path else {"instances": page.get("items", [])}
        names += [i["name"] for i in scoped.get("instances", [])]
        if "nextPageToken" not in page:
            return names, tokens
        tokens.append(page["nextPageToken"])


@pytest.mark.parametrize("path", ["/aggregated/instances", f"/zones/{ZONES[0]}/instances"])
def test_a_page_token_is_opaque_and_belongs_to_its_request(emulator: ComputeEmulator, api: Api, path: str) -> None:
    # AIP-158 (https://google.aip.dev/158), which Compute's list methods follow: "Page tokens
    # provided by APIs must be opaque (but URL-safe) strings, and must not be user-parseable",
    # and "The user is expected to keep all other arguments to the RPC the same; if any arguments
    # are different, the API should send an INVALID_ARGUMENT error."
    for index in range(4):
        emulator.add_instance(ZONES[0], f"p-{index}", labels={"team": "a"})
    names, tokens = pages_of(api, path, maxResults=3, filter='(labels.team = "a")')
    assert names == [f"p-{index}" for index in range(4)] and len(tokens) == 1
    # Not an encoding of where the page ended: the same first page gets another token.
    assert pages_of(api, path, maxResults=3, filter='(labels.team = "a")')[1] != tokens
    # Another filter with that token, or a token nobody issued: 400 invalid.
    status, error = api.call("GET", path, maxResults=3, filter='(labels.team = "b")', pageToken=tokens[0])
    assert (status, error["error"]["errors"][0]["reason"]) == (400, "invalid")
    assert "pageToken" in error["error"]["message"]
    assert api.call("GET", path, maxResults=3, pageToken="b2Zmc2V0OjI=")[0] == 400
    # The page size may change from page to page.
    assert api.call("GET", path, maxResults=1, filter='(labels.team = "a")', pageToken=tokens[0])[0] == 200


def test_a_page_goes_on_after_the_last_name_of_the_one_before(emulator: ComputeEmulator, api: Api) -> None:
    for index in (0, 2, 4, 6):
        emulator.add_instance(ZONES[0], f"p-{index}")
    path = f"/zones/{ZONES[0]}/instances"
    status, first = api.call("GET", path, maxResults=2)
    assert [i["name"] for i in first["items"]] == ["p-0", "p-2"]
    emulator.add_instance(ZONES[0], "p-1")  # before the page's end: not repeated, not shifted onto the next page
    emulator.add_instance(ZONES[0], "p-5")
    emulator.instances.pop((ZONES[0], "p-0"))
    status, second = api.call("GET", path, maxResults=2, pageToken=first["nextPageToken"])
    assert status == 200 and [i["name"] for i in second["items"]] == ["p-4", "p-5"]


@pytest.mark.parametrize(
    ("fault_reason", "domain", "message"),
    [("rateLimitExceeded", "usageLimits", "Rate Limit Exceeded"),
     ("quotaExceeded", "usageLimits", "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."),
     ("forbidden", "global", f"Required 'compute.instances.create' permission for 'projects/{PROJECT}'")],
)
def test_403_bodies_carry_the_real_reasons(emulator: ComputeEmulator, api: Api, fault_reason: str, domain: str,
                                           message: str) -> None:
    # "If your project exceeds a rate quota, you receive a 403 error with the reason
    # rateLimitExceeded" (Compute Engine rate quotas); the body as "Troubleshoot operation
    # limits" shows it: {"message": "Rate Limit Exceeded", "reason": "rateLimitExceeded",
    # "domain": "usageLimits"}. Resource quotas are 403 quotaExceeded, missing permissions 403
    # forbidden: only the reason tells a client which ones heal.
    emulator.fail_next("POST", "/instances$", 403, reason=fault_reason)
    status, body = api.insert(ZONES[0])
    assert status == 403
    assert body["error"]["errors"] == [{"message": message, "domain": domain, "reason": fault_reason}]


def test_at_most_64_labels(api: Api) -> None:
    # "Each resource can have up to 64 labels." (Labeling resources)
    assert api.insert(ZONES[0], "p-1", labels={f"k{i}": "v" for i in range(64)})[0] == 200
    status, body = api.insert(ZONES[0], "p-2", labels={f"k{i}": "v" for i in range(65)})
    assert (status, reason(body)) == (400, "invalid") and "resource.labels" in body["error"]["message"]


def test_metadata_limits(api: Api) -> None:
    # Metadata.items: "The total size of all keys and values must be less than 512 KB."
    # Items.value: "their size must be less than or equal to 262144 bytes (256 KiB)."
    # Items.key: "[a-zA-Z0-9-_]+, and be less than 128 bytes in length."
    def metadata(*items: tuple[str, str]) -> dict[str, Any]:
        return {"metadata": {"items": [{"key": k, "value": v} for k, v in items]}}

    full = "x" * (256 * 1024)
    assert api.insert(ZONES[0], "p-1", **metadata(("a", full)))[0] == 200
    assert api.insert(ZONES[0], "p-2", **metadata(("a", full + "x")))[0] == 400
    status, body = api.insert(ZONES[0], "p-3", **metadata(("a", full), ("b", full)))  # 512 KiB + 2 bytes in all
    assert status == 400 and "512 KB" in body["error"]["message"]
    assert api.insert(ZONES[0], "p-4", **metadata(("k" * 128, "v")))[0] == 400
    assert api.insert(ZONES[0], "p-5", **metadata(("bad key", "v")))[0] == 400


def test_deleting_an_instance_in_transition_is_400_resource_not_ready(emulator: ComputeEmulator, api: Api) -> None:
    # An instance with an operation in flight (being created, or already being deleted) answers
    # instances.delete with 400 resourceNotReady, "The resource '...' is not ready" (as reported
    # in https://github.com/googleapis/google-api-python-client/issues/485 and
    # https://github.com/opstrace/opstrace/issues/1218); it succeeds once the instance settles.
    emulator.operation_seconds = 0.5
    api.insert(ZONES[0])
    status, body = api.call("DELETE", f"/zones/{ZONES[0]}/instances/p-1")
    assert (status, reason(body)) == (400, "resourceNotReady")
    assert body["error"]["message"] == f"The resource 'projects/{PROJECT}/zones/{ZONES[0]}/instances/p-1' is not ready"
    time.sleep(0.6)
    assert api.call("DELETE", f"/zones/{ZONES[0]}/instances/p-1")[0] == 200
    assert reason(api.call("DELETE", f"/zones/{ZONES[0]}/instances/p-1")[1]) == "resourceNotReady"
