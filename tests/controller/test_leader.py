"""LeaseElector against the Kubernetes API emulator through the real client (kube.KubeLeases).

Time is a fake clock shared by the contenders, so expiry is decided by the test, not by
sleeping; the API's optimistic concurrency (409 on a stale resourceVersion or an existing
Lease) is the real emulator's.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from egress_proxies.leader import LeaseElector, parse_micro_time
from egress_proxies.sources.kube import KubeLeases
from support.kube.emulator import KubeEmulator

pytestmark = pytest.mark.timeout(30)

NS, LEASE = "egress", "egress-proxies"
START = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
Obj = dict[str, Any]


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


@pytest.fixture
def leases(kube: KubeEmulator) -> Iterator[KubeLeases]:
    if kube.get_object("namespaces", None, NS) is None:  # the API refuses a Lease in a missing one
        kube.create_namespace(NS)
    api_client = client.ApiClient(client.Configuration(host=kube.url))
    try:
        yield KubeLeases(api_client)
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def elector(leases: Any, clock: FakeClock, identity: str) -> LeaseElector:
    return LeaseElector(leases, NS, LEASE, identity, lease_seconds=15, renew_seconds=5, clock=clock)


def lease_spec(kube: KubeEmulator) -> Obj:
    obj = kube.get_object("leases.coordination.k8s.io", NS, LEASE)
    assert obj is not None
    return dict(obj["spec"])


def test_only_one_of_two_contenders_wins(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")

    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()

    assert (a.is_leader, b.is_leader) == (True, False)
    spec = lease_spec(kube)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("a", 15, 0)
    # MicroTime on the wire: six fractional digits and Z, even at a whole second.
    assert spec["renewTime"] == spec["acquireTime"] == "2026-01-01T12:00:00.000000Z"


def test_the_leader_renews_and_stays_leader(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()

    for _ in range(5):  # 50 s in all, far beyond one lease, renewed every 10 s
        clock.advance(10)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()

    spec = lease_spec(kube)
    assert parse_micro_time(spec["renewTime"]) == clock.now
    assert parse_micro_time(spec["acquireTime"]) == START
    assert spec["leaseTransitions"] == 0


def test_a_leader_that_stops_renewing_loses_its_lease(kube: KubeEmulator, leases: KubeLeases,
                                                      clock: FakeClock) -> None:
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()

    clock.advance(14)
    assert not b.try_acquire_or_renew()  # not yet expired
    clock.advance(1)
    assert not a.is_leader  # a knows its own lease ran out, even without asking the API
    assert b.try_acquire_or_renew()

    assert lease_spec(kube)["holderIdentity"] == "b"
    assert lease_spec(kube)["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()  # the old leader finds it taken


def test_release_lets_the_other_take_over_at_once(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()

    a.release()

    assert not a.is_leader
    assert "holderIdentity" not in lease_spec(kube)
    assert b.try_acquire_or_renew()  # no clock advance needed
    assert lease_spec(kube)["holderIdentity"] == "b"


def test_release_by_a_non_holder_changes_nothing(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    before = kube.get_object("leases.coordination.k8s.io", NS, LEASE)

    b.release()

    assert kube.get_object("leases.coordination.k8s.io", NS, LEASE) == before
    assert a.try_acquire_or_renew()


class RacingLeases:
    """KubeLeases where another contender writes the Lease right after our read, the window
    a real race hits: our write then carries a stale view and must lose."""

    def __init__(self, inner: KubeLeases) -> None:
        self.inner = inner
        self.after_read: Callable[[], None] | None = None

    def get(self, namespace: str, name: str) -> Obj | None:
        lease = self.inner.get(namespace, name)
        if self.after_read is not None:
            hook, self.after_read = self.after_read, None
            hook()
        return lease

    def create(self, namespace: str, body: Obj) -> Obj:
        return self.inner.create(namespace, body)

    def replace(self, namespace: str, name: str, body: Obj) -> Obj:
        return self.inner.replace(namespace, name, body)


def test_a_concurrent_create_means_not_leader(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    racing = RacingLeases(leases)
    a, b = elector(racing, clock, "a"), elector(leases, clock, "b")
    racing.after_read = lambda: assert_won(b)  # a saw no Lease; b creates it first

    assert not a.try_acquire_or_renew()

    assert (a.is_leader, b.is_leader) == (False, True)
    assert lease_spec(kube)["holderIdentity"] == "b"


def test_a_concurrent_takeover_means_not_leader(kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    racing = RacingLeases(leases)
    old, a, b = elector(leases, clock, "old"), elector(racing, clock, "a"), elector(leases, clock, "b")
    assert old.try_acquire_or_renew()
    clock.advance(20)  # both see the old leader's lease expired
    racing.after_read = lambda: assert_won(b)

    assert not a.try_acquire_or_renew()

    assert (a.is_leader, b.is_leader) == (False, True)
    assert lease_spec(kube)["holderIdentity"] == "b"


def test_a_leader_whose_renewal_races_a_takeover_steps_down(kube: KubeEmulator, leases: KubeLeases,
                                                            clock: FakeClock) -> None:
    racing = RacingLeases(leases)
    a, b = elector(racing, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    clock.advance(20)  # a was stalled past its lease; b takes over while a renews
    racing.after_read = lambda: assert_won(b)

    assert not a.try_acquire_or_renew()

    assert not a.is_leader
    assert lease_spec(kube)["holderIdentity"] == "b"


def assert_won(contender: LeaseElector) -> None:
    assert contender.try_acquire_or_renew()


def contend_at_once(contenders: list[LeaseElector]) -> dict[str, bool]:
    """One try_acquire_or_renew per contender, all released together from a barrier."""
    start = threading.Barrier(len(contenders))
    results: dict[str, bool] = {}

    def contend(contender: LeaseElector) -> None:
        start.wait()
        results[contender.identity] = contender.try_acquire_or_renew()

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return results


def test_contenders_in_threads_never_both_win(leases: KubeLeases, clock: FakeClock) -> None:
    contenders = [elector(leases, clock, name) for name in ("a", "b", "c")]
    for _ in range(15):
        clock.advance(20)  # every round starts with the lease expired: all three contend
        results = contend_at_once(contenders)
        assert len(results) == 3 and sum(results.values()) == 1, results
        assert sum(c.is_leader for c in contenders) == 1


def test_an_api_failure_keeps_leadership_only_until_the_lease_runs_out(
        kube: KubeEmulator, leases: KubeLeases, clock: FakeClock) -> None:
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()

    clock.advance(10)
    kube.fail_next("GET", "/leases/", 500)
    assert a.try_acquire_or_renew()  # nobody can have taken over yet
    clock.advance(5)
    kube.fail_next("GET", "/leases/", 500)
    assert not a.try_acquire_or_renew()  # the lease written at START has run out
    assert not a.is_leader


def test_renew_must_be_shorter_than_the_lease(leases: KubeLeases) -> None:
    with pytest.raises(ValueError, match="shorter than"):
        LeaseElector(leases, NS, LEASE, "a", lease_seconds=5, renew_seconds=5)
