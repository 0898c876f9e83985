"""The kvm_hypervisor role (``playbooks/bootstrap_hypervisor.yml``) on a real hypervisor host.

The molecule scenario ``extensions/molecule/kvm_hypervisor`` is the role's own test: it starts a
:class:`HypervisorHost` (libvirtd + sshd in a network namespace), converges over SSH, converges
again expecting no change, and verifies over ``qemu+libssh2`` with the key the role authorized and
the known_hosts file the role wrote. It runs here as ``molecule test``, exactly as from a shell.

The other tests run the playbook directly (:func:`support.hosts.hypervisor_host.bootstrap`, through
ansible-runner) against one host whose pools, networks and domains each test sets up and removes:
check mode changes nothing; the network Debian's packages define (NAT, DNS on: the role's
defaults) is kept as it is; a pool or network that exists with another definition makes the role
fail with a message naming the variable and the fix, and stays as it was; with
``kvm_hypervisor_allow_redefine`` the role replaces a definition only while nothing uses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest

from support import REPO
from support.collection.modules import collections_path
from support.hosts.hypervisor_host import GUEST_NETWORK_PREFIX, HypervisorHost, bootstrap

SCENARIO = "kvm_hypervisor"
# Installed with libvirt-daemon-system (libvirt-daemon-config-network).
DEBIAN_DEFAULT_NETWORK = Path("/usr/share/libvirt/networks/default.xml")
# The bootstrap inventory's network variables, which replace the role's defaults.
NETWORK_VARIABLES = (
    "kvm_hypervisor_network_forward_mode", "kvm_hypervisor_network_bridge", "kvm_hypervisor_network_address",
    "kvm_hypervisor_network_netmask", "kvm_hypervisor_network_dhcp_start", "kvm_hypervisor_network_dhcp_end",
    "kvm_hypervisor_network_dns",
)
MOLECULE_TIMEOUT = 280

# What the role must never touch on the machine running the tests.
REAL_ROOT_SSH = Path("/root/.ssh")


def _directory_snapshot(directory: Path) -> dict[str, bytes] | None:
    if not directory.is_dir():
        return None
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --- the molecule scenario ---------------------------------------------------------------------


@pytest.mark.timeout(MOLECULE_TIMEOUT + 20)
def test_molecule_scenario_converges_is_idempotent_and_verifies(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the molecule scenario needs root (network and mount namespaces)", pytrace=False)
    state = tmp_path / "hypervisor-host.json"
    bin_dir = Path(sys.executable).parent
    # ansible-playbook runs in the scenario's directory: every path it is given must be absolute.
    collections = os.pathsep.join(str(Path(path).resolve()) for path in collections_path().split(os.pathsep))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": collections,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule"),
        "HYPERVISOR_HOST_STATE": str(state),
        "ANSIBLE_NOCOLOR": "1",
        "NO_COLOR": "1",
    }
    real_ssh_before = _directory_snapshot(REAL_ROOT_SSH)
    try:
        result = subprocess.run(
            [str(bin_dir / "molecule"), "test", "--scenario-name", SCENARIO],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=MOLECULE_TIMEOUT, check=False,
        )
    finally:
        # Molecule destroys the host after a failed step too; this covers molecule itself dying.
        leftover = HypervisorHost.attach(state) if state.exists() else None
        if leftover is not None:
            leftover.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, _tail(output, 120)
    for step in ("create", "converge", "idempotence", "verify", "destroy"):
        assert f"{SCENARIO} > {step}: Executed: Successful" in output
    recorded = json.loads(state.read_text())
    assert recorded["stopped"], "molecule's destroy step did not stop the host"
    assert leftover is None
    assert not Path("/run/netns", recorded["namespace"]).exists()
    assert not Path(recorded["root"]).exists()
    assert _directory_snapshot(REAL_ROOT_SSH) == real_ssh_before


# --- existing definitions: compare, refuse, redefine only what nothing uses ----------------------


@pytest.fixture(scope="module")
def host() -> Iterator[HypervisorHost]:
    """A hypervisor host without pool or network; each test leaves it that way."""
    if os.geteuid() != 0:
        pytest.fail("the bootstrap tests need root (network and mount namespaces)", pytrace=False)
    with HypervisorHost() as hypervisor:
        yield hypervisor


@pytest.fixture
def conn(host: HypervisorHost) -> Iterator[libvirt.virConnect]:
    """The host's libvirt connection; afterwards every domain, volume, pool and network is gone."""
    yield host.connection
    connection = host.connection
    for domain in connection.listAllDomains():
        if domain.isActive():
            domain.destroy()
        domain.undefine()
    for pool in connection.listAllStoragePools():
        if pool.isActive():
            for volume in pool.listAllVolumes():
                volume.delete()
            pool.destroy()
        pool.undefine()
    for network in connection.listAllNetworks():
        if network.isActive():
            network.destroy()
        network.undefine()


