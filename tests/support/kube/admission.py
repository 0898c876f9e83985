"""Admission and defaulting the Kubernetes API emulator applies to Pods and Services on create
(tests/support/kube/emulator.py), each rule after the real server's source:

- **Pod Security admission** (k8s.io/pod-security-admission, ``admission/admission.go`` and
  ``policy/check_*.go``): the namespace's ``pod-security.kubernetes.io/enforce`` label names a
  level (``privileged``: nothing checked; ``baseline``; ``restricted``: baseline plus its own
  checks, which replace the baseline checks they override). A Pod failing any check is refused
  403 Forbidden, ``pods "<name>" is forbidden: violates PodSecurity "<level>:<version>": <reason>
  (<detail>), ...``, the checks in the order ``policy/registry.go`` runs them (baseline IDs
  sorted, then restricted IDs sorted), each reason and detail as its check words it. The checks
  here are the ones a proxy Pod can trip: host namespaces, hostPort, privileged, capabilities,
  hostPath/restricted volume types, seccomp, allowPrivilegeEscalation, runAsNonRoot, runAsUser.
- **ResourceQuota admission** (k8s.io/apiserver ``pkg/admission/plugin/resourcequota/
  controller.go``): a Pod that would take a namespace's ``pods`` (or ``count/pods``) usage past
  a ResourceQuota's ``spec.hard`` is refused 403 ``pods "<name>" is forbidden: exceeded quota:
  <quota>, requested: pods=1, used: pods=<n>, limited: pods=<hard>``. Pods in a terminal phase
  (Succeeded, Failed) do not count (the Pod evaluator's ``QuotaV1Pod``). The quota controller
  is instantaneous here (a quota without a ``status`` counts as synced), except for a quota a
  test marks unsynced (``KubeEmulator.quota_unsynced``: ``status.hard`` written, ``status.used``
  not yet): every Pod is then refused 403 ``status unknown for quota: <quota>, resources:
  <names>`` (``CheckRequest``'s ``hasUsageStats``), checked before any quota's usage.
- **Service validation** (``pkg/apis/core/validation/validation.go`` ``ValidateService``):
  ``loadBalancerSourceRanges`` only on type LoadBalancer (``spec.LoadBalancerSourceRanges:
  Forbidden: may only be used when `type` is 'LoadBalancer'``, the field path capitalised as the
  source spells it) and each entry a CIDR (``IsValidCIDR``: "must be a valid CIDR value, (e.g.
  10.9.8.0/24 or 2001:db8::/64)"); the API does **not** check the ranges' families against
  ``ipFamilies`` (the cloud's service controller fails on them: ``KubeEmulator.provision_load_balancer``);
  ``allocateLoadBalancerNodePorts`` only on type LoadBalancer; ``externalTrafficPolicy`` only on
  an externally accessible Service (NodePort, LoadBalancer, or with ``externalIPs``).
- **Service defaulting** (``pkg/registry/core/service/storage``, ``pkg/apis/core/v1/defaults.go``):
  ``type`` defaults to ClusterIP and a cluster IP is allocated; ``ipFamilies`` to the cluster's
  one family (``IPv4``: the emulator is a single-stack IPv4 cluster, kubeadm's default) and
  ``ipFamilyPolicy`` to SingleStack; NodePort and LoadBalancer Services get a ``nodePort`` per
  port from the node port range (``--service-node-port-range``, default 30000-32767), unique in
  the cluster, and ``externalTrafficPolicy: Cluster`` unless set; a LoadBalancer Service gets
  ``allocateLoadBalancerNodePorts: true`` unless set, and with ``false`` no ``nodePort`` is
  allocated (one asked for explicitly is kept); a LoadBalancer Service with ``Local`` gets a
  ``healthCheckNodePort`` either way. Its ``status.loadBalancer`` stays empty until the cloud
  provider's service controller writes the address (``KubeEmulator.provision_load_balancer``).
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

Obj = dict[str, Any]

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
# check_capabilities_baseline.go: what baseline lets a container add.
BASELINE_CAPABILITIES = frozenset(("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"))
# check_restrictedVolumes.go: the volume types restricted allows.
RESTRICTED_VOLUMES = frozenset(("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                "persistentVolumeClaim", "projected", "secret"))
NODE_PORT_RANGE = range(30000, 32768)
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")  # kubeadm's default --service-cluster-ip-range

Check = Callable[[Obj], tuple[str, str] | None]  # pod spec -> (reason, detail) when it fails


def _containers(spec: Obj) -> Iterator[Obj]:
    """visitContainers: init containers, containers, ephemeral containers."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _plural(single: str, plural: str, count: int) -> str:
    return single if count == 1 else plural


