"""A private ``libvirtd`` serving libvirt's test driver.

Every Ansible module run is a new process, so an in-process ``test:///default`` connection would
start from scratch each time. Instead one ``libvirtd`` holds the test driver's state and every
process (pytest, ansible, a ``python -c``) reaches it at ``test+unix:///default?socket=...``.

The daemon runs in its own mount namespace with a tmpfs on ``/run`` and private, empty copies of
libvirt's state directories bound over the real ones, so it can never touch the host's
``/run/libvirt``, autostart the host's networks or leave state behind. The private mounts are
also used by ``hypervisor_host`` for the same reasons.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import libvirt

from support.process import DaemonStartError, log_tail, stop_process_group, unix_socket_accepts
from support.waiting import wait_for

# libvirt's state lives under these; each daemon gets its own empty copy of each.
LIBVIRT_STATE_DIRS = (
    "/etc/libvirt",
    "/var/lib/libvirt",
    "/var/cache/libvirt",
    "/var/log/libvirt",
)


def private_mounts_script(root: Path) -> str:
    """Shell lines, run inside a fresh mount namespace, that hide the host's libvirt state.

    ``/run`` becomes a tmpfs (sockets and pid files vanish with the namespace) and each of
    LIBVIRT_STATE_DIRS is replaced by ``root/<dir>``, which this function creates empty.
    """
    lines = ["set -e", "mount -t tmpfs -o mode=0755 tmpfs /run"]
    for state_dir in LIBVIRT_STATE_DIRS:
        private = private_state_dir(root, state_dir)
        private.mkdir(parents=True, exist_ok=True)
        # A mount point must exist; on a fresh machine the libvirt packages made these.
        lines.append(f"mkdir -p {shlex.quote(state_dir)}")
        lines.append(
            f"mount --bind {shlex.quote(str(private))} {shlex.quote(state_dir)}"
        )
    return "\n".join(lines)


def private_state_dir(root: Path, state_dir: str) -> Path:
    """Where private_mounts_script keeps the private copy of ``state_dir``."""
    return root / state_dir.strip("/").replace("/", "-")


class LibvirtTestDaemon:
    """``libvirtd`` serving the test driver on a private socket; use as a context manager.

    The held :attr:`connection` keeps the test driver's state alive between the short-lived
    connections of other processes (the driver frees it when its last connection closes).
    """

    def __init__(self, start_timeout: float = 20.0) -> None:
        self.start_timeout = start_timeout
        self.startup_seconds = 0.0
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: libvirt.virConnect | None = None
        self._baseline_pools: set[str] = set()
        self._baseline_networks: set[str] = set()

    @property
    def root(self) -> Path:
        """The daemon's private temporary directory."""
        if self._root is None:
            raise RuntimeError("LibvirtTestDaemon is not started")
        return self._root

    @property
    def socket_path(self) -> Path:
        return self.root / "sock" / "libvirt-sock"

    @property
    def uri(self) -> str:
        """What a module or any other process passes to libvirt.open()."""
        return f"test+unix:///default?socket={self.socket_path}"

    @property
    def connection(self) -> libvirt.virConnect:
        """The connection held for the daemon's lifetime."""
        if self._connection is None:
            raise RuntimeError("LibvirtTestDaemon is not started")
        return self._connection

    def _logs(self) -> list[Path]:
        return [self.root / "libvirtd.log", self.root / "libvirtd.out"]

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="libvirt-test-daemon-"))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        (self.root / "sock").mkdir()
        config = self.root / "libvirtd.conf"
        config.write_text(
            f'unix_sock_dir = "{self.root / "sock"}"\n'
            'auth_unix_rw = "none"\n'
            'auth_unix_ro = "none"\n'
            'unix_sock_rw_perms = "0700"\n'
            # Warnings and errors only: the tail is what a start-up failure shows.
            f'log_outputs = "3:file:{self.root / "libvirtd.log"}"\n'
        )
        script = "\n".join(
            [
                private_mounts_script(self.root / "state"),
                shlex.join(
                    [
                        "exec",
                        "libvirtd",
                        "--config",
                        str(config),
                        "--pid-file",
                        str(self.root / "libvirtd.pid"),
                    ]
                ),
            ]
        )
        started = time.monotonic()
        with open(self.root / "libvirtd.out", "wb") as out:
            self._process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: unix_socket_accepts(str(self.socket_path)), self.start_timeout, "libvirtd (test driver)",
                 diagnostics=lambda: log_tail(self._logs()), process=self._process, error=DaemonStartError)
        self._connection = libvirt.open(self.uri)
        self.startup_seconds = time.monotonic() - started
        self._baseline_pools = {
            pool.name() for pool in self._connection.listAllStoragePools()
        }
        self._baseline_networks = {
            net.name() for net in self._connection.listAllNetworks()
        }

    def reset(self) -> None:
        """Bring the test driver back to its initial state between tests.

        Removes every domain but the built-in ``test`` one, every volume, and every pool and
        network a test added; the built-in ones are kept and made active again.
        """
        conn = self.connection
        for domain in conn.listAllDomains():
            if domain.name() == "test":
                continue
            if domain.isActive():
                domain.destroy()
            if domain.isPersistent():
                domain.undefineFlags(
                    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                )
        for pool in conn.listAllStoragePools():
            if pool.name() in self._baseline_pools:
                if not pool.isActive():
                    pool.create()
                for volume in pool.listAllVolumes():
                    volume.delete()
                continue
            if pool.isActive():
                for volume in pool.listAllVolumes():
                    volume.delete()
                pool.destroy()
            if pool.isPersistent():
                pool.undefine()
        for network in conn.listAllNetworks():
            if network.name() in self._baseline_networks:
                if not network.isActive():
                    network.create()
                continue
            if network.isActive():
                network.destroy()
            if network.isPersistent():
                network.undefine()

    def stop(self) -> None:
        """Close the held connection, kill the daemon and remove its files; safe to repeat."""
        if self._connection is not None:
            try:
                self._connection.close()
            except libvirt.libvirtError:
                pass  # the daemon may already be gone; it is about to be killed anyway
            self._connection = None
        if self._process is not None:
            stop_process_group(self._process)
            self._process = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
