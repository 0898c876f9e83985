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
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import (
    GceInstance,
    InsertSpec,
    MachineTypeNotInZone,
    MissingReference,
    QuotaExceeded,
    StockOut,
    operation_deadline,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import (
    FirewallKeeper,
    Opening,
    ProviderIdentity,
    opening_metadata,
    opening_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.labels import (
    MARKER_LABEL,
    MARKER_VALUE,
    OURS_FILTER,
    PORT_METADATA_KEY,
    SOURCES_METADATA_KEY,
    TAGS_METADATA_KEY,
    decode_tags,
    encode_tags,
    is_ours,
    list_filter,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.startup import startup_script
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    Instance,
    InstanceRequest,
    ListResult,
    choose_key,
    endpoint_of,
    matches_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    format_provider_id,
    parse_provider_id,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import admitting_probes

Log = Callable[[str], None]

USER_DATA_KEY = "user-data"
USER_DATA_ENCODING_KEY = "user-data-encoding"
# The operator's channel beside user-data: the Google guest environment (google-guest-agent's
# metadata script runner) runs this item as root on every boot, on every public image, while
# user-data is read only where cloud-init is installed (not on Debian's GCE images). It carries
# the access policy and installs squid where the image lacks it (startup.py); user-data stays
# the user's, byte for byte.
STARTUP_SCRIPT_KEY = "startup-script"

# GCE instance status -> the contract's state, for every status the Compute API documents
# (Instance.Status in compute.proto and "Instance lifecycle"):
# - PROVISIONING, STAGING: on the way to RUNNING. PENDING: a flex-start or TPU instance
#   waiting for capacity before it is provisioned: still on its way, so pending.
# - REPAIRING: GCE recovers the instance after a host failure by itself and returns it to
#   RUNNING: pending (waiting), not error, which would invite replacing something that is
#   coming back.
# - STOPPING, SUSPENDING, PENDING_STOP (a graceful shutdown in progress), STOPPED, SUSPENDED,
#   TERMINATED: stopped. Preemption and host errors end in TERMINATED; the instance does not
#   come back by itself, and stopped is what the controller's self-healing acts on.
# - DEPROVISIONING: "the instance is halted and we are performing tear down tasks like network
#   deprogramming, releasing quota, IP, tearing down disks": already halted and heading for
#   TERMINATED, STOPPED, SUSPENDED or deletion, never back to RUNNING by itself: stopped.
#   (pending would make the controller wait for something that will not run.)
# Anything else is a status this provider does not know: error, worth a look.
STATES = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "PENDING": "pending",
    "REPAIRING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopped",
    "PENDING_STOP": "stopped",
    "SUSPENDING": "stopped",
    "DEPROVISIONING": "stopped",
    "STOPPED": "stopped",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",
}

# A machine type given as a (partial) URL names its zone.
ZONAL_MACHINE_TYPE_RE = re.compile(r"(?:^|/)zones/([^/]+)/machineTypes/([^/]+)$")


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


def _why_passed(zone: str, error: ProxyError) -> str:
    if isinstance(error, StockOut):
        return "zone %s was out of capacity: %s" % (zone, error)
    if isinstance(error, MachineTypeNotInZone):
        return "zone %s does not offer the machine type: %s" % (zone, error)
    return "zone %s could not take it: %s" % (zone, error)


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
    machine_key: str
    machine_type: str  # the config's value: a bare name, or a (partial) URL naming its zone
    pinned_zone: Optional[str]  # the zone such a URL names
    image_key: str
    image: str
    labels: Dict[str, str]
    metadata: List[Tuple[str, str]]
    opening: Opening  # what the firewall must admit for it


class GcpProvider:
    def __init__(self, settings: GcpSettings, client: Any, identity: ProviderIdentity,
                 warn: Optional[Log] = None) -> None:
        """``client`` is a ``client.ComputeClient`` (or anything with its methods); ``identity``
        the provider's name, owner and default sources (its firewall rule's); ``warn`` reports
        what the run did that its result does not show (the module's warnings)."""
        self.settings = settings
        self.client = client
        self.firewall = FirewallKeeper(settings, client, identity)
        self.warn: Log = warn or (lambda _message: None)
        # One budget for the whole module run, from its first insert or delete: a batch's items
        # (``operations``) run side by side and share it, so however many there are the run ends
        # within the runner's timeout; an item reached after it is transient without starting
        # anything (the retry finds it by name).
        self._run_deadline: Optional[float] = None
        self._deadline_lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    # -- conversions -----------------------------------------------------------------------

    def provider_id(self, zone: str, name: str) -> str:
        return format_provider_id("gce", zone, name, self.settings.project)

    def _instance(self, found: GceInstance) -> Instance:
        state = state_of(found.status)
        if self.settings.external_ip:
            # Crawlers reach the proxy from outside: its internal address would be a wrong
            # answer that looks right, so none is reported until the NAT IP is there.
            ip = found.nat_ip
            if ip is None and state == "running":
                self.warn("instance %s in zone %s is running without an external IP although gcp.externalIP is "
                          "true (no natIP on its first network interface); its ip is reported as null, not its "
                          "internal address" % (found.name, found.zone))
        else:
            ip = found.internal_ip
        port = found.metadata.get(PORT_METADATA_KEY, "")
        return Instance(
            provider_id=self.provider_id(found.zone, found.name), name=found.name, location=found.zone,
            state=state, ip=ip, endpoint=endpoint_of(ip, int(port) if port.isdigit() else None),
            tags=decode_tags(found.labels, found.metadata), created=utc_created(found.creation_timestamp))

    def _parse(self, provider_id: str) -> Tuple[str, str]:
        parsed = parse_provider_id(provider_id, "gce")
        if parsed.project != self.settings.project:
            raise Permanent("provider_id: %r is in project %r, but this provider manages project %r" % (
                provider_id, parsed.project, self.settings.project))
        return parsed.location, parsed.name

    def _deadline(self) -> float:
        """This item's deadline for inserts and waits: its own budget, capped by the run's (set
        by the first item that needs one); Transient for an item reached after the run's."""
        own = operation_deadline()
        with self._deadline_lock:
            if self._run_deadline is None:
                self._run_deadline = own
            run = self._run_deadline
        if own != run and time.monotonic() >= run:
            raise Transient("not started: this module run's time for waiting on operations is used up (a large "
                            "batch on a slow API); will retry")
        return min(own, run)

    def provider_ids_for(self, name: str, location: Optional[str]) -> List[str]:
        """For state=absent by name: the instance in zone ``location``, else in every configured zone."""
        zones = [self._zone(location)] if location else list(self.settings.zones)
        return [self.provider_id(zone, name) for zone in zones]

    def _zone(self, location: str) -> str:
        if location not in self.settings.zones:
            raise Permanent("location: zone %r is not configured for this provider (configured: %s)" % (
                location, ", ".join(self.settings.zones)))
        return location

    # -- get / list ------------------------------------------------------------------------

    def get(self, provider_id: str) -> Instance:
        """The instance; any zone of the project answers (a zone since removed from the config
        too), and a 404 or an unknown zone is not_found."""
        zone, name = self._parse(provider_id)
        return self._instance(self.client.get(zone, name))

    def list(self, tags: Dict[str, str]) -> ListResult:
        """Every instance of ours carrying ``tags`` in the configured zones; a zone that cannot
        be listed is a failed location on its own."""
        query = list_filter(tags)
        if query is None:
            return ListResult([], {})
        listing = self.client.list_instances(query, self.settings.zones)
        instances = [self._instance(found) for found in listing.instances
                     if is_ours(found.labels) and matches_tags(decode_tags(found.labels, found.metadata), tags)]
        return ListResult(instances, dict(listing.failed_zones))

    # -- create ----------------------------------------------------------------------------

    def _plan(self, request: InstanceRequest) -> "_Plan":
        """Everything about the instance that does not depend on its zone, checked before any API call."""
        machine_key = choose_key("machine_type", request.machine_type, self.settings.default_machine_type,
                                 self.settings.machine_types, "a machine type")
        image_key = choose_key("image", request.image, self.settings.default_image, self.settings.images, "an image")
        machine_type = self.settings.machine_types[machine_key]
        pinned_zone = None
        if "/" in machine_type:
            zonal = ZONAL_MACHINE_TYPE_RE.search(machine_type)
            if zonal is None:
                raise Permanent("machine_type: %r (machineTypes.%s) is not a machine type such as e2-small or "
                                "zones/<zone>/machineTypes/e2-small; fix the provider config" % (
                                    machine_type, machine_key))
            pinned_zone = zonal.group(1)
        labels, tags_json = encode_tags(request.tags)
        opening = opening_of(request.access, request.port, self.firewall.identity)
        self.firewall.require(opening)
        access = admitting_probes(request.access, self.firewall.identity.probe_sources)
        metadata = [*user_data_metadata(request.user_data, request.user_data_encoding),
                    (TAGS_METADATA_KEY, tags_json), (PORT_METADATA_KEY, str(request.port)),
                    (SOURCES_METADATA_KEY, opening_metadata(opening)),
                    (STARTUP_SCRIPT_KEY, startup_script(access, request.port))]
        plan = _Plan(machine_key, machine_type, pinned_zone, image_key, self.settings.images[image_key], labels,
                     metadata, opening)
        if request.location:
            misfit = self._misfit(plan, self._zone(request.location))
            if misfit:
                raise Permanent(misfit)
        return plan

    def _misfit(self, plan: "_Plan", zone: str) -> Optional[str]:
        """Why an instance of ``plan`` cannot go to ``zone`` (None when it can): GCE only takes
        a machine type of the instance's own zone. (A subnetwork must be of the zone's region
        too; the config refuses one that is not in every configured zone's region.)"""
        if plan.pinned_zone is not None and plan.pinned_zone != zone:
            name = plan.machine_type.rsplit("/", 1)[-1]
            return ("machine_type: %r (machineTypes.%s) is pinned to zone %s and cannot be used in zone %s; "
                    "configure the bare name %r so that each zone gets its own" % (
                        plan.machine_type, plan.machine_key, plan.pinned_zone, zone, name))
        return None

    def _insert_spec(self, request: InstanceRequest, plan: "_Plan", zone: str) -> InsertSpec:
        """The insert for ``zone``: a bare machine type name resolved in that zone, a pinned one
        as is (``_misfit`` made sure it fits). A custom-mode or Shared VPC network needs the
        subnetwork; without one the network's own (auto mode) is used."""
        machine_type = plan.machine_type
        if plan.pinned_zone is None:
            machine_type = "zones/%s/machineTypes/%s" % (zone, machine_type)
        return InsertSpec(name=request.name, zone=zone, machine_type=machine_type, source_image=plan.image,
                          network=self.settings.network, subnetwork=self.settings.subnetwork,
                          external_ip=self.settings.external_ip, labels=dict(plan.labels),
                          metadata=list(plan.metadata), network_tags=self.firewall.instance_tags(plan.opening))

    def _existing_and_zones(self, request: InstanceRequest, plan: "_Plan") -> Tuple[Optional[GceInstance], List[str]]:
        """An instance of this name, and the zones to try, best first.

        With a location, one get there. Without, the zones the plan fits (a pinned machine
        type narrows them to its zone), refused before any call if none does;
        then one listing of our instances in every configured zone finds a same-named one
        anywhere and counts per zone for placement. A zone that cannot be listed fails the
        create rather than risk a twin of an instance it might hold.
        """
        if request.location:
            zone = self._zone(request.location)
            return self.client.find(zone, request.name), [zone]
        misfits = [(zone, self._misfit(plan, zone)) for zone in self.settings.zones]
        candidates = [zone for zone, misfit in misfits if misfit is None]
        if not candidates:
            raise Permanent("%s (no configured zone fits: %s)" % (misfits[0][1], ", ".join(self.settings.zones)))
        listing = self.client.list_instances(OURS_FILTER, self.settings.zones)
        for found in listing.instances:
            if found.name == request.name:
                return found, [found.zone]
        if listing.failed_zones:
            failure = Permanent if all(isinstance(e, Permanent) for e in listing.failed_zones.values()) else Transient
            raise failure("cannot place %s: listing failed in zone(s) %s" % (request.name, "; ".join(
                "%s: %s" % (zone, error) for zone, error in sorted(listing.failed_zones.items()))))
        owner = {OWNER_TAG: request.tags[OWNER_TAG]} if OWNER_TAG in request.tags else {}
        counts = dict.fromkeys(candidates, 0)
        for found in listing.instances:
            if found.zone in counts and matches_tags(decode_tags(found.labels, found.metadata), owner):
                counts[found.zone] += 1
        # sorted() is stable: config order breaks ties.
        return None, sorted(candidates, key=lambda zone: counts[zone])

    def _ours_or_fail(self, found: GceInstance, field: str) -> GceInstance:
        if not is_ours(found.labels):
            raise Permanent("%s: instance %s in zone %s was not made by egress-proxies (it has no %s=%s label); "
                            "refusing to touch it" % (field, found.name, found.zone, MARKER_LABEL, MARKER_VALUE))
        return found

    def _missing(self, error: MissingReference, plan: "_Plan", zone: str) -> Permanent:
        """A 404 on the insert, as a failure naming the option or config field to fix."""
        if error.field == "image":
            return Permanent("image: %r (images.%s) does not exist or is not readable: %s; fix images.%s in the "
                             "provider config" % (plan.image, plan.image_key, error, plan.image_key))
        if error.field == "machine_type":
            return Permanent("machine_type: %r (machineTypes.%s) does not exist in zone %s: %s; fix machineTypes.%s "
                             "in the provider config" % (
                                 plan.machine_type, plan.machine_key, zone, error, plan.machine_key))
        if error.field in ("network", "subnetwork"):
            return Permanent("gcp.%s: not found: %s; fix the provider config" % (error.field, error))
        return error

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]:
        """Create ``request`` unless an instance of that name exists (then changed is False), and
        make sure its opening's firewall rule exists (before the insert, so a refusal leaves
        nothing behind, and after it: firewall.py says why)."""
        plan = self._plan(request)
        found, zones = self._existing_and_zones(request, plan)
        if found is not None:
            ours = self._ours_or_fail(found, "name")
            # A retried create whose rule step failed: its rule, for the instance carrying its tag
            # (never one of the legacy layout, which has no rule of its own to admit).
            if not check_mode and self.firewall.managed and self.firewall.rule_name(plan.opening) in ours.network_tags:
                self.firewall.admit(plan.opening, self._deadline())
            return False, self._instance(ours)
        if check_mode:
            return True, Instance(provider_id=self.provider_id(zones[0], request.name), name=request.name,
                                  location=zones[0], state="pending", tags=dict(request.tags))
        deadline = self._deadline()
        self.firewall.admit(plan.opening, deadline)
        created, found = self._place(request, plan, zones, deadline)
        self.firewall.admit(plan.opening, deadline)
        return created, self._instance(found)

    def _place(self, request: InstanceRequest, plan: "_Plan", zones: List[str],
               deadline: float) -> Tuple[bool, GceInstance]:
        """Insert into the first of ``zones`` that takes the instance, in this run.

        What lasts moves the insert on rather than failing it: a zone out of capacity or
        without the machine type (the next zone), a regional quota used up (the next zone of
        another region). A warning says where it went and why. Nothing is remembered between
        runs (the module is stateless): each create tries the least-loaded zone first again.
        """
        passed: List[Tuple[str, ProxyError]] = []
        exhausted_regions: Set[str] = set()
        for zone in zones:
            if zone.rsplit("-", 1)[0] in exhausted_regions or (passed and time.monotonic() >= deadline):
                continue
            try:
                created = self.client.insert(self._insert_spec(request, plan, zone), deadline)
            except (StockOut, MachineTypeNotInZone) as error:
                passed.append((zone, error))
                continue
            except QuotaExceeded as error:
                passed.append((zone, error))
                if error.region is None:
                    break  # a project-wide quota: no other zone helps
                exhausted_regions.add(error.region)
                continue
            except MissingReference as error:
                raise self._missing(error, plan, zone) from error
            found = self.client.get(zone, request.name)
            if passed:
                self.warn("instance %s was placed in zone %s because %s" % (
                    request.name, zone, "; ".join(_why_passed(where, error) for where, error in passed)))
            if not created:  # 409: made meanwhile (a concurrent run, or a foreign instance)
                return False, self._ours_or_fail(found, "name")
            return True, found
        raise self._unplaced(request, plan, zones, passed)

    def _unplaced(self, request: InstanceRequest, plan: "_Plan", zones: List[str],
                  passed: List[Tuple[str, ProxyError]]) -> ProxyError:
        """Why no zone took the instance: permanent when none offers the machine type (the
        config must change), else transient (capacity and quotas come back)."""
        tried = [zone for zone, _error in passed]
        errors = [error for _zone, error in passed]
        if errors and all(isinstance(error, MachineTypeNotInZone) for error in errors):
            return Permanent("machine_type: %r (machineTypes.%s) does not exist in zone(s) %s: %s; fix "
                             "machineTypes.%s (or gcp.zones) in the provider config: `gcloud compute machine-types "
                             "list --filter=name=%s` lists the zones that offer it" % (
                                 plan.machine_type, plan.machine_key, ", ".join(tried), errors[0], plan.machine_key,
                                 plan.machine_type.rsplit("/", 1)[-1]))
        if request.location:
            hint = "location pins it to zone %s, so it cannot move to another zone" % request.location
        elif any(isinstance(error, QuotaExceeded) and error.region is None for error in errors):
            hint = "a project-wide quota: no other zone can help"
        elif len(tried) < len(zones):
            hint = "zone(s) %s were not tried (their region is out of quota, or time ran out)" % ", ".join(
                zone for zone in zones if zone not in tried)
        else:
            hint = "every zone it may go to (%s) was tried" % ", ".join(zones)
        kinds = {type(error) for error in errors}
        what = "out of capacity" if kinds == {StockOut} else "quota exceeded" if kinds == {QuotaExceeded} else \
            "no zone could take it"
        return Transient("%s: %s; %s; will retry" % (what, "; ".join(str(error) for error in errors), hint))

    # -- delete ----------------------------------------------------------------------------

    def delete(self, provider_id: str, check_mode: bool) -> bool:
        """Delete the instance; False when it was already gone (its zone too). Either way the
        firewall rule is then brought in step with the instances left (a retry of a delete whose
        firewall step failed finds the instance gone and still does it)."""
        zone, name = self._parse(provider_id)
        found = self.client.find(zone, name)
        if found is not None:
            # Nothing without our marker is ever touched, even if a providerID points at it.
            self._ours_or_fail(found, "provider_id")
        if check_mode:
            return found is not None
        deadline = self._deadline()
        deleted = found is not None and bool(self.client.delete(zone, name, deadline))
        self.firewall.settle(deadline)
        return deleted
