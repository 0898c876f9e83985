"""Base image transfers in the controller's log while a KVM create run is still going.

A KVM create may first download a base image (hundreds of MiB) and upload it to a host, which
takes minutes; the module's result only arrives at the end, and its own log lines go to the
syslog of the machine running it. So ``kvm_proxy`` appends one JSON object per transfer event
to its ``progress_path`` (docs/contract.md, "Image transfer progress"), and ``ProgressTail``
follows that file from a thread while the runner runs, logging each event with its provider:

    provider lab: base image debian-12: downloading https://images.example/debian-12.qcow2 (312.5 MiB)
    provider lab: base image debian-12: downloaded 64.0 of 312.5 MiB (20%), 21.3 MiB/s
    provider lab: base image debian-12: downloaded and verified 312.5 MiB in 14.2 s (22.0 MiB/s)

The module runs on this machine (local connection), so the file is simply shared. With
``--log-format json`` each line carries ``provider`` and a ``transfer`` object (the event's
numbers and the rate). URLs are redacted here again: the module strips userinfo and query
already, and a secret must not reach the log even from a module that did not.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# How often the files are looked at: a transfer event is at most this late in the log.
POLL_SECONDS = 0.5
# A longer "line" is not one of the module's events (those are a few hundred bytes): dropped.
MAX_LINE = 64 * 1024
# The event vocabulary kvm_proxy writes (plugins/module_utils/kvm/images.py defines the same:
# the controller is installed without the collection; tests/contract holds the two together).
KINDS = ("start", "progress", "done", "failed", "waiting")
DIRECTIONS = ("download", "upload")
# What the module puts in place of a URL's userinfo and query.
REDACTED = "<redacted>"


# kvm_proxy redacts URLs before it writes an event (images.redact_url, the one place that knows
# how). The controller only refuses to log one that still carries userinfo, a query or a
# fragment -- a module of another version, or a bug -- instead of redacting a second way.
WITHHELD_URL = "<URL withheld: it carries credentials or a query>"


def loggable_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return WITHHELD_URL
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo not in ("", REDACTED) or parts.query not in ("", REDACTED) or parts.fragment:
        return WITHHELD_URL
    return url


def _mib(count: float) -> str:
    return f"{count / MIB:.1f} MiB"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def describe(provider: str, event: Mapping[str, Any]) -> tuple[int, str, dict[str, Any]] | None:
    """The log level, message and ``transfer`` field of one event, or None when it is not one."""
    kind, direction, image = event.get("kind"), event.get("direction"), event.get("image")
    done, seconds = _number(event.get("bytes")), _number(event.get("seconds"))
    if kind not in KINDS or direction not in DIRECTIONS or not isinstance(image, str) or not image:
        return None
    if done is None or seconds is None:
        return None
    total = _number(event.get("total"))
    host = event.get("host") if isinstance(event.get("host"), str) else None
    url = loggable_url(event["url"]) if isinstance(event.get("url"), str) else None
    # A rate over the first milliseconds says nothing; a start has none at all.
    rate = done / MIB / seconds if seconds >= 0.05 and kind != "start" else None
    rate_text = f"{rate:.1f} MiB/s" if rate is not None else "rate n/a"
    to_host = f" to host {host}" if host else ""
    amount = f"{done / MIB:.1f} of {_mib(total)}" if total is not None else _mib(done)
    share = f" ({100 * done / total:.0f}%)" if total else ""
    level = logging.INFO
    if kind == "start":
        size = _mib(total) if total is not None else "size unknown"
        what = f"downloading {url or '(no URL)'}" if direction == "download" else f"uploading{to_host}"
        message = f"{what} ({size})"
    elif kind == "progress":
        message = f"{direction}ed {amount}{to_host}{share}, {rate_text}"
    elif kind == "done":
        verified = " and verified" if direction == "download" else ""
        message = f"{direction}ed{verified} {_mib(done)}{to_host} in {seconds:.1f} s ({rate_text})"
    elif kind == "failed":
        level = logging.WARNING
        message = f"{direction}{to_host} failed after {seconds:.1f} s ({amount} done; the run's result says why)"
    else:
        message = f"waiting for another run's {direction}{to_host} of this image"
    transfer = {"event": kind, "direction": direction, "image": image, "host": host, "bytes": int(done),
                "total_bytes": int(total) if total is not None else None, "seconds": round(seconds, 3),
                "rate_mib_s": round(rate, 2) if rate is not None else None}
    if url is not None:
        transfer["url"] = url
    return level, f"provider {provider}: base image {image}: {message}", transfer


class ProgressTail:
    """Follows ``paths`` (files a module appends JSON lines to) from a thread and logs each event.

    Use as a context manager around the run: leaving it stops the thread and reads what is
    left, so the last events (``done``) are logged before the run's own summary line. Lines
    are read whole (a partial last line waits for its newline); anything that is not an event
    is skipped with a DEBUG line. Never raises: the log is a side channel of the run.
    """

    def __init__(self, paths: Sequence[Path], provider: str, poll_seconds: float = POLL_SECONDS) -> None:
        self.paths = list(paths)
        self.provider = provider
        self.poll_seconds = poll_seconds
        self.events = 0
        self._offsets = dict.fromkeys(self.paths, 0)
        self._partial = dict.fromkeys(self.paths, b"")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"progress-{provider}", daemon=True)

    def __enter__(self) -> ProgressTail:
        if self.paths:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.paths:
            self._stop.set()
            self._thread.join()
            self.poll()  # what was written between the thread's last look and the run's end

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.poll()

    def poll(self) -> None:
        """Log every whole line added to the files since the last call."""
        for path in self.paths:
            try:
                with path.open("rb") as handle:
                    handle.seek(self._offsets[path])
                    data = handle.read()
            except OSError:
                continue  # not written yet (or already removed): nothing to log
            self._offsets[path] += len(data)
            lines = (self._partial[path] + data).split(b"\n")
            self._partial[path] = lines.pop()
            if len(self._partial[path]) > MAX_LINE:
                log.debug("%s: dropped an over-long progress line", path.name)
                self._partial[path] = b""
            for line in lines:
                self._log_line(path, line)

    def _log_line(self, path: Path, line: bytes) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line) if len(line) <= MAX_LINE else None
        except ValueError:
            event = None
        described = describe(self.provider, event) if isinstance(event, dict) else None
        if described is None:
            log.debug("%s: skipped a progress line that is not a transfer event", path.name)
            return
        level, message, transfer = described
        self.events += 1
        log.log(level, "%s", message, extra={"provider": self.provider, "transfer": transfer})