def _named(what: list[str]) -> str:
    return f"{_plural('container', 'containers', len(what))} {_quoted(what)}"


def _context(container: Obj) -> Obj:
    return container.get("securityContext") or {}


def _host_namespaces(spec: Obj) -> tuple[str, str] | None:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ("host namespaces", ", ".join(found)) if found else None


def _host_ports(spec: Obj) -> tuple[str, str] | None:
    bad = [c["name"] for c in _containers(spec) if any(p.get("hostPort") for p in c.get("ports") or [])]
    ports = sorted({str(p["hostPort"]) for c in _containers(spec) for p in c.get("ports") or [] if p.get("hostPort")})
    if not bad:
        return None
    return ("hostPort", (f"{_named(bad)} {_plural('uses', 'use', len(bad))} "
                        f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(ports)}"))


def _privileged(spec: Obj) -> tuple[str, str] | None:
    bad = [c["name"] for c in _containers(spec) if _context(c).get("privileged")]
    return ("privileged", f"{_named(bad)} must not set securityContext.privileged=true") if bad else None


def _capabilities_baseline(spec: Obj) -> tuple[str, str] | None:
    bad, added = [], set()
    for c in _containers(spec):
        extra = {str(a) for a in (_context(c).get("capabilities") or {}).get("add") or []} - BASELINE_CAPABILITIES
        if extra:
            bad.append(c["name"])
            added |= extra
    if not bad:
        return None
    return ("non-default capabilities",
            f"{_named(bad)} must not include {_quoted(sorted(added))} in securityContext.capabilities.add")


def _host_path_volumes(spec: Obj) -> tuple[str, str] | None:
    bad = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_quoted(bad)}") if bad else None


def _seccomp_baseline(spec: Obj) -> tuple[str, str] | None:
    def unconfined(context: Obj) -> bool:
        return (context.get("seccompProfile") or {}).get("type") == "Unconfined"

    setters = ["pod"] if unconfined(spec.get("securityContext") or {}) else []
    bad = [c["name"] for c in _containers(spec) if unconfined(_context(c))]
    if bad:
        setters.append(_named(bad))
    if not setters:
        return None
    return ("seccompProfile", (f'{" and ".join(setters)} must not set securityContext.seccompProfile.type to '
                              '"Unconfined"'))


