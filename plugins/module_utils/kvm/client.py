# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libvirt edge: the only importer of libvirt-python in the collection, and ``classify``,
the one place its errors become our error classes.

One thin function per libvirt call the provider makes, each re-raising a ``libvirtError`` as
``NotFound`` / ``Permanent`` / ``Transient`` with what it was doing in the message. Nothing above
this file sees a libvirt exception or a libvirt constant: connections, domains, pools, volumes
and networks travel as opaque handles, handed back to the functions here. Where the absence of
a thing is an answer rather than a failure (a domain, volume or network that does not exist),
the lookup returns None instead of raising.

Calls that make no round trip (a handle's ``name()`` or ``UUIDString()``) are made on the handles
directly; a volume's ``path()`` is a round trip (``virStorageVolGetPath``), so ``volume_path``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

try:
    import libvirt
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    HAS_LIBVIRT = False

    class _NotInstalled(Exception):
        """Stands in for libvirtError, which nothing can raise without libvirt."""

    libvirt = None
    LibvirtError: Any = _NotInstalled
else:
    HAS_LIBVIRT = True
    LibvirtError = libvirt.libvirtError

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)

CHUNK = 1024 * 1024
# Where a running domain's addresses come from (``interface_addresses``), by their names here.
ADDRESS_SOURCES = ("agent", "lease", "arp")


def classify(error: Any, context: str) -> ProxyError:
    """Map a libvirtError to our error classes. Unknown codes are transient."""
    code = error.get_error_code()
    message = "%s: %s" % (context, error.get_error_message() or error)
    if _is_host_key_failure(message):
        return Permanent(message + " (the host's key does not match kvm.ssh.knownHostsFile; "
                         "if the host was reinstalled, update known_hosts)")
    if code in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_NO_STORAGE_VOL):
        return NotFound(message)
    if code in (libvirt.VIR_ERR_NO_STORAGE_POOL, libvirt.VIR_ERR_NO_NETWORK):
        return Permanent(message + " (fix the host's pool/network in the provider config, or create it)")
    if code in (libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_ERR_AUTH_CANCELLED, libvirt.VIR_ERR_ACCESS_DENIED,
                libvirt.VIR_ERR_XML_ERROR, libvirt.VIR_ERR_XML_DETAIL, libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
                libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_NO_DOMAIN_METADATA):
        return Permanent(message)
    return Transient(message)


def _is_host_key_failure(message: str) -> bool:
    # libvirt reports host-key rejections under the generic SSH error codes; only the
    # text tells them apart from a connection that merely dropped.
    lowered = message.lower()
    return "host key" in lowered or "hostkey" in lowered or "known_hosts" in lowered


@contextlib.contextmanager
def _mapped(context: str) -> Iterator[None]:
    """Every libvirtError raised in the block, as ``classify`` maps it."""
    try:
        yield
    except LibvirtError as error:
        raise classify(error, context) from error


def _absent_as_none(call: Callable[[], Any], missing_code: str, context: str) -> Optional[Any]:
    """``call()``, or None when libvirt answers that the thing does not exist (``missing_code``)."""
    try:
        return call()
    except LibvirtError as error:
        if error.get_error_code() == getattr(libvirt, missing_code):
            return None
        raise classify(error, context) from error


def silence_stderr() -> None:
    """libvirt prints every error to stderr by default; ours are raised and classified instead."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


# -- connections ------------------------------------------------------------------------------


def open_connection(uri: str, context: str) -> Any:
    # No keepalive: libvirt needs an event loop for it, and a module run is short-lived;
    # the controller's runner timeout bounds a peer that dies mid-call.
    with _mapped(context):
        return libvirt.open(uri)


def close_connection(connection: Any) -> None:
    """Close, ignoring a connection that is already broken: nothing is left to release."""
    with contextlib.suppress(LibvirtError):
        connection.close()


# A connection's driver never changes: asked once per connection, not once per volume uploaded.
_DRIVERS_LOCK = threading.Lock()
_TEST_DRIVER: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def is_test_driver(connection: Any) -> bool:
    """Whether ``connection`` is libvirt's test driver (no volume upload, no leases)."""
    with _DRIVERS_LOCK:
        known = _TEST_DRIVER.get(connection)
    if known is None:
        with _mapped("asking the connection's driver"):
            known = bool(connection.getType().lower() == "test")
        with _DRIVERS_LOCK:
            _TEST_DRIVER[connection] = known
    return known


