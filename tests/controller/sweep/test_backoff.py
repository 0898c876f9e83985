"""sweep/backoff.py: per-key retry timing, with the clock and the random source in the test's hands."""

from __future__ import annotations

import pytest

from egress_proxies.sweep.backoff import Backoff
from support.controller.fakes import ManualClock as Clock


def backoff(clock: Clock, rng: float = 0.5, **settings: float) -> Backoff:
    """rng 0.5 is the middle of the jitter range: no jitter at all."""
    return Backoff(clock=clock, rng=lambda: rng, **settings)


def test_a_key_never_seen_is_due() -> None:
    assert backoff(Clock()).due("uid-1")


def test_transient_failures_double_the_delay_from_the_base() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=1000)
    assert [retries.failed("uid-1", "transient") for _ in range(5)] == [5, 10, 20, 40, 80]


def test_the_delay_stops_growing_at_the_cap() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=30)
    assert [retries.failed("uid-1", "transient") for _ in range(6)] == [5, 10, 20, 30, 30, 30]


def test_a_permanent_failure_waits_the_permanent_delay_at_once() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=30, permanent_seconds=600)
    assert retries.failed("uid-1", "permanent") == 600
    assert retries.failed("uid-1", "permanent") == 600  # not doubled, not capped


def test_not_found_is_timed_like_transient() -> None:
    retries = backoff(Clock(), base_seconds=5)
    assert retries.failed("uid-1", "not_found") == 5


def test_a_key_is_not_due_until_its_delay_has_passed() -> None:
    clock = Clock()
    retries = backoff(clock, base_seconds=5)
    retries.failed("uid-1", "transient")
    assert not retries.due("uid-1")
    clock.now += 4.9
    assert not retries.due("uid-1")
    clock.now += 0.1
    assert retries.due("uid-1")


def test_keys_back_off_independently() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=1000)
    retries.failed("uid-1", "transient")
    retries.failed("uid-1", "transient")
    assert retries.failed("uid-2", "transient") == 5
    assert retries.due("uid-3")


@pytest.mark.parametrize(("rng", "factor"), [(0.0, 0.8), (0.5, 1.0), (0.999999, 1.2)])
def test_jitter_stays_within_its_share_either_way(rng: float, factor: float) -> None:
    retries = backoff(Clock(), rng=rng, base_seconds=10, jitter=0.2)
    assert retries.failed("uid-1", "transient") == pytest.approx(10 * factor, rel=1e-5)


def test_jitter_applies_to_the_permanent_delay_too() -> None:
    retries = backoff(Clock(), rng=0.0, permanent_seconds=600, jitter=0.1)
    assert retries.failed("uid-1", "permanent") == pytest.approx(540)


def test_the_default_random_jitter_is_bounded() -> None:
    retries = Backoff(base_seconds=10, cap_seconds=10, jitter=0.2)
    delays = [retries.failed(f"uid-{n}", "transient") for n in range(200)]
    assert all(8 <= d <= 12 for d in delays)
    assert len(set(delays)) > 1  # spread, not one value


def test_success_resets_the_count_and_the_wait() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=1000)
    for _ in range(3):
        retries.failed("uid-1", "transient")
    retries.succeeded("uid-1")
    assert retries.due("uid-1")
    assert retries.failed("uid-1", "transient") == 5


def test_succeeded_on_an_unknown_key_is_harmless() -> None:
    retries = backoff(Clock())
    retries.succeeded("never-failed")
    assert retries.due("never-failed")


def test_forget_drops_every_key_not_kept() -> None:
    retries = backoff(Clock(), base_seconds=5, cap_seconds=1000)
    for key in ("gone", "kept"):
        retries.failed(key, "transient")
        retries.failed(key, "transient")
    retries.forget({"kept"})
    assert retries.due("gone")
    assert not retries.due("kept")
    assert retries.failed("gone", "transient") == 5  # starts over
    assert retries.failed("kept", "transient") == 20  # its count survived
