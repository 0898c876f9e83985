# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GCP provider: create, get, delete and list proxy instances across the configured zones.

Anatomy of one instance (docs/gcp-provider.md): the machine type and boot image from the
config, one NIC on the configured network (with a one-to-one NAT when ``externalIP``),
labels and metadata from ``labels.py``, and the user-data in the metadata item
``user-data`` byte for byte. Only ``client.py`` talks to the API.
"""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    Permanent,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import GceInstance, InsertSpec
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import (
    MARKER_LABEL,
    MARKER_VALUE,
    OURS_FILTER,
    PORT_METADATA_KEY,
    TAGS_METADATA_KEY,
    decode_tags,
    encode_tags,
    is_ours,
    list_filter,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    Instance,
    InstanceRequest,
    ListResult,
    choose_key,
    matches_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    format_provider_id,
    parse_provider_id,
)

USER_DATA_KEY = "user-data"
USER_DATA_ENCODING_KEY = "user-data-encoding"

# GCE instance status -> the contract's state. REPAIRING is GCE recovering the instance
# after a host failure by itself: pending (waiting), not error (which would invite a
# replacement of something that is coming back).
STATES = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "REPAIRING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopped",
    "STOPPED": "stopped",
    "SUSPENDING": "stopped",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",
}


def state_of(status: str) -> str:
    """The contract's state for a GCE status; an unknown status is an error worth seeing."""
    return STATES.get(status, "error")


def utc_created(timestamp: Optional[str]) -> Optional[str]:
    """GCE's RFC 3339 creationTimestamp (``2026-01-02T03:04:05.678-08:00``) as UTC ``...Z``, like KVM's."""
    if not timestamp:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def user_data_metadata(user_data: bytes, encoding: str) -> List[Tuple[str, str]]:
    """The ``user-data`` metadata items: plain text as is, base64 input as base64 text plus
    ``user-data-encoding: base64`` (cloud-init's GCE datasource decodes it back to the bytes)."""
    if not user_data:
        return []
    if encoding == "base64":
        return [(USER_DATA_KEY, base64.b64encode(user_data).decode("ascii")), (USER_DATA_ENCODING_KEY, "base64")]
    # Plain user-data came in as a string and was encoded as UTF-8, so this is that string again.
    return [(USER_DATA_KEY, user_data.decode("utf-8"))]


@dataclass(frozen=True)
class _Plan:
    machine_type: str  # the config's value: a bare name or a (partial) URL
    image: str
    labels: Dict[str, str]
    metadata: List[Tuple[str, str]]