# -- domains ----------------------------------------------------------------------------------


def _state_names() -> Dict[int, str]:
    return {
        libvirt.VIR_DOMAIN_NOSTATE: "pending",
        libvirt.VIR_DOMAIN_RUNNING: "running",
        libvirt.VIR_DOMAIN_BLOCKED: "running",
        libvirt.VIR_DOMAIN_PAUSED: "stopped",
        libvirt.VIR_DOMAIN_SHUTDOWN: "stopped",
        libvirt.VIR_DOMAIN_SHUTOFF: "stopped",
        libvirt.VIR_DOMAIN_CRASHED: "error",
        libvirt.VIR_DOMAIN_PMSUSPENDED: "stopped",
    }


def state_name(code: Optional[int]) -> str:
    """The contract's state for a libvirt domain state; one libvirt does not document is an error."""
    return _state_names().get(code, "error") if code is not None else "error"


def find_domain(connection: Any, name: str) -> Optional[Any]:
    """The domain called ``name``, or None when the hypervisor has none."""
    return _absent_as_none(lambda: connection.lookupByName(name), "VIR_ERR_NO_DOMAIN",
                           "looking up domain %s" % name)


def domain_states(connection: Any, context: str) -> List[Tuple[Any, str]]:
    """Every domain of the hypervisor with its state (``state_name``): one call for all of them."""
    with _mapped(context):
        listed = connection.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE, 0)
    return [(domain, state_name(stats.get("state.state"))) for domain, stats in listed]


def domain_state(domain: Any, context: str) -> str:
    with _mapped(context):
        return state_name(domain.state(0)[0])


def domain_xml(domain: Any, context: str) -> str:
    """The domain's XML; ``NotFound`` when it was undefined meanwhile."""
    with _mapped(context):
        return str(domain.XMLDesc(0))


def is_active(domain: Any, context: str) -> bool:
    with _mapped(context):
        return bool(domain.isActive())


def define_domain(connection: Any, xml: str, context: str) -> Any:
    with _mapped(context):
        return connection.defineXML(xml)


def start_domain(domain: Any, context: str) -> None:
    """Start the domain, marked autostart first: libvirtd starts it again after a host reboot
    (maintenance, a crash), so the proxy comes back without waiting for a sweep to replace it."""
    with _mapped(context):
        domain.setAutostart(1)
        domain.create()


def undefine_domain(domain: Any, context: str) -> None:
    """Undefine a domain that never ran; one undefined meanwhile is fine."""
    _absent_as_none(domain.undefine, "VIR_ERR_NO_DOMAIN", context)


def remove_domain(domain: Any, context: str) -> None:
    """Stop and undefine; one undefined meanwhile is fine."""
    def remove() -> None:
        if domain.isActive():
            domain.destroy()
        # Our domains boot BIOS (no NVRAM); managed saves and snapshot metadata would
        # otherwise make a plain undefine refuse.
        flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        domain.undefineFlags(flags)
    _absent_as_none(remove, "VIR_ERR_NO_DOMAIN", context)


def interface_addresses(domain: Any, source: str) -> Optional[Dict[str, Any]]:
    """The domain's interfaces and addresses from ``source`` (one of ``ADDRESS_SOURCES``), or None
    when that source cannot answer (agent not connected, no lease support on this network, ...)."""
    code = {
        "agent": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        "lease": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        "arp": libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
    }[source]
    try:
        return dict(domain.interfaceAddresses(code, 0) or {})
    except LibvirtError:
        return None


# -- pools and volumes ------------------------------------------------------------------------


def find_pool(connection: Any, name: str, context: str) -> Optional[Any]:
    """The storage pool ``name``, or None when the host has none."""
    return _absent_as_none(lambda: connection.storagePoolLookupByName(name), "VIR_ERR_NO_STORAGE_POOL", context)


