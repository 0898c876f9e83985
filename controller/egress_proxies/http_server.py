"""The controller's HTTP listeners: the discovery port (the kubelet's probes and the crawler
discovery endpoint) and, on a listener of its own, the metrics.

Started by ``cli`` next to ``loop.Controller``. Routes of the discovery port (``--listen``):

- ``/healthz`` and ``/readyz``: ``SweepHealth.alive()`` / ``ready()``, 200 ``ok`` or 503 with the
  reason. Unauthenticated, for the kubelet.
- ``/v1/pools/{namespace}/{name}/proxies[.txt]``: the same, for one ProxyPool's members, and
  ``/v1/namespaces/{namespace}/proxies[.txt]`` for one namespace; 403 for a token without it,
  404 ``no ProxyPool`` for a pool that does not exist (an empty list: it has no member ready).
- ``POST /v1/proxies/{namespace}/{name}/quarantine`` with ``{"reason": "..."}``: a crawler reports
  the proxy's current instance unusable (banned); it leaves discovery at once and is replaced
  (``sweep.quarantine.Quarantine``). Same tokens and scopes as discovery, rate-limited per token.
- ``/v1/proxies`` (JSON) and ``/v1/proxies.txt`` (``ip:port`` lines): the Ready proxies, for
  crawlers. Always behind ``Authorization: Bearer <DISCOVERY_TOKEN>``: the list is a map of
  egress addresses, so it is never served unauthenticated -- without a configured token the
  endpoint answers 503 rather than opening up. Every discovery answer carries an ``ETag`` (a hash
  of its body); a GET with a matching ``If-None-Match`` gets ``304 Not Modified`` without the body,
  so crawlers polling every few seconds fetch the list only when it changed.

The metrics listener (``--metrics-listen``; none unless asked for) serves ``/metrics``, the
Prometheus registry, unauthenticated, for scrapers, and nothing else; the discovery port has no
``/metrics`` (404): pool names and sizes per namespace are not for whoever reaches discovery
(issue 38 row 7). Each listener counts its own connections, so a flood on one never closes the
other.

An asyncio server on one thread, stdlib only: four routes do not justify a framework. A
client costs no thread while it sends its request, so a slow one (a byte a second) holds
nothing but its socket, and only until ``request_timeout`` cuts it off; at most
``max_connections`` are open at once (beyond, a new one is closed at once), and answers are
computed on a pool of ``workers`` threads. So slow or many clients never hold the probes
hostage, and nothing here ever waits on the sweep loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from egress_proxies.health import SweepHealth
from egress_proxies.http1 import MAX_HEAD_BYTES, MalformedHead, RequestHead, parse_request, read_head
from egress_proxies.resources.pool import pool_of
from egress_proxies.resources.proxy import NAMESPACE_RULE, Proxy, is_namespace_name
from egress_proxies.serving.discovery import DiscoveryView, proxy_entry
from egress_proxies.sources.store import StoreError
from egress_proxies.sweep.quarantine import QuarantineError, QuarantineOutcome

log = logging.getLogger(__name__)

TOKEN_ENV = "DISCOVERY_TOKEN"
DISABLED_MESSAGE = f"discovery endpoint disabled: set {TOKEN_ENV} to enable it\n"
_TEXT = "text/plain; charset=utf-8"
# Seconds a connection may take, from accept to the last byte of the answer: a request is a
# few hundred bytes, so a client still sending after this is too slow or hostile.
REQUEST_TIMEOUT = 5.0
# Open connections at once (each is a socket and a buffer, no thread): far above what the
# kubelet, a scraper and the crawlers need, far below the process's file limit.
MAX_CONNECTIONS = 256
# Threads computing answers (probes, metrics, discovery): all quick and in memory.
WORKERS = 4
# A quarantine's JSON body: a reason and nothing else.
_MAX_BODY = 4096
MAX_QUARANTINE_REASON = 512
# Quarantines a token may ask for per minute (--quarantine-rate): enough for a crawler that meets
# bans, far too few for a buggy one to recycle a pool.
QUARANTINE_PER_MINUTE = 10.0

Response = tuple[int, str, bytes, Mapping[str, str]]


def token_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """The discovery token, or None when unset or blank.

    Surrounding whitespace is dropped: a Secret written with ``echo`` ends in a newline that
    no crawler sends back.
    """
    token = environ.get(TOKEN_ENV, "").strip()
    return token or None


def warn_if_no_token(token: str | None, logger: logging.Logger) -> None:
    """Say loudly at startup that discovery is off; never logs the token itself."""
    if not token:
        logger.warning("!!! %s is not set: the crawler discovery endpoint (/v1/proxies) refuses every request "
                       "with 503 until it is. Create the Secret egress-proxies-discovery (key: token) and "
                       "restart the controller. !!!", TOKEN_ENV)


ALL_NAMESPACES = None  # the operator's token (DISCOVERY_TOKEN): every namespace, no credentials


# sha256 of the empty string: what hashing an unset shell variable gives. An entry holding it
# would make an empty bearer token a valid one.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
TOKEN_FIELDS = ("name", "sha256", "namespaces")
TOKENS_FORMAT = "a YAML list of entries {name, sha256, namespaces}"


class TokensFileError(Exception):
    """The discovery tokens file cannot be used as a whole; the message names every problem, and
    ``problems`` holds them apart (one a line in ``--check-config``)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems) or (message,)


