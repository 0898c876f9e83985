"""Timestamps as the Kubernetes API writes them (metav1.Time: RFC 3339, UTC, whole seconds, e.g.
``2026-12-06T01:09:02Z``): condition transitions, ``status.readySince``, a pool's placement
clocks, the directory source's ``creationTimestamp``. Every such stamp is written and read here.
"""

from __future__ import annotations

import datetime
import functools
import time

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now() -> datetime.datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.datetime.now(datetime.UTC)


def stamp(moment: datetime.datetime | float | None = None) -> str:
    """``moment`` (a datetime, or seconds since the epoch; None: now) as the API writes it."""
    if moment is None:
        return _stamp_of_second(int(time.time()))
    if not isinstance(moment, datetime.datetime):
        moment = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime(STAMP_FORMAT)


@functools.lru_cache(maxsize=4)
def _stamp_of_second(second: int) -> str:
    """Now's stamp, formatted once per second: a sweep asks for it twice per Proxy it looks at."""
    return datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(STAMP_FORMAT)


def parse(text: object) -> datetime.datetime | None:
    """An RFC 3339 stamp (``Z`` or an offset, fractions allowed) as an aware datetime; None when
    ``text`` is not one (a missing field, a hand-edited status)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def epoch_seconds(text: object) -> float | None:
    """``parse`` as seconds since the epoch (what the pool decisions compute with)."""
    parsed = parse(text)
    return None if parsed is None else parsed.timestamp()


def seconds_since(text: object, moment: datetime.datetime | None = None) -> float | None:
    """How long ago the stamp ``text`` was, at ``moment`` (None: now); None when it is no stamp."""
    parsed = parse(text)
    return None if parsed is None else ((moment or now()) - parsed).total_seconds()
