"""sweep/containment.py: whatever goes wrong in one object's step stays with that object."""

from __future__ import annotations

import logging

import pytest

from egress_proxies.sources.store import Conflict, Gone
from egress_proxies.sweep.containment import Containment


class Record:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.crashes: list[str] = []
        self.gone = 0

    def run(self, containment: Containment, action: object, uid: str = "u1") -> None:
        def call() -> object:
            if isinstance(action, BaseException):
                raise action
            return None

        containment.run("crawlers/eu-1", uid, call, failed=self.failed.append, record_crash=self.crashes.append,
                        gone=self.count_gone)

    def count_gone(self) -> None:
        self.gone += 1


def test_a_step_that_works_records_nothing() -> None:
    record = Record()
    record.run(Containment("Proxy"), None)
    assert (record.failed, record.crashes, record.gone) == ([], [], 0)


def test_an_object_deleted_meanwhile_is_let_go() -> None:
    record = Record()
    record.run(Containment("Proxy"), Gone("crawlers/eu-1"))
    assert (record.failed, record.crashes, record.gone) == ([], [], 1)


def test_a_store_error_fails_the_object_for_this_sweep(caplog: pytest.LogCaptureFixture) -> None:
    record = Record()
    with caplog.at_level(logging.WARNING):
        record.run(Containment("Proxy"), Conflict("kept conflicting"))
    assert record.failed == ["kept conflicting"] and record.crashes == []
    assert "crawlers/eu-1: kept conflicting" in caplog.text


def test_a_bug_is_recorded_on_the_object_and_its_traceback_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    containment, record = Containment("pool"), Record()
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            record.run(containment, KeyError("spec"))
    assert record.failed == ["KeyError: 'spec'"] * 3
    assert record.crashes == ["KeyError: 'spec'"] * 3
    assert caplog.text.count("Traceback") == 1
    assert caplog.text.count("unexpected error again (contained to this pool)") == 2
    # Another error on the same object is news: its traceback is logged too.
    with caplog.at_level(logging.ERROR):
        record.run(containment, ValueError("other"))
    assert caplog.text.count("Traceback") == 2


def test_a_failing_crash_record_does_not_escape(caplog: pytest.LogCaptureFixture) -> None:
    failed: list[str] = []

    def record_crash(_: str) -> None:
        raise OSError("disk full")

    def boom() -> None:
        raise RuntimeError("bug")

    with caplog.at_level(logging.ERROR):
        Containment("Proxy").run("crawlers/eu-1", "u1", boom, failed=failed.append, record_crash=record_crash)
    assert failed == ["RuntimeError: bug"]
