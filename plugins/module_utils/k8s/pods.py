# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Pod of one Proxy, as plain dicts: built from the config and the request, read back
into an ``Instance``. Pure functions, no API calls, so every rule here is unit-tested with
tables (tests/unit/plugins/module_utils/k8s/test_pods.py).

Anatomy (docs/kubernetes-provider.md has the why):
- labels ``app.kubernetes.io/name: egress-proxy``, ``app.kubernetes.io/managed-by:
  egress-proxies``, ``app.kubernetes.io/instance: <name>`` and every tag that is a valid label as
  it stands (the owner tag always is: config.py validates it as a label value). Listing selects
  on these.
- annotation ``crawl.example.com/tags``: all tags as JSON, the source of truth when reading
  back (``crawl.example.com/proxy: ns/name`` is not a valid label value, so labels alone
  cannot carry every tag);
- annotation ``crawl.example.com/squid-conf``: the squid.conf (``http_port <port>`` first),
  projected into the container as a file by a downwardAPI volume, so the whole instance is
  one object created in one call: no ConfigMap to create, clean up or grant RBAC for;
- with the ``access`` option: the operator's policy (squid_access.py) around the provider's
  squidConfig (its head right after ``http_port``, its tail last), and the password file
  (bcrypt hashes only, never a password) in the annotation ``crawl.example.com/squid-passwd``,
  projected by the same volume. Not a Secret: the provider's Role has no Secrets (they live
  only in the controller's own namespace), and a hash of a random password of 128 bits or
  more gains a reader nothing. The container's command (squid_install.container_command)
  first writes the error pages and the Pod's own addresses (its ``status.podIPs`` and its
  node's ``status.hostIP``, from the downward API) into an emptyDir at ``/run/egress-proxy``;
- one container running ``squid -N -f /etc/egress-proxy/squid.conf``, with the port, the
  resource requests and a tcpSocket readiness probe on the port, as the unprivileged ``proxy``
  user: the Pod passes the ``restricted`` Pod Security Standard;
