"""A real KVM-style hypervisor host for integration tests: libvirtd (qemu driver) behind sshd.

The host is a network namespace the test creates, reached from the root namespace over a veth
pair on a private /30 that exists only between the two veth ends (no route anywhere else). Inside
it one ``unshare``'d shell starts ``libvirtd`` in the background and then becomes ``sshd``, so both
share one mount namespace: libvirt's SSH transports run ``virt-ssh-helper`` on the far side, which
connects to ``/run/libvirt/libvirt-sock`` -- that path must be the private libvirtd's socket.

/dev/kvm is not usable on these machines, so domains defined here must use ``type='qemu'``.

Transports measured against libvirt 9.0 on Debian 12 (see :meth:`HypervisorHost.uri`):
``qemu+libssh`` and ``qemu+libssh2`` both honour ``keyfile=`` and ``known_hosts=`` and refuse a
host whose key differs from the known_hosts entry (plain ``qemu+ssh`` ignores ``known_hosts=``,
see the design notes, so it is not offered). ``qemu+libssh`` stalls on replies over 4 KiB (a
running domain's XML, a volume download) without an event loop, so the held connection and the
default URI use ``qemu+libssh2``, as the collection does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import libvirt

from .libvirt_daemon import (
    DaemonStartError,
    private_mounts_script,
    private_state_dir,
    stop_process_group,
    tcp_port_accepts,
    unix_socket_accepts,
    wait_until,
)

# Seen from our side only: the veth pair uses 10.213.<n>.0/30 and the isolated libvirt network
# inside the namespace uses 10.214.<n>.0/24, where <n> is the first free slot.
VETH_PREFIX = "10.213"
GUEST_NETWORK_PREFIX = "10.214"
SLOTS = range(1, 255)

# Software emulation as root without cgroups, namespaces, virtlogd or security labels: what
# works inside a bare network namespace on a machine without systemd.
QEMU_CONF = """\
user = "root"
group = "root"
security_driver = "none"
stdio_handler = "file"
cgroup_controllers = [ ]
namespaces = [ ]
remember_owner = 0
"""


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a set-up command; on failure raise with its stderr, the part worth reading."""
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DaemonStartError(f"{shlex.join(cmd)} failed: {result.stderr.strip()}")
    return result


def _generate_key(path: Path) -> str:
    """Make an ed25519 key pair at ``path``; return the public key's ``type base64`` part."""
    _run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "egress-proxies-test",
            "-f",
            str(path),
        ]
    )
    key_type, key_b64 = path.with_suffix(".pub").read_text().split()[:2]
    return f"{key_type} {key_b64}"


