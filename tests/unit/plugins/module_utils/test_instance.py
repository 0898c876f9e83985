"""Instance names, ports and tags as every provider validates them, tag matching, and listing
locations side by side."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils import instance as instance_module
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import PERMANENT, Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    Instance,
    endpoint_of,
    list_locations,
    matches_tags,
    validate_name,
    validate_port,
    validate_tags,
)


@pytest.mark.parametrize("name", ["a", "eu-1", "crawlers-eu-1-3f9c2a", "a" * 63, "a--b"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param("1abc", id="leading-digit"),
        pytest.param("-a", id="leading-dash"),
        pytest.param("a-", id="trailing-dash"),
        pytest.param("Eu-1", id="uppercase"),
        pytest.param("eu_1", id="underscore"),
        pytest.param("eu.1", id="dot"),
        pytest.param("eu 1", id="space"),
        pytest.param("a/b", id="slash"),
        pytest.param("a" * 64, id="64-chars"),
        pytest.param("eu-1\n", id="trailing-newline"),
        pytest.param(None, id="none"),
        pytest.param(7, id="int"),
    ],
)
def test_invalid_names_are_permanent(name: Any) -> None:
    with pytest.raises(Permanent) as caught:
        validate_name(name)
    assert caught.value.error_class == PERMANENT
    assert str(caught.value).startswith(f"name: {name!r} is not a valid instance name")


@pytest.mark.parametrize("port", [1024, 3128, 65535])
def test_valid_ports(port: int) -> None:
    assert validate_port(port) == port


@pytest.mark.parametrize("port", [1, 22, 80, 1023])
def test_ports_below_1024_are_refused_naming_the_field_and_the_fix(port: int) -> None:
    # Issue 38 row 3: a firewall rule or a published port for 22 opens sshd, not squid.
    with pytest.raises(Permanent) as caught:
        validate_port(port)
    assert str(caught.value).startswith(f"port: {port} is below 1024, where the instance's own services listen")
    assert str(caught.value).endswith("use 1024-65535 (default 3128)")


@pytest.mark.parametrize(
    "port",
    [
        pytest.param(0, id="zero"),
        pytest.param(-1, id="negative"),
        pytest.param(65536, id="too-big"),
        pytest.param(True, id="bool"),
        pytest.param("3128", id="string"),
        pytest.param(3128.0, id="float"),
        pytest.param(None, id="none"),
    ],
)
def test_invalid_ports_are_permanent(port: Any) -> None:
    with pytest.raises(Permanent) as caught:
        validate_port(port)
    assert str(caught.value).startswith(f"port: {port!r} is not a TCP port")


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        pytest.param(None, {}, id="none"),
        pytest.param({}, {}, id="empty"),
        pytest.param({"crawl.example.com/owner": "o", "k": ""}, {"crawl.example.com/owner": "o", "k": ""},
                     id="strings"),
    ],
)
def test_valid_tags(tags: Any, expected: dict[str, str]) -> None:
    result = validate_tags(tags)
    assert result == expected
    assert result is not tags  # a copy: the caller's mapping is never shared


@pytest.mark.parametrize(
    ("tags", "prefix"),
    [
        pytest.param({"": "x"}, "tags: every key must be a non-empty string", id="empty-key"),
        pytest.param({1: "x"}, "tags: every key must be a non-empty string", id="int-key"),
        pytest.param({"a": 1}, "tags.a: value must be a string, got int", id="int-value"),
        pytest.param({"a": None}, "tags.a: value must be a string, got NoneType", id="none-value"),
        pytest.param({"a": "ok", "b": ["x"]}, "tags.b: value must be a string, got list", id="list-value"),
    ],
)
def test_invalid_tags_are_permanent(tags: dict[Any, Any], prefix: str) -> None:
    with pytest.raises(Permanent) as caught:
        validate_tags(tags)
    assert str(caught.value).startswith(prefix)


INSTANCE_TAGS = {"crawl.example.com/owner": "o", "crawl.example.com/proxy": "ns/eu-1", "extra": "x"}


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        pytest.param({}, True, id="nothing-wanted"),
        pytest.param({"crawl.example.com/owner": "o"}, True, id="one-matching"),
        pytest.param({"crawl.example.com/owner": "o", "crawl.example.com/proxy": "ns/eu-1"}, True,
                     id="two-matching"),
        pytest.param({"crawl.example.com/owner": "other"}, False, id="other-value"),
        pytest.param({"crawl.example.com/owner": "o", "crawl.example.com/uid": "u"}, False, id="one-missing"),
        pytest.param({"crawl.example.com/owner": "O"}, False, id="case-differs"),
    ],
)
def test_matches_tags(wanted: dict[str, str], expected: bool) -> None:
    assert matches_tags(INSTANCE_TAGS, wanted) is expected


def test_an_instance_without_tags_matches_only_an_empty_wish() -> None:
    assert matches_tags({}, {})
    assert not matches_tags({}, {"crawl.example.com/owner": "o"})


def test_instance_dict_has_the_contract_shape() -> None:
    tags = {"crawl.example.com/owner": "o"}
    instance = Instance(provider_id="kvm://hosts/h/domains/d", name="d", location="h", state="running",
                        ip="192.0.2.10", tags=tags, created="2026-01-01T00:00:00Z",
                        endpoint=endpoint_of("192.0.2.10", 3128))
    result = instance.to_dict()
    assert result == {"provider_id": "kvm://hosts/h/domains/d", "name": "d", "location": "h",
                      "state": "running", "ip": "192.0.2.10", "endpoint": "192.0.2.10:3128", "tags": tags,
                      "created": "2026-01-01T00:00:00Z"}
    result["tags"]["x"] = "y"
    assert instance.tags == {"crawl.example.com/owner": "o"}


def test_an_endpoint_is_host_and_port_with_brackets_for_ipv6() -> None:
    assert endpoint_of("192.0.2.10", 8080) == "192.0.2.10:8080"
    assert endpoint_of("2001:db8::7", 3128) == "[2001:db8::7]:3128"
    assert endpoint_of("lb.example.com", 3128) == "lb.example.com:3128"
    assert endpoint_of(None, 3128) is None and endpoint_of("192.0.2.10", None) is None


def test_locations_are_listed_side_by_side_in_their_order_and_a_failure_stays_with_its_location() -> None:
    # Every location waits at the barrier until LISTING_PARALLELISM of them have arrived: only
    # listings that run at the same time get past it.
    locations = [f"h{index}" for index in range(instance_module.LISTING_PARALLELISM)]
    together = threading.Barrier(len(locations), timeout=10)

    def list_one(location: str) -> list[str]:
        together.wait()
        if location == "h1":
            raise Transient("host h1 does not answer")
        return [f"{location}-a", f"{location}-b"]

    found, failed = list_locations(locations, lambda location: location, list_one)
    assert found == [f"{location}-{suffix}" for location in locations if location != "h1" for suffix in "ab"]
    assert list(failed) == ["h1"] and isinstance(failed["h1"], Transient)


def test_a_bug_while_listing_a_location_is_raised() -> None:
    def list_one(location: str) -> list[str]:
        if location == "h2":
            raise KeyError("a bug")
        return [location]

    with pytest.raises(KeyError):
        list_locations(["h1", "h2", "h3"], str, list_one)
