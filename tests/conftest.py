"""Fixtures that start real libvirt daemons (see tests/support/); they need root.

They fail instead of skipping when not root: CI runs as root, and a skipped integration test
would look like a passing one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from support.hypervisor_host import HypervisorHost
from support.libvirt_daemon import LibvirtTestDaemon


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(
            f"{what} needs root (mount and network namespaces); run the tests as root, as CI does",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def libvirt_test_daemon() -> Iterator[LibvirtTestDaemon]:
    """One libvirtd serving the test driver for the whole session; prefer ``libvirt_test``."""
    _require_root("libvirt_test_daemon")
    with LibvirtTestDaemon() as daemon:
        yield daemon


@pytest.fixture
def libvirt_test(libvirt_test_daemon: LibvirtTestDaemon) -> LibvirtTestDaemon:
    """The session's test-driver daemon, reset to its initial state for this test."""
    libvirt_test_daemon.reset()
    return libvirt_test_daemon


@pytest.fixture(scope="module")
def hypervisor_host() -> Iterator[HypervisorHost]:
    """A hypervisor host (libvirtd + sshd in a network namespace) with pool and network
    ``default`` defined, as the provider config's defaults expect."""
    _require_root("hypervisor_host")
    with HypervisorHost() as host:
        host.define_default_pool()
        host.define_isolated_network()
        yield host
