"""Fixtures shared by the controller's tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Restores the root logger after a test that sets it up for the process (``logs.configure``,
    which ``cli.parse_args`` calls), so pytest's own log capture works again for the next test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
