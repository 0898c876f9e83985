"""The tag encoding: labels for filtering, metadata JSON for the exact tags, and back."""

from __future__ import annotations

import json

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import (
    OURS_FILTER,
    TAGS_METADATA_KEY,
    decode_tags,
    encode_tags,
    is_ours,
    list_filter,
)

CONTROLLER_TAGS = {
    "crawl.example.com/owner": "prod-cluster-1",
    "crawl.example.com/proxy": "crawlers/eu-1",
    "crawl.example.com/uid": "0b6f4c1e-9d1a-4f2e-8c3b-5a7d9e1f2a3b",
    "crawl.example.com/spec-hash": "3f9c2a0d11e4b7aa",
}


@pytest.mark.parametrize(
    "tags",
    [
        pytest.param(CONTROLLER_TAGS, id="controller-tags"),
        pytest.param({}, id="none"),
        pytest.param({"Team/Name": "Crawl Ops", "x.y": "", "ünï": "😀 / \" {{ }}"}, id="anything-goes"),
        pytest.param({**CONTROLLER_TAGS, "crawl.example.com/uid": "UPPER/case"}, id="uid-not-label-safe"),
    ],
)
def test_tags_round_trip_exactly(tags: dict[str, str]) -> None:
    labels, tags_json = encode_tags(tags)
    assert decode_tags(labels, {TAGS_METADATA_KEY: tags_json}) == tags
    assert is_ours(labels)


def test_labels_mirror_only_label_safe_filter_tags() -> None:
    labels, _ = encode_tags({**CONTROLLER_TAGS, "crawl.example.com/uid": "UPPER/case"})
    assert labels == {"egress_proxies": "v1", "egress_proxies_owner": "prod-cluster-1",
                      "egress_proxies_spec_hash": "3f9c2a0d11e4b7aa"}


def test_without_metadata_the_labels_are_decoded_back() -> None:
    labels, _ = encode_tags(CONTROLLER_TAGS)
    expected = {k: v for k, v in CONTROLLER_TAGS.items() if k != "crawl.example.com/proxy"}
    assert decode_tags(labels, {}) == expected
    assert decode_tags(labels, {TAGS_METADATA_KEY: "not json"}) == expected
    assert decode_tags(labels, {TAGS_METADATA_KEY: json.dumps({"k": 1})}) == expected


def test_an_owner_that_cannot_be_a_label_is_refused_naming_the_tag() -> None:
    with pytest.raises(Permanent, match=r"^tags\.crawl\.example\.com/owner: 'Prod Cluster'"):
        encode_tags({"crawl.example.com/owner": "Prod Cluster"})


def test_the_filter_names_the_marker_and_the_owner_only() -> None:
    assert list_filter({}) == OURS_FILTER == '(labels.egress_proxies = "v1")'
    owner_clause = '(labels.egress_proxies_owner = "prod-cluster-1")'
    assert list_filter(CONTROLLER_TAGS) == f"{OURS_FILTER} {owner_clause}"
    # No instance can carry an owner that is not label-safe: nothing to ask the API.
    assert list_filter({"crawl.example.com/owner": 'x") OR (name = "y'}) is None
