# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API edge: the only importer of the ``kubernetes`` client in the collection,
and ``classify``, the one place its errors become our error classes.

One thin method per API call, each taking and returning plain dicts (the JSON the server
sent, never the SDK's models), each bounded by ``REQUEST_TIMEOUT`` and each re-raising as
``NotFound`` / ``Permanent`` / ``Transient``. Nothing above this file sees an SDK exception.

Connection: the kubeconfig named in the provider config; without one, the in-cluster
service account when ``KUBERNETES_SERVICE_HOST`` is set. A kubeconfig file that does not
exist (yet) is ``Transient``: it may be a Secret mounted later, and the next sweep heals
without a restart. One that does not parse is ``Permanent``.

Retries: urllib3 would by default retry 413/429/503 answers carrying ``Retry-After`` three
times inside one call, sleeping as told; the controller already backs off per object, so
here only connection failures (nothing reached the server) are retried, twice, and every
error answer goes straight to ``classify`` (measured against the emulator: an injected 503
costs one request).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

try:
    import urllib3
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    HAS_KUBERNETES = False

    class _NotInstalled(Exception):
        """Stands in for the client's exception types, which nothing can raise without it."""

    urllib3 = None  # type: ignore[assignment]
    kube_client = None  # type: ignore[assignment]
    kube_config = None  # type: ignore[assignment]
    ApiException = ConfigException = _NotInstalled  # type: ignore[assignment,misc]
else:
    HAS_KUBERNETES = True

try:
    import yaml
except ImportError:  # pragma: no cover - config.py needs it first and reports it
    yaml = None  # type: ignore[assignment]

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings

# (connect, read) seconds for every request: a wedged API server fails the module as
# transient long before the controller's runner timeout kills the whole run.
REQUEST_TIMEOUT = (5.0, 20.0)
CONNECT_RETRIES = 2
# Pods per list request: the chunk size kubectl and client-go's reflector use. One unpaged list
# of thousands of Pods is tens of MB in one answer the server builds in memory and must send
# within REQUEST_TIMEOUT; in pages each answer is bounded.
LIST_PAGE_SIZE = 500
# A paged list starts again from its first page when its continue token expired (410) between
# two pages, this many times at most; then the listing fails transient.
LIST_ATTEMPTS = 3
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
# Said with every Node call, so a 403 names its fix.
NODES_GRANT = (" (the provider reads the nodes' addresses: its service account needs get and list on nodes, as "
               "the ClusterRole egress-proxies-controller of controller/manifests/rbac.yaml grants)")

# Answers that retrying cannot change: the request itself (400, 405, 413, 415, 422) or our
# credentials and RBAC (401, 403, which also covers an admission webhook or a Pod Security
# level refusing the Pod).
PERMANENT_STATUSES = frozenset((400, 401, 403, 405, 413, 415, 422))
# The two 403s that heal by themselves (k8s.io/apiserver pkg/admission/plugin/resourcequota/
# controller.go, CheckRequest): a namespace's ResourceQuota is full ("exceeded quota: <name>,
# requested: ..., used: ..., limited: ..."), which frees when Pods go; and a quota the quota
# controller has not counted yet ("status unknown for quota: <name>, resources: ...", a new or
# changed quota, until its next sync). ("failed quota: <name>: must specify ..." is a Pod the
# quota can never admit: permanent.)
EXCEEDED_QUOTA_RE = re.compile(r"exceeded quota: ([^,]+),")
UNKNOWN_QUOTA_RE = re.compile(r"status unknown for quota: ([^,]+)")


class AlreadyExists(Transient):
    """409 AlreadyExists on create. The caller reads the existing object to decide whether
    it is ours (idempotent success) or someone else's (permanent); left unhandled it is
    transient, like any conflict."""


class Expired(Transient):
    """410 Expired on a list's next page: its continue token outlived the snapshot it pointed at
    (etcd compacted it, after a few minutes). ``list_pods`` starts the list again; left
    unhandled it is transient."""


def _status_message(error: Any) -> str:
    """The Status object's message when the body is one, else the HTTP reason."""
    body = getattr(error, "body", None)
    try:
        status = json.loads(body) if body else None
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(getattr(error, "reason", "") or body or "no details")


def _status_reason(error: Any) -> str:
    try:
        status = json.loads(error.body) if getattr(error, "body", None) else None
    except ValueError:
        return ""
    return str(status.get("reason") or "") if isinstance(status, dict) else ""


def _quota_refusal(message: str) -> Optional[str]:
    """The message of a ResourceQuota refusal that heals by itself, with what heals it; None for
    any other 403."""
    full = EXCEEDED_QUOTA_RE.search(message)
    if full is not None:
        return "%s (the namespace's ResourceQuota %s is used up; it frees as Pods go, or raise its limit)" % (
            message, full.group(1))
    unknown = UNKNOWN_QUOTA_RE.search(message)
    if unknown is not None:
        return ("%s (the quota controller has not counted the namespace's ResourceQuota %s yet, as after it was "
                "created or changed; it does within its sync period; will retry)" % (message, unknown.group(1)))
    return None


def classify(error: BaseException, context: str) -> ProxyError:
    """Map anything the client raised to our classes; whatever is not recognised is transient.

    404 -> NotFound (a pod, or its whole namespace, is gone); 409 AlreadyExists ->
    AlreadyExists (create decides); 410 -> Expired (a list starts again); a 403 from a
    ResourceQuota that is full or not counted yet -> Transient; PERMANENT_STATUSES ->
    Permanent; every other status (5xx, 429, 409 Conflict) -> Transient. Connection errors and
    timeouts are transient; a TLS certificate the kubeconfig's CA does not accept is permanent.
    """
    if isinstance(error, ProxyError):
        return error
    if isinstance(error, ApiException):
        code = int(error.status or 0)
        message = "%s: %s %s" % (context, code or "", _status_message(error))
        if code == 404:
            return NotFound(message)
        if code == 409 and _status_reason(error) == "AlreadyExists":
            return AlreadyExists(message)
        if code == 403:
            quota = _quota_refusal(message)
            if quota is not None:
                return Transient(quota)
        if code == 410:
            return Expired(message)
        if code in PERMANENT_STATUSES:
            return Permanent(message)
        if code == 0 and "CERTIFICATE_VERIFY_FAILED" in message:  # the client's wrapping of an SSLError
            return Permanent(message + " (the API server's certificate does not verify against the kubeconfig)")
        return Transient(message)
    if isinstance(error, ConfigException):
        return Permanent("%s: %s" % (context, error))
    return Transient("%s: %s: %s" % (context, type(error).__name__, error))  # timeouts, refused connections


def client_errors() -> Tuple[Type[BaseException], ...]:
    """What the client raises for a failed call: the server's answers (ApiException), the
    transport's failures (urllib3, sockets) and the config loader's complaints."""
    return (ApiException, ConfigException, urllib3.exceptions.HTTPError, OSError)


def _configuration(settings: KubernetesSettings) -> Any:
    """A client Configuration from the kubeconfig file, else the in-cluster service account."""
    configuration = kube_client.Configuration()
    path = settings.kubeconfig
    try:
        if path is None:
            if not os.environ.get(IN_CLUSTER_ENV):
                raise Permanent("kubernetes.kubeconfig: not set, and not running inside a cluster (%s is unset); "
                                "set kubeconfig in the provider config" % IN_CLUSTER_ENV)
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            if not os.path.isfile(path):
                raise Transient("kubernetes.kubeconfig: %s does not exist (yet): the Secret holding it may not be "
                                "mounted; will retry" % path)
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=configuration, persist_config=False)
    except OSError as error:
        raise Transient("kubernetes.kubeconfig: cannot read %s: %s; will retry" % (path, error.strerror)) from error
    except (ConfigException, yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError) as error:
        # The loader walks the document without checking its shape first, so a file that
        # is YAML but not a kubeconfig surfaces as a TypeError/AttributeError/KeyError.
        raise Permanent("kubernetes.kubeconfig: %s is not a usable kubeconfig: %s" % (
            path or "in-cluster config", error)) from error
    configuration.retries = urllib3.util.Retry(
        total=CONNECT_RETRIES, connect=CONNECT_RETRIES, read=0, status=0, other=0,
        respect_retry_after_header=False, backoff_factor=0.2, raise_on_status=False)
    return configuration