def _other_network(host: HypervisorHost) -> str:
    """A network ``default`` unlike the one the bootstrap inventory asks for: bridge and range."""
    prefix = f"{GUEST_NETWORK_PREFIX}.{host.slot}"
    return (
        "<network><name>default</name><bridge name='virbr7'/><dns enable='no'/>"
        f"<ip address='{host.guest_network_address}' netmask='255.255.255.0'>"
        f"<dhcp><range start='{prefix}.100' end='{prefix}.199'/></dhcp></ip></network>"
    )


def _other_pool(host: HypervisorHost) -> str:
    """A pool ``default`` in another directory than the bootstrap inventory's."""
    return f"<pool type='dir'><name>default</name><target><path>{host.root / 'other-pool'}</path></target></pool>"


def _pool_path(pool: libvirt.virStoragePool) -> str:
    xml = str(pool.XMLDesc(0))
    return xml.split("<path>", 1)[1].split("</path>", 1)[0]


def test_check_mode_reports_changes_and_makes_none(host: HypervisorHost, conn: libvirt.virConnect) -> None:
    run = bootstrap(host, check_mode=True)

    assert "changed=0" not in run.stdout
    assert conn.listAllStoragePools() == []
    assert conn.listAllNetworks() == []
    assert not run.known_hosts_file.exists()


def test_the_network_a_fresh_debian_host_has_is_kept_as_it_is(host: HypervisorHost, conn: libvirt.virConnect) -> None:
    # What libvirt-daemon-config-network defines on Debian: NAT, DNS on, the role's defaults.
    network = conn.networkDefineXML(DEBIAN_DEFAULT_NETWORK.read_text())
    uuid = network.UUIDString()
    role_defaults: dict[str, Any] = dict.fromkeys(NETWORK_VARIABLES)

    bootstrap(host, **role_defaults)

    network = conn.networkLookupByName("default")
    assert network.UUIDString() == uuid
    assert network.isActive()
    assert network.autostart()
    assert "<forward mode='nat'>" in network.XMLDesc()


def test_a_network_defined_differently_fails_the_role_and_is_left_alone(
    host: HypervisorHost, conn: libvirt.virConnect
) -> None:
    network = conn.networkDefineXML(_other_network(host))
    before = network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)

    run = bootstrap(host, check=False)

    assert not run.ok
    assert (
        "The libvirt network 'default' on hypervisor already exists with another definition: "
        "bridge is 'virbr7' where kvm_hypervisor_network_bridge wants 'virbr0'"
    ) in run.stdout
    prefix = f"{GUEST_NETWORK_PREFIX}.{host.slot}"
    assert (
        f"DHCP range is '{prefix}.100-{prefix}.199' where kvm_hypervisor_network_dhcp_start/"
        f"kvm_hypervisor_network_dhcp_end wants '{prefix}.10-{prefix}.250'"
    ) in run.stdout
    assert "set kvm_hypervisor_allow_redefine to true" in run.stdout
    assert conn.networkLookupByName("default").XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE) == before
    # Nothing changes before both definitions are compared: not even the missing pool is added.
    assert conn.listAllStoragePools() == []


def test_a_pool_defined_differently_fails_the_role_and_is_left_alone(
    host: HypervisorHost, conn: libvirt.virConnect
) -> None:
    pool = conn.storagePoolDefineXML(_other_pool(host))
    uuid = pool.UUIDString()

    run = bootstrap(host, check=False)

    assert not run.ok
    assert (
        "The libvirt storage pool 'default' on hypervisor already exists with another definition: "
        f"path is '{host.root / 'other-pool'}' where kvm_hypervisor_pool_path wants '{host.pool_path}'"
    ) in run.stdout
    pool = conn.storagePoolLookupByName("default")
    assert (pool.UUIDString(), _pool_path(pool)) == (uuid, str(host.root / "other-pool"))
    assert conn.listAllNetworks() == []


