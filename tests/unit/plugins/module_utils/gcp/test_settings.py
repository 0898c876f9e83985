"""The gcp section: the API endpoint, the subnetwork, and every bad field."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import config_errors, parse_provider_config
from support.collection.config_documents import GCP, assert_bad_field, changed, config_error, paths, valid_document


@pytest.mark.parametrize("endpoint", ["https://compute.example.com", "http://127.0.0.1:8085",
                                      "http://localhost:8085", "http://[::1]:8085"])
def test_gcp_api_endpoint_is_https_or_a_loopback_emulator(endpoint: str) -> None:
    gcp = parse_provider_config(changed(((*GCP, "apiEndpoint"), endpoint))).providers[1].gcp
    assert gcp is not None
    assert gcp.api_endpoint == endpoint


BAD_FIELDS = [
    pytest.param(changed(((*GCP, "zones"), [])), "providers[1].gcp.zones: must be a non-empty list",
                 id="gcp-zones-empty"),
    pytest.param(changed(((*GCP, "zones", 1), "Europe West")), "providers[1].gcp.zones[1]: 'Europe West'",
                 id="gcp-bad-zone"),
    pytest.param(changed(((*GCP, "zones", 0), "europe-west1-b\n")), "providers[1].gcp.zones[0]: ",
                 id="gcp-zone-with-trailing-newline"),
    pytest.param(changed(((*GCP, "project"), "My_Project")), "providers[1].gcp.project: 'My_Project'",
                 id="gcp-project-invalid"),
    pytest.param(changed(((*GCP, "apiEndpoint"), "http://compute.example.com")),
                 "providers[1].gcp.apiEndpoint: 'http://compute.example.com' must be an https:// URL",
                 id="gcp-plain-http-endpoint-off-loopback"),
    pytest.param(changed(((*GCP, "apiEndpoint"), "127.0.0.1:8085")),
                 "providers[1].gcp.apiEndpoint: '127.0.0.1:8085' must be", id="gcp-endpoint-without-scheme"),
    pytest.param(changed(((*GCP, "firewall"), "none")),
                 "providers[1].gcp.firewall: 'none' is not one of managed, external", id="gcp-firewall-mode"),
    pytest.param(changed(((*GCP, "networkTags"), ["proxies", "Proxies_2"])),
                 "providers[1].gcp.networkTags[1]: 'Proxies_2' is not a network tag", id="gcp-network-tag"),
]


def test_gcp_firewall_is_managed_unless_the_operator_says_external() -> None:
    default = parse_provider_config(changed()).providers[1].gcp
    external = parse_provider_config(changed(((*GCP, "firewall"), "external"),
                                             ((*GCP, "networkTags"), ["proxies"]))).providers[1].gcp
    assert default is not None and (default.firewall, default.network_tags) == ("managed", ())
    assert external is not None and (external.firewall, external.network_tags) == ("external", ("proxies",))


@pytest.mark.parametrize(("document", "expected"), BAD_FIELDS)
def test_a_bad_field_is_reported_with_its_path(document: dict[str, Any], expected: str) -> None:
    assert_bad_field(document, expected)


def test_every_error_within_one_mapping_is_reported_in_document_order() -> None:
    # The gcp section as docs/gcp-provider.md's example writes it: project first, then zones.
    document = changed(((*GCP, "project"), "My_Project"), ((*GCP, "zones", 0), "Europe West"))
    assert list(document["providers"][1]["gcp"])[:2] == ["project", "zones"]
    assert paths(config_errors(document)) == ["providers[1].gcp.project", "providers[1].gcp.zones[0]"]


# --- GCP subnetwork ---------------------------------------------------------------------------


@pytest.mark.parametrize("subnetwork", [
    "regions/europe-west1/subnetworks/egress",
    "projects/my-project/regions/europe-west1/subnetworks/egress",
    "https://www.googleapis.com/compute/v1/projects/my-project/regions/europe-west1/subnetworks/egress",
])
def test_gcp_subnetwork_forms(subnetwork: str) -> None:
    document = changed(((*GCP, "subnetwork"), subnetwork), ((*GCP, "zones"), ["europe-west1-b", "europe-west1-c"]))
    gcp = parse_provider_config(document).provider("gcp-eu", "gcp").gcp
    assert gcp is not None
    assert gcp.subnetwork == subnetwork


def test_gcp_subnetwork_defaults_to_none() -> None:
    gcp = parse_provider_config(valid_document()).provider("gcp-eu").gcp
    assert gcp is not None
    assert gcp.subnetwork is None


@pytest.mark.parametrize(("subnetwork", "expected"), [
    ("egress", "'egress' is not a subnetwork such as regions/europe-west1/subnetworks/egress"),
    ("regions/europe-west1/subnetworks/Egress_1", "is not a subnetwork"),
    ("global/networks/default", "is not a subnetwork"),
    ("regions/europe-west1/subnetworks/egress", "is in region europe-west1, but zones europe-west4-a are not"),
])
def test_gcp_bad_subnetwork(subnetwork: str, expected: str) -> None:
    error = config_error(changed(((*GCP, "subnetwork"), subnetwork)))
    assert error.errors[0].startswith("providers[1].gcp.subnetwork: ")
    assert expected in error.errors[0]
