# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An in-memory Kubernetes API server for tests, spoken to by the official client unchanged.

No kube-apiserver can be installed on the test machines, and kmock's emulator lacks most of the
semantics the controller relies on (optimistic concurrency, the status subresource, finalizers,
watch resume and expiry).  This module is a small stdlib-only HTTP server on 127.0.0.1 that
reproduces those semantics closely enough that a bug in the controller's use of them shows up in
tests; ``tests/contract/test_kube_emulator.py`` proves each one through ``kubernetes.client``.

Usage::

    with KubeEmulator() as kube:
        cfg = kubernetes.client.Configuration(host=kube.url)
        ...

What it honours (see the contract tests): create with ``uid``/``resourceVersion``/
``generation``/``creationTimestamp`` and ``generateName``; 409 AlreadyExists; get and list
(per namespace or across namespaces) with label and ``metadata.name``/``metadata.namespace``
field selectors; PUT with a 409 Conflict on a stale ``resourceVersion``; an isolated
``/status`` subresource; a CRD's ``/scale`` subresource (an ``autoscaling/v1`` Scale over its
``specReplicasPath``/``statusReplicasPath``/``labelSelectorPath``: GET, PUT, merge and JSON
patch, 422 below 0, 409 on a stale resourceVersion); JSON merge patch, JSON patch (RFC 6902) and strategic merge patch
(applied as a JSON merge patch, which is exact for our kinds' maps but replaces lists where the
real server merges them by key); finalizers with ``deletionTimestamp``; watch with replay from a
``resourceVersion``, ``ERROR`` 410 Expired once that version left the bounded history, and
``timeoutSeconds``; paged lists (below); discovery; fault injection.

