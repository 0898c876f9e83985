# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Compute Engine edge: the only importer of google-cloud-compute, google-auth and api-core.

Everything above this file sees plain dataclasses (``GceInstance``, ``InsertSpec``)
and our three error classes; every SDK exception and every failed zone operation is
classified by ``classify`` (one mapping, status code first, then the reason).

Get, insert, delete and operations go through google-cloud-compute's clients (imported at
their first use: ``_sdk``). Listings read the API's JSON pages themselves, with google-auth's
AuthorizedSession and api-core's exceptions (``ComputeClient._pages`` says why).

Bounded time: google-api-core retries some methods by itself (``get`` and
``aggregatedList`` on 503 for up to 600 s). Every SDK call here passes ``retry=None`` and
an explicit ``timeout``; every list page has that timeout and is not retried. Operations
are waited on with ``ZoneOperationsClient.wait``, which the server holds open for up to 2
minutes per call ("Waits for the specified Operation resource to return as DONE or for the
request to approach the 2 minute deadline", zoneOperations.wait in the Compute API
reference): each wait call's client timeout is that hold plus one request timeout, and no
new call starts past the caller's deadline. Retrying is the controller's job (per-object backoff), not the module's.

Credentials: the service-account key file ``credentialsFile`` when configured (read at
the first API call, so a Secret mounted later heals: missing is ``Transient``, not a
credentials file is ``Permanent``), else Application Default Credentials (a missing ADC
is ``Permanent``, with the ways to provide them in the message). An ``apiEndpoint`` of
``http://`` on a loopback address with no ``credentialsFile`` uses anonymous
credentials: that is a local emulator, and no token must be sent to it. No credential
material is ever put in a message.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Type
from urllib.parse import urlsplit

try:
    import google.auth
    import requests
    from google.api_core import exceptions as api_exceptions
    from google.api_core.client_options import ClientOptions
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from google.oauth2 import service_account
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    HAS_GOOGLE = False
else:
    # google-cloud-compute itself is imported where it is first used (``_sdk``).
    try:
        HAS_GOOGLE = importlib.util.find_spec("google.cloud.compute_v1") is not None
    except ModuleNotFoundError:  # pragma: no cover - no google.cloud at all
        HAS_GOOGLE = False

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import list_locations

SCOPES = ("https://www.googleapis.com/auth/compute",)
# One HTTP request (get, insert, delete, one list page).
REQUEST_TIMEOUT_SECONDS = 30.0
# Instances per list page: maxResults' largest value, and its default ("Acceptable values are 0
# to 500, inclusive. (Default: 500)", instances.list and instances.aggregatedList).
LIST_PAGE_SIZE = 500
# zoneOperations.wait: the server holds each call open until the operation is DONE or
# "the request approaches the 2 minute deadline" (Compute API reference).
SERVER_WAIT_HOLD_SECONDS = 120.0
# One wait call's client-side timeout: the server's hold plus one request's allowance, so a
# wait the server holds to its end is answered, not cut off as a timeout.
WAIT_CALL_TIMEOUT_SECONDS = SERVER_WAIT_HOLD_SECONDS + REQUEST_TIMEOUT_SECONDS
# Waiting on operations in one module run, in all (a create across zones, or a delete): no
# new wait call or insert starts past it. With the last wait call and one request the run
# ends within 240 + 150 + 30 = 420 s, below the controller's 600 s runner timeout. Past it
# the run fails transient; the retry finds the instance by name (or finds it gone).
OPERATION_TIMEOUT_SECONDS = 240.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Where the API is when the config names no apiEndpoint (InstancesClient.DEFAULT_ENDPOINT).
DEFAULT_API_HOST = "compute.googleapis.com"


def operation_deadline() -> float:
    """The ``time.monotonic()`` past which a run starts no new insert or wait call."""
    return time.monotonic() + OPERATION_TIMEOUT_SECONDS


# zoneOperations.wait "is called on a best-effort basis ... when the server is overloaded, the
# request might return before the default deadline is reached, or might return after zero
# seconds" (REST reference): a wait answered early with the operation still running is followed
# by a pause before the next call, doubling from the first to the last, never past the deadline.
EARLY_WAIT_SECONDS = 5.0  # a wait answered sooner than this did not hold
FIRST_POLL_PAUSE_SECONDS = 0.5
LAST_POLL_PAUSE_SECONDS = 8.0
# What a token without a Compute scope gets (403 "Request had insufficient authentication
# scopes.", reason insufficientPermissions, ErrorInfo ACCESS_TOKEN_SCOPE_INSUFFICIENT): a VM's
# or GKE node's default service account carries only the "default access scopes" unless the VM
# was given more, and IAM roles cannot widen a token's scopes.
SCOPE_REASONS = frozenset(("insufficientPermissions", "ACCESS_TOKEN_SCOPE_INSUFFICIENT"))
SCOPES_HINT = (
    "the credentials' OAuth access scopes do not include Compute Engine: Application Default Credentials of a VM "
    "or GKE node created with the default access scopes carry only storage/logging/monitoring ones, whatever IAM "
    "roles the service account has. Grant the access scope https://www.googleapis.com/auth/cloud-platform (or "
    "https://www.googleapis.com/auth/compute) to the VM or node pool (gcloud compute instances set-service-account "
    "--scopes=cloud-platform, with the VM stopped; a new node pool for GKE), or use Workload Identity, or set "
    "gcp.credentialsFile to a service-account key")