- the exposure (settings.EXPOSURES): a ``hostPort``, ``hostNetwork``, or a Service per Pod
  (:func:`build_service`), and what a crawler dials read back (:func:`pod_endpoint`); a
  topology spread constraint over ``kubernetes.io/hostname`` on the owner's Pods (egress from
  different nodes).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.crawl.egress_proxies.plugins.module_utils import squid_networks as nets
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import DEFAULT_ALLOWED_SOURCES
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    Instance,
    InstanceRequest,
    endpoint_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import (
    SERVICE_EXPOSURES,
    KubernetesSettings,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import format_provider_id
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    Access,
    PolicyPaths,
    refuse_open_user_config,
    render_password_file,
    render_policy,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import container_command

NAME_LABEL = "app.kubernetes.io/name"
NAME_VALUE = "egress-proxy"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "egress-proxies"
FIXED_LABELS = {NAME_LABEL: NAME_VALUE, MANAGED_BY_LABEL: MANAGED_BY_VALUE}
# The Pod's own name, which its Service (NodePort, LoadBalancer exposure) selects on.
INSTANCE_LABEL = "app.kubernetes.io/instance"
RESERVED_LABELS = (*FIXED_LABELS, INSTANCE_LABEL)
TAGS_ANNOTATION = "crawl.example.com/tags"
SQUID_CONF_ANNOTATION = "crawl.example.com/squid-conf"
PASSWD_ANNOTATION = "crawl.example.com/squid-passwd"

CONTAINER_NAME = "squid"
PORT_NAME = "proxy"
CONF_VOLUME = "squid-conf"
CONF_DIR = "/etc/egress-proxy"
CONF_FILE = "squid.conf"
PASSWD_FILE = "passwd"
# Written by the container's command before squid starts: an emptyDir, whatever the image's
# file system allows.
RUN_VOLUME = "egress-proxy-run"
RUN_DIR = "/run/egress-proxy"
POD_PATHS = PolicyPaths(password_file="%s/%s" % (CONF_DIR, PASSWD_FILE), own_addresses="%s/own-addresses" % RUN_DIR,
                        error_directory="%s/errors" % RUN_DIR)
# The Pod's own addresses, which squid never connects to: its IPs and its node's (the same with
# hostNetwork). status.podIPs is comma-separated for a dual-stack Pod. Both are fields an env var
# may take from the downward API (validation.go, validEnvDownwardAPIFieldPathExpressions);
# status.hostIPs is not used: API servers before 1.29 refuse it (the PodHostIPs feature gate).
OWN_ADDRESS_ENV = (("POD_IPS", "status.podIPs"), ("NODE_IP", "status.hostIP"))
# squid's auth helper runs as squid's unprivileged user, and projected files are root's.
PASSWD_MODE = 0o444
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"
_FAMILY_VERSIONS = {"IPv4": 4, "IPv6": 6}
# squid's own shutdown_lifetime in the default config is 3 s; this leaves it room.
TERMINATION_GRACE_SECONDS = 10
# The Pod passes the "restricted" Pod Security Standard (k8s.io/pod-security-admission, policy/
# check_runAsNonRoot.go, check_seccompProfile_restricted.go, check_allowPrivilegeEscalation.go,
# check_capabilities_restricted.go), so it is admitted in a namespace enforcing it: squid runs as
# the Debian/Ubuntu ``proxy`` user (uid and gid 13, which the squid images' own
# cache_effective_user is) without root, privilege escalation or any capability, under the
# runtime's default seccomp profile. As non-root it cannot bind ports below 1024 (without
# NET_BIND_SERVICE in its effective set, which a non-root process does not get), so those are
# refused. Measured with squid 5.7 as uid 13 and the default squid.conf: it starts and serves.
SQUID_UID = 13
UNPRIVILEGED_PORT_START = 1024
POD_SECURITY_CONTEXT: Dict[str, Any] = {"runAsNonRoot": True, "runAsUser": SQUID_UID, "runAsGroup": SQUID_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT: Dict[str, Any] = {"allowPrivilegeEscalation": False, "privileged": False}

# What squid serves when the provider config has no squidConfig: a forward proxy for
# clients from the provider config's default allowed sources only (an open proxy on a node
# IP would be abused within hours), CONNECT only to 443, no disk cache, no access log. Squid
# opens its logs after dropping to its cache_effective_user, which may not open the
# container's /dev/stdout (squid 5.7 then exits: "FATAL: Cannot open '/dev/stdout' for
# writing", measured), and a log file in the container would grow unrotated; cache.log falls
# back to stderr by itself.
DEFAULT_SQUID_CONFIG = ("acl localnet src %s\n" % " ".join(DEFAULT_ALLOWED_SOURCES)) + """\
acl SSL_ports port 443
acl Safe_ports port 80 443
acl CONNECT method CONNECT
http_access deny !Safe_ports
http_access deny CONNECT !SSL_ports
http_access allow localnet
http_access deny all
cache deny all
access_log none
cache_log /dev/stderr
pid_filename none
shutdown_lifetime 3 seconds
"""

# Label syntax (k8s.io/apimachinery validation): an optional DNS-subdomain prefix and "/",
# then a name of at most 63 characters; values are empty or a name-shaped string.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY_RE = re.compile(r"^(?:(?P<prefix>%s)/)?%s$" % (_LABEL_PREFIX, _LABEL_NAME))
_LABEL_VALUE_RE = re.compile(r"^(%s)?$" % _LABEL_NAME)

# Waiting reasons that do not heal by waiting: the instance is in error, not pending.
FAILING_WAIT_REASONS = frozenset((
    "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
))


def is_label_key(key: str) -> bool:
    match = _LABEL_KEY_RE.fullmatch(key)
    return match is not None and len(match.group("prefix") or "") <= 253


def is_label_value(value: str) -> bool:
    return _LABEL_VALUE_RE.fullmatch(value) is not None


def tag_labels(tags: Mapping[str, str]) -> Dict[str, str]:
    """The tags that are valid labels as they stand; the others live only in the annotation."""
    return {key: value for key, value in tags.items() if is_label_key(key) and is_label_value(value)}


def pod_labels(tags: Mapping[str, str], name: str) -> Dict[str, str]:
    for key in tags:
        if key in RESERVED_LABELS:
            raise Permanent("tags.%s: is reserved for the label the Kubernetes provider sets itself; "
                            "use another tag key" % key)
    labels = dict(FIXED_LABELS)
    labels[INSTANCE_LABEL] = name
    labels.update(tag_labels(tags))
    return labels


def label_selector(tags: Mapping[str, str]) -> str:
    """Our Pods carrying the label-safe part of ``tags``; the rest is filtered by the caller."""
    wanted = dict(FIXED_LABELS)
    wanted.update(tag_labels(tags))
    return ",".join("%s=%s" % (key, value) for key, value in sorted(wanted.items()))


def squid_conf(settings: KubernetesSettings, port: int, access: Optional[Access] = None,
               node_addresses: Sequence[str] = ()) -> str:
    """The squid.conf of one Pod: ``http_port`` from the request, then the configured text, with
    the operator's policy around it when ``access`` is given.

    The policy's rules come first and end in ``http_access deny all``, so the configured text's
    own ``http_access`` lines are never reached; its settings come last (its other directives
    still apply). A squidConfig with ``http_access allow all`` is refused outright, so the
    config never reads as an open proxy. ``node_addresses`` (every address of every node, see
    :func:`build_pod`) are refused as the addresses of the machine the Pod runs on.
    """
    body = settings.squid_config if settings.squid_config is not None else DEFAULT_SQUID_CONFIG
    if not body.endswith("\n"):
        body += "\n"
    if access is None:
        return "http_port %d\n%s" % (port, body)
    refuse_open_user_config(settings.squid_config, "squidConfig (the Kubernetes provider's config)")
    return "http_port %d\n%s" % (port, render_policy(access, POD_PATHS, node_addresses).around(body))


def build_pod(settings: KubernetesSettings, request: InstanceRequest, namespace: str,
              node_addresses: Sequence[str] = ()) -> Dict[str, Any]:
    """The Pod manifest for ``request`` in ``namespace`` (a plain dict, as the API takes it).

    ``node_addresses``: the addresses of every node of the cluster (``status.addresses``, the
    provider lists them). The squid.conf is written before the scheduler picks the Pod's node,
    so every node's addresses are refused: a safe superset of its own node's (an ExternalIP
    included, which the downward API cannot give the container)."""
    if request.port < UNPRIVILEGED_PORT_START:
        raise Permanent("port: %d is below %d: squid runs as an unprivileged user (the Pod passes the restricted Pod "
                        "Security Standard) and cannot listen there; use a port of %d or more" % (
                            request.port, UNPRIVILEGED_PORT_START, UNPRIVILEGED_PORT_START))
    labels = pod_labels(request.tags, request.name)
    container = _container(settings, request.port)
    spec: Dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # squid needs neither the API nor Service environment variables.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(POD_SECURITY_CONTEXT),
        "volumes": [{"name": CONF_VOLUME,
                     "downwardAPI": {"items": [_annotation_file(CONF_FILE, SQUID_CONF_ANNOTATION)]}}],
    }
    annotations = {
        TAGS_ANNOTATION: json.dumps(request.tags, sort_keys=True, separators=(",", ":")),
        SQUID_CONF_ANNOTATION: squid_conf(settings, request.port, request.access, node_addresses),
    }
    if request.access is not None:
        _with_policy(request.access, container, spec, annotations)
    if settings.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if settings.spread_nodes:
        spec["topologySpreadConstraints"] = [_spread(labels)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": request.name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": spec}


def _container(settings: KubernetesSettings, port: int) -> Dict[str, Any]:
    """squid in the foreground on ``port``, unprivileged (CONTAINER_SECURITY_CONTEXT)."""
    declared: Dict[str, Any] = {"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}
    if settings.exposure in ("hostPort", "hostNetwork"):
        # The node's port: the scheduler never puts two Pods with the same hostPort on one node
        # (the API server defaults hostPort to containerPort with hostNetwork; stated, the
        # manifest equals what is stored).
        declared["hostPort"] = port
    return {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "command": ["squid", "-N", "-f", "%s/%s" % (CONF_DIR, CONF_FILE)],
        "ports": [declared],
        "readinessProbe": {"tcpSocket": {"port": PORT_NAME}, "initialDelaySeconds": 2, "periodSeconds": 5,
                           "timeoutSeconds": 2, "failureThreshold": 3},
        "resources": {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request}},
        "securityContext": dict(CONTAINER_SECURITY_CONTEXT, capabilities={"drop": ["ALL"]}),
        "volumeMounts": [{"name": CONF_VOLUME, "mountPath": CONF_DIR, "readOnly": True}],
    }


def _annotation_file(path: str, annotation: str) -> Dict[str, Any]:
    return {"path": path, "fieldRef": {"fieldPath": "metadata.annotations['%s']" % annotation}}


def _with_policy(access: Access, container: Dict[str, Any], spec: Dict[str, Any],
                 annotations: Dict[str, str]) -> None:
    """The password file projected beside squid.conf; the container writes what else the policy
    needs at start (its own addresses, the error pages) into an emptyDir, then execs squid."""
    if access.users:
        annotations[PASSWD_ANNOTATION] = render_password_file(access)
        spec["volumes"][0]["downwardAPI"]["items"].append(
            dict(_annotation_file(PASSWD_FILE, PASSWD_ANNOTATION), mode=PASSWD_MODE))
    variables = [name for name, _path in OWN_ADDRESS_ENV]
    container["command"] = container_command(RUN_DIR, variables, container["command"])
    container["env"] = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
                        for name, path in OWN_ADDRESS_ENV]
    container["volumeMounts"].append({"name": RUN_VOLUME, "mountPath": RUN_DIR})
    spec["volumes"].append({"name": RUN_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})


