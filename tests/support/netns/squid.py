"""Real squid (Debian's package) in a network namespace the test creates, with targets beside it.

Everything a proxy test talks to lives in one network namespace of its own, reached from the
root namespace (where the test process runs) over a veth pair on ``10.215.<slot>.0/24``: the
root namespace's end is ``.1`` (:attr:`NetworkNamespace.gateway`), the namespace's ``.2``
(:attr:`NetworkNamespace.address`), and :meth:`NetworkNamespace.add_address` adds more of the
/24 to the namespace's end (a target's own address, a squid's ``tcp_outgoing_address``). The
/24 is routed over the veth, so nothing addressed to it can leave the machine; the namespace
has no other interface than its loopback and no default route, so nothing squid fetches can
leave it either. Send tests' traffic only to those addresses (and 127.0.0.1).

Pieces, each a context manager, each reusable on its own::

    with NetworkNamespace() as ns, TargetServer(ns) as targets:
        with Squid(ns, "http_access allow all\\n", port=3128) as squid:
            ...  # a proxy at squid.address:3128; targets.url("/generate_204") answers 204

- :class:`~support.netns.namespace.NetworkNamespace` (``namespace.py``): the namespace, veth pair
  and addresses, and the processes run inside it.
- :class:`Squid`: ``squid -N`` (no daemon, no SMP workers) with the caller's configuration
  (access rules, auth, or a whole squid.conf such as a generated one) plus the harness's own
  housekeeping lines appended (pid file, logs and coredump dir in a private directory,
  pinger off, a zero shutdown lifetime), which win because squid takes the last value of a
  single-valued directive. ``http_port`` and ``visible_hostname`` are added only when the
  caller's configuration has none; ``extra`` lines (``dns_nameservers``) come last.
  ``launcher`` runs squid through a command of the caller's (a container's entrypoint), with
  ``env``. Start waits until the port accepts connections, or fails with the tail of cache.log.
- :class:`~support.netns.targets.TargetServer` and :class:`~support.netns.targets.DnsServer`
  (``targets.py``): the origin (HTTP, a TCP echo port for CONNECT, FTP) and a DNS server.
- :func:`write_password_file`: an htpasswd-style file of SHA-512-crypt hashes (``openssl
  passwd -6``; ``basic_ncsa_auth`` checks them through crypt(3)), readable by squid's user.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.netns.namespace import NamespacedProcess, NetworkNamespace, read_log
from support.process import DaemonStartError, log_tail, run_checked, tcp_port_accepts
from support.waiting import wait_for

SQUID = "/usr/sbin/squid"
BASIC_NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"
# Debian's squid drops root to this user (its cache_effective_user default): whatever squid or
# its helpers open after start-up must be readable or writable by it.
SQUID_USER = "proxy"


_HTTP_PORT_LINE = re.compile(r"^\s*http_port\s", re.MULTILINE)
_VISIBLE_HOSTNAME_LINE = re.compile(r"^\s*visible_hostname\s", re.MULTILINE)


class Squid(NamespacedProcess):
    """One ``squid -N`` in ``netns`` with ``config`` (see the module docstring); a context manager.
    Stopping it (SIGTERM to squid and its helpers, one process group) takes 2 s however idle.

    ``address`` defaults to the namespace's :attr:`~NetworkNamespace.address`; ``ports`` are the
    ``http_port`` lines added when ``config`` has none (``port`` alone by default) and the ports
    start() waits for. ``name`` must be unique in the namespace (it names the private directory).
    """

    stop_timeout = 10.0

    def __init__(self, netns: NetworkNamespace, config: str, *, port: int = 3128, ports: Sequence[int] = (),
                 address: str | None = None, name: str = "squid", start_timeout: float = 30.0,
                 extra: str = "", launcher: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        super().__init__(netns)
        self.config = config
        self.address = address or netns.address
        self.ports = tuple(ports) or (port,)
        self.name = name
        self.start_timeout = start_timeout
        self.extra = extra
        self.launcher = tuple(launcher)
        self.env = dict(env or {})
        self.startup_seconds = 0.0

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def directory(self) -> Path:
        return self.netns.root / self.name

    @property
    def config_path(self) -> Path:
        return self.directory / "squid.conf"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def cache_log(self) -> str:
        return read_log(self.directory / "cache.log")

    def access_log(self) -> list[str]:
        return read_log(self.directory / "access.log").splitlines()

    def render_config(self) -> str:
        """The whole squid.conf start() writes: the caller's lines, then the harness's."""
        home = self.directory
        lines = [self.config.rstrip("\n"), "", "# --- tests/support/netns/squid.py: housekeeping (last value wins) ---"]
        if not _HTTP_PORT_LINE.search(self.config):
            lines += [f"http_port {self.address}:{port}" for port in self.ports]
        if not _VISIBLE_HOSTNAME_LINE.search(self.config):
            lines += [f"visible_hostname {self.name}.test"]
        lines += [
            f"pid_filename {home / 'squid.pid'}",
            f"cache_log {home / 'cache.log'}",
            f"access_log stdio:{home / 'access.log'}",
            "cache_store_log none",
            f"coredump_dir {home}",
            "pinger_enable off",
            # SIGTERM ends squid at once instead of after 30 s of draining.
            "shutdown_lifetime 0 seconds",
        ]
        return "\n".join(lines) + "\n" + self.extra

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"squid {self.name} is already running")
        started = time.monotonic()
        self.directory.mkdir(exist_ok=True)
        shutil.chown(self.directory, SQUID_USER, SQUID_USER)
        self.config_path.write_text(self.render_config())
        for log_name in ("cache.log", "access.log"):
            (self.directory / log_name).unlink(missing_ok=True)  # a restart reads only its own lines
        process = self.launch([*self.launcher, SQUID, "-N", "-f", str(self.config_path)],
                              self.directory / "squid.out", env=self.env)
        logs = [self.directory / "cache.log", self.directory / "squid.out"]
        try:
            wait_for(lambda: all(tcp_port_accepts(self.address, port) for port in self.ports), self.start_timeout,
                     f"squid {self.name} on {self.address}:{','.join(map(str, self.ports))}",
                     diagnostics=lambda: log_tail(logs), process=process, error=DaemonStartError)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def reconfigure(self) -> None:
        """``squid -k reconfigure``: SIGHUP, squid reads its configuration again."""
        if self._process is not None:
            os.kill(self.pid, signal.SIGHUP)

    def terminate(self) -> None:
        """Ask squid to shut down without waiting: it takes 2 s however idle (squid 5.7,
        measured), so stopping several at once starts with this on each, then stop()."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)



def write_password_file(path: Path, users: Mapping[str, str]) -> Path:
    """Write ``user:hash`` lines (SHA-512 crypt) for ``basic_ncsa_auth``; mode 0640, group proxy.

    The passwords reach openssl on stdin, never on a command line.
    """
    lines = []
    for user, password in users.items():
        hashed = run_checked(["openssl", "passwd", "-6", "-stdin"], stdin=password + "\n").stdout.strip()
        lines.append(f"{user}:{hashed}\n")
    path.write_text("".join(lines))
    path.chmod(0o640)
    shutil.chown(path, group=SQUID_USER)
    return path


def basic_auth_config(password_file: Path, realm: str = "egress-proxies-test") -> str:
    """squid.conf lines: Basic auth against ``password_file``, every request must authenticate."""
    return (
        f"auth_param basic program {BASIC_NCSA_AUTH} {password_file}\n"
        "auth_param basic children 2 startup=1 idle=1\n"
        f"auth_param basic realm {realm}\n"
        "acl authenticated proxy_auth REQUIRED\n"
        "http_access deny !authenticated\n"
        "http_access allow authenticated\n"
        "http_access deny all\n"
    )