def test_allow_redefine_replaces_definitions_nothing_uses(host: HypervisorHost, conn: libvirt.virConnect) -> None:
    (host.root / "other-pool").mkdir(exist_ok=True)
    old_pool = conn.storagePoolDefineXML(_other_pool(host))
    old_pool.create()
    old_network = conn.networkDefineXML(_other_network(host))
    old_network.create()  # active, with its bridge, but nothing attached

    bootstrap(host, kvm_hypervisor_allow_redefine=True)

    pool = conn.storagePoolLookupByName("default")
    assert pool.UUIDString() != old_pool.UUIDString()
    assert _pool_path(pool) == str(host.pool_path)
    assert pool.isActive()
    assert pool.autostart()
    network = conn.networkLookupByName("default")
    assert network.bridgeName() == "virbr0"
    assert network.isActive()
    assert network.autostart()
    assert f"<range start='{GUEST_NETWORK_PREFIX}.{host.slot}.10'" in network.XMLDesc()
    assert (host.root / "other-pool").is_dir()  # removing a pool's definition keeps its directory


def test_allow_redefine_refuses_a_pool_with_volumes_and_a_network_with_a_vm(
    host: HypervisorHost, conn: libvirt.virConnect
) -> None:
    (host.root / "other-pool").mkdir(exist_ok=True)
    pool = conn.storagePoolDefineXML(_other_pool(host))
    pool.create()
    pool.createXML("<volume><name>disk.qcow2</name><capacity unit='MiB'>1</capacity>"
                   "<target><format type='qcow2'/></target></volume>")
    network = conn.networkDefineXML(_other_network(host))
    network.create()
    network_before = network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    domain = conn.defineXML(
        "<domain type='qemu'><name>user-of-the-network</name><memory unit='MiB'>64</memory>"
        "<os><type arch='x86_64'>hvm</type></os><devices><interface type='network'>"
        "<source network='default'/><model type='virtio'/></interface></devices></domain>"
    )
    domain.create()

    run = bootstrap(host, check=False, kvm_hypervisor_allow_redefine=True)

    assert not run.ok
    assert "kvm_hypervisor_allow_redefine is true, but the storage pool 'default' holds 1 volume(s)" in run.stdout
    assert "the network 'default' has interfaces attached (vnet0)" in run.stdout
    assert [volume.name() for volume in conn.storagePoolLookupByName("default").listAllVolumes()] == ["disk.qcow2"]
    network = conn.networkLookupByName("default")
    assert network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE) == network_before
    assert network.isActive()
    assert domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING


# --- network modes (docs/kvm-provider.md, "Networking"); nat with publishing: the molecule scenario ---


def test_a_route_network_is_defined_for_a_routed_prefix_and_kept(host: HypervisorHost,
                                                                 conn: libvirt.virConnect) -> None:
    bootstrap(host, kvm_hypervisor_network_forward_mode="route")
    xml = conn.networkLookupByName("default").XMLDesc()
    assert "<forward mode='route'/>" in xml and f"<ip address='{host.guest_network_address}'" in xml
    again = bootstrap(host, kvm_hypervisor_network_forward_mode="route")
    assert "changed=0" in again.stdout, again.stdout[-2000:]


def test_a_bridge_network_names_an_existing_host_bridge_only(host: HypervisorHost, conn: libvirt.virConnect) -> None:
    missing = bootstrap(host, check=False, kvm_hypervisor_network_forward_mode="bridge",
                        kvm_hypervisor_network_bridge="br-lan")
    assert not missing.ok
    assert "kvm_hypervisor_network_bridge: 'br-lan' is not a bridge on hypervisor" in missing.stdout
    assert conn.listAllNetworks() == []

    subprocess.run(["ip", "-n", host.namespace, "link", "add", "br-lan", "type", "bridge"], check=True)
    try:
        bootstrap(host, kvm_hypervisor_network_forward_mode="bridge", kvm_hypervisor_network_bridge="br-lan")
        xml = conn.networkLookupByName("default").XMLDesc()
        assert "<forward mode='bridge'/>" in xml and "<bridge name='br-lan'/>" in xml and "<ip" not in xml
    finally:
        subprocess.run(["ip", "-n", host.namespace, "link", "del", "br-lan"], check=False)