def _spread(labels: Mapping[str, str]) -> Dict[str, Any]:
    """Over nodes, among the owner's Pods. ScheduleAnyway: with more Proxies than nodes the extra
    ones still run (sharing a node's IP) instead of staying Pending; the scheduler still spreads
    them evenly."""
    selector = {key: labels[key] for key in (MANAGED_BY_LABEL, OWNER_TAG) if key in labels}
    return {"maxSkew": 1, "topologyKey": HOSTNAME_TOPOLOGY_KEY, "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector}}


def build_service(settings: KubernetesSettings, request: InstanceRequest, pod: Mapping[str, Any]) -> Dict[str, Any]:
    """The Service exposing ``pod`` (created, so it has its uid) when the exposure is a Service one.

    Its name, labels and tags annotation are the Pod's, so it lists and is cleaned up with it;
    an ownerReference to the Pod lets a real cluster's garbage collector remove it with the Pod
    too. ``externalTrafficPolicy: Local`` keeps the client's address (squid's source allowlist
    sees the crawler, not a node that forwarded it) and sends traffic only to the Pod's node; a
    LoadBalancer also gets the allowed sources of its IP families as ``loadBalancerSourceRanges``
    (:func:`source_ranges`) and no node ports (``allocateLoadBalancerNodePorts: false``).
    """
    meta = pod["metadata"]
    spec: Dict[str, Any] = {
        "type": settings.exposure,
        "selector": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, INSTANCE_LABEL: meta["name"]},
        "ports": [{"name": PORT_NAME, "port": request.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        "externalTrafficPolicy": "Local",
        "ipFamilyPolicy": "RequireDualStack" if len(settings.ip_families) > 1 else "SingleStack",
        "ipFamilies": list(settings.ip_families),
    }
    if settings.exposure == "LoadBalancer":
        # No node ports: nodeIP:nodePort would reach the Pod past loadBalancerSourceRanges, which
        # only the load balancer's address honours (issue 38 row 9).
        spec["allocateLoadBalancerNodePorts"] = False
        if request.access is not None and request.access.allowed_sources:
            spec["loadBalancerSourceRanges"] = source_ranges(request.access.allowed_sources, settings.ip_families)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": meta["name"], "namespace": meta["namespace"], "labels": dict(meta["labels"]),
        "annotations": {TAGS_ANNOTATION: meta["annotations"][TAGS_ANNOTATION]},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta.get("uid", "")}]},
        "spec": spec}


