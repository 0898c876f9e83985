"""Is an instance a chronic flapper? The pure decision ``live.LivePath`` replaces it by.

A proxy that fails a share of its probes for ever never goes ``unhealthyAfterSeconds`` without a
success, so the failure clock never replaces it, while discovery follows it in and out and
crawlers see it fail one request in a few, for ever. ``chronic`` reads the instance's recent
probe verdicts (``monitor.ProbeRecord.recent``: the last ``flapWindow`` verdicts that said
anything of the proxy, oldest first) and says why it is chronic, or None. It reads nothing but
its arguments; the table in tests/controller/sweep/test_flapping.py pins it.
"""

from __future__ import annotations

from collections.abc import Sequence

# A single outage, however long, is one spell of failures (the failure clock judges it); a proxy
# that fails again after it recovered, and again, flaps. Below this many spells it is followed.
CHRONIC_SPELLS = 3


def spells(recent: Sequence[bool]) -> int:
    """How many separate runs of failed probes ``recent`` holds (True: the probe passed)."""
    return sum(1 for i, passed in enumerate(recent) if not passed and (i == 0 or recent[i - 1]))


def chronic(recent: Sequence[bool], window: int, percent: int) -> str | None:
    """Why the instance is a chronic flapper (None: it is not): a full window of ``window``
    verdicts, at least ``percent`` % of them failed, in at least ``CHRONIC_SPELLS`` spells. A new
    instance (window not yet full) and one that failed once are not."""
    if window <= 0 or len(recent) < window:
        return None
    last = list(recent)[-window:]
    failed = last.count(False)
    runs = spells(last)
    if failed * 100 < percent * window or runs < CHRONIC_SPELLS:
        return None
    return (f"failed {failed} of its last {window} probes in {runs} separate spells (chronic: at least "
            f"{percent} % of {window} probes, in {CHRONIC_SPELLS} spells or more)")
