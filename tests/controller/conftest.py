"""Fixtures shared by the controller's tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Restores the root logger after a test that sets it up for the process (``logs.configure``,
    which ``cli.parse_args`` calls), so pytest's own log capture works again for the next test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A provider config with one KVM provider, ``home-kvm``, and nothing else: enough for the
    sweeps that run on fakes or emulators. A test file that needs more defines its own."""
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "test-owner", "providers": [{"name": "home-kvm", "type": "kvm",
                                                                          "kvm": {}}]}))
    return path
