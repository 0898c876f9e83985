"""Fixtures of the scenarios that need two KVM hosts (two providers, or a provider and a spare)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.hosts.libvirt_daemon import LibvirtTestDaemon


@pytest.fixture(scope="module")
def second_daemon() -> Iterator[LibvirtTestDaemon]:
    """A second KVM host (the session's test-driver daemon is the first)."""
    with LibvirtTestDaemon() as daemon:
        yield daemon


@pytest.fixture
def hosts(libvirt_test: LibvirtTestDaemon, second_daemon: LibvirtTestDaemon) -> tuple[LibvirtTestDaemon,
                                                                                        LibvirtTestDaemon]:
    second_daemon.reset()
    return libvirt_test, second_daemon
