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

- :class:`NetworkNamespace`: the namespace, veth pair and addresses; :meth:`~NetworkNamespace.spawn`
  runs a process inside it, and stopping kills every process left in it. :meth:`~NetworkNamespace.link`
  joins two of them by a veth pair of their own (an "internet" namespace behind a proxy's, with
  public-looking addresses that exist nowhere else), and :meth:`~NetworkNamespace.add_outside_address`
  gives the root namespace's end one more address (a client the proxy does not know).
- :class:`Squid`: ``squid -N`` (no daemon, no SMP workers) with the caller's configuration
  (access rules, auth, or a whole squid.conf such as a generated one) plus the harness's own
  housekeeping lines appended (pid file, logs and coredump dir in a private directory,
  pinger off, a zero shutdown lifetime), which win because squid takes the last value of a
  single-valued directive. ``http_port`` and ``visible_hostname`` are added only when the
  caller's configuration has none; ``extra`` lines (``dns_nameservers``) come last.
  ``launcher`` runs squid through a command of the caller's (a container's entrypoint), with
  ``env``. Start waits until the port accepts connections, or fails with the tail of cache.log.
- :class:`TargetServer`: one Python process inside the namespace serving HTTP at
  ``<address>:8080`` -- ``/generate_204`` answers 204, ``/echo`` answers the peer's address
  as plain text, anything else 404 -- and a plain TCP echo port at ``<address>:8443`` as the
  CONNECT target (no TLS: the tunnel is what is tested); optionally an FTP server (passive
  mode, the same short text for every ``*.txt`` file, and a listing of ``/``). The address
  and ports are the caller's to choose.
  Every HTTP request and FTP command it receives is recorded (peer, method, path, headers)
  and readable with :meth:`TargetServer.requests`, so a test can check what reached the
  origin (which address, whether ``Via``, ``X-Forwarded-For`` or ``Cache-Control`` came
  along, what squid logs in to FTP with).
- :class:`DnsServer`: dnsmasq inside the namespace with the caller's names and no upstream,
  logging every query (:meth:`DnsServer.queries`), for squid's ``dns_nameservers``.
- :func:`write_password_file`: an htpasswd-style file of SHA-512-crypt hashes (``openssl
  passwd -6``; ``basic_ncsa_auth`` checks them through crypt(3)), readable by squid's user.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from .libvirt_daemon import DaemonStartError, stop_process_group, tcp_port_accepts, wait_until

PREFIX = "10.215"
SLOTS = range(1, 255)
SQUID = "/usr/sbin/squid"
BASIC_NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"
# Debian's squid drops root to this user (its cache_effective_user default): whatever squid or
# its helpers open after start-up must be readable or writable by it.
SQUID_USER = "proxy"

TARGET_HTTP_PORT = 8080
TARGET_CONNECT_PORT = 8443
# Nothing listens there in a namespace of ours: a CONNECT to it is refused by the kernel.
CLOSED_PORT = 8444


def _run(cmd: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, input=stdin)
    if result.returncode != 0:
        raise DaemonStartError(f"{shlex.join(cmd)} failed: {result.stderr.strip()}")
    return result


