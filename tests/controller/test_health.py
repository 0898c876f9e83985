"""health.py: SweepHealth's liveness and readiness decisions, on a clock the test moves. The same
answers over HTTP (/healthz, /readyz) are in test_http_server.py."""

from __future__ import annotations

import pytest

from egress_proxies.health import MIN_MAX_SWEEP_SECONDS, MIN_STALL_SECONDS, SweepHealth
from support.controller.fakes import ManualClock as Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(5000.0)


def sweep(health: SweepHealth, clock: Clock, ok: bool = True, seconds: float = 1.0, problems: str = "") -> None:
    health.sweep_started()
    clock.now += seconds
    health.sweep_finished(ok, problems)


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_seconds must be positive"):
        SweepHealth(0)


def test_windows_follow_the_interval_with_floors() -> None:
    assert (SweepHealth(10).stall_seconds, SweepHealth(10).max_sweep_seconds) == (MIN_STALL_SECONDS,
                                                                                 MIN_MAX_SWEEP_SECONDS)
    assert (SweepHealth(600).stall_seconds, SweepHealth(600).max_sweep_seconds) == (1800, 6000)
    assert SweepHealth(10, max_sweep_seconds=50).max_sweep_seconds == 50


def test_a_new_process_is_alive_but_not_ready_before_its_first_sweep(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock)
    assert health.alive() == (True, "sweep loop progressing")
    assert health.ready() == (False, "no successful sweep yet")


def test_ready_after_a_good_sweep_until_three_intervals_pass(clock: Clock) -> None:
    health = SweepHealth(10, clock=clock)
    sweep(health, clock)
    assert health.ready() == (True, "last sweep ok 0s ago")
    clock.now += 30
    assert health.ready()[0]
    clock.now += 1
    assert health.alive()[0]
    assert health.ready() == (False, "last successful sweep finished 31s ago (limit 30s)")


def test_a_failed_sweep_keeps_the_previous_good_answer_ready(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock)
    sweep(health, clock)
    clock.now += 30
    sweep(health, clock, ok=False)
    assert health.ready() == (True, "last sweep failed; last successful one 31s ago")


def test_problems_of_a_good_sweep_are_reported_and_stay_ready(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock)
    sweep(health, clock, problems="1 provider(s) failing: lab")
    assert health.ready() == (True, "last sweep ok 0s ago, 1 provider(s) failing: lab")


def test_a_loop_that_stops_sweeping_is_not_alive_after_the_stall_window(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock)
    sweep(health, clock, ok=False)  # sweeps that finish with errors are progress
    clock.now += health.stall_seconds
    assert health.alive()[0]
    clock.now += 1
    assert health.alive() == (False, "no sweep started or finished for 181s (limit 180s)")
    assert not health.ready()[0]  # not alive is never ready


def test_a_running_sweep_is_alive_until_its_bound(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock, max_sweep_seconds=900)
    health.sweep_started()
    clock.now += 900
    assert health.alive() == (True, "sweep running for 900s")
    clock.now += 1
    assert health.alive() == (False, "sweep running for 901s (limit 900s): wedged")


def test_a_dead_thread_fails_both_probes_and_the_first_death_is_kept(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock)
    sweep(health, clock)
    health.thread_died("watch", "ApiException: 500")
    health.thread_died("sweep", "later")
    assert health.alive() == (False, "the watch thread died: ApiException: 500")
    assert health.ready() == (False, "the watch thread died: ApiException: 500")


def test_a_standby_is_alive_while_its_election_loop_reports_and_ready_once_loaded(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock, leader=False)
    assert not health.leader
    assert health.ready() == (False, "standby: the stored Proxies were not read yet (discovery would be empty)")
    health.view_loaded()
    assert health.ready() == (True, "standby: waiting for the leader Lease")
    clock.now += health.stall_seconds - 1
    health.set_leader(False)  # the heartbeat
    clock.now += health.stall_seconds
    assert health.alive() == (True, "standby")
    clock.now += 1
    assert not health.alive()[0] and "leader election silent" in health.alive()[1]


def test_a_new_leader_serves_the_stored_view_for_one_readiness_window(clock: Clock) -> None:
    health = SweepHealth(10, clock=clock, leader=False)
    health.view_loaded()
    sweep(health, clock)  # a sweep from an earlier term does not count for the new one
    clock.now += 500
    health.set_leader(True)
    assert health.leader
    assert health.ready() == (True, "new leader: serving the stored Proxies until its first successful sweep")
    clock.now += 31
    assert health.alive()[0]
    assert health.ready() == (False, "no successful sweep yet")
    sweep(health, clock)
    assert health.ready()[0]


def test_a_new_leader_without_a_stored_view_waits_for_its_first_sweep(clock: Clock) -> None:
    health = SweepHealth(60, clock=clock, leader=False)
    health.set_leader(True)
    assert health.ready() == (False, "no successful sweep yet")
