# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KVM provider: create, get, delete and list proxy VMs across the configured hosts.

Anatomy of one instance (docs/kvm-provider.md, "Instance anatomy"), with volumes named after
the domain so that every step is idempotent and a half-made instance can always be
found and removed by name:
- ``<domain>.qcow2``: a qcow2 overlay backed by the cached ``base-<key>.<format>``;
- ``<domain>-seed.iso``: the NoCloud seed (user-data byte for byte, meta-data,
  vendor-data);
- the domain, carrying its tags in ``<metadata>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import (
    build_meta_data,
    build_seed_iso,
    build_vendor_data,
    new_instance_id,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    OWNER_TAG,
    Instance,
    InstanceRequest,
    ListResult,
    choose_key,
    endpoint_of,
    list_locations,
    matches_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import name_claims
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.addresses import (
    domain_ip,
    leased_addresses,
    listed_ip,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    create_volume,
    define_domain,
    delete_volume,
    domain_state,
    domain_states,
    domain_xml,
    find_domain,
    find_pool,
    is_active,
    lookup_pool,
    remove_domain,
    start_domain,
    undefine_domain,
    volume_capacity,
    volume_path,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.connection import KvmConnections
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_cache import DomainCache
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.domain_xml import (
    DomainInfo,
    DomainSpec,
    build_domain_xml,
    parse_domain_xml,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.images import (
    TransferEvent,
    TransferReport,
    create_volume_with_content,
    ensure_base_volume,
    lookup_volume,
    volume_xml,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.name_claims import (
    ClaimBook,
    home_host,
    owner_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.networking import (
    check_mode,
    claim,
    host_addresses,
    lookup_network,
    network_facts,
    release_address,
    reserve_address,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.run_memo import RunMemo
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import HOST_ACTIVE, KvmHost, KvmSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    format_provider_id,
    parse_provider_id,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import admitting_probes
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import boothook

GIB = 1024 ** 3
# How long a claim another controller holds, with no domain behind it, is waited for before it is
# taken for a leftover of a run that died: the controller's default runner timeout, which no create
# (base image upload included) outlives.
CLAIM_PATIENCE_SECONDS = 600
Log = Callable[[str], None]


def overlay_volume_name(domain: str) -> str:
    return "%s.qcow2" % domain


def seed_volume_name(domain: str) -> str:
    return "%s-seed.iso" % domain


@dataclasses.dataclass(frozen=True)
class _Base:
    """A host's base image volume as the run's overlays need it: backed by ``path``, at least
    ``capacity`` bytes."""

    volume: Any
    capacity: int
    path: str


@dataclasses.dataclass
class _Fleet:
    """One listing of every configured host: where each domain name lives (the host entry it is
    listed under) and each entry's domains with their XML and state."""

    where: Dict[str, KvmHost]
    domains: Dict[str, List[Tuple[Any, DomainInfo, str]]]


class KvmProvider:
    def __init__(self, settings: KvmSettings, cache_dir: str, log: Log, warn: Optional[Log] = None,
                 transfers: Optional[TransferReport] = None, probe_sources: Sequence[str] = ()) -> None:
        """``transfers`` (kvm_proxy's): where base image transfer events go, reported in the result
        as ``image_transfers``; without it (kvm_proxy_info, which never transfers) they are log lines."""
        self.settings = settings
        self.cache_dir = cache_dir
        self.log = log
        self.warn = warn or log
        self.transfers = transfers
        self.probe_sources = tuple(probe_sources)  # the root's probeSources: admitted beside the crawlers'
        self.connections = KvmConnections(settings.ssh)
        self.domain_cache = DomainCache(os.path.join(cache_dir, "domains"), settings.domain_cache_seconds)
        self.claims = ClaimBook(os.path.join(cache_dir, "claims"), owner_of(cache_dir))
        # Placement of a batch's creates: each owner's count per host (config order), read
        # once per run and kept up to date by the run's own placements, so items placed side
        # by side spread instead of all seeing the same emptiest host.
        self._placement_lock = threading.Lock()
        self._placed: Dict[str, List[int]] = {}
        # Items of one run claiming published ports and source addresses on one hypervisor take
        # turns (other runs are caught by networking.claim's check after defining).
        self._claim_locks: Dict[str, threading.Lock] = {}
        # Creates without a location: every host's domains, listed once per run (``_fleet``).
        self._fleet_listing: Optional[Union[_Fleet, ProxyError]] = None
        self._home_pools: Dict[str, name_claims.HomePool] = {}
        # Each host's pool, base volume and networking check, looked up once per run (run_memo).
        self._memo = RunMemo()

    def close(self) -> None:
        # The domains this run created, so the next listing reads none of their XML again.
        self.domain_cache.save()
        # The run's libvirt handles go before their connections: freed at interpreter exit instead,
        # after the libvirt module itself, each would print a traceback.
        self._fleet_listing = None
        self._home_pools.clear()
        self._memo.clear()
        self.connections.close()
        if self.transfers is not None:
            self.transfers.close()

    def result_fields(self) -> Dict[str, Any]:
        """What the run's result carries beside the contract's fields (proxy_module.ProxyModule.run)."""
        return {} if self.transfers is None else {"image_transfers": self.transfers.transfers()}

    def _progress(self, event: TransferEvent) -> None:
        if self.transfers is not None:
            self.transfers(event)
        else:
            self.log(event.text())

    # -- lookups ---------------------------------------------------------------------------

    def _host(self, name: str) -> KvmHost:
        host = self.settings.host(name)
        if host is None:
            known = ", ".join(h.name for h in self.settings.hosts)
            raise Permanent("location: KVM host %r is not configured (configured: %s)" % (name, known))
        return host

    @staticmethod
    def _pool(connection: Any, host: KvmHost) -> Any:
        return lookup_pool(connection, host.pool, "pool %r on host %s" % (host.pool, host.name))

    def _describe(self, host: KvmHost, domain: Any) -> Instance:
        """One domain as an Instance: its XML, its state and (running) its IP, each its own call."""
        info = self._info(host, domain)
        state = domain_state(domain, "reading state of domain %s on host %s" % (info.name, host.name))
        return self._instance(host, info, state, domain_ip(domain, info.macs) if state == "running" else None)

    @staticmethod
    def _instance(host: KvmHost, info: DomainInfo, state: str, ip: Optional[str]) -> Instance:
        # A published guest is dialled at the host's address and port (the hook's forwarding), once
        # it has an address of its own to be forwarded to.
        published = info.published
        endpoint = endpoint_of(*published) if published is not None and ip else endpoint_of(ip, info.port)
        return Instance(provider_id=format_provider_id("kvm", host.name, info.name), name=info.name,
                        location=host.name, state=state, ip=ip, endpoint=endpoint, tags=info.tags,
                        created=info.created)

    # -- get / list ------------------------------------------------------------------------

    def get(self, provider_id: str) -> Instance:
        parsed = parse_provider_id(provider_id, "kvm")
        # An unconfigured host stays Permanent here on purpose: the live path reads
        # not_found as "rebuild it", so a typo in the hosts list must never look like a
        # missing VM (that would duplicate every Proxy of the host).
        host = self._host(parsed.location)
        domain = find_domain(self.connections.open(host), parsed.name)
        if domain is None:
            raise NotFound("domain %s does not exist on KVM host %s" % (parsed.name, host.name))
        return self._describe(host, domain)

    def _recorded(self, host: KvmHost) -> List[Tuple[Any, DomainInfo, str]]:
        """Every domain with our metadata on ``host``'s hypervisor (whichever host entry, network
        or owner it belongs to), with its parsed XML and its state."""
        # Without our metadata a domain is never ours, and never touched.
        return [(domain, info, state) for domain, info, state in self._domains(host) if info.ours]

    def _domains(self, host: KvmHost) -> List[Tuple[Any, DomainInfo, str]]:
        """Every domain on ``host``'s hypervisor, ours or not, with its parsed XML and its state.

        One call answers every domain's state (``getAllDomainStats``, which lists them too),
        then one XML read per domain the domain cache does not hold: our tags live only in the
        XML (``domain_cache``)."""
        domains = domain_states(self.connections.open(host), "listing domains on host %s" % host.name)
        cache = self.domain_cache.for_uri(host.uri)
        # A virDomain holds its UUID and name: asking them is no round trip.
        uuids = [domain.UUIDString() for domain, _stats in domains]
        found = []
        for (domain, state), uuid in zip(domains, uuids):
            info = cache.get(uuid, domain.name())
            if info is None:
                try:
                    info = parse_domain_xml(domain_xml(domain, "reading domain on host %s" % host.name))
                except NotFound:
                    continue  # undefined between listing and reading: not there any more
                cache.put(uuid, info)
            found.append((domain, info, state))
        cache.keep_only(uuids)
        cache.save()
        return found

    def _listed(self, host: KvmHost, tags: Dict[str, str]) -> List[Instance]:
        """Our instances on one host: a few calls for the host (the domains with their states,
        each network's leases) and one XML read per domain; a running domain no lease covers is
        also asked for its address on its own (``addresses.listed_ip``)."""
        found = self._matching_domains(host, tags)
        running = [info for _domain, info, state in found if state == "running"]
        leases = leased_addresses(self.connections.open(host), (n for info in running for n in info.networks))
        return [self._instance(host, info, state, listed_ip(domain, info.macs, leases) if state == "running" else None)
                for domain, info, state in found]

    def _holds(self, host: KvmHost, info: DomainInfo) -> bool:
        """Whether ``host`` is the entry a domain is listed under. Entries naming the same URI are
        one hypervisor's networks: a domain belongs to the entry of its network (the first such),
        else to the first entry of that URI, so every domain is listed exactly once."""
        siblings = self._sharing(host)
        if len(siblings) == 1:
            return True
        owner = next((h for h in siblings if h.network == info.network), siblings[0])
        return owner is host

    def _sharing(self, host: KvmHost) -> List[KvmHost]:
        """The host entries naming ``host``'s URI (itself included): one hypervisor."""
        return [h for h in self.settings.hosts if h.uri == host.uri]

    def _matching_domains(self, host: KvmHost, tags: Dict[str, str]) -> List[Tuple[Any, DomainInfo, str]]:
        """Our domains listed under ``host`` carrying ``tags``, with their parsed XML and state."""
        return [(domain, info, state) for domain, info, state in self._recorded(host)
                if matches_tags(info.tags, tags) and self._holds(host, info)]

    def list(self, tags: Dict[str, str]) -> ListResult:
        """Every instance carrying ``tags`` on every configured host, hosts side by side
        (``list_locations``: one connection per host, as for everything else in a run).

        A host that fails is recorded, not fatal to the others: the caller decides
        (the module fails the run so the controller never garbage-collects on a
        partial list, but still gets the instances it could see).
        """
        instances, failed = list_locations(self.settings.hosts, lambda host: host.name,
                                           lambda host: self._listed(host, tags))
        return ListResult(instances, failed)

    # -- create ----------------------------------------------------------------------------

    def _existing(self, request: InstanceRequest) -> Tuple[Optional[KvmHost], Optional[Any]]:
        """Where a domain of this name lives now, asking each candidate host. Every one must
        answer: a host we cannot see might hold it, and creating elsewhere would duplicate it."""
        hosts = [self._host(request.location)] if request.location else list(self.settings.hosts)
        for host in hosts:
            domain = find_domain(self.connections.open(host), request.name)
            if domain is None:
                continue
            # Entries sharing one hypervisor see the same domains: it is the one its network names.
            if request.location or len(self._sharing(host)) == 1 or self._holds(host, self._info(host, domain)):
                return host, domain
        return None, None

    def _fleet(self) -> _Fleet:
        """Every configured host's domains, listed once per run, when its first create needs them
        (under the placement lock, so the run's items wait for the one listing). Every host must
        answer, as for ``_existing``; a failure is kept and fails the run's other creates too."""
        with self._placement_lock:
            if self._fleet_listing is None:
                self._fleet_listing = self._list_fleet()
            listing = self._fleet_listing
        if isinstance(listing, ProxyError):
            raise type(listing)(str(listing))  # a fresh one: threads must not share a traceback
        return listing

    def _list_fleet(self) -> Union[_Fleet, ProxyError]:
        listed, failed = list_locations(self.settings.hosts, lambda host: host.name,
                                        lambda host: [(host, self._domains(host))])
        if failed:
            name, error = next(iter(failed.items()))
            return type(error)("host %s must answer before anything is created without a location: %s" % (
                name, error))
        fleet = _Fleet(where={}, domains={})
        for host, domains in listed:
            fleet.domains[host.name] = domains
            single = len(self._sharing(host)) == 1
            for domain, info, _state in domains:
                # Entries sharing one hypervisor see the same domains: it is the one its network names.
                if single or self._holds(host, info):
                    fleet.where.setdefault(domain.name(), host)
        return fleet

    def _known(self, name: str) -> Tuple[Optional[KvmHost], Optional[Any]]:
        """Where the run's listing saw a domain called ``name``, looked up again there (it may have
        gone since); else nothing."""
        host = self._fleet().where.get(name)
        if host is None:
            return None, None
        domain = find_domain(self.connections.open(host), name)
        return (host, domain) if domain is not None else (None, None)

    @staticmethod
    def _info(host: KvmHost, domain: Any) -> DomainInfo:
        return parse_domain_xml(domain_xml(domain, "reading domain on host %s" % host.name))

    def _place(self, request: InstanceRequest) -> KvmHost:
        """The requested host, else the one with the fewest of our instances (config order breaks ties).

        The hosts are counted once per run, from the run's one listing (``_fleet``), and each
        placement adds one.
        """
        if request.location:
            return self._host(request.location)
        owner = request.tags.get(OWNER_TAG, "")
        # A host whose networking fields are wrong, or that is cordoned or draining, takes no new
        # proxies; the others do.
        hosts = [h for h in self.settings.hosts if h.takes_new_proxies]
        if not hosts:
            states = ["host %s is %s (%s)" % (h.name, h.state, h.at("state"))
                      for h in self.settings.hosts if h.state != HOST_ACTIVE]
            raise Permanent("no host can take a new proxy: %s" % "; ".join(
                list(self.settings.location_errors) + states))
        fleet = self._fleet()
        with self._placement_lock:
            counts = self._placed.get(owner)
            if counts is None:
                wanted = {OWNER_TAG: owner} if owner else {}
                counts = [sum(1 for _d, info, _s in fleet.domains[host.name]
                              if info.ours and matches_tags(info.tags, wanted) and self._holds(host, info))
                          for host in hosts]
                self._placed[owner] = counts
            index = min(range(len(hosts)), key=lambda i: (counts[i], i))
            counts[index] += 1
        return hosts[index]

    def provider_ids_for(self, name: str, location: Optional[str]) -> List[str]:
        """Where a domain called ``name`` may be, for state=absent by name: the host named by
        ``location``, else every configured host (each must answer: a host we cannot see
        might hold it)."""
        hosts = [self._host(location)] if location else list(self.settings.hosts)
        return [format_provider_id("kvm", host.name, name) for host in hosts]

    def plan_create(self, request: InstanceRequest, check_mode: bool) -> Tuple[KvmHost, Optional[Any], Optional[int]]:
        """Validate the request against the config; return the target host, any existing domain,
        and the stamp of the name's claim this run now holds (``name_claims``; None when the
        domain exists, in check mode, and with a location when the name's home host does not answer).

        Without a location, the run's one listing of every host says whether the name exists
        (``_known``); with one, that host is asked. A name not found is claimed before anything
        is made (docs/kvm-provider.md, "Creating without a duplicate")."""
        choose_key("machine_type", request.machine_type, self.settings.default_machine_type,
                   self.settings.machine_types, "a machine type")
        choose_key("image", request.image, self.settings.default_image, self.settings.images, "an image")
        host, domain = self._existing(request) if request.location else self._known(request.name)
        if domain is not None or check_mode:
            return (host or self._place(request)), domain, None
        try:
            home = self._home(request.name)
        except ProxyError as error:
            if not request.location:
                raise
            # With a location only that host had to answer, and still does: the name goes unclaimed.
            self.warn("the name %s is not claimed: its home host does not answer (%s)" % (request.name, error))
            return self._host(request.location), None, None
        host, domain, stamp = self._claim(request, home)
        try:
            return (host or self._place(request)), domain, stamp
        except BaseException:
            if stamp is not None:
                self._release(request.name, stamp)
            raise

    def _home(self, name: str) -> name_claims.HomePool:
        """The claims' pool of ``name``'s home host, looked up once per run."""
        home = home_host(self.settings.hosts, name)
        with self._placement_lock:
            found = self._home_pools.get(home.name)
        if found is None:
            found = name_claims.HomePool(self.connections.open(home), home)
            with self._placement_lock:
                found = self._home_pools.setdefault(home.name, found)
        return found

    def _claim(self, request: InstanceRequest,
               home: name_claims.HomePool) -> Tuple[Optional[KvmHost], Optional[Any], Optional[int]]:
        """Take the name's claim: (None, None, stamp). When another claim holds it, every candidate
        host is asked, as every create once was: the domain when one has it, (host, domain, None);
        else the claim is another run's creating it now (Transient: the retry finds its domain),
        or a leftover, taken over: at once when this controller took it (its run is over), after
        ``CLAIM_PATIENCE_SECONDS`` when another did."""
        stamp = self.claims.stamp_for(request.name)
        if not home.take(request.name, stamp):
            host, domain = self._existing(request)
            if domain is not None:
                return host, domain, None
            held = home.stamp(request.name)
            theirs = held if held is not None and not self.claims.is_mine(request.name, held) else None
            if theirs is not None and self.claims.waited(request.name, theirs) < CLAIM_PATIENCE_SECONDS:
                raise Transient("the name %s is claimed on host %s by another run and no host holds its domain yet: "
                                "that run is creating it (a claim nobody completes is taken over after %d s); "
                                "will retry" % (request.name, home.home.name, CLAIM_PATIENCE_SECONDS))
            # A leftover (this controller's, from a run that is over; another's, past its patience), or
            # released meanwhile: replaced by a new stamp, which the old run's _still_claimed cannot match.
            home.release(request.name, held)
            stamp = self.claims.stamp_for(request.name, avoid=held)
            if not home.take(request.name, stamp):
                raise Transient("the name %s was claimed on host %s by another run at the same time; will retry" % (
                    request.name, home.home.name))
        return None, None, stamp

    def _release(self, name: str, stamp: Optional[int] = None) -> None:
        """Release ``name``'s claim (given ``stamp``: only while it is still that one). One that
        cannot be released sends a later create of the name to ask every host and wait its
        patience out, so this warns rather than failing a delete that succeeded."""
        self.claims.forget(name)
        try:
            self._home(name).release(name, stamp)
        except ProxyError as error:
            self.warn("the claim of the name %s stays on host %s (%s); a later create of that name asks every "
                      "host" % (name, home_host(self.settings.hosts, name).name, error))

    def _still_claimed(self, name: str, stamp: int) -> None:
        """Right before the domain is defined: the claim still carries this run's stamp, else
        another run took it over (this one was taken for dead) and this one stops."""
        if self._home(name).stamp(name) != stamp:
            raise Transient("the claim of the name %s was taken over by another run while this one was creating "
                            "it; nothing of it is left, the retry finds the other's domain" % name)

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]:
        host, domain, stamp = self.plan_create(request, check_mode)
        if domain is not None:
            changed = False
            if not check_mode and not is_active(domain, "asking whether domain %s on host %s runs" % (
                    request.name, host.name)):
                start_domain(domain, "starting domain %s on host %s" % (request.name, host.name))
                changed = True
            return changed, self._describe(host, domain)
        if check_mode:
            self._check_networking(host)
            return True, Instance(provider_id=format_provider_id("kvm", host.name, request.name),
                                  name=request.name, location=host.name, state="pending", tags=dict(request.tags))
        try:
            self._check_networking(host)
            domain = self._build(host, request, stamp)
        except BaseException:
            if stamp is not None:
                self._release(request.name, stamp)  # nothing was made: a retry takes the claim afresh
            raise
        return True, self._describe_started(host, domain)

    def _describe_started(self, host: KvmHost, domain: Any) -> Instance:
        """A domain this run just defined and started: running (no state read), its XML read once
        for its MACs and kept in the domain cache (the next listing reads it from there)."""
        info = self._info(host, domain)
        self.domain_cache.for_uri(host.uri).put(domain.UUIDString(), info)
        return self._instance(host, info, "running", domain_ip(domain, info.macs))

    def _check_networking(self, host: KvmHost) -> None:
        """Before anything is made on ``host``: its networking fields are sound and its network
        does what they say (Permanent, naming the field; nothing that runs is touched). Checked
        once per run and host; a failed check is asked again by the next create."""
        self._memo.get(("networking checked", host.name), lambda: self._check_network(host))

    def _check_network(self, host: KvmHost) -> bool:
        if host.state != HOST_ACTIVE:
            # Only a Proxy pinned here by its location gets this far (placement skips such hosts).
            raise Permanent("location: host %s is %s (%s) and takes no new proxies; set that field to %s "
                            "or give the Proxy another location" % (
                                host.name, host.state, host.at("state"), HOST_ACTIVE))
        if host.networking_errors:
            raise Permanent("host %s takes no new proxies until its networking is fixed: %s" % (
                host.name, "; ".join(host.networking_errors)))
        network = lookup_network(self.connections.open(host), host)
        if network is None:
            raise Permanent("%s: the libvirt network %r does not exist on host %s; define it (the kvm_hypervisor "
                            "role does) or name another" % (host.at("network"), host.network, host.name))
        check_mode(host, network_facts(network, host))
        return True

    def _define(self, connection: Any, host: KvmHost, request: InstanceRequest, spec: DomainSpec) -> Any:
        """Define the domain of ``spec``; on a host that fixes guest addresses, with an address
        reserved on its network and a published port and source address of its own."""
        if not host.networking.fixes_guest_addresses:
            return self._define_xml(connection, host, spec)
        network = lookup_network(connection, host)
        if network is None:
            raise Permanent("%s: the libvirt network %r does not exist on host %s" % (
                host.at("network"), host.network, host.name))
        reservation = reserve_address(network, host, request.name)
        with self._placement_lock:
            lock = self._claim_locks.setdefault(host.uri, threading.Lock())
        with lock:
            domain, _guest = claim(
                host, reservation, request.name, lambda: [info for _d, info, _s in self._recorded(host)],
                lambda guest: self._define_xml(connection, host, dataclasses.replace(spec, guest_network=guest)))
        return domain

    @staticmethod
    def _define_xml(connection: Any, host: KvmHost, spec: DomainSpec) -> Any:
        return define_domain(connection, build_domain_xml(spec), "defining domain %s on host %s" % (
            spec.name, host.name))

    def _build(self, host: KvmHost, request: InstanceRequest, stamp: Optional[int]) -> Any:
        """Make and start the domain (its volumes, its definition); on failure nothing of it stays."""
        machine = self.settings.machine_types[request.machine_type or self.settings.default_machine_type]
        image = self.settings.images[request.image or self.settings.default_image]
        connection = self.connections.open(host)
        pool = self._memo.get(("pool", host.name), lambda: self._pool(connection, host))
        base = self._memo.get(("base", host.name, image.key), lambda: self._base(connection, pool, host, image))

        # The access policy rides in vendor-data: the user's document stays byte for byte. It
        # refuses the hypervisor's addresses too (issue 38).
        # The root's probeSources join the crawlers' sources (squid's and the hook's), as on every provider.
        access = admitting_probes(request.access, self.probe_sources)
        # The host's addresses (a network XML read) once per host and run, like its pool and base.
        refused = self._memo.get(("host addresses", host.name), lambda: host_addresses(connection, host))
        policy = boothook(access, refused) if access is not None else None
        vendor_data = build_vendor_data(self.settings.vendor_data, self.settings.install_guest_agent, policy)
        seed = build_seed_iso(request.user_data, build_meta_data(new_instance_id(request.name), request.name),
                              vendor_data)
        created_volumes: List[Any] = []
        # Before a volume in the way is taken for stale (``_fresh``): a run taken for dead must not
        # replace the volumes of the run that took its claim over.
        still_mine = (lambda: self._still_claimed(request.name, stamp)) if stamp is not None else (lambda: None)
        try:
            overlay = self._create_overlay(pool, request.name, machine.disk_gib * GIB, base, image.format, still_mine)
            created_volumes.append(overlay)
            seed_volume = self._fresh(pool, seed_volume_name(request.name), lambda: create_volume_with_content(
                connection, pool, seed_volume_name(request.name), "raw", io.BytesIO(seed), len(seed)), still_mine)
            created_volumes.append(seed_volume)
            created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if stamp is not None:
                self._still_claimed(request.name, stamp)
            domain = self._define(connection, host, request, DomainSpec(
                name=request.name, domain_type=host.domain_type, vcpus=machine.vcpus, memory_mib=machine.memory_mib,
                machine=machine.machine, overlay_path=overlay.path(), seed_path=seed_volume.path(),
                network=host.network, tags=dict(request.tags), created=created, port=request.port,
                clients=access.allowed_sources if access is not None else ()))
            try:
                start_domain(domain, "starting domain %s on host %s" % (request.name, host.name))
            except ProxyError:
                with contextlib.suppress(ProxyError):
                    undefine_domain(domain, "undefining domain %s on host %s" % (request.name, host.name))
                raise
        except BaseException:
            self._undo(connection, host, request.name, created_volumes)
            raise
        self.log("created domain %s on KVM host %s" % (request.name, host.name))
        return domain

    @staticmethod
    def _undo(connection: Any, host: KvmHost, name: str, volumes: List[Any]) -> None:
        """After a failed create nothing half-made stays behind, so a retry starts from a clean
        slate: the volumes it made and the address reserved under its name. Unless a domain of
        that name is still defined (one this run could not undefine, or another run's that took
        the name over): that domain keeps its volumes and its reservation (removing them would
        leave its guest without a disk, or without the DHCP entry that gives it the address its
        published port forwards to), and the retry finds it. A host that cannot be asked cannot
        be cleaned either: the retry finds what is there (stale volumes, a reservation it reuses)."""
        try:
            if find_domain(connection, name) is not None:
                return
        except ProxyError:
            return
        for volume in volumes:
            with contextlib.suppress(ProxyError):
                delete_volume(volume, "deleting half-made volume %s on host %s" % (volume.name(), host.name))
        with contextlib.suppress(ProxyError):
            release_address(connection, host, name, host.network)

    def _base(self, connection: Any, pool: Any, host: KvmHost, image: Any) -> _Base:
        volume = ensure_base_volume(connection, pool, host.name, image, self.cache_dir, self._progress)
        context = "reading base volume %s on host %s" % (image.volume_name, host.name)
        return _Base(volume, volume_capacity(volume, context), volume_path(volume, context))

    @staticmethod
    def _fresh(pool: Any, volume_name: str, make: Callable[[], Any], still_mine: Callable[[], None]) -> Any:
        """``make()`` the volume ``volume_name``; when that fails because a volume of that name is
        there, that one is stale and replaced: left by a run killed (or cut off from the host)
        mid-create, when even its clean-up could not reach libvirt. Only ever called before the
        domain is defined, and ``still_mine()`` (raising when another run took the name's claim
        over) is asked before the replacement, so nothing uses it. Asked only on failure: a create
        that finds nothing in its way (nearly all) makes no lookup."""
        try:
            return make()
        except ProxyError:
            stale = lookup_volume(pool, volume_name)
            if stale is None:
                raise
        still_mine()
        with contextlib.suppress(ProxyError):
            delete_volume(stale, "deleting stale volume %s" % volume_name)
        return make()

    def _create_overlay(self, pool: Any, name: str, capacity: int, base: _Base, base_format: str,
                        still_mine: Callable[[], None]) -> Any:
        volume_name = overlay_volume_name(name)
        xml = volume_xml(volume_name, max(capacity, base.capacity), "qcow2", base.path, base_format)
        return self._fresh(pool, volume_name, lambda: create_volume(pool, xml, "creating overlay %s" % volume_name),
                           still_mine)

    # -- delete ----------------------------------------------------------------------------

    def delete(self, provider_id: str, check_mode: bool) -> bool:
        """Remove the domain and its volumes. Returns whether anything was (or would be) removed."""
        parsed = parse_provider_id(provider_id, "kvm")
        host = self.settings.host(parsed.location)
        if host is None:
            # Nothing this controller can clean: succeeding releases the Proxy instead of
            # pinning its finalizer forever. The VM, if any, must be removed by hand.
            self.warn("KVM host %r is not configured: nothing to clean for %s, treated as deleted; "
                      "remove any VM there by hand" % (parsed.location, provider_id))
            return False
        connection = self.connections.open(host)
        changed = False
        domain = find_domain(connection, parsed.name)
        network = host.network
        if domain is not None:
            changed = True
            network = self._info(host, domain).network or host.network
            if not check_mode:
                self._remove_domain(domain, parsed.name, host)
        # Its reserved address goes with it (its port and source address went with its metadata).
        if not check_mode and release_address(connection, host, parsed.name, network):
            changed = True
        changed = self._remove_volumes(connection, host, parsed.name, check_mode) or changed
        if not check_mode:
            self._release(parsed.name)  # last: the name stays claimed while anything of it is left
        return changed

    @staticmethod
    def _remove_domain(domain: Any, name: str, host: KvmHost) -> None:
        remove_domain(domain, "removing domain %s on host %s" % (name, host.name))  # gone meanwhile: fine

    def _remove_volumes(self, connection: Any, host: KvmHost, name: str, check_mode: bool) -> bool:
        storage_pool = find_pool(connection, host.pool, "pool %r on host %s" % (host.pool, host.name))
        if storage_pool is None:
            # Refusing would pin the Proxy's finalizer; with no pool there is nothing to remove.
            return False
        changed = False
        for volume_name in (overlay_volume_name(name), seed_volume_name(name)):
            volume = lookup_volume(storage_pool, volume_name)
            if volume is None:
                continue
            changed = True
            if not check_mode:
                delete_volume(volume, "deleting volume %s on host %s" % (volume_name, host.name))
        return changed
