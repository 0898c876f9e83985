"""ProxyPool as a resource (controller/egress_proxies/resources/pool.py), pure: validation errors,
durations, member names, which Proxies are a pool's members, and which instance a quarantine
names. What the pool does with its members is sweep/placement.py's (tests/controller/sweep/
test_placement.py); the directory source's pool through the real runner is in
scenarios/test_directory_pools.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from egress_proxies.resources.pool import (
    POOL_LABEL,
    QUARANTINE_ANNOTATION,
    Placement,
    Pool,
    foreign,
    member_name,
    owned_by,
    parse_duration,
    parse_spec,
    quarantined,
)
from egress_proxies.resources.proxy import Proxy

GOOD_SPEC: dict[str, Any] = {"replicas": 3, "template": {"port": 3128},
                             "placement": [{"provider": "a", "weight": 2}, {"provider": "b"}]}


# -- validation -----------------------------------------------------------------------------------

PLACEMENT_SHAPE = "{provider, location?, weight?, max?}"
DURATION_HINT = 'must be a duration such as "90s", "5m", "6h" or "1h30m" (units h, m, s, ms)'


# What a field may hold comes from crd-proxypool.yaml's schema (the API server's admission); the
# rules across fields from parse_spec. Each message is pinned whole: the path, what is allowed, the value.
@pytest.mark.parametrize(("change", "expected"), [
    ({"replicas": "abc"}, "spec.replicas: must be an integer >= 0 (got 'abc')"),
    ({"replicas": -1}, "spec.replicas: must be an integer >= 0 (got -1)"),
    ({"replicas": True}, "spec.replicas: must be an integer >= 0 (got True)"),
    ({"template": {"provider": "a"}}, ("spec.template.provider: not allowed: each member's provider comes from "
                                      "spec.placement; move it there")),
    ({"template": "squid"}, ("spec.template: must be an object: a Proxy spec without provider and location, which "
                             "come from placement (got 'squid')")),
    ({"placement": []}, f"spec.placement: must be a non-empty list of {PLACEMENT_SHAPE} (got [])"),
    ({"placement": None}, f"spec.placement: is required; it must be a non-empty list of {PLACEMENT_SHAPE}"),
    ({"placement": ["a"]}, f"spec.placement[0]: must be an object {PLACEMENT_SHAPE} (got 'a')"),
    ({"placement": [{"weight": 1}]}, "spec.placement[0].provider: is required; it must be a non-empty string"),
    ({"placement": [{"provider": 3}]}, ("spec.placement[0].provider: must be a non-empty string (quote it in YAML) "
                                       "(got 3)")),
    ({"placement": [{"provider": "a", "location": ""}]}, ("spec.placement[0].location: must be a non-empty string "
                                                         "(got '')")),
    ({"placement": [{"provider": "a", "weight": "x"}]}, "spec.placement[0].weight: must be an integer >= 0 (got 'x')"),
    ({"placement": [{"provider": "a", "max": -2}]}, "spec.placement[0].max: must be an integer >= 0 (got -2)"),
    ({"placement": [{"provider": "a", "zone": "x"}]}, ("spec.placement[0]: unknown field(s) zone; allowed: provider, "
                                                      "location, weight, max")),
    ({"placement": [{"provider": "a", "weight": 0}]}, "spec.placement: at least one placement needs a weight > 0"),
    ({"rotation": "x"}, "spec.rotation: must be an object {maxAge?, maxSurge?, maxUnavailable?, jitter?} (got 'x')"),
    ({"rotation": {"maxAge": "6 hours"}}, f"spec.rotation.maxAge: {DURATION_HINT} (got '6 hours')"),
    ({"rotation": {"maxAge": "0s"}}, ('spec.rotation.maxAge: must be a duration greater than 0, such as "90s" or "6h" '
                                     "(got '0s')")),
    ({"rotation": {"maxage": "6h"}}, ("spec.rotation: unknown field(s) maxage; allowed: maxAge, maxSurge, "
                                      "maxUnavailable, jitter")),
    ({"rotation": {"maxAge": "1h", "maxSurge": 0}}, ("spec.rotation: maxSurge and maxUnavailable cannot both be 0 "
                                                     "with maxAge set (no member could ever be replaced); set "
                                                     "maxSurge: 1")),
    ({"rotation": {"jitter": 2}}, "spec.rotation.jitter: must be a number from 0 to 1 (got 2)"),
    ({"minReady": "all"}, "spec.minReady: must be an integer >= 0 (got 'all')"),
    ({"minReady": 4}, ("spec.minReady: must be at most spec.replicas (got minReady 4 > replicas 3); lower "
                       "spec.minReady or raise spec.replicas")),
    ({"replicas": 0, "minReady": 1}, ("spec.minReady: must be at most spec.replicas (got minReady 1 > replicas 0); "
                                      "lower spec.minReady or raise spec.replicas")),
    ({"failoverAfter": 120}, f"spec.failoverAfter: {DURATION_HINT} (got 120)"),
    ({"replica": 3}, ("spec: unknown field(s) replica; allowed: replicas, template, placement, rotation, minReady, "
                      "failoverAfter, distinctEgressIPs")),
])
def test_a_malformed_spec_names_the_field_and_the_fix(change: dict[str, Any], expected: str) -> None:
    spec, errors = parse_spec({**GOOD_SPEC, **change})
    assert spec is None
    assert errors == [expected]


@pytest.mark.parametrize("spec", [None, [], "replicas: 3"])
def test_a_spec_that_is_no_object_says_what_it_holds(spec: Any) -> None:
    assert parse_spec(spec) == (None, [
        (f"spec: must be an object {{replicas?, template?, placement, rotation?, minReady?, failoverAfter?, "
         f"distinctEgressIPs?}} "
        f"(got {spec!r})")])


def test_a_null_field_reads_as_omitted_as_the_api_server_stores_it() -> None:
    spec, errors = parse_spec({**GOOD_SPEC, "template": None, "rotation": None, "minReady": None,
                               "placement": [{"provider": "a", "weight": None, "max": None}]})
    assert errors == [] and spec is not None
    assert (spec.template, spec.placements, spec.min_ready) == ({}, (Placement("a", None, 1, None),), None)


def test_every_error_is_reported_at_once() -> None:
    _, errors = parse_spec({"replicas": "abc", "placement": [{"provider": 3}], "rotation": {"jitter": -1}})
    assert [e.split(":")[0] for e in errors] == ["spec.replicas", "spec.placement[0].provider",
                                                 "spec.rotation.jitter"]


def test_a_good_spec_is_typed_with_defaults() -> None:
    spec, errors = parse_spec({**GOOD_SPEC, "rotation": {"maxAge": "1h30m"}, "failoverAfter": "5m"})
    assert errors == [] and spec is not None
    assert spec.placements == (Placement("a", None, 2, None), Placement("b", None, 1, None))
    assert (spec.max_age_seconds, spec.max_surge, spec.max_unavailable, spec.jitter) == (5400, 1, 0, 0.1)
    assert spec.failover_after_seconds == 300 and spec.available_minimum == 3
    assert spec.member_spec(1) == {"port": 3128, "provider": "b"}


def test_durations() -> None:
    assert [parse_duration(t) for t in ("6h", "1h30m", "90s", "500ms", "1.5m")] == [21600, 5400, 90, 0.5, 90]
    assert [parse_duration(t) for t in ("", "6", "6 h", "h", 6, None, "-1s")] == [None] * 7


# -- names and members ------------------------------------------------------------------------------

def test_member_names_are_deterministic_per_pool_uid_and_serial() -> None:
    pool = Pool("crawlers", "eu", "uid-1", GOOD_SPEC)
    assert member_name(pool, 1) == member_name(pool, 1)
    assert member_name(pool, 1) != member_name(pool, 2)
    assert member_name(pool, 1) != member_name(dataclasses.replace(pool, uid="uid-2"), 1)
    name = member_name(pool, 7)
    assert name.startswith("eu-") and name.endswith("-7") and len(name) == len("eu-") + 5 + len("-7")


def test_member_names_never_collide_at_any_size_and_fit_a_name() -> None:
    """5 hex characters of a hash of the serial collided 45 times in 10,000 (issue 30); the serial
    itself cannot. The longest pool name still gives names of at most 253 characters, distinct."""
    pool = Pool("crawlers", "eu", "3b9c2c8e-0000-4000-8000-000000000000", GOOD_SPEC)
    names = {member_name(pool, serial) for serial in range(1, 100_001)}
    assert len(names) == 100_000
    long = dataclasses.replace(pool, name="p" * 253)
    longest = [member_name(long, serial) for serial in (1, 10**9, 10**9 + 1)]
    assert all(len(n) <= 253 for n in longest) and len(set(longest)) == 3


def test_a_member_is_only_what_the_pool_created() -> None:
    pool = Pool("crawlers", "eu", "uid-1", GOOD_SPEC)
    owner = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": "eu", "uid": "uid-1",
             "controller": True}
    def proxy(name: str, **metadata: Any) -> Proxy:
        return Proxy("crawlers", name, name, {}, raw={"metadata": {"labels": {POOL_LABEL: "eu"}, **metadata}})

    made = proxy("eu-1", ownerReferences=[owner])
    lookalike = proxy("x")
    older = proxy("y", ownerReferences=[{**owner, "uid": "uid-0"}])
    assert [owned_by(p, pool) for p in (made, lookalike, older)] == [True, False, False]
    # The lookalike is reported; a member of an earlier pool of that name is an orphan instead.
    assert [foreign(p, pool) for p in (made, lookalike, older)] == [False, True, False]


def test_quarantine_names_one_instance() -> None:
    proxy = Proxy("ns", "p", "uid", {"provider": "a"}, status={"providerID": "kvm://hosts/h/domains/x"},
                  annotations={QUARANTINE_ANNOTATION: "kvm://hosts/h/domains/x"})
    assert quarantined(proxy)
    proxy.status["providerID"] = "kvm://hosts/h/domains/y"  # its replacement is not quarantined
    assert not quarantined(proxy)


# -- distinct egress addresses ------------------------------------------------------------------------

def test_distinct_egress_ips_is_a_typed_field_off_by_default() -> None:
    typed, errors = parse_spec(GOOD_SPEC)
    assert errors == [] and typed is not None and typed.distinct_egress_ips is False
    typed, errors = parse_spec({**GOOD_SPEC, "distinctEgressIPs": True})
    assert errors == [] and typed is not None and typed.distinct_egress_ips
    _, errors = parse_spec({**GOOD_SPEC, "distinctEgressIPs": "yes"})
    assert any(e.startswith("spec.distinctEgressIPs") for e in errors), errors