def source_ranges(sources: Sequence[str], families: Sequence[str]) -> List[str]:
    """The allowed sources a load balancer of ``families`` can hold: a range of another family
    makes the cloud's firewall refuse the whole list (the Service then never gets an address), and
    could never reach that load balancer anyway. None left would be an empty list, which a cloud
    reads as "everyone": Permanent, naming the fields."""
    versions = {_FAMILY_VERSIONS[family] for family in families}
    kept = [source for source in sources if ipaddress.ip_network(source, strict=False).version in versions]
    if not kept:
        named = (", ".join(sources), " or ".join(families), "/".join(families))
        raise Permanent("access.allowed_sources: none of %s is %s, the IP families of the Proxy's Service "
                        "(kubernetes.ipFamilies); name the crawlers' %s networks in allowedSources, or set "
                        "ipFamilies to the family they use" % named)
    return kept


# -- reading a Pod back ----------------------------------------------------------------------


def _metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def is_managed(pod: Mapping[str, Any]) -> bool:
    """Whether the Pod was made by this provider (any owner)."""
    return (_metadata(pod).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


def is_ours(pod: Mapping[str, Any], tags: Mapping[str, str]) -> bool:
    """Made by this provider for the same owner as ``tags`` names (checked on the label)."""
    labels = _metadata(pod).get("labels") or {}
    return is_managed(pod) and labels.get(OWNER_TAG) == tags.get(OWNER_TAG)


def pod_tags(pod: Mapping[str, Any]) -> Dict[str, str]:
    """The tags from the annotation; a Pod whose annotation is missing or broken has none,
    so no tag filter (the owner's above all) ever matches it and it is never touched."""
    raw = (_metadata(pod).get("annotations") or {}).get(TAGS_ANNOTATION)
    try:
        tags = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    if not isinstance(tags, dict):
        return {}
    return {key: value for key, value in tags.items() if isinstance(key, str) and isinstance(value, str)}


def _condition(status: Mapping[str, Any], kind: str) -> Optional[str]:
    conditions: List[Mapping[str, Any]] = status.get("conditions") or []
    return next((str(c.get("status")) for c in conditions if c.get("type") == kind), None)


def _node_lost(status: Mapping[str, Any]) -> bool:
    """Not Ready although its containers are: only the node lifecycle controller writes that
    (``MarkPodsNotReady`` flips the Ready condition alone when the node stops reporting; the
    kubelet would have turned ContainersReady False too, and our Pods have no readiness gates)."""
    return _condition(status, "Ready") == "False" and _condition(status, "ContainersReady") == "True"


def _failing(status: Mapping[str, Any]) -> bool:
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAIT_REASONS:
            return True
    return False


def pod_state(pod: Mapping[str, Any]) -> str:
    """Phase and readiness as the contract's states (table in docs/kubernetes-provider.md)."""
    if _metadata(pod).get("deletionTimestamp"):
        return "stopped"  # terminating: it will not serve again
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in ("Pending", "Running") and _failing(status):
        return "error"
    if phase == "Running":
        if _condition(status, "Ready") == "True":
            return "running"
        # A lost node's Pods stay Running (nobody reports otherwise) until they are evicted and
        # then terminating for as long as the node is gone: not serving, so replaced like any.
        return "error" if _node_lost(status) else "pending"
    if phase == "Pending":
        return "pending"
    if phase == "Succeeded":
        return "stopped"
    return "error"  # Failed, Unknown (defined, set by no current component), anything newer than this code


def pod_ip(pod: Mapping[str, Any]) -> Optional[str]:
    """The address crawlers reach: the node's with hostNetwork, else the Pod's."""
    status = pod.get("status") or {}
    if (pod.get("spec") or {}).get("hostNetwork"):
        return status.get("hostIP") or status.get("podIP") or None
    return status.get("podIP") or None


def node_addresses(node: Optional[Mapping[str, Any]], kind: Optional[str] = None) -> List[str]:
    """The IP addresses a Node reports in ``status.addresses`` (of one ``kind``: InternalIP,
    ExternalIP), in its order; Hostname and DNS entries are names, not addresses, and left out."""
    found = []
    for entry in ((node or {}).get("status") or {}).get("addresses") or []:
        if kind is not None and entry.get("type") != kind:
            continue
        try:
            found.append(str(ipaddress.ip_address(str(entry.get("address")))))
        except ValueError:
            continue
    return found


def node_port_address(pod: Mapping[str, Any], node: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Where crawlers reach a NodePort on the Pod's node: its first ExternalIP when it has one
    (crawlers outside the cluster route there), else the Pod's ``hostIP`` (the node's
    InternalIP, as the kubelet reports it)."""
    external = node_addresses(node, "ExternalIP")
    return external[0] if external else (pod.get("status") or {}).get("hostIP") or None


def pod_endpoint(pod: Mapping[str, Any], exposure: str, service: Optional[Mapping[str, Any]],
                 node: Optional[Mapping[str, Any]] = None) -> Optional[str]:
    """What a crawler dials: the Pod IP and its port (``none``), its node's address and the port
    (``hostPort``, ``hostNetwork``), its node's address (:func:`node_port_address`) and the
    Service's node port (``NodePort``: externalTrafficPolicy Local serves it on the Pod's node
    only), or the load balancer's address and the Service's port (``LoadBalancer``); None until
    known."""
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    port = ((containers[0].get("ports") or [{}])[0]).get("containerPort")
    if exposure == "none":
        return endpoint_of(status.get("podIP"), port)
    if exposure in ("hostPort", "hostNetwork"):
        return endpoint_of(status.get("hostIP"), port)
    if service is None:
        return None
    service_port = ((service.get("spec") or {}).get("ports") or [{}])[0]
    if exposure == "NodePort":
        return endpoint_of(node_port_address(pod, node), service_port.get("nodePort"))
    ingress = (((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or [{}])[0]
    return endpoint_of(ingress.get("ip") or ingress.get("hostname"), service_port.get("port"))


# How to verify the outside path, named in every exposure note that cannot say it was.
VERIFY_HINT = ("to verify it, probe from outside the cluster and admit only that address (the root's probeSources; "
               "docs/kubernetes-provider.md, \"Verifying the outside path\")")


def exposure_note(pod: Mapping[str, Any], exposure: str, service: Optional[Mapping[str, Any]],
                  node: Optional[Mapping[str, Any]]) -> Optional[str]:
    """What a crawler outside the cluster meets at a NodePort or LoadBalancer endpoint, and whether a
    probe that passes proves that path (None for the other exposures: in-cluster or flat-network
    addresses).

    A load balancer whose source ranges are all outside the private networks admits nothing from
    inside the cluster, so a passing probe came from outside, the crawlers' way: verified. A
    private range (or none: everyone) admits the controller's own Pod, whose probe to the load
    balancer's address kube-proxy answers inside the cluster: not verified. A NodePort has no
    ranges at all: not verified."""
    if exposure not in SERVICE_EXPOSURES or service is None:
        return None
    if exposure == "NodePort":
        external = node_addresses(node, "ExternalIP")
        if not external:
            return ("NodePort on the node's InternalIP %s (the node has no ExternalIP): reachable from the cluster's "
                    "network only" % ((pod.get("status") or {}).get("hostIP") or "unknown"))
        return ("NodePort on the node's ExternalIP %s, no firewall in front: the outside path is not verified "
                "(nothing shows a probe crossed the node's edge; open the node port in the cloud's firewall to the "
                "crawlers' networks); %s" % (external[0], VERIFY_HINT))
    ranges = (service.get("spec") or {}).get("loadBalancerSourceRanges") or []
    private = [r for r in ranges if nets.overlaps_internal(r)]
    if ranges and not private:
        return ("LoadBalancer admitting %s only, none inside the private networks: a passing probe came from outside "
                "the cluster, the crawlers' way (outside path verified)" % ", ".join(ranges))
    why = "admits private sources (%s)" % ", ".join(private) if private else "admits every source (no source ranges)"
    return ("LoadBalancer that %s: a probe from inside the cluster passes without crossing the load balancer, so the "
            "outside path is not verified; %s" % (why, VERIFY_HINT))


def pod_instance(pod: Mapping[str, Any], exposure: str = "none",
                 service: Optional[Mapping[str, Any]] = None, node: Optional[Mapping[str, Any]] = None) -> Instance:
    """The instance of ``pod`` (and, for a Service exposure, its ``service``; for a NodePort, its
    ``node``). A running Pod whose endpoint is not known yet (no load balancer address) is
    pending; one whose Service is gone is in error (crawlers cannot reach it; it is replaced)."""
    meta = _metadata(pod)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    state, endpoint = pod_state(pod), pod_endpoint(pod, exposure, service, node)
    if state == "running" and endpoint is None:
        state = "error" if exposure in SERVICE_EXPOSURES and service is None else "pending"
    return Instance(
        provider_id=format_provider_id("k8s", namespace, name), name=name, location=namespace, state=state,
        ip=pod_ip(pod), endpoint=endpoint, tags=pod_tags(pod), created=meta.get("creationTimestamp"),
        exposure=exposure_note(pod, exposure, service, node))