# A machine type a zone does not offer is a 400 invalid naming it: "Invalid value for field
# 'resource.machineType': '...'. Machine type with name 'f1-micro' does not exist in zone
# 'europe-west8-a'." It lasts (machine types come to a zone rarely), so placement moves on.
MACHINE_TYPE_NOT_IN_ZONE_RE = re.compile(r"Machine type with name '([^']+)' does not exist in zone '([^']+)'")
# A quota, as the message words it: "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."
# (or "... globally."), or, newer, only "Quota 'N2_CPUS' exceeded." (the region is then in the
# operation error's errorDetails[].quotaInfo.dimensions only).
QUOTA_NAME_RE = re.compile(r"Quota '([A-Z0-9_]+)' exceeded\.")
QUOTA_LIMIT_RE = re.compile(r"Limit: ([0-9.]+) (?:in region ([a-z0-9-]+)|(globally))")
QUOTA_REASONS = frozenset(("quotaExceeded", "QUOTA_EXCEEDED"))

# A zone out of capacity: the insert is accepted and its operation fails with one of these
# codes (HTTP 503 in httpErrorStatusCode). It lasts, so the provider moves to another zone.
STOCKOUT_REASONS = frozenset(("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"))
# Reasons (error.errors[].reason, or an operation error's code) that heal by themselves
# although their HTTP status says otherwise: rate limits and quotas are 403 on Google APIs,
# and ``resourceNotReady`` is the 400 for an instance in transition (being created or
# deleted), which a later call gets past.
TRANSIENT_REASONS = frozenset((
    "rateLimitExceeded", "userRateLimitExceeded", "quotaExceeded", "backendError", "internalError",
    "resourceNotReady", "QUOTA_EXCEEDED", "RESOURCE_OPERATION_RATE_EXCEEDED", "RATE_LIMIT_EXCEEDED",
    "INTERNAL_ERROR", *STOCKOUT_REASONS,
))
# Zone warnings in an aggregated list that are not failures.
HARMLESS_SCOPE_WARNINGS = frozenset(("NO_RESULTS_ON_PAGE",))
# A zone that does not exist is a 400 ``invalid``, not a 404:
# "Invalid value for field 'zone': 'us-east1'. Unknown zone."
UNKNOWN_ZONE_MARKER = "Unknown zone"
# What a 404 on an insert (or in its operation) is about, from the resource path the API
# quotes ("The resource 'projects/debian-cloud/global/images/family/debian-13' was not
# found"), as the module option or config field to fix. Subnetworks before networks.
REFERENCED_FIELDS = (("/machineTypes/", "machine_type"), ("/images/", "image"), ("/subnetworks/", "subnetwork"),
                     ("/networks/", "network"))


class StockOut(Transient):
    """A zone has no capacity for the instance right now (the insert's operation said so)."""

    def __init__(self, zone: str, message: str) -> None:
        super().__init__(message)
        self.zone = zone


class QuotaExceeded(Transient):
    """A quota of the project is used up (it frees when instances go). ``region`` is the region of
    a regional quota (another region's zones may still take the instance), None for a
    project-wide one; ``quota`` its name (CPUS, IN_USE_ADDRESSES, ...)."""

    def __init__(self, message: str, quota: Optional[str], region: Optional[str]) -> None:
        super().__init__(message)
        self.quota = quota
        self.region = region


def _project_wide(name: str) -> bool:
    return "ALL_REGIONS" in name.upper().replace("-", "_") or "GLOBAL" in name.upper()


