"""sweep/flapping.py: the pure "chronic flapper" decision, as a table of recent probe verdicts
(``+`` passed, ``-`` failed, oldest first) and what each must give."""

from __future__ import annotations

import pytest

from egress_proxies.sweep.flapping import CHRONIC_SPELLS, chronic, spells


def verdicts(text: str) -> tuple[bool, ...]:
    return tuple(c == "+" for c in text.replace(" ", ""))


@pytest.mark.parametrize(("recent", "window", "percent", "expected"), [
    # fails half its probes for ever: the complaint ("reported alive, does not serve")
    ("+-+-+-+-+-", 10, 25, "failed 5 of its last 10 probes in 5 separate spells"),
    ("++-++-++-+", 10, 25, "failed 3 of its last 10 probes in 3 separate spells"),
    # flaps once, however long: one spell, followed, not replaced (the failure clock judges it)
    ("++++------", 10, 25, None),
    ("+++++-++++", 10, 25, None),
    # twice is not yet chronic
    ("++--+++--+", 10, 25, None),
    # three spells but below the share
    ("+-++++-++-+++++++++-", 20, 25, None),
    ("+-++++-++-+++++-+++-", 20, 25, "failed 5 of its last 20 probes in 5 separate spells"),
    # the window not full yet (a new instance): never chronic
    ("+-+-+-+-+", 10, 25, None),
    # only the last `window` count: an old bad spell has aged out
    ("-+-+-+-+" + "+" * 10, 10, 25, None),
    ("+" * 10 + "-+-+-+-+-+", 10, 25, "failed 5 of its last 10 probes in 5 separate spells"),
    # a window of nothing is no decision
    ("+-+-+-", 0, 25, None),
    # exactly the share counts
    ("-+++-+++-+++", 12, 25, "failed 3 of its last 12 probes in 3 separate spells"),
    ("-+++-+++-++++", 13, 25, None),
])
def test_chronic(recent: str, window: int, percent: int, expected: str | None) -> None:
    found = chronic(verdicts(recent), window, percent)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected), found
        assert f"at least {percent} % of {window} probes" in found


@pytest.mark.parametrize(("recent", "expected"), [("", 0), ("+++", 0), ("-", 1), ("--+--", 2), ("-+-+-", 3),
                                                  ("+--+-+", 2)])
def test_spells(recent: str, expected: int) -> None:
    assert spells(verdicts(recent)) == expected


def test_the_spell_count_is_three() -> None:
    assert CHRONIC_SPELLS == 3  # docs/contract.md says so
