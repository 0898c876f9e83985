"""A Compute Engine REST emulator on 127.0.0.1 for the GCP provider's tests.

It speaks the paths google-cloud-compute's REST transport uses for what the provider
calls, with the API's JSON shapes, and enforces the API's rules where the provider could
get them wrong. Each rule cites its source in docs/gcp-provider.md ("Validated against")
and has a contract test in tests/contract/test_compute_emulator.py:

- ``/compute/v1/projects/{p}/zones/{z}/instances``: POST insert, GET list (``filter``,
  ``maxResults``/``pageToken`` paging: at most 500 a page, opaque tokens valid only with the
  request's other parameters unchanged, each page going on after the last name of the one before);
- ``/compute/v1/projects/{p}/zones/{z}/instances/{name}``: GET, DELETE;
- ``/compute/v1/projects/{p}/zones/{z}/operations/{op}``: GET, and ``.../wait``: POST, which
  holds the call until the operation is DONE or ``wait_hold_seconds`` (the real API: 2
  minutes) have passed;
- ``/compute/v1/projects/{p}/aggregated/instances``: GET with ``filter`` and paging; ``items``
  keyed ``zones/<zone>``, zones without results on the page carrying ``NO_RESULTS_ON_PAGE``.
  An unreachable zone fails the whole call (503) unless ``returnPartialSuccess=true``, which
  then lists it in ``unreachables`` with an ``UNREACHABLE`` scope warning;
- ``/compute/v1/projects/{p}/global/firewalls[/{name}]``: POST insert (409 for a name taken),
  GET, PATCH (the fields given replace the stored ones), DELETE, GET list; each write is a
  global operation, ``.../global/operations/{op}`` GET and ``/wait`` POST.

The rules: a zone that does not exist is a 400 ``invalid`` ("Unknown zone"); an insert
referencing a missing image, network or subnetwork is answered 404 synchronously, a machine
type the zone lacks 400 ``invalid`` ("Machine type with name ... does not exist in zone ...");
a machine type must be of the instance's zone; a custom-mode network needs a subnetwork of the
instance's region; at most 64 labels and 64 network tags (RFC 1035); metadata keys
``[a-zA-Z0-9-_]+`` under 128 bytes, values at most 256 KiB, all of it under 512 KiB; deleting
an instance with an operation in flight is a 400 ``resourceNotReady``; a zone out of stock
(``stock_out``) accepts inserts whose operations fail with ``ZONE_RESOURCE_POOL_EXHAUSTED``;
quotas (``set_quota``): CPUs fail the insert's operation with ``QUOTA_EXCEEDED``, in-use
addresses the insert itself (403 ``quotaExceeded``); a bearer token listed in
``token_scopes`` without a Compute scope gets 403 "insufficient authentication scopes";
``wait_returns_early`` answers waits at once, as an overloaded server may; ``quota_wording``
words quota errors the older way (limit and region in the message) or the newer one (the quota
only), the operation's ``errorDetails[].quotaInfo`` saying where either way. Images run at boot
what their family runs (``ImageKind``, ``boot``), and an instance has a way out (``BootReport.egress``)
only through its external address or a Cloud NAT of its region (``add_cloud_nat``, listed by
``/aggregated/routers``). VPC firewall rules (firewall.py) decide ``reachable``, the path a
crawler or the controller's probe takes to an instance's external address and port, which no
address the internet does not route ever takes (``UNROUTED_SOURCES``). With
``external_addresses``/``internal_addresses`` (a test's own) and ``network_view``,
tests/support/compute/guests.py runs the instances for real.

Operations finish ``operation_seconds`` after they start (0: at the next request). An
inserted instance goes PROVISIONING -> RUNNING and gets its NAT IP then; a deleted one goes
STOPPING -> gone. Errors use the API's body ``{"error": {"code", "message", "errors":
[{"reason", "message", "domain"}]}}``. Filters accept what the provider sends,
``(labels.KEY = "VALUE")`` and ``(name = "VALUE")`` clauses ANDed; anything else is a 400, so
a change in what the provider sends shows up. Faults: ``fail_next(method, path_regex,
status, count, reason)``; ``fail_next_operation``; ``set_unreachable``, ``retire_zone``,
``stock_out``. Every request is recorded in ``requests`` (with its headers).
With ``ssl_context`` it serves HTTPS (the credentials tests need a non-loopback-HTTP
endpoint so that the client sends a real token).
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import re
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from support.compute.firewall import FirewallError, admits, default_network_rules, validate_rule

API = "https://www.googleapis.com/compute/v1"
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
FILTER_CLAUSE_RE = re.compile(r'\s*\(\s*(name|labels\.[a-z][a-z0-9_-]*)\s*=\s*"([^"]*)"\s*\)\s*')
METADATA_KEY_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
METADATA_KEY_LIMIT = 128  # bytes, "less than 128 bytes in length"
METADATA_VALUE_LIMIT = 256 * 1024  # "less than or equal to 262144 bytes"
METADATA_TOTAL_LIMIT = 512 * 1024  # "The total size of all keys and values must be less than 512 KB"
LABEL_COUNT_LIMIT = 64
MAX_RESULTS_LIMIT = 500  # "Acceptable values are 0 to 500, inclusive. (Default: 500)"
WAIT_HOLD_SECONDS = 120.0  # zoneOperations.wait: "waits for no more than the 2 minutes"


@dataclass(frozen=True)
class ImageKind:
    """What an image runs at boot from the instance's metadata.

    ``guest_environment``: Google's guest agent runs the ``startup-script`` item as root on every
    boot ("All public Compute Engine images come with the guest environment preinstalled",
    https://cloud.google.com/compute/docs/instances/startup-scripts). ``cloud_init``: cloud-init's
    GCE datasource reads ``user-data``. Debian's GCE images carry the guest agent and no
    cloud-init: debian-cloud-images, config_space/bookworm/package_config/GCE installs
    google-guest-agent and google-compute-engine-oslogin only (cloud-init is in the EC2 class),
    and Google asked Debian not to add it ("Please do not add cloud-init to the official GCE
    Debian manifests. It conflicts with our own software", andsens/bootstrap-vz#469). Ubuntu's
    GCE images run both; their startup scripts may start before cloud-init has finished
    (GoogleCloudPlatform/guest-agent#84: "users can add cloud-init status --wait to the
    beginning of their startup script")."""

    guest_environment: bool = True
    cloud_init: bool = False


DEBIAN_GCE = ImageKind(guest_environment=True, cloud_init=False)
UBUNTU_GCE = ImageKind(guest_environment=True, cloud_init=True)
# The image a test config names by default, the families the docs name, and a custom image
# (which runs what its builder put in; here: nothing).
DEFAULT_IMAGES: dict[str, ImageKind] = {
    "projects/debian-cloud/global/images/family/debian-12": DEBIAN_GCE,
    "projects/debian-cloud/global/images/family/debian-11": DEBIAN_GCE,
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64": UBUNTU_GCE,
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts": UBUNTU_GCE,
    "projects/x/global/images/y": ImageKind(guest_environment=False, cloud_init=False),
}
# Every machine type the tests use has 2 vCPUs (what the CPUS quota counts).
DEFAULT_MACHINE_TYPES = frozenset(("e2-micro", "e2-small", "e2-medium", "n2-standard-2"))
VCPUS_PER_INSTANCE = 2
STOCKOUT_MESSAGE = ("The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
                    "the request.  Try a different zone, or try again later.")
REASONS = {400: "invalid", 403: "forbidden", 404: "notFound", 409: "alreadyExists", 429: "rateLimitExceeded",
           500: "backendError", 503: "backendError"}
# What the API says with each 403 reason (domain, message): rate limits and quotas are
# "usageLimits" 403s (the rate-limit body as "Troubleshoot operation limits" shows it), a
# missing permission is a "global" one.
FORBIDDEN_BODIES = {
    "rateLimitExceeded": ("usageLimits", "Rate Limit Exceeded"),
    "userRateLimitExceeded": ("usageLimits", "User Rate Limit Exceeded"),
    "quotaExceeded": ("usageLimits", "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."),
    "forbidden": ("global", "Required 'compute.instances.create' permission for 'projects/{project}'"),
}
# What a token needs for the Compute API: "Authorization scopes: Requires one of the following
# OAuth scopes: https://www.googleapis.com/auth/compute, https://www.googleapis.com/auth/cloud-platform"
# (REST reference, instances.insert and the other write methods; reads also take compute.readonly).
WRITE_SCOPES = frozenset(("https://www.googleapis.com/auth/compute", "https://www.googleapis.com/auth/cloud-platform"))
READ_SCOPES = WRITE_SCOPES | {"https://www.googleapis.com/auth/compute.readonly"}
# A VM's "default access scopes" (Compute Engine, "Service accounts": devstorage.read_only,
# logging.write, monitoring.write, service.management.readonly, servicecontrol, trace.append):
# what the metadata server's token of a VM or GKE node created with the defaults carries.
DEFAULT_VM_SCOPES = tuple("https://www.googleapis.com/auth/" + scope for scope in (
    "devstorage.read_only", "logging.write", "monitoring.write", "service.management.readonly",
    "servicecontrol", "trace.append"))
# The answer to a token without them, as Google APIs give it (the body in public reports, e.g.
# googleapis/google-api-python-client#915 and analogdotnow/Analog#296): 403, reason
# insufficientPermissions, status PERMISSION_DENIED, an ErrorInfo ACCESS_TOKEN_SCOPE_INSUFFICIENT.
INSUFFICIENT_SCOPES_MESSAGE = "Request had insufficient authentication scopes."
# A machine type that exists but not in this zone (or not at all) is a 400 invalid, not a 404:
# "Invalid value for field 'resource.machineType': 'zones/europe-west8-a/machineTypes/f1-micro'.
# Machine type with name 'f1-micro' does not exist in zone 'europe-west8-a'." (the API's text as
# quoted in gruntwork-io/terratest#1132 and GoogleCloudPlatform/bank-of-anthos#1234).
MACHINE_TYPE_MISSING = ("Invalid value for field 'resource.machineType': '{reference}'. Machine type with name "
                        "'{name}' does not exist in zone '{zone}'.")
# Quota messages as the API words them ("Quota 'CPUS' exceeded.  Limit: 8.0 in region us-east1.",
# mesosphere-backup/terraform-dcos#61; "HTTPError 403: Quota 'IN_USE_ADDRESSES' exceeded. Limit:
# 4.0 in region us-central1.", kelseyhightower/kubernetes-the-hard-way#47; project-wide ones end
# "globally", fastai/course-v3#165). CPUs are counted when the operation runs (it fails with code
# QUOTA_EXCEEDED); an ephemeral external address is refused with the insert (403 quotaExceeded).
QUOTA_MESSAGE = "Quota '{metric}' exceeded.  Limit: {limit:.1f} {where}."
# The newer form names the quota only ("Code: QUOTA_EXCEEDED Message: Quota 'N2_CPUS' exceeded.",
# GoogleCloudPlatform/ai-on-gke#849, 2024); where it applies is in the operation error's
# structured details: Errors.error_details[].quota_info, a QuotaExceededInfo with metric_name,
# limit_name, limit and the dimensions map ("QuotaExceededInfo will have details when the error
# code is QUOTA_EXCEEDED", google-cloud-compute's compute_v1 types, Errors and QuotaExceededInfo).
QUOTA_MESSAGE_BARE = "Quota '{metric}' exceeded."
QUOTA_WORDINGS = ("legacy", "bare")
GLOBAL = "global"
STATUS_TEXT = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 409: "CONFLICT", 429: "TOO MANY REQUESTS",
               500: "INTERNAL SERVER ERROR", 503: "SERVICE UNAVAILABLE"}
URL_PREFIXES = ("https://www.googleapis.com/compute/v1/", "https://compute.googleapis.com/compute/v1/")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    reason: str | None


@dataclass
class _OperationFault:
    code: str
    message: str
    http_status: int
    details: list[dict[str, Any]] = field(default_factory=list)  # errorDetails[] of the operation's error


@dataclass(frozen=True)
class _QuotaBreach:
    """A quota an insert would pass: its message as the API words it and its ``quotaInfo``."""

    message: str
    quota_info: dict[str, Any]


@dataclass
class _Operation:
    body: dict[str, Any]
    zone: str  # GLOBAL for a global operation (firewalls)
    kind: str  # insert | delete | firewall
    instance: str  # the instance's or the firewall rule's name
    done_at: float
    fault: _OperationFault | None = None
    apply: Callable[[], None] | None = None  # what a firewall operation changes when it is DONE


@dataclass(frozen=True)
class GuestView:
    """A RUNNING instance as the network sees it: its internal address (on its NIC) and external
    one (a one-to-one NAT at the edge, None without), its proxy port (the ``egress-proxies-port``
    metadata), where it leaves from (``BootReport.egress``), its network
    (``projects/<p>/global/networks/<n>``) and its tags."""

    zone: str
    name: str
    internal: str
    external: str | None
    port: int
    egress: str | None
    network: str
    tags: tuple[str, ...]

    @property
    def address(self) -> str:
        """Where it is dialled: its external address, else its internal one."""
        return self.external or self.internal


@dataclass(frozen=True)
class BootReport:
    """What an instance's image runs from its metadata at boot (see ``ImageKind``): the
    ``startup-script`` the guest agent executes and the ``user-data`` cloud-init reads; None
    for what nothing on the image runs (or what the metadata does not have). ``egress``: the
    address its traffic to the internet leaves from (its external address, else its region's
    Cloud NAT's), None when it has no way out: then a package install in the script fails."""

    startup_script: str | None
    user_data: str | None
    egress: str | None = None

    @property
    def internet(self) -> bool:
        return self.egress is not None


# What the internet does not route (RFC 1918, RFC 6598 shared space, loopback, link-local,
# unique-local): a source there never reaches an instance's external address. From outside the
# VPC such packets are not routed to Google; from inside it, a VM reaching another's external
# address leaves through its own external address or Cloud NAT, so the firewall sees that public
# address, not the private one ("Cloud NAT": "Cloud NAT ... translates the source"; "IP
# addresses": "a VM ... sends packets to an external IP address ... the source is the external
# address"; https://cloud.google.com/nat/docs/overview, https://cloud.google.com/vpc/docs/ip-addresses).
UNROUTED_SOURCES = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "::1/128",
    "fc00::/7", "fe80::/10"))


