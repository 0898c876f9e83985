"""Status conditions in metav1.Condition's shape, for Proxies and ProxyPools alike: building one,
finding one, and merging the conditions a sweep decided into the ones an object has, so that a
condition's ``lastTransitionTime`` moves only when its status does. The condition types are named
here; the reasons they carry in ``reasons``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A Proxy's condition types (docs/contract.md, "The Proxy resource", "Conditions").
READY = "Ready"
SERVING = "Serving"
PRIVATE = "Private"
PROVIDER_LISTED = "ProviderListed"
# Present only while spec.location pins the Proxy to a host taken out of placement (cordoned, draining).
HOST_ACTIVE = "HostActive"
# A ProxyPool's condition types (docs/contract.md, "The ProxyPool resource", "Status").
AVAILABLE = "Available"
PROGRESSING = "Progressing"
PLACEMENT_DEGRADED = "PlacementDegraded"
DISTINCT_EGRESS_IPS = "DistinctEgressIPs"
# Present from a replacement of an instance (its reason says why) until the successor serves.
REPLACING = "Replacing"

# metav1.Condition caps message at 32768 characters; the API server rejects longer ones.
MAX_CONDITION_MESSAGE = 32768

# What a sweep wants of one condition: (status, reason, message); None removes the condition.
Wanted = tuple[str, str, str]


def condition(condition_type: str, status: str, reason: str, message: str, transition: str,
              generation: int) -> dict[str, Any]:
    """One condition in metav1.Condition's shape (an over-long message is cut, as the API requires)."""
    if len(message) > MAX_CONDITION_MESSAGE:
        message = message[: MAX_CONDITION_MESSAGE - 12] + " [truncated]"
    return {"type": condition_type, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": transition, "observedGeneration": generation}


def find_condition(status: Mapping[str, Any], condition_type: str) -> dict[str, Any]:
    """The condition of that type in an object's status, or ``{}``."""
    return next((c for c in status.get("conditions") or []
                 if isinstance(c, dict) and c.get("type") == condition_type), {})


def merge_conditions(previous: Any, wanted: Mapping[str, Wanted | None], stamp: str,
                     generation: int) -> list[dict[str, Any]]:
    """The conditions to write: each wanted one (keeping its ``lastTransitionTime`` while its
    status stays, else ``stamp``), a ``None`` one removed, and the others as they were."""
    old = [c for c in previous or [] if isinstance(c, dict)]
    by_type = {c.get("type"): c for c in old}
    result = []
    for condition_type, value in wanted.items():
        if value is None:
            continue
        status, reason, message = value
        before = by_type.get(condition_type) or {}
        kept = before.get("lastTransitionTime") if before.get("status") == status else None
        result.append(condition(condition_type, status, reason, message, str(kept or stamp), generation))
    result.extend(c for c in old if c.get("type") not in wanted)
    return result
