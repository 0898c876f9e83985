"""logs.py: the JSON log format (one object per line, context fields from ``extra=``) and the
process-wide set-up. The running controller's JSON lines are checked in scenarios/test_operator_ux.py."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

import pytest

from egress_proxies.logs import JSONFormatter, configure


def record(message: str = "hello %s", args: tuple[Any, ...] = ("world",), **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("egress_proxies.sweep", logging.WARNING, __file__, 1, message, args, None)
    made.created, made.msecs = 1764979200.0, 7.9
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def formatted(made: logging.LogRecord) -> dict[str, Any]:
    line = JSONFormatter().format(made)
    assert "\n" not in line
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def test_a_line_is_one_object_with_time_level_logger_and_message() -> None:
    assert formatted(record()) == {"time": "2025-12-06T00:00:00.007Z", "level": "WARNING",
                                   "logger": "egress_proxies.sweep", "message": "hello world"}


def test_proxy_and_provider_from_extra_become_string_fields() -> None:
    entry = formatted(record(proxy="crawlers/eu-1", provider=7))
    assert (entry["proxy"], entry["provider"]) == ("crawlers/eu-1", "7")


def test_a_transfer_stays_a_json_value() -> None:
    transfer = {"event": "progress", "bytes": 1024, "total_bytes": 4096, "rate_mib_s": 1.5}
    assert formatted(record(transfer=transfer))["transfer"] == transfer


def test_other_extra_attributes_are_not_fields() -> None:
    assert "secret" not in formatted(record(secret="s3cr3t"))


def test_an_exception_is_one_escaped_field() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        made = record(exc_info=sys.exc_info())
    entry = formatted(made)
    assert entry["exception"].startswith("Traceback") and "RuntimeError: boom" in entry["exception"]


def test_a_multiline_or_non_ascii_message_stays_on_one_7_bit_line() -> None:
    line = JSONFormatter().format(record("first\nsecond \u2013 \u00fc", ()))
    assert line.isascii() and "\n" not in line
    assert json.loads(line)["message"] == "first\nsecond \u2013 \u00fc"


@pytest.mark.usefixtures("root_logging")
@pytest.mark.parametrize(("log_format", "json_lines"), [("json", True), ("text", False)])
def test_configure_sets_the_root_logger_once_for_the_process(log_format: str, json_lines: bool,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    configure("INFO", log_format)
    configure("INFO", log_format)  # again: still one handler
    root = logging.getLogger()
    assert len(root.handlers) == 1 and root.level == logging.INFO
    logging.getLogger("egress_proxies.test").info("sweep done", extra={"proxy": "crawlers/eu-1"})
    logging.getLogger("egress_proxies.test").debug("not shown")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    if json_lines:
        assert json.loads(lines[0])["proxy"] == "crawlers/eu-1"
    else:
        assert re.fullmatch(r"\S+ \S+ INFO egress_proxies\.test: sweep done", lines[0])
