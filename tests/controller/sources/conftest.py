"""Fixtures shared by the sources' tests."""

from __future__ import annotations

import time

import pytest

from egress_proxies.sources import file_cache


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file looks older than file_cache's racy window when it is read, so every parse may be
    used again at once: what a later read sees of a change comes from the file's stamp alone."""
    monkeypatch.setattr(file_cache, "time_ns", lambda: time.time_ns() + 10 * file_cache.SETTLED_NS)