def lookup_pool(connection: Any, name: str, context: str) -> Any:
    """The storage pool ``name``; ``Permanent`` when the host has none."""
    with _mapped(context):
        return connection.storagePoolLookupByName(name)


def find_volume(storage_pool: Any, name: str) -> Optional[Any]:
    """The volume, or None when the pool has no such volume."""
    return _absent_as_none(lambda: storage_pool.storageVolLookupByName(name), "VIR_ERR_NO_STORAGE_VOL",
                           "looking up volume %s" % name)


def create_volume(storage_pool: Any, xml: str, context: str) -> Any:
    with _mapped(context):
        return storage_pool.createXML(xml, 0)


def create_volume_once(storage_pool: Any, name: str, xml: str, context: str) -> bool:
    """Create the volume ``name`` (described by ``xml``); False when the pool holds one of that name
    already. libvirt refuses a second volume of one name in a pool under the pool's lock, so of
    runs creating the same name at once exactly one gets True. Drivers report the refusal under
    different codes (the test driver: operation failed), so the pool is asked instead."""
    try:
        storage_pool.createXML(xml, 0)
        return True
    except LibvirtError as error:
        if find_volume(storage_pool, name) is not None:
            return False
        raise classify(error, context) from error


def volume_capacity(volume: Any, context: str) -> int:
    with _mapped(context):
        return int(volume.info()[1])


def volume_path(volume: Any, context: str) -> str:
    with _mapped(context):
        return str(volume.path())


def delete_volume(volume: Any, context: str) -> None:
    """Delete ``volume``; one deleted meanwhile is fine."""
    _absent_as_none(lambda: volume.delete(0), "VIR_ERR_NO_STORAGE_VOL", context)


def upload_volume(connection: Any, volume: Any, source: Any, size: int,
                  sent: Optional[Callable[[int], None]] = None) -> None:
    """Stream ``size`` bytes from the file object ``source`` into ``volume``; ``sent`` is told
    each chunk's length once libvirt took it."""
    stream = connection.newStream(0)
    try:
        volume.upload(stream, 0, size, 0)
        for chunk in iter(lambda: source.read(CHUNK), b""):
            stream.send(chunk)
            if sent is not None:
                sent(len(chunk))
        stream.finish()
    except LibvirtError as error:
        with contextlib.suppress(LibvirtError):
            stream.abort()
        raise classify(error, "uploading into volume %s" % volume.name()) from error


# -- networks ---------------------------------------------------------------------------------


def find_network(connection: Any, name: str, context: str) -> Optional[Any]:
    """The libvirt network ``name``, or None when the host has none."""
    return _absent_as_none(lambda: connection.networkLookupByName(name), "VIR_ERR_NO_NETWORK", context)


def network_xml(network: Any, context: str) -> str:
    with _mapped(context):
        return str(network.XMLDesc(0))


def network_leases(network: Any) -> Optional[List[Dict[str, Any]]]:
    """The network's DHCP leases, or None when it cannot answer (not started, no DHCP, a driver
    without leases such as libvirt's test driver)."""
    try:
        return list(network.DHCPLeases() or [])
    except LibvirtError:
        return None


def named_network_leases(connection: Any, name: str) -> Optional[List[Dict[str, Any]]]:
    """``network_leases`` of the network ``name``; None too when it is not defined there."""
    try:
        network = connection.networkLookupByName(name)
    except LibvirtError:
        return None
    return network_leases(network)


def _update_flags(network: Any) -> int:
    live = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE if network.isActive() else 0
    return int(live | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG)


def add_dhcp_host(network: Any, xml: str, context: str) -> bool:
    """Add the DHCP ``<host>`` entry ``xml``; False when libvirt refuses it because an entry with
    its MAC, name or address exists (taken meanwhile by another run)."""
    try:
        network.update(libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST, libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                       -1, xml, _update_flags(network))
        return True
    except LibvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID:
            return False
        raise classify(error, context) from error


def delete_dhcp_host(network: Any, xml: str, context: str) -> None:
    with _mapped(context):
        network.update(libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE, libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                       -1, xml, _update_flags(network))
