"""sweep/locations.py: the gauges an operator waits on for "the host is drained", from the
provider's listing and its hosts' states; a failed listing changes nothing (a host that did not
answer is not empty); a location's series go when it has nothing left to report."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from egress_proxies.providers.client import Instance, Listing
from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.sweep.locations import LocationReport

PROVIDER = "locations-test"  # a name no other test's gauges use


def on(*hosts: str) -> Listing:
    return Listing([Instance(f"kvm://hosts/{host}/domains/p-{i}", location=host) for i, host in enumerate(hosts)])


def instances(location: str) -> float | None:
    return REGISTRY.get_sample_value("egress_proxies_location_instances", {"provider": PROVIDER, "location": location})


def states(location: str) -> dict[str, float | None]:
    return {state: REGISTRY.get_sample_value("egress_proxies_location_state",
                                             {"provider": PROVIDER, "location": location, "state": state})
            for state in ("cordoned", "draining", "drained")}


def test_a_draining_host_is_reported_drained_once_empty_and_forgotten_when_active(
        caplog: pytest.LogCaptureFixture) -> None:
    report = LocationReport()
    draining = {PROVIDER: {"h1": "draining"}}
    report.publish(draining, {PROVIDER: on("h1", "h1", "h2")})
    assert (instances("h1"), instances("h2")) == (2, 1)
    assert states("h1") == {"cordoned": 0, "draining": 1, "drained": 0}
    assert states("h2") == {"cordoned": None, "draining": None, "drained": None}  # active: no state series
    # A listing that failed says nothing of the host (it may not have answered): values kept.
    report.publish(draining, {PROVIDER: Listing(on("h2").instances, ProviderError(ErrorClass.TRANSIENT, "h1 down"))})
    assert instances("h1") == 2 and states("h1")["draining"] == 1
    with caplog.at_level("INFO", logger="egress_proxies"):
        report.publish(draining, {PROVIDER: on("h2", "h2", "h2")})
        report.publish(draining, {PROVIDER: on("h2", "h2", "h2")})
    assert (instances("h1"), instances("h2")) == (0, 3)
    assert states("h1") == {"cordoned": 0, "draining": 0, "drained": 1}
    drained = [r.getMessage() for r in caplog.records if "host h1 is drained" in r.getMessage()]
    assert len(drained) == 1, drained  # said once, the gauge says it every scrape
    # Active again, and empty: nothing left to report about h1.
    report.publish({}, {PROVIDER: on("h2")})
    assert instances("h1") is None and states("h1") == {"cordoned": None, "draining": None, "drained": None}
    # The provider gone from the config: its series go too.
    report.publish({}, {})
    assert instances("h2") is None