def quota_exceeded(message: str, tried_region: Optional[str],
                   info: Optional[Mapping[str, Any]] = None) -> QuotaExceeded:
    """The quota error of an insert tried in ``tried_region``: what is used up, where and its limit,
    from the structured ``quotaInfo`` (an operation error's ``errorDetails[]``) first, the message's
    text second.

    Where neither names a region nor says project-wide (a bare "Quota 'N2_CPUS' exceeded." without
    details), the quota is taken as the tried zone's region's (the documented choice): the create
    then moves on to another region, which costs one insert if the quota was project-wide after
    all, whereas taking it as project-wide would stop a failover that may well succeed."""
    info = info or {}
    named = QUOTA_NAME_RE.search(message)
    limited = QUOTA_LIMIT_RE.search(message)
    metric = str(info.get("metricName") or "").rsplit("/", 1)[-1].upper() or None
    quota = metric or (named.group(1) if named else None)
    limit = info.get("limit") if info.get("limit") is not None else (limited.group(1) if limited else None)
    dimensions = info.get("dimensions") or {}
    assumed = ""
    if dimensions.get("region"):
        region: Optional[str] = str(dimensions["region"])
    elif limited and limited.group(2):
        region = limited.group(2)
    elif (limited and limited.group(3)) or _project_wide(str(info.get("limitName") or "")) or \
            _project_wide(quota or ""):
        region = None
    else:
        region = tried_region
        assumed = " (the answer names no region: taken as the tried zone's)" if region else ""
    where = "region %s%s" % (region, assumed) if region else "the project (all regions)"
    what = "quota %s" % quota if quota else "a quota of the project"
    of_limit = " (limit %s)" % limit if limit is not None else ""
    return QuotaExceeded("%s: %s is used up in %s%s; it frees when instances are deleted, or ask for a higher limit "
                         "on the console's Quotas page" % (message, what, where, of_limit), quota, region)


class MissingReference(Permanent):
    """An insert referenced something that does not exist (an image, a machine type, a network).

    ``field`` is the module option or config field it came from, so the provider can name it.
    """

    def __init__(self, field: Optional[str], message: str) -> None:
        super().__init__(message)
        self.field = field


class MachineTypeNotInZone(MissingReference):
    """The zone does not offer the machine type (a 400 on the insert); another zone may."""

    def __init__(self, zone: str, message: str) -> None:
        super().__init__("machine_type", message)
        self.zone = zone


def referenced_field(message: str) -> Optional[str]:
    for marker, name in REFERENCED_FIELDS:
        if marker in message:
            return name
    return None


def classify(status: Optional[int], reasons: Sequence[str], message: str, missing: str = "not_found") -> ProxyError:
    """The one status-to-class mapping: 404 not_found, 400/403 permanent, 429/5xx/the rest transient.

    ``missing`` says what a 404 means here: ``not_found`` when the thing asked for is
    the instance (a zone that does not exist too: nothing can live there, and the API
    says so with a 400 "Unknown zone"), ``permanent`` when the 404 is about something
    the request referenced (an image, a network). Rate-limit, quota, capacity and
    "not ready" reasons are transient whatever their status.
    """
    if any(reason in TRANSIENT_REASONS for reason in reasons):
        return Transient(message)
    if status == 404:
        return NotFound(message) if missing == "not_found" else Permanent(message)
    if status == 400 and missing == "not_found" and UNKNOWN_ZONE_MARKER in message:
        return NotFound(message)
    if status in (400, 401, 403, 409, 412, 413):
        return Permanent(message)
    return Transient(message)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _quota_info_json(info: Any) -> Dict[str, Any]:
    """The SDK's ``QuotaExceededInfo`` in the API's JSON names, unset fields left out."""
    names = (("metricName", "metric_name"), ("limitName", "limit_name"), ("limit", "limit"))
    found = {key: getattr(info, field) for key, field in names if field in info}
    return {**found, "dimensions": dict(info.dimensions)}


def _reasons(error: Any) -> List[str]:
    reasons = [str(item.get("reason")) for item in getattr(error, "errors", None) or () if isinstance(item, dict)]
    if getattr(error, "reason", None):
        reasons.append(str(error.reason))
    return reasons


def classify_exception(error: BaseException, context: str, missing: str = "not_found",
                       region: Optional[str] = None) -> ProxyError:
    """Unpack an SDK, HTTP or auth exception into ``classify``. Never quotes credentials.
    ``region``: where the request was tried (for a quota error that does not say)."""
    if isinstance(error, api_exceptions.GoogleAPICallError):
        status = error.code if isinstance(error.code, int) else None
        # The HTTP status leads the API's message: "403 Required 'compute.instances.create' ...".
        message = "%s: %s %s" % (context, status, error.message) if status else "%s: %s" % (context, error.message)
        reasons = _reasons(error)
        if status == 403 and SCOPE_REASONS.intersection(reasons):
            return Permanent("%s; %s" % (message, SCOPES_HINT))
        if QUOTA_REASONS.intersection(reasons):
            return quota_exceeded(message, region)
        return classify(status, reasons, message, missing=missing)
    if isinstance(error, auth_exceptions.RefreshError):
        # A revoked or deleted key does not come back; a token endpoint hiccup does.
        if getattr(error, "retryable", False):
            return Transient("%s: refreshing the access token failed; will retry" % context)
        return Permanent("%s: the credentials were refused when fetching an access token; check the "
                         "service account and its key" % context)
    if isinstance(error, (requests.exceptions.Timeout, requests.exceptions.ConnectionError,
                          auth_exceptions.TransportError)):
        return Transient("%s: %s" % (context, unreachable_cause(error)))
    return Transient("%s: %s: %s" % (context, type(error).__name__, error))


