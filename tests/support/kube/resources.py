# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API emulator's resource table: the kinds it serves and what each needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import yaml

from support import REPO

Obj = dict[str, Any]

# The namespaces a new cluster has (kube-apiserver's system namespaces controller makes them).
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
PROXY_CRD_PATH = REPO / "controller" / "manifests" / "crd.yaml"


@dataclass(frozen=True)
class ResourceType:
    """One row of the resource table: everything the server needs to serve a kind."""

    group: str
    """API group; ``""`` for the core group served under ``/api``."""
    version: str
    kind: str
    plural: str
    namespaced: bool
    status_subresource: bool
    """With it, main writes ignore ``status``, ``/status`` writes change only ``status``, and
    ``generation`` counts ``spec`` changes; without it, any non-metadata change bumps it."""
    returns_deleted_object: bool = False
    """Whether an immediate DELETE answers with the object (pods, custom resources) or with a
    ``Status`` of success (most other built-in kinds)."""
    initial_status: Mapping[str, Any] | None = None
    """What the server puts in ``status`` on create (the real server resets it for these kinds)."""
    custom: bool = False
    """A custom resource (served from a CRD): it has no strategic merge patch, only JSON merge
    and JSON patch."""
    scale: tuple[str, str, str | None] | None = None
    """The CRD's scale subresource: (specReplicasPath, statusReplicasPath, labelSelectorPath)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """``plural`` for the core group, ``plural.group`` otherwise (kubectl's spelling)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"
NAMESPACES_KEY = "namespaces"
NAMESPACE_FINALIZER = "kubernetes"
PODS_KEY = "pods"
SERVICES_KEY = "services"
QUOTAS_KEY = "resourcequotas"
NODES_KEY = "nodes"
EVENTS_KEY = "events"
LEASES_KEY = "leases.coordination.k8s.io"


def proxy_crd() -> Obj:
    """The project's Proxy CRD, as ``controller/manifests/crd.yaml`` ships it."""
    return cast(Obj, yaml.safe_load(PROXY_CRD_PATH.read_text()))

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "Namespace", "namespaces", False, True, False, {"phase": "Active"}),
    ResourceType("", "v1", "Pod", "pods", True, True, True, {"phase": "Pending"}),
    ResourceType("", "v1", "Secret", "secrets", True, False),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, False),
    ResourceType("", "v1", "Event", "events", True, False),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, False),
    ResourceType("", "v1", "Service", "services", True, True, False, {"loadBalancer": {}}),
    ResourceType("", "v1", "ResourceQuota", "resourcequotas", True, True),
    ResourceType("", "v1", "Node", "nodes", False, True),
    ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, False),
    # What deploy_controller.yml installs besides the kinds above.
    ResourceType("apps", "v1", "Deployment", "deployments", True, True),
    ResourceType("networking.k8s.io", "v1", "Ingress", "ingresses", True, True, False, {"loadBalancer": {}}),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False, False),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False, False),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True, False),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True, False),
    ResourceType("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
                 True),
)