class GcpProvider:
    def __init__(self, settings: GcpSettings, client: Any) -> None:
        """``client`` is a ``client.ComputeClient`` (or anything with its methods)."""
        self.settings = settings
        self.client = client

    def close(self) -> None:
        self.client.close()

    # -- conversions -----------------------------------------------------------------------

    def provider_id(self, zone: str, name: str) -> str:
        return format_provider_id("gce", zone, name, self.settings.project)

    def _instance(self, found: GceInstance) -> Instance:
        state = state_of(found.status)
        return Instance(
            provider_id=self.provider_id(found.zone, found.name), name=found.name, location=found.zone,
            state=state, ip=found.nat_ip or found.internal_ip, tags=decode_tags(found.labels, found.metadata),
            created=utc_created(found.creation_timestamp))

    def _parse(self, provider_id: str) -> Tuple[str, str]:
        parsed = parse_provider_id(provider_id, "gce")
        if parsed.project != self.settings.project:
            raise Permanent("provider_id: %r is in project %r, but this provider manages project %r" % (
                provider_id, parsed.project, self.settings.project))
        return parsed.location, parsed.name

    def _zone(self, location: str) -> str:
        if location not in self.settings.zones:
            raise Permanent("location: zone %r is not configured for this provider (configured: %s)" % (
                location, ", ".join(self.settings.zones)))
        return location

    # -- get / list ------------------------------------------------------------------------

    def get(self, provider_id: str) -> Instance:
        """The instance; any zone of the project answers (a zone since removed from the config
        too), and a 404 (a retired zone too) is not_found."""
        zone, name = self._parse(provider_id)
        return self._instance(self.client.get(zone, name))

    def list(self, tags: Dict[str, str]) -> ListResult:
        """Every instance of ours carrying ``tags`` in the configured zones: one aggregatedList."""
        query = list_filter(tags)
        if query is None:
            return ListResult([], {})
        listing = self.client.aggregated_list(query, self.settings.zones)
        instances = [self._instance(found) for found in listing.instances
                     if is_ours(found.labels) and matches_tags(decode_tags(found.labels, found.metadata), tags)]
        return ListResult(instances, dict(listing.failed_zones))

    # -- create ----------------------------------------------------------------------------

    def _plan(self, request: InstanceRequest) -> "_Plan":
        """Everything about the instance that does not depend on its zone, checked before any API call."""
        machine_key = choose_key("machine_type", request.machine_type, self.settings.default_machine_type,
                                 self.settings.machine_types, "a machine type")
        image_key = choose_key("image", request.image, self.settings.default_image, self.settings.images, "an image")
        if request.location:
            self._zone(request.location)
        labels, tags_json = encode_tags(request.tags)
        metadata = [*user_data_metadata(request.user_data, request.user_data_encoding),
                    (TAGS_METADATA_KEY, tags_json), (PORT_METADATA_KEY, str(request.port))]
        return _Plan(self.settings.machine_types[machine_key], self.settings.images[image_key], labels, metadata)

    def _insert_spec(self, request: InstanceRequest, plan: "_Plan", zone: str) -> InsertSpec:
        machine_type = plan.machine_type
        if "/" not in machine_type:  # a bare name such as e2-small: GCE wants the zonal path
            machine_type = "zones/%s/machineTypes/%s" % (zone, machine_type)
        return InsertSpec(name=request.name, zone=zone, machine_type=machine_type, source_image=plan.image,
                          network=self.settings.network, external_ip=self.settings.external_ip,
                          labels=dict(plan.labels), metadata=list(plan.metadata))

    def _existing_and_zone(self, request: InstanceRequest) -> Tuple[Optional[GceInstance], str]:
        """An instance of this name, and the zone to use.

        With a location, one get there. Without, one aggregatedList of our instances in
        every configured zone finds a same-named one anywhere and counts per zone for
        placement; a zone that cannot be listed fails the create (transient) rather than
        risk a twin of an instance it might hold.
        """
        if request.location:
            zone = self._zone(request.location)
            return self.client.find(zone, request.name), zone
        listing = self.client.aggregated_list(OURS_FILTER, self.settings.zones)
        for found in listing.instances:
            if found.name == request.name:
                return found, found.zone
        if listing.failed_zones:
            raise Transient("cannot place %s: listing failed in zone(s) %s" % (request.name, "; ".join(
                "%s: %s" % (zone, error) for zone, error in sorted(listing.failed_zones.items()))))
        owner = {OWNER_TAG: request.tags[OWNER_TAG]} if OWNER_TAG in request.tags else {}
        counts = dict.fromkeys(self.settings.zones, 0)
        for found in listing.instances:
            if found.zone in counts and matches_tags(decode_tags(found.labels, found.metadata), owner):
                counts[found.zone] += 1
        # min() keeps the first of equals: config order breaks ties.
        return None, min(self.settings.zones, key=lambda zone: counts[zone])

    def _ours_or_fail(self, found: GceInstance, field: str) -> GceInstance:
        if not is_ours(found.labels):
            raise Permanent("%s: instance %s in zone %s was not made by egress-proxies (it has no %s=%s label); "
                            "refusing to touch it" % (field, found.name, found.zone, MARKER_LABEL, MARKER_VALUE))
        return found

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]:
        """Create ``request`` unless an instance of that name exists (then changed is False)."""
        plan = self._plan(request)
        found, zone = self._existing_and_zone(request)
        if found is not None:
            return False, self._instance(self._ours_or_fail(found, "name"))
        spec = self._insert_spec(request, plan, zone)
        if check_mode:
            return True, Instance(provider_id=self.provider_id(zone, request.name), name=request.name,
                                  location=zone, state="pending", tags=dict(request.tags))
        created = self.client.insert(spec)
        found = self.client.get(zone, request.name)
        if not created:  # 409: made meanwhile (a concurrent run, or a foreign instance)
            return False, self._instance(self._ours_or_fail(found, "name"))
        return True, self._instance(found)

    # -- delete ----------------------------------------------------------------------------

    def delete(self, provider_id: str, check_mode: bool) -> bool:
        """Delete the instance; False when it was already gone (a retired zone too)."""
        zone, name = self._parse(provider_id)
        found = self.client.find(zone, name)
        if found is None:
            return False
        # Nothing without our marker is ever touched, even if a providerID points at it.
        self._ours_or_fail(found, "provider_id")
        if check_mode:
            return True
        return bool(self.client.delete(zone, name))
