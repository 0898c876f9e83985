"""sources/store.py: retry_on_conflict, the one way every write through a source is optimistic."""

from __future__ import annotations

import pytest

from egress_proxies.sources.store import CONFLICT_RETRIES, Conflict, Gone, StoreError, retry_on_conflict


def test_a_conflict_rereads_and_applies_the_change_to_what_is_stored_now() -> None:
    attempts: list[int] = []

    def write(version: int) -> str:
        attempts.append(version)
        if version < 3:
            raise Conflict("stale")
        return f"written on version {version}"

    assert retry_on_conflict(1, write, lambda version: version + 1, "thing") == "written on version 3"
    assert attempts == [1, 2, 3]


def test_it_gives_up_after_the_retries_naming_what_kept_conflicting() -> None:
    calls: list[int] = []

    def write(version: int) -> None:
        calls.append(version)
        raise Conflict("stale")

    with pytest.raises(StoreError, match=r"Proxy crawlers/eu-1: status update kept conflicting \(5 times\)"):
        retry_on_conflict(0, write, lambda version: version + 1, "Proxy crawlers/eu-1: status update")
    assert len(calls) == CONFLICT_RETRIES
    assert not isinstance(StoreError("x"), Conflict)


def test_other_errors_are_not_retried() -> None:
    def write(_: int) -> None:
        raise Gone("deleted meanwhile")

    def reread(_: int) -> int:
        raise AssertionError("a Gone must not be retried")

    with pytest.raises(Gone):
        retry_on_conflict(0, write, reread, "thing")
