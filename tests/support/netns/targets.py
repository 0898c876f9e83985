"""The origin side of a proxy test, inside a test's network namespace (see :mod:`support.netns.squid`).

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
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from support.netns.namespace import NamespacedProcess, NetworkNamespace, read_log

TARGET_HTTP_PORT = 8080
TARGET_CONNECT_PORT = 8443
# Nothing listens there in a namespace of ours: a CONNECT to it is refused by the kernel.
CLOSED_PORT = 8444


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
        return [json.loads(line) for line in read_log(self._log).splitlines()]

    def start(self) -> None:
        self.address = self.netns.add_address(self._wanted_address)
        directory = self.netns.root / f"targets-{self.address}"
        directory.mkdir()
        self._log = directory / "requests.jsonl"
        output = directory / "server.out"
        # Ready from inside: the address may be one the root namespace cannot reach.
        self._run([sys.executable, "-c", TARGET_SERVER, self.address, str(self.http_port), str(self.connect_port),
                   str(self._log), str(self.ftp_port)], output, lambda: read_log(output).startswith("ready"),
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
        found = re.findall(r"query\[(\w+)\] (\S+) from", read_log(self._log))
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
                  lambda: "started" in read_log(self._log), f"dnsmasq on {self.address}", [self._log])
