"""The client's own bounds (limits.py): backoff of failing proxies, per-site cool-downs and the
quarantine budget, on a clock the test moves."""

from __future__ import annotations

import pytest

from egress_proxies_client.limits import Backoff, QuarantineBudget, SiteCooldowns

A, B = ("crawlers", "a", "id-a"), ("crawlers", "b", "id-b")


def test_backoff_doubles_per_failure_in_a_row_up_to_its_ceiling_and_starts_over_on_success() -> None:
    backoff = Backoff(5.0, 60.0)
    assert [backoff.failed(A) for _ in range(6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert backoff.failed(B) == 5.0  # per proxy
    backoff.succeeded(A)
    assert backoff.failed(A) == 5.0
    backoff.forget({B})
    assert backoff.failed(A) == 5.0 and backoff.failed(B) == 10.0


def test_backoff_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^failure_cooldown: 0"):
        Backoff(0, 10)
    with pytest.raises(ValueError, match=r"^failure_cooldown: 20"):
        Backoff(20, 10)


def test_a_site_cool_down_holds_one_pair_for_its_time() -> None:
    cooldowns = SiteCooldowns()
    cooldowns.cool(A, "shop.example", until=110.0, now=100.0)
    assert cooldowns.cooling(A, "shop.example", 109.9)
    assert not cooldowns.cooling(A, "news.example", 105.0) and not cooldowns.cooling(B, "shop.example", 105.0)
    assert not cooldowns.cooling(A, "shop.example", 110.0) and len(cooldowns) == 0  # expired, forgotten


def test_site_cool_downs_are_bounded_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SiteCooldowns, "MAX_PAIRS", 10)
    cooldowns = SiteCooldowns()
    for n in range(25):
        cooldowns.cool(A, f"site-{n}.example", until=1000.0 + n, now=0.0)
    assert len(cooldowns) <= 10 and cooldowns.cooling(A, "site-24.example", 1.0)


def test_the_quarantine_budget_bounds_reports_per_window_and_the_share_of_the_pool() -> None:
    pool = {("crawlers", f"p{n}", f"id-{n}") for n in range(10)}
    first, second, third = sorted(pool)[:3]
    budget = QuarantineBudget(per_window=2, window=60.0, share=1.0)
    assert budget.take(first, pool, now=0.0).allowed and budget.take(second, pool, now=1.0).allowed
    refused = budget.take(third, pool, now=2.0)
    assert not refused.allowed and "2 quarantines in the last 60 s (max_quarantines)" in refused.why
    assert budget.take(third, pool, now=60.5).allowed  # the first one left the window
    share = QuarantineBudget(per_window=100, window=60.0, share=0.5)
    three = {A, B, ("crawlers", "c", "id-c")}
    assert share.take(A, three, now=0.0).allowed  # 1 of 3
    # A gone from discovery (quarantined): still counted in the pool while in the window.
    verdict = share.take(B, three - {A}, now=1.0)
    assert not verdict.allowed and "1 of 3 proxies already reported by this client" in verdict.why
    assert share.take(B, three - {A}, now=61.0).allowed  # the window moved on
    assert QuarantineBudget(100, 60.0, 0.5).take(A, {A}, now=0.0).allowed  # a pool of one: its one


@pytest.mark.parametrize(("arguments", "message"), [
    ((0, 60.0, 0.5), "^max_quarantines: 0"), ((1, 0.0, 0.5), "^quarantine_window: 0"),
    ((1, 60.0, 0.0), "^max_quarantine_share: 0"), ((1, 60.0, 1.5), "^max_quarantine_share: 1.5")])
def test_budget_settings_are_checked(arguments: tuple[int, float, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuarantineBudget(*arguments)
