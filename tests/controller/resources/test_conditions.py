"""resources/conditions.py: one way to build, find and merge conditions (Proxies and pools)."""

from __future__ import annotations

from egress_proxies.resources.conditions import MAX_CONDITION_MESSAGE, condition, find_condition, merge_conditions

OLD = "2026-01-01T00:00:00Z"
NOW = "2026-12-06T00:00:00Z"


def test_a_condition_has_the_api_shape_and_a_bounded_message() -> None:
    made = condition("Ready", "True", "Serving", "m", OLD, 3)
    assert made == {"type": "Ready", "status": "True", "reason": "Serving", "message": "m",
                    "lastTransitionTime": OLD, "observedGeneration": 3}
    long = condition("Ready", "False", "X", "x" * (MAX_CONDITION_MESSAGE + 10), OLD, 1)
    assert len(long["message"]) == MAX_CONDITION_MESSAGE and long["message"].endswith(" [truncated]")


def test_find_condition() -> None:
    status = {"conditions": ["junk", {"type": "Serving", "status": "True"}]}
    assert find_condition(status, "Serving") == {"type": "Serving", "status": "True"}
    assert find_condition(status, "Ready") == {}
    assert find_condition({}, "Ready") == {}


def test_merge_keeps_a_transition_time_while_the_status_stays() -> None:
    previous = [condition("Ready", "True", "Serving", "old message", OLD, 1),
                condition("Serving", "True", "Serving", "m", OLD, 1),
                condition("Private", "True", "CredentialsRequired", "m", OLD, 1),
                condition("ProviderListed", "False", "ListFailed", "m", OLD, 1)]
    merged = merge_conditions(previous, {"Ready": ("True", "Serving", "new message"),
                                         "Serving": ("False", "Timeout", "no answer"),
                                         "ProviderListed": None}, NOW, 2)
    by_type = {c["type"]: c for c in merged}
    # Same status: the transition time stays, reason and message follow.
    assert (by_type["Ready"]["lastTransitionTime"], by_type["Ready"]["message"]) == (OLD, "new message")
    # Another status: it moves.
    assert by_type["Serving"]["lastTransitionTime"] == NOW
    # None removes one; one not named stays as it was.
    assert "ProviderListed" not in by_type
    assert by_type["Private"] == previous[2]
    assert [c["type"] for c in merged] == ["Ready", "Serving", "Private"]


def test_merge_starts_from_nothing() -> None:
    merged = merge_conditions(None, {"Available": ("False", "MinimumReplicasUnavailable", "0 of 3")}, NOW, 1)
    assert merged == [condition("Available", "False", "MinimumReplicasUnavailable", "0 of 3", NOW, 1)]
