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
- https://cloud.google.com/firewall/docs/firewalls (implied and pre-populated rules);
- public reports of real responses where the reference gives no body (cited per test).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from support.compute.emulator import DEFAULT_VM_SCOPES, ComputeEmulator

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
    started = time.monotonic()  # before the insert: the operation's second counts from it
    _, operation = api.insert(ZONES[0])
    path = f"/zones/{ZONES[0]}/operations/{operation['name']}"
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
     ({"networkInterfaces": [{"network": "global/networks/nope"}]}, f"projects/{PROJECT}/global/networks/nope")],
    ids=["image", "network"],
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


def test_a_machine_type_a_zone_lacks_is_a_400_invalid_naming_it(emulator: ComputeEmulator, api: Api) -> None:
    # Not a 404: "Invalid value for field 'resource.machineType': 'zones/europe-west8-a/machineTypes/
    # f1-micro'. Machine type with name 'f1-micro' does not exist in zone 'europe-west8-a'., invalid"
    # (googleapi's rendering in gruntwork-io/terratest#1132; the same text in
    # GoogleCloudPlatform/bank-of-anthos#1234 and taskcluster/community-tc-config#75).
    emulator.machine_types[ZONES[0]].discard("e2-small")
    status, body = api.insert(ZONES[0])
    assert (status, reason(body)) == (400, "invalid")
    assert body["error"]["message"] == (
        f"Invalid value for field 'resource.machineType': 'zones/{ZONES[0]}/machineTypes/e2-small'. Machine type "
        f"with name 'e2-small' does not exist in zone '{ZONES[0]}'.")
    assert api.insert(ZONES[1])[0] == 200  # another zone offers it


def test_images_run_what_their_family_runs_at_boot(emulator: ComputeEmulator, api: Api) -> None:
    # Debian's GCE images: the guest agent, no cloud-init (debian-cloud-images
    # config_space/bookworm/package_config/GCE); Ubuntu's: both (GoogleCloudPlatform/guest-agent#84).
    metadata = {"items": [{"key": "startup-script", "value": "#!/bin/sh\n"},
                          {"key": "user-data", "value": "#cloud-config\npackages: [squid]\n"}]}
    ubuntu = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
    api.insert(ZONES[0], "debian", metadata=metadata)
    api.insert(ZONES[0], "ubuntu", metadata=metadata,
               disks=[{"boot": True, "initializeParams": {"sourceImage": ubuntu}}])
    api.call("GET", f"/zones/{ZONES[0]}/instances")  # the operations finish
    debian = emulator.boot(ZONES[0], "debian")
    assert (debian.startup_script, debian.user_data) == ("#!/bin/sh\n", None)
    both = emulator.boot(ZONES[0], "ubuntu")
    assert (both.startup_script, both.user_data) == ("#!/bin/sh\n", "#cloud-config\npackages: [squid]\n")


def firewall_rule(name: str, ports: list[str], sources: list[str], tags: list[str] | None = None) -> dict[str, Any]:
    return {"name": name, "network": "global/networks/default", "direction": "INGRESS", "priority": 1000,
            "sourceRanges": sources, "allowed": [{"IPProtocol": "tcp", "ports": ports}],
            **({"targetTags": tags} if tags else {})}


def wait_global(api: Api, operation: dict[str, Any]) -> dict[str, Any]:
    return api.call("POST", f"/global/operations/{operation['name']}/wait")[1]


