"""A web site for crawl tests that bans a client address, inside a network namespace of the test's.

:class:`BanningSite` runs one Python process in the namespace (tests/support/netns/squid.py) on an
address of its own, port 8080. Its pages form a binary tree: ``/page/<n>`` (0 <= n < ``pages``)
links to ``/page/<2n+1>`` and ``/page/<2n+2>``, and ``/`` is page 0, so a crawler that follows
every link fetches each page once, ``pages`` in all. Every answer waits ``delay`` seconds first
(a site's own latency, which spreads the crawl out over time); :meth:`set_delay` changes it
while the site runs.

The ban: the first client address to ask for more than ``ban_after`` pages gets ``ban_status``
(403) from then on, for every page, with the body ``banned: solve this captcha`` (a site that says
it with a 200 is what a crawler's own ban detector is for); only that one address is ever banned
(so a crawl can finish through the others). ``ban_headers`` go with each ban answer: a
``Retry-After`` for a site that rate-limits (``ban_status=429``), or the fleet's own-error header
forged by a site that wants its ban taken for the proxy's refusal.
Every request is recorded (time, peer, path, status) and readable with :meth:`requests`. The
root page is ``url("/")``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from support.netns.namespace import NetworkNamespace
from support.netns.targets import TargetServer
from support.process import tcp_port_accepts

SITE_PORT = 8080

# argv: address, port, pages, ban_after, ban_status, delay file, log path, ban headers (JSON). One
# JSON line per request.
SITE_SERVER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

address, port, pages, ban_after, ban_status, delay_path, log_path = sys.argv[1], int(sys.argv[2]), \
    int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
ban_headers = json.loads(sys.argv[8])
lock = threading.Lock()
served = {}
banned = []

class Site(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(delay_path) as delay:
            time.sleep(float(delay.read()))
        peer = self.client_address[0]
        page = 0 if self.path == "/" else int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/page/") \
            and self.path.rsplit("/", 1)[1].isdigit() else -1
        with lock:
            ban = 0 <= page < pages and (peer in banned or (served.get(peer, 0) >= ban_after and not banned))
            if ban and not banned:
                banned.append(peer)
            if page < 0 or page >= pages:
                status = 404
            elif ban:
                status = ban_status
            else:
                served[peer] = served.get(peer, 0) + 1
                status = 200
            with open(log_path, "a") as log:
                log.write(json.dumps({"time": time.time(), "peer": peer, "path": self.path, "status": status,
                                      "banned": ban}) + "\n")
        if ban:
            body = b"banned: solve this captcha\n"
        elif status == 200:
            links = "".join(f'<a href="/page/{c}">page {c}</a>\n' for c in (2 * page + 1, 2 * page + 2) if c < pages)
            body = f"<html><body><h1>page {page}</h1>\n{links}</body></html>\n".encode()
        else:
            body = b"not found\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/html" if status == 200 else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (ban_headers.items() if ban else ()):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True

Server((address, port), Site).serve_forever()
"""


class BanningSite(TargetServer):
    """The site, inside ``netns`` on an address of its own (a context manager): a TargetServer
    with the site's pages instead of the probe targets (it has no CONNECT port). Each of its
    ``requests()`` has ``time`` (epoch seconds), ``peer``, ``path``, ``status`` and ``banned``."""

    def __init__(self, netns: NetworkNamespace, pages: int, ban_after: int, delay: float = 0.0,
                 ban_status: int = 403, start_timeout: float = 20.0, ban_headers: Mapping[str, str] | None = None
                 ) -> None:
        super().__init__(netns, start_timeout)
        self.http_port = SITE_PORT
        self.pages = pages
        self.ban_after = ban_after
        self.delay = delay
        self.ban_status = ban_status
        self.ban_headers = dict(ban_headers or {})
        self._delay_file = Path()

    def set_delay(self, seconds: float) -> None:
        """How long each answer waits from now on."""
        self.delay = seconds
        partial = self._delay_file.with_suffix(".new")
        partial.write_text(str(seconds))
        partial.replace(self._delay_file)  # the server never reads half a number

    def start(self) -> None:
        self.address = self.netns.add_address()
        directory = self.netns.root / f"site-{self.address}"
        directory.mkdir()
        self._log = directory / "requests.jsonl"
        self._delay_file = directory / "delay"
        self.set_delay(self.delay)
        self._run([sys.executable, "-c", SITE_SERVER, self.address, str(self.http_port), str(self.pages),
                   str(self.ban_after), str(self.ban_status), str(self._delay_file), str(self._log),
                   json.dumps(self.ban_headers)],
                  directory / "site.out", lambda: tcp_port_accepts(self.address, self.http_port),
                  f"the site on {self.address}")