def _allow_privilege_escalation(spec: Obj) -> tuple[str, str] | None:
    bad = [c["name"] for c in _containers(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    return ("allowPrivilegeEscalation != false",
            f"{_named(bad)} must set securityContext.allowPrivilegeEscalation=false") if bad else None


def _capabilities_restricted(spec: Obj) -> tuple[str, str] | None:
    missing, adding, added = [], [], set()
    for c in _containers(spec):
        capabilities = _context(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            missing.append(c["name"])
        extra = {str(a) for a in capabilities.get("add") or []} - {"NET_BIND_SERVICE"}
        if extra:
            adding.append(c["name"])
            added |= extra
    details = []
    if missing:
        details.append(f'{_named(missing)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_named(adding)} must not include {_quoted(sorted(added))} in "
                       "securityContext.capabilities.add")
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Obj) -> tuple[str, str] | None:
    bad, kinds = [], set()
    for volume in spec.get("volumes") or []:
        kind = next((key for key in volume if key != "name"), "unknown")
        if kind not in RESTRICTED_VOLUMES:
            bad.append(volume["name"])
            kinds.add(kind)
    if not bad:
        return None
    return ("restricted volume types", (f"{_plural('volume', 'volumes', len(bad))} {_quoted(bad)} "
                                       f"{_plural('uses', 'use', len(bad))} "
                                       f"{_plural('restricted volume type', 'restricted volume types', len(kinds))} "
                                       f"{_quoted(sorted(kinds))}"))


def _pod_or_containers(spec: Obj, key: str, good: Callable[[Any], bool], reason: str,
                       wanted: str, unwanted: Callable[[list[str]], str]) -> tuple[str, str] | None:
    """The shape of runAsNonRoot and seccompProfile_restricted: a Pod-level setting covers the
    containers that say nothing; an explicit bad value anywhere, else a container covered by
    nothing, fails."""
    pod_value = (spec.get("securityContext") or {}).get(key)
    setters = ["pod"] if pod_value is not None and not good(pod_value) else []
    covered = pod_value is not None and good(pod_value)
    explicit = [c["name"] for c in _containers(spec) if _context(c).get(key) is not None
                and not good(_context(c)[key])]
    implicit = [c["name"] for c in _containers(spec) if _context(c).get(key) is None and not covered]
    if explicit:
        setters.append(_named(explicit))
    if setters:
        return reason, unwanted(setters)
    if implicit:
        return reason, f"pod or {_named(implicit)} must set {wanted}"
    return None


def _run_as_non_root(spec: Obj) -> tuple[str, str] | None:
    return _pod_or_containers(
        spec, "runAsNonRoot", lambda value: value is True, "runAsNonRoot != true",
        "securityContext.runAsNonRoot=true",
        lambda setters: f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false")


def _run_as_user(spec: Obj) -> tuple[str, str] | None:
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    bad = [c["name"] for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    if bad:
        setters.append(_named(bad))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _seccomp_restricted(spec: Obj) -> tuple[str, str] | None:
    def valid(profile: Any) -> bool:
        return isinstance(profile, Mapping) and profile.get("type") in ("RuntimeDefault", "Localhost")

    def unwanted(setters: list[str]) -> str:
        values = {str((p or {}).get("type")) for p in [(spec.get("securityContext") or {}).get("seccompProfile"),
                                                       *(_context(c).get("seccompProfile") for c in _containers(spec))]
                  if p is not None and not valid(p)}
        return f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_quoted(sorted(values))}"

    return _pod_or_containers(spec, "seccompProfile", valid, "seccompProfile",
                              'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"', unwanted)


# (ID, check), in the order policy/registry.go runs them: baseline IDs sorted, then restricted ones.
BASELINE_CHECKS: tuple[tuple[str, Check], ...] = (
    ("capabilities_baseline", _capabilities_baseline), ("hostNamespaces", _host_namespaces),
    ("hostPathVolumes", _host_path_volumes), ("hostPorts", _host_ports), ("privileged", _privileged),
    ("seccompProfile_baseline", _seccomp_baseline))
RESTRICTED_CHECKS: tuple[tuple[str, Check], ...] = (
    ("allowPrivilegeEscalation", _allow_privilege_escalation), ("capabilities_restricted", _capabilities_restricted),
    ("restrictedVolumes", _restricted_volumes), ("runAsNonRoot", _run_as_non_root), ("runAsUser", _run_as_user),
    ("seccompProfile_restricted", _seccomp_restricted))
# The baseline checks a restricted check replaces (its OverrideCheckIDs).
OVERRIDDEN = frozenset(("capabilities_baseline", "hostPathVolumes", "seccompProfile_baseline"))


def pod_security_violation(namespace: Obj, pod: Obj) -> str | None:
    """The Forbidden message's ``violates PodSecurity ...`` part for ``pod`` in ``namespace``,
    or None when the namespace's enforce level admits it."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level not in LEVELS or level == "privileged":
        return None
    checks = list(BASELINE_CHECKS)
    if level == "restricted":
        checks = [(i, c) for i, c in checks if i not in OVERRIDDEN] + list(RESTRICTED_CHECKS)
    spec = pod.get("spec") or {}
    failed = [result for _, check in checks if (result := check(spec)) is not None]
    if not failed:
        return None
    version = labels.get(ENFORCE_VERSION_LABEL, "latest")
    detail = ", ".join(f"{reason} ({why})" if why else reason for reason, why in failed)
    return f'violates PodSecurity "{level}:{version}": {detail}'


POD_COUNT_RESOURCES = ("count/pods", "pods")


def _unsynced(quota: Obj) -> list[str]:
    """The Pod-count resources ``quota``'s ``status.hard`` names without a ``status.used`` entry
    (``hasUsageStats``): the quota controller has not counted them yet."""
    status = quota.get("status") or {}
    used = status.get("used") or {}
    return sorted(key for key in (status.get("hard") or {}) if key in POD_COUNT_RESOURCES and key not in used)


def quota_violation(quotas: Iterable[Obj], pods: Iterable[Obj]) -> str | None:
    """The Forbidden message's ``status unknown for quota: ...`` part while a quota is not synced,
    else its ``exceeded quota: ...`` part when one more Pod passes a quota's ``pods`` (or
    ``count/pods``) in ``spec.hard``; ``pods`` are the namespace's Pods."""
    quotas = sorted(quotas, key=lambda q: q["metadata"]["name"])
    for quota in quotas:
        unknown = _unsynced(quota)
        if unknown:
            return f"status unknown for quota: {quota['metadata']['name']}, resources: {','.join(unknown)}"
    used = sum(1 for pod in pods if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        for key in POD_COUNT_RESOURCES:
            if key in hard and used + 1 > int(hard[key]):
                return (f"exceeded quota: {quota['metadata']['name']}, requested: {key}=1, used: {key}={used}, "
                        f"limited: {key}={hard[key]}")
    return None


_CIDR_DETAIL = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
_ONLY_LOAD_BALANCER = "may only be used when `type` is 'LoadBalancer'"
EXTERNAL_TYPES = ("NodePort", "LoadBalancer")


def service_errors(service: Obj) -> list[tuple[str, str, Any, str]]:
    """``ValidateService``'s rules on the fields the provider sets: (error type, field, value,
    detail) for each failure, in the source's order."""
    spec = service.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    errors: list[tuple[str, str, Any, str]] = []
    ranges = spec.get("loadBalancerSourceRanges") or []
    if ranges:
        if kind != "LoadBalancer":
            errors.append(("FieldValueForbidden", "spec.LoadBalancerSourceRanges", None, _ONLY_LOAD_BALANCER))
        for index, value in enumerate(ranges):
            try:  # netutils.ParseCIDRSloppy: an address, "/" and a prefix length; host bits may be set
                address, slash, _length = str(value).strip().partition("/")
                ipaddress.ip_network(str(value).strip() if slash and address else "", strict=False)
            except ValueError:
                errors.append(("FieldValueInvalid", f"spec.LoadBalancerSourceRanges[{index}]", value, _CIDR_DETAIL))
    if spec.get("allocateLoadBalancerNodePorts") is not None and kind != "LoadBalancer":
        errors.append(("FieldValueForbidden", "spec.allocateLoadBalancerNodePorts", None, _ONLY_LOAD_BALANCER))
    if spec.get("externalTrafficPolicy") and kind not in EXTERNAL_TYPES and not spec.get("externalIPs"):
        errors.append(("FieldValueInvalid", "spec.externalTrafficPolicy", spec["externalTrafficPolicy"],
                       "may only be set for externally-accessible services"))
    return errors


def default_service(service: Obj, taken_node_ports: set[int], taken_ips: set[str]) -> tuple[str, int, str] | None:
    """Fill in what the API server allocates for a new Service (in place); (field, value, detail)
    of a 422 when a requested nodePort is outside the range or taken, else None."""
    spec = service.setdefault("spec", {})
    kind = spec.setdefault("type", "ClusterIP")
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("ipFamilies", ["IPv4"])
    if not spec.get("clusterIP"):
        spec["clusterIP"] = next(str(ip) for ip in itertools.islice(SERVICE_CIDR.hosts(), 10, None)
                                 if str(ip) not in taken_ips)
        spec["clusterIPs"] = [spec["clusterIP"]]
    if kind not in EXTERNAL_TYPES:
        return None
    spec.setdefault("externalTrafficPolicy", "Cluster")
    if kind == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)
    allocate = kind == "NodePort" or spec.get("allocateLoadBalancerNodePorts") is not False
    free = (port for port in NODE_PORT_RANGE if port not in taken_node_ports)
    for index, port in enumerate(spec.get("ports") or []):
        wanted = port.get("nodePort")
        if wanted is None and not allocate:
            continue
        if wanted is None:
            port["nodePort"] = next(free)
        elif wanted not in NODE_PORT_RANGE:
            return f"spec.ports[{index}].nodePort", wanted, "provided port is not in the valid range"
        elif wanted in taken_node_ports:
            return f"spec.ports[{index}].nodePort", wanted, "provided port is already allocated"
        taken_node_ports.add(port["nodePort"])
    if kind == "LoadBalancer" and spec["externalTrafficPolicy"] == "Local":
        spec["healthCheckNodePort"] = next(free)
    return None