def test_the_default_network_lets_nothing_reach_the_proxy_port_until_a_rule_does(emulator: ComputeEmulator,
                                                                                  api: Api) -> None:
    # "Implied rules": deny all ingress at priority 65535; the default network's pre-populated rules
    # allow ssh (22), rdp (3389) and icmp from anywhere and everything from 10.128.0.0/9
    # (https://cloud.google.com/firewall/docs/firewalls). A rule applies to the instances carrying
    # one of its targetTags (all of them without any); the lowest priority number decides.
    api.insert(ZONES[0], "tagged", tags={"items": ["proxy"]},
               networkInterfaces=[{"network": "global/networks/default",
                                   "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}])
    api.insert(ZONES[0], "untagged", networkInterfaces=[{
        "network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}])
    api.call("GET", f"/zones/{ZONES[0]}/instances")
    crawler = "198.51.100.7"
    assert emulator.reachable(crawler, ZONES[0], "tagged", 22)
    assert not emulator.reachable(crawler, ZONES[0], "tagged", 3128)
    status, operation = api.call("POST", "/global/firewalls", firewall_rule("proxy-port", ["3128"],
                                                                            ["198.51.100.0/24"], ["proxy"]))
    assert status == 200 and operation["selfLink"].endswith(f"/global/operations/{operation['name']}")
    assert wait_global(api, operation)["status"] == "DONE"
    assert emulator.reachable(crawler, ZONES[0], "tagged", 3128)
    assert not emulator.reachable(crawler, ZONES[0], "untagged", 3128)
    assert not emulator.reachable("203.0.113.9", ZONES[0], "tagged", 3128)  # outside sourceRanges
    assert not emulator.reachable(crawler, ZONES[0], "tagged", 8080)
    # A deny of higher precedence wins; patch replaces the fields it names.
    _, deny = api.call("POST", "/global/firewalls", {**firewall_rule("deny", ["3128"], ["0.0.0.0/0"]),
                                                     "priority": 900, "denied": [{"IPProtocol": "tcp"}],
                                                     "allowed": []})
    wait_global(api, deny)
    assert not emulator.reachable(crawler, ZONES[0], "tagged", 3128)
    wait_global(api, api.call("DELETE", "/global/firewalls/deny")[1])
    patched = api.call("PATCH", "/global/firewalls/proxy-port", {"allowed": [{"IPProtocol": "tcp", "ports": ["8080"]}]})
    wait_global(api, patched[1])
    assert api.call("GET", "/global/firewalls/proxy-port")[1]["allowed"] == [{"IPProtocol": "tcp", "ports": ["8080"]}]
    assert emulator.reachable(crawler, ZONES[0], "tagged", 8080)
    assert not emulator.reachable(crawler, ZONES[0], "tagged", 3128)
    # Names are unique in the project; a rule holds IPv4 or IPv6 ranges, not both.
    status, body = api.call("POST", "/global/firewalls", firewall_rule("proxy-port", ["3128"], ["0.0.0.0/0"]))
    assert (status, reason(body)) == (409, "alreadyExists")
    status, body = api.call("POST", "/global/firewalls", firewall_rule("mixed", ["3128"], ["0.0.0.0/0", "::/0"]))
    assert (status, reason(body)) == (400, "invalid")
    assert api.call("GET", "/global/firewalls/nope")[0] == 404
    names = {rule["name"] for rule in api.call("GET", "/global/firewalls")[1]["items"]}
    assert names == {"default-allow-internal", "default-allow-ssh", "default-allow-rdp", "default-allow-icmp",
                     "proxy-port"}


def test_a_token_without_a_compute_scope_is_a_403_insufficient_scopes(emulator: ComputeEmulator) -> None:
    # The access scopes of a VM's (or GKE node's) default service account do not include Compute
    # ("default access scopes"); Google APIs answer such a token 403 "Request had insufficient
    # authentication scopes.", reason insufficientPermissions, status PERMISSION_DENIED, with an
    # ErrorInfo ACCESS_TOKEN_SCOPE_INSUFFICIENT (googleapis/google-api-python-client#915,
    # analogdotnow/Analog#296). instances.* need compute or cloud-platform (reads: compute.readonly too).
    emulator.token_scopes.update({"narrow": DEFAULT_VM_SCOPES,
                                  "readonly": ("https://www.googleapis.com/auth/compute.readonly",),
                                  "wide": ("https://www.googleapis.com/auth/cloud-platform",)})
    base = f"{emulator.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONES[0]}/instances"

    def call(method: str, token: str) -> requests.Response:
        body = instance(ZONES[0], f"p-{token}") if method == "POST" else None
        return requests.request(method, base, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    refused = call("GET", "narrow")
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["message"], error["status"], reason(refused.json())) == (
        "Request had insufficient authentication scopes.", "PERMISSION_DENIED", "insufficientPermissions")
    assert error["details"][0]["reason"] == "ACCESS_TOKEN_SCOPE_INSUFFICIENT"
    assert call("GET", "readonly").status_code == 200 and call("POST", "readonly").status_code == 403
    assert call("POST", "wide").status_code == 200


def test_regional_quotas_refuse_inserts_in_their_region_only(emulator: ComputeEmulator, api: Api) -> None:
    # CPUs: the insert is accepted and its operation fails QUOTA_EXCEEDED, "Quota 'CPUS' exceeded.
    # Limit: 8.0 in region us-east1." (mesosphere-backup/terraform-dcos#61); an ephemeral external IP
    # over IN_USE_ADDRESSES is refused with the request, "HTTPError 403: Quota 'IN_USE_ADDRESSES'
    # exceeded. Limit: 4.0 in region us-central1." (kelseyhightower/kubernetes-the-hard-way#47).
    # Regional quotas are per region: another region still takes the instance.
    emulator.set_quota("CPUS", 2.0, region="europe-west1")
    assert "error" not in api.call("POST", f"/zones/{ZONES[0]}/operations/{api.insert(ZONES[0], 'p-1')[1]['name']}"
                                           "/wait")[1]
    _, operation = api.insert(ZONES[0], "p-2")
    done = api.call("POST", f"/zones/{ZONES[0]}/operations/{operation['name']}/wait")[1]
    assert done["error"]["errors"][0] == {
        "code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded.  Limit: 2.0 in region europe-west1.",
        "errorDetails": [{"quotaInfo": {"metricName": "compute.googleapis.com/cpus", "limit": 2.0,
                                        "limitName": "CPUS-per-project-region",
                                        "dimensions": {"region": "europe-west1"}}}]}
    assert done["httpErrorStatusCode"] == 403
    assert api.call("GET", f"/zones/{ZONES[0]}/instances/p-2")[0] == 404
    assert "error" not in api.call("POST", f"/zones/{ZONES[1]}/operations/{api.insert(ZONES[1], 'p-3')[1]['name']}"
                                           "/wait")[1]
    emulator.set_quota("IN_USE_ADDRESSES", 0.0, region="europe-west4")
    status, body = api.insert(ZONES[1], "p-4", networkInterfaces=[{
        "network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}])
    assert (status, reason(body), body["error"]["errors"][0]["domain"]) == (403, "quotaExceeded", "usageLimits")
    assert body["error"]["message"] == "Quota 'IN_USE_ADDRESSES' exceeded.  Limit: 0.0 in region europe-west4."
    emulator.set_quota("CPUS", 4.0)  # project-wide: no region helps
    _, operation = api.insert(ZONES[1], "p-5")
    done = api.call("POST", f"/zones/{ZONES[1]}/operations/{operation['name']}/wait")[1]
    assert done["error"]["errors"][0]["message"] == "Quota 'CPUS_ALL_REGIONS' exceeded.  Limit: 4.0 globally."
    assert "dimensions" not in done["error"]["errors"][0]["errorDetails"][0]["quotaInfo"]


def test_the_newer_quota_wording_names_the_quota_only_and_quota_info_says_where(emulator: ComputeEmulator,
                                                                              api: Api) -> None:
    # Newer answers name the quota only: "Code: QUOTA_EXCEEDED Message: Quota 'N2_CPUS' exceeded."
    # (GoogleCloudPlatform/ai-on-gke#849); the region is in the error's errorDetails[].quotaInfo
    # (QuotaExceededInfo: metricName, limitName, limit, dimensions; google-cloud-compute's
    # compute_v1 types: "QuotaExceededInfo will have details when the error code is QUOTA_EXCEEDED").
    emulator.quota_wording = "bare"
    emulator.set_quota("CPUS", 0.0, region="europe-west1")
    _, operation = api.insert(ZONES[0], "p-1")
    done = api.call("POST", f"/zones/{ZONES[0]}/operations/{operation['name']}/wait")[1]
    error = done["error"]["errors"][0]
    assert (error["code"], error["message"]) == ("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.")
    assert error["errorDetails"][0]["quotaInfo"]["dimensions"] == {"region": "europe-west1"}
    emulator.set_quota("IN_USE_ADDRESSES", 0.0, region="europe-west4")
    status, body = api.insert(ZONES[1], "p-2", networkInterfaces=[{
        "network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}])
    assert (status, reason(body), body["error"]["message"]) == (403, "quotaExceeded",
                                                                "Quota 'IN_USE_ADDRESSES' exceeded.")


def test_a_private_source_never_reaches_an_external_address(emulator: ComputeEmulator, api: Api) -> None:
    # The internet routes no private, shared (100.64/10), loopback or link-local address to Google,
    # and a VM of the VPC reaching another's external address is seen from its own external
    # address or its Cloud NAT's (Cloud NAT overview; "IP addresses"). So even a rule that admits
    # 0.0.0.0/0, or the default network's 10.128.0.0/9 one, lets no private source in that way.
    api.insert(ZONES[0], "open", tags={"items": ["proxy"]}, networkInterfaces=[{
        "network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}])
    api.call("GET", f"/zones/{ZONES[0]}/instances")
    wait_global(api, api.call("POST", "/global/firewalls", firewall_rule("everyone", ["3128"], ["0.0.0.0/0"],
                                                                         ["proxy"]))[1])
    assert emulator.reachable("198.51.100.7", ZONES[0], "open", 3128)
    for private in ("10.128.0.9", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "127.0.0.1",
                    "169.254.169.254"):
        assert not emulator.reachable(private, ZONES[0], "open", 3128), private


def test_without_an_external_address_or_cloud_nat_an_instance_has_no_way_out(emulator: ComputeEmulator,
                                                                             api: Api) -> None:
    # "Cloud NAT ... lets certain resources without external IP addresses create outbound
    # connections to the internet" (Cloud NAT overview); a VM with neither has none. A VM with an
    # external address leaves from it; every VM behind one Cloud NAT leaves from the NAT's addresses.
    # The Router as routers.aggregatedList shows it (items keyed regions/<region>).
    external = [{"network": "global/networks/default",
                 "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}]
    api.insert(ZONES[0], "public", networkInterfaces=external)
    api.insert(ZONES[0], "private-1")
    api.insert(ZONES[1], "private-2")
    api.call("GET", f"/zones/{ZONES[0]}/instances")
    assert emulator.boot(ZONES[0], "public").egress == emulator.instances[(ZONES[0], "public")][
        "networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    assert not emulator.boot(ZONES[0], "private-1").internet
    status, listed = api.call("GET", "/aggregated/routers")
    assert status == 200 and "routers" not in listed["items"]["regions/europe-west1"]
    emulator.add_cloud_nat("europe-west1", ("198.51.100.20",))
    assert emulator.boot(ZONES[0], "private-1").egress == "198.51.100.20"
    assert not emulator.boot(ZONES[1], "private-2").internet  # another region: that NAT does not serve it
    [router] = api.call("GET", "/aggregated/routers")[1]["items"]["regions/europe-west1"]["routers"]
    assert router["network"].endswith(f"/projects/{PROJECT}/global/networks/default")
    assert router["nats"][0]["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"


def test_wait_may_answer_at_once_when_the_server_is_overloaded(emulator: ComputeEmulator, api: Api) -> None:
    # zoneOperations.wait: "In uncommon cases, when the server is overloaded, the request might
    # return before the default deadline is reached, or might return after zero seconds."
    emulator.operation_seconds, emulator.wait_returns_early = 1.0, True
    _, operation = api.insert(ZONES[0])
    started = time.monotonic()
    answered = api.call("POST", f"/zones/{ZONES[0]}/operations/{operation['name']}/wait")[1]
    assert answered["status"] == "RUNNING" and time.monotonic() - started < 0.3