def _endpoint_of(error: BaseException) -> Optional[str]:
    """``scheme://host:port`` of the request that failed: never its path or query."""
    request = getattr(error, "request", None)
    url = getattr(request, "url", None)
    if not url:
        return None
    parts = urlsplit(str(url))
    return "%s://%s" % (parts.scheme, parts.netloc.rsplit("@", 1)[-1]) if parts.netloc else None


def _root_cause(error: BaseException) -> str:
    """The innermost reason a connection failed ("[Errno 111] Connection refused", "timed out"):
    requests, urllib3 and google-auth wrap it in layers whose own text repeats the URL."""
    queue: List[BaseException] = [error]
    seen: Set[int] = set()
    reason = ""
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            reason = "[Errno %s] %s" % (current.errno, current.strerror) if current.errno else current.strerror
        linked = (getattr(current, "reason", None), *getattr(current, "args", ()), current.__cause__,
                  current.__context__)
        queue.extend(item for item in linked if isinstance(item, BaseException))
    return reason or str(error).rsplit(": ", 1)[-1].strip(" '\")") or "no reason given"


def unreachable_cause(error: BaseException) -> str:
    """What a failed connection says to a person: the endpoint and the cause, e.g. ``cannot
    reach https://compute.googleapis.com: ConnectionError: [Errno 111] Connection refused``."""
    endpoint = _endpoint_of(error)
    where = "cannot reach %s" % endpoint if endpoint else "cannot reach the endpoint"
    return "%s: %s: %s" % (where, type(error).__name__, _root_cause(error))


def _api_errors() -> Tuple[Type[BaseException], ...]:
    return (api_exceptions.GoogleAPICallError, auth_exceptions.GoogleAuthError, requests.exceptions.RequestException)


@dataclass(frozen=True)
class CloudNat:
    """One Cloud NAT of a Cloud Router: its region and network (a URL), which subnetworks' ranges it
    translates (``ranges``: ALL_SUBNETWORKS_ALL_IP_RANGES, ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES or
    LIST_OF_SUBNETWORKS, then ``subnetworks`` names them)."""

    name: str
    region: str
    network: str
    ranges: str
    subnetworks: Tuple[str, ...] = ()


@dataclass(frozen=True)
class GceInstance:
    """What the provider needs of a Compute ``Instance``."""

    name: str
    zone: str
    status: str
    labels: Dict[str, str]
    metadata: Dict[str, str]
    nat_ip: Optional[str]
    internal_ip: Optional[str]
    creation_timestamp: Optional[str]
    network_tags: Tuple[str, ...] = ()


@dataclass(frozen=True)
class InsertSpec:
    name: str
    zone: str
    machine_type: str  # zones/<zone>/machineTypes/<type>, always of this zone
    source_image: str
    network: str
    external_ip: bool
    labels: Dict[str, str]
    metadata: Sequence[Tuple[str, str]]
    subnetwork: Optional[str] = None  # regions/<region>/subnetworks/<name> or a URL; None: the network's own
    network_tags: Tuple[str, ...] = ()


@dataclass(frozen=True)
class FirewallRule:
    """A VPC firewall rule, as much of it as the provider writes or checks. ``allowed`` and
    ``denied`` are (protocol, ports) pairs, ports as the API writes them ("3128", "8000-8100")."""

    name: str
    network: str
    source_ranges: Tuple[str, ...] = ()
    allowed: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    denied: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    target_tags: Tuple[str, ...] = ()
    direction: str = "INGRESS"
    priority: int = 1000
    disabled: bool = False
    description: str = ""


@dataclass
class AggregatedListing:
    instances: List[GceInstance] = field(default_factory=list)
    failed_zones: Dict[str, ProxyError] = field(default_factory=dict)


def _is_loopback_http(endpoint: Optional[str]) -> bool:
    if not endpoint:
        return False
    parts = urlsplit(endpoint)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


NO_CREDENTIALS_MESSAGE = (
    "gcp: no credentials: gcp.credentialsFile is not set and Application Default Credentials were not found "
    "(no GOOGLE_APPLICATION_CREDENTIALS, no gcloud application-default login, no GCE/GKE metadata server); "
    "set gcp.credentialsFile to a service-account key file (a mounted Secret), or run the controller with "
    "Workload Identity or an attached service account")