class _Started:
    """A context manager of start() and stop()."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class NetworkNamespace(_Started):
    """A network namespace joined to the root namespace by a veth pair on 10.215.<slot>.0/24."""

    def __init__(self) -> None:
        self.slot = 0
        self._root: Path | None = None
        self._next_host = 3
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def namespace(self) -> str:
        return f"egp-sq{self.slot}"

    @property
    def _veth_outside(self) -> str:
        return f"egpsq{self.slot}"

    @property
    def _veth_inside(self) -> str:
        return f"egpsq{self.slot}p"

    @property
    def gateway(self) -> str:
        """The root namespace's end of the veth pair: where the test process's packets come from."""
        return f"{PREFIX}.{self.slot}.1"

    @property
    def address(self) -> str:
        """The namespace's first address."""
        return f"{PREFIX}.{self.slot}.2"

    @property
    def network(self) -> str:
        """The /24 routed to the namespace: every address a test may send to (besides loopback)."""
        return f"{PREFIX}.{self.slot}.0/24"

    @property
    def root(self) -> Path:
        """A private temporary directory for this namespace's files; removed on stop."""
        if self._root is None:
            raise RuntimeError("NetworkNamespace is not started")
        return self._root

    def add_address(self, address: str | None = None) -> str:
        """Give the namespace one more address (of its /24 unless ``address`` says which) and return it.

        An address of the caller's choosing exists only inside this namespace (and whatever
        :meth:`link` joins to it): nothing outside routes to it."""
        if address is None:
            if self._next_host > 254:
                raise DaemonStartError(f"namespace {self.namespace} has no free address left")
            address = f"{PREFIX}.{self.slot}.{self._next_host}"
            self._next_host += 1
        prefix = 128 if ":" in address else 32
        _run(["ip", "-n", self.namespace, "addr", "add", f"{address}/{prefix}", "dev", self._veth_inside, *(
            ["nodad"] if prefix == 128 else [])])
        return address

    def add_outside_address(self) -> str:
        """One more address of the /24 on the root namespace's end: a client source that is not
        the gateway (bind a socket to it to be someone the proxy does not know)."""
        address = f"{PREFIX}.{self.slot}.254"
        _run(["ip", "addr", "add", f"{address}/32", "dev", self._veth_outside])
        return address

    def link(self, other: NetworkNamespace, address: str, peer: str, prefix: int = 24) -> None:
        """Join this namespace to ``other`` by a veth pair: ``address`` here, ``peer`` there, both
        on one ``prefix`` network. Deleting either namespace deletes the pair."""
        here, there = f"egpl{self.slot}x{other.slot}", f"egpl{self.slot}x{other.slot}p"
        _run(["ip", "link", "add", here, "netns", self.namespace, "type", "veth", "peer", there, "netns",
              other.namespace])
        for namespace, device, mine in ((self.namespace, here, address), (other.namespace, there, peer)):
            _run(["ip", "-n", namespace, "addr", "add", f"{mine}/{prefix}", "dev", device])
            _run(["ip", "-n", namespace, "link", "set", device, "up"])

    def route(self, network: str, via: str) -> None:
        """Route ``network`` through ``via`` (a peer of :meth:`link`) inside this namespace."""
        _run(["ip", "-n", self.namespace, "route", "add", network, "via", via])

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` as a command line that runs inside the namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def spawn(self, args: Sequence[str], output: IO[bytes],
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``args`` inside the namespace in a session of its own, with ``env`` added to the
        environment; stop() ends it at the latest."""
        process = subprocess.Popen(self.command(args), stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **env} if env else None)
        self._processes.append(process)
        return process

    def start(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="squid-netns-"))
        # squid's user has to reach its own directories below this one.
        self._root.chmod(0o755)
        try:
            self._claim_slot()
            outside, inside, ns = self._veth_outside, self._veth_inside, self.namespace
            _run(["ip", "link", "add", outside, "type", "veth", "peer", inside, "netns", ns])
            _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", outside])
            _run(["ip", "link", "set", outside, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address}/24", "dev", inside])
            _run(["ip", "-n", ns, "link", "set", inside, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        except BaseException:
            self.stop()
            raise

    def _claim_slot(self) -> None:
        """Create the namespace in the first free slot; ``ip netns add`` fails on a taken name."""
        for slot in SLOTS:
            self.slot = slot
            if Path(f"/sys/class/net/{self._veth_outside}").exists():
                continue
            if subprocess.run(["ip", "netns", "add", self.namespace], check=False,
                              capture_output=True).returncode == 0:
                return
        self.slot = 0
        raise DaemonStartError("no free slot for a squid test network namespace")

    def _pids(self) -> list[int]:
        result = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True,
                                check=False)
        return [int(pid) for pid in result.stdout.split()]

    def stop(self) -> None:
        """Kill every process in the namespace, delete it and the veth pair; safe to repeat."""
        for process in self._processes:
            stop_process_group(process, timeout=5.0)
        self._processes.clear()
        if self.slot:
            # Whatever left our process groups (a squid helper that re-parented) is found here.
            deadline = time.monotonic() + 5.0
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in self._pids():
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                while self._pids() and time.monotonic() < deadline:
                    time.sleep(0.05)
                deadline = time.monotonic() + 5.0
            # Deleting one end of a veth pair deletes both; the namespace may already be gone.
            subprocess.run(["ip", "link", "del", self._veth_outside], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", self.namespace], check=False, capture_output=True)
            self.slot = 0
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


class NamespacedProcess(_Started):
    """One process a test runs inside a ``NetworkNamespace``, its output in a log file: ``launch``
    (or ``_run``, which also waits until it is ready) starts it from a subclass's ``start``;
    ``stop`` ends its process group and closes its output (safe to repeat); a context manager."""

    start_timeout: float = 20.0
    stop_timeout = 5.0

    def __init__(self, netns: NetworkNamespace) -> None:
        self.netns = netns
        self._process: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """The process (0 when stopped)."""
        return self._process.pid if self._process is not None else 0

    def launch(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Spawn ``args`` in the namespace, its output to ``log``."""
        self._out = open(log, "ab")  # noqa: SIM115 -- closed in stop()
        self._process = self.netns.spawn(args, self._out, env=env)
        return self._process

    def _run(self, args: Sequence[str], output: Path, ready: Callable[[], bool], what: str,
             logs: Sequence[Path] = ()) -> None:
        """``launch``, then wait until ``ready`` (stopped again when it never is)."""
        process = self.launch(args, output)
        try:
            wait_until(ready, what=what, timeout=self.start_timeout, process=process, logs=[output, *logs])
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the process group and wait for it; safe to repeat."""
        if self._process is not None:
            stop_process_group(self._process, timeout=self.stop_timeout)
            self._process = None
        if self._out is not None:
            self._out.close()
            self._out = None


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
        return _read(self.directory / "cache.log")

    def access_log(self) -> list[str]:
        return _read(self.directory / "access.log").splitlines()

    def render_config(self) -> str:
        """The whole squid.conf start() writes: the caller's lines, then the harness's."""
        home = self.directory
        lines = [self.config.rstrip("\n"), "", "# --- tests/support/squid.py: housekeeping (last value wins) ---"]
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
        remaining = self.start_timeout
        try:
            for port in self.ports:
                remaining -= wait_until(_accepts(self.address, port),
                                        what=f"squid {self.name} on {self.address}:{port}", timeout=remaining,
                                        process=process, logs=logs)
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



def _accepts(address: str, port: int) -> Callable[[], bool]:
    return lambda: tcp_port_accepts(address, port)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def write_password_file(path: Path, users: Mapping[str, str]) -> Path:
    """Write ``user:hash`` lines (SHA-512 crypt) for ``basic_ncsa_auth``; mode 0640, group proxy.

    The passwords reach openssl on stdin, never on a command line.
    """
    lines = []
    for user, password in users.items():
        hashed = _run(["openssl", "passwd", "-6", "-stdin"], stdin=password + "\n").stdout.strip()
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


# The target server, run by the namespace's python: HTTP on argv[1]:argv[2], TCP echo on argv[3],
# FTP on argv[5] (0: none), one JSON line per HTTP request or FTP command appended to argv[4];
# "ready" on stdout once every port listens.
TARGET_SERVER = r"""
import json, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

address, http_port, connect_port, log_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ftp_port = int(sys.argv[5])
lock = threading.Lock()
FILE = b"egress-proxies test file\n"

def record(entry):
    with lock, open(log_path, "a") as log:
        log.write(json.dumps(entry) + "\n")

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        record({"peer": self.client_address[0], "method": "GET", "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()]})
        if self.path == "/generate_204":
            self.send_response(204)
            self.end_headers()
        elif self.path == "/echo":
            body = self.client_address[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass

def echo(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)

def serve(listener, handle):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()

def ftp(conn):
    # Passive-mode FTP, enough for squid's client: any *.txt file, and a listing of /.
    data = None
    with conn, conn.makefile("rb") as lines:
        def reply(text):
            conn.sendall(text.encode() + b"\r\n")
        def transfer(payload):
            with data.accept()[0] as channel:
                reply("150 sending")
                channel.sendall(payload)
            reply("226 done")
        reply("220 test FTP")
        for raw in lines:
            command = raw.decode(errors="replace").strip()
            verb, _, argument = command.partition(" ")
            verb = verb.upper()
            record({"peer": conn.getpeername()[0], "method": "FTP", "path": argument, "command": command,
                    "headers": []})
            if verb in ("EPSV", "PASV"):
                data = socket.create_server((conn.getsockname()[0], 0))
                port = data.getsockname()[1]
                host = conn.getsockname()[0].replace(".", ",")
                reply("229 Entering Extended Passive Mode (|||%d|)" % port if verb == "EPSV"
                      else "227 Entering Passive Mode (%s,%d,%d)" % (host, port // 256, port % 256))
            elif verb == "RETR" and argument.endswith(".txt"):
                transfer(FILE)
            elif verb in ("LIST", "NLST"):
                transfer(b"-rw-r--r-- 1 ftp ftp 25 Jan 01 00:00 file.txt\r\n")
            elif verb == "SIZE" and argument.endswith(".txt"):
                reply("213 %d" % len(FILE))
            elif verb == "CWD" and argument.strip("/") == "":
                reply("250 ok")
            elif verb == "QUIT":
                reply("221 bye")
                return
            else:
                reply({"USER": "331 password", "PASS": "230 in", "TYPE": "200 ok", "PWD": '257 "/"',
                       "SYST": "215 UNIX Type: L8"}.get(verb, "550 no"))

class Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops SYNs under a burst of proxies fetching at once,
    # and each drop costs the client a 1 s (then 3 s) retransmission.
    request_queue_size = 1024

server = Server((address, http_port), Handler)
threading.Thread(target=serve, args=(socket.create_server((address, connect_port), backlog=1024), echo),
                 daemon=True).start()
if ftp_port:
    threading.Thread(target=serve, args=(socket.create_server((address, ftp_port), backlog=1024), ftp),
                     daemon=True).start()
print("ready", flush=True)
server.serve_forever()
"""


class TargetServer(NamespacedProcess):
    """The origin side of a proxy test, inside ``netns`` on an address of its own (a context manager).

    ``address`` (default: a new one of the namespace's /24) is added to the namespace; ``ftp_port``
    0 runs no FTP server."""

    def __init__(self, netns: NetworkNamespace, start_timeout: float = 20.0, *, address: str | None = None,
                 http_port: int = TARGET_HTTP_PORT, connect_port: int = TARGET_CONNECT_PORT,
                 ftp_port: int = 0) -> None:
        super().__init__(netns)
        self.start_timeout = start_timeout
        self.address = ""
        self._wanted_address = address
        self.http_port = http_port
        self.connect_port = connect_port
        self.ftp_port = ftp_port
        self._log = Path()

    def url(self, path: str) -> str:
        return f"http://{self.address}:{self.http_port}{path}"

    @property
    def connect_target(self) -> str:
        """``host:port`` of the TCP echo port, for a CONNECT check."""
        return f"{self.address}:{self.connect_port}"

    @property
    def closed_connect_target(self) -> str:
        """``host:port`` where nothing listens."""
        return f"{self.address}:{CLOSED_PORT}"

    def requests(self) -> list[dict[str, Any]]:
        """Every HTTP request the server received so far, oldest first."""
        return [json.loads(line) for line in _read(self._log).splitlines()]

    def start(self) -> None:
        self.address = self.netns.add_address(self._wanted_address)
        directory = self.netns.root / f"targets-{self.address}"
        directory.mkdir()
        self._log = directory / "requests.jsonl"
        output = directory / "server.out"
        # Ready from inside: the address may be one the root namespace cannot reach.
        self._run([sys.executable, "-c", TARGET_SERVER, self.address, str(self.http_port), str(self.connect_port),
                   str(self._log), str(self.ftp_port)], output, lambda: _read(output).startswith("ready"),
                  f"target server on {self.address}")


class DnsServer(NamespacedProcess):
    """dnsmasq inside ``netns`` on ``address``:53 answering only ``names`` (name -> addresses;
    every other name: REFUSED, no upstream), logging each query (a context manager)."""

    def __init__(self, netns: NetworkNamespace, names: Mapping[str, Sequence[str]], address: str = "127.0.0.1",
                 start_timeout: float = 20.0) -> None:
        super().__init__(netns)
        self.names = dict(names)
        self.address = address
        self.start_timeout = start_timeout
        self._log = Path()

    def queries(self) -> list[str]:
        """``<type> <name>`` of every query so far, oldest first (``A metadata.google.internal``)."""
        found = re.findall(r"query\[(\w+)\] (\S+) from", _read(self._log))
        return [f"{kind} {name}" for kind, name in found]

    def start(self) -> None:
        directory = self.netns.root / f"dns-{self.address}"
        directory.mkdir()
        self._log = directory / "queries.log"
        output = directory / "dnsmasq.out"
        answers = [f"--address=/{name}/{address}" for name, addresses in self.names.items() for address in addresses]
        self._run(["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
                   "--pid-file=", f"--listen-address={self.address}", "--bind-interfaces", "--port=53", "--user=root",
                   "--log-queries", f"--log-facility={self._log}", *answers], output,
                  lambda: "started" in _read(self._log), f"dnsmasq on {self.address}", [self._log])
