"""The controller's log formats: ``text`` (the default, for a terminal) and ``json`` (one object
per line, for a log pipeline: Loki, Elasticsearch, Cloud Logging parse it without a regex).

A log call about one Proxy or one provider passes them as ``extra={"proxy": "ns/name",
"provider": "name"}``; the JSON format turns them into fields, so an operator can select every
line about one Proxy (or one provider) without parsing the message. The text format keeps the
message as it is (it already names them).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes a log call may set with extra= that become fields of the JSON object.
CONTEXT_FIELDS = ("proxy", "provider")
# Such attributes that stay JSON values (numbers, objects) instead of strings: a base image
# transfer's event, image, host, bytes, total_bytes, seconds and rate_mib_s (transfers.py).
VALUE_FIELDS = ("transfer",)


class JSONFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"[, "proxy"][, "provider"][, "transfer"][, "exception"]}``, one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            # RFC 3339 in UTC with milliseconds: sortable, and what log stores parse by default.
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = str(value)
        for name in VALUE_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        # ensure_ascii keeps every line 7-bit clean; a message's newlines stay escaped inside the string.
        return json.dumps(entry, ensure_ascii=True)


def configure(level: str, log_format: str) -> None:
    """Set up the root logger once, for the whole process (ansible-runner's own logging included)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
