"""Fixtures shared across the suite: real libvirt daemons (they need root), the Kubernetes API
emulator with a client on it, a base image and a provider config for the test driver.

The libvirt fixtures fail instead of skipping when not root: CI runs as root, and a skipped
integration test would look like a passing one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from egress_proxies.providers.runner import RUN_TEMP_PREFIX
from support.collection.provider_config import BaseImage, kvm_host, make_base_image, write_kvm_config
from support.hosts.hypervisor_host import HypervisorHost
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd

# The config tests' shared checks assert inside this helper module: rewritten like a test's own
# asserts, a failing one shows the values it compared. Registered here, before any test module is
# imported: tests outside tests/unit (the probe target's flood test) use it too, and pytest
# collects tests/controller before tests/unit.
pytest.register_assert_rewrite("support.collection.config_documents")

# The test driver's built-in storage pool.
TEST_DRIVER_POOL = "default-pool"


def pytest_configure(config: pytest.Config) -> None:
    """Give this pytest run a temporary directory of its own (``TMPDIR`` for every process it
    starts, ``tempfile.tempdir`` for itself), so what the run-wide checks below count is this run's
    alone: another run of the suite on the same machine has its own. The name is short because
    unix sockets (libvirtd's, ssh's control sockets) live below it and their paths are capped at
    108 bytes."""
    run_temp = Path(tempfile.mkdtemp(prefix="ep-", dir=tempfile.gettempdir()))
    # mkdtemp makes it 0700: squid (cache_effective_user proxy) could not reach its own
    # directories below it and refused to start.
    run_temp.chmod(0o755)
    config.stash[_RUN_TEMP] = run_temp
    os.environ["TMPDIR"] = str(run_temp)
    tempfile.tempdir = str(run_temp)


def pytest_unconfigure(config: pytest.Config) -> None:
    run_temp = config.stash.get(_RUN_TEMP, None)
    if run_temp is not None:
        shutil.rmtree(run_temp, ignore_errors=True)


_RUN_TEMP = pytest.StashKey[Path]()


@pytest.fixture(scope="session", autouse=True)
def no_run_temp_dir_left_behind() -> Iterator[None]:
    """Whatever the tests do to runs (time them out, SIGKILL their controllers), no run's temporary
    directory outlives the session: a killed run's is for the next runner on its work dir to
    remove, and a test that kills one starts that runner. Counted in this pytest run's own
    temporary directory (``pytest_configure``), so a run beside it does not count."""
    def run_temp_dirs() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob(f"{RUN_TEMP_PREFIX}*"))

    before = run_temp_dirs()
    yield
    left = sorted(run_temp_dirs() - before)
    assert not left, f"runs' temporary directories left behind in {tempfile.gettempdir()}: {left}"


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


@pytest.fixture
def image(tmp_path: Path) -> BaseImage:
    """A small real qcow2 base image with its sha256, served from a file:// URL."""
    return make_base_image(tmp_path)


@pytest.fixture
def testdriver_config(tmp_path: Path, libvirt_test: LibvirtTestDaemon, image: BaseImage) -> Path:
    """A provider config with one KVM provider ``lab`` whose host ``h1`` is the test-driver daemon."""
    return write_kvm_config(tmp_path / "providers.yaml", [kvm_host("h1", libvirt_test.uri, pool=TEST_DRIVER_POOL)],
                            image)


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    """The Kubernetes API emulator on 127.0.0.1 (tests/support/kube/emulator.py), with the
    project's Proxy CRD (controller/manifests/crd.yaml) installed, so Proxies are served and
    validated against its schema. Only the system namespaces exist: a test creates the ones it
    uses (``kube.create_namespace``), as an operator would on a real cluster."""
    with KubeEmulator(crds=[proxy_crd()]) as emulator:
        yield emulator


@pytest.fixture
def api(kube: KubeEmulator) -> Iterator[client.ApiClient]:
    """The official client, pointed at the emulator."""
    with client.ApiClient(client.Configuration(host=kube.url)) as api_client:
        yield api_client
