# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Compute Engine edge: the only importer of google-cloud-compute, google-auth and api-core.

Everything above this file sees plain dataclasses (``GceInstance``, ``InsertSpec``)
and our three error classes; every SDK exception and every failed zone operation is
classified by ``classify`` (one mapping, status code first, then the reason).

Bounded time: google-api-core retries some methods by itself (``get`` and
``aggregatedList`` on 503 for up to 600 s). Every call here passes ``retry=None`` and
an explicit ``timeout``, and operations are waited on with ``ZoneOperationsClient.wait``
in a loop bounded by ``OPERATION_TIMEOUT_SECONDS``. Retrying is the controller's job
(per-object backoff), not the module's.

Credentials: the service-account key file ``credentialsFile`` when configured (read at
the first API call, so a Secret mounted later heals: missing is ``Transient``, not a
credentials file is ``Permanent``), else Application Default Credentials. An
``apiEndpoint`` of ``http://`` on a loopback address with no ``credentialsFile`` uses
anonymous credentials: that is a local emulator, and no token must be sent to it. No
credential material is ever put in a message.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Type
from urllib.parse import urlsplit

try:
    import google.auth
    import requests
    from google.api_core import exceptions as api_exceptions
    from google.api_core.client_options import ClientOptions
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1
    from google.oauth2 import service_account
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    HAS_GOOGLE = False
else:
    HAS_GOOGLE = True

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)

SCOPES = ("https://www.googleapis.com/auth/compute",)
# One HTTP request (get, insert, delete, one aggregatedList page, one operation wait).
REQUEST_TIMEOUT_SECONDS = 30.0
# A whole insert or delete, from the request to the operation's DONE. Past it the
# module fails transient; the retry finds the instance by name (or finds it gone).
OPERATION_TIMEOUT_SECONDS = 240.0
# ZoneOperations.wait returns after at most ~2 minutes server-side; ask for less.
WAIT_CALL_SECONDS = 60.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# Reasons (error.errors[].reason, or an operation error's code) that heal by themselves
# although their HTTP status says otherwise: rate limits and quotas are 403 on Google APIs,
# a zone out of capacity fails the operation.
TRANSIENT_REASONS = frozenset((
    "rateLimitExceeded", "userRateLimitExceeded", "quotaExceeded", "backendError", "internalError",
    "QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_OPERATION_RATE_EXCEEDED", "RATE_LIMIT_EXCEEDED", "INTERNAL_ERROR",
))
# Zone warnings in an aggregated list that are not failures.
HARMLESS_SCOPE_WARNINGS = frozenset(("NO_RESULTS_ON_PAGE",))


def classify(status: Optional[int], reasons: Sequence[str], message: str, missing: str = "not_found") -> ProxyError:
    """The one status-to-class mapping: 404 not_found, 400/403 permanent, 429/5xx/the rest transient.

    ``missing`` says what a 404 means here: ``not_found`` when the thing asked for is
    the instance (a retired zone too: nothing can live there), ``permanent`` when the
    404 is about something the request referenced (an image, a network) in a finished
    operation. Rate-limit and quota reasons are transient whatever their status.
    """
    if any(reason in TRANSIENT_REASONS for reason in reasons):
        return Transient(message)
    if status == 404:
        return NotFound(message) if missing == "not_found" else Permanent(message)
    if status in (400, 401, 403, 409, 412, 413):
        return Permanent(message)
    return Transient(message)


def _reasons(error: Any) -> List[str]:
    reasons = [str(item.get("reason")) for item in getattr(error, "errors", None) or () if isinstance(item, dict)]
    if getattr(error, "reason", None):
        reasons.append(str(error.reason))
    return reasons


