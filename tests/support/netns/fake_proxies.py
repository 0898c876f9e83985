"""Many fake proxies in one process inside a test's network namespace, each endpoint doing what a
test tells it to (``FakeProxies.set``): the instances a controller probes, without a VM or a
squid per instance.

Every endpoint is an ``address:port`` of the namespace; its ``mode`` says how it answers:

- ``forward``: a real (if small) forwarding proxy. A GET in absolute form is sent on to its
  origin (a new connection, ``Connection: close``) and the origin's answer relayed as it came; a
  ``CONNECT host:port`` opens a TCP connection there, answers 200 and pipes both ways. With
  ``users`` (``{name: bcrypt hash}``, what an instance's password file holds)
  every request needs a matching ``Proxy-Authorization`` (407 otherwise), as squid's
  ``basic_ncsa_auth`` would check it; without, anyone may use it;
- ``any-password``: ``forward``, but any Basic credentials pass (a drop-in's fake
  authenticator); none still gets 407;
- ``liar``: authenticates like ``forward``, then answers by itself: 204 to any GET, an echo
  body with the address 203.0.113.77 for a path ending in ``/echo``, and to a CONNECT 200
  followed by echoing whatever comes through the "tunnel". ``forward`` with ``lie`` (a list of
  ``http``, ``echo``, ``connect``) lies for those requests only; with ``forge`` (``append-address``,
  ``replay-204``) its echo's proof is one the real probe target signed for a 204 check of a nonce
  of the liar's making (issue 38 row 2's forgery) instead of zeros;
- ``echo-credentials``: answers every request with a line that is not HTTP, carrying the
  request's ``Proxy-Authorization`` value (an endpoint echoing what it was sent);
- ``hang``: accepts, reads, never answers;
- ``delay``: ``forward`` after ``delay`` seconds per request;
- ``flap``: ``forward`` for ``period`` seconds, then refuses connections for ``period`` seconds,
  and so on (by the wall clock);
- ``closed``: nothing listens (connections are refused).

The process re-reads its control file when it changes and acknowledges each change
(``set`` waits for that); every connection it accepts is logged (``connections``: time,
endpoint), so a test can tell when a probe started.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from support.netns.namespace import NamespacedProcess, NetworkNamespace
from support.waiting import wait_for

FAKE_PROXIES = r"""
import asyncio, base64, json, os, sys, time
import bcrypt

control_path, ack_path, log_path = sys.argv[1], sys.argv[2], sys.argv[3]
endpoints = {}     # "addr:port" -> settings
servers = {}       # "addr:port" -> asyncio.Server
verified = {}      # (hash, password) -> bool
log = open(log_path, "a", buffering=1)

def check(settings, header):
    users = settings.get("users") or {}
    if not users:
        return True
    if not header or not header.startswith("Basic "):
        return False
    if settings["mode"] == "any-password":
        return True
    try:
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except Exception:
        return False
    hashed = users.get(user)
    if hashed is None:
        return False
    # Checked once per hash and password, as squid caches a verified login: instances of one
    # namespace share its hash, and bcrypt costs tens of milliseconds on this process's loop.
    key = (hashed, password)
    if key not in verified:
        verified[key] = bcrypt.checkpw(password.encode(), hashed.encode())
    return verified[key]

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except Exception:
        pass
    finally:
        writer.close()

async def forward(method, target, head, reader, writer):
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            return True
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        return False
    rest = target.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "80")
    lines = [f"{method} /{path} HTTP/1.1"] + [l for l in head[1:] if l.split(":")[0].lower() not in (
        "proxy-authorization", "connection", "proxy-connection")] + ["Connection: close"]
    try:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = await up_reader.read()
        up_writer.close()
    except OSError:
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return False
    writer.write(answer)
    return False

# A proof the real probe target signs for a nonce of the liar's making (issue 38 row 2): the echo's
# nonce with the invented address appended (append-address), or the echo's nonce as it is
# (replay-204), asked for as a 204 check at the echo URL's host.
async def forged_proof(target, forge):
    url, _, query = target.partition("?")
    nonce = query.partition("egress-probe-nonce=")[2].partition("&")[0]
    asked = nonce + "%20203.0.113.77" if forge == "append-address" else nonce
    netloc = url.split("://", 1)[1].partition("/")[0]
    host, _, port = netloc.rpartition(":")
    up_reader, up_writer = await asyncio.open_connection(host, int(port))
    up_writer.write(f"GET /generate_204?egress-probe-nonce={asked} HTTP/1.1\r\nHost: {netloc}\r\n"
                    "Connection: close\r\n\r\n".encode())
    answer = (await up_reader.read()).decode("latin-1")
    up_writer.close()
    found = [l.split(":", 1)[1].strip() for l in answer.split("\r\n") if l.lower().startswith("x-egress-probe-proof:")]
    return found[0] if found else "0" * 64

