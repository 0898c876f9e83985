"""A small Compute Engine REST emulator on 127.0.0.1 for the GCP provider's tests.

It speaks the paths google-cloud-compute's REST transport uses for what the provider
calls, with the API's JSON shapes:

- ``/compute/v1/projects/{p}/zones/{z}/instances``: POST insert, GET list (``filter``);
- ``/compute/v1/projects/{p}/zones/{z}/instances/{name}``: GET, DELETE;
- ``/compute/v1/projects/{p}/zones/{z}/operations/{op}``: GET, and ``.../wait``: POST;
- ``/compute/v1/projects/{p}/aggregated/instances``: GET with ``filter``; ``items`` keyed
  ``zones/<zone>``, empty zones carrying the ``NO_RESULTS_ON_PAGE`` warning and unreachable
  ones ``UNREACHABLE`` (plus the ``unreachables`` list when ``returnPartialSuccess=true``).

Insert and delete return ``Operation`` objects that finish when they are next polled
(get or wait): an inserted instance goes PROVISIONING -> RUNNING and gets its NAT IP
then; a deleted one goes STOPPING -> gone. Errors use the API's body
``{"error": {"code", "message", "errors": [{"reason", "message", "domain"}]}}``.

Filters accept what the provider sends, ``(labels.KEY = "VALUE")`` and ``(name = "VALUE")``
clauses ANDed; anything else is a 400, so a change in what the provider sends shows up.
Faults: ``fail_next(method, path_regex, status, count)`` answers the next matching
requests with that status; ``fail_next_operation`` makes the next insert's operation
finish with an error; ``set_unreachable`` and ``retire_zone`` change a zone. Every
request is recorded in ``requests``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API = "https://www.googleapis.com/compute/v1"
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
FILTER_CLAUSE_RE = re.compile(r'\s*\(\s*(name|labels\.[a-z][a-z0-9_-]*)\s*=\s*"([^"]*)"\s*\)\s*')
METADATA_VALUE_LIMIT = 256 * 1024
REASONS = {400: "invalid", 403: "forbidden", 404: "notFound", 409: "alreadyExists", 429: "rateLimitExceeded",
           500: "backendError", 503: "backendError"}
STATUS_TEXT = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 429: "TOO MANY REQUESTS",
               500: "INTERNAL SERVER ERROR", 503: "SERVICE UNAVAILABLE"}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    status: int
    remaining: int


@dataclass
class _OperationFault:
    code: str
    message: str
    http_status: int


@dataclass
class _Operation:
    body: dict[str, Any]
    zone: str
    kind: str  # insert | delete
    instance: str
    fault: _OperationFault | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or REASONS.get(status, "error")

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


@dataclass
class ComputeEmulator:
    project: str = "test-project"
    zones: tuple[str, ...] = ("europe-west1-b", "europe-west4-a", "us-central1-a")
    requests: list[RecordedRequest] = field(default_factory=list)
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._operation_faults: list[_OperationFault] = []
        self._operations: dict[tuple[str, str], _Operation] = {}
        self._unreachable: set[str] = set()
        self._retired: set[str] = set()
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ComputeEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # As a real API front end: no ~40 ms delayed-ACK wait on every small request.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body = emulator.handle(self.command, self.path, raw)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, and every test stops one.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "use the emulator as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- test controls ---------------------------------------------------------------------

    def fail_next(self, method: str, path_regex: str, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests whose method and path match with ``status``."""
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_regex), status, count))

    def clear_faults(self) -> None:
        """The outage is over: no injected fault answers any more."""
        with self._lock:
            self._faults.clear()
            self._operation_faults.clear()

    def fail_next_operation(self, code: str, message: str, http_status: int) -> None:
        """The next insert is accepted, but its operation finishes DONE with this error (no instance)."""
        with self._lock:
            self._operation_faults.append(_OperationFault(code, message, http_status))

    def set_unreachable(self, zone: str) -> None:
        with self._lock:
            self._unreachable.add(zone)

    def retire_zone(self, zone: str) -> None:
        """The zone no longer exists: every path under it answers 404."""
        with self._lock:
            self._retired.add(zone)

    def add_instance(self, zone: str, name: str, labels: dict[str, str] | None = None,
                     metadata: dict[str, str] | None = None, status: str = "RUNNING") -> dict[str, Any]:
        """An instance made behind the provider's back (another owner, or not ours at all)."""
        body = {"name": name, "machineType": f"zones/{zone}/machineTypes/e2-small", "labels": labels or {},
                "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
                "networkInterfaces": [{"network": "global/networks/default"}],
                "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/x/global/images/y"}}]}
        with self._lock:
            instance = self._new_instance(zone, body)
            instance["status"] = status
            self.instances[(zone, name)] = instance
        return instance

    def metadata(self, zone: str, name: str) -> dict[str, str]:
        items = self.instances[(zone, name)].get("metadata", {}).get("items", [])
        return {item["key"]: item["value"] for item in items}

    def requests_to(self, method: str, path_regex: str) -> list[RecordedRequest]:
        pattern = re.compile(path_regex)
        return [r for r in self.requests if r.method == method and pattern.search(r.path)]

    # -- dispatch --------------------------------------------------------------------------

    def handle(self, method: str, target: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        with self._lock:
            self.requests.append(RecordedRequest(method, parts.path, query, body))
            try:
                self._injected_fault(method, parts.path)
                return 200, self._route(method, parts.path, query, body)
            except ApiError as error:
                return error.status, error.body()

    def _injected_fault(self, method: str, path: str) -> None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.method == method and fault.path.search(path):
                fault.remaining -= 1
                raise ApiError(fault.status, f"injected fault: {fault.status} for {method} {path}")

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> dict[str, Any]:
        match = re.fullmatch(r"/compute/v1/projects/([^/]+)/(.*)", path)
        if match is None:
            raise ApiError(404, f"Not Found: {path}")
        project, rest = match.groups()
        if project != self.project:
            raise ApiError(404, f"The resource 'projects/{project}' was not found")
        if rest == "aggregated/instances" and method == "GET":
            return self._aggregated(query)
        match = re.fullmatch(r"zones/([^/]+)/(instances|operations)(?:/([^/]+))?(/wait)?", rest)
        if match is None:
            raise ApiError(404, f"Not Found: {path}")
        zone, collection, name, wait = match.groups()
        if zone not in self.zones or zone in self._retired:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}' was not found")
        if collection == "operations" and name and ((method == "GET" and not wait) or (method == "POST" and wait)):
            return self._poll(zone, name)
        if collection == "instances" and name is None:
            if method == "POST":
                return self._insert(zone, body)
            if method == "GET":
                instances = self._matching(zone, self._parse_filter(query))
                return {"kind": "compute#instanceList", "items": instances} if instances else {
                    "kind": "compute#instanceList"}
        if collection == "instances" and name:
            if method == "GET":
                return self._instance(zone, name)
            if method == "DELETE":
                instance = self._instance(zone, name)
                instance["status"] = "STOPPING"
                return self._start_operation(zone, "delete", name)
        raise ApiError(405, f"Method {method} not allowed on {path}", "methodNotAllowed")

    # -- instances -------------------------------------------------------------------------

    def _instance(self, zone: str, name: str) -> dict[str, Any]:
        instance = self.instances.get((zone, name))
        if instance is None:
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
        return instance

    def _new_instance(self, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        nics = []
        for index, nic in enumerate(body.get("networkInterfaces", [])):
            nics.append({**nic, "name": f"nic{index}", "networkIP": "10.128.{}.{}".format(*divmod(number, 250)),
                         "accessConfigs": [dict(access) for access in nic.get("accessConfigs", [])]})
        offset = datetime.timezone(datetime.timedelta(hours=-7))
        return {
            **body, "kind": "compute#instance", "id": str(number), "status": "PROVISIONING",
            "zone": f"{API}/projects/{self.project}/zones/{zone}", "networkInterfaces": nics,
            "creationTimestamp": datetime.datetime.now(offset).isoformat(timespec="milliseconds"),
            "selfLink": f"{API}/projects/{self.project}/zones/{zone}/instances/{body['name']}",
            "metadata": {"kind": "compute#metadata", "fingerprint": "emulated", **body.get("metadata", {})},
        }

    def _insert(self, zone: str, body: Any) -> dict[str, Any]:
        self._validate_insert(body)
        name = body["name"]
        if (zone, name) in self.instances:
            raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        self.instances[(zone, name)] = self._new_instance(zone, body)
        return self._start_operation(zone, "insert", name)

    def _validate_insert(self, body: Any) -> None:
        if not isinstance(body, dict) or not NAME_RE.fullmatch(str(body.get("name", ""))):
            raise ApiError(400, "Invalid value for field 'resource.name'")
        if "/machineTypes/" not in str(body.get("machineType", "")):
            raise ApiError(400, "Invalid value for field 'resource.machineType'")
        disks = body.get("disks") or [{}]
        if not disks[0].get("boot") or not disks[0].get("initializeParams", {}).get("sourceImage"):
            raise ApiError(400, "Invalid value for field 'resource.disks[0]': a boot disk with a sourceImage")
        nics = body.get("networkInterfaces") or [{}]
        if not nics[0].get("network"):
            raise ApiError(400, "Invalid value for field 'resource.networkInterfaces[0].network'")
        for key, value in body.get("labels", {}).items():
            if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
                raise ApiError(400, f"Invalid value for field 'resource.labels': {key!r}: {value!r}")
        for item in body.get("metadata", {}).get("items", []):
            if len(item.get("value", "").encode()) > METADATA_VALUE_LIMIT:
                raise ApiError(400, f"Invalid value for field 'resource.metadata': {item['key']} is too long")

    def _matching(self, zone: str, clauses: list[tuple[str, str]]) -> list[dict[str, Any]]:
        found = []
        for (where, _), instance in sorted(self.instances.items()):
            if where != zone:
                continue
            values = {"name": instance["name"], **{"labels." + k: v for k, v in instance.get("labels", {}).items()}}
            if all(values.get(key) == value for key, value in clauses):
                found.append(instance)
        return found

    @staticmethod
    def _parse_filter(query: dict[str, list[str]]) -> list[tuple[str, str]]:
        text = query.get("filter", [""])[0]
        clauses: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            match = FILTER_CLAUSE_RE.match(text, position)
            if match is None:
                raise ApiError(400, f"Invalid value for field 'filter': {text!r}")
            clauses.append((match.group(1), match.group(2)))
            position = match.end()
        return clauses

    def _aggregated(self, query: dict[str, list[str]]) -> dict[str, Any]:
        clauses = self._parse_filter(query)
        unreachable = sorted(z for z in self._unreachable if z in self.zones and z not in self._retired)
        items: dict[str, Any] = {}
        for zone in self.zones:
            if zone in self._retired:
                continue
            scope = f"zones/{zone}"
            found = self._matching(zone, clauses)
            if zone in unreachable:
                items[scope] = {"warning": {"code": "UNREACHABLE", "message": f"Scope {scope} is unreachable.",
                                            "data": [{"key": "scope", "value": scope}]}}
            elif found:
                items[scope] = {"instances": found}
            else:
                items[scope] = {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                            "message": f"There are no results for scope '{scope}' on this page.",
                                            "data": [{"key": "scope", "value": scope}]}}
        result = {"kind": "compute#instanceAggregatedList", "id": f"projects/{self.project}/aggregated/instances",
                  "items": items, "selfLink": f"{API}/projects/{self.project}/aggregated/instances"}
        if unreachable and query.get("returnPartialSuccess", ["false"])[0] == "true":
            result["unreachables"] = [f"zones/{zone}" for zone in unreachable]
        return result

    # -- operations ------------------------------------------------------------------------

    def _start_operation(self, zone: str, kind: str, instance: str) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        body = {
            "kind": "compute#operation", "id": name.split("-")[1], "name": name, "operationType": kind,
            "zone": f"{API}/projects/{self.project}/zones/{zone}", "status": "RUNNING", "progress": 0,
            "targetLink": f"{API}/projects/{self.project}/zones/{zone}/instances/{instance}",
            "selfLink": f"{API}/projects/{self.project}/zones/{zone}/operations/{name}",
        }
        fault = self._operation_faults.pop(0) if kind == "insert" and self._operation_faults else None
        self._operations[(zone, name)] = _Operation(body, zone, kind, instance, fault)
        return dict(body)

    def _poll(self, zone: str, name: str) -> dict[str, Any]:
        operation = self._operations.get((zone, name))
        if operation is None:
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/operations/{name}' was not found")
        if operation.body["status"] != "DONE":
            self._finish(operation)
        return dict(operation.body)

    def _finish(self, operation: _Operation) -> None:
        key = (operation.zone, operation.instance)
        operation.body.update(status="DONE", progress=100)
        if operation.fault is not None:
            self.instances.pop(key, None)
            operation.body.update(
                error={"errors": [{"code": operation.fault.code, "message": operation.fault.message}]},
                httpErrorStatusCode=operation.fault.http_status,
                httpErrorMessage=STATUS_TEXT.get(operation.fault.http_status, "ERROR"))
        elif operation.kind == "insert" and key in self.instances:
            instance = self.instances[key]
            instance["status"] = "RUNNING"
            for nic in instance["networkInterfaces"]:
                for access in nic["accessConfigs"]:
                    if access.get("type") == "ONE_TO_ONE_NAT":
                        access["natIP"] = f"203.0.113.{int(instance['id']) % 250}"
        elif operation.kind == "delete":
            self.instances.pop(key, None)

    def zones_of(self, name: str) -> list[str]:
        """The zones holding an instance of that name."""
        return sorted(zone for zone, found in self.instances if found == name)
