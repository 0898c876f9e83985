# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes provider: create, get, delete and list proxy Pods.

Called by the two k8s modules (module.py builds it). It decides; ``pods.py`` builds and
reads manifests; ``client.py`` talks to the API and raises only our error classes.

A Pod is one object, so every operation is one or two API calls and idempotent by name:
- create: POST; a 409 AlreadyExists is read back and is success (``changed: false``) when
  the Pod is ours (our managed-by label and the same owner label) and not terminating
  (terminating: ``Transient``, the name frees up after its grace period), else ``Permanent``
  naming ``name`` (someone else's Pod is never adopted or touched); a 404 (no such
  namespace) is ``Permanent`` naming ``location``;
- delete: GET, refuse a Pod that is not ours, DELETE with a uid precondition; gone = success;
- get: GET; 404 (the Pod or its whole namespace is gone) = ``NotFound``;
- list: a label-selected, paged LIST per configured namespace, failures recorded per namespace.

With a Service exposure (NodePort, LoadBalancer) each Pod has a Service of its name (pods.py
``build_service``): create makes it after the Pod (and again when the Pod exists without it),
get and list read it for the endpoint, delete removes it with the Pod (or alone, when the Pod
is gone already).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    Instance,
    InstanceRequest,
    ListResult,
    list_locations,
    matches_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.client import AlreadyExists, KubeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    build_pod,
    build_service,
    is_managed,
    is_ours,
    label_selector,
    node_addresses,
    pod_instance,
    pod_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import (
    SERVICE_EXPOSURES,
    KubernetesSettings,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    format_provider_id,
    parse_provider_id,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import admitting_probes


def check_request(settings: KubernetesSettings, request: InstanceRequest) -> str:
    """Reject what a Pod cannot honour, naming the field; return the target namespace."""
    if request.user_data:
        raise Permanent(
            "user_data: a Pod has no cloud-init, so user-data cannot be delivered; leave the Proxy's cloudInit "
            "empty and configure squid with the provider's squidConfig")
    if request.machine_type:
        raise Permanent("machine_type: the Kubernetes provider has no machine types; the Pod's requests come "
                        "from the provider's cpuRequest and memoryRequest")
    if request.image:
        raise Permanent("image: the Kubernetes provider has no image keys; the container image comes from the "
                        "provider's image")
    namespace = request.location or settings.namespace
    if namespace not in settings.locations:
        raise Permanent("location: namespace %r is not configured for this provider (configured: %s); add it "
                        "to the provider's namespaces" % (namespace, ", ".join(settings.locations)))
    return namespace


def with_probe_sources(request: InstanceRequest, probe_sources: Sequence[str]) -> InstanceRequest:
    """``request`` whose access also admits the controller's probe sources (the root's ``probeSources``),
    beside the crawlers': in squid's allowlist and a load balancer's source ranges alike, so the
    controller's own probe is never refused on the way a crawler takes."""
    access = admitting_probes(request.access, probe_sources)
    return request if access is request.access else dataclasses.replace(request, access=access)


class K8sProvider:
    def __init__(self, settings: KubernetesSettings, client: KubeClient, probe_sources: Sequence[str] = ()) -> None:
        self.settings = settings
        self.client = client
        self.exposed = settings.exposure in SERVICE_EXPOSURES
        self.probe_sources = tuple(probe_sources)

    def close(self) -> None:
        self.client.close()

    # -- create ----------------------------------------------------------------------------

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]:
        namespace = check_request(self.settings, request)
        request = with_probe_sources(request, self.probe_sources)
        build_pod(self.settings, request, namespace)  # validates the request before any call
        pod = build_pod(self.settings, request, namespace, self._all_node_addresses(request))
        if check_mode:
            existing = self._existing(namespace, request)
            if existing is not None:
                return False, self._instance(existing)
            return True, Instance(provider_id=format_provider_id("k8s", namespace, request.name), name=request.name,
                                  location=namespace, state="pending", tags=dict(request.tags))
        changed, created = self._create_pod(namespace, request, pod)
        return changed, pod_instance(created, self.settings.exposure, self._ensure_service(request, created),
                                     self._node_of(created))

    def _create_pod(self, namespace: str, request: InstanceRequest, pod: Dict[str, Any]) -> Tuple[bool, Dict[str, Any]]:
        """(changed, the Pod): created now, or ours already (see the module docstring)."""
        try:
            return True, self.client.create_pod(namespace, pod)
        except NotFound as error:
            # On create, a 404 means the namespace is missing: nothing to "recreate", the
            # config or the cluster needs fixing (the slow permanent requeue retries it).
            raise Permanent("location: namespace %s does not exist; create it, or fix the Proxy's location or the "
                            "provider's namespace (%s)" % (namespace, error)) from error
        except AlreadyExists:
            existing = self._existing(namespace, request)
            if existing is None:  # deleted between our POST and GET: let the next sweep create it
                raise Transient("pod %s/%s was being replaced while creating it; will retry" % (
                    namespace, request.name)) from None
            if (existing.get("metadata") or {}).get("deletionTimestamp"):
                # Ours but terminating (a graceful delete runs for its grace period): it will
                # never serve again, so it is not the instance asked for; once it is gone the
                # name is free and a retry creates the Pod.
                raise Transient("pod %s/%s is still terminating from an earlier delete; will retry once it is "
                                "gone" % (namespace, request.name)) from None
            return False, existing

    def _all_node_addresses(self, request: InstanceRequest) -> List[str]:
        """Every address of every node, which the Pod's squid refuses (``build_pod``); none
        without an access policy (the default squid.conf has no refusal list)."""
        if request.access is None:
            return []
        return sorted({address for node in self.client.list_nodes() for address in node_addresses(node)},
                      key=lambda address: (":" in address, address))

    def _ensure_service(self, request: InstanceRequest, pod: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The Pod's Service (made now, or found ours); None without a Service exposure."""
        if not self.exposed:
            return None
        service = build_service(self.settings, request, pod)
        namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
        try:
            return self.client.create_service(namespace, service)
        except AlreadyExists:
            existing = self._service(namespace, name)
            if existing is None or not is_ours(existing, request.tags):
                raise Permanent("name: a service %s/%s exists and is not the egress-proxies one of this Pod; it is "
                                "left alone: remove or rename it" % (namespace, name)) from None
            return existing

    def _service(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        try:
            return self.client.read_service(namespace, name)
        except NotFound:
            return None

    def _instance(self, pod: Dict[str, Any]) -> Instance:
        meta = pod.get("metadata") or {}
        service = self._service(meta.get("namespace", ""), meta.get("name", "")) if self.exposed else None
        return pod_instance(pod, self.settings.exposure, service, self._node_of(pod))

    def _node_of(self, pod: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The Node a NodePort Pod runs on (its ExternalIP is the endpoint's address); None for
        other exposures, an unscheduled Pod, or a Node that is gone."""
        node = (pod.get("spec") or {}).get("nodeName")
        if self.settings.exposure != "NodePort" or not node:
            return None
        try:
            return self.client.read_node(node)
        except NotFound:
            return None

    def _existing(self, namespace: str, request: InstanceRequest) -> Optional[Dict[str, Any]]:
        """The Pod of that name if it is ours, None if there is none; someone else's is Permanent."""
        try:
            pod = self.client.read_pod(namespace, request.name)
        except NotFound:
            return None
        if not is_ours(pod, request.tags):
            raise Permanent(
                "name: a pod %s/%s already exists and is not an egress-proxies instance of owner %r; it is left "
                "alone: rename one of them" % (namespace, request.name, request.tags.get(OWNER_TAG)))
        return pod

    # -- get / delete ----------------------------------------------------------------------

    def _managed_pod(self, provider_id: str) -> Dict[str, Any]:
        parsed = parse_provider_id(provider_id, "k8s")
        try:
            pod = self.client.read_pod(parsed.location, parsed.name)
        except NotFound as error:
            raise NotFound("pod %s/%s does not exist (%s)" % (parsed.location, parsed.name, error)) from error
        if not is_managed(pod):
            # Never not_found: the controller would "recreate" it and collide by name.
            raise Permanent("provider_id: pod %s/%s exists but is not an egress-proxies instance; it is left "
                            "alone" % (parsed.location, parsed.name))
        return pod

    def get(self, provider_id: str) -> Instance:
        return self._instance(self._managed_pod(provider_id))

    def provider_ids_for(self, name: str, location: Optional[str]) -> List[str]:
        """For state=absent by name: the Pod in ``location``, else in the provider's namespace
        (as kubernetes.core's k8s module takes its default namespace)."""
        return [format_provider_id("k8s", location or self.settings.namespace, name)]

    def delete(self, provider_id: str, check_mode: bool) -> bool:
        """Delete the Pod (and its Service); whether the Pod was (or would be) deleted. Gone
        already = False (a Service left behind is deleted all the same)."""
        parsed = parse_provider_id(provider_id, "k8s")
        try:
            pod: Optional[Dict[str, Any]] = self._managed_pod(provider_id)
        except NotFound:
            pod = None
        metadata = (pod or {}).get("metadata") or {}
        deleting = pod is not None and not metadata.get("deletionTimestamp")  # terminating: nothing to do
        if check_mode:
            return deleting
        if deleting:
            try:
                self.client.delete_pod(parsed.location, parsed.name, metadata.get("uid"))
            except NotFound:
                deleting = False
        if self.exposed:
            self._delete_service(parsed.location, parsed.name)
        return deleting

    def _delete_service(self, namespace: str, name: str) -> None:
        """Our Service of that name, if there is one (never another's)."""
        service = self._service(namespace, name)
        if service is None or not is_managed(service):
            return
        try:
            self.client.delete_service(namespace, name)
        except NotFound:
            pass

    # -- list ------------------------------------------------------------------------------

    def list(self, tags: Dict[str, str]) -> ListResult:
        """Every Pod of ours carrying ``tags`` in every configured namespace, namespaces side by
        side (``list_locations``), each in pages (``client.list_pods``).

        The label selector narrows by the label-safe tags; the annotation (the full tags)
        decides. A namespace that fails is recorded, not fatal to the others.
        """
        selector = label_selector(tags)
        nodes = {(node.get("metadata") or {}).get("name"): node for node in self.client.list_nodes()} \
            if self.settings.exposure == "NodePort" else {}

        def list_namespace(namespace: str) -> List[Instance]:
            try:
                pods = self.client.list_pods(namespace, selector)
                services = self.client.list_services(namespace, selector) if self.exposed else []
            except NotFound:
                return []  # no such namespace (the real server lists one as empty): no Pods there
            by_name = {(service.get("metadata") or {}).get("name"): service for service in services}
            return [pod_instance(pod, self.settings.exposure, by_name.get(pod["metadata"].get("name")),
                                 nodes.get((pod.get("spec") or {}).get("nodeName")))
                    for pod in pods if is_managed(pod) and matches_tags(pod_tags(pod), tags)]

        instances, failed = list_locations(self.settings.locations, str, list_namespace)
        return ListResult(instances, failed)
