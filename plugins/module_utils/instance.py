# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every provider takes (an InstanceRequest) and returns (an Instance).

The return shape is the module contract in docs/contract.md:
``{provider_id, name, location, state, ip, endpoint, tags, created}``: ``ip`` is the
instance's own address, ``endpoint`` the ``host:port`` a crawler dials (the same address on
KVM and GCP; a node's address or a load balancer's for a Pod exposed through one).
"""

from __future__ import annotations

import concurrent.futures
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    PERMANENT,
    Permanent,
    ProxyError,
    Transient,
)

if TYPE_CHECKING:  # squid_access imports nothing from here; only the annotation needs it
    from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import Access

STATES = ("pending", "running", "stopped", "error")
DEFAULT_PORT = 3128
# No proxy listens below 1024 on any provider: those are the host's services (22 is sshd on every
# VM image; a KVM host publishes or GCP's firewall opens the port for crawlers), and an
# unprivileged squid (the Kubernetes Pod) cannot bind them anyway.
MIN_PORT = 1024

# One rule for every provider: an RFC 1123 label fits a libvirt domain name, a GCE
# instance name (which must also start with a letter) and a Pod name alike.
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")

# Locations (KVM hosts, GCP zones, namespaces) a listing reads side by side: almost all of a
# location's listing is waiting for its answers, so reading them one after another made a
# listing's time the sum of every location's; more than this at once only opens more
# connections than two cores can keep busy (measured in docs/performance.md).
LISTING_PARALLELISM = 8

OWNER_TAG = "crawl.example.com/owner"
PROXY_TAG = "crawl.example.com/proxy"
UID_TAG = "crawl.example.com/uid"
SPEC_HASH_TAG = "crawl.example.com/spec-hash"


@dataclass(frozen=True)
class InstanceRequest:
    """A validated ask for one instance (the module's options after decoding)."""

    name: str
    user_data: bytes
    tags: Dict[str, str]
    location: Optional[str] = None
    machine_type: Optional[str] = None
    image: Optional[str] = None
    port: int = DEFAULT_PORT
    # How user_data arrived; GCP passes base64 input on as base64 metadata (docs/contract.md).
    user_data_encoding: str = "plain"
    # Who may use the proxy (the ``access`` option); None keeps the provider's own behaviour.
    access: Optional["Access"] = None


@dataclass
class Instance:
    provider_id: str
    name: str
    location: str
    state: str
    ip: Optional[str] = None
    endpoint: Optional[str] = None
    tags: Dict[str, str] = field(default_factory=dict)
    created: Optional[str] = None
    exposure: Optional[str] = None
    """How crawlers reach ``endpoint`` and from where, and whether a passing probe proves the path
    a crawler outside takes (a provider that can tell says so; None: it does not)."""

    def to_dict(self) -> Dict[str, Any]:
        found = {
            "provider_id": self.provider_id, "name": self.name, "location": self.location, "state": self.state,
            "ip": self.ip, "endpoint": self.endpoint, "tags": dict(self.tags), "created": self.created,
        }
        if self.exposure is not None:
            found["exposure"] = self.exposure
        return found


def endpoint_of(host: Optional[str], port: Optional[int]) -> Optional[str]:
    """``host:port`` (``[v6]:port`` for an IPv6 address), or None while either is unknown."""
    if not host or not port:
        return None
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise Permanent(
            "name: %r is not a valid instance name: use 1-63 lowercase letters, digits and '-', starting with "
            "a letter and ending with a letter or digit" % (name,))
    return name


def validate_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise Permanent("port: %r is not a TCP port; use %d-65535 (default %d)" % (port, MIN_PORT, DEFAULT_PORT))
    if port < MIN_PORT:
        raise Permanent("port: %d is below %d, where the instance's own services listen (22 is its sshd): the "
                        "firewall or the host's publishing would open that service to crawlers instead of squid; "
                        "use %d-65535 (default %d)" % (port, MIN_PORT, MIN_PORT, DEFAULT_PORT))
    return port


def validate_tags(tags: Optional[Mapping[Any, Any]]) -> Dict[str, str]:
    result: Dict[str, str] = {}
    for key, value in (tags or {}).items():
        if not isinstance(key, str) or not key:
            raise Permanent("tags: every key must be a non-empty string, got %r" % (key,))
        if not isinstance(value, str):
            raise Permanent("tags.%s: value must be a string, got %s" % (key, type(value).__name__))
        result[key] = value
    return result


def choose_key(option: str, requested: Optional[str], default: str, table: Mapping[str, Any], what: str) -> str:
    """The requested key of a config table (machine types, images), else the default; an
    unknown key is Permanent, naming the module option and the keys there are."""
    key = requested or default
    if key not in table:
        raise Permanent("%s: %r is not %s of this provider (known: %s)" % (
            option, key, what, ", ".join(sorted(table))))
    return key


def matches_tags(instance_tags: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """True when the instance carries every wanted tag with the same value."""
    return all(instance_tags.get(key) == value for key, value in wanted.items())


@dataclass
class ListResult:
    """Instances found by a listing, plus the locations that could not be listed (and why)."""

    instances: List[Instance]
    failed_locations: Dict[str, ProxyError] = field(default_factory=dict)

    def to_result(self, what: str) -> Dict[str, Any]:
        """The info module's result. A failed location fails the whole listing, so nothing
        garbage-collects on a partial view, but the failure still carries what was seen."""
        instances = [instance.to_dict() for instance in self.instances]
        if not self.failed_locations:
            return {"changed": False, "instances": instances, "failed_locations": {}}
        failed = {location: {"error_class": error.error_class, "msg": str(error)}
                  for location, error in self.failed_locations.items()}
        # Permanent only when no location could heal by itself.
        permanent = all(error.error_class == PERMANENT for error in self.failed_locations.values())
        failure_class = Permanent if permanent else Transient
        raise failure_class("listing failed on %s: %s" % (what, "; ".join(
            "%s: %s" % (location, error) for location, error in sorted(self.failed_locations.items()))),
            details={"instances": instances, "failed_locations": failed})


Location = TypeVar("Location")
Listed = TypeVar("Listed")


def list_locations(locations: Sequence[Location], name_of: Callable[[Location], str],
                   list_one: Callable[[Location], List[Listed]]) -> Tuple[List[Listed], Dict[str, ProxyError]]:
    """``list_one`` for every location, LISTING_PARALLELISM at a time: what they found, in the
    order of ``locations``, and the locations that failed (by ``name_of``), each with its error.

    A location that fails is recorded, never fatal to the others: the caller decides (a listing
    with any failed location fails as a whole, so nothing is garbage-collected on a partial view,
    ``ListResult.to_result``). Anything that is not a ProxyError is a bug and is raised."""
    def attempt(location: Location) -> Tuple[List[Listed], Optional[ProxyError]]:
        try:
            return list_one(location), None
        except ProxyError as error:
            return [], error

    if len(locations) <= 1:
        outcomes = [attempt(location) for location in locations]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(LISTING_PARALLELISM, len(locations))) as pool:
            outcomes = list(pool.map(attempt, locations))
    found: List[Listed] = []
    failed: Dict[str, ProxyError] = {}
    for location, (items, error) in zip(locations, outcomes):
        if error is not None:
            failed[name_of(location)] = error
        found.extend(items)
    return found, failed
