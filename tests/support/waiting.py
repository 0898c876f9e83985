"""The one way for a test to wait for a condition: poll it, fail with what it waited for.

``wait_for`` fails the test (``AssertionError``) or a helper's start-up (``error``, e.g.
``DaemonStartError``), at once when the ``process`` it waits on has exited. ``poll`` is the same
loop for a caller that goes on either way (SIGKILL what SIGTERM did not end).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def poll(condition: Callable[[], object], seconds: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def wait_for(condition: Callable[[], T], seconds: float, what: str, interval: float = 0.05,
             diagnostics: Callable[[], str] | None = None, *, process: subprocess.Popen[Any] | None = None,
             error: type[Exception] = AssertionError) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    After ``seconds``, or as soon as ``process`` (the one that should make it true) has exited,
    raise ``error`` naming ``what`` and, given ``diagnostics``, what it says (e.g. the tail of a
    process's log).
    """
    held: list[T] = []

    def holds() -> bool:
        if value := condition():
            held.append(value)
            return True
        if process is not None and process.poll() is not None:
            raise error(f"{what}: the process exited with {process.returncode}{detail()}")
        return False

    def detail() -> str:
        return f"\n{diagnostics()}" if diagnostics is not None else ""

    if not poll(holds, seconds, interval):
        raise error(f"timed out after {seconds:.0f} s waiting for {what}{detail()}")
    return held[0]
