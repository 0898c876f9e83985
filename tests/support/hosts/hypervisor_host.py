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
see docs/kvm-provider.md, "Connecting", so it is not offered). ``qemu+libssh`` stalls on replies over 4 KiB (a
running domain's XML, a volume download) without an event loop, so the held connection and the
default URI use ``qemu+libssh2``, as the collection does.

The private mount namespace also holds a private, empty ``/root`` (root's home), so whatever
logs in over SSH -- the ``kvm_hypervisor`` role authorizing a key in ``~/.ssh/authorized_keys``,
Ansible's remote temporary files -- never touches the real machine's ``/root``. sshd accepts the
keys in ``~/.ssh/authorized_keys`` there plus the harness's own file (:attr:`HypervisorHost.key_file`
is authorized from the start; :attr:`HypervisorHost.controller_key_file` only once the role has
run). :meth:`HypervisorHost.bootstrap_inventory` is the Ansible inventory for bootstrapping the
host with ``playbooks/bootstrap_hypervisor.yml`` and :func:`bootstrap` runs that playbook.

For molecule (and by hand) the host can outlive the Python process that made it::

    cd tests && python -m support.hosts.hypervisor_host up --state FILE [--inventory FILE]
    cd tests && python -m support.hosts.hypervisor_host restart-libvirtd --state FILE
    cd tests && python -m support.hosts.hypervisor_host down --state FILE

``up`` leaves the daemons running and writes what ``down`` needs to the state file; ``down``
kills every process in the namespace, removes namespace, veth pair and files, and marks the
state file stopped (a missing or stopped state file is nothing to do); ``restart-libvirtd``
restarts libvirtd (what an operator does after the role installs a hook on a host whose libvirtd
the role does not manage).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import libvirt

from support import REPO
from support.hosts.libvirt_daemon import private_mounts_script, private_state_dir
from support.process import (
    DaemonStartError,
    kill_namespace_processes,
    log_tail,
    namespace_pids,
    run_checked,
    stop_process_group,
    tcp_port_accepts,
    unix_socket_accepts,
)
from support.waiting import wait_for

# Seen from our side only: the veth pair uses 10.213.<n>.0/30 and the isolated libvirt network
# inside the namespace uses 10.214.<n>.0/24, where <n> is the first free slot.
VETH_PREFIX = "10.213"
GUEST_NETWORK_PREFIX = "10.214"
# Additional addresses of the host (on its end of the veth pair, /32 each, routed nowhere): the
# source addresses a publishing nat network gives its guests.
SOURCE_ADDRESS_PREFIX = "10.218"
SLOTS = range(1, 255)
# The host ports a publishing nat network publishes proxies on.
PUBLISH_PORTS = "40000-40009"

BOOTSTRAP_PLAYBOOK = REPO / "playbooks" / "bootstrap_hypervisor.yml"
# The name the bootstrap inventory gives the host, in the group the playbook targets by default.
INVENTORY_HOST = "hypervisor"
INVENTORY_GROUP = "kvm_hypervisors"

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


def _generate_key(path: Path) -> str:
    """Make an ed25519 key pair at ``path``; return the public key's ``type base64`` part."""
    run_checked(
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
        # The namespace's first process (sshd); also set when attached to a host another
        # process started (see attach()), where there is no Popen to hold.
        self._pid = 0
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
    def ssh_dir(self) -> Path:
        """Where sshd's host key (``ssh_host_ed25519_key[.pub]``) and the client keys live."""
        return self.root / "ssh"

    @property
    def controller_key_file(self) -> Path:
        """A second client key that the harness does *not* authorize: the bootstrap role does."""
        return self.ssh_dir / "controller_id_ed25519"

    @property
    def home(self) -> Path:
        """What the host's processes see as ``/root`` (root's home, bound over it)."""
        return self.root / "home"

    @property
    def bootstrap_known_hosts_file(self) -> Path:
        """Where the bootstrap inventory has the role write the host's known_hosts lines.

        Its directory does not exist until the role makes it.
        """
        return self.root / "controller" / "known_hosts"

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

    def uri(self, transport: str = "libssh2", known_hosts: Path | None = None, key_file: Path | None = None) -> str:
        """The libvirt URI of this host over ``qemu+<transport>``, verifying the host key.

        ``transport`` is ``libssh2`` (what the collection connects with) or ``libssh``; ``known_hosts``
        defaults to :attr:`known_hosts_file`, ``key_file`` to :attr:`key_file`.
        """
        if transport not in ("libssh", "libssh2"):
            raise ValueError(f"transport must be libssh or libssh2, not {transport!r}")
        known = known_hosts or self.known_hosts_file
        key = key_file or self.key_file
        return (
            f"qemu+{transport}://root@{self.address}/system"
            f"?keyfile={key}&known_hosts={known}&sshauth=privkey&no_verify=0"
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
        self.home.mkdir(mode=0o700)
        marker = self.root / "mounted"
        libvirtd = ["libvirtd", "--pid-file", str(self.root / "libvirtd.pid")]
        sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config)]
        script = "\n".join(
            [
                mounts,
                # Root's home: what logs in over SSH may write ~/.ssh, ~/.ansible and so on.
                f"mount --bind {shlex.quote(str(self.home))} /root",
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
        self._pid = self._process.pid
        logs = [self.root / "daemons.out", self.root / "libvirtd.log"]
        deadline = time.monotonic() + self.start_timeout

        def wait(ready: Callable[[], bool], what: str) -> None:
            wait_for(ready, max(0.0, deadline - time.monotonic()), what, diagnostics=lambda: log_tail(logs),
                     process=self._process, error=DaemonStartError)
        # Only once the marker exists does /proc/<pid>/root show the private /run, not the host's.
        wait(marker.exists, "namespace set-up")
        libvirt_socket = f"/proc/{self._process.pid}/root/run/libvirt/libvirt-sock"
        wait(lambda: unix_socket_accepts(libvirt_socket), "libvirtd")
        wait(lambda: tcp_port_accepts(self.address, 22), "sshd")
        self._connection = libvirt.open(self.uri())
        self.startup_seconds = time.monotonic() - started

    def restart_libvirtd(self) -> None:
        """Stop libvirtd and start it again in the host's namespaces, as an operator restarts it
        after installing a hook script (libvirtd looks for hooks when it starts only); reopens
        :attr:`connection`. Running domains keep running (libvirtd reconnects to them)."""
        self._cycle_libvirtd(lambda: None)

    def reboot(self) -> None:
        """What a reboot of the host does to libvirt and its guests: every guest's qemu process
        dies at once (the power goes), and libvirtd starts again on an empty state directory
        (``/run`` is a tmpfs: the domains' live status and libvirt's "autostarted" mark are gone),
        so it starts the domains marked autostart, as at boot. Reopens :attr:`connection`; other
        connections to the host must be closed first and opened again after. The namespace's
        network (bridges, addresses, iptables) stays as it was: a real boot brings those back
        from the host's configuration and libvirt's autostarted networks, which this does not."""
        def power_off() -> None:
            guests = self.guest_pids()
            for pid in guests:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in guests), 30, "the guests to die")
            self.run_in_namespace(["sh", "-c", "rm -rf /run/libvirt/qemu/*"])
        self._cycle_libvirtd(power_off)

    def guest_pids(self) -> set[int]:
        """The host's guests' qemu processes."""
        return {pid for pid in namespace_pids(self.namespace) if _command_name(pid).startswith("qemu-system")}

    def _cycle_libvirtd(self, while_stopped: Callable[[], None]) -> None:
        # Closed while its daemon still answers: closing it afterwards waits forever for the
        # close call's reply over the SSH channel (measured, libvirt 9.0 over libssh2).
        reopen = self._connection is not None
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        pid_file = self.root / "libvirtd.pid"
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "libvirtd to stop")
        while_stopped()
        self.run_in_namespace(["libvirtd", "--daemon", "--pid-file", str(pid_file)])
        libvirt_socket = f"/proc/{self._pid}/root/run/libvirt/libvirt-sock"
        wait_for(lambda: unix_socket_accepts(libvirt_socket), self.start_timeout, "libvirtd to answer again",
                 diagnostics=lambda: log_tail([self.root / "libvirtd.log"]))
        if reopen:
            self._connection = libvirt.open(self.uri())

    def _create_veth_pair(self) -> None:
        outside, inside, ns = self._veth_outside, self._veth_inside, self.namespace
        run_checked(
            ["ip", "link", "add", outside, "type", "veth", "peer", inside, "netns", ns]
        )
        run_checked(["ip", "addr", "add", f"{self.gateway}/30", "dev", outside])
        run_checked(["ip", "link", "set", outside, "up"])
        run_checked(["ip", "-n", ns, "addr", "add", f"{self.address}/30", "dev", inside])
        run_checked(["ip", "-n", ns, "link", "set", inside, "up"])
        run_checked(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _write_ssh_files(self) -> Path:
        """Host and client keys, authorized_keys, known_hosts; return the sshd config."""
        ssh_dir = self.ssh_dir
        ssh_dir.mkdir(mode=0o700)
        host_key = _generate_key(ssh_dir / "ssh_host_ed25519_key")
        client_key = _generate_key(self.key_file)
        _generate_key(self.controller_key_file)
        (ssh_dir / "authorized_keys").write_text(client_key + "\n")
        self.known_hosts_file.write_text(f"{self.address} {host_key}\n")
        sshd_config = ssh_dir / "sshd_config"
        sshd_config.write_text(
            f"ListenAddress {self.address}\n"
            f"HostKey {ssh_dir / 'ssh_host_ed25519_key'}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            # The user's own file (in the private home) first, as a real host has it.
            f"AuthorizedKeysFile .ssh/authorized_keys {ssh_dir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            # Ansible copies files with sftp (scp runs over it too since OpenSSH 9).
            "Subsystem sftp internal-sftp\n"
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

    def stop(self) -> None:
        """Kill everything, remove the namespace, veth pair and files; safe to repeat."""
        if self._connection is not None:
            try:
                self._connection.close()
            except libvirt.libvirtError:
                pass  # the host is being torn down anyway
            self._connection = None
        if self.slot:
            process = self._process
            kill_namespace_processes(self.namespace, timeout=15.0,
                                     reap=process.poll if process is not None else None)
        if self._process is not None:
            stop_process_group(self._process)
            self._process = None
        self._pid = 0
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

    def save_state(self, path: Path) -> None:
        """Write what :meth:`attach` needs to find and stop this host from another process."""
        state = {"namespace": self.namespace, "slot": self.slot, "root": str(self.root), "pid": self._pid,
                 "address": self.address, "stopped": False}
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(state, indent=2) + "\n")
        partial.replace(path)

    @classmethod
    def attach(cls, path: Path) -> Self | None:
        """The host a :meth:`save_state` file describes, to stop it; None when it is already gone.

        "Gone" is a state marked stopped or a missing temporary directory: then the slot may
        already belong to another host, which must not be touched.
        """
        state = json.loads(path.read_text())
        root = Path(state["root"])
        if state["stopped"] or not root.is_dir():
            return None
        host = cls()
        host.slot, host._root, host._pid = int(state["slot"]), root, int(state["pid"])
        return host

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

    # --- bootstrapping with the kvm_hypervisor role ----------------------------------------

    def bootstrap_inventory(self, **role_vars: Any) -> dict[str, Any]:
        """An Ansible inventory for ``playbooks/bootstrap_hypervisor.yml`` on this host.

        One host, ``hypervisor`` in the group ``kvm_hypervisors`` (the playbook's default), reached
        as root with :attr:`key_file`, its host key checked against :attr:`known_hosts_file`. Its
        variables make the role define pool and network ``default`` as :meth:`define_default_pool`
        and :meth:`define_isolated_network` do (the pool under the host's directory, the network
        isolated, DNS off), authorize :attr:`controller_key_file` for root and write the host's
        known_hosts line to :attr:`bootstrap_known_hosts_file`. ``role_vars`` override any of
        them; an override of None drops the variable, so the role's default applies.

        Nothing the role does then reaches beyond the host: libvirtd is the harness's own (the
        role must not manage the service; there is no init system), the packages are already
        installed (no apt cache update), root's ``~/.ssh`` is the private home's, and no user is
        created.
        """
        prefix = f"{GUEST_NETWORK_PREFIX}.{self.slot}"
        host_vars: dict[str, Any] = {
            "ansible_host": self.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key_file),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts_file} -o GlobalKnownHostsFile=/dev/null"
                " -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
            ),
            # A short ControlPersist: no SSH master outlives the run by more than a few seconds.
            "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=5s",
            "ansible_pipelining": True,  # one SSH round trip per module, no file copies
            "ansible_python_interpreter": "/usr/bin/python3",  # the one with python3-libvirt
            "ansible_become": False,  # already root (and the machine has no sudo)
            # Not the role's: the private half of kvm_hypervisor_controller_public_key, for
            # whoever connects as the controller afterwards (molecule's verify, a provider config),
            # and the namespace, where a verification reads the host's firewall.
            "hypervisor_controller_key_file": str(self.controller_key_file),
            "hypervisor_namespace": self.namespace,
            "kvm_hypervisor_manage_service": False,
            "kvm_hypervisor_update_apt_cache": False,
            "kvm_hypervisor_user": "root",
            "kvm_hypervisor_controller_public_key": self.controller_key_file.with_suffix(".pub").read_text().strip(),
            "kvm_hypervisor_ssh_host_key_dir": str(self.ssh_dir),
            "kvm_hypervisor_known_hosts_file": str(self.bootstrap_known_hosts_file),
            "kvm_hypervisor_pool_name": "default",
            "kvm_hypervisor_pool_path": str(self.pool_path),
            "kvm_hypervisor_network_name": "default",
            "kvm_hypervisor_network_forward_mode": "none",
            "kvm_hypervisor_network_bridge": "virbr0",  # the role's default, named for whoever checks it
            "kvm_hypervisor_network_dns": False,
            "kvm_hypervisor_network_address": self.guest_network_address,
            "kvm_hypervisor_network_netmask": "255.255.255.0",
            "kvm_hypervisor_network_dhcp_start": f"{prefix}.10",
            "kvm_hypervisor_network_dhcp_end": f"{prefix}.250",
        }
        host_vars.update(role_vars)
        host_vars = {name: value for name, value in host_vars.items() if value is not None}
        return {INVENTORY_GROUP: {"hosts": {INVENTORY_HOST: host_vars}}}

    def publishing_role_vars(self, source_addresses: int = 2) -> dict[str, Any]:
        """Role variables for a nat network that publishes proxies on :attr:`address` (ports
        PUBLISH_PORTS) and gives each a source address of its own: ``source_addresses`` additional
        addresses, added to the host's end of the veth pair first (the role checks the host has them)."""
        sources = [f"{SOURCE_ADDRESS_PREFIX}.{self.slot}.{n}" for n in range(1, source_addresses + 1)]
        present = run_checked(["ip", "-n", self.namespace, "-4", "-o", "address", "show"]).stdout
        for address in sources:
            if f" {address}/" not in present:
                run_checked(["ip", "-n", self.namespace, "address", "add", f"{address}/32", "dev", self._veth_inside])
        return {"kvm_hypervisor_network_forward_mode": "nat", "kvm_hypervisor_public_address": self.address,
                "kvm_hypervisor_publish_ports": PUBLISH_PORTS, "kvm_hypervisor_source_addresses": sources}

    # --- inside the host --------------------------------------------------------------

    def run_in_namespace(
        self, cmd: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the host's network and mount namespaces (it sees the private /run)."""
        if not self._pid:
            raise RuntimeError("HypervisorHost is not started")
        return subprocess.run(
            [
                "nsenter",
                "--target",
                str(self._pid),
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


# --- running the bootstrap playbook ------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapRun:
    """One run of ``playbooks/bootstrap_hypervisor.yml`` through ansible-runner."""

    status: str  # ansible-runner's: "successful", "failed", "timeout", ...
    stdout: str  # ansible-playbook's output, recap included
    seconds: float
    known_hosts_file: Path  # where the role wrote the host's key lines (when it got that far)

    @property
    def ok(self) -> bool:
        return self.status == "successful"


class BootstrapError(RuntimeError):
    """The bootstrap playbook failed; the message ends with the tail of its output."""


def bootstrap(host: HypervisorHost, *, check: bool = True, check_mode: bool = False, timeout: int = 300,
              **role_vars: Any) -> BootstrapRun:
    """Bootstrap ``host`` with ``playbooks/bootstrap_hypervisor.yml`` as an operator would.

    The inventory is :meth:`HypervisorHost.bootstrap_inventory` (``role_vars`` override its
    variables); ansible-playbook is the one beside this interpreter, the collections those of
    :func:`support.collection.modules.collections_path`. With ``check`` a failed run raises
    :class:`BootstrapError`; ``check_mode`` runs the playbook with ``--check``.
    """
    # Imported here: the harness itself (and its CLI) needs neither.
    import ansible_runner

    from support.collection.modules import collections_path

    inventory = host.bootstrap_inventory(**role_vars)
    known_hosts = Path(inventory[INVENTORY_GROUP]["hosts"][INVENTORY_HOST]["kvm_hypervisor_known_hosts_file"])
    with tempfile.TemporaryDirectory(prefix="bootstrap-hypervisor-") as private:
        started = time.monotonic()
        outcome = ansible_runner.run(
            private_data_dir=private,
            playbook=str(BOOTSTRAP_PLAYBOOK),
            inventory=inventory,
            cmdline="--check" if check_mode else None,
            # ansible-playbook from beside this interpreter, found on PATH.
            envvars={"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                     "ANSIBLE_COLLECTIONS_PATH": collections_path(), "ANSIBLE_NOCOLOR": "1",
                     "ANSIBLE_RETRY_FILES_ENABLED": "0"},
            timeout=timeout,
            quiet=True,
            # Without one, ansible-runner takes over SIGINT/SIGTERM of the test process for good.
            cancel_callback=lambda: False,
        )
        seconds = time.monotonic() - started
        with outcome.stdout as stdout:
            run = BootstrapRun(str(outcome.status), stdout.read(), seconds, known_hosts)
    if check and not run.ok:
        tail = "\n".join(run.stdout.splitlines()[-40:])
        raise BootstrapError(f"bootstrap of {host.namespace} ended {run.status}:\n{tail}")
    return run


# --- command line: a host that outlives the process, for molecule ------------------------------


def _command_name(pid: int) -> str:
    """The process's command name (``/proc/PID/comm``); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _up(state: Path, inventory: Path | None, publishing: bool) -> None:
    host = HypervisorHost()
    host.start()
    try:
        host.save_state(state)
        if inventory is not None:
            role_vars = host.publishing_role_vars() if publishing else {}
            inventory.parent.mkdir(parents=True, exist_ok=True)
            inventory.write_text(json.dumps(host.bootstrap_inventory(**role_vars), indent=2) + "\n")
    except BaseException:
        host.stop()
        raise
    # The daemons run on in their own session; this process leaves without stopping them.
    sys.stdout.write(f"hypervisor host {host.namespace} up at {host.address} in {host.startup_seconds:.1f} s\n")


def _down(state: Path) -> None:
    if not state.exists():
        sys.stdout.write(f"no hypervisor host state at {state}: nothing to stop\n")
        return
    host = HypervisorHost.attach(state)
    if host is None:
        sys.stdout.write(f"the hypervisor host of {state} is already stopped\n")
        return
    namespace = host.namespace
    host.stop()
    recorded = json.loads(state.read_text())
    recorded["stopped"] = True
    state.write_text(json.dumps(recorded, indent=2) + "\n")
    sys.stdout.write(f"hypervisor host {namespace} stopped and removed\n")


def _restart_libvirtd(state: Path) -> None:
    host = HypervisorHost.attach(state)
    if host is None:
        raise SystemExit(f"the hypervisor host of {state} is not running")
    host.restart_libvirtd()
    sys.stdout.write(f"libvirtd of hypervisor host {host.namespace} restarted\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m support.hosts.hypervisor_host",
        description="Start a test hypervisor host that outlives this command, or stop one.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a host; write its state (and an Ansible inventory)")
    up.add_argument("--state", type=Path, required=True, help="where to write the host's state")
    up.add_argument("--inventory", type=Path, help="where to write the bootstrap inventory (JSON)")
    up.add_argument("--publishing", action="store_true",
                    help="the inventory's network is nat, publishing proxies and giving them source addresses")
    down = commands.add_parser("down", help="stop the host a state file describes and remove it")
    down.add_argument("--state", type=Path, required=True, help="the state file `up` wrote")
    restart = commands.add_parser("restart-libvirtd", help="restart the host's libvirtd (it runs new hooks then)")
    restart.add_argument("--state", type=Path, required=True, help="the state file `up` wrote")
    args = parser.parse_args(argv)
    if args.command == "up":
        _up(args.state, args.inventory, args.publishing)
    elif args.command == "restart-libvirtd":
        _restart_libvirtd(args.state)
    else:
        _down(args.state)


if __name__ == "__main__":
    main()

