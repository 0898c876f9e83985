"""The GCP modules through ansible-runner against the Compute REST emulator.

Each module run is its own process driving the real google-cloud-compute client, as
under the controller; the emulator (tests/support/compute/emulator.py) keeps the state
between runs and records every request, so tests can count API calls. A run costs about
2.5 s, so the finer cases (every bad field, operation errors, foreign instances,
credentials) run in-process against the same emulator in
tests/unit/plugins/module_utils/gcp/test_instances.py.
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import ssl
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import TAGS_METADATA_KEY, encode_tags
from support.collection.modules import ModuleRun, run_module
from support.collection.provider_config import OWNER, OWNER_TAGS
from support.compute.emulator import DEFAULT_VM_SCOPES, ComputeEmulator
from support.netns.tls_front import self_signed

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
    document = {"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": gcp}]}
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
    # The port is open to the provider's allowedSources, and only to them; a private source never
    # gets to an external address at all.
    assert emulator.reachable("198.51.100.7", ZONES[0], NAME, 3128)
    assert not emulator.reachable("203.0.113.9", ZONES[0], NAME, 3128)
    assert not emulator.reachable("10.1.2.3", ZONES[0], NAME, 3128)
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
    # Its firewall rule went with the provider's last instance.
    assert [name for _, name in emulator.firewalls if name.startswith("egress-proxies-")] == []


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
    ("method", "path", "status", "reason", "module", "args", "error_class", "calls"),
    [
        pytest.param("GET", r"/instances/" + NAME + "$", 429, None, "gcp_proxy_info",
                     {"provider_id": provider_id(ZONES[0], NAME)}, "transient", 1, id="429-get"),
        # The aggregated call and then each zone's own listing: every zone fails, each once.
        pytest.param("GET", r"/instances$", 503, None, "gcp_proxy_info", {"tags": OWNER_TAGS}, "transient",
                     1 + len(ZONES), id="503-listing"),
        pytest.param("POST", r"/zones/[^/]+/instances$", 403, "forbidden", "gcp_proxy",
                     {"name": "p-new", "tags": TAGS, "location": ZONES[0]}, "permanent", 1, id="403-forbidden-insert"),
        # Rate limits and quotas are 403s on Google APIs; their reason makes them transient.
        pytest.param("POST", r"/zones/[^/]+/instances$", 403, "quotaExceeded", "gcp_proxy",
                     {"name": "p-new", "tags": TAGS, "location": ZONES[0]}, "transient", 1, id="403-quota-insert"),
        pytest.param("GET", r"/instances/" + NAME + "$", 403, "rateLimitExceeded", "gcp_proxy_info",
                     {"provider_id": provider_id(ZONES[0], NAME)}, "transient", 1, id="403-rate-limit-get"),
    ],
)
def test_api_errors_are_classified(config: Path, emulator: ComputeEmulator, method: str, path: str, status: int,
                                   reason: str | None, module: str, args: dict[str, Any], error_class: str,
                                   calls: int) -> None:
    seed(emulator, ZONES[0], NAME, TAGS)
    # More than once: google-api-core retries get and list on 503 by itself unless told not to.
    emulator.fail_next(method, path, status, count=10, reason=reason)
    result = run_module(module, {"provider_config": str(config), "provider": "cloud", **args})
    assert result.failed, result.result
    assert result.result["error_class"] == error_class
    assert str(status) in result.result["msg"]
    assert len(emulator.requests_to(method, path)) == calls  # no hidden retries
    assert set(emulator.instances) == {(ZONES[0], NAME)}
    if module == "gcp_proxy_info" and "tags" in args:
        assert set(result.result["failed_locations"]) == set(ZONES)


def test_an_unreachable_zone_fails_the_listing_but_returns_the_rest(config: Path, emulator: ComputeEmulator) -> None:
    seed(emulator, ZONES[0], NAME, TAGS)
    emulator.set_unreachable(ZONES[1])  # the aggregated call fails whole: each zone is then listed alone
    listed = info(config, tags=OWNER_TAGS)
    assert listed.failed and listed.result["error_class"] == "transient", listed.result
    assert [i["provider_id"] for i in listed.result["instances"]] == [provider_id(ZONES[0], NAME)]
    assert list(listed.result["failed_locations"]) == [ZONES[1]]
    assert listed.result["failed_locations"][ZONES[1]]["error_class"] == "transient"
    assert f"listing zone {ZONES[1]}: 503" in listed.result["failed_locations"][ZONES[1]]["msg"]


def test_a_stock_out_places_the_instance_in_another_zone_and_warns(config: Path, emulator: ComputeEmulator) -> None:
    emulator.stock_out(ZONES[0])
    created = proxy(config, name=NAME, tags=TAGS)
    assert created.status == "successful", created.result
    assert created.result["instance"]["location"] == ZONES[1]
    warnings = " ".join(created.result.get("warnings", []))
    assert f"because zone {ZONES[0]} was out of capacity" in warnings, created.result


def test_a_missing_image_fails_permanent_naming_it(tmp_path: Path, emulator: ComputeEmulator) -> None:
    config = write_config(tmp_path / "providers.yaml", emulator,
                          images={"debian-13": "projects/debian-cloud/global/images/family/debian-13"},
                          defaultImage="debian-13")
    result = proxy(config, name=NAME, tags=TAGS, location=ZONES[0])
    assert result.failed and result.result["error_class"] == "permanent", result.result
    assert result.result["msg"].startswith("image: 'projects/debian-cloud/global/images/family/debian-13' "
                                           "(images.debian-13)"), result.result["msg"]
    assert emulator.instances == {}


def test_three_tenants_each_reach_their_own_proxy_only(config: Path, emulator: ComputeEmulator) -> None:
    # Issue 38 row 3, through the module: tenant A (port 8080, the provider's default sources),
    # B (its own range), C asking for port 22, D with users and no sources. One rule for the
    # provider admitted 0.0.0.0/0 and every range to 22, 3128 and 8080 on every instance.
    user = {"name": "crawlers", "password_hash": "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"}
    tenant_b = ["203.0.113.0/24"]
    items = [
        {"key": "a", "name": "tenant-a", "tags": TAGS, "location": ZONES[0], "port": 8080},
        {"key": "b", "name": "tenant-b", "tags": TAGS, "location": ZONES[0],
         "access": {"users": [user], "allowed_sources": tenant_b}},
        {"key": "c", "name": "tenant-c", "tags": TAGS, "location": ZONES[0], "port": 22,
         "access": {"users": [user], "allowed_sources": tenant_b}},
        {"key": "d", "name": "tenant-d", "tags": TAGS, "location": ZONES[0], "access": {"users": [user]}},
    ]
    run = proxy(config, operations=items)
    results = {item["key"]: item for item in run.result["results"]}
    assert results["a"]["ok"] and results["b"]["ok"], run.result
    assert not results["c"]["ok"] and results["c"]["error_class"] == "permanent"
    assert results["c"]["msg"].startswith("operations[2]: port: 22 is below 1024"), results["c"]["msg"]
    assert not results["d"]["ok"] and results["d"]["error_class"] == "permanent"
    assert results["d"]["msg"].startswith("operations[3]: access.allowed_sources: no IPv4 network to admit"), \
        results["d"]["msg"]
    assert set(emulator.instances) == {(ZONES[0], "tenant-a"), (ZONES[0], "tenant-b")}
    b_address, a_address = "203.0.113.7", "198.51.100.7"  # A: the provider's allowedSources
    assert emulator.reachable(a_address, ZONES[0], "tenant-a", 8080)
    assert emulator.reachable(b_address, ZONES[0], "tenant-b", 3128)
    assert not emulator.reachable(b_address, ZONES[0], "tenant-a", 8080)  # B's address, A's port
    assert not emulator.reachable(a_address, ZONES[0], "tenant-b", 3128)
    assert not emulator.reachable(b_address, ZONES[0], "tenant-a", 3128)
    ours = [rule for (_, name), rule in emulator.firewalls.items() if name.startswith("egress-proxies-")]
    assert len(ours) == 2
    assert all("0.0.0.0/0" not in rule["sourceRanges"] and rule["allowed"][0]["ports"] != ["22"] for rule in ours)


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


# -- Application Default Credentials: the GCE / GKE metadata server path -----------------------

ADC_TOKEN = "ya29.adc-token-from-the-metadata-server"


class FakeMetadataServer:
    """The metadata server's credential endpoints on 127.0.0.1, as google-auth calls them when
    it looks for Application Default Credentials on GCE or GKE (Workload Identity serves the
    same paths): the probe on ``/``, the project id, the default service account and its
    token. Like the real server it refuses requests without ``Metadata-Flavor: Google``
    and says ``Metadata-Flavor: Google`` in every answer (google-auth checks both)."""

    def __init__(self, scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)) -> None:
        self.paths: list[str] = []
        self.scopes = scopes
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.paths.append(self.path)
                status, body = server.answer(self.path, self.headers.get("Metadata-Flavor"))
                payload = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/json" if body.startswith("{") else "text/plain")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, flavor: str | None) -> tuple[int, str]:
        if flavor != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        route = path.split("?", 1)[0]
        if route == "/":
            return 200, "computeMetadata/"
        if route == "/computeMetadata/v1/project/project-id":
            return 200, PROJECT
        if route == "/computeMetadata/v1/instance/service-accounts/default/":
            return 200, json.dumps({"email": f"proxies@{PROJECT}.iam.gserviceaccount.com", "aliases": ["default"],
                                    "scopes": list(self.scopes)})
        if route == "/computeMetadata/v1/instance/service-accounts/default/token":
            return 200, json.dumps({"access_token": ADC_TOKEN, "expires_in": 3599, "token_type": "Bearer"})
        return 404, "not found"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed_context(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A TLS server context for 127.0.0.1 and the certificate a client must trust for it."""
    cert_path, key_path = self_signed(directory, [], ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, cert_path


@pytest.fixture
def tls_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ComputeEmulator]:
    """The emulator over HTTPS: an https:// apiEndpoint gets real credentials (only plain http
    on loopback is treated as an emulator that must not see a token). The module process
    trusts its certificate through REQUESTS_CA_BUNDLE, and finds no ADC of its own."""
    context, certificate = self_signed_context(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no application-default login file
    with ComputeEmulator(project=PROJECT, zones=(*ZONES, UNCONFIGURED_ZONE), ssl_context=context) as running:
        yield running


def test_application_default_credentials_come_from_the_metadata_server(tmp_path: Path, tls_emulator: ComputeEmulator,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    metadata = FakeMetadataServer()
    try:
        # google-auth's documented overrides of the metadata server's address (GCE_METADATA_HOST
        # for its requests, GCE_METADATA_IP for the "are we on GCE" probe): the module process
        # inherits them, so every token request goes to 127.0.0.1.
        monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
        monkeypatch.setenv("GCE_METADATA_IP", metadata.host)
        config = write_config(tmp_path / "providers.yaml", tls_emulator)
        seed(tls_emulator, ZONES[0], NAME, TAGS)
        fetched = info(config, provider_id=provider_id(ZONES[0], NAME))
    finally:
        metadata.close()
    assert fetched.status == "successful", fetched.result
    assert [r.headers.get("authorization") for r in tls_emulator.requests] == [f"Bearer {ADC_TOKEN}"]
    assert any(path.startswith("/computeMetadata/v1/instance/service-accounts/default/token")
               for path in metadata.paths), metadata.paths
    assert ADC_TOKEN not in json.dumps(fetched.result)


def test_no_credentials_at_all_fail_permanent_with_the_fix(tmp_path: Path, tls_emulator: ComputeEmulator,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # nothing listens there: no metadata server
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("GCE_METADATA_HOST", nowhere)
    monkeypatch.setenv("GCE_METADATA_IP", nowhere)
    config = write_config(tmp_path / "providers.yaml", tls_emulator)
    result = info(config, provider_id=provider_id(ZONES[0], NAME))
    assert result.failed and result.result["error_class"] == "permanent", result.result
    assert "set gcp.credentialsFile" in result.result["msg"] and "Workload Identity" in result.result["msg"]
    assert tls_emulator.requests == []


def test_the_config_check_finds_credentials_without_the_compute_scope_and_says_what_to_grant(
        tmp_path: Path, tls_emulator: ComputeEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    # A GKE node or VM created with the default access scopes, no Workload Identity: the metadata
    # server's token carries storage/logging/monitoring scopes only, and Compute refuses it 403
    # "insufficient authentication scopes" whatever the service account's IAM roles.
    metadata = FakeMetadataServer(scopes=DEFAULT_VM_SCOPES)
    tls_emulator.token_scopes[ADC_TOKEN] = DEFAULT_VM_SCOPES
    try:
        monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
        monkeypatch.setenv("GCE_METADATA_IP", metadata.host)
        config = write_config(tmp_path / "providers.yaml", tls_emulator)
        checked = run_module("provider_config_info", {"provider_config": str(config), "check_backends": True})
    finally:
        metadata.close()
    assert checked.status == "successful", checked.result
    (provider,) = checked.result["providers"]
    assert provider["valid"] is True  # as written; the backend says it cannot work
    (problem,) = provider["backend_errors"]
    assert problem.startswith("providers[0].gcp: listing instances (aggregated): 403 "), problem
    assert "insufficient authentication scopes" in problem
    assert "https://www.googleapis.com/auth/cloud-platform" in problem and "Workload Identity" in problem
    assert ADC_TOKEN not in json.dumps(checked.result)