async def lie(method, target, reader, writer, settings):
    if method == "CONNECT":
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await pipe(reader, writer)
        return False
    if target.split("?")[0].endswith("/echo"):
        forge = settings.get("forge")
        signed = await forged_proof(target, forge) if forge else "0" * 64
        body = json.dumps({"ip": "203.0.113.77", "proof": signed}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    else:
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    return True

async def handle(name, reader, writer):
    log.write(json.dumps({"time": time.time(), "endpoint": name}) + "\n")
    try:
        while True:
            settings = endpoints.get(name) or {"mode": "closed"}
            raw = await reader.readuntil(b"\r\n\r\n")
            head = raw.decode("latin-1").split("\r\n")[:-2]
            method, target = head[0].split(" ")[:2]
            auth = next((l.split(":", 1)[1].strip() for l in head[1:]
                         if l.lower().startswith("proxy-authorization:")), None)
            mode = settings["mode"]
            if mode == "hang":
                await asyncio.sleep(3600)
            if mode == "echo-credentials":
                writer.write(("ECHO " + str(auth) + "\r\n\r\n").encode("latin-1"))
                break
            if mode == "delay":
                await asyncio.sleep(float(settings.get("delay", 0)))
            if not check(settings, auth):
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                             b"Proxy-Authenticate: Basic realm=\"fake\"\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                continue
            kind = "connect" if method == "CONNECT" else "echo" if target.split("?")[0].endswith("/echo") else "http"
            lying = mode == "liar" or kind in (settings.get("lie") or ())
            keep = await (lie(method, target, reader, writer, settings) if lying
                          else forward(method, target, head, reader, writer))
            await writer.drain()
            if not keep:
                break
    except Exception:
        pass
    finally:
        writer.close()

def refusing(settings):
    if settings["mode"] == "closed":
        return True
    if settings["mode"] == "flap":
        period = float(settings["period"])
        return int(time.time() / period) % 2 == 1
    return False

async def apply():
    for name, settings in list(endpoints.items()):
        listening = name in servers
        if refusing(settings) and listening:
            servers.pop(name).close()
        elif not refusing(settings) and not listening:
            address, _, port = name.rpartition(":")
            servers[name] = await asyncio.start_server(lambda r, w, n=name: handle(n, r, w), address, int(port),
                                                       backlog=4096)
    for name in list(servers):
        if name not in endpoints:
            servers.pop(name).close()

async def main():
    seen = None
    while True:
        try:
            stamp = os.stat(control_path).st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp != seen and stamp is not None:
            seen = stamp
            document = json.load(open(control_path))
            endpoints.clear()
            endpoints.update(document["endpoints"])
            await apply()
            with open(ack_path + ".tmp", "w") as ack:
                ack.write(str(document["generation"]))
            os.replace(ack_path + ".tmp", ack_path)
        else:
            await apply()
        await asyncio.sleep(0.05)

asyncio.run(main())
"""


class FakeProxies(NamespacedProcess):
    """The process and its control file (a context manager); see the module docstring."""

    def __init__(self, netns: NetworkNamespace, name: str = "fake-proxies") -> None:
        super().__init__(netns)
        self.directory = netns.root / name
        self.endpoints: dict[str, dict[str, Any]] = {}
        self._generation = 0
        # A kubelet's thread places instances while the test's own thread changes modes: one
        # change at a time, or two writes of the temporary file interleave and the process dies
        # on a control file with extra data in it (seen under load).
        self._lock = threading.Lock()

    def set(self, address: str, port: int, mode: str, users: Mapping[str, str] | None = None,
            **options: Any) -> None:
        """Make ``address:port`` answer as ``mode`` (with ``users`` and the mode's options)."""
        self._write({f"{address}:{port}": {"mode": mode, "users": dict(users or {}), **options}})

    def mode(self, address: str, port: int, mode: str, **options: Any) -> None:
        """Change an endpoint's mode, keeping its users."""
        self.set(address, port, mode, self.endpoints[f"{address}:{port}"]["users"], **options)

    def connections(self) -> list[dict[str, Any]]:
        """Every connection accepted so far: ``time`` (epoch seconds) and ``endpoint``."""
        try:
            lines = (self.directory / "connections.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def _write(self, changed: Mapping[str, dict[str, Any]]) -> None:
        """Apply ``changed`` endpoints and wait until the process has them."""
        with self._lock:
            self.endpoints.update(changed)
            self._generation += 1
            generation = self._generation
            temporary = self.directory / "control.json.tmp"
            temporary.write_text(json.dumps({"generation": generation, "endpoints": self.endpoints}))
            os.replace(temporary, self.directory / "control.json")
        wait_for(lambda: self._acknowledged() >= generation, 10, "the fake proxies to apply a change",
                 diagnostics=lambda: (self.directory / "out.log").read_text(errors="replace")[-2000:])

    def _acknowledged(self) -> int:
        try:
            return int((self.directory / "ack").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.launch([sys.executable, "-c", FAKE_PROXIES, str(self.directory / "control.json"),
                     str(self.directory / "ack"), str(self.directory / "connections.jsonl")],
                    self.directory / "out.log")
        self._write({})