@pytest.mark.parametrize(("role_vars", "problem"), [
    ({"kvm_hypervisor_network_forward_mode": "route", "kvm_hypervisor_public_address": "10.213.0.1",
      "kvm_hypervisor_publish_ports": "40000-40009"},
     ("kvm_hypervisor_publish_ports and kvm_hypervisor_source_addresses: only with "
      "kvm_hypervisor_network_forward_mode nat (it is route")),
    ({"kvm_hypervisor_network_forward_mode": "nat", "kvm_hypervisor_public_address": "host.example",
      "kvm_hypervisor_publish_ports": "40000-40009"},
     "kvm_hypervisor_public_address: 'host.example' is not an IPv4 address"),
    ({"kvm_hypervisor_network_forward_mode": "nat", "kvm_hypervisor_public_address": "10.213.0.1",
      "kvm_hypervisor_publish_ports": "40009-40000"},
     "kvm_hypervisor_publish_ports: '40009-40000' is not a port range"),
    # Issue 38 row 6: a range below 1024 would publish a guest on the host's sshd port.
    ({"kvm_hypervisor_network_forward_mode": "nat", "kvm_hypervisor_public_address": "10.213.0.1",
      "kvm_hypervisor_publish_ports": "20-30"},
     "kvm_hypervisor_publish_ports: '20-30' is not a port range first-last within 1024-65535"),
])
def test_networking_variables_that_do_not_fit_change_nothing(host: HypervisorHost, conn: libvirt.virConnect,
                                                             role_vars: dict[str, Any], problem: str) -> None:
    run = bootstrap(host, check=False, **role_vars)
    assert not run.ok and problem in run.stdout, run.stdout[-3000:]
    assert conn.listAllNetworks() == [] and conn.listAllStoragePools() == []


def test_a_publish_range_covering_a_port_the_host_listens_on_changes_nothing(host: HypervisorHost,
                                                                             conn: libvirt.virConnect) -> None:
    # Issue 38 row 6: a proxy published on a port the host serves would take that service's
    # connections. A service of the host's on every address inside the range refuses the range;
    # one on loopback only never sees a connection to the public address, and is no obstacle.
    role_vars = host.publishing_role_vars()
    first = int(role_vars["kvm_hypervisor_publish_ports"].split("-")[0])
    listener = ("import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); "
                "s.listen(); print('listening', flush=True); time.sleep(600)")
    serve = ["ip", "netns", "exec", host.namespace, sys.executable, "-c", listener]
    servers = [subprocess.Popen([*serve, address, str(port)], stdout=subprocess.PIPE, text=True)
               for address, port in (("0.0.0.0", first + 5), ("127.0.0.1", first + 6))]
    try:
        for server in servers:
            assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        run = bootstrap(host, check=False, **role_vars)
        assert not run.ok
        assert (f"kvm_hypervisor_publish_ports: '{role_vars['kvm_hypervisor_publish_ports']}' covers "
                f"0.0.0.0:{first + 5}, where hypervisor itself listens") in run.stdout, run.stdout[-3000:]
        assert f":{first + 6}" not in run.stdout.split("covers", 1)[1].split("where", 1)[0]
        assert conn.listAllNetworks() == [] and conn.listAllStoragePools() == []
    finally:
        for server in servers:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()


# --- one source of truth: the role takes the host's publishing from the provider config ---------

# The inventory's networking variables, dropped: with kvm_hypervisor_provider_config the host
# entry is their one source (the test inventory's isolated network would be a second opinion).
FROM_THE_CONFIG: dict[str, Any] = {"kvm_hypervisor_network_forward_mode": None}


