"""One way for a test to wait for a condition: poll it, fail with what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], seconds: float, what: str, interval: float = 0.05,
             diagnostics: Callable[[], str] | None = None) -> None:
    """Poll ``condition`` until it holds; after ``seconds``, fail naming ``what`` (and, given
    ``diagnostics``, what it says, e.g. the tail of a process's log)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            detail = f"\n{diagnostics()}" if diagnostics is not None else ""
            raise AssertionError(f"timed out after {seconds} s waiting for {what}{detail}")
        time.sleep(interval)
