"""resources/times.py: the one way stamps are written and read."""

from __future__ import annotations

import datetime

import pytest

from egress_proxies.resources import times

MOMENT = datetime.datetime(2026, 12, 6, 1, 9, 2, 750000, tzinfo=datetime.UTC)


def test_a_stamp_is_rfc3339_utc_in_whole_seconds() -> None:
    assert times.stamp(MOMENT) == "2026-12-06T01:09:02Z"
    assert times.stamp(MOMENT.timestamp()) == "2026-12-06T01:09:02Z"
    # Another zone's moment is written in UTC.
    assert times.stamp(MOMENT.astimezone(datetime.timezone(datetime.timedelta(hours=2)))) == "2026-12-06T01:09:02Z"
    parsed = times.parse(times.stamp())
    assert parsed is not None and abs((times.now() - parsed).total_seconds()) < 5


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-06T01:09:02Z", datetime.datetime(2026, 12, 6, 1, 9, 2, tzinfo=datetime.UTC)),
    ("2026-12-06T03:09:02+02:00", datetime.datetime(2026, 12, 6, 1, 9, 2, tzinfo=datetime.UTC)),
    ("2026-12-06T01:09:02.5Z", datetime.datetime(2026, 12, 6, 1, 9, 2, 500000, tzinfo=datetime.UTC)),
    ("2026-12-06T01:09:02", datetime.datetime(2026, 12, 6, 1, 9, 2, tzinfo=datetime.UTC)),  # no zone: UTC
    ("", None), (None, None), (42, None), ("yesterday", None), ("2026-13-01T00:00:00Z", None),
])
def test_parse_reads_what_the_api_writes_and_nothing_else(text: object, expected: datetime.datetime | None) -> None:
    assert times.parse(text) == expected


def test_seconds_since_and_epoch_seconds() -> None:
    later = MOMENT + datetime.timedelta(seconds=90)
    assert times.seconds_since("2026-12-06T01:09:02Z", later) == pytest.approx(90.75)
    assert times.seconds_since("garbage", later) is None
    assert times.epoch_seconds("1970-01-01T00:01:00Z") == 60.0
    assert times.epoch_seconds(None) is None
