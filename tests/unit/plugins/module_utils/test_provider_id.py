"""providerIDs: every scheme round-trips, and anything not exactly one of the shapes is Permanent."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import PERMANENT, Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    ProviderID,
    format_provider_id,
    parse_provider_id,
)


@pytest.mark.parametrize(
    ("scheme", "location", "name", "project", "text"),
    [
        pytest.param("kvm", "beelink", "crawlers-eu-1-3f9c2a", "",
                     "kvm://hosts/beelink/domains/crawlers-eu-1-3f9c2a", id="kvm"),
        pytest.param("kvm", "nuc_2.lan", "Domain_1.x", "", "kvm://hosts/nuc_2.lan/domains/Domain_1.x",
                     id="kvm-identifier-characters"),
        pytest.param("gce", "europe-west1-b", "crawlers-eu-1", "my-project",
                     "gce://my-project/zones/europe-west1-b/instances/crawlers-eu-1", id="gce"),
        pytest.param("gce", "us-central1-a", "a", "example.com:my-project",
                     "gce://example.com:my-project/zones/us-central1-a/instances/a", id="gce-domain-project"),
        pytest.param("k8s", "egress", "crawlers-eu-1", "", "k8s://namespaces/egress/pods/crawlers-eu-1",
                     id="k8s"),
        pytest.param("k8s", "egress", "proxy.eu-1", "", "k8s://namespaces/egress/pods/proxy.eu-1",
                     id="k8s-dotted-pod-name"),
    ],
)
def test_round_trip(scheme: str, location: str, name: str, project: str, text: str) -> None:
    formatted = format_provider_id(scheme, location, name, project)
    assert formatted == text
    parsed = parse_provider_id(formatted)
    assert parsed == ProviderID(scheme=scheme, location=location, name=name, project=project)
    assert str(parsed) == text
    assert parse_provider_id(text, scheme) == parsed


REJECTED = [
    pytest.param("", id="empty"),
    pytest.param("hosts/beelink/domains/x", id="no-scheme"),
    pytest.param("aws://us-east-1/instances/i-1", id="unknown-scheme"),
    pytest.param("KVM://hosts/beelink/domains/x", id="uppercase-scheme"),
    pytest.param("kvm://hosts/beelink/domains/x/extra", id="kvm-extra-segment"),
    pytest.param("kvm://hosts/beelink/domains", id="kvm-missing-segment"),
    pytest.param("kvm://hosts/beelink/x", id="kvm-missing-keyword"),
    pytest.param("kvm://hosts//domains/x", id="kvm-empty-host"),
    pytest.param("kvm://hosts/beelink/domains/", id="kvm-empty-domain"),
    pytest.param("kvm://hosts/bee/link/domains/x", id="kvm-slash-in-host"),
    pytest.param("kvm://hosts/bee link/domains/x", id="kvm-space-in-host"),
    pytest.param("kvm://hosts/beelink/domains/x y", id="kvm-space-in-domain"),
    pytest.param("kvm://hosts/beelink/domains/x/", id="kvm-trailing-slash"),
    pytest.param("kvm://hosts/beelink/domains/x\n", id="kvm-trailing-newline"),
    pytest.param(" kvm://hosts/beelink/domains/x", id="kvm-leading-space"),
    pytest.param("kvm://domains/x/hosts/beelink", id="kvm-segments-swapped"),
    pytest.param("gce://my-project/zones/europe-west1-b/instances/EU-1", id="gce-uppercase-name"),
    pytest.param("gce://my-project/zones/europe-west1-b/instances/eu_1", id="gce-underscore-name"),
    pytest.param("gce://my-project/zones/europe-west1-b/instances/eu-1/", id="gce-trailing-slash"),
    pytest.param("gce://my-project/zones/europe-west1-b/instances", id="gce-missing-segment"),
    pytest.param("gce://My_Project/zones/europe-west1-b/instances/eu-1", id="gce-bad-project"),
    pytest.param("gce://my-project/europe-west1-b/instances/eu-1", id="gce-missing-zones-keyword"),
    pytest.param("gce://my-project/zones/europe-west1-b/instances/eu-1\n", id="gce-trailing-newline"),
    pytest.param("k8s://namespaces/egress/pods/eu-1/extra", id="k8s-extra-segment"),
    pytest.param("k8s://namespaces/Egress/pods/eu-1", id="k8s-uppercase-namespace"),
    pytest.param("k8s://namespaces//pods/eu-1", id="k8s-empty-namespace"),
    pytest.param("k8s://namespaces/egress/pods/eu 1", id="k8s-space-in-name"),
]


@pytest.mark.parametrize("text", REJECTED)
def test_malformed_provider_ids_are_permanent(text: str) -> None:
    with pytest.raises(Permanent) as caught:
        parse_provider_id(text)
    assert caught.value.error_class == PERMANENT
    assert str(caught.value).startswith(f"provider_id: {text!r} is malformed")


@pytest.mark.parametrize("value", [None, 42, b"kvm://hosts/a/domains/b"], ids=["none", "int", "bytes"])
def test_a_provider_id_that_is_not_a_string_is_permanent(value: Any) -> None:
    with pytest.raises(Permanent, match=r"^provider_id: must be a string"):
        parse_provider_id(value)


@pytest.mark.parametrize(
    ("text", "scheme"),
    [
        pytest.param("gce://my-project/zones/europe-west1-b/instances/eu-1", "kvm", id="gce-to-kvm"),
        pytest.param("kvm://hosts/beelink/domains/x", "k8s", id="kvm-to-k8s"),
        pytest.param("k8s://namespaces/egress/pods/eu-1", "gce", id="k8s-to-gce"),
    ],
)
def test_the_wrong_scheme_is_permanent_when_a_scheme_is_required(text: str, scheme: str) -> None:
    with pytest.raises(Permanent) as caught:
        parse_provider_id(text, scheme)
    found = text.split(":")[0]
    assert str(caught.value).startswith(f"provider_id: {text!r} is a {found}:// providerID")
    assert f"only handles {scheme}://" in str(caught.value)


@pytest.mark.parametrize(
    ("scheme", "location", "name", "project"),
    [
        pytest.param("kvm", "bee/link", "x", "", id="kvm-slash-in-host"),
        pytest.param("kvm", "beelink", "", "", id="kvm-empty-name"),
        pytest.param("gce", "europe-west1-b", "EU-1", "my-project", id="gce-uppercase-name"),
        pytest.param("gce", "europe-west1-b", "eu-1", "", id="gce-without-project"),
        pytest.param("k8s", "egress", "eu-1", "my-project", id="k8s-with-project"),
    ],
)
def test_format_refuses_parts_that_would_not_parse_back(scheme: str, location: str, name: str,
                                                        project: str) -> None:
    with pytest.raises(Permanent, match=r"^provider_id: "):
        format_provider_id(scheme, location, name, project)
