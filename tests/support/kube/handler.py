# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API emulator's HTTP side: routes, injected faults and the request handler that
translates HTTP to the emulator's verbs.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import select
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlsplit

from support.kube.errors import ApiError, object_details
from support.kube.resources import Obj, ResourceType
from support.kube.selectors import Filter, parse_field_selector, parse_label_selector
from support.kube.watch import Watcher

if TYPE_CHECKING:
    from support.kube.emulator import KubeEmulator

LOG = logging.getLogger(__name__)

# How often an idle watch wakes up to notice a client that went away or a server stopping.
WATCH_POLL_SECONDS = 0.1


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    reason: str | None
    message: str
    retry_after: int | None


@dataclass(frozen=True)
class Route:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


class Handler(BaseHTTPRequestHandler):
    """Translates HTTP to the emulator's verbs; every error becomes a Status object."""

    protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, as the client expects
    # A real API server never waits on Nagle: without this every small request sits ~40 ms on a
    # delayed ACK (measured: 44 ms against 0.6 ms per GET).
    disable_nagle_algorithm = True
    server_version = "kube-emulator"

    @property
    def emulator(self) -> KubeEmulator:
        return cast("KubeEmulator", cast(Any, self.server).emulator)

    def setup(self) -> None:
        super().setup()
        with self.emulator._lock:
            self.emulator._connections.add(self.connection)

    def finish(self) -> None:
        with self.emulator._lock:
            self.emulator._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the client or stop() already closed the socket

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        emulator = self.emulator
        # Always consume the body first, so a keep-alive connection stays in step.
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = emulator._record(method, self.path)
        try:
            if fault is not None:
                headers = {}
                if fault.retry_after is not None:
                    headers["Retry-After"] = str(fault.retry_after)
                raise InjectedError(fault, headers)
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            route = emulator._route(url.path)
            if not isinstance(route, Route):
                if method != "GET":
                    raise ApiError(405, "the server does not allow this method on the "
                                        "requested resource")
                self._send_json(200, route)
                return
            self._serve(method, route, query, parse_json(raw))
        except InjectedError as exc:
            self._send_json(exc.code, exc.status(), exc.headers)
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except Exception as exc:  # an emulator bug answers 500, as a panic does on a real server
            LOG.exception("kube emulator failed on %s %s", method, self.path)
            self._send_json(500, ApiError(500, f"emulator bug: {exc!r}").status())

    def _serve(self, method: str, route: Route, query: dict[str, str], body: Any) -> None:
        emulator = self.emulator
        if method == "GET" and route.name is None:
            flt = Filter(route.rtype, route.namespace,
                          parse_label_selector(query.get("labelSelector", "")),
                          parse_field_selector(query.get("fieldSelector", "")))
            if query.get("watch", "").lower() in ("1", "true"):
                self._watch(flt, query)
            else:
                self._send_json(200, emulator._list(flt, query))
        elif route.subresource == "scale" and method in ("GET", "PUT", "PATCH"):
            self._send_json(200, emulator._scale(route, method, self.headers.get("Content-Type", ""), body))
        elif method == "GET":
            self._send_json(200, emulator._get(route))
        elif method == "POST":
            self._send_json(201, emulator._create(route, object_body(body)))
        elif route.name is None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        elif method == "PUT":
            self._send_json(200, emulator._update(route, object_body(body)))
        elif method == "PATCH":
            self._send_json(200, emulator._patch(route, self.headers.get("Content-Type", ""),
                                                body))
        elif route.subresource is not None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        else:  # DELETE
            # endpoints/handlers/delete.go: DeleteOptions come from the body when there is one,
            # else from the query string.
            options = body if isinstance(body, dict) and body else {}
            if not options and "gracePeriodSeconds" in query:
                if not query["gracePeriodSeconds"].lstrip("-").isdigit():
                    raise ApiError(400, f"invalid gracePeriodSeconds {query['gracePeriodSeconds']!r}")
                options = {"gracePeriodSeconds": int(query["gracePeriodSeconds"])}
            obj, deleted = emulator._delete(route, options)
            if deleted and not route.rtype.returns_deleted_object:
                obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                       "details": {**object_details(route.rtype, route.name),
                                   "uid": obj["metadata"]["uid"]}}
            self._send_json(200, obj)

    def _send_json(self, code: int, payload: Obj, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, flt: Filter, query: dict[str, str]) -> None:
        emulator = self.emulator
        timeout = query.get("timeoutSeconds")
        if timeout is not None and not timeout.isdigit():
            raise ApiError(400, f"invalid timeoutSeconds {timeout!r}")
        deadline = time.monotonic() + int(timeout) if timeout else None
        watcher, initial, error = emulator._open_watch(flt, query.get("resourceVersion"))
        self.close_connection = True  # a watch ends its connection, like a timed-out stream
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if error is not None:
                self._send_chunk({"type": "ERROR", "object": error})
            else:
                for etype, obj in initial:
                    self._send_chunk({"type": etype, "object": obj})
                for etype, obj in self._live_events(watcher, deadline):
                    self._send_chunk({"type": etype, "object": obj})
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            LOG.debug("watch client went away")
        finally:
            emulator._close_watch(watcher)

    def _live_events(self, watcher: Watcher, deadline: float | None) -> Iterator[tuple[str, Obj]]:
        """Events until the deadline, server stop, or the client closing its socket."""
        while not self.emulator._stopping.is_set():
            wait = WATCH_POLL_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            try:
                item = watcher.events.get(timeout=wait)
            except queue.Empty:
                if self._client_gone():
                    return
                continue
            if item is None:
                return
            yield item

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    def _send_chunk(self, payload: Obj) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


class InjectedError(ApiError):
    def __init__(self, fault: Fault, headers: dict[str, str]) -> None:
        super().__init__(fault.status, fault.message, fault.reason)
        self.headers = headers


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"request body is not JSON: {exc}") from exc


def object_body(body: Any) -> Obj:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body
