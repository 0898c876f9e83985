"""The Proxy resource as the controller sees it, and the names and hashes derived from it.

Plain data, no I/O: every source (Kubernetes, a directory of YAML files) produces these.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

GROUP = "crawl.example.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Proxy"
PLURAL = "proxies"

FINALIZER = f"{GROUP}/cleanup"
SKIP_CLEANUP_ANNOTATION = f"{GROUP}/skip-cleanup"
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
# "<spec hash>:<n>": how many times the instance for this spec was replaced because it died or
# stopped serving. Written before the replacement is created, so the name it derives is the
# same after a crash mid-replacement (never a duplicate).
REPLACEMENTS_ANNOTATION = f"{GROUP}/replacements"

OWNER_TAG = f"{GROUP}/owner"
PROXY_TAG = f"{GROUP}/proxy"
UID_TAG = f"{GROUP}/uid"
SPEC_HASH_TAG = f"{GROUP}/spec-hash"

DEFAULT_PORT = 3128

PHASE_PENDING = "Pending"
PHASE_PROVISIONING = "Provisioning"
PHASE_READY = "Ready"
PHASE_DELETING = "Deleting"
PHASE_FAILED = "Failed"
# Its instance was reported unusable by a crawler (docs/contract.md, "Quarantine"); until that
# instance is gone (its Proxy deleted by its pool, or the instance replaced).
PHASE_QUARANTINED = "Quarantined"

# The spec fields that shape an instance; a change to any of them replaces it.
SPEC_FIELDS = ("provider", "location", "machineType", "image", "port", "cloudInit", "cloudInitEncoding", "auth",
               "allowedSources", "allowedDestinations")


# What Kubernetes allows as a namespace (a DNS-1123 label) and as an object's name (a DNS-1123
# subdomain): k8s.io/apimachinery/pkg/util/validation IsDNS1123Label / IsDNS1123Subdomain, which
# ValidateNamespaceName and a custom resource's NameIsDNSSubdomain apply. Checked for every
# source: a directory has no API server, and these names become file names and Secret names.
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL = re.compile(_DNS1123_LABEL)
_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
NAMESPACE_RULE = (f"must be a DNS-1123 label, as Kubernetes requires of a namespace: at most {LABEL_MAX} lowercase "
                  "letters, digits and '-', starting and ending with a letter or digit")
NAME_RULE = (f"must be a DNS-1123 subdomain, as Kubernetes requires of a name: at most {SUBDOMAIN_MAX} lowercase "
             "letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit")


def is_namespace_name(text: str) -> bool:
    return len(text) <= LABEL_MAX and _LABEL.fullmatch(text) is not None


def checked_namespace(namespace: str) -> str:
    """``namespace`` if it is a namespace name (a DNS-1123 label), else ValueError: it names a
    file or a Secret, so ``../x`` must never get that far (the sweep refuses such Proxies first)."""
    if not is_namespace_name(namespace):
        raise ValueError(f"namespace {namespace!r} {NAMESPACE_RULE}")
    return namespace


def is_object_name(text: str) -> bool:
    return len(text) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(text) is not None


def replacement_count(annotations: dict[str, str], hash_of_spec: str) -> int:
    """Replacements recorded for the instance of this spec (0 after a spec change)."""
    recorded, _, count = annotations.get(REPLACEMENTS_ANNOTATION, "").partition(":")
    return int(count) if recorded == hash_of_spec and count.isdigit() else 0


def _mapping(value: Any, path: str, problems: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    problems.append(f"{path}: must be an object, not {type(value).__name__}")
    return {}


SpecT = TypeVar("SpecT")


@dataclass
class CustomObject(Generic[SpecT]):
    """One namespaced object of this API group (a Proxy, a ProxyPool): its metadata, spec and
    status as plain data (the API's own shape), parsed by one ``from_object`` for every kind.

    Mutable on purpose: the reconcilers and the sources change finalizers, annotations, status
    and resourceVersion in place and write the same object back."""

    namespace: str
    name: str
    uid: str
    spec: SpecT
    status: dict[str, Any] = field(default_factory=dict)
    generation: int = 1
    resource_version: str = ""
    finalizers: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    deletion_timestamp: str | None = None
    creation_timestamp: str | None = None
    # The whole object as a source read it, so a write can send back everything it did not
    # change (labels, spec, unknown fields) rather than a rebuilt, lossy copy. Sources that
    # need it (kube.KubeStore) set it; it duplicates the fields above, so equality ignores it.
    raw: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    # Why this object, as its source holds it, cannot be reconciled (a corrupt status file, two
    # files with one name, a field of the wrong type). The reconciler marks it Failed with this
    # message and touches nothing of it: no create, no delete, no GC of its instances.
    defect: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def deleting(self) -> bool:
        return self.deletion_timestamp is not None

    def _raw_metadata(self, key: str) -> Any:
        # Labels and owner references are read only (the controller never rewrites them), so
        # they stay in ``raw`` instead of being copied into fields a write would have to merge.
        metadata = (self.raw or {}).get("metadata")
        return metadata.get(key) if isinstance(metadata, dict) else None

    @property
    def labels(self) -> dict[str, str]:
        labels = self._raw_metadata("labels")
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    @property
    def owner_references(self) -> list[dict[str, Any]]:
        owners = self._raw_metadata("ownerReferences")
        return [o for o in owners if isinstance(o, dict)] if isinstance(owners, list) else []

    @classmethod
    def _spec_from(cls, spec: Any, problems: list[str]) -> Any:
        """The spec as this kind keeps it: an object, else a defect and ``{}``. A kind whose spec
        is validated field by field later (a ProxyPool's) keeps it as found instead."""
        return dict(_mapping(spec, "spec", problems))

    @classmethod
    def from_object(cls, obj: Any) -> Self:
        """From the API's JSON object (or a YAML file of the same shape). Never raises: an object
        whose metadata, spec or status has the wrong type gets ``defect`` set, so one malformed
        object fails alone instead of stopping the sweep."""
        problems: list[str] = []
        obj = _mapping(obj, "the object", problems)
        metadata = _mapping(obj.get("metadata"), "metadata", problems)
        spec = cls._spec_from(obj.get("spec"), problems)
        status = _mapping(obj.get("status"), "status", problems)
        generation = metadata.get("generation") or 1
        if isinstance(generation, bool) or not isinstance(generation, int | str) or not str(generation).isdigit():
            problems.append(f"metadata.generation: must be an integer, not {generation!r}")
            generation = 1
        finalizers = metadata.get("finalizers") or []
        if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
            problems.append("metadata.finalizers: must be a list of strings")
            finalizers = [f for f in finalizers if isinstance(f, str)] if isinstance(finalizers, list) else []
        annotations = _mapping(metadata.get("annotations"), "metadata.annotations", problems)
        if not all(isinstance(v, str) for v in annotations.values()):
            problems.append("metadata.annotations: every value must be a string (quote it)")
        deletion = metadata.get("deletionTimestamp")
        creation = metadata.get("creationTimestamp")
        return cls(
            namespace=str(metadata.get("namespace") or "default"),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            spec=spec,
            status=dict(status),
            generation=int(generation),
            resource_version=str(metadata.get("resourceVersion") or ""),
            finalizers=list(finalizers),
            annotations={str(k): str(v) for k, v in annotations.items()},
            deletion_timestamp=None if deletion is None else str(deletion),
            creation_timestamp=None if creation is None else str(creation),
            defect="; ".join(problems) or None,
        )


@dataclass
class Proxy(CustomObject[dict[str, Any]]):
    """One Proxy object (``from_object`` leaves ``raw`` unset: the source that needs it sets it)."""

    @property
    def provider(self) -> str:
        return str(self.spec.get("provider") or "")

    @property
    def port(self) -> int:
        return int(self.spec.get("port") or DEFAULT_PORT)

    @property
    def skip_cleanup(self) -> bool:
        return self.annotations.get(SKIP_CLEANUP_ANNOTATION, "").lower() == "true"


def spec_hash(spec: dict[str, Any]) -> str:
    """A short, stable hash of the fields that shape the instance (label-safe: 16 hex)."""
    shaping = tuple((key, tuple(value) if isinstance(value, list) else value)
                    for key, value in ((key, spec.get(key)) for key in SPEC_FIELDS))
    try:
        return _hash_of_shaping(shaping)
    except TypeError:  # a value that cannot be a cache key (an object where a string belongs)
        return _hash_of_shaping.__wrapped__(shaping)


@functools.lru_cache(maxsize=4096)
def _hash_of_shaping(shaping: tuple[tuple[str, Any], ...]) -> str:
    """``spec_hash`` of the shaping fields, remembered: a sweep hashes every Proxy's spec, and a
    fleet has few distinct ones."""
    fields: dict[str, Any] = {key: list(value) if isinstance(value, tuple) else value for key, value in shaping}
    fields["port"] = int(fields["port"] or DEFAULT_PORT)
    fields["cloudInitEncoding"] = fields["cloudInitEncoding"] or "plain"
    fields["auth"] = fields["auth"] or "basic"
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def instance_name(proxy: Proxy, hash_of_spec: str, replacement: int = 0) -> str:
    """The deterministic instance name for this Proxy and spec.

    Deterministic, so a controller killed between create and status write finds the
    same instance again instead of making a second one; it includes the spec hash,
    so a replacement (make-before-break) gets a different name than the instance it
    replaces. ``replacement`` (the recorded count of replacements of a dead or
    non-serving instance) gives a replacement its own name the same way. At most 63
    characters, starting with a letter: valid as a libvirt domain, a GCE instance and a
    Pod name alike.
    """
    seed = f"{proxy.uid}/{hash_of_spec}" + (f"/{replacement}" if replacement else "")
    suffix = hashlib.sha256(seed.encode()).hexdigest()[:6]
    readable = _NOT_NAME.sub("-", f"{proxy.namespace}-{proxy.name}".lower()).strip("-")
    readable = readable[: 63 - len(suffix) - 3].rstrip("-")
    return f"p-{readable}-{suffix}" if readable else f"p-{suffix}"


def instance_tags(owner: str, proxy: Proxy, hash_of_spec: str) -> dict[str, str]:
    return {OWNER_TAG: owner, PROXY_TAG: proxy.key, UID_TAG: proxy.uid, SPEC_HASH_TAG: hash_of_spec}