Paged lists, as "Retrieving large results sets in chunks" in the API concepts
(https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks)
and apiserver's etcd3 storage describe them: with ``limit`` a list answers at most that many items
in storage key order and, while keys are left, a ``continue`` token (``storage/continue.go``'s
format: the next key and the first page's resourceVersion); every page shows the objects as they
were at the first page (read back from the event history, as etcd reads an older revision), with
``remainingItemCount`` unless a selector was given. A token whose resourceVersion left the history
(``compact``, or more writes than ``history_limit`` since the first page: etcd's compaction) is 410
Expired with a token for the rest of the list as it is now (``etcd3/errors.go``); a token the
server did not make, or one sent with a ``resourceVersion``, is 400.

Besides the controller's kinds it serves what ``playbooks/deploy_controller.yml`` installs with
``kubernetes.core.k8s`` (ServiceAccounts, Services, Deployments, RBAC, CRDs), so that playbook is
tested here: its client-side apply is a GET, then a POST or a JSON merge patch, and a strategic
merge patch on a custom resource is refused with 415 as on the real server (custom resources
have no patch strategy), which is what makes ``kubernetes.core.k8s`` fall back to a merge patch.

Strict where the code under test depends on it (``tests/support/kube/validation.py`` holds the
rules and cites their sources):

- custom resources exist only once their CustomResourceDefinition is created (through the API
  or ``install_crd``; the shared ``kube`` fixture installs ``controller/manifests/crd.yaml``), and
  every write is pruned, defaulted and validated against that CRD's ``openAPIV3Schema``: 422
  Invalid with one ``status.details.causes`` entry per field path. ``store_unvalidated`` is the
  one test back door around it;
- a custom-resource PUT without ``metadata.resourceVersion`` is 422 (CRs never allow an
  unconditional update); a Lease ``acquireTime``/``renewTime`` that is not a MicroTime is 400;
- labels and annotations of every object, and Pods (containers, names, images, ports), are
  validated; a namespaced object in a namespace that does not exist is 404 ``namespaces "x" not
  found`` (the emulator starts with the real server's ``default`` and ``kube-*`` namespaces);
- Namespaces live as on a real server: each has its own uid (a namespace deleted and created
  again under its name has a new one), ``spec.finalizers: [kubernetes]`` and ``status.phase``;
  a DELETE makes it ``Terminating`` (``deletionTimestamp`` set, 409 on a second DELETE while
  content remains), the namespace controller's stand-in deletes everything in it (finalizers
  hold their objects, as they hold the namespace) and removes the namespace once it is empty;
  creating anything in a terminating namespace is 403 ``NamespaceTerminating``;
- a scheduled Pod (``spec.nodeName`` set, e.g. by ``kubelet_run``) is deleted gracefully:
  ``deletionTimestamp`` and ``deletionGracePeriodSeconds``, still readable and listed, then gone
  (a DELETED event) once the grace period has passed on the emulator's clock (``advance``);
  an unscheduled or finished Pod, or ``gracePeriodSeconds=0``, goes at once, as on a real server;
- ``kubelet_run`` and ``kubelet_evict`` stand in for the scheduler and kubelet; ``node_lost`` for the
  node lifecycle and taint eviction controllers when a node stops reporting, ``node_returns`` for
  its kubelet coming back, ``provision_load_balancer`` for the cloud's service controller (which
  refuses source ranges of a family the Service lacks, as clouds do), ``add_node`` for a kubelet
  registering its Node with its addresses, ``quota_unsynced``/``quota_synced`` for the quota
  controller; a thread stands in for the kubelet's end of graceful deletion and for the namespace
  controller; tests/support/netns/service_network.py serves the Services for real;
- admission after validation (``tests/support/kube/admission.py``): namespace lifecycle, Pod
  Security from the namespace's ``pod-security.kubernetes.io/enforce`` label, ResourceQuota on Pod
  counts (403 Forbidden as the real plugins word it, "status unknown for quota" included);
  Services validated as ``ValidateService`` does for the fields the provider sets, and a new one
  gets its cluster IP, IP families and node ports (none for a LoadBalancer without
  ``allocateLoadBalancerNodePorts``).

Deliberately left out (nothing tested depends on them): admission beyond namespace lifecycle, Pod
Security and Pod-count quotas, built-in defaulting beyond a Service's allocations (a real server
fills in e.g. a Pod's ``terminationGracePeriodSeconds: 30`` or a Deployment's ``strategy``;
graceful deletion uses 30 when the Pod has none), Pod spec immutability on update, workload
controllers (a Deployment's status changes only when a test writes it), a Secret's ``stringData``
folding into ``data``, owner-reference garbage collection, CRD conversion and per-version schemas
beyond the one each version declares, defaulting and pruning on read, the watch cache's own
answers to lists (lists are served as from etcd), ``dryRun``, server-side apply (415), BOOKMARK
events, and a status write to a Pod changing its labels (the real Pod status strategy allows it;
here every status write changes only ``status``, as for custom resources).
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import random
import re
import secrets
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

from support.kube.admission import default_service, pod_security_violation, quota_violation, service_errors
from support.kube.errors import ApiError, conflict, invalid, namespace_not_found, not_found, object_details
from support.kube.handler import Fault, Handler, Route
from support.kube.paging import decode_continue, encode_continue, expired_continue, list_limit
from support.kube.patches import PatchFailed, json_patch, merge_patch, reject_strategic_directives
from support.kube.resources import (
    CRD_KEY,
    DEFAULT_RESOURCES,
    EVENTS_KEY,
    LEASES_KEY,
    NAMESPACE_FINALIZER,
    NAMESPACES_KEY,
    NODES_KEY,
    PODS_KEY,
    QUOTAS_KEY,
    SERVICES_KEY,
    SYSTEM_NAMESPACES,
    Obj,
    ResourceType,
)
from support.kube.selectors import Filter
from support.kube.validation import (
    FieldError,
    GoValue,
    StructuralSchema,
    crd_errors,
    dns1123_subdomain_errors,
    is_micro_time,
    micro_time_error,
    validate_metadata,
    validate_pod,
)
from support.kube.watch import Event, Watcher

LOG = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT = 1000
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_STATUS_VERBS = ["get", "patch", "update"]
# The alphabet and length the real API server appends to generateName.
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATE_SUFFIX_LEN = 5
# pkg/registry/core/pod/strategy.go: a Pod without terminationGracePeriodSeconds gets 30 (the
# API server defaults it on create; the emulator applies it at deletion instead).
DEFAULT_POD_GRACE_SECONDS = 30
# The DefaultTolerationSeconds admission plugin gives every Pod tolerations for the
# node.kubernetes.io/not-ready and /unreachable NoExecute taints of 300 s: that long after its node
# stops reporting, the taint eviction controller deletes the Pod (node_lost).
UNREACHABLE_TOLERATION_SECONDS = 300
# How often the kubelet stand-in looks for Pods whose grace period has passed.
_GRACE_POLL_SECONDS = 0.05


def _timestamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _foreign_family_ranges(spec: Mapping[str, Any]) -> list[str]:
    """The ``loadBalancerSourceRanges`` of an IP family the Service's ``ipFamilies`` lacks."""
    families = {{"IPv4": 4, "IPv6": 6}.get(str(f)) for f in spec.get("ipFamilies") or ["IPv4"]}
    return [str(r) for r in spec.get("loadBalancerSourceRanges") or []
            if ipaddress.ip_network(str(r).strip(), strict=False).version not in families]


class KubeEmulator:
    """The server: start/stop, a context manager, state helpers and fault injection for tests."""

    def __init__(
        self,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        port: int = 0,
        *,
        namespaces: Iterable[str] = (),
        crds: Iterable[Obj] = (),
    ) -> None:
        """``namespaces`` are created besides the system ones and ``crds`` installed, as if an
        operator had done both before the test."""
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in resources:
            self.register(rtype)
        # Structural schemas of the served custom resources, by ResourceType.key.
        self._schemas: dict[str, StructuralSchema] = {}
        self._history_limit = history_limit
        self._port = port
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str, str], Obj] = {}  # (type key, namespace, name)
        # A watch reads resourceVersion "0" as "any version: send the current state", so the
        # counter starts above it; a list of an empty server then gives a resumable "1".
        self._rv = 1
        self._history: deque[Event] = deque()
        # Every event after this resourceVersion is still in the history.
        self._history_floor = self._rv
        self._watchers: list[Watcher] = []
        self._watchers_changed = threading.Condition(self._lock)
        self._faults: list[Fault] = []
        # fail_randomly: (rate, generator); injected so far, by status.
        self._random_faults: tuple[float, random.Random] = (0.0, random.Random())
        self.random_faults_injected: dict[int, int] = {}
        self._requests: list[tuple[str, str]] = []
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # The emulator's clock: wall time plus what tests ``advance``d it by.
        self._clock_offset = 0.0
        # Set by ``freeze_clock``: time stands still but for ``advance`` (a slow machine must not
        # end a grace period a test is still looking at).
        self._frozen_at: float | None = None
        # Terminating Pods the kubelet stand-in removes once their grace period has passed.
        self._grace_deadlines: dict[tuple[str, str, str], tuple[str, float]] = {}  # key: (uid, when)
        # Nodes that stopped reporting (node_lost) -> when their Pods are evicted.
        self._lost_nodes: dict[str, float] = {}
        self._kubelet: threading.Thread | None = None
        self._terminating: set[str] = set()  # namespaces deleted, waiting for their content to go
        for namespace in (*SYSTEM_NAMESPACES, *namespaces):
            self.create_namespace(namespace)
        for crd in crds:
            self.install_crd(crd)

    # -- lifecycle ---------------------------------------------------------------------------

    def register(self, rtype: ResourceType) -> None:
        """Add a kind to the resource table (discovery lists it from then on)."""
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def start(self) -> KubeEmulator:
        if self._server is not None:
            raise RuntimeError("emulator already started")
        server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        server.daemon_threads = True
        cast(Any, server).emulator = self
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name="kube-emulator",
        )
        self._thread.start()
        self._kubelet = threading.Thread(target=self._kubelet_loop, daemon=True,
                                         name="kube-emulator-kubelet")
        self._kubelet.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every watch stream and close every client connection."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with self._lock:
            for watcher in self._watchers:
                watcher.events.put(None)
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._kubelet is not None:
            self._kubelet.join(timeout=5)

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("emulator not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- test helpers ------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int,
        count: int = 1,
        *,
        reason: str | None = None,
        message: str = "injected failure",
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``count`` requests whose method matches (``*`` for any) and whose
        path, or path with query string, matches ``path_regex`` (``re.search``) with a Status
        error.  A 429 carries ``Retry-After`` (default 1 s) like the real server's; note that
        the official client's urllib3 layer retries 413/429/503 answers carrying
        ``Retry-After`` up to three times by itself, so only the fourth reaches the caller."""
        if status == 429 and retry_after is None:
            retry_after = 1
        with self._lock:
            self._faults.append(
                Fault(method.upper(), re.compile(path_regex), status, count, reason, message,
                       retry_after)
            )

    def fail_randomly(self, rate: float, seed: int | None = None) -> None:
        """Answer about ``rate`` of all later requests (those no ``fail_next`` fault took) with an
        injected error, drawn from ``random.Random(seed)``: a read 500 InternalError, a write 500
        or 409 Conflict (half each), as a real server answers under etcd trouble and write
        contention. Nothing is processed for an injected answer. ``rate`` 0 switches it off;
        ``random_faults_injected`` counts them by status (bench/chaos_bench.py uses this)."""
        with self._lock:
            self._random_faults = (rate, random.Random(seed))

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> Obj:
        """Create a Namespace, as ``kubectl create namespace`` would (objects may then live in it);
        ``labels`` such as ``pod-security.kubernetes.io/enforce: restricted``."""
        rtype = self._type_by_key(NAMESPACES_KEY)
        metadata: Obj = {"name": name, **({"labels": dict(labels)} if labels else {})}
        return self._create(Route(rtype, None, None, None),
                            {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})

    def create(self, resource: str, namespace: str | None, obj: Obj) -> Obj:
        """Create an object exactly as a POST would (validated, admitted, its ADDED event sent),
        without a round trip: how a test or the bench fills the server with many objects.
        ``resource`` is ``pods`` or ``proxies.crawl.example.com``."""
        return self._create(Route(self._type_by_key(resource), namespace, None, None), copy.deepcopy(obj))

    def install_crd(self, crd: Obj) -> Obj:
        """Create a CustomResourceDefinition (e.g. ``proxy_crd()``): its kind is served from then
        on, with its schema, exactly as after a POST of the CRD."""
        rtype = self._type_by_key(CRD_KEY)
        return self._create(Route(rtype, None, None, None), copy.deepcopy(crd))

    def store_unvalidated(self, obj: Obj) -> Obj:
        """TEST BACK DOOR: store a custom resource exactly as given, without pruning, defaulting
        or schema validation, and emit its ADDED event.

        A real API server never accepts such an object, but it can hold one written before the
        CRD's schema tightened (validation runs on writes, not on reads); this is how a test
        gives the controller such an object. Server fields (uid, resourceVersion, generation,
        creationTimestamp, namespace) are set as on a create; the namespace must exist and the
        kind must be served; the name must not be taken."""
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        matches = [t for t in self._types.values()
                   if (t.group, t.version, t.kind) == (group, version, kind) and t.custom]
        if not matches:
            raise KeyError(f"no custom resource {kind} in {api_version} is served")
        rtype = matches[0]
        body = copy.deepcopy(obj)
        meta = body.setdefault("metadata", {})
        with self._lock:
            if rtype.namespaced:
                self._require_namespace(meta.get("namespace") or "")
            if self._key(rtype, meta) in self._objects:
                raise ValueError(f"{rtype.key} {meta.get('namespace')}/{meta['name']} already exists")
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), generation=1,
                        creationTimestamp=self._timestamp())
            self._objects[self._key(rtype, meta)] = body
            self._emit(rtype, "ADDED", body, None)
            return copy.deepcopy(body)

    def freeze_clock(self) -> None:
        """Stop the emulator's clock where it is; only ``advance`` moves it from now on."""
        with self._lock:
            self._frozen_at = time.time()

    def advance(self, seconds: float) -> None:
        """Move the emulator's clock forward: Pods whose grace period has now passed are gone
        (their DELETED events sent) before this returns."""
        with self._lock:
            self._clock_offset += seconds
        self._expire_graceful()

    def kubelet_run(self, namespace: str, name: str, *, node: str = "node-1",
                    pod_ip: str = "10.244.0.10", host_ip: str | None = None,
                    ready: bool = True) -> Obj:
        """The scheduler and kubelet stand-in: bind the Pod to ``node`` (``spec.nodeName``, as the
        binding subresource does) and report it Running with its containers running, Ready as
        asked, ``podIP`` and ``hostIP`` set (as the kubelet's status manager writes them).
        ``hostIP`` is the node's first InternalIP when ``add_node`` made it (the kubelet's
        ``nodeutil.GetNodeHostIPs``), else ``host_ip`` (172.18.0.2 unless given)."""
        if host_ip is None:
            host_ip = next(iter(self.node_addresses(node, "InternalIP")), "172.18.0.2")

        def change(pod: Obj) -> None:
            now = self._timestamp()
            pod["spec"]["nodeName"] = node
            containers = pod["spec"].get("containers") or []
            condition = "True" if ready else "False"
            pod["status"] = {
                "phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "startTime": now, "qosClass": "Burstable",
                "conditions": [{"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": now}
                               for t, s in (("PodReadyToStartContainers", "True"), ("Initialized", "True"),
                                            ("Ready", condition), ("ContainersReady", condition),
                                            ("PodScheduled", "True"))],
                "containerStatuses": [{"name": c.get("name"), "image": c.get("image"), "imageID": "",
                                       "containerID": f"containerd://{uuid.uuid4().hex}",
                                       "ready": ready, "started": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": now}}} for c in containers],
            }
        return self._kubelet_write(namespace, name, change)

    def kubelet_evict(self, namespace: str, name: str,
                      message: str = "The node was low on resource: memory. ") -> Obj:
        """The kubelet's eviction manager: the Pod ends ``Failed`` with reason ``Evicted``, a
        ``DisruptionTarget`` condition, not Ready, and every container terminated (exit 137,
        killed). The Pod object stays (an evicted Pod is kept until deleted), keeping its IPs."""
        def change(pod: Obj) -> None:
            now = self._timestamp()
            status = pod.setdefault("status", {})
            status.update(phase="Failed", reason="Evicted", message=message)
            conditions = [c for c in status.get("conditions") or []
                          if c.get("type") not in ("Ready", "ContainersReady", "DisruptionTarget")]
            conditions += [
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                 "message": message, "lastProbeTime": None, "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "PodFailed", "lastProbeTime": None,
                 "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastProbeTime": None,
                 "lastTransitionTime": now}]
            status["conditions"] = conditions
            previous = {c.get("name"): c for c in status.get("containerStatuses") or []}
            statuses = []
            for container in pod["spec"].get("containers") or []:
                old = previous.get(container.get("name"), {})
                started = ((old.get("state") or {}).get("running") or {}).get("startedAt", now)
                statuses.append({**old, "name": container.get("name"), "image": container.get("image"),
                                 "ready": False, "started": False,
                                 "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                                          "startedAt": started, "finishedAt": now}}})
            status["containerStatuses"] = statuses
        return self._kubelet_write(namespace, name, change)

    def node_lost(self, node: str) -> list[Obj]:
        """The node stops reporting (kubelet gone, network cut). As the node lifecycle controller
        does (pkg/controller/nodelifecycle, ``MarkPodsNotReady`` in pkg/controller/util/node):
        every Pod bound to it keeps its phase (Running) and its container statuses (nobody is
        there to change them), and only its ``Ready`` condition turns False. After
        ``UNREACHABLE_TOLERATION_SECONDS`` on the emulator's clock the taint eviction controller
        deletes them gracefully; with no kubelet to confirm, they stay terminating (listed, with
        ``deletionTimestamp``) until the node is back (``node_returns``). No Pod phase changes
        to ``Unknown``: no current component sets it. Returns the Pods as marked."""
        with self._lock:
            self._lost_nodes[node] = self._clock() + UNREACHABLE_TOLERATION_SECONDS
            names = [(ns, n) for (key, ns, n), o in self._objects.items()
                     if key == PODS_KEY and (o.get("spec") or {}).get("nodeName") == node]

        def not_ready(pod: Obj) -> None:
            now = self._timestamp()
            for condition in (pod.get("status") or {}).get("conditions") or []:
                if condition.get("type") == "Ready" and condition.get("status") != "False":
                    condition.update(status="False", lastTransitionTime=now)
        return [self._kubelet_write(ns, n, not_ready) for ns, n in names]

    def node_returns(self, node: str) -> None:
        """The node reports again: its kubelet finishes the terminations that waited for it."""
        with self._lock:
            self._lost_nodes.pop(node, None)
        self._expire_graceful()

    def add_node(self, name: str, internal_ip: str, external_ip: str | None = None) -> Obj:
        """A Node as its kubelet and the cloud's node controller report it: ``status.addresses``
        with its ``InternalIP``, its ``ExternalIP`` when it has one, and its ``Hostname``
        (k8s.io/api core/v1 ``NodeAddressType``), condition Ready."""
        addresses = [{"type": "InternalIP", "address": internal_ip}]
        if external_ip:
            addresses.append({"type": "ExternalIP", "address": external_ip})
        addresses.append({"type": "Hostname", "address": name})
        node = self._create(Route(self._type_by_key(NODES_KEY), None, None, None),
                            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                             "labels": {"kubernetes.io/hostname": name}}})
        rtype = self._type_by_key(NODES_KEY)
        with self._lock:
            old = self._stored(Route(rtype, None, name, None))
            node = copy.deepcopy(old)
            node["status"] = {"addresses": addresses, "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
            node["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[self._key(rtype, node["metadata"])] = node
            self._emit(rtype, "MODIFIED", node, old)
            return copy.deepcopy(node)

    def node_addresses(self, node: str, kind: str | None = None) -> list[str]:
        """The addresses ``node`` reports (of one ``kind``: InternalIP, ExternalIP), or none when
        there is no such Node."""
        with self._lock:
            stored = self._objects.get((NODES_KEY, "", node)) or {}
        return [a["address"] for a in (stored.get("status") or {}).get("addresses") or []
                if kind is None or a.get("type") == kind]

    def quota_unsynced(self, namespace: str, name: str) -> Obj:
        """The quota controller has not counted ``name`` yet: its ``status.hard`` is the spec's and
        ``status.used`` is missing, so every Pod create in the namespace is refused 403 ``status
        unknown for quota`` (tests/support/kube/admission.py) until ``quota_synced``."""
        return self._write_quota_status(namespace, name, used=False)

    def quota_synced(self, namespace: str, name: str) -> Obj:
        """The quota controller's sync: ``status.hard`` and ``status.used`` (Pods not terminal)."""
        return self._write_quota_status(namespace, name, used=True)

    def _write_quota_status(self, namespace: str, name: str, used: bool) -> Obj:
        rtype = self._type_by_key(QUOTAS_KEY)
        with self._lock:
            old = self._stored(Route(rtype, namespace, name, None))
            new = copy.deepcopy(old)
            hard = dict((old.get("spec") or {}).get("hard") or {})
            new["status"] = {"hard": hard}
            if used:
                count = sum(1 for (key, ns, _), o in self._objects.items() if key == PODS_KEY and ns == namespace
                            and (o.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
                new["status"]["used"] = {key: str(count) for key in hard if key in ("pods", "count/pods")}
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[self._key(rtype, new["metadata"])] = new
            self._emit(rtype, "MODIFIED", new, old)
            return copy.deepcopy(new)

    def provision_load_balancer(self, namespace: str, name: str, ip: str | None = None,
                                hostname: str | None = None) -> Obj:
        """The cloud provider's service controller: a LoadBalancer Service gets its address in
        ``status.loadBalancer.ingress`` (an ``ip``, or a ``hostname`` on clouds that give one).

        As the clouds' load balancers do, a ``loadBalancerSourceRanges`` entry of an IP family the
        Service does not have (an IPv6 range on a single-stack IPv4 Service) fails the sync: the
        API accepted it (``ValidateService`` only checks each is a CIDR), the cloud's firewall
        refuses it (AWS: "error authorizing security group ingress: InvalidParameterValue: CIDR
        block ... is malformed", kubernetes/kubernetes#67551), the Service keeps no address and a
        Warning Event ``SyncLoadBalancerFailed`` says why. Returns the Service as stored."""
        rtype = self._type_by_key(SERVICES_KEY)
        ingress = {"ip": ip} if ip else {"hostname": hostname}
        with self._lock:
            old = self._stored(Route(rtype, namespace, name, None))
            foreign = _foreign_family_ranges(old.get("spec") or {})
        if foreign:
            self._event(namespace, old, "SyncLoadBalancerFailed",
                        f"Error syncing load balancer: failed to ensure load balancer: error authorizing security "
                        f"group ingress: \"InvalidParameterValue: CIDR block {foreign[0]} is malformed\"")
            return copy.deepcopy(old)
        with self._lock:
            old = self._stored(Route(rtype, namespace, name, None))
            new = copy.deepcopy(old)
            new["status"] = {"loadBalancer": {"ingress": [ingress]}}
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[self._key(rtype, new["metadata"])] = new
            self._emit(rtype, "MODIFIED", new, old)
            return copy.deepcopy(new)

    def _event(self, namespace: str, about: Obj, reason: str, message: str) -> Obj:
        """A Warning Event about ``about``, as a controller's event recorder writes it."""
        meta = about["metadata"]
        return self.create(EVENTS_KEY, namespace, {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"apiVersion": about.get("apiVersion", "v1"), "kind": about.get("kind"),
                               "namespace": namespace, "name": meta["name"], "uid": meta.get("uid")},
            "type": "Warning", "reason": reason, "message": message, "count": 1,
            "firstTimestamp": self._timestamp(), "lastTimestamp": self._timestamp()})

    def _kubelet_write(self, namespace: str, name: str, change: Any) -> Obj:
        rtype = self._type_by_key(PODS_KEY)
        with self._lock:
            old = self._stored(Route(rtype, namespace, name, None))
            new = copy.deepcopy(old)
            change(new)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[self._key(rtype, new["metadata"])] = new
            self._emit(rtype, "MODIFIED", new, old)
            return copy.deepcopy(new)

    def _kubelet_loop(self) -> None:
        """The kubelet's and the namespace controller's stand-ins."""
        while not self._stopping.wait(_GRACE_POLL_SECONDS):
            self._expire_graceful()
            self._finalize_namespaces()

    def _expire_graceful(self) -> None:
        """The kubelet's last word on a terminating Pod: once its grace period has passed, the
        Pod is deleted for good (the kubelet's DELETE with gracePeriodSeconds=0), or, if it still
        has finalizers, left terminating with a grace period of 0."""
        with self._lock:
            now = self._clock()
            self._evict_from_lost_nodes(now)
            for key, (uid, deadline) in list(self._grace_deadlines.items()):
                if deadline > now:
                    continue
                old = self._objects.get(key)
                if old is not None and (old.get("spec") or {}).get("nodeName") in self._lost_nodes:
                    continue  # no kubelet to confirm: it stays terminating until the node is back
                del self._grace_deadlines[key]
                if old is None or old["metadata"].get("uid") != uid:
                    continue
                new = copy.deepcopy(old)
                new["metadata"].update(deletionGracePeriodSeconds=0, resourceVersion=self._next_rv())
                rtype = self._type_by_key(key[0])
                if new["metadata"].get("finalizers"):
                    self._objects[key] = new
                    self._emit(rtype, "MODIFIED", new, old)
                else:
                    del self._objects[key]
                    self._emit(rtype, "DELETED", new, old)

    def _evict_from_lost_nodes(self, now: float) -> None:
        """The taint eviction controller's DELETE of each Pod on a node lost for longer than the
        Pods tolerate (under the lock)."""
        rtype = self._type_by_key(PODS_KEY)
        for node, evict_at in self._lost_nodes.items():
            if evict_at > now:
                continue
            for key, pod in list(self._objects.items()):
                if (key[0] == PODS_KEY and (pod.get("spec") or {}).get("nodeName") == node
                        and "deletionTimestamp" not in pod["metadata"]):
                    self._delete_gracefully(rtype, pod, self._pod_grace_period(pod, {}))

    def _clock(self) -> float:
        return (time.time() if self._frozen_at is None else self._frozen_at) + self._clock_offset

    def _timestamp(self, later: float = 0.0) -> str:
        return _timestamp(self._clock() + later)

    def compact(self) -> None:
        """Drop the whole watch history, as etcd compaction does: a watch resuming from any
        earlier resourceVersion now gets 410 Expired."""
        with self._lock:
            self._history.clear()
            self._history_floor = self._rv

    def requests(self) -> list[tuple[str, str]]:
        """Every request served so far as (method, path with query string)."""
        with self._lock:
            return list(self._requests)

    def wait_for_watchers(self, count: int, timeout: float = 5.0) -> None:
        """Block until at least ``count`` watch streams are open, so a test can change objects
        knowing a watch started in another thread will see the change live."""
        with self._watchers_changed:
            if not self._watchers_changed.wait_for(lambda: len(self._watchers) >= count, timeout):
                raise TimeoutError(f"{len(self._watchers)} watchers open, wanted {count}")

    def get_object(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """A copy of a stored object; ``resource`` is ``pods`` or ``proxies.crawl.example.com``."""
        rtype = self._type_by_key(resource)
        with self._lock:
            obj = self._objects.get((rtype.key, namespace or "", name))
            return copy.deepcopy(obj) if obj is not None else None

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def _type_by_key(self, resource: str) -> ResourceType:
        for rtype in self._types.values():
            if rtype.key == resource:
                return rtype
        raise KeyError(resource)

    # -- request plumbing --------------------------------------------------------------------

    def _record(self, method: str, target: str) -> Fault | None:
        """Log the request and return the injected fault it triggers, if any."""
        path = urlsplit(target).path
        with self._lock:
            self._requests.append((method, target))
            for fault in self._faults:
                if fault.method in ("*", method) and (
                    fault.path.search(target) or fault.path.search(path)
                ):
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    return fault
            rate, draw = self._random_faults
            if rate and draw.random() < rate:
                status = 409 if method != "GET" and draw.random() < 0.5 else 500
                self.random_faults_injected[status] = self.random_faults_injected.get(status, 0) + 1
                reason = "Conflict" if status == 409 else "InternalError"
                return Fault(method, re.compile(""), status, 1, reason, "injected failure (fail_randomly)", None)
        return None

    def _route(self, path: str) -> Route | Obj:
        """Map a URL path to a resource route, or to a discovery document."""
        parts = [p for p in path.split("/") if p]
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[len("http://"):]}]}
        if parts == ["apis"]:
            return self._group_list()
        if parts == ["version"]:
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator",
                    "gitCommit": "emulator", "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "gc", "platform": "linux/amd64"}
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        types = {p: t for (g, v, p), t in list(self._types.items()) if (g, v) == (group, version)}
        if not types:
            raise ApiError(404, "the server could not find the requested resource")
        if not rest:
            return self._resource_list(group, version, types.values())
        namespace = None
        if (rest[0] == "namespaces" and len(rest) >= 3 and rest[2] in types
                and types[rest[2]].namespaced):
            namespace, rest = rest[1], rest[2:]
        rtype = types.get(rest[0])
        if rtype is None or len(rest) > 3 or (len(rest) == 3 and rest[2] not in ("status", "scale")):
            raise ApiError(404, "the server could not find the requested resource")
        if not rtype.namespaced and namespace is not None:
            raise ApiError(404, "the server could not find the requested resource")
        if len(rest) == 3 and rest[2] == "status" and not rtype.status_subresource:
            raise ApiError(404, "the server could not find the requested resource")
        if len(rest) == 3 and rest[2] == "scale" and rtype.scale is None:
            raise ApiError(404, "the server could not find the requested resource")
        return Route(rtype, namespace, rest[1] if len(rest) > 1 else None,
                      rest[2] if len(rest) > 2 else None)

    def _group_list(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._types:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": group,
             "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
             "preferredVersion": {"groupVersion": f"{group}/{versions[0]}",
                                  "version": versions[0]}}
            for group, versions in sorted(groups.items())]}

    @staticmethod
    def _resource_list(group: str, version: str, types: Iterable[ResourceType]) -> Obj:
        resources: list[Obj] = []
        for t in sorted(types, key=lambda t: t.plural):
            resources.append({"name": t.plural, "singularName": t.kind.lower(),
                              "namespaced": t.namespaced, "kind": t.kind, "verbs": _VERBS})
            if t.status_subresource:
                resources.append({"name": f"{t.plural}/status", "singularName": "",
                                  "namespaced": t.namespaced, "kind": t.kind,
                                  "verbs": _STATUS_VERBS})
            if t.scale is not None:
                resources.append({"name": f"{t.plural}/scale", "singularName": "",
                                  "namespaced": t.namespaced, "group": "autoscaling", "version": "v1",
                                  "kind": "Scale", "verbs": _STATUS_VERBS})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # -- verbs (all under the lock, so each is atomic and events keep resourceVersion order) --
    # A stored object is never changed in place: every write stores a new object (a copy of the
    # old one, changed), so an object once stored -- in ``_objects``, as an event's ``previous``,
    # in a list being sent -- keeps its content. Paged lists read older versions back from the
    # history (``_state_at``), and lists send stored objects without copying them.

    def _emit(self, rtype: ResourceType, etype: str, obj: Obj, previous: Obj | None) -> None:
        event = Event(int(obj["metadata"]["resourceVersion"]), rtype, etype,
                       copy.deepcopy(obj), previous)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._history_floor = self._history.popleft().rv
        for watcher in self._watchers:
            seen = event.seen_by(watcher.flt)
            if seen is not None:
                watcher.events.put(seen)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _create(self, route: Route, body: Obj) -> Obj:
        rtype = route.rtype
        if route.name is not None or route.subresource is not None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        if rtype.namespaced and route.namespace is None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if rtype.namespaced:
            if meta.get("namespace") not in (None, "", route.namespace):
                raise ApiError(400, "the namespace of the provided object does not match the "
                                    "namespace sent on the request")
            meta["namespace"] = route.namespace
        else:
            meta.pop("namespace", None)
        with self._lock:
            if rtype.namespaced:
                self._require_active_namespace(rtype, str(meta.get("name") or meta.get("generateName") or ""),
                                               route.namespace or "")
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise invalid(rtype, "", [FieldError("FieldValueRequired", "metadata.name",
                                                          detail="name or generateName is required")])
                while True:
                    suffix = "".join(secrets.choice(_GENERATE_ALPHABET)
                                     for _ in range(_GENERATE_SUFFIX_LEN))
                    meta["name"] = meta["generateName"] + suffix
                    if self._key(rtype, meta) not in self._objects:
                        break
            name = meta["name"]
            name_errors = [FieldError("FieldValueInvalid", "metadata.name", name, msg)
                           for msg in dns1123_subdomain_errors(str(name))]
            if name_errors:
                raise invalid(rtype, name, name_errors)
            for server_owned in ("deletionTimestamp", "deletionGracePeriodSeconds",
                                 "managedFields", "selfLink"):
                meta.pop(server_owned, None)
            body["apiVersion"], body["kind"] = rtype.api_version, rtype.kind
            if rtype.status_subresource:
                body.pop("status", None)
                if rtype.initial_status is not None:
                    body["status"] = copy.deepcopy(dict(rtype.initial_status))
            body = self._admit(rtype, name, body, creating=True)
            if rtype.key == NAMESPACES_KEY:
                # pkg/registry/core/namespace/strategy.go PrepareForCreate: the namespace
                # controller's finalizer, which holds a deleted namespace until its content is gone.
                body["spec"] = {"finalizers": [NAMESPACE_FINALIZER]}
            meta = body["metadata"]
            # Storage answers last: an invalid object is 422 even when its name is taken.
            if self._key(rtype, meta) in self._objects:
                raise ApiError(409, f'{rtype.key} "{name}" already exists',
                               reason="AlreadyExists", details=object_details(rtype, name))
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), generation=1,
                        creationTimestamp=self._timestamp())
            if rtype.key == CRD_KEY:
                self._serve_crd(body)
            self._objects[self._key(rtype, meta)] = body
            self._emit(rtype, "ADDED", body, None)
            return copy.deepcopy(body)

    def _require_namespace(self, namespace: str) -> None:
        if (NAMESPACES_KEY, "", namespace) not in self._objects:
            raise namespace_not_found(namespace)

    def _require_active_namespace(self, rtype: ResourceType, name: str, namespace: str) -> None:
        """NamespaceLifecycle admission (plugin/pkg/admission/namespace/lifecycle/admission.go):
        nothing new is created in a namespace that is being deleted: 403 Forbidden with the cause
        ``NamespaceTerminating`` on ``metadata.namespace``. Updates and deletes still pass (a
        controller must be able to release its finalizers there)."""
        self._require_namespace(namespace)
        if self._objects[(NAMESPACES_KEY, "", namespace)]["metadata"].get("deletionTimestamp"):
            message = f"unable to create new content in namespace {namespace} because it is being terminated"
            raise ApiError(403, f'{rtype.key} "{name}" is forbidden: {message}', details={
                "name": name, "group": rtype.group, "kind": rtype.plural,
                "causes": [{"reason": "NamespaceTerminating", "message": message, "field": "metadata.namespace"}]})

    def _admit(self, rtype: ResourceType, name: str, obj: Obj, creating: bool, old: Obj | None = None) -> Obj:
        """Decode, default and validate a write as the real server does before storing it;
        returns the object to store (a custom resource pruned and defaulted)."""
        if rtype.key == LEASES_KEY:
            spec = obj.get("spec") or {}
            for time_field in ("acquireTime", "renewTime"):
                if not is_micro_time(spec.get(time_field)):
                    # A decode error, before any validation: 400 BadRequest, as the server
                    # answers a body its JSON decoder refuses.
                    raise ApiError(400, f'Lease in version "{rtype.version}" cannot be handled as a '
                                        f"Lease: {micro_time_error(spec.get(time_field))}")
        schema = self._schemas.get(rtype.key)
        if schema is not None:
            obj = schema.prune_and_default(obj)
        errors = validate_metadata(obj.get("metadata") or {})
        if rtype.key == PODS_KEY and creating:
            errors += validate_pod(obj)
        if rtype.key == SERVICES_KEY:
            errors += [FieldError(kind, path, value, detail) for kind, path, value, detail in service_errors(obj)]
        if rtype.key == CRD_KEY:
            errors += crd_errors(obj)
        if schema is not None:
            # The API server reads the old object from storage with the schema's defaults applied
            # (apiextensions-apiserver defaults on read as well as on write), so ratcheting compares
            # defaulted with defaulted: a field defaulted since it was stored is no change.
            errors += schema.validate(obj, None if old is None else schema.prune_and_default(old))
        if errors:
            raise invalid(rtype, name, errors)
        if creating and rtype.key == PODS_KEY:
            self._admit_pod(name, obj)
        if creating and rtype.key == SERVICES_KEY:
            self._default_service(rtype, name, obj)
        return obj

    def _admit_pod(self, name: str, pod: Obj) -> None:
        """The validating admission plugins after validation, in the server's order: PodSecurity,
        then ResourceQuota (kube_admission.py); either refuses with 403 Forbidden."""
        namespace = pod["metadata"]["namespace"]
        namespace_obj = self._objects[(NAMESPACES_KEY, "", namespace)]
        pods = [o for (key, ns, _), o in self._objects.items() if key == PODS_KEY and ns == namespace]
        quotas = [o for (key, ns, _), o in self._objects.items() if key == QUOTAS_KEY and ns == namespace]
        refusal = pod_security_violation(namespace_obj, pod) or quota_violation(quotas, pods)
        if refusal is not None:
            # apierrors.NewForbidden: `<resource> "<name>" is forbidden: <err>`.
            raise ApiError(403, f'pods "{name}" is forbidden: {refusal}',
                           details={"name": name, "group": "", "kind": "pods"})

    def _default_service(self, rtype: ResourceType, name: str, service: Obj) -> None:
        services = [o for (key, _, _), o in self._objects.items() if key == SERVICES_KEY]
        taken_ports = {port.get("nodePort") for o in services for port in (o.get("spec") or {}).get("ports") or []}
        taken_ports |= {(o.get("spec") or {}).get("healthCheckNodePort") for o in services}
        problem = default_service(service, {p for p in taken_ports if isinstance(p, int)},
                                  {str((o.get("spec") or {}).get("clusterIP")) for o in services})
        if problem is not None:
            raise invalid(rtype, name, [FieldError("FieldValueInvalid", *problem)])

    def _serve_crd(self, crd: Obj) -> None:
        """Serve (or re-serve, on an update) the kind a CRD defines, with its schema; the CRD's
        status says so, as the apiextensions controllers would within a moment."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            scale = (version.get("subresources") or {}).get("scale")
            rtype = ResourceType(spec["group"], version["name"], names["kind"], names["plural"],
                                 namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                                 status_subresource="status" in (version.get("subresources") or {}),
                                 returns_deleted_object=True, custom=True,
                                 scale=None if scale is None else (scale["specReplicasPath"],
                                                                   scale["statusReplicasPath"],
                                                                   scale.get("labelSelectorPath")))
            if not version.get("served", True):
                self._types.pop((rtype.group, rtype.version, rtype.plural), None)
                continue
            if self._types.get((rtype.group, rtype.version, rtype.plural)) != rtype:
                self.register(rtype)  # an unchanged one stays the very object open watches hold
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is not None:
                self._schemas[rtype.key] = StructuralSchema(schema)
            else:
                self._schemas.pop(rtype.key, None)
        now = self._timestamp()
        crd["status"] = {
            "acceptedNames": copy.deepcopy(names),
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now}],
        }

    def _unserve_crd(self, crd: Obj) -> None:
        """A deleted CRD takes its kind and every object of it with it."""
        spec = crd["spec"]
        for version in spec["versions"]:
            rtype = self._types.pop((spec["group"], version["name"], spec["names"]["plural"]), None)
            if rtype is None:
                continue
            self._schemas.pop(rtype.key, None)
            for key in [k for k in self._objects if k[0] == rtype.key]:
                old = self._objects.pop(key)
                gone = copy.deepcopy(old)
                gone["metadata"]["resourceVersion"] = self._next_rv()
                self._emit(rtype, "DELETED", gone, old)

    @staticmethod
    def _key(rtype: ResourceType, meta: Mapping[str, Any]) -> tuple[str, str, str]:
        return rtype.key, meta.get("namespace") or "", meta["name"]

    def _stored(self, route: Route) -> Obj:
        assert route.name is not None
        obj = self._objects.get((route.rtype.key, route.namespace or "", route.name))
        if obj is None:
            raise not_found(route.rtype, route.name)
        return obj

    def _get(self, route: Route) -> Obj:
        with self._lock:
            return copy.deepcopy(self._stored(route))

    def _list(self, flt: Filter, query: Mapping[str, str]) -> Obj:
        """A list, in storage key order, paged as the real server pages it (module docstring,
        "Paged lists"): ``limit`` items at most, and a ``continue`` token for the rest while there
        is more; every page shows the objects as they were when the first page was served."""
        limit = list_limit(query.get("limit"))
        token = query.get("continue") or ""
        if token and query.get("resourceVersion") not in (None, "", "0"):
            # etcd3/store.go GetList (storage.ValidateListOptions in later releases).
            raise ApiError(400, "specifying resource version is not allowed when using continue")
        with self._lock:
            start, rv = decode_continue(token) if token else ("", self._rv)
            if rv == -1:  # the token of a 410: the rest of the list as it is now (inconsistent)
                rv = self._rv
            if rv < self._history_floor:
                raise expired_continue(start)
            state = self._state_at(flt.rtype, rv)
            # Keys below the request's own prefix (a namespace's, or the whole resource's).
            prefix = f"{flt.namespace}/" if flt.namespace is not None else ""
            keys = sorted(key[len(prefix):] for key in state if key.startswith(prefix) and key[len(prefix):] >= start)
            # As etcd3/store.go GetList reads: keys in order, until ``limit`` of them matched the
            # selectors; there is more (a token) when any key is left after the last one read,
            # matching or not, so a page may come back short or even empty with a token.
            page: list[str] = []
            read = 0
            for key in keys:
                if limit and len(page) == limit:
                    break
                read += 1
                if flt.matches(state[prefix + key]):
                    page.append(prefix + key)
            # Not copied: a stored object is never changed in place (every write stores a new one,
            # which the history relies on too), so these stay as they are while they are sent.
            items = [state[key] for key in page]
        metadata: Obj = {"resourceVersion": str(rv)}
        if read < len(keys):
            metadata["continue"] = encode_continue(keys[read - 1] + "\x00", rv)
            if not (flt.labels or flt.fields):
                # ListMeta.remainingItemCount: "If the list request contained label or field
                # selectors, then the number of remaining items is unknown and the field will be
                # left unset and omitted during serialization."
                metadata["remainingItemCount"] = len(keys) - read
        return {"kind": f"{flt.rtype.kind}List", "apiVersion": flt.rtype.api_version,
                "metadata": metadata, "items": items}

    def _state_at(self, rtype: ResourceType, rv: int) -> dict[str, Obj]:
        """Every object of ``rtype`` as it was at resourceVersion ``rv`` (>= the history floor), by
        its storage key below the resource's prefix (``<namespace>/<name>``, or ``<name>`` for a
        cluster-scoped kind): the objects now, with every later event of the history undone, as
        etcd answers a read at an older revision."""
        def storage_key(obj: Obj) -> str:
            meta = obj["metadata"]
            return f"{meta['namespace']}/{meta['name']}" if rtype.namespaced else str(meta["name"])

        state = {storage_key(obj): obj for (key, _, _), obj in self._objects.items() if key == rtype.key}
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.rtype.key != rtype.key:
                continue
            if event.previous is None:  # ADDED
                state.pop(storage_key(event.obj), None)
            else:  # MODIFIED, DELETED: what it was before
                state[storage_key(event.previous)] = event.previous
        return state

    def _scale(self, route: Route, method: str, content_type: str, body: Any) -> Obj:
        """The scale subresource of a custom resource, as apiextensions-apiserver serves it
        (registry/customresource/etcd.go ScaleREST): an ``autoscaling/v1`` Scale whose
        ``spec.replicas`` is read from and written to ``specReplicasPath``, ``status.replicas``
        read from ``statusReplicasPath`` (0 when absent) and ``status.selector`` from
        ``labelSelectorPath`` ("" when absent). A write changes only the spec replicas (and so
        the generation); a resourceVersion in the Scale is a precondition (409 when stale)."""
        rtype = route.rtype
        assert rtype.scale is not None and route.name is not None
        spec_path, status_path, selector_path = (p.lstrip(".").split(".") if p else None for p in rtype.scale)

        def read(obj: Obj, path: list[str] | None) -> Any:
            value: Any = obj
            for part in path or []:
                value = value.get(part) if isinstance(value, dict) else None
            return value

        def scale_of(obj: Obj) -> Obj:
            replicas = read(obj, spec_path)
            if not isinstance(replicas, int):
                raise ApiError(500, f"the spec replicas field {rtype.scale[0]!r} cannot be found")  # type: ignore[index]
            meta = obj["metadata"]
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                      "creationTimestamp") if k in meta},
                    "spec": {"replicas": replicas},
                    "status": {"replicas": read(obj, status_path) or 0,
                               "selector": str(read(obj, selector_path) or "")}}

        with self._lock:
            old = self._stored(route)
            if method == "GET":
                return scale_of(copy.deepcopy(old))
            current = scale_of(copy.deepcopy(old))
            if method == "PATCH":
                media = content_type.split(";")[0].strip().lower()
                if media == "application/json-patch+json":
                    try:
                        wanted = json_patch(current, body)
                    except (PatchFailed, KeyError, TypeError) as exc:
                        raise ApiError(422, f"the server rejected our request due to an error in our request: "
                                            f"{exc}") from exc
                elif media in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                    if not isinstance(body, dict):
                        raise ApiError(400, "a merge patch must be a JSON object")
                    wanted = merge_patch(current, body)
                else:
                    raise ApiError(415, f"the body of the request was in an unknown format (got {media})")
            else:
                wanted = body
            if not isinstance(wanted, dict) or wanted.get("kind") not in (None, "Scale"):
                raise ApiError(400, "the body must be an autoscaling/v1 Scale")
            replicas = (wanted.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise invalid(rtype, route.name, [FieldError(
                    "FieldValueInvalid", "spec.replicas", GoValue(replicas),
                    "must be greater than or equal to 0")])
            rv = (wanted.get("metadata") or {}).get("resourceVersion")
            if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
                raise conflict(rtype, route.name)
            new = copy.deepcopy(old)
            target: Any = new
            assert spec_path is not None
            for part in spec_path[:-1]:
                target = target.setdefault(part, {})
            target[spec_path[-1]] = replicas
            updated = self._update_locked(Route(rtype, route.namespace, route.name, None), new)
            return scale_of(updated)

    def _update(self, route: Route, body: Obj) -> Obj:
        with self._lock:
            return self._update_locked(route, body, put=True)

    def _update_locked(self, route: Route, body: Obj, put: bool = False) -> Obj:
        """PUT semantics, shared by PATCH (which builds the full object first from the stored
        one, so it always carries the current resourceVersion)."""
        rtype, name = route.rtype, route.name
        assert name is not None
        old = self._stored(route)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if meta.get("name") != name:
            raise ApiError(400, f"the name of the object ({meta.get('name')}) does not match the "
                                f"name on the URL ({name})")
        if rtype.namespaced and meta.get("namespace") not in (None, "", route.namespace):
            raise ApiError(400, "the namespace of the provided object does not match the "
                                "namespace sent on the request")
        rv = meta.get("resourceVersion")
        if put and rtype.custom and rv in (None, ""):
            # registry/generic/registry/store.go: a kind whose strategy does not
            # AllowUnconditionalUpdate (every custom resource, main and status) refuses a PUT
            # without a resourceVersion; the error names the resource, not the kind.
            raise ApiError(
                422, f'{rtype.key} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
                     "must be specified for an update",
                details={"name": name, "group": rtype.group, "kind": rtype.plural, "causes": [
                    FieldError("FieldValueInvalid", "metadata.resourceVersion", GoValue("0x0"),
                               "must be specified for an update").cause()]})
        if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
            raise conflict(rtype, name)
        if route.subresource == "status":
            # Only status changes; everything else is copied from the stored object.
            new = copy.deepcopy(old)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
            if rtype.status_subresource:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            new_meta = new["metadata"]
            for immutable in ("uid", "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds", "generation", "namespace"):
                if immutable in old["metadata"]:
                    new_meta[immutable] = old["metadata"][immutable]
                else:
                    new_meta.pop(immutable, None)
            new_meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if "deletionTimestamp" in old["metadata"]:
                added = set(new_meta.get("finalizers") or []) - set(
                    old["metadata"].get("finalizers") or [])
                if added:
                    raise invalid(rtype, name, [FieldError(
                        "FieldValueForbidden", "metadata.finalizers",
                        detail="no new finalizers can be added if the object is being deleted, found new "
                               f"finalizers {sorted(added)}")])
        new = self._admit(rtype, name, new, creating=False, old=old)
        if route.subresource != "status" and self._generation_changed(rtype, old, new):
            new["metadata"]["generation"] = old["metadata"]["generation"] + 1
        if new == old:
            return copy.deepcopy(old)  # a no-op write changes nothing, as on the real server
        if rtype.key == CRD_KEY:
            self._serve_crd(new)
            new["status"] = old.get("status", new["status"])
        new["metadata"]["resourceVersion"] = self._next_rv()
        key = self._key(rtype, new["metadata"])
        if ("deletionTimestamp" in new["metadata"] and not new["metadata"].get("finalizers")
                and key not in self._grace_deadlines):  # a terminating Pod waits for its kubelet
            del self._objects[key]
            self._emit(rtype, "DELETED", new, old)
        else:
            self._objects[key] = new
            self._emit(rtype, "MODIFIED", new, old)
        return copy.deepcopy(new)

    @staticmethod
    def _generation_changed(rtype: ResourceType, old: Obj, new: Obj) -> bool:
        if rtype.status_subresource:
            return old.get("spec") != new.get("spec")
        # Without a status subresource, every change outside metadata counts (the CRD rule).
        def content(obj: Obj) -> Obj:
            return {k: v for k, v in obj.items() if k != "metadata"}
        return content(old) != content(new)

    def _patch(self, route: Route, content_type: str, patch: Any) -> Obj:
        media = content_type.split(";")[0].strip().lower()
        with self._lock:
            old = self._stored(route)
            if media == "application/json-patch+json":
                if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
                    raise ApiError(400, "a JSON patch must be a list of operations")
                try:
                    new = json_patch(old, patch)
                except (PatchFailed, KeyError, TypeError) as exc:
                    raise ApiError(422, f"the server rejected our request due to an error in "
                                        f"our request: {exc}") from exc
            elif media in ("application/merge-patch+json",
                           "application/strategic-merge-patch+json"):
                if not isinstance(patch, dict):
                    raise ApiError(400, "a merge patch must be a JSON object")
                if media == "application/strategic-merge-patch+json":
                    if route.rtype.custom:
                        raise ApiError(415, "the body of the request was in an unknown format - "
                                            "accepted media types include: application/json-patch+json, "
                                            "application/merge-patch+json, application/apply-patch+yaml")
                    reject_strategic_directives(patch)
                new = merge_patch(old, patch)
            else:
                raise ApiError(415, f"the body of the request was in an unknown format - "
                                    f"accepted media types include: application/json-patch+json, "
                                    f"application/merge-patch+json, "
                                    f"application/strategic-merge-patch+json (got {media})")
            if not isinstance(new, dict):
                raise ApiError(422, "the patched object is not a JSON object")
            return self._update_locked(route, new)

    def _delete(self, route: Route, options: Obj) -> tuple[Obj, bool]:
        """Delete or, with finalizers, mark for deletion; returns (object, deleted now)."""
        rtype, name = route.rtype, route.name
        assert name is not None
        with self._lock:
            old = self._stored(route)
            preconditions = options.get("preconditions") or {}
            for field_name in ("uid", "resourceVersion"):
                wanted = preconditions.get(field_name)
                if wanted and wanted != old["metadata"].get(field_name):
                    raise conflict(rtype, name)
            meta = old["metadata"]
            if rtype.key == NAMESPACES_KEY:
                return self._terminate_namespace(rtype, old), False
            if rtype.key == PODS_KEY:
                grace = self._pod_grace_period(old, options)
                if grace > 0:
                    return self._delete_gracefully(rtype, old, grace), False
                self._grace_deadlines.pop(self._key(rtype, meta), None)
            if meta.get("finalizers"):
                if "deletionTimestamp" in meta:
                    if meta.get("deletionGracePeriodSeconds"):  # a graceful one, cut short
                        new = copy.deepcopy(old)
                        new["metadata"].update(deletionGracePeriodSeconds=0, resourceVersion=self._next_rv())
                        self._objects[self._key(rtype, meta)] = new
                        self._emit(rtype, "MODIFIED", new, old)
                        return copy.deepcopy(new), False
                    return copy.deepcopy(old), False
                new = copy.deepcopy(old)
                new["metadata"].update(deletionTimestamp=self._timestamp(), deletionGracePeriodSeconds=0,
                                       resourceVersion=self._next_rv())
                # The real server bumps generation when it first sets deletionTimestamp, so
                # controllers comparing observedGeneration notice the deletion.
                new["metadata"]["generation"] = meta["generation"] + 1
                self._objects[self._key(rtype, meta)] = new
                self._emit(rtype, "MODIFIED", new, old)
                return copy.deepcopy(new), False
            new = copy.deepcopy(old)
            new["metadata"]["resourceVersion"] = self._next_rv()
            del self._objects[self._key(rtype, meta)]
            self._emit(rtype, "DELETED", new, old)
            if rtype.key == CRD_KEY:
                self._unserve_crd(old)
            return copy.deepcopy(new), True

    def _terminate_namespace(self, rtype: ResourceType, old: Obj) -> Obj:
        """pkg/registry/core/namespace/storage/storage.go ``Delete``: the first DELETE sets
        ``deletionTimestamp`` and ``status.phase: Terminating`` and answers with the namespace; it
        stays, with its uid, until the namespace controller (``_finalize_namespaces``) has deleted
        everything in it and removed its finalizer. A DELETE while it still has that finalizer
        is 409. Only then may a namespace of that name be created again, with a new uid."""
        name = old["metadata"]["name"]
        if old["metadata"].get("deletionTimestamp"):
            if (old.get("spec") or {}).get("finalizers"):
                raise ApiError(409, f'Operation cannot be fulfilled on namespaces "{name}": The system is ensuring '
                                    "all content is removed from this namespace.  Upon completion, this namespace "
                                    "will automatically be purged by the system.", details=object_details(rtype, name))
            return copy.deepcopy(old)
        new = copy.deepcopy(old)
        new["metadata"].update(deletionTimestamp=self._timestamp(), resourceVersion=self._next_rv())
        new["status"] = {**(new.get("status") or {}), "phase": "Terminating"}
        self._objects[self._key(rtype, old["metadata"])] = new
        self._terminating.add(name)
        self._emit(rtype, "MODIFIED", new, old)
        return copy.deepcopy(new)

    def _finalize_namespaces(self) -> None:
        """The namespace controller (pkg/controller/namespace/deletion): in a terminating namespace,
        delete every object (each as a DELETE would: finalizers hold theirs, Pods go gracefully);
        once none is left, remove its finalizer and with it the namespace."""
        with self._lock:
            terminating = set(self._terminating)
            if not terminating:
                return
            content = [(key, obj["metadata"].get("deletionTimestamp")) for key, obj in self._objects.items()
                       if key[1] in terminating and self._type_by_key(key[0]).namespaced]
        for (type_key, namespace, name), deleting in content:
            if not deleting:
                try:
                    self._delete(Route(self._type_by_key(type_key), namespace, name, None), {})
                except ApiError:
                    pass  # deleted meanwhile
        with self._lock:
            occupied = {key[1] for key in self._objects if key[1] in terminating}
            rtype = self._type_by_key(NAMESPACES_KEY)
            for namespace in terminating - occupied:
                old = self._objects[(NAMESPACES_KEY, "", namespace)]
                new = copy.deepcopy(old)
                new["spec"] = {**(new.get("spec") or {}), "finalizers": []}
                new["metadata"]["resourceVersion"] = self._next_rv()
                del self._objects[(NAMESPACES_KEY, "", namespace)]
                self._terminating.discard(namespace)
                self._emit(rtype, "DELETED", new, old)

    @staticmethod
    def _pod_grace_period(pod: Obj, options: Obj) -> int:
        """pkg/registry/core/pod/strategy.go ``CheckGracefulDelete``: the request's
        gracePeriodSeconds, else the Pod's terminationGracePeriodSeconds; 0 (at once) for a Pod
        never scheduled to a node or already Failed/Succeeded, since no kubelet has anything to
        stop; a negative value counts as 1."""
        period = options.get("gracePeriodSeconds")
        if period is None:
            period = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_SECONDS)
        if not (pod.get("spec") or {}).get("nodeName"):
            period = 0
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            period = 0
        return 1 if int(period) < 0 else int(period)

    def _delete_gracefully(self, rtype: ResourceType, old: Obj, grace: int) -> Obj:
        """staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go ``BeforeDelete``: the first
        graceful DELETE sets deletionTimestamp to now + grace and deletionGracePeriodSeconds (and
        bumps generation); a later one may only shorten it; the object stays until the kubelet
        (here ``_expire_graceful``) removes it."""
        meta = old["metadata"]
        key = self._key(rtype, meta)
        if "deletionTimestamp" in meta and grace >= (meta.get("deletionGracePeriodSeconds") or 0):
            return copy.deepcopy(old)
        new = copy.deepcopy(old)
        new["metadata"].update(deletionTimestamp=self._timestamp(grace), deletionGracePeriodSeconds=grace,
                               resourceVersion=self._next_rv())
        if "deletionTimestamp" not in meta:
            new["metadata"]["generation"] = meta["generation"] + 1
        self._grace_deadlines[key] = (meta["uid"], self._clock() + grace)
        self._objects[key] = new
        self._emit(rtype, "MODIFIED", new, old)
        return copy.deepcopy(new)

    def _open_watch(self, flt: Filter, resource_version: str | None) -> tuple[
            Watcher, list[tuple[str, Obj]], Obj | None]:
        """Register a watch; returns it, the events to send first, and an ERROR Status when
        ``resource_version`` is older than the history (the stream then sends only that)."""
        watcher = Watcher(flt)
        with self._lock:
            if resource_version in (None, "", "0"):
                # "Start at most recent": the current state as synthetic ADDED events.
                initial = [("ADDED", copy.deepcopy(o)) for (key, _, _), o
                           in sorted(self._objects.items())
                           if key == flt.rtype.key and flt.matches(o)]
            else:
                assert resource_version is not None
                if not resource_version.isdigit():
                    raise ApiError(400, f"invalid resource version {resource_version!r}")
                since = int(resource_version)
                if since < self._history_floor:
                    expired = ApiError(410, f"too old resource version: {since} "
                                            f"({self._history_floor + 1})", reason="Expired")
                    return watcher, [], expired.status()
                initial = [seen for event in self._history if event.rv > since
                           if (seen := event.seen_by(flt)) is not None]
            self._watchers.append(watcher)
            self._watchers_changed.notify_all()
        return watcher, initial, None

    def _close_watch(self, watcher: Watcher) -> None:
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
                self._watchers_changed.notify_all()
