"""Every reason a Proxy's or a ProxyPool's conditions and Events carry, named once (the condition
types are in ``conditions``). They are the API's vocabulary: docs/contract.md lists each one
("Reasons", "Conditions", "Events" of the Proxy; "Status" of the ProxyPool, its
``distinctEgressIPs``) and tests/controller/resources/test_reasons.py holds the two to each other.

The ``Serving`` condition's failing reasons are the probe's own (``serving.probe.ProbeReason``):
they are named there, as the values of what a probe found.
"""

from __future__ import annotations

# -- a Proxy's Ready condition: True ---------------------------------------------------------------
SERVING = "Serving"  # also the Serving condition's when the probes pass
PROVIDER_WIDE_FAILURE = "ProviderWideFailure"  # kept Ready while every probe of its provider fails at once
INSTANCE_RUNNING = "InstanceRunning"  # probe: none

# -- a Proxy's Ready condition: False ------------------------------------------------------------
PROVISIONING = "Provisioning"
AWAITING_PROBE = "AwaitingProbe"  # also the Serving condition's (Unknown) before the first probe
NOT_PRIVATE = "NotPrivate"  # also the Private condition's, and an Event's
NOT_SERVING = "NotServing"  # also an Event's: an instance that kept failing its probes is replaced
INSTANCE_STOPPED = "InstanceStopped"  # also the Serving condition's
INSTANCE_ERROR = "InstanceError"  # also the Serving condition's
QUARANTINED = "Quarantined"  # also the Serving reason of a replaced bare Proxy, and an Event's
REPLACEMENTS_EXHAUSTED = "ReplacementsExhausted"
CREATE_FAILED = "CreateFailed"
LIST_FAILED = "ListFailed"  # also the ProviderListed condition's
DELETE_FAILED = "DeleteFailed"
INVALID_SPEC = "InvalidSpec"  # also a ProxyPool's Available and Progressing, and its Event
SOURCE_DEFECT = "SourceDefect"
PROVIDER_CONFIG_INVALID = "ProviderConfigInvalid"
PROVIDER_NOT_CONFIGURED = "ProviderNotConfigured"
INTERNAL_ERROR = "InternalError"

# -- a Proxy's Private condition (and Serving's under probe: none) --------------------------------
CREDENTIALS_REQUIRED = "CredentialsRequired"
AUTH_DISABLED = "AuthDisabled"  # also an Event's, once, when it starts
UNVERIFIED = "Unverified"

# -- a Proxy's Events (besides the reasons above) --------------------------------------------------
CREATED = "Created"
REPLACING = "Replacing"
INSTANCE_LOST = "InstanceLost"  # also the Replacing condition's
FLAPPING = "Flapping"  # also the Replacing condition's: probes failing a share of the window, in spells
# Also the Replacing condition's (its host's state is draining: moved elsewhere), and the HostActive
# condition's and a Warning Event's when spec.location pins the Proxy there (not moved).
HOST_DRAINING = "HostDraining"
HOST_CORDONED = "HostCordoned"  # the HostActive condition's, and a Warning Event's: pinned to a cordoned host
REPLACED = "Replaced"
DELETED = "Deleted"
ABANDONED = "Abandoned"
GARBAGE_COLLECTED = "GarbageCollected"

# -- a ProxyPool's conditions -----------------------------------------------------------------------
MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
MINIMUM_REPLICAS_UNAVAILABLE = "MinimumReplicasUnavailable"
RECONCILING = "Reconciling"
COMPLETE = "Complete"
PLACEMENT_DEGRADED = "PlacementDegraded"  # also its Event's
ALL_PLACEMENTS_SERVING = "AllPlacementsServing"
EGRESS_IPS_DISTINCT = "EgressIPsDistinct"
EGRESS_IP_SHARED = "EgressIPShared"

# -- a ProxyPool's Events (besides the reasons above) --------------------------------------------
MEMBERS_CREATED = "MembersCreated"
MEMBER_DELETED = "MemberDeleted"
ROTATING = "Rotating"
UPDATING = "Updating"
PLACEMENT_RECOVERED = "PlacementRecovered"
FOREIGN_PROXY = "ForeignProxy"