@dataclass(frozen=True)
class TokenEntry:
    """One crawler token: who it is (for Events and logs) and the namespaces it sees."""

    name: str
    namespaces: frozenset[str]


def _entry_errors(entry: Any) -> list[str]:
    """What is wrong with one entry, field by field, each with the fix."""
    if not isinstance(entry, dict):
        return [f"must be a mapping {{{', '.join(TOKEN_FIELDS)}}}, not {type(entry).__name__}"]
    errors = [f"{key}: unknown field; allowed: {', '.join(TOKEN_FIELDS)}" for key in entry if key not in TOKEN_FIELDS]
    name, digest, namespaces = (entry.get(key) for key in TOKEN_FIELDS)
    if not isinstance(name, str) or not name.strip():
        errors.append("name: must be a non-empty string naming the token's holder (shown in Events)")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        errors.append("sha256: must be the 64 hex digits of the token's sha256 (printf %s \"$TOKEN\" | sha256sum)")
    elif digest.lower() == EMPTY_SHA256:
        errors.append("sha256: is the hash of an empty token (an unset variable was hashed): make a token "
                      "(openssl rand -hex 32) and hash that")
    if isinstance(namespaces, str):
        errors.append(f"namespaces: must be a list of namespace names, not the string {namespaces!r} "
                      f"(write [{namespaces}])")
    elif not isinstance(namespaces, list) or not namespaces:
        errors.append("namespaces: must be a non-empty list of namespace names, e.g. [crawlers]")
    else:
        errors += [f"namespaces[{i}]: {NAMESPACE_RULE} (got {n!r})" for i, n in enumerate(namespaces)
                   if not isinstance(n, str) or not is_namespace_name(n)]
    return errors


def parse_tokens(document: Any) -> tuple[dict[str, TokenEntry], list[str]]:
    """The usable entries of a tokens file, by sha256 (lower-case hex), and a problem per bad entry
    (``entry[i] (name): field: what it must be``). A bad entry is left out, never read leniently;
    so is every entry sharing its hash with another (which scope would it have?). A document that
    is not a list is one problem and no entries."""
    if not isinstance(document, list):
        return {}, [f"must be {TOKENS_FORMAT}, not {type(document).__name__}"]
    entries: dict[str, TokenEntry] = {}
    owners: dict[str, list[str]] = {}
    problems: list[str] = []
    for index, entry in enumerate(document):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"entry[{index}]" + (f" ({name})" if isinstance(name, str) and name.strip() else "")
        errors = _entry_errors(entry)
        if errors:
            problems += [f"{label}: {error}" for error in errors]
            continue
        digest = str(entry["sha256"]).lower()
        owners.setdefault(digest, []).append(label)
        entries[digest] = TokenEntry(str(entry["name"]), frozenset(entry["namespaces"]))
    for digest, labels in owners.items():
        if len(labels) > 1:
            problems.append(f"{', '.join(labels)}: sha256: the same token in {len(labels)} entries; give each its "
                            "own token (none of them is accepted meanwhile)")
            del entries[digest]
    return entries, problems