class HypervisorHost:
    """A network namespace running libvirtd and sshd; use as a context manager.

    Stopping kills every process in the namespace (libvirtd, sshd and their sessions, qemu,
    dnsmasq), deletes the namespace and the veth pair, and removes the temporary directory.
    """

    def __init__(self, start_timeout: float = 60.0) -> None:
        self.start_timeout = start_timeout
        self.startup_seconds = 0.0
        self.slot = 0
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: libvirt.virConnect | None = None
        self._wrong_known_hosts: Path | None = None

    # --- names derived from the slot --------------------------------------------------

    @property
    def namespace(self) -> str:
        return f"egp-hv{self.slot}"

    @property
    def _veth_outside(self) -> str:
        return f"egphv{self.slot}"

    @property
    def _veth_inside(self) -> str:
        return f"egphv{self.slot}p"

    @property
    def gateway(self) -> str:
        """Our (root namespace) end of the veth pair."""
        return f"{VETH_PREFIX}.{self.slot}.1"

    @property
    def address(self) -> str:
        """The host's address: sshd listens here."""
        return f"{VETH_PREFIX}.{self.slot}.2"

    @property
    def guest_network_address(self) -> str:
        """The bridge address of the isolated ``default`` network (a /24 inside the namespace)."""
        return f"{GUEST_NETWORK_PREFIX}.{self.slot}.1"

    @property
    def root(self) -> Path:
        """The host's private temporary directory."""
        if self._root is None:
            raise RuntimeError("HypervisorHost is not started")
        return self._root

    @property
    def key_file(self) -> Path:
        """The client's private key, authorised for root on the host."""
        return self.root / "ssh" / "id_ed25519"

    @property
    def known_hosts_file(self) -> Path:
        """A known_hosts file holding the host's real ed25519 key for :attr:`address`."""
        return self.root / "ssh" / "known_hosts"

    @property
    def pool_path(self) -> Path:
        """The directory behind the ``default`` storage pool."""
        return self.root / "pool"

    @property
    def connection(self) -> libvirt.virConnect:
        """A connection over SSH (``qemu+libssh2``) held for the host's lifetime."""
        if self._connection is None:
            raise RuntimeError("HypervisorHost is not started")
        return self._connection

    def uri(self, transport: str = "libssh2", known_hosts: Path | None = None) -> str:
        """The libvirt URI of this host over ``qemu+<transport>``, verifying the host key.

        ``transport`` is ``libssh2`` (what the collection connects with) or ``libssh``; ``known_hosts``
        defaults to :attr:`known_hosts_file`.
        """
        if transport not in ("libssh", "libssh2"):
            raise ValueError(f"transport must be libssh or libssh2, not {transport!r}")
        known = known_hosts or self.known_hosts_file
        return (
            f"qemu+{transport}://root@{self.address}/system"
            f"?keyfile={self.key_file}&known_hosts={known}&sshauth=privkey&no_verify=0"
        )

    def wrong_known_hosts_file(self) -> Path:
        """A known_hosts file that pins a different ed25519 key to :attr:`address`."""
        if self._wrong_known_hosts is None:
            other_key = _generate_key(self.root / "ssh" / "other_host_key")
            self._wrong_known_hosts = self.root / "ssh" / "wrong_known_hosts"
            self._wrong_known_hosts.write_text(f"{self.address} {other_key}\n")
        return self._wrong_known_hosts

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="hypervisor-host-"))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _claim_slot(self) -> None:
        """Create the namespace in the first free slot; ``ip netns add`` fails on a taken name."""
        for slot in SLOTS:
            self.slot = slot
            if Path(f"/sys/class/net/{self._veth_outside}").exists():
                continue
            add = ["ip", "netns", "add", self.namespace]
            if subprocess.run(add, check=False, capture_output=True).returncode == 0:
                return
        self.slot = 0
        raise DaemonStartError("no free slot for a hypervisor host network namespace")

    def _start(self) -> None:
        started = time.monotonic()
        self._claim_slot()
        self._create_veth_pair()
        sshd_config = self._write_ssh_files()
        mounts = private_mounts_script(self.root / "state")  # makes the private dirs
        self._write_libvirt_config()
        marker = self.root / "mounted"
        libvirtd = ["libvirtd", "--pid-file", str(self.root / "libvirtd.pid")]
        sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config)]
        script = "\n".join(
            [
                mounts,
                "mkdir -p -m 0755 /run/sshd",  # sshd's privilege separation directory
                f"touch {shlex.quote(str(marker))}",
                f"{shlex.join(libvirtd)} &",
                f"exec {shlex.join(sshd)}",
            ]
        )
        in_namespace = ["ip", "netns", "exec", self.namespace]
        private_mounts = ["unshare", "--mount", "--propagation", "private"]
        with open(self.root / "daemons.out", "wb") as out:
            self._process = subprocess.Popen(
                [*in_namespace, *private_mounts, "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        logs = [self.root / "daemons.out", self.root / "libvirtd.log"]
        remaining = self.start_timeout
        # Only once the marker exists does /proc/<pid>/root show the private /run, not the host's.
        remaining -= wait_until(
            marker.exists,
            what="namespace set-up",
            timeout=remaining,
            process=self._process,
            logs=logs,
        )
        libvirt_socket = f"/proc/{self._process.pid}/root/run/libvirt/libvirt-sock"
        remaining -= wait_until(
            lambda: unix_socket_accepts(libvirt_socket),
            what="libvirtd",
            timeout=remaining,
            process=self._process,
            logs=logs,
        )
        wait_until(
            lambda: tcp_port_accepts(self.address, 22),
            what="sshd",
            timeout=remaining,
            process=self._process,
            logs=logs,
        )
        self._connection = libvirt.open(self.uri())
        self.startup_seconds = time.monotonic() - started

    def _create_veth_pair(self) -> None:
        outside, inside, ns = self._veth_outside, self._veth_inside, self.namespace
        _run(
            ["ip", "link", "add", outside, "type", "veth", "peer", inside, "netns", ns]
        )
        _run(["ip", "addr", "add", f"{self.gateway}/30", "dev", outside])
        _run(["ip", "link", "set", outside, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.address}/30", "dev", inside])
        _run(["ip", "-n", ns, "link", "set", inside, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _write_ssh_files(self) -> Path:
        """Host and client keys, authorized_keys, known_hosts; return the sshd config."""
        ssh_dir = self.root / "ssh"
        ssh_dir.mkdir(mode=0o700)
        host_key = _generate_key(ssh_dir / "ssh_host_ed25519_key")
        client_key = _generate_key(self.key_file)
        (ssh_dir / "authorized_keys").write_text(client_key + "\n")
        self.known_hosts_file.write_text(f"{self.address} {host_key}\n")
        sshd_config = ssh_dir / "sshd_config"
        sshd_config.write_text(
            f"ListenAddress {self.address}\n"
            f"HostKey {ssh_dir / 'ssh_host_ed25519_key'}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {ssh_dir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            # The files sit under /tmp, which is world-writable: StrictModes would refuse them.
            "StrictModes no\n"
            "LogLevel VERBOSE\n"
        )
        return sshd_config

    def _write_libvirt_config(self) -> None:
        etc = private_state_dir(self.root / "state", "/etc/libvirt")
        (etc / "qemu.conf").write_text(QEMU_CONF)
        (etc / "libvirtd.conf").write_text(
            # No auth: the socket is only reachable inside this mount namespace (and via sshd).
            'auth_unix_rw = "none"\n'
            'auth_unix_ro = "none"\n'
            'unix_sock_rw_perms = "0700"\n'
            f'log_outputs = "3:file:{self.root / "libvirtd.log"}"\n'
        )

    def _namespace_pids(self) -> list[int]:
        result = subprocess.run(
            ["ip", "netns", "pids", self.namespace],
            capture_output=True,
            text=True,
            check=False,
        )
        return [int(pid) for pid in result.stdout.split()]

    def _kill_namespace_processes(self, timeout: float = 15.0) -> None:
        """SIGTERM everything in the namespace, wait for it to go, SIGKILL what is left.

        libvirt's qemu and dnsmasq leave our process group, so the namespace is what finds them.
        """
        deadline = time.monotonic() + timeout
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._namespace_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            while time.monotonic() < deadline:
                if self._process is not None:
                    self._process.poll()  # reap our own child so it leaves the list
                if not self._namespace_pids():
                    return
                time.sleep(0.1)
            deadline = time.monotonic() + 5.0

    def stop(self) -> None:
        """Kill everything, remove the namespace, veth pair and files; safe to repeat."""
        if self._connection is not None:
            try:
                self._connection.close()
            except libvirt.libvirtError:
                pass  # the host is being torn down anyway
            self._connection = None
        if self.slot:
            self._kill_namespace_processes()
        if self._process is not None:
            stop_process_group(self._process)
            self._process = None
        if self.slot:
            # Deleting one end of a veth pair deletes both; the namespace may already be gone.
            subprocess.run(
                ["ip", "link", "del", self._veth_outside],
                check=False,
                capture_output=True,
            )
            subprocess.run(
                ["ip", "netns", "del", self.namespace], check=False, capture_output=True
            )
            self.slot = 0
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

    # --- inside the host --------------------------------------------------------------

    def run_in_namespace(
        self, cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the host's network and mount namespaces (it sees the private /run)."""
        if self._process is None:
            raise RuntimeError("HypervisorHost is not started")
        return subprocess.run(
            [
                "nsenter",
                "--target",
                str(self._process.pid),
                "--mount",
                "--net",
                "--",
                *cmd,
            ],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def define_default_pool(self) -> libvirt.virStoragePool:
        """Define, build, start and autostart the ``dir`` pool ``default`` at :attr:`pool_path`."""
        pool = self.connection.storagePoolDefineXML(
            "<pool type='dir'><name>default</name>"
            f"<target><path>{self.pool_path}</path></target></pool>"
        )
        pool.build()
        pool.create()
        pool.setAutostart(1)
        return pool

    def define_isolated_network(self) -> libvirt.virNetwork:
        """Define and start the network ``default``: no <forward>, DHCP on, DNS off."""
        base = f"{GUEST_NETWORK_PREFIX}.{self.slot}"
        network = self.connection.networkDefineXML(
            "<network><name>default</name><dns enable='no'/>"
            f"<ip address='{self.guest_network_address}' netmask='255.255.255.0'>"
            f"<dhcp><range start='{base}.10' end='{base}.250'/></dhcp></ip></network>"
        )
        network.create()
        network.setAutostart(1)
        return network