class KubeClient:
    """The Pod (and Service) calls the provider makes, on plain dicts."""

    def __init__(self, settings: KubernetesSettings) -> None:
        self.api_client = kube_client.ApiClient(_configuration(settings))
        self.core = kube_client.CoreV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]

    def _call(self, context: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Dict[str, Any]:
        try:
            response = method(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
            data = response.data
        except client_errors() as error:
            raise classify(error, context) from error
        try:
            document = json.loads(data)
        except ValueError as error:
            raise Transient("%s: the API server answered with something that is not JSON: %s" % (
                context, error)) from error
        if not isinstance(document, dict):
            raise Transient("%s: the API server answered with a JSON %s, not an object" % (
                context, type(document).__name__))
        return document

    def create_pod(self, namespace: str, pod: Dict[str, Any]) -> Dict[str, Any]:
        return self._call("creating pod %s/%s" % (namespace, pod["metadata"]["name"]),
                          self.core.create_namespaced_pod, namespace, pod)

    def read_pod(self, namespace: str, name: str) -> Dict[str, Any]:
        return self._call("reading pod %s/%s" % (namespace, name), self.core.read_namespaced_pod, name, namespace)

    def delete_pod(self, namespace: str, name: str, uid: Optional[str]) -> Dict[str, Any]:
        """Delete exactly the Pod that was inspected: a uid precondition makes the server
        refuse (409, transient) if a different Pod of that name took its place meanwhile."""
        body: Dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        return self._call("deleting pod %s/%s" % (namespace, name), self.core.delete_namespaced_pod, name,
                          namespace, body=body)

    def list_pods(self, namespace: str, label_selector: str) -> List[Dict[str, Any]]:
        """Every Pod the selector selects (``_list``)."""
        return self._list("listing pods in namespace %s" % namespace, self.core.list_namespaced_pod, namespace,
                          label_selector)

    # -- Nodes (cluster-scoped: their addresses) ---------------------------------------------------

    def read_node(self, name: str) -> Dict[str, Any]:
        return self._call("reading node %s%s" % (name, NODES_GRANT), self.core.read_node, name)

    def list_nodes(self) -> List[Dict[str, Any]]:
        """Every Node of the cluster (``_list``)."""
        return self._list("listing nodes" + NODES_GRANT, lambda _namespace, **kwargs: self.core.list_node(**kwargs),
                          "", "")

    def _list(self, context: str, method: Any, namespace: str, label_selector: str) -> List[Dict[str, Any]]:
        """Every object ``method`` lists, LIST_PAGE_SIZE per request (``limit`` and ``continue``).

        The pages of one list are one consistent snapshot, as long as its continue token lives;
        a token that expired between two pages (410) starts the list again from its first page,
        since pages from two snapshots could miss an object or hold one twice."""
        for _attempt in range(LIST_ATTEMPTS):
            try:
                return self._list_pages(context, method, namespace, label_selector)
            except Expired:
                continue
        raise Transient("%s: the list's continue token expired before its last page, %d times in a row; will "
                        "retry" % (context, LIST_ATTEMPTS))

    def _list_pages(self, context: str, method: Any, namespace: str, label_selector: str) -> List[Dict[str, Any]]:
        found: List[Dict[str, Any]] = []
        token: Optional[str] = None
        while True:
            paging: Dict[str, Any] = {"limit": LIST_PAGE_SIZE}
            if token:
                paging["_continue"] = token
            document = self._call(context, method, namespace, label_selector=label_selector, **paging)
            found.extend(item for item in document.get("items") or [] if isinstance(item, dict))
            token = (document.get("metadata") or {}).get("continue")
            if not token:
                return found

    # -- the Service of a Pod (NodePort and LoadBalancer exposure) ----------------------------------

    def create_service(self, namespace: str, service: Dict[str, Any]) -> Dict[str, Any]:
        return self._call("creating service %s/%s" % (namespace, service["metadata"]["name"]),
                          self.core.create_namespaced_service, namespace, service)

    def read_service(self, namespace: str, name: str) -> Dict[str, Any]:
        return self._call("reading service %s/%s" % (namespace, name), self.core.read_namespaced_service, name,
                          namespace)

    def delete_service(self, namespace: str, name: str) -> Dict[str, Any]:
        return self._call("deleting service %s/%s" % (namespace, name), self.core.delete_namespaced_service, name,
                          namespace)

    def list_services(self, namespace: str, label_selector: str) -> List[Dict[str, Any]]:
        """Every Service the selector selects (``_list``)."""
        return self._list("listing services in namespace %s" % namespace, self.core.list_namespaced_service,
                          namespace, label_selector)