def classify_exception(error: BaseException, context: str) -> ProxyError:
    """Unpack an SDK, HTTP or auth exception into ``classify``. Never quotes credentials."""
    if isinstance(error, api_exceptions.GoogleAPICallError):
        status = error.code if isinstance(error.code, int) else None
        return classify(status, _reasons(error), "%s: %s" % (context, error.message))
    if isinstance(error, auth_exceptions.RefreshError):
        # A revoked or deleted key does not come back; a token endpoint hiccup does.
        if getattr(error, "retryable", False):
            return Transient("%s: refreshing the access token failed; will retry" % context)
        return Permanent("%s: the credentials were refused when fetching an access token; check the "
                         "service account and its key" % context)
    if isinstance(error, (requests.exceptions.Timeout, requests.exceptions.ConnectionError,
                          auth_exceptions.TransportError)):
        return Transient("%s: %s" % (context, type(error).__name__))
    return Transient("%s: %s: %s" % (context, type(error).__name__, error))


def _api_errors() -> Tuple[Type[BaseException], ...]:
    return (api_exceptions.GoogleAPICallError, auth_exceptions.GoogleAuthError, requests.exceptions.RequestException)


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


@dataclass(frozen=True)
class InsertSpec:
    name: str
    zone: str
    machine_type: str  # a URL or partial URL, e.g. zones/<zone>/machineTypes/e2-small
    source_image: str
    network: str
    external_ip: bool
    labels: Dict[str, str]
    metadata: Sequence[Tuple[str, str]]


@dataclass
class AggregatedListing:
    instances: List[GceInstance] = field(default_factory=list)
    failed_zones: Dict[str, ProxyError] = field(default_factory=dict)


def _is_loopback_http(endpoint: Optional[str]) -> bool:
    if not endpoint:
        return False
    parts = urlsplit(endpoint)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


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
        # Workload identity or a mounted GOOGLE_APPLICATION_CREDENTIALS may appear later.
        raise Transient("gcp: no Application Default Credentials found and no gcp.credentialsFile configured; "
                        "will retry") from error
    return credentials


def _metadata_dict(instance: Any) -> Dict[str, str]:
    return {item.key: item.value for item in instance.metadata.items}


def _to_gce_instance(instance: Any) -> GceInstance:
    nat_ip = internal_ip = None
    if instance.network_interfaces:
        nic = instance.network_interfaces[0]
        internal_ip = nic.network_i_p or None
        for access in nic.access_configs:
            if access.nat_i_p:
                nat_ip = access.nat_i_p
                break
    return GceInstance(
        name=instance.name, zone=instance.zone.rsplit("/", 1)[-1], status=instance.status,
        labels=dict(instance.labels), metadata=_metadata_dict(instance), nat_ip=nat_ip, internal_ip=internal_ip,
        creation_timestamp=instance.creation_timestamp or None)