def load_credentials(settings: GcpSettings) -> Any:
    """The credentials the clients use (see the module docstring for the rules)."""
    if settings.credentials_file:
        path = settings.credentials_file
        if not os.path.exists(path):
            raise Transient("gcp.credentialsFile: %s does not exist (yet): the Secret may not be mounted; "
                            "will retry" % path)
        try:
            # Service-account keys only: google-auth's generic loader would also follow
            # external-account files, whose URLs a config file should not be able to direct.
            credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                path, scopes=list(SCOPES))
        except OSError as error:
            raise Transient("gcp.credentialsFile: cannot read %s: %s; will retry" % (path, error.strerror)) from error
        except (auth_exceptions.GoogleAuthError, ValueError) as error:
            # The SDK's text may quote the file; say only what is wrong with it.
            raise Permanent("gcp.credentialsFile: %s is not a service-account key file (the JSON key of a "
                            "service account is expected); replace it" % path) from error
        return credentials
    if _is_loopback_http(settings.api_endpoint):
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    try:
        credentials, _project = google.auth.default(scopes=list(SCOPES))
    except auth_exceptions.DefaultCredentialsError as error:
        # google-auth has already probed the metadata server (three tries): a deployment
        # without any credential source does not grow one by itself, so retrying forever
        # would hide a configuration error. The message says how to provide one.
        raise Permanent(NO_CREDENTIALS_MESSAGE) from error
    return credentials


def _to_gce_instance(instance: Mapping[str, Any]) -> GceInstance:
    """What the provider needs of an ``Instance``, from the resource's JSON: as a listing reads it
    from the API, and as the SDK's ``get`` answer gives it back (``Message.to_dict`` with the
    JSON field names)."""
    nat_ip = internal_ip = None
    interfaces = instance.get("networkInterfaces") or []
    if interfaces:
        internal_ip = interfaces[0].get("networkIP") or None
        nat_ip = next((access["natIP"] for access in interfaces[0].get("accessConfigs") or [] if access.get("natIP")),
                      None)
    items = (instance.get("metadata") or {}).get("items") or []
    return GceInstance(
        name=str(instance.get("name") or ""), zone=str(instance.get("zone") or "").rsplit("/", 1)[-1],
        status=str(instance.get("status") or ""), labels=dict(instance.get("labels") or {}),
        metadata={str(item.get("key") or ""): str(item.get("value") or "") for item in items}, nat_ip=nat_ip,
        internal_ip=internal_ip, creation_timestamp=instance.get("creationTimestamp") or None,
        network_tags=tuple((instance.get("tags") or {}).get("items") or ()))


def _to_rule(found: Any) -> FirewallRule:
    return FirewallRule(
        name=found.name, network=found.network, source_ranges=tuple(found.source_ranges),
        allowed=tuple((a.I_p_protocol, tuple(a.ports)) for a in found.allowed),
        denied=tuple((d.I_p_protocol, tuple(d.ports)) for d in found.denied), target_tags=tuple(found.target_tags),
        direction=found.direction or "INGRESS", priority=found.priority if "priority" in found else 1000,
        disabled=bool(found.disabled), description=found.description)


def _firewall_resource(rule: FirewallRule) -> Any:
    compute_v1 = _sdk()
    return compute_v1.Firewall(
        name=rule.name, network=rule.network, direction=rule.direction, priority=rule.priority,
        source_ranges=list(rule.source_ranges), target_tags=list(rule.target_tags), description=rule.description,
        allowed=[compute_v1.Allowed(I_p_protocol=protocol, ports=list(ports)) for protocol, ports in rule.allowed])


def api_base_url(api_endpoint: Optional[str]) -> str:
    """The URL the API's paths go under: ``apiEndpoint`` (https unless it names a scheme, as the
    SDK's REST transport reads it), else the SDK's default host."""
    endpoint = (api_endpoint or DEFAULT_API_HOST).rstrip("/")
    return endpoint if endpoint.startswith(("http://", "https://")) else "https://" + endpoint


def _sdk() -> Any:
    """google-cloud-compute, imported at its first use: its generated package takes 1-2 s to
    import (more than listing a few hundred instances takes), and the call made most often, a
    listing (one per sweep and provider), does not use it; get, insert and delete do."""
    from google.cloud import compute_v1
    return compute_v1


def _scope_zone(scope: str) -> str:
    return scope.split("/", 1)[1] if scope.startswith("zones/") else ""