@dataclass
class Network:
    """A VPC network: auto mode has a subnetwork named like the network in every region;
    custom mode only the ones listed (region -> names), and instances must name one."""

    custom: bool = False
    subnetworks: dict[str, set[str]] = field(default_factory=dict)


class ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str | None = None, domain: str = "global",
                 item_message: str | None = None, extra: dict[str, Any] | None = None) -> None:
        """``item_message``: the ``errors[0].message`` when it differs from the top one;
        ``extra``: further fields of ``error`` (``status``, ``details``)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason or REASONS.get(status, "error")
        self.domain = domain
        self.item_message = item_message or message
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, **self.extra,
                          "errors": [{"message": self.item_message, "domain": self.domain, "reason": self.reason}]}}


class _Hold(Exception):
    """A wait call to hold for ``seconds`` (outside the lock) before answering."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


def _relative(reference: str) -> str:
    for prefix in URL_PREFIXES:
        if reference.startswith(prefix):
            return reference[len(prefix):]
    return reference


@dataclass
class ComputeEmulator:
    project: str = "test-project"
    zones: tuple[str, ...] = ("europe-west1-b", "europe-west4-a", "us-central1-a")
    requests: list[RecordedRequest] = field(default_factory=list)
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operation_seconds: float = 0.0
    wait_hold_seconds: float = WAIT_HOLD_SECONDS
    # sourceImage -> what it runs at boot; an image not listed does not exist (404).
    images: dict[str, ImageKind] = field(default_factory=lambda: dict(DEFAULT_IMAGES))
    # zone -> machine types offered there; zones not listed offer DEFAULT_MACHINE_TYPES.
    machine_types: dict[str, set[str]] = field(default_factory=dict)
    # (project, name) -> network; the project's "default" network (auto mode) is always there.
    networks: dict[tuple[str, str], Network] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None
    # (project, name) -> firewall rule, networks as projects/<p>/global/networks/<n>; the default
    # network's pre-populated rules are there from the start (compute_firewall.py).
    firewalls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Bearer token -> the OAuth scopes it was issued with; a token not listed may do anything.
    token_scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # zoneOperations.wait answers at once, as an overloaded server may (see _poll).
    wait_returns_early: bool = False
    # How quota errors are worded (QUOTA_WORDINGS): "legacy" names the limit and region in the
    # message, "bare" the quota only; the operation's errorDetails[].quotaInfo says both either way.
    quota_wording: str = "legacy"
    # Ephemeral external and internal addresses to hand out, in order (tests/support/compute/guests.py:
    # addresses of the test's own network namespaces); when empty, made-up 203.0.113.x and
    # 10.128.x.y ones.
    external_addresses: list[str] = field(default_factory=list)
    internal_addresses: list[str] = field(default_factory=list)
    # (project, region, name) -> a Cloud Router carrying a Cloud NAT (add_cloud_nat), as the API shows it.
    routers: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        # (metric, region or None for a project-wide quota) -> limit (see set_quota).
        self._quotas: dict[tuple[str, str | None], float] = {}
        self._faults: list[_Fault] = []
        self._operation_faults: list[_OperationFault] = []
        self._operations: dict[tuple[str, str], _Operation] = {}
        self._pending: list[_Operation] = []  # not DONE yet: what _tick looks at (the bench makes thousands)
        self._unreachable: set[str] = set()
        self._retired: set[str] = set()
        self._stocked_out: dict[str, str] = {}
        # Page tokens handed out: token -> (the request it belongs to, the last key of its page).
        self._page_tokens: dict[str, tuple[Any, Any]] = {}
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None
        # (project, region, network name) -> the addresses its Cloud NAT translates to.
        self._nat_addresses: dict[tuple[str, str, str], tuple[str, ...]] = {}
        for zone in self.zones:
            self.machine_types.setdefault(zone, set(DEFAULT_MACHINE_TYPES))
        self.networks.setdefault((self.project, "default"), Network())
        for rule in default_network_rules(self.project):
            self.firewalls.setdefault((self.project, rule["name"]), self._stored_rule(self.project, rule))

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
                headers = {key.lower(): value for key, value in self.headers.items()}
                status, body = emulator.handle(self.command, self.path, raw, headers)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.ssl_context is not None:
            self._server.socket = self.ssl_context.wrap_socket(self._server.socket, server_side=True)
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
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    # -- test controls ---------------------------------------------------------------------

    def fail_next(self, method: str, path_regex: str, status: int, count: int = 1, reason: str | None = None) -> None:
        """Answer the next ``count`` requests whose method and path match with ``status``
        (and ``reason``: a 403 carries the API's own message and domain for it)."""
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_regex), status, count, reason))

    def clear_faults(self) -> None:
        """The outage is over: no injected fault answers any more, no zone is unreachable or out of stock."""
        with self._lock:
            self._faults.clear()
            self._operation_faults.clear()
            self._unreachable.clear()
            self._stocked_out.clear()

    def fail_next_operation(self, code: str, message: str, http_status: int) -> None:
        """The next insert is accepted, but its operation finishes DONE with this error (no instance)."""
        with self._lock:
            self._operation_faults.append(_OperationFault(code, message, http_status))

    def set_unreachable(self, zone: str, unreachable: bool = True) -> None:
        with self._lock:
            if unreachable:
                self._unreachable.add(zone)
            else:
                self._unreachable.discard(zone)

    def retire_zone(self, zone: str) -> None:
        """The zone no longer exists: every path under it answers 400 "Unknown zone"."""
        with self._lock:
            self._retired.add(zone)

    def stock_out(self, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED") -> None:
        """The zone has no capacity: inserts there are accepted and their operations fail with ``code``."""
        with self._lock:
            self._stocked_out[zone] = code

    def restock(self, zone: str) -> None:
        with self._lock:
            self._stocked_out.pop(zone, None)

    def set_quota(self, metric: str, limit: float, region: str | None = None) -> None:
        """A quota of the project: ``CPUS`` (vCPUs of instances not TERMINATED) or
        ``IN_USE_ADDRESSES`` (their ephemeral external IPs), per ``region`` or, without one,
        project-wide (``CPUS_ALL_REGIONS``-like: "Limit: N globally")."""
        with self._lock:
            self._quotas[(metric, region)] = limit

    def boot(self, zone: str, name: str) -> BootReport:
        """What the instance's image ran from its metadata when it booted (see ``ImageKind``), and
        its way out (``BootReport.egress``)."""
        with self._lock:
            instance = self.instances[(zone, name)]
            kind = self.images[self._image_path(instance["disks"][0]["initializeParams"]["sourceImage"])]
            metadata = {item["key"]: item["value"] for item in instance.get("metadata", {}).get("items", [])}
            return BootReport(startup_script=metadata.get("startup-script") if kind.guest_environment else None,
                              user_data=metadata.get("user-data") if kind.cloud_init else None,
                              egress=self._egress(zone, instance))

    def _egress(self, zone: str, instance: dict[str, Any]) -> str | None:
        """The external address, else the Cloud NAT's of the instance's region and network: Cloud NAT
        serves only VMs without an external address ("Cloud NAT ... lets certain resources without
        external IP addresses create outbound connections to the internet", Cloud NAT overview),
        and every VM behind it leaves from the NAT's addresses (the first one here)."""
        nic = instance["networkInterfaces"][0]
        external = next((access["natIP"] for access in nic.get("accessConfigs", []) if access.get("natIP")), None)
        if external or any(access.get("type") == "ONE_TO_ONE_NAT" for access in nic.get("accessConfigs", [])):
            return external
        parts = self._network_path(nic["network"]).split("/")  # projects/<p>/global/networks/<n>
        addresses = self._nat_addresses.get((parts[1], zone.rsplit("-", 1)[0], parts[4]))
        return addresses[0] if addresses else None

    def add_cloud_nat(self, region: str, nat_ips: tuple[str, ...], network: str = "default",
                      name: str = "egress-nat", project: str | None = None) -> dict[str, Any]:
        """A Cloud Router with a Cloud NAT for every subnetwork of ``network`` in ``region``
        (``sourceSubnetworkIpRangesToNat: ALL_SUBNETWORKS_ALL_IP_RANGES``), translating to
        ``nat_ips`` (reserved addresses, ``MANUAL_ONLY``). The Router resource as routers.get
        shows it: ``network`` a URL, ``nats[].natIps`` the addresses' URLs."""
        project = project or self.project
        router = {
            "kind": "compute#router", "id": str(next(self._ids)), "name": name,
            "region": f"{API}/projects/{project}/regions/{region}",
            "network": f"{API}/projects/{project}/global/networks/{network}",
            "selfLink": f"{API}/projects/{project}/regions/{region}/routers/{name}",
            "nats": [{"name": f"{name}-config", "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
                      "natIpAllocateOption": "MANUAL_ONLY",
                      "natIps": [f"{API}/projects/{project}/regions/{region}/addresses/{name}-{index}"
                                 for index in range(len(nat_ips))]}]}
        with self._lock:
            self.routers[(project, region, name)] = router
            self._nat_addresses[(project, region, network)] = tuple(nat_ips)
        return router

    def reachable(self, source: str, zone: str, name: str, port: int) -> bool:
        """Whether a TCP connection from ``source`` reaches ``port`` on the instance's external
        IP: never from an address the internet does not route (``UNROUTED_SOURCES``), else as its
        network's ingress firewall rules decide (compute_firewall.admits), the implied deny when
        no rule allows it."""
        address = ipaddress.ip_address(source)
        if any(address.version == network.version and address in network for network in UNROUTED_SOURCES):
            return False
        with self._lock:
            instance = self.instances[(zone, name)]
            nic = instance["networkInterfaces"][0]
            if not any(access.get("natIP") for access in nic.get("accessConfigs", [])):
                return False
            network = self._network_path(nic["network"])
            tags = (instance.get("tags") or {}).get("items") or []
            return admits(self.firewalls.values(), network, tags, source, port)

    def network_view(self) -> tuple[list[GuestView], list[dict[str, Any]]]:
        """One consistent look at what the network sees: every RUNNING instance, at the address it
        is dialled at (its external one, else its internal one), and every firewall rule (copies;
        tests/support/compute/guests.py runs them)."""
        with self._lock:
            found = []
            for (zone, name), instance in sorted(self.instances.items()):
                if instance.get("status") != "RUNNING":
                    continue
                nic = instance["networkInterfaces"][0]
                external = next((a["natIP"] for a in nic.get("accessConfigs", []) if a.get("natIP")), None)
                metadata = {i["key"]: i["value"] for i in (instance.get("metadata") or {}).get("items", [])}
                found.append(GuestView(zone, name, nic["networkIP"], external,
                                       int(metadata.get("egress-proxies-port") or 3128), self._egress(zone, instance),
                                       self._network_path(nic["network"]),
                                       tuple((instance.get("tags") or {}).get("items") or ())))
            return found, [dict(rule) for rule in self.firewalls.values()]

    def firewall(self, name: str, project: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            return self.firewalls.get((project or self.project, name))

    def add_network(self, name: str, subnetworks: dict[str, set[str]], project: str | None = None) -> None:
        """A custom-mode network (``project`` other than ours: a Shared VPC host project's)."""
        with self._lock:
            self.networks[(project or self.project, name)] = Network(custom=True, subnetworks=subnetworks)

    def add_instance(self, zone: str, name: str, labels: dict[str, str] | None = None,
                     metadata: dict[str, str] | None = None, status: str = "RUNNING",
                     nat_ip: bool = True) -> dict[str, Any]:
        """An instance made behind the provider's back (another owner, or not ours at all)."""
        access = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}] if nat_ip else []
        body = {"name": name, "machineType": f"zones/{zone}/machineTypes/e2-small", "labels": labels or {},
                "metadata": {"items": [{"key": k, "value": v} for k, v in (metadata or {}).items()]},
                "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": access}],
                "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/x/global/images/y"}}]}
        with self._lock:
            instance = self._new_instance(zone, body)
            self._assign_nat(instance)
            instance["status"] = status
            self.instances[(zone, name)] = instance
        return instance

    def preempt(self, zone: str, name: str) -> dict[str, Any]:
        """Compute Engine reclaims the instance (preemption, a host error): it ends ``TERMINATED``
        -- stopped, kept, never RUNNING again by itself -- and its ephemeral external IP is
        released (the access config stays, without ``natIP``), as for any stopped instance."""
        with self._lock:
            instance = self.instances[(zone, name)]
            instance["status"] = "TERMINATED"
            for nic in instance["networkInterfaces"]:
                for access in nic.get("accessConfigs", []):
                    access.pop("natIP", None)
            return instance

    def metadata(self, zone: str, name: str) -> dict[str, str]:
        items = self.instances[(zone, name)].get("metadata", {}).get("items", [])
        return {item["key"]: item["value"] for item in items}

    def requests_to(self, method: str, path_regex: str) -> list[RecordedRequest]:
        pattern = re.compile(path_regex)
        return [r for r in self.requests if r.method == method and pattern.search(r.path)]

    def zones_of(self, name: str) -> list[str]:
        """The zones holding an instance of that name."""
        return sorted(zone for zone, found in self.instances if found == name)

    # -- dispatch --------------------------------------------------------------------------

    def handle(self, method: str, target: str, raw: bytes,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        body = json.loads(raw) if raw else None
        with self._lock:
            self.requests.append(RecordedRequest(method, parts.path, query, body, dict(headers or {})))
            try:
                self._injected_fault(method, parts.path)
                self._check_scopes(method, headers or {})
                self._tick()
                return 200, self._route(method, parts.path, query, body, hold=True)
            except ApiError as error:
                return error.status, error.body()
            except _Hold as hold:
                seconds = hold.seconds
        # zoneOperations.wait: the call is held open without blocking other requests.
        time.sleep(seconds)
        with self._lock:
            try:
                self._tick()
                return 200, self._route(method, parts.path, query, body, hold=False)
            except ApiError as error:
                return error.status, error.body()

    def _injected_fault(self, method: str, path: str) -> None:
        for fault in self._faults:
            if fault.remaining > 0 and fault.method == method and fault.path.search(path):
                fault.remaining -= 1
                reason = fault.reason or REASONS.get(fault.status)
                domain, message = FORBIDDEN_BODIES.get(reason or "", ("global", ""))
                message = message.format(project=self.project) or f"injected fault: {fault.status} for {method} {path}"
                raise ApiError(fault.status, message, reason, domain)

    def _check_scopes(self, method: str, headers: dict[str, str]) -> None:
        """A token issued without a Compute scope is refused whatever its IAM rights (see
        INSUFFICIENT_SCOPES_MESSAGE)."""
        token = headers.get("authorization", "").removeprefix("Bearer ")
        scopes = self.token_scopes.get(token)
        if scopes is None or set(scopes) & (READ_SCOPES if method == "GET" else WRITE_SCOPES):
            return
        raise ApiError(403, INSUFFICIENT_SCOPES_MESSAGE, "insufficientPermissions",
                       item_message="Insufficient Permission", extra={"status": "PERMISSION_DENIED", "details": [{
                           "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                           "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT", "domain": "googleapis.com",
                           "metadata": {"service": "compute.googleapis.com"}}]})

    def _tick(self) -> None:
        """Finish every operation whose time has come (real operations run without being polled)."""
        now = time.monotonic()
        due = [operation for operation in self._pending if operation.done_at <= now]
        for operation in due:
            self._finish(operation)

    def _check_zone(self, zone: str) -> None:
        if zone not in self.zones or zone in self._retired:
            raise ApiError(400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.")

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any, hold: bool) -> dict[str, Any]:
        match = re.fullmatch(r"/compute/v1/projects/([^/]+)/(.*)", path)
        if match is None:
            raise ApiError(404, f"Not Found: {path}")
        project, rest = match.groups()
        if project != self.project:
            raise ApiError(404, f"The resource 'projects/{project}' was not found")
        if rest == "aggregated/instances" and method == "GET":
            return self._aggregated(query)
        if rest == "aggregated/routers" and method == "GET":
            return self._aggregated_routers()
        if rest.startswith("global/"):
            return self._route_global(method, rest, body, hold)
        match = re.fullmatch(r"zones/([^/]+)/(instances|operations)(?:/([^/]+))?(/wait)?", rest)
        if match is None:
            raise ApiError(404, f"Not Found: {path}")
        zone, collection, name, wait = match.groups()
        self._check_zone(zone)
        if collection == "operations" and name and ((method == "GET" and not wait) or (method == "POST" and wait)):
            return self._poll(zone, name, hold=hold and bool(wait))
        if collection == "instances" and name is None:
            if method == "POST":
                return self._insert(zone, body)
            if method == "GET":
                return self._list(zone, query)
        if collection == "instances" and name:
            if method == "GET":
                return self._instance(zone, name)
            if method == "DELETE":
                return self._delete(zone, name)
        raise ApiError(405, f"Method {method} not allowed on {path}", "methodNotAllowed")

    def _route_global(self, method: str, rest: str, body: Any, hold: bool) -> dict[str, Any]:
        match = re.fullmatch(r"global/(firewalls|operations)(?:/([^/]+))?(/wait)?", rest)
        if match is None:
            raise ApiError(404, f"Not Found: {rest}")
        collection, name, wait = match.groups()
        if collection == "operations" and name and ((method == "GET" and not wait) or (method == "POST" and wait)):
            return self._poll(GLOBAL, name, hold=hold and bool(wait))
        if collection == "firewalls" and name is None and not wait:
            if method == "GET":
                return {"kind": "compute#firewallList", "items": [
                    rule for (project, _), rule in sorted(self.firewalls.items()) if project == self.project]}
            if method == "POST":
                return self._insert_firewall(body)
        if collection == "firewalls" and name and not wait:
            if method == "GET":
                return self._firewall(name)
            if method == "PATCH":
                return self._patch_firewall(name, body)
            if method == "DELETE":
                self._firewall(name)
                return self._start_operation(GLOBAL, "firewall", name,
                                             apply=lambda: self._drop_firewall(name))
        raise ApiError(405, f"Method {method} not allowed on {rest}", "methodNotAllowed")

    # -- firewalls -------------------------------------------------------------------------

    def _network_path(self, reference: str) -> str:
        """A network reference as projects/<project>/global/networks/<name> (404 if there is none)."""
        parsed = re.fullmatch(r"(?:projects/([^/]+)/)?global/networks/([^/]+)", _relative(reference))
        if parsed is None:
            raise ApiError(400, f"Invalid value for field 'resource.network': '{reference}'")
        project, name = parsed.group(1) or self.project, parsed.group(2)
        if (project, name) not in self.networks:
            raise self._not_found(f"projects/{project}/global/networks/{name}")
        return f"projects/{project}/global/networks/{name}"

    def _stored_rule(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        return {"kind": "compute#firewall", "id": str(number), "direction": "INGRESS", "priority": 1000,
                "disabled": False, **body,
                "selfLink": f"{API}/projects/{project}/global/firewalls/{body['name']}"}

    def _firewall(self, name: str) -> dict[str, Any]:
        rule = self.firewalls.get((self.project, name))
        if rule is None:
            raise self._not_found(f"projects/{self.project}/global/firewalls/{name}")
        return rule

    def _checked_rule(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid value for field 'resource'")
        try:
            validate_rule(body)
        except FirewallError as error:
            raise ApiError(400, str(error)) from None
        return {**body, "network": self._network_path(str(body.get("network") or "global/networks/default"))}

    def _drop_firewall(self, name: str) -> None:
        self.firewalls.pop((self.project, name), None)

    def _insert_firewall(self, body: Any) -> dict[str, Any]:
        """firewalls.insert: names are unique in the project (409); the rule is there once its
        global operation is DONE."""
        rule = self._checked_rule(body)
        if (self.project, rule["name"]) in self.firewalls:
            raise ApiError(409, f"The resource 'projects/{self.project}/global/firewalls/{rule['name']}' already "
                                "exists", "alreadyExists")
        stored = self._stored_rule(self.project, rule)
        return self._start_operation(GLOBAL, "firewall", rule["name"],
                                     apply=lambda: self.firewalls.__setitem__((self.project, rule["name"]), stored))

    def _patch_firewall(self, name: str, body: Any) -> dict[str, Any]:
        """firewalls.patch: the fields given replace the stored ones (JSON merge patch semantics,
        lists as a whole); the name and network cannot change."""
        current = self._firewall(name)
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid value for field 'resource'")
        merged = {**current, **body, "name": name}
        if _relative(str(body.get("network", current["network"]))) not in (current["network"],
                                                                           current["network"].split("/", 2)[-1]):
            raise ApiError(400, "Invalid value for field 'resource.network': the network of a rule cannot change")
        checked = self._checked_rule(merged)
        return self._start_operation(GLOBAL, "firewall", name,
                                     apply=lambda: self.firewalls.__setitem__((self.project, name), checked))

    # -- instances -------------------------------------------------------------------------

    def _instance(self, zone: str, name: str) -> dict[str, Any]:
        instance = self.instances.get((zone, name))
        if instance is None:
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found")
        return instance

    def _in_flight(self, zone: str, name: str) -> bool:
        return any(op.zone == zone and op.instance == name for op in self._pending)

    def _delete(self, zone: str, name: str) -> dict[str, Any]:
        instance = self._instance(zone, name)
        if self._in_flight(zone, name):
            raise ApiError(400, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' is not ready",
                           "resourceNotReady")
        instance["status"] = "STOPPING"
        return self._start_operation(zone, "delete", name)

    def _new_instance(self, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        number = next(self._ids)
        nics = []
        for index, nic in enumerate(body.get("networkInterfaces", [])):
            internal = self.internal_addresses.pop(0) if self.internal_addresses and index == 0 else \
                "10.128.{}.{}".format(*divmod(number, 250))
            nics.append({**nic, "name": f"nic{index}", "networkIP": internal,
                         "accessConfigs": [dict(access) for access in nic.get("accessConfigs", [])]})
        offset = datetime.timezone(datetime.timedelta(hours=-7))
        return {
            **body, "kind": "compute#instance", "id": str(number), "status": "PROVISIONING",
            "zone": f"{API}/projects/{self.project}/zones/{zone}", "networkInterfaces": nics,
            "creationTimestamp": datetime.datetime.now(offset).isoformat(timespec="milliseconds"),
            "selfLink": f"{API}/projects/{self.project}/zones/{zone}/instances/{body['name']}",
            "metadata": {"kind": "compute#metadata", "fingerprint": "emulated", **body.get("metadata", {})},
        }

    def _assign_nat(self, instance: dict[str, Any]) -> None:
        """An ephemeral external address: the next of ``external_addresses`` (addresses a test's
        network namespace holds), else a made-up one nothing may be sent to."""
        for nic in instance["networkInterfaces"]:
            for access in nic["accessConfigs"]:
                if access.get("type") == "ONE_TO_ONE_NAT":
                    access["natIP"] = (self.external_addresses.pop(0) if self.external_addresses else
                                       f"203.0.113.{int(instance['id']) % 250}")

    def _insert(self, zone: str, body: Any) -> dict[str, Any]:
        self._validate_insert(zone, body)
        name = body["name"]
        if (zone, name) in self.instances:
            raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists",
                           "alreadyExists")
        external = any(access.get("type") == "ONE_TO_ONE_NAT"
                       for access in (body.get("networkInterfaces") or [{}])[0].get("accessConfigs", []))
        if external and (exceeded := self._exceeded("IN_USE_ADDRESSES", zone)):
            raise ApiError(403, exceeded.message, "quotaExceeded", "usageLimits")
        cpus = self._exceeded("CPUS", zone, VCPUS_PER_INSTANCE)
        self.instances[(zone, name)] = self._new_instance(zone, body)
        fault = None
        if cpus:
            fault = _OperationFault("QUOTA_EXCEEDED", cpus.message, 403, [{"quotaInfo": cpus.quota_info}])
        elif zone in self._stocked_out:
            fault = _OperationFault(self._stocked_out[zone], STOCKOUT_MESSAGE.format(project=self.project, zone=zone),
                                    503)
        elif self._operation_faults:
            fault = self._operation_faults.pop(0)
        return self._start_operation(zone, "insert", name, fault)

    def _exceeded(self, metric: str, zone: str, amount: int = 1) -> _QuotaBreach | None:
        """The breach when ``amount`` more of ``metric`` in ``zone``'s region would pass a regional
        or project-wide limit, worded as ``quota_wording`` says; None while it fits. ``quotaInfo``
        names the region in ``dimensions`` for a regional limit and carries none for a
        project-wide one (``CPUS-per-project-region`` / ``CPUS-ALL-REGIONS-per-project``)."""
        region = zone.rsplit("-", 1)[0]
        for where in (region, None):
            limit = self._quotas.get((metric, where))
            if limit is None:
                continue
            live = [i for (z, _), i in self.instances.items() if where is None or z.rsplit("-", 1)[0] == where
                    if i.get("status") not in ("TERMINATED", "STOPPED", "SUSPENDED")]
            per_instance = VCPUS_PER_INSTANCE if metric == "CPUS" else 1
            if len(live) * per_instance + amount <= limit:
                continue
            name = metric if where else f"{metric}_ALL_REGIONS"
            info: dict[str, Any] = {
                "metricName": f"compute.googleapis.com/{name.lower()}", "limit": limit,
                "limitName": f"{metric.replace('_', '-')}-per-project-region" if where else
                f"{name.replace('_', '-')}-per-project"}
            if where:
                info["dimensions"] = {"region": where}
            if self.quota_wording == "bare":
                return _QuotaBreach(QUOTA_MESSAGE_BARE.format(metric=name), info)
            return _QuotaBreach(QUOTA_MESSAGE.format(metric=name, limit=limit,
                                                     where=f"in region {where}" if where else "globally"), info)
        return None

    def _image_path(self, reference: str) -> str:
        image = _relative(reference)
        return f"projects/{self.project}/{image}" if image.startswith("global/") else image

    def _not_found(self, resource: str) -> ApiError:
        return ApiError(404, f"The resource '{resource}' was not found")

    def _validate_insert(self, zone: str, body: Any) -> None:
        """The synchronous checks of instances.insert, in the order a reader meets the fields."""
        if not isinstance(body, dict) or not NAME_RE.fullmatch(str(body.get("name", ""))):
            raise ApiError(400, "Invalid value for field 'resource.name'")
        machine_type = _relative(str(body.get("machineType", "")))
        zonal = re.fullmatch(r"(?:projects/[^/]+/)?zones/([^/]+)/machineTypes/([^/]+)", machine_type)
        if zonal is None:
            raise ApiError(400, f"Invalid value for field 'resource.machineType': '{machine_type}'. "
                                "Machine type must be a zonal URL such as zones/<zone>/machineTypes/<type>.")
        if zonal.group(1) != zone:
            # Machine types are zonal resources: an instance takes one of its own zone.
            raise ApiError(400, f"Invalid value for field 'resource.machineType': '{machine_type}'. "
                                f"Machine type must be in zone '{zone}'.")
        if zonal.group(2) not in self.machine_types.get(zone, set()):
            raise ApiError(400, MACHINE_TYPE_MISSING.format(reference=body.get("machineType"), name=zonal.group(2),
                                                            zone=zone))
        disks = body.get("disks") or [{}]
        image = self._image_path(str(disks[0].get("initializeParams", {}).get("sourceImage", "")))
        if not disks[0].get("boot") or not image:
            raise ApiError(400, "Invalid value for field 'resource.disks[0]': a boot disk with a sourceImage")
        if image not in self.images:
            raise self._not_found(image)
        self._validate_network(zone, (body.get("networkInterfaces") or [{}])[0])
        self._validate_tags(body.get("tags") or {})
        labels = body.get("labels", {})
        if len(labels) > LABEL_COUNT_LIMIT:
            raise ApiError(400, f"Invalid value for field 'resource.labels': ''. Label count {len(labels)} exceeds "
                                f"the maximum of {LABEL_COUNT_LIMIT}.")
        for key, value in labels.items():
            if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
                raise ApiError(400, f"Invalid value for field 'resource.labels': {key!r}: {value!r}")
        total = 0
        for item in body.get("metadata", {}).get("items", []):
            key, value = str(item.get("key", "")), str(item.get("value", ""))
            if not METADATA_KEY_RE.fullmatch(key) or len(key.encode()) >= METADATA_KEY_LIMIT:
                raise ApiError(400, f"Invalid value for field 'resource.metadata.items': key {key!r}")
            if len(value.encode()) > METADATA_VALUE_LIMIT:
                raise ApiError(400, f"Invalid value for field 'resource.metadata': {key} is too long")
            total += len(key.encode()) + len(value.encode())
        if total >= METADATA_TOTAL_LIMIT:
            raise ApiError(400, f"Invalid value for field 'resource.metadata': the total size of all keys and values "
                                f"is {total} bytes; it must be less than 512 KB.")

    @staticmethod
    def _validate_tags(tags: dict[str, Any]) -> None:
        """Network tags (Instance.tags.items): "Each tag within the list must comply with RFC1035"
        (REST reference, Tags.items); at most 64 per instance (Add network tags)."""
        items = tags.get("items") or []
        if len(items) > LABEL_COUNT_LIMIT:
            raise ApiError(400, f"Invalid value for field 'resource.tags.items': {len(items)} tags; at most 64")
        for index, tag in enumerate(items):
            if not NAME_RE.fullmatch(str(tag)):
                raise ApiError(400, f"Invalid value for field 'resource.tags.items[{index}]': '{tag}'. Must be a "
                                    "match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")

    def _validate_network(self, zone: str, nic: dict[str, Any]) -> None:
        reference = _relative(str(nic.get("network", "")))
        parsed = re.fullmatch(r"(?:projects/([^/]+)/)?global/networks/([^/]+)", reference)
        if parsed is None:
            raise ApiError(400, f"Invalid value for field 'resource.networkInterfaces[0].network': '{reference}'")
        project, name = parsed.group(1) or self.project, parsed.group(2)
        network = self.networks.get((project, name))
        if network is None:
            raise self._not_found(f"projects/{project}/global/networks/{name}")
        region = zone.rsplit("-", 1)[0]
        subnetwork = _relative(str(nic.get("subnetwork", "")))
        if not subnetwork:
            if network.custom:
                raise ApiError(400, "Invalid value for field 'resource.networkInterfaces[0]': ''. Subnetwork should "
                                    "be specified for custom subnetmode network")
            return
        sub = re.fullmatch(r"(?:projects/([^/]+)/)?regions/([^/]+)/subnetworks/([^/]+)", subnetwork)
        if sub is None:
            raise ApiError(400, f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': '{subnetwork}'")
        sub_project, sub_region, sub_name = sub.group(1) or self.project, sub.group(2), sub.group(3)
        if sub_region != region:
            raise ApiError(400, f"Invalid value for field 'resource.networkInterfaces[0].subnetwork': "
                                f"'{subnetwork}'. Subnetwork must be in the same region as the instance ({region}).")
        names = network.subnetworks.get(sub_region, set()) if network.custom else {name}
        if sub_project != project or sub_name not in names:
            raise self._not_found(f"projects/{sub_project}/regions/{sub_region}/subnetworks/{sub_name}")

    def _matching(self, clauses: list[tuple[str, str]]) -> dict[str, list[dict[str, Any]]]:
        """The instances the filter's clauses select, by zone, each zone's in name order ("By
        default, results are returned in alphanumerical order based on the resource name")."""
        found: dict[str, list[dict[str, Any]]] = {}
        for (zone, name), instance in sorted(self.instances.items()):
            labels = instance.get("labels", {})
            if all((name if key == "name" else labels.get(key[len("labels."):])) == value for key, value in clauses):
                found.setdefault(zone, []).append(instance)
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

    def _page(self, query: dict[str, list[str]], keyed: list[tuple[Any, dict[str, Any]]],
              scope: str) -> tuple[list[tuple[Any, dict[str, Any]]], str | None]:
        """This page of ``keyed`` (sorted (key, item) pairs) and the next page's token.

        maxResults: "The maximum number of results per page that should be returned ... Acceptable
        values are 0 to 500, inclusive. (Default: 500)". pageToken: "Set pageToken to the
        nextPageToken returned by a previous list request to get the next page of results." As
        AIP-158 (https://google.aip.dev/158) has it, a token is opaque ("Base-64 encoding an
        otherwise-transparent page token is not a sufficient obfuscation mechanism") and belongs
        to its request: "The user is expected to keep all other arguments to the RPC the same; if
        any arguments are different, the API should send an INVALID_ARGUMENT error". A page goes
        on after the last key of the one before, so instances made or deleted between pages are
        neither repeated nor skipped (the emulator's tokens do not expire).
        """
        raw = query.get("maxResults", [str(MAX_RESULTS_LIMIT)])[0]
        if not raw.isdigit() or int(raw) > MAX_RESULTS_LIMIT:
            raise ApiError(400, f"Invalid value for field 'maxResults': '{raw}'. Must be less than or equal to 500")
        size = int(raw) or MAX_RESULTS_LIMIT
        # What a token is bound to: everything the request says but its page size and token.
        bound = (scope, tuple(sorted((name, tuple(values)) for name, values in query.items()
                                     if name not in ("maxResults", "pageToken"))))
        token = query.get("pageToken", [""])[0]
        after = None
        if token:
            issued = self._page_tokens.get(token)
            if issued is None:
                raise ApiError(400, f"Invalid value for field 'pageToken': '{token}'. Invalid page token.")
            if issued[0] != bound:
                raise ApiError(400, f"Invalid value for field 'pageToken': '{token}'. The page token was issued "
                                    "for a request with different parameters.")
            after = issued[1]
        rest = [pair for pair in keyed if after is None or pair[0] > after]
        page = rest[:size]
        if len(rest) <= size:
            return page, None
        following = secrets.token_urlsafe(24)
        self._page_tokens[following] = (bound, page[-1][0])
        return page, following

    def _list(self, zone: str, query: dict[str, list[str]]) -> dict[str, Any]:
        if zone in self._unreachable:
            raise ApiError(503, f"The zone 'projects/{self.project}/zones/{zone}' is currently unavailable.")
        found = self._matching(self._parse_filter(query)).get(zone, [])
        page, following = self._page(query, [(instance["name"], instance) for instance in found], f"zones/{zone}")
        result: dict[str, Any] = {"kind": "compute#instanceList"}
        if page:
            result["items"] = [instance for _, instance in page]
        if following:
            result["nextPageToken"] = following
        return result

    def _aggregated(self, query: dict[str, list[str]]) -> dict[str, Any]:
        clauses = self._parse_filter(query)
        zones = [zone for zone in self.zones if zone not in self._retired]
        unreachable = [zone for zone in zones if zone in self._unreachable]
        partial = query.get("returnPartialSuccess", ["false"])[0] == "true"
        if unreachable and not partial:
            # "returnPartialSuccess: Opt-in for partial success behavior which provides partial
            # results in case of failure." Without it a failing zone fails the call.
            raise ApiError(503, "Internal error. Please try again or contact Google Support. "
                                f"(scopes unreachable: {', '.join('zones/' + z for z in unreachable)})")
        matching = self._matching(clauses)
        keyed = [((index, instance["name"]), instance) for index, zone in enumerate(zones) if zone not in unreachable
                 for instance in matching.get(zone, [])]
        page, following = self._page(query, keyed, "aggregated")
        items: dict[str, Any] = {}
        for index, zone in enumerate(zones):
            scope = f"zones/{zone}"
            on_page = [instance for (where, _), instance in page if where == index]
            if zone in unreachable:
                items[scope] = {"warning": {"code": "UNREACHABLE", "message": f"Scope {scope} is unreachable.",
                                            "data": [{"key": "scope", "value": scope}]}}
            elif on_page:
                items[scope] = {"instances": on_page}
            else:
                items[scope] = {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                            "message": f"There are no results for scope '{scope}' on this page.",
                                            "data": [{"key": "scope", "value": scope}]}}
        result: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList", "id": f"projects/{self.project}/aggregated/instances",
            "items": items, "selfLink": f"{API}/projects/{self.project}/aggregated/instances"}
        if following:
            result["nextPageToken"] = following
        if unreachable:
            result["unreachables"] = [f"zones/{zone}" for zone in unreachable]
        return result

    def _aggregated_routers(self) -> dict[str, Any]:
        """routers.aggregatedList: ``items`` keyed ``regions/<region>``, each with its ``routers``
        or a NO_RESULTS_ON_PAGE warning (one page: a project has few routers)."""
        regions = sorted({zone.rsplit("-", 1)[0] for zone in self.zones} | {r for (p, r, _) in self.routers
                                                                              if p == self.project})
        items: dict[str, Any] = {}
        for region in regions:
            found = [router for (project, where, _), router in sorted(self.routers.items())
                     if project == self.project and where == region]
            scope = f"regions/{region}"
            items[scope] = {"routers": found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{scope}' on this page.",
                "data": [{"key": "scope", "value": scope}]}}
        return {"kind": "compute#routerAggregatedList", "id": f"projects/{self.project}/aggregated/routers",
                "items": items, "selfLink": f"{API}/projects/{self.project}/aggregated/routers"}

    # -- operations ------------------------------------------------------------------------

    def _start_operation(self, zone: str, kind: str, instance: str, fault: _OperationFault | None = None,
                         apply: Callable[[], None] | None = None) -> dict[str, Any]:
        """A zonal operation on an instance, or (``zone`` GLOBAL) a global one on a firewall rule."""
        name = f"operation-{next(self._ids)}"
        scope = "global" if zone == GLOBAL else f"zones/{zone}"
        target = f"global/firewalls/{instance}" if zone == GLOBAL else f"zones/{zone}/instances/{instance}"
        body = {
            "kind": "compute#operation", "id": name.split("-")[1], "name": name, "operationType": kind,
            "status": "RUNNING", "progress": 0, "targetLink": f"{API}/projects/{self.project}/{target}",
            "selfLink": f"{API}/projects/{self.project}/{scope}/operations/{name}",
        }
        if zone != GLOBAL:
            body["zone"] = f"{API}/projects/{self.project}/zones/{zone}"
        done_at = time.monotonic() + self.operation_seconds
        operation = _Operation(body, zone, kind, instance, done_at, fault, apply)
        self._operations[(zone, name)] = operation
        self._pending.append(operation)
        return dict(body)

    def _poll(self, zone: str, name: str, hold: bool) -> dict[str, Any]:
        operation = self._operations.get((zone, name))
        if operation is None:
            scope = "global" if zone == GLOBAL else f"zones/{zone}"
            raise ApiError(404, f"The resource 'projects/{self.project}/{scope}/operations/{name}' was not found")
        if operation.body["status"] != "DONE" and hold and not self.wait_returns_early:
            # zoneOperations.wait: "This method is called on a best-effort basis ... when the
            # server is overloaded, the request might return before the default deadline is
            # reached, or might return after zero seconds" (REST reference): wait_returns_early.
            raise _Hold(min(max(operation.done_at - time.monotonic(), 0.0), self.wait_hold_seconds))
        return dict(operation.body)

    def _finish(self, operation: _Operation) -> None:
        key = (operation.zone, operation.instance)
        self._pending.remove(operation)
        operation.body.update(status="DONE", progress=100)
        if operation.apply is not None:
            operation.apply()
        elif operation.fault is not None:
            self.instances.pop(key, None)
            error: dict[str, Any] = {"code": operation.fault.code, "message": operation.fault.message}
            if operation.fault.details:
                error["errorDetails"] = operation.fault.details
            operation.body.update(
                error={"errors": [error]},
                httpErrorStatusCode=operation.fault.http_status,
                httpErrorMessage=STATUS_TEXT.get(operation.fault.http_status, "ERROR"))
        elif operation.kind == "insert" and key in self.instances:
            instance = self.instances[key]
            instance["status"] = "RUNNING"
            self._assign_nat(instance)
        elif operation.kind == "delete":
            self.instances.pop(key, None)