class ComputeClient:
    """The calls the provider makes, each bounded in time and failing with our error classes."""

    def __init__(self, settings: GcpSettings) -> None:
        self.project = settings.project
        credentials = load_credentials(settings)
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        self.instances = compute_v1.InstancesClient(credentials=credentials, client_options=options,
                                                    transport="rest")
        self.operations = compute_v1.ZoneOperationsClient(credentials=credentials, client_options=options,
                                                          transport="rest")

    def close(self) -> None:
        """Close the HTTP sessions (the clients keep connections open otherwise)."""
        self.instances.transport.close()  # type: ignore[no-untyped-call]
        self.operations.transport.close()  # type: ignore[no-untyped-call]

    def get(self, zone: str, name: str) -> GceInstance:
        context = "getting instance %s in zone %s" % (name, zone)
        try:
            found = self.instances.get(project=self.project, zone=zone, instance=name, retry=None,
                                       timeout=REQUEST_TIMEOUT_SECONDS)
        except _api_errors() as error:
            raise classify_exception(error, context) from error
        return _to_gce_instance(found)

    def find(self, zone: str, name: str) -> Optional[GceInstance]:
        """``get``, with a missing instance as None."""
        try:
            return self.get(zone, name)
        except NotFound:
            return None

    def insert(self, spec: InsertSpec) -> bool:
        """Create the instance and wait for it. False when one of that name already exists (409)."""
        context = "creating instance %s in zone %s" % (spec.name, spec.zone)
        nic = compute_v1.NetworkInterface(network=spec.network)
        if spec.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        resource = compute_v1.Instance(
            name=spec.name, machine_type=spec.machine_type, labels=dict(spec.labels),
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=(
                compute_v1.AttachedDiskInitializeParams(source_image=spec.source_image)))],
            network_interfaces=[nic],
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in spec.metadata]))
        try:
            operation = self.instances.insert_unary(project=self.project, zone=spec.zone, instance_resource=resource,
                                                    retry=None, timeout=REQUEST_TIMEOUT_SECONDS)
        except api_exceptions.Conflict:
            return False
        except _api_errors() as error:
            raise classify_exception(error, context) from error
        self._wait(spec.zone, operation, context)
        return True

    def delete(self, zone: str, name: str) -> bool:
        """Delete and wait. False when there was nothing to delete (404, a retired zone too)."""
        context = "deleting instance %s in zone %s" % (name, zone)
        try:
            operation = self.instances.delete_unary(project=self.project, zone=zone, instance=name, retry=None,
                                                    timeout=REQUEST_TIMEOUT_SECONDS)
        except api_exceptions.NotFound:
            return False
        except _api_errors() as error:
            raise classify_exception(error, context) from error
        self._wait(zone, operation, context)
        return True

    def _wait(self, zone: str, operation: Any, context: str) -> None:
        deadline = time.monotonic() + OPERATION_TIMEOUT_SECONDS
        while operation.status != compute_v1.Operation.Status.DONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Transient("%s: operation %s still not done after %ds; will retry" % (
                    context, operation.name, OPERATION_TIMEOUT_SECONDS))
            try:
                operation = self.operations.wait(
                    project=self.project, zone=zone, operation=operation.name, retry=None,
                    timeout=min(remaining, WAIT_CALL_SECONDS + REQUEST_TIMEOUT_SECONDS))
            except _api_errors() as error:
                raise classify_exception(error, "%s: waiting for operation %s" % (context, operation.name)) from error
        if operation.error.errors:
            details = "; ".join("%s: %s" % (e.code, e.message) for e in operation.error.errors)
            # The operation's own 404s are about what the request referenced (image, network).
            raise classify(operation.http_error_status_code or None, [e.code for e in operation.error.errors],
                           "%s: %s" % (context, details), missing="permanent")

    def aggregated_list(self, list_filter: str, zones: Iterable[str]) -> AggregatedListing:
        """Instances matching ``list_filter`` in ``zones``, in one aggregatedList (paged).

        Zones not asked for are ignored. A zone the API reports as unreachable (a scope
        warning other than "no results", or listed in ``unreachables``) is a failed zone;
        a failure of the whole call fails every zone with the same error.
        """
        wanted = set(zones)
        listing = AggregatedListing()
        # google-cloud-compute 1.57 has no returnPartialSuccess for instances: an unreachable
        # zone comes back as a scope warning (or in ``unreachables``), not as a failed call.
        request = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=list_filter)
        try:
            for page in self.instances.aggregated_list(request=request, retry=None,
                                                       timeout=REQUEST_TIMEOUT_SECONDS).pages:
                for scope, scoped in page.items.items():
                    zone = scope.split("/", 1)[1] if scope.startswith("zones/") else ""
                    if zone not in wanted:
                        continue
                    # proto-plus annotates this field "Warning", which mypy reads as the builtin.
                    warning: Any = scoped.warning
                    if "warning" in scoped and warning.code not in HARMLESS_SCOPE_WARNINGS:
                        listing.failed_zones[zone] = Transient("listing zone %s: %s: %s" % (
                            zone, warning.code, warning.message))
                    listing.instances.extend(_to_gce_instance(found) for found in scoped.instances)
                for scope in page.unreachables:
                    zone = scope.split("/", 1)[-1]
                    if zone in wanted and zone not in listing.failed_zones:
                        listing.failed_zones[zone] = Transient("listing zone %s: unreachable" % zone)
        except _api_errors() as error:
            failure = classify_exception(error, "listing instances (aggregated)")
            return AggregatedListing([], dict.fromkeys(sorted(wanted), failure))
        return listing
