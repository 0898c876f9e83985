"""One way for a passing test to put measured figures in the run's output, without ``-s``."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable

import pytest


def show(config: pytest.Config, heading: str, lines: Iterable[str]) -> None:
    """Write ``heading`` and the indented ``lines`` to the terminal, past pytest's capture.

    Capture is suspended rather than bypassed: the default fd-level capture swallows even
    ``sys.__stderr__`` (file descriptor 2 itself is redirected), so figures written there never
    reached CI's log."""
    text = f"\n{heading}\n" + "".join(f"  {line}\n" for line in lines)
    capture = config.pluginmanager.get_plugin("capturemanager")
    suspended = capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext()
    with suspended:
        sys.stdout.write(text)
        sys.stdout.flush()