class TokenScopes:
    """Crawler tokens scoped to namespaces, from a YAML file (a mounted Secret in a cluster):
    ``[{name: team-a, sha256: <hex of the token>, namespaces: [crawlers-a]}]``. Only hashes are
    stored. ``check`` at start-up refuses a file with any problem (the controller does not start).
    The file is read again when it changes (a rotated Secret needs no restart); a change with
    problems is logged at ERROR, naming each, and fails closed: a bad entry is refused (never read
    leniently), the good ones stay in force, and a file that cannot be read or is not a list
    refuses every scoped token until it is fixed. No empty token is ever accepted."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: float | None = None
        self._entries: dict[bytes, TokenEntry] = {}
        self._lock = threading.Lock()

    def check(self) -> None:
        """Read the file now; raise ``TokensFileError`` naming every problem (start-up)."""
        if self.path is None:
            return
        entries, problems = self._read()
        if problems:
            raise TokensFileError(f"discovery tokens {self.path}: " + "; ".join(problems), problems)
        with self._lock:
            self._entries, self._stamp = entries, self._mtime()
        log.info("discovery tokens %s: %d scoped token(s)", self.path, len(entries))

    def scope(self, token: bytes) -> frozenset[str] | None:
        found = self._find(token)
        return found.namespaces if found is not None else None

    def name(self, token: bytes) -> str | None:
        """The token's entry name (who it is, for Events and logs; never the token)."""
        found = self._find(token)
        return f"token {found.name}" if found is not None else None

    def _find(self, token: bytes) -> TokenEntry | None:
        if self.path is None or not token:
            return None
        self._reload()
        digest = hashlib.sha256(token).hexdigest().encode()
        with self._lock:
            for known, entry in self._entries.items():
                if hmac.compare_digest(known, digest):
                    return entry
        return None

    def _mtime(self) -> float | None:
        assert self.path is not None
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    def _read(self) -> tuple[dict[bytes, TokenEntry], list[str]]:
        assert self.path is not None
        try:
            document = yaml.safe_load(self.path.read_text())
        except (OSError, UnicodeDecodeError) as error:
            return {}, [f"cannot be read ({getattr(error, 'strerror', None) or type(error).__name__})"]
        except yaml.YAMLError as error:
            # Never the YAML error's text: it quotes the file, which holds only hashes, but a
            # token pasted by mistake would be logged.
            return {}, [f"is not valid YAML ({type(error).__name__}); it must be {TOKENS_FORMAT}"]
        entries, problems = parse_tokens(document)
        return {digest.encode(): entry for digest, entry in entries.items()}, problems

    def _reload(self) -> None:
        stamp = self._mtime()
        if stamp == self._stamp:
            return
        entries, problems = self._read()
        if problems:
            log.error("discovery tokens %s changed and has problems (bad entries are refused, %d good one(s) in "
                      "force): %s", self.path, len(entries), "; ".join(problems))
        with self._lock:
            self._entries, self._stamp = entries, stamp


@dataclass(frozen=True)
class ServerSettings:
    """How much the server takes on: see the constants above. ``registry``: the metrics served."""

    registry: CollectorRegistry = REGISTRY
    request_timeout: float = REQUEST_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    workers: int = WORKERS
    quarantine_per_minute: float = QUARANTINE_PER_MINUTE


