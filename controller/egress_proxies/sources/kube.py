"""The Kubernetes API edge: the only module of the controller that imports the ``kubernetes`` client.

``KubeStore`` is ``store.ProxyStore`` for ``crawl.example.com/v1alpha1`` proxies, ``KubeLeases``
is the Lease adapter ``leader.LeaseElector`` writes through, and ``kube_client`` builds the
ApiClient (in-cluster or from a kubeconfig). The loop and the command build these; everything
above sees plain dicts, ``resources.proxy.Proxy`` and ``store.StoreError`` subclasses. Client errors
become those subclasses in ``store_error`` and nowhere else.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar, cast

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from egress_proxies.resources import times
from egress_proxies.resources.pool import POOL_KIND, POOL_PLURAL, Pool
from egress_proxies.resources.proxy import API_VERSION, GROUP, KIND, PLURAL, VERSION, Proxy
from egress_proxies.sources.store import Conflict, Gone, StoreError, WatchEvent, WatchExpired

log = logging.getLogger(__name__)

COMPONENT = "egress-proxies"
# Bounds every plain request, so a hung API server stalls a sweep, not the controller.
DEFAULT_REQUEST_TIMEOUT = 30.0
_CONNECT_TIMEOUT = 10.0
# A watch's server closes the stream after timeoutSeconds; the client gives up on a silent
# connection only this much later, so a half-open TCP connection cannot hang the watch forever.
_WATCH_READ_SLACK = 15.0
_WATCH_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED"})  # BOOKMARKs carry no object change
# events.k8s.io/v1 caps an Event's note (core v1's message) at 1 KiB; longer ones are refused.
_EVENT_MESSAGE_LIMIT = 1024
_EVENT_NAME_LIMIT = 253

LEASE_GROUP = "coordination.k8s.io"
LEASE_VERSION = "v1"
LEASE_PLURAL = "leases"

Obj = dict[str, Any]

_ERROR_BY_STATUS: dict[int, type[StoreError]] = {404: Gone, 409: Conflict, 410: WatchExpired}


def store_error(error: ApiException | urllib3.exceptions.HTTPError, what: str) -> StoreError:
    """The one place an HTTP status (or a transport failure) becomes a StoreError subclass.

    404 → Gone, 409 (stale resourceVersion, or AlreadyExists on create) → Conflict, 410 →
    WatchExpired; every other status, and anything that never got an answer (refused,
    reset, timed out, retries exhausted on 429/503), is a plain StoreError: retry later.
    """
    if isinstance(error, ApiException):
        status = int(error.status or 0)
        return _ERROR_BY_STATUS.get(status, StoreError)(f"{what}: HTTP {status}: {_api_message(error)}")
    return StoreError(f"{what}: {error}")


def _api_message(error: ApiException) -> str:
    """The server's Status message when it sent one, else the HTTP reason."""
    try:
        status = json.loads(error.body or "")
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(error.reason or "no reason given")


# Attempts per call (the first and three retries, urllib3's default count), all within the
# call's one timeout. Retried: what cost the server no work (see bounded_call), and 429/503
# (the server asks for a retry, with Retry-After), except for a POST, which may not be idempotent.
_MAX_ATTEMPTS = 4
_RETRY_STATUSES = frozenset({429, 503})
_FIRST_BACKOFF = 0.2
# Below this much time left another attempt cannot do anything useful.
_MIN_ATTEMPT_SECONDS = 0.05


def _retry_after(error: ApiException, attempt: int) -> float:
    """Seconds the server asked to wait (Retry-After in seconds), else exponential backoff."""
    header = error.headers.get("Retry-After") if error.headers is not None else None
    try:
        return max(0.0, float(str(header)))
    except ValueError:
        return _FIRST_BACKOFF * 2.0 ** (attempt - 1)