def _provider_config(tmp_path: Path, host: HypervisorHost, **networking: Any) -> Path:
    """A provider config whose one KVM provider lists this host as ``hypervisor`` (its inventory name)."""
    config = tmp_path / "providers.yaml"
    config.write_text(json.dumps({"owner": "prod-cluster-1", "providers": [{
        "name": "home-kvm", "type": "kvm", "allowedSources": ["198.51.100.0/24"],
        "kvm": {"ssh": {"keyFile": "/etc/egress-proxies/kvm-ssh/id_ed25519",
                        "knownHostsFile": "/etc/egress-proxies/kvm-ssh/known_hosts"},
                "hosts": [{"name": "hypervisor", "uri": f"qemu+libssh2://root@{host.address}/system",
                           "networkMode": "nat", **networking}],
                "images": {"debian-12": {"url": "https://images.example.invalid/d.qcow2", "sha256": "a" * 64}},
                "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 10}}}}]}))
    return config


def test_the_provider_config_is_the_one_source_of_the_hosts_publishing(host: HypervisorHost,
                                                                       conn: libvirt.virConnect,
                                                                       tmp_path: Path) -> None:
    """Issue 40 row 6: the role reads the host's entry, a role variable saying otherwise is refused
    naming both, and a row-6 mistake in the file is refused by the collection's validator; in both
    refusals nothing on the host changes."""
    publishing = host.publishing_role_vars()
    entry = {"publicAddress": publishing["kvm_hypervisor_public_address"],
             "publishPorts": publishing["kvm_hypervisor_publish_ports"],
             "sourceAddresses": publishing["kvm_hypervisor_source_addresses"]}
    config = _provider_config(tmp_path, host, **entry)

    disagreeing = bootstrap(host, check=False, kvm_hypervisor_provider_config=str(config),
                            kvm_hypervisor_publish_ports="41000-41009", **FROM_THE_CONFIG)
    assert not disagreeing.ok
    assert ('kvm_hypervisor_publish_ports is "41000-41009" but the provider config\'s '
            f'providers[0].kvm.hosts[0].publishPorts says "{entry["publishPorts"]}"') in disagreeing.stdout, \
        _tail(disagreeing.stdout)
    assert conn.listAllNetworks() == [] and conn.listAllStoragePools() == []

    reversed_range = _provider_config(tmp_path, host, **{**entry, "publishPorts": "40009-40000"})
    invalid = bootstrap(host, check=False, kvm_hypervisor_provider_config=str(reversed_range), **FROM_THE_CONFIG)
    assert not invalid.ok
    assert "providers[0].kvm.hosts[0].publishPorts: '40009-40000' is not a port range" in invalid.stdout, \
        _tail(invalid.stdout)
    assert conn.listAllNetworks() == [] and conn.listAllStoragePools() == []

    config = _provider_config(tmp_path, host, **entry)
    bootstrap(host, kvm_hypervisor_provider_config=str(config), **FROM_THE_CONFIG)
    hook = json.loads(host.run_in_namespace(["cat", "/etc/libvirt/hooks/egress-proxies/default.json"]).stdout)
    first, last = (int(port) for port in entry["publishPorts"].split("-"))
    assert (hook["public_address"], hook["publish_ports"], hook["source_addresses"]) == (
        entry["publicAddress"], [first, last], entry["sourceAddresses"])
    assert "<forward mode='nat'" in conn.networkLookupByName("default").XMLDesc(0)


@pytest.mark.usefixtures("conn")
def test_a_key_rotation_authorizes_the_new_key_and_removes_the_retired_one(host: HypervisorHost,
                                                                            tmp_path: Path) -> None:
    """Issue 40 day 2: the role's second rotation step removes the old controller key."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rotated", "-f", str(tmp_path / "new")],
                   check=True)
    new = (tmp_path / "new.pub").read_text().strip()
    old = host.controller_key_file.with_suffix(".pub").read_text().strip()
    try:
        bootstrap(host)  # the old key, as the first bootstrap authorized it
        assert old in host.run_in_namespace(["cat", "/root/.ssh/authorized_keys"]).stdout
        bootstrap(host, kvm_hypervisor_controller_public_key=new, kvm_hypervisor_retired_public_keys=[old])
        keys = host.run_in_namespace(["cat", "/root/.ssh/authorized_keys"]).stdout
        assert new in keys and old not in keys, keys
    finally:  # as a first bootstrap leaves it, for the tests after this one
        host.run_in_namespace(["sh", "-c", 'printf "%s\\n" "$1" > /root/.ssh/authorized_keys', "restore", old])