@dataclass(frozen=True)
class DiscoveryAccess:
    """Who may use discovery and the quarantine route. ``token``: the operator's (every namespace;
    None: only scoped tokens, or discovery off); ``scopes``: the crawlers' tokens; ``proxy_url``:
    the crawler's URL of a proxy, credentials included, only ever served to a scoped token;
    ``quarantine``: ``quarantine.Quarantine`` (None: the route answers 503)."""

    token: str | None
    scopes: TokenScopes = field(default_factory=lambda: TokenScopes(None))
    proxy_url: Callable[[Proxy], str | None] | None = None
    quarantine: Callable[[str, str, str, str], QuarantineOutcome] | None = None


class ControllerHTTPServer:
    """Serves the routes above from a daemon thread; ``start()``, ``port``, ``stop()``.

    ``discovery`` is only read: what it hands out at the time of each discovery request
    (``DiscoveryView.handed_out``), from a worker thread.
    """

    def __init__(self, health: SweepHealth, discovery: DiscoveryView, access: DiscoveryAccess,
                 settings: ServerSettings | None = None) -> None:
        settings = settings or ServerSettings()
        self.health = health
        self.discovery = discovery
        self.quarantine = access.quarantine
        self.quarantine_per_minute = settings.quarantine_per_minute
        self._buckets: dict[bytes, _Bucket] = {}
        self._bucket_lock = threading.Lock()
        self.token_scopes = access.scopes
        self.proxy_url = access.proxy_url
        self.registry = settings.registry
        self.request_timeout = settings.request_timeout
        self.max_connections = settings.max_connections
        # Bytes, so compare_digest also works on a header with non-ASCII characters (str would raise).
        self._token = access.token.encode() if access.token else None
        self._workers = settings.workers
        self._listeners: list[_Listener] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def discovery_enabled(self) -> bool:
        return self._token is not None or self.token_scopes.path is not None

    def authorized(self, header: str | None) -> bool:
        """Whether an Authorization header carries the operator's token (constant-time comparison)."""
        token = _bearer(header)
        return token is not None and self._token is not None and hmac.compare_digest(token, self._token)

    def scope(self, header: str | None) -> tuple[bool, frozenset[str] | None]:
        """(authorized, namespaces): the operator's token sees every namespace (None); a scoped
        token only its own."""
        if self.authorized(header):
            return True, ALL_NAMESPACES
        token = _bearer(header)
        namespaces = self.token_scopes.scope(token) if token is not None else None
        return namespaces is not None, namespaces

    def start(self, host: str, port: int, metrics: tuple[str, int] | None = None) -> None:
        """Listen on host:port for discovery and, with ``metrics`` (host, port), there for
        /metrics (port 0: any free port, see ``port`` and ``metrics_port``); serve from a daemon
        thread. The sockets are bound here, so a taken port or a bad address raises in the caller."""
        if self._listeners:
            raise RuntimeError("already started")
        self._listeners.append(_Listener(_bound(host, port), metrics=False))
        if metrics is not None:
            try:
                self._listeners.append(_Listener(_bound(*metrics), metrics=True))
            except OSError:
                self._listeners.pop().socket.close()
                raise
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve_forever, args=(ready,), name="http", daemon=True)
        self._thread.start()
        ready.wait()
        log.debug("HTTP server on %s:%d (/healthz /readyz /v1/...)", host, self.port)

    @property
    def port(self) -> int:
        """The discovery port."""
        if not self._listeners:
            raise RuntimeError("not started")
        return int(self._listeners[0].socket.getsockname()[1])

    @property
    def metrics_port(self) -> int:
        """The metrics listener's port."""
        if len(self._listeners) < 2:
            raise RuntimeError("no metrics listener started")
        return int(self._listeners[1].socket.getsockname()[1])

    def stop(self) -> None:
        if not self._listeners or self._loop is None:
            return
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=5)
        for listener in self._listeners:
            listener.socket.close()
        self._listeners = []
        self._thread = None
        self._loop = None

    # -- the event loop's thread ---------------------------------------------------------------

    def _serve_forever(self, ready: threading.Event) -> None:
        assert self._loop is not None and self._listeners  # set by start()
        loop = self._loop
        asyncio.set_event_loop(loop)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="http-worker")
        loop.set_default_executor(pool)
        try:
            loop.run_until_complete(self._serve(ready))
        except Exception:
            log.exception("the HTTP server stopped")
            raise
        finally:
            ready.set()  # start() must not wait forever for a server that failed to start
            pool.shutdown(wait=False, cancel_futures=True)
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        servers = [await asyncio.start_server(functools.partial(self._connection, listener), sock=listener.socket,
                                              limit=MAX_HEAD_BYTES) for listener in self._listeners]
        ready.set()
        async with contextlib.AsyncExitStack() as serving:
            for server in servers:
                await serving.enter_async_context(server)
            await self._stopped.wait()
        # Connections still open (slow clients) end with the server.
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _connection(self, listener: _Listener, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?",)
        if listener.open >= self.max_connections:
            # Closed without a word: answering would cost the very time and buffers this
            # bound protects, and a well-behaved client retries.
            log.warning("HTTP: %d connections open, closing one from %s", listener.open, peer[0])
            writer.transport.abort()
            return
        listener.open += 1
        finished = False
        try:
            async with asyncio.timeout(self.request_timeout):
                if listener.metrics:
                    await self._metrics_exchange(reader, writer)
                else:
                    await self._exchange(reader, writer, str(peer[0]))
            finished = True
        except TimeoutError:
            log.info("HTTP: connection from %s cut off after %.0f s (too slow)", peer[0], self.request_timeout)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            listener.open -= 1
            if finished:
                writer.close()  # the answer is sent (drained): a clean close
            else:
                # Nothing left to say, and a client that does not read would keep a closing
                # transport (and its buffer) open: drop it.
                writer.transport.abort()

    async def _metrics_exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await self._request(reader, writer)
        if request is None:
            return
        if request.method != "GET":
            response: Response = (501, _TEXT, b"only GET /metrics is served here\n", {"Allow": "GET"})
        elif urlsplit(request.target).path != "/metrics":
            response = (404, _TEXT, b"not found (only /metrics is served here)\n", {})
        else:
            response = await asyncio.get_running_loop().run_in_executor(
                None, lambda: (200, CONTENT_TYPE_LATEST, generate_latest(self.registry), {}))
        await self._write(writer, response)

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RequestHead | None:
        """The request's head, or None once a 431 or 400 is answered for it."""
        try:
            return parse_request(await read_head(reader))
        except asyncio.LimitOverrunError:
            await self._write(writer, (431, _TEXT, b"request header too large\n", {}))
        except MalformedHead:
            await self._write(writer, (400, _TEXT, b"bad request\n", {}))
        return None

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        request = await self._request(reader, writer)
        if request is None:
            return
        method, target, headers = request.method, request.target, request.headers
        loop = asyncio.get_running_loop()
        if method == "POST" and _is_quarantine(urlsplit(target).path):
            length = headers.get("content-length") or "0"
            if not length.isdigit() or int(length) > _MAX_BODY:
                response: Response = (413, _TEXT, f"a body of at most {_MAX_BODY} bytes\n".encode(), {})
            else:
                body = await reader.readexactly(int(length))
                response = await loop.run_in_executor(None, self._respond_post, urlsplit(target).path,
                                                      headers.get("authorization"), peer, body)
        elif method != "GET":
            response = (501, _TEXT, b"only GET is served here (POST only to .../quarantine)\n", {"Allow": "GET"})
        else:
            response = await loop.run_in_executor(None, self._respond, urlsplit(target).path,
                                                  headers.get("authorization"), peer)
            response = _not_modified(response, headers.get("if-none-match"))
        # The path only, never the query string: a client may put anything there (a token pasted
        # into a URL by mistake), and only the Authorization header is ever read for one.
        log.debug('%s "%s %s" %d', peer, method, urlsplit(target).path, response[0])
        await self._write(writer, response)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response) -> None:
        code, content_type, body, extra = response
        # A 304 has no content, and its Content-Length would have to be the 200's (RFC 9110, 8.6).
        content = [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"] if code != 304 else []
        lines = [f"HTTP/1.1 {code} {HTTPStatus(code).phrase}", "Server: egress-proxies",
                 f"Date: {email.utils.formatdate(usegmt=True)}", *content,
                 # Discovery answers are per-client secrets and probes must never be answered by a cache.
                 "Cache-Control: no-store", "Connection: close",
                 *(f"{name}: {value}" for name, value in extra.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()

    # -- worker threads ------------------------------------------------------------------------

    def _respond(self, path: str, authorization: str | None, peer: str) -> Response:
        if path == "/healthz":
            return _probe(*self.health.alive())
        if path == "/readyz":
            return _probe(*self.health.ready())
        if path in ("/v1/proxies", "/v1/proxies.txt"):
            return self._discovery(authorization, peer, as_text=path.endswith(".txt"))
        parts = path.split("/")
        if len(parts) == 6 and parts[:3] == ["", "v1", "pools"] and parts[5] in ("proxies", "proxies.txt"):
            return self._discovery(authorization, peer, as_text=parts[5].endswith(".txt"), within=(parts[3], parts[4]))
        if len(parts) == 5 and parts[:3] == ["", "v1", "namespaces"] and parts[4] in ("proxies", "proxies.txt"):
            return self._discovery(authorization, peer, as_text=parts[4].endswith(".txt"), within=(parts[3], None))
        if path.endswith("/quarantine") and path.startswith("/v1/proxies/"):
            return 405, _TEXT, b"POST a JSON body {\"reason\": \"...\"}\n", {"Allow": "POST"}
        return 404, _TEXT, b"not found\n", {}

    def _refused(self, header: str | None, peer: str, what: str) -> Response:
        challenge = 'Bearer realm="egress-proxies"'
        if header is not None:
            challenge += ', error="invalid_token"'
        log.info("%s request from %s refused: %s", what, peer, "wrong token" if header is not None else "no token")
        return 401, _TEXT, b"unauthorized\n", {"WWW-Authenticate": challenge}

    def _discovery(self, header: str | None, peer: str, as_text: bool,
                   within: tuple[str, str | None] | None = None) -> Response:
        """The Ready proxies the token may see; ``within``: (namespace, pool name or None for the
        whole namespace)."""
        if not self.discovery_enabled:
            return 503, _TEXT, DISABLED_MESSAGE.encode(), {}
        authorized, namespaces = self.scope(header)
        if not authorized:
            return self._refused(header, peer, "discovery")
        if within is not None and namespaces is not None and within[0] not in namespaces:
            return 403, _TEXT, f"this token does not cover namespace {within[0]}\n".encode(), {}
        # "No such pool" told apart from "no member ready" (an empty list): a mistyped pool fails
        # the crawler at once instead of draining its queue (issue 41). After the 403: a token
        # learns nothing of a namespace it does not cover.
        if within is not None and within[1] is not None and not self.discovery.knows_pool(within[0], within[1]):
            return 404, _TEXT, f"no ProxyPool {within[0]}/{within[1]}\n".encode(), {}
        proxies = sorted((p for p in self.discovery.handed_out()
                          if (namespaces is None or p.namespace in namespaces)
                          and (within is None or (p.namespace == within[0] and within[1] in (None, pool_of(p))))),
                         key=lambda p: (p.namespace, p.name))
        entries = [proxy_entry(proxy) for proxy in proxies]
        if namespaces is not None and self.proxy_url is not None:
            for entry, proxy in zip(entries, proxies, strict=True):
                entry["url"] = self.proxy_url(proxy)
        if as_text:
            lines = [entry.get("url") or f"{entry['ip']}:{entry['port']}" for entry in entries if entry["ip"]]
            body, content_type = "".join(f"{line}\n" for line in lines).encode(), _TEXT
        else:
            body, content_type = json.dumps({"proxies": entries}).encode(), "application/json"
        return 200, content_type, body, {"ETag": f'"{hashlib.sha256(body).hexdigest()[:32]}"'}


    def _respond_post(self, path: str, authorization: str | None, peer: str, body: bytes) -> Response:
        _, _, _, namespace, name, _ = path.split("/")
        if self.quarantine is None or not self.discovery_enabled:
            return 503, _TEXT, b"quarantine is not enabled on this controller\n", {}
        authorized, namespaces = self.scope(authorization)
        token = _bearer(authorization)
        if not authorized or token is None:
            return self._refused(authorization, peer, "quarantine")
        if namespaces is not None and namespace not in namespaces:
            return 403, _TEXT, f"this token does not cover namespace {namespace}\n".encode(), {}
        try:
            document = json.loads(body or b"null")
        except ValueError:
            document = None
        reason = document.get("reason") if isinstance(document, dict) else None
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_QUARANTINE_REASON:
            return 400, _TEXT, (f'the body must be JSON {{"reason": "..."}} with a reason of 1-{MAX_QUARANTINE_REASON} '
                                "characters\n").encode(), {}
        wait = self._take(token)
        if wait > 0:
            log.warning("quarantine request from %s for %s/%s refused: rate limit (%g per minute per token)", peer,
                        namespace, name, self.quarantine_per_minute)
            return 429, _TEXT, (f"at most {self.quarantine_per_minute:g} quarantines per minute per token; retry "
                                f"in {wait} s\n").encode(), {"Retry-After": str(wait)}
        who = "the operator token" if namespaces is None else (self.token_scopes.name(token) or "a crawler token")
        try:
            outcome = self.quarantine(namespace, name, " ".join(reason.split()), who)
        except QuarantineError as error:
            return error.status, _TEXT, f"{error}\n".encode(), {}
        except StoreError as error:
            log.warning("quarantine of %s/%s failed: %s", namespace, name, error)
            return 503, _TEXT, b"the Proxy could not be updated; try again\n", {}
        return 200, "application/json", json.dumps(outcome.answer()).encode(), {}

    def _take(self, token: bytes) -> int:
        """One quarantine from this token's bucket: 0, or the seconds to wait (Retry-After)."""
        key = hashlib.sha256(token).digest()
        with self._bucket_lock:
            bucket = self._buckets.setdefault(key, _Bucket(self.quarantine_per_minute))
            return bucket.take()


@dataclass
class _Listener:
    """One listening socket and what it serves: discovery (and the kubelet's probes), or metrics."""

    socket: socket.socket
    metrics: bool
    open: int = 0  # connections open now; only touched on the event loop's thread


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


class _Bucket:
    """A token bucket: ``per_minute`` at once, refilled continuously at ``per_minute`` a minute."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = max(1.0, per_minute)
        self.rate = per_minute / 60.0
        self.tokens = self.capacity
        self.clock = clock
        self.stamp = clock()

    def take(self) -> int:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0
        return max(1, math.ceil((1 - self.tokens) / self.rate)) if self.rate > 0 else 3600


def _not_modified(response: Response, if_none_match: str | None) -> Response:
    """304 for a GET whose ``If-None-Match`` names the answer's ETag (weak comparison, ``*`` matching
    any, RFC 9110, 13.1.2); any other answer as it is."""
    code, content_type, _, extra = response
    etag = extra.get("ETag")
    if code != 200 or etag is None or if_none_match is None:
        return response
    candidates = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    if etag in candidates or "*" in candidates:
        return 304, content_type, b"", extra
    return response


def _is_quarantine(path: str) -> bool:
    """``/v1/proxies/{namespace}/{name}/quarantine``: the one route that takes a POST."""
    parts = path.split("/")
    return len(parts) == 6 and parts[:3] == ["", "v1", "proxies"] and all(parts[3:5]) and parts[5] == "quarantine"


def _bearer(header: str | None) -> bytes | None:
    if header is None:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    # Headers are decoded as latin-1; surrogateescape keeps any byte comparable. No token at all
    # (``Bearer `` alone) is no token, whatever any configured hash says.
    return credentials.strip().encode("utf-8", "surrogateescape") or None


def _probe(ok: bool, reason: str) -> Response:
    if ok:
        return 200, _TEXT, b"ok\n", {}
    return 503, _TEXT, f"{reason}\n".encode(), {}