def bounded_call(what: str, timeout: float, call: Callable[..., object], *args: Any, idempotent: bool = True,
                 clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> object:
    """``call(*args, **kwargs)`` with retries, all of it within ``timeout`` seconds.

    The client's own retries (urllib3's, when the ApiClient has them) give every attempt a
    fresh timeout: 4 attempts of 30 s made one list take 121 s against a server that accepts
    and never answers. Here each attempt gets only what is left of the one deadline, so a
    call ends within ``timeout`` (plus scheduling slack) whatever happens, and a read timeout
    is never retried: it has used the time up.
    """
    deadline = clock() + timeout
    attempt = 0
    while True:
        attempt += 1
        remaining = deadline - clock()
        try:
            return call(*args, _request_timeout=max(remaining, _MIN_ATTEMPT_SECONDS), **kwargs)
        except ApiException as error:
            status = int(error.status or 0)
            wait = _retry_after(error, attempt)
            if not (idempotent and status in _RETRY_STATUSES and attempt < _MAX_ATTEMPTS
                    and clock() + wait + _MIN_ATTEMPT_SECONDS < deadline):
                raise store_error(error, what) from error
        except urllib3.exceptions.HTTPError as error:
            wait = _FIRST_BACKOFF * 2.0 ** (attempt - 1)
            # Retryable: the request never left (refused, or the connect timed out: urllib3's
            # NewConnectionError is a ConnectTimeoutError), or a kept-alive connection the server
            # had closed dropped it (ProtocolError) and replaying it is safe (a PUT carries its
            # resourceVersion, so a duplicate is a 409, never a second write).
            retryable = isinstance(error, urllib3.exceptions.ConnectTimeoutError) or (
                idempotent and isinstance(error, urllib3.exceptions.ProtocolError))
            if not (retryable and attempt < _MAX_ATTEMPTS and clock() + wait + _MIN_ATTEMPT_SECONDS < deadline):
                raise store_error(error, what) from error
        log.debug("%s: attempt %d failed, retrying in %.1f s", what, attempt, wait)
        time.sleep(wait)


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except (ApiException, urllib3.exceptions.HTTPError) as error:
        raise store_error(error, what) from error


def watch_objects(plural: str, call: Callable[..., object], args: tuple[str, ...], resource_version: str,
                  timeout_seconds: int) -> Iterator[Obj]:
    """ADDED/MODIFIED/DELETED events of ``plural`` after ``resource_version`` (one request).

    With timeout_seconds set the client makes exactly one request and turns an ERROR event (410
    Expired when resource_version left the server's history) into an ApiException, so expiry
    reaches store_error like any other status."""
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    with _translated(f"watching {plural} from resourceVersion {resource_version}"):
        events = cast(Iterator[Obj], stream.stream(  # type: ignore[no-untyped-call]
            call, *args, resource_version=resource_version, timeout_seconds=timeout_seconds,
            _request_timeout=(_CONNECT_TIMEOUT, timeout_seconds + _WATCH_READ_SLACK)))
        try:
            for event in events:
                if event["type"] in _WATCH_TYPES:
                    yield event
        finally:
            # A consumer that stops early closes this generator; closing the client's releases
            # the HTTP connection instead of leaving the stream open.
            cast(Any, events).close()


def _list_call(objects: client.CustomObjectsApi, namespace: str | None,
               plural: str) -> tuple[Callable[..., object], tuple[str, ...]]:
    """The list call (and its arguments) for one kind of ours: cluster-wide, or in ``namespace``."""
    if namespace is None:
        return objects.list_cluster_custom_object, (GROUP, VERSION, plural)
    return objects.list_namespaced_custom_object, (GROUP, VERSION, namespace, plural)


# Items per page of a list, as client-go's pager (tools/pager) asks by default: no answer holds
# 10,000 Proxies at once (their bytes, their text and their parse side by side were the peak of a
# sweep's memory), and the apiserver serves the pages from one snapshot.
LIST_PAGE_SIZE = 500
# How often a list is started over when its continue token expires between two pages (410: more
# writes than etcd keeps since the first page) before the sweep fails and tries next time.
LIST_RESTARTS = 3


def paged_list(what: str, timeout: float, call: Callable[..., object], *args: Any,
               page_size: int = LIST_PAGE_SIZE) -> tuple[list[Obj], str]:
    """Every item of a list ``call`` and the list's resourceVersion, read ``page_size`` at a time
    with ``limit``/``continue``; each page is one ``bounded_call``. A continue token that expired
    starts the list over, as client-go's pager does; the items are always one snapshot's."""
    for _attempt in range(LIST_RESTARTS):
        items: list[Obj] = []
        token: str | None = None
        try:
            while True:
                paging: dict[str, Any] = {"limit": page_size} if token is None else {
                    "limit": page_size, "_continue": token}
                listing = cast(Obj, bounded_call(what, timeout, call, *args, **paging))
                items.extend(listing.get("items") or [])
                metadata = listing.get("metadata") or {}
                token = metadata.get("continue") or None
                if token is None:
                    return items, str(metadata.get("resourceVersion", ""))
        except WatchExpired:
            log.info("%s: the list's continue token expired between pages; listing again", what)
    raise StoreError(f"{what}: the list changed faster than it could be read in pages "
                     f"({LIST_RESTARTS} tries); trying again next sweep")


JsonT = TypeVar("JsonT")


def json_copy(value: JsonT) -> JsonT:
    """A deep copy of JSON data (dicts, lists, immutable scalars), as everything read from or
    written to the API is: what ``copy.deepcopy`` makes of it in a third of the time (no memo,
    no dispatch by type), which counts when a sweep reads 10,000 Proxies."""
    if isinstance(value, dict):
        return cast(JsonT, {key: json_copy(item) for key, item in value.items()})
    if isinstance(value, list):
        return cast(JsonT, [json_copy(item) for item in value])
    return value


def _proxy(obj: Obj) -> Proxy:
    # The Proxy gets its own spec and status: a caller changing them in place (nested values
    # included) must not change the object a later PUT sends back. ``from_object`` copies their
    # top level only, and makes the metadata it keeps into new strings, lists and dicts, so only
    # these two are copied deeply, not the whole object (managedFields is most of a real one,
    # and a sweep reads every Proxy: docs/performance.md).
    own = {**obj, "spec": json_copy(obj.get("spec")), "status": json_copy(obj.get("status"))}
    proxy = Proxy.from_object(own)
    proxy.raw = obj
    return proxy


class KubeStore:
    """Proxies in one namespace (``namespace``) or all of them (``None``).

    Writes are PUTs of the object as read, carrying its resourceVersion: a change by anyone
    in between is a 409 (``Conflict``), never a silent overwrite, and nothing the controller
    did not mean to change (labels, spec, fields it does not know) is rebuilt or lost.
    """

    def __init__(self, api_client: client.ApiClient, namespace: str | None = None,
                 field_manager: str = COMPONENT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.namespace = namespace
        self.field_manager = field_manager
        self.request_timeout = request_timeout
        self._objects = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def _list_call(self) -> tuple[Callable[..., object], tuple[str, ...]]:
        return _list_call(self._objects, self.namespace, PLURAL)

    def list_proxies(self) -> tuple[list[Proxy], str]:
        call, args = self._list_call()
        items, version = paged_list(f"listing {PLURAL}", self.request_timeout, call, *args)
        return [_proxy(item) for item in items], version

    def get_proxy(self, namespace: str, name: str) -> Proxy:
        obj = bounded_call(f"reading proxy {namespace}/{name}", self.request_timeout,
                           self._objects.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        return _proxy(cast(Obj, obj))

    def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        call, args = self._list_call()
        for event in watch_objects(PLURAL, call, args, resource_version, timeout_seconds):
            yield WatchEvent(event["type"], _proxy(event["raw_object"]))

    def _as_read(self, proxy: Proxy) -> Obj:
        """The object at the resourceVersion ``proxy`` was read at, to send back with changes.

        A Proxy built by hand carries no raw object: read it again, and if it moved on since
        the version the caller saw, that is a conflict like any other.
        """
        if proxy.raw is not None:
            return json_copy(proxy.raw)
        fresh = self.get_proxy(proxy.namespace, proxy.name)
        if fresh.resource_version != proxy.resource_version:
            raise Conflict(f"proxy {proxy.key} changed since it was read (resourceVersion "
                           f"{proxy.resource_version or 'unknown'}, now {fresh.resource_version})")
        return cast(Obj, fresh.raw)

    def replace_metadata(self, proxy: Proxy) -> Proxy:
        body = self._as_read(proxy)
        metadata = body.setdefault("metadata", {})
        metadata["resourceVersion"] = proxy.resource_version
        for key, value in (("finalizers", list(proxy.finalizers)), ("annotations", dict(proxy.annotations))):
            if value:
                metadata[key] = value
            else:
                metadata.pop(key, None)
        obj = bounded_call(f"updating metadata of proxy {proxy.key}", self.request_timeout,
                           self._objects.replace_namespaced_custom_object, GROUP, VERSION, proxy.namespace, PLURAL,
                           proxy.name, body, field_manager=self.field_manager)
        return _proxy(cast(Obj, obj))

    def replace_status(self, proxy: Proxy) -> Proxy:
        body = self._as_read(proxy)
        body.setdefault("metadata", {})["resourceVersion"] = proxy.resource_version
        body["status"] = json_copy(proxy.status)
        obj = bounded_call(f"updating status of proxy {proxy.key}", self.request_timeout,
                           self._objects.replace_namespaced_custom_object_status, GROUP, VERSION, proxy.namespace,
                           PLURAL, proxy.name, body, field_manager=self.field_manager)
        return _proxy(cast(Obj, obj))

    def namespace_identities(self, namespaces: Collection[str]) -> dict[str, str]:
        """Each existing namespace's uid: one Namespace read when this store watches one namespace,
        else one list of them all (the ClusterRole grants get and list on namespaces)."""
        wanted = set(namespaces) if self.namespace is None else set(namespaces) & {self.namespace}
        if not wanted:
            return {}
        if self.namespace is not None:
            try:
                found = [bounded_call(f"reading namespace {self.namespace}", self.request_timeout,
                                      self._core.read_namespace, self.namespace)]
            except Gone:
                return {}
        else:
            listing = bounded_call("listing namespaces", self.request_timeout, self._core.list_namespace)
            found = list(cast(client.V1NamespaceList, listing).items)
        return {str(item.metadata.name): str(item.metadata.uid) for item in cast(list[client.V1Namespace], found)
                if item.metadata is not None and item.metadata.name in wanted and item.metadata.uid}

    def record_event(self, proxy: Proxy | Pool, event_type: str, reason: str, message: str) -> None:
        now = times.now().replace(microsecond=0)
        # client-go's naming: the object's name and the time in hex nanoseconds.
        suffix = f".{time.time_ns():x}"
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=proxy.name[:_EVENT_NAME_LIMIT - len(suffix)] + suffix,
                                         namespace=proxy.namespace),
            involved_object=client.V1ObjectReference(
                api_version=API_VERSION, kind=POOL_KIND if isinstance(proxy, Pool) else KIND,
                namespace=proxy.namespace, name=proxy.name,
                uid=proxy.uid or None, resource_version=proxy.resource_version or None),
            reason=reason, message=message[:_EVENT_MESSAGE_LIMIT], type=event_type,
            source=client.V1EventSource(component=COMPONENT),
            first_timestamp=now, last_timestamp=now, count=1)
        try:
            what = "pool" if isinstance(proxy, Pool) else "proxy"
            bounded_call(f"recording event {reason} on {what} {proxy.key}", self.request_timeout,
                         self._core.create_namespaced_event, proxy.namespace, event, idempotent=False,
                         field_manager=self.field_manager)
        except StoreError as error:
            # Events are for humans; losing one must never fail or slow down a reconcile.
            log.warning("event not recorded (%s: %s): %s", reason, message, error)


class KubePools:
    """``store.PoolStore`` on the Kubernetes API: ProxyPools (status subresource, Events) and the
    member Proxies a pool creates and deletes. Same namespace rule as ``KubeStore``."""

    def __init__(self, api_client: client.ApiClient, namespace: str | None = None,
                 field_manager: str = COMPONENT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.namespace = namespace
        self.field_manager = field_manager
        self.request_timeout = request_timeout
        self._objects = client.CustomObjectsApi(api_client)
        self._events = KubeStore(api_client, namespace, field_manager, request_timeout)
        self._missing_logged = False

    def list_pools(self) -> list[Pool]:
        call, args = self._list_call()
        try:
            items, _version = paged_list(f"listing {POOL_PLURAL}", self.request_timeout, call, *args)
        except Gone:
            # 404 on the collection: the ProxyPool CRD is not installed (a cluster upgraded from
            # before pools): there are no pools, which is not a failure of the sweep.
            if not self._missing_logged:
                log.info("the ProxyPool CRD (%s.%s) is not installed: no pools", POOL_PLURAL, GROUP)
                self._missing_logged = True
            return []
        self._missing_logged = False
        return [Pool.from_object(json_copy(item)) for item in items]

    def _list_call(self) -> tuple[Callable[..., object], tuple[str, ...]]:
        return _list_call(self._objects, self.namespace, POOL_PLURAL)

    def list_version(self) -> str:
        """The pool list's resourceVersion, to watch from: a page of one item carries the list's
        resourceVersion as the whole list would."""
        call, args = self._list_call()
        listing = cast(Obj, bounded_call(f"listing {POOL_PLURAL}", self.request_timeout, call, *args, limit=1))
        return str(listing["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[str]:
        """The resourceVersion of each pool change after ``resource_version`` (a scale, a new pool,
        a deletion): each one only wakes the sweep. Raises WatchExpired like ``watch_proxies``."""
        call, args = self._list_call()
        for event in watch_objects(POOL_PLURAL, call, args, resource_version, timeout_seconds):
            yield str(event["raw_object"].get("metadata", {}).get("resourceVersion") or resource_version)

    def create_proxy(self, namespace: str, body: Obj) -> None:
        # Not retried (a POST): a repeat after a lost answer is a 409, which the caller reads as "exists".
        bounded_call(f"creating proxy {namespace}/{body['metadata']['name']}", self.request_timeout,
                     self._objects.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, body,
                     idempotent=False, field_manager=self.field_manager)

    def delete_proxy(self, namespace: str, name: str) -> None:
        try:
            bounded_call(f"deleting proxy {namespace}/{name}", self.request_timeout,
                         self._objects.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        except Gone:
            pass  # gone already: what was asked

    def _body(self, pool: Pool) -> Obj:
        body = json_copy(pool.raw) if pool.raw is not None else {
            "apiVersion": API_VERSION, "kind": POOL_KIND, "metadata": {"name": pool.name, "namespace": pool.namespace},
            "spec": pool.spec}
        body.setdefault("metadata", {})["resourceVersion"] = pool.resource_version
        return body

    def replace_pool_metadata(self, pool: Pool) -> Pool:
        body = self._body(pool)
        metadata = body["metadata"]
        for key, value in (("finalizers", list(pool.finalizers)), ("annotations", dict(pool.annotations))):
            if value:
                metadata[key] = value
            else:
                metadata.pop(key, None)
        obj = bounded_call(f"updating metadata of pool {pool.key}", self.request_timeout,
                           self._objects.replace_namespaced_custom_object, GROUP, VERSION, pool.namespace,
                           POOL_PLURAL, pool.name, body, field_manager=self.field_manager)
        return Pool.from_object(json_copy(cast(Obj, obj)))

    def replace_pool_status(self, pool: Pool) -> Pool:
        body = self._body(pool)
        body["status"] = json_copy(pool.status)
        obj = bounded_call(f"updating status of pool {pool.key}", self.request_timeout,
                           self._objects.replace_namespaced_custom_object_status, GROUP, VERSION, pool.namespace,
                           POOL_PLURAL, pool.name, body, field_manager=self.field_manager)
        return Pool.from_object(json_copy(cast(Obj, obj)))

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, message: str) -> None:
        self._events.record_event(pool, event_type, reason, message)


class KubeLeases:
    """``leader.LeaseApi``: coordination.k8s.io/v1 Leases as plain dicts.

    Through CustomObjectsApi rather than CoordinationV1Api: the URLs are the same, but the
    typed client turns every body into a V1Lease and writes its datetimes with
    ``isoformat()``, which drops the fraction when the microseconds are 0; a real API
    server's MicroTime parser wants exactly six fractional digits and refuses that. A dict
    body goes out as written, in the format ``leader`` chose.
    """

    def __init__(self, api_client: client.ApiClient, field_manager: str = COMPONENT,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.field_manager = field_manager
        self.request_timeout = request_timeout
        self._objects = client.CustomObjectsApi(api_client)

    def get(self, namespace: str, name: str) -> Obj | None:
        try:
            obj = bounded_call(f"reading lease {namespace}/{name}", self.request_timeout,
                               self._objects.get_namespaced_custom_object, LEASE_GROUP, LEASE_VERSION, namespace,
                               LEASE_PLURAL, name)
        except Gone:
            return None
        return cast(Obj, obj)

    def create(self, namespace: str, body: Obj) -> Obj:
        obj = bounded_call(f"creating lease {namespace}/{body['metadata']['name']}", self.request_timeout,
                           self._objects.create_namespaced_custom_object, LEASE_GROUP, LEASE_VERSION, namespace,
                           LEASE_PLURAL, body, idempotent=False, field_manager=self.field_manager)
        return cast(Obj, obj)

    def replace(self, namespace: str, name: str, body: Obj) -> Obj:
        obj = bounded_call(f"updating lease {namespace}/{name}", self.request_timeout,
                           self._objects.replace_namespaced_custom_object, LEASE_GROUP, LEASE_VERSION, namespace,
                           LEASE_PLURAL, name, body, field_manager=self.field_manager)
        return cast(Obj, obj)


class KubeSecrets:
    """``credentials.SecretBackend``: one Secret per Proxy namespace in the controller's own
    namespace (RBAC on Secrets is granted only there), labelled with that namespace. The annotation
    ``crawl.example.com/rotate`` on a Secret asks for a new credential; deleting the Secret does
    too. Secret names come from Proxy namespaces the sweep has validated; the API server checks
    them once more."""

    ROTATE_ANNOTATION = f"{GROUP}/rotate"
    PROXY_NAMESPACE = f"{GROUP}/proxy-namespace"  # the label naming the Proxy namespace a Secret is for

    def __init__(self, api_client: client.ApiClient, namespace: str, field_manager: str = COMPONENT,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.namespace = namespace
        self.field_manager = field_manager
        self.request_timeout = request_timeout
        self._core = client.CoreV1Api(api_client)

    @staticmethod
    def secret_name(proxy_namespace: str) -> str:
        return f"egress-proxies-credentials-{proxy_namespace}"

    def _read(self, name: str) -> client.V1Secret | None:
        try:
            return cast(client.V1Secret, bounded_call(f"reading secret {self.namespace}/{name}", self.request_timeout,
                                                      self._core.read_namespaced_secret, name, self.namespace))
        except Gone:
            return None

    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        secret = self._read(self.secret_name(namespace))
        return None if secret is None else self._fields(secret)

    def _fields(self, secret: client.V1Secret) -> tuple[dict[str, str], bool]:
        data = {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}
        rotate = self.ROTATE_ANNOTATION in ((secret.metadata.annotations or {}) if secret.metadata else {})
        return data, rotate

    def load_all(self) -> dict[str, tuple[dict[str, str], bool]]:
        """Every credential Secret (one list, by the label every one carries), by Proxy namespace."""
        listing = bounded_call(f"listing secrets in {self.namespace}", self.request_timeout,
                               self._core.list_namespaced_secret, self.namespace, label_selector=self.PROXY_NAMESPACE)
        found: dict[str, tuple[dict[str, str], bool]] = {}
        for secret in cast(client.V1SecretList, listing).items:
            labels = (secret.metadata.labels or {}) if secret.metadata is not None else {}
            namespace = labels.get(self.PROXY_NAMESPACE, "")
            # Only what this controller named so: a Secret merely carrying the label is not one.
            if secret.metadata is not None and secret.metadata.name == self.secret_name(namespace):
                found[namespace] = self._fields(secret)
        return found

    def delete(self, namespace: str) -> None:
        name = self.secret_name(namespace)
        try:
            bounded_call(f"deleting secret {self.namespace}/{name}", self.request_timeout,
                         self._core.delete_namespaced_secret, name, self.namespace)
        except Gone:
            pass  # gone already: what was asked

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        name = self.secret_name(namespace)
        body: Obj = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": COMPONENT,
                                        self.PROXY_NAMESPACE: namespace}},
                "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}}
        existing = self._read(name)
        if existing is None:
            bounded_call(f"creating secret {self.namespace}/{name}", self.request_timeout,
                         self._core.create_namespaced_secret, self.namespace, body, idempotent=False,
                         field_manager=self.field_manager)
            return
        assert existing.metadata is not None
        body["metadata"]["resourceVersion"] = existing.metadata.resource_version  # optimistic
        bounded_call(f"updating secret {self.namespace}/{name}", self.request_timeout,
                     self._core.replace_namespaced_secret, name, self.namespace, body,
                     field_manager=self.field_manager)


class NoClusterConfig(StoreError):
    """Neither a kubeconfig nor a cluster to run in: nothing to connect to."""


# Where the client looks when neither --kubeconfig nor KUBECONFIG says (kube_config.py).
_DEFAULT_KUBECONFIG = "~/.kube/config"
NO_CLUSTER_MESSAGE = ("no kubeconfig (--kubeconfig or KUBECONFIG) and not running in a cluster "
                      "(KUBERNETES_SERVICE_HOST unset)")


def kube_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient with the pod's service account when running in a cluster (and no
    kubeconfig is given), else with the kubeconfig (``None``: $KUBECONFIG or ~/.kube/config).

    Raises ``NoClusterConfig`` (one line, for the command to print) when there is neither.
    The client never retries by itself: ``bounded_call`` does, within each call's timeout.
    """
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if (kubeconfig is None and not in_cluster and not os.environ.get("KUBECONFIG")
            and not os.path.exists(os.path.expanduser(_DEFAULT_KUBECONFIG))):
        raise NoClusterConfig(NO_CLUSTER_MESSAGE)
    configuration = client.Configuration()
    # False, not 0: urllib3 then raises the connection error itself instead of MaxRetryError.
    configuration.retries = False
    try:
        if kubeconfig is None and in_cluster:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            # persist_config=False: never write refreshed credentials back into the file,
            # which is a read-only mount in a pod and the operator's own file elsewhere.
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    except ConfigException as error:
        raise StoreError(f"kubernetes client configuration: {error}") from error
    return client.ApiClient(configuration)