class ComputeClient:
    """The calls the provider makes, each bounded in time and failing with our error classes."""

    def __init__(self, settings: GcpSettings) -> None:
        self.project = settings.project
        self._credentials = load_credentials(settings)
        self._options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        self._sdk_clients: Dict[str, Any] = {}
        self._sdk_lock = threading.Lock()
        # The listing's own HTTP session (``_pages``), with the same credentials.
        self.session = AuthorizedSession(self._credentials)  # type: ignore[no-untyped-call]
        self.base_url = "%s/compute/v1/projects/%s" % (api_base_url(settings.api_endpoint), self.project)

    def _sdk_client(self, kind: str) -> Any:
        """One of the SDK's clients (``InstancesClient``, ``FirewallsClient``, ...), made at its first use and
        shared by the run's threads from then on."""
        with self._sdk_lock:
            if kind not in self._sdk_clients:
                self._sdk_clients[kind] = getattr(_sdk(), kind)(credentials=self._credentials,
                                                                client_options=self._options, transport="rest")
            return self._sdk_clients[kind]

    @property
    def instances(self) -> Any:
        return self._sdk_client("InstancesClient")

    @property
    def operations(self) -> Any:
        return self._sdk_client("ZoneOperationsClient")

    @property
    def firewalls(self) -> Any:
        return self._sdk_client("FirewallsClient")

    @property
    def global_operations(self) -> Any:
        return self._sdk_client("GlobalOperationsClient")

    @property
    def routers(self) -> Any:
        return self._sdk_client("RoutersClient")

    def close(self) -> None:
        """Close the HTTP sessions (the clients keep connections open otherwise)."""
        for sdk_client in self._sdk_clients.values():
            sdk_client.transport.close()
        self.session.close()  # type: ignore[no-untyped-call]

    def get(self, zone: str, name: str) -> GceInstance:
        """The instance; NotFound when it does not exist, or its zone does not."""
        context = "getting instance %s in zone %s" % (name, zone)
        try:
            found = self.instances.get(project=self.project, zone=zone, instance=name, retry=None,
                                       timeout=REQUEST_TIMEOUT_SECONDS)
        except _api_errors() as error:
            raise classify_exception(error, context) from error
        return _to_gce_instance(_sdk().Instance.to_dict(found, preserving_proto_field_name=False))

    def find(self, zone: str, name: str) -> Optional[GceInstance]:
        """``get``, with a missing instance as None."""
        try:
            return self.get(zone, name)
        except NotFound:
            return None

    def insert(self, spec: InsertSpec, deadline: float) -> bool:
        """Create the instance and wait for it (no new wait call past ``deadline``, a
        ``time.monotonic()`` value). False when one of that name already exists (409).

        A 404, on the request or in its operation, is ``MissingReference`` naming what was
        missing; a zone out of capacity is ``StockOut``.
        """
        context = "creating instance %s in zone %s" % (spec.name, spec.zone)
        compute_v1 = _sdk()
        nic = compute_v1.NetworkInterface(network=spec.network)
        if spec.subnetwork:
            nic.subnetwork = spec.subnetwork
        if spec.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        resource = compute_v1.Instance(
            name=spec.name, machine_type=spec.machine_type, labels=dict(spec.labels),
            tags=compute_v1.Tags(items=list(spec.network_tags)),
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=(
                compute_v1.AttachedDiskInitializeParams(source_image=spec.source_image)))],
            network_interfaces=[nic],
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in spec.metadata]))
        try:
            operation = self.instances.insert_unary(project=self.project, zone=spec.zone, instance_resource=resource,
                                                    retry=None, timeout=REQUEST_TIMEOUT_SECONDS)
        except api_exceptions.Conflict:
            return False
        except api_exceptions.NotFound as error:
            # GCE checks the image and network before it accepts the insert: synchronous 404.
            message = "%s: 404 %s" % (context, error.message)
            raise MissingReference(referenced_field(error.message or ""), message) from error
        except api_exceptions.BadRequest as error:
            if MACHINE_TYPE_NOT_IN_ZONE_RE.search(error.message or ""):
                raise MachineTypeNotInZone(spec.zone, "%s: 400 %s" % (context, error.message)) from error
            raise classify_exception(error, context, missing="permanent") from error
        except _api_errors() as error:
            raise classify_exception(error, context, missing="permanent", region=region_of(spec.zone)) from error
        self._wait(operation, context, deadline, spec.zone)
        return True

    def delete(self, zone: str, name: str, deadline: float) -> bool:
        """Delete and wait. False when there was nothing to delete (404, a zone that does not exist too).

        An instance still in transition (being created, or already being deleted by an
        earlier run that timed out) answers 400 ``resourceNotReady``: transient, the retry
        finds it gone or deletes it then.
        """
        context = "deleting instance %s in zone %s" % (name, zone)
        try:
            operation = self.instances.delete_unary(project=self.project, zone=zone, instance=name, retry=None,
                                                    timeout=REQUEST_TIMEOUT_SECONDS)
        except _api_errors() as error:
            failure = classify_exception(error, context)
            if isinstance(failure, NotFound):
                return False
            if "resourceNotReady" in _reasons(error):
                raise Transient("%s: the instance is in transition (still being created or deleted); will retry"
                                % context) from error
            raise failure from error
        self._wait(operation, context, deadline, zone)
        return True

    def _wait(self, operation: Any, context: str, deadline: float, zone: Optional[str] = None,
              project: Optional[str] = None) -> None:
        """Wait on a zonal operation (``zone``) or a global one (firewalls, in ``project``) until
        DONE, then raise its error. A wait call answered before it could have held (the API
        may answer at once when loaded) is followed by a pause, doubling up to the last, so an
        early-answering server is polled with backoff rather than in a tight loop."""
        started = time.monotonic()
        compute_v1 = _sdk()
        pause = FIRST_POLL_PAUSE_SECONDS
        while operation.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() >= deadline:
                raise Transient("%s: operation %s still not done after %ds; will retry" % (
                    context, operation.name, time.monotonic() - started))
            called = time.monotonic()
            try:
                # Never shorter than the server's hold: a wait that runs to the 2-minute
                # deadline is a normal answer ("still running"), not a timeout.
                if zone is None:
                    operation = self.global_operations.wait(project=project or self.project, operation=operation.name,
                                                            retry=None, timeout=WAIT_CALL_TIMEOUT_SECONDS)
                else:
                    operation = self.operations.wait(project=self.project, zone=zone, operation=operation.name,
                                                     retry=None, timeout=WAIT_CALL_TIMEOUT_SECONDS)
            except _api_errors() as error:
                raise classify_exception(error, "%s: waiting for operation %s" % (context, operation.name)) from error
            if operation.status != compute_v1.Operation.Status.DONE and time.monotonic() - called < EARLY_WAIT_SECONDS:
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(pause * 2, LAST_POLL_PAUSE_SECONDS)
        if operation.error.errors:
            codes = [e.code for e in operation.error.errors]
            details = "; ".join("%s: %s" % (e.code, e.message) for e in operation.error.errors)
            message = "%s: %s" % (context, details)
            if any(code in STOCKOUT_REASONS for code in codes) and zone is not None:
                raise StockOut(zone, message)
            quota = next((e for e in operation.error.errors if e.code in QUOTA_REASONS), None)
            if quota is not None:
                info = next((_quota_info_json(detail.quota_info) for detail in quota.error_details
                             if "quota_info" in detail), None)
                raise quota_exceeded(message, region_of(zone) if zone else None, info)
            status = operation.http_error_status_code or None
            if status == 404:
                # The operation's own 404s are about what the request referenced (image, network).
                raise MissingReference(referenced_field(details), message)
            raise classify(status, codes, message, missing="permanent")

    # -- firewall rules (global resources of the network's project) ------------------------------

    def firewall(self, project: str, name: str) -> Optional[FirewallRule]:
        """The rule of that name, None when there is none."""
        context = "reading firewall rule %s in project %s" % (name, project)
        try:
            return _to_rule(self.firewalls.get(project=project, firewall=name, retry=None,
                                               timeout=REQUEST_TIMEOUT_SECONDS))
        except _api_errors() as error:
            failure = classify_exception(error, context)
            if isinstance(failure, NotFound):
                return None
            raise failure from error

    def firewall_rules(self, project: str) -> List[FirewallRule]:
        """Every firewall rule of the project (paged)."""
        request = _sdk().ListFirewallsRequest(project=project)
        try:
            return [_to_rule(found) for page in self.firewalls.list(
                request=request, retry=None, timeout=REQUEST_TIMEOUT_SECONDS).pages for found in page.items]
        except _api_errors() as error:
            raise classify_exception(error, "listing the firewall rules of project %s" % project,
                                     missing="permanent") from error

    def put_firewall(self, project: str, rule: FirewallRule, exists: bool, deadline: float) -> bool:
        """Create the rule, or (``exists``) patch it to ``rule``; wait for the operation. False
        when a create met a rule of that name made meanwhile (409): the caller reads it again."""
        verb = "updating" if exists else "creating"
        context = "%s firewall rule %s in project %s" % (verb, rule.name, project)
        try:
            if exists:
                operation = self.firewalls.patch_unary(project=project, firewall=rule.name,
                                                       firewall_resource=_firewall_resource(rule), retry=None,
                                                       timeout=REQUEST_TIMEOUT_SECONDS)
            else:
                operation = self.firewalls.insert_unary(project=project, firewall_resource=_firewall_resource(rule),
                                                        retry=None, timeout=REQUEST_TIMEOUT_SECONDS)
        except api_exceptions.Conflict:
            return False
        except _api_errors() as error:
            raise classify_exception(error, context, missing="permanent") from error
        self._wait(operation, context, deadline, project=project)
        return True

    def delete_firewall(self, project: str, name: str, deadline: float) -> None:
        context = "deleting firewall rule %s in project %s" % (name, project)
        try:
            operation = self.firewalls.delete_unary(project=project, firewall=name, retry=None,
                                                    timeout=REQUEST_TIMEOUT_SECONDS)
        except _api_errors() as error:
            failure = classify_exception(error, context)
            if isinstance(failure, NotFound):
                return
            raise failure from error
        self._wait(operation, context, deadline, project=project)

    def cloud_nats(self, project: str) -> List[CloudNat]:
        """Every Cloud NAT of the project's Cloud Routers (one routers.aggregatedList)."""
        request = _sdk().AggregatedListRoutersRequest(project=project)
        try:
            return [CloudNat(name="%s/%s" % (router.name, nat.name), region=scope.rsplit("/", 1)[-1],
                             network=router.network, ranges=nat.source_subnetwork_ip_ranges_to_nat,
                             subnetworks=tuple(sub.name.rsplit("/", 1)[-1] for sub in nat.subnetworks))
                    for scope, scoped in self.routers.aggregated_list(request=request, retry=None,
                                                                      timeout=REQUEST_TIMEOUT_SECONDS)
                    for router in scoped.routers for nat in router.nats]
        except _api_errors() as error:
            raise classify_exception(error, "listing the Cloud Routers of project %s" % project,
                                     missing="permanent") from error

    def list_instances(self, list_filter: str, zones: Iterable[str]) -> AggregatedListing:
        """Instances matching ``list_filter`` in ``zones``; a zone that cannot be listed fails alone.

        One aggregatedList, LIST_PAGE_SIZE instances a page, each page's ``nextPageToken`` sent
        back with the request otherwise unchanged (``_pages``), when all is well. Without
        ``returnPartialSuccess`` (google-cloud-compute 1.57 cannot ask for it, so the listing
        does not either) one unreachable zone fails the whole aggregated call; so a transient
        failure of that call is followed by one paged ``instances.list`` per zone, zones side by
        side, and a zone then fails only if its own listing does. A configured zone the
        aggregated answer does not mention (the API lists every zone it knows, an empty one with
        ``NO_RESULTS_ON_PAGE``) is listed on its own too: a zone that does not exist then fails
        ``permanent`` instead of looking empty. Zones not asked for are ignored.
        """
        wanted = list(dict.fromkeys(zones))
        try:
            listing, seen = self._aggregated(list_filter, wanted)
        except _api_errors() as error:
            failure = classify_exception(error, "listing instances (aggregated)")
            if not isinstance(failure, Transient):  # forbidden, bad filter: every zone would say the same
                return AggregatedListing([], dict.fromkeys(wanted, failure))
            listing, seen = AggregatedListing(), set()
        found, failed = list_locations([zone for zone in wanted if zone not in seen], str,
                                       lambda zone: self._list_zone(zone, list_filter))
        listing.instances.extend(found)
        listing.failed_zones.update(failed)
        return listing

    def _pages(self, path: str, list_filter: str) -> Iterator[Dict[str, Any]]:
        """Every page of a list method under the project, as the API's JSON.

        The SDK's REST transport reads every answer into protobuf messages through protobuf's
        ``json_format``, in Python: for a listing of 10,000 instances that was more than half of
        the module's time (docs/performance.md). A listing reads only a few fields, so it asks
        for the pages itself, with the SDK's own parts: google-auth's AuthorizedSession (the
        session the transport uses, same credentials) and api-core's ``from_http_response`` for
        an error answer (the exception the transport raises, so ``classify`` sees the same).
        """
        params: Dict[str, Any] = {"filter": list_filter, "maxResults": LIST_PAGE_SIZE}
        while True:
            response = self.session.get("%s/%s" % (self.base_url, path), params=params,
                                        timeout=REQUEST_TIMEOUT_SECONDS)
            if response.status_code >= 400:
                raise api_exceptions.from_http_response(response)  # type: ignore[no-untyped-call]
            page = response.json()
            yield page
            if not page.get("nextPageToken"):
                return
            params["pageToken"] = page["nextPageToken"]

    def _aggregated(self, list_filter: str, wanted: List[str]) -> Tuple[AggregatedListing, Set[str]]:
        """Every page of the aggregated list: the instances of the ``wanted`` zones, the zones that
        failed in it (a scope warning, ``unreachables``) and the zones it answered for."""
        listing = AggregatedListing()
        seen: Set[str] = set()
        for page in self._pages("aggregated/instances", list_filter):
            for scope, scoped in (page.get("items") or {}).items():
                zone = _scope_zone(scope)
                if zone not in wanted:
                    continue
                seen.add(zone)
                warning = scoped.get("warning") or {}
                if warning and warning.get("code") not in HARMLESS_SCOPE_WARNINGS:
                    listing.failed_zones[zone] = Transient("listing zone %s: %s: %s" % (
                        zone, warning.get("code"), warning.get("message")))
                listing.instances.extend(_to_gce_instance(found) for found in scoped.get("instances") or [])
            for scope in page.get("unreachables") or []:
                zone = scope.split("/", 1)[-1]
                if zone in wanted and zone not in listing.failed_zones:
                    listing.failed_zones[zone] = Transient("listing zone %s: unreachable" % zone)
        return listing, seen

    def _list_zone(self, zone: str, list_filter: str) -> List[GceInstance]:
        context = "listing zone %s" % zone
        try:
            return [_to_gce_instance(found) for page in self._pages("zones/%s/instances" % zone, list_filter)
                    for found in page.get("items") or []]
        except _api_errors() as error:
            failure = classify_exception(error, context, missing="permanent")
            if UNKNOWN_ZONE_MARKER in str(failure):
                raise Permanent("%s; the zone does not exist: fix gcp.zones" % failure) from error
            raise failure from error
