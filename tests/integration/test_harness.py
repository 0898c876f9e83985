"""Proof that the libvirt test harness (tests/support/) does what the other tests rely on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import libvirt
import pytest

from support.hosts.hypervisor_host import HypervisorHost
from support.hosts.libvirt_daemon import LibvirtTestDaemon

TEST_DOMAIN_XML = """
<domain type='test'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <os><type>hvm</type></os>
</domain>
"""


def test_test_daemon_keeps_state_across_processes(
    libvirt_test: LibvirtTestDaemon,
) -> None:
    # What an Ansible module run does: a new process that connects, changes state and exits.
    script = textwrap.dedent(
        f"""
        import libvirt
        conn = libvirt.open({libvirt_test.uri!r})
        conn.defineXML({TEST_DOMAIN_XML.format(name="from-subprocess")!r})
        conn.close()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)

    domain = libvirt_test.connection.lookupByName("from-subprocess")
    assert domain.isPersistent()


def test_test_daemon_reset_restores_the_initial_state(
    libvirt_test: LibvirtTestDaemon,
) -> None:
    conn = libvirt_test.connection
    conn.defineXML(TEST_DOMAIN_XML.format(name="leftover")).create()
    pool = conn.storagePoolLookupByName("default-pool")
    pool.createXML(
        "<volume><name>leftover.qcow2</name><capacity>1048576</capacity></volume>"
    )
    conn.networkDefineXML("<network><name>leftover</name></network>")

    libvirt_test.reset()

    assert [domain.name() for domain in conn.listAllDomains()] == ["test"]
    assert pool.listVolumes() == []
    assert [network.name() for network in conn.listAllNetworks()] == ["default"]


@pytest.mark.parametrize("transport", ["libssh", "libssh2"])
def test_ssh_with_the_right_host_key_connects(
    hypervisor_host: HypervisorHost, transport: str
) -> None:
    conn = libvirt.open(hypervisor_host.uri(transport))
    try:
        assert conn.getType() == "QEMU"
    finally:
        conn.close()


@pytest.mark.parametrize("transport", ["libssh", "libssh2"])
def test_ssh_with_a_wrong_host_key_is_refused(
    hypervisor_host: HypervisorHost, transport: str
) -> None:
    uri = hypervisor_host.uri(transport, hypervisor_host.wrong_known_hosts_file())
    with pytest.raises(libvirt.libvirtError, match="HOST KEY VERIFICATION FAILED"):
        libvirt.open(uri)


def test_qemu_domain_runs_with_pool_disk_on_isolated_network(
    hypervisor_host: HypervisorHost,
) -> None:
    conn = hypervisor_host.connection
    network = conn.networkLookupByName("default")
    assert network.isActive()
    assert "<forward" not in network.XMLDesc()

    pool = conn.storagePoolLookupByName("default")
    volume = pool.createXML(
        "<volume><name>harness.qcow2</name><capacity unit='MiB'>16</capacity>"
        "<target><format type='qcow2'/></target></volume>"
    )
    domain = conn.defineXML(
        """
        <domain type='qemu'>
          <name>harness-vm</name>
          <memory unit='MiB'>128</memory>
          <vcpu>1</vcpu>
          <os><type arch='x86_64'>hvm</type></os>
          <devices>
            <disk type='volume' device='disk'>
              <driver name='qemu' type='qcow2'/>
              <source pool='default' volume='harness.qcow2'/>
              <target dev='vda' bus='virtio'/>
            </disk>
            <interface type='network'>
              <source network='default'/>
              <model type='virtio'/>
            </interface>
          </devices>
        </domain>
        """
    )
    try:
        domain.create()
        state, _reason = domain.state()
        assert state == libvirt.VIR_DOMAIN_RUNNING
        # The guest's NIC is on the namespace's bridge, not anywhere in the root namespace.
        bridge = network.bridgeName()
        links = hypervisor_host.run_in_namespace(
            ["ip", "-o", "link", "show", "master", bridge]
        )
        assert "vnet" in links.stdout
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()
        volume.delete()
    assert pool.listVolumes() == []
