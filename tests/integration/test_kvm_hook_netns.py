"""The kvm_hypervisor role's qemu hook (roles/kvm_hypervisor/files/egress-proxies-hook) for real:
run as libvirtd runs it, inside a hypervisor's network namespace with libvirt's NAT rules, while
a "guest" namespace on the host's bridge and an "outside" namespace on its uplink send real
traffic through the rules it adds and removes.

    outside (10.242.0.2) --uplink-- host (public 10.242.0.1; sources 10.243.0.1-2) --bridge-- guest (10.241.0.20)

The outside namespace reaches the host only over the uplink, with a route to the source addresses
via the host: a crawler there dials the published port; an echo server there says which address
a guest's connection came from. Everything stays inside the three namespaces the test creates.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "roles" / "kvm_hypervisor" / "files" / "egress-proxies-hook"
NETWORK = "default"
BRIDGE = "virbr9"
GUEST_NET = "10.241.0.0/24"
GUEST = "10.241.0.20"
GUEST_MAC = "52:54:00:00:00:20"
PUBLIC = "10.242.0.1"
OUTSIDE = "10.242.0.2"
SOURCES = ["10.243.0.1", "10.243.0.2"]
PORTS = (40000, 40009)
PROXY_PORT = 3128
ECHO_PORT = 8080

# A TCP server that answers every connection with the address it came from, then closes it: the
# guest's "proxy" (what the crawler reached it from) and the outside's echo (what a site sees).
# With a second argument it says who it is first ("host-sshd:10.242.0.2").
PEER_SERVER = """
import socket, sys
label = sys.argv[2] + ":" if len(sys.argv) > 2 else ""
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1]))); server.listen(8)
while True:
    connection, peer = server.accept()
    connection.sendall((label + peer[0]).encode()); connection.close()
"""
PEER_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as connection:
        print(connection.recv(64).decode())
except OSError as error:
    print("unreachable: %s" % error)
"""
# libvirt's rules for a NAT network (what `iptables-save` shows on a Debian host with
# virbr0): guests leave masqueraded; from outside, only replies reach them.
LIBVIRT_NAT_RULES = [
    ["-t", "nat", "-A", "POSTROUTING", "-s", GUEST_NET, "!", "-d", GUEST_NET, "-j", "MASQUERADE"],
    ["-A", "FORWARD", "-d", GUEST_NET, "-o", BRIDGE, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
     "-j", "ACCEPT"],
    ["-A", "FORWARD", "-s", GUEST_NET, "-i", BRIDGE, "-j", "ACCEPT"],
    ["-A", "FORWARD", "-o", BRIDGE, "-j", "REJECT"],
    ["-A", "FORWARD", "-i", BRIDGE, "-j", "REJECT"],
]


def run(*cmd: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{shlex.join(cmd)}: {result.stderr.strip()}")
    return result


class Hypervisor:
    """The three namespaces, and the hook run inside the host's as libvirtd runs it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        tag = f"ephk{os.getpid()}"
        self.host, self.guest, self.outside = f"{tag}-host", f"{tag}-guest", f"{tag}-out"
        self.servers: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for namespace in (self.host, self.guest, self.outside):
            run("ip", "netns", "add", namespace)
            run("ip", "-n", namespace, "link", "set", "lo", "up")
        host, guest, outside = self.host, self.guest, self.outside
        run("ip", "-n", host, "link", "add", BRIDGE, "type", "bridge")
        run("ip", "-n", host, "address", "add", "10.241.0.1/24", "dev", BRIDGE)
        run("ip", "-n", host, "link", "add", "vnet0", "type", "veth", "peer", "name", "eth0", "netns", guest)
        run("ip", "-n", host, "link", "set", "vnet0", "master", BRIDGE)
        run("ip", "-n", host, "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", outside)
        run("ip", "-n", host, "address", "add", f"{PUBLIC}/24", "dev", "uplink")
        for source in SOURCES:
            run("ip", "-n", host, "address", "add", f"{source}/32", "dev", "uplink")
        for link in (BRIDGE, "vnet0", "uplink"):
            run("ip", "-n", host, "link", "set", link, "up")
        run("ip", "netns", "exec", host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        run("ip", "-n", guest, "address", "add", f"{GUEST}/24", "dev", "eth0")
        run("ip", "-n", guest, "link", "set", "eth0", "address", GUEST_MAC, "up")
        run("ip", "-n", guest, "route", "add", "default", "via", "10.241.0.1")
        run("ip", "-n", outside, "address", "add", f"{OUTSIDE}/24", "dev", "eth0")
        run("ip", "-n", outside, "link", "set", "eth0", "up")
        # The upstream routing an operator sets up for source addresses; nothing routes the guest network.
        run("ip", "-n", outside, "route", "add", "10.243.0.0/24", "via", PUBLIC)
        for rule in LIBVIRT_NAT_RULES:
            self.iptables(*rule)
        self.serve(guest, PROXY_PORT)
        self.serve(outside, ECHO_PORT)
        self.configure(PORTS)
        self.status_dir.mkdir(parents=True)

    def configure(self, ports: tuple[int, int]) -> None:
        """What the role writes (roles/kvm_hypervisor/vars/main.yml, kvm_hypervisor_hook_config)."""
        config_dir = self.root / "etc-libvirt" / "hooks" / "egress-proxies"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / f"{NETWORK}.json").write_text(json.dumps({
            "network": NETWORK, "bridge": BRIDGE, "bridge_address": "10.241.0.1", "netmask": "255.255.255.0",
            "public_address": PUBLIC, "publish_ports": list(ports), "source_addresses": SOURCES}))

    @property
    def status_dir(self) -> Path:
        """The host's /run/libvirt/qemu, where libvirtd keeps a running domain's status."""
        return self.root / "run" / "libvirt" / "qemu"

    def running(self, name: str, xml: str) -> None:
        """libvirtd's status file of a running domain, as it writes it before ``started begin``."""
        live = xml.replace("<domain ", "<domain id='1' ", 1)
        self._status_file(name).write_text(
            "<!--\nWARNING: THIS IS AN AUTO-GENERATED FILE.\n-->\n"
            f"<domstatus state='running' reason='booted' pid='4242'>\n  <taint flag='high-privileges'/>\n"
            f"  {live}\n</domstatus>\n")

    def gone(self, name: str) -> None:
        """The domain stopped (libvirtd removes its status file)."""
        self._status_file(name).unlink(missing_ok=True)

    def _status_file(self, name: str) -> Path:
        # libvirtd names it <name>.xml; a name longer than a file name cannot be, so it is cut.
        return self.status_dir / f"{name[:200]}.xml"

    def serve(self, namespace: str, port: int, label: str | None = None) -> None:
        server = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", PEER_SERVER, str(port),
                                   *([label] if label else [])])
        self.servers.append(server)
        wait_for(lambda: not self.peer(namespace, "127.0.0.1", port).startswith("unreachable"), 10,
                 f"the server in {namespace} to start", 0.1, process=server)

    def stop(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait()
        for namespace in (self.host, self.guest, self.outside):
            run("ip", "netns", "del", namespace, check=False)

    def iptables(self, *arguments: str) -> None:
        run("ip", "netns", "exec", self.host, "iptables", "-w", *arguments)

    def rules(self) -> str:
        return run("ip", "netns", "exec", self.host, "iptables-save").stdout

    def peer(self, namespace: str, address: str, port: int) -> str:
        """What a server at ``address:port`` says a connection from ``namespace`` came from."""
        return run("ip", "netns", "exec", namespace, sys.executable, "-c", PEER_CLIENT, address,
                   str(port)).stdout.strip()

    def hook(self, domain: str, operation: str, sub_operation: str, xml: str,
             commands: Path | None = None) -> subprocess.CompletedProcess[str]:
        """The hook as libvirtd runs it, in the host's namespace, seeing the role's configuration at
        /etc/libvirt/hooks/egress-proxies and the test's /run (its lock, libvirtd's status files):
        private mounts, the machine's own /etc and /run are not touched. ``commands``: a directory
        put first on its PATH."""
        path = f"PATH={shlex.quote(str(commands))}:$PATH " if commands else ""
        script = (f"mount --bind {shlex.quote(str(self.root / 'etc-libvirt'))} /etc/libvirt && "
                  f"mount --bind {shlex.quote(str(self.root / 'run'))} /run && {path}exec /usr/bin/python3 \"$@\"")
        return run("ip", "netns", "exec", self.host, "unshare", "--mount", "sh", "-c", script, "hook", str(HOOK),
                   domain, operation, sub_operation, "-", stdin=xml, check=False)


def uuid_of(name: str) -> str:
    """A UUID per domain name, as libvirt gives each domain one."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def domain_xml(name: str, *, port: int = 40003, source: str | None = SOURCES[1], guest: str = GUEST,
               metadata: bool = True, proxy_port: int = PROXY_PORT, clients: tuple[str, ...] = ()) -> str:
    """A domain as the KVM provider defines it on a host that publishes proxies (domain_xml.py);
    ``clients``: the networks its crawlers may connect from (the Proxy's allowed sources)."""
    published = f"<egress:published address='{PUBLIC}' port='{port}'/>" if port else ""
    sourced = f"<egress:source address='{source}'/>" if source else ""
    allowed = "".join(f"<egress:client network='{network}'/>" for network in clients)
    instance = (f"<metadata><egress:instance xmlns:egress='https://crawl.example.com/egress-proxies/v1alpha1'>"
                f"<egress:port>{proxy_port}</egress:port><egress:guest address='{guest}' mac='{GUEST_MAC}'/>"
                f"{published}{sourced}{allowed}</egress:instance></metadata>") if metadata else ""
    return (f"<domain type='kvm'><name>{escape(name)}</name><uuid>{uuid_of(name)}</uuid>{instance}<devices>"
            f"<interface type='network'><mac address='{GUEST_MAC}'/><source network='{NETWORK}'/></interface>"
            f"</devices></domain>")


@pytest.fixture(scope="module")
def hypervisor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hypervisor]:
    if os.geteuid() != 0:
        pytest.fail("the hook's test needs root (network namespaces); run the tests as root, as CI does",
                    pytrace=False)
    found = Hypervisor(tmp_path_factory.mktemp("hook"))
    try:
        found.start()
        yield found
    finally:
        found.stop()


def ours(rules: str) -> list[str]:
    return [line for line in rules.splitlines() if "egress-proxies:" in line]


def test_a_published_guest_is_reached_and_leaves_from_its_source_while_it_runs(hypervisor: Hypervisor) -> None:
    # Before: libvirt's NAT network alone, unreachable from outside, leaving as the host.
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003).startswith("unreachable")
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == PUBLIC

    hypervisor.running("p-1", domain_xml("p-1"))
    started = hypervisor.hook("p-1", "started", "begin", domain_xml("p-1"))
    assert (started.returncode, started.stderr) == (0, "")
    # The crawler outside dials public:port and reaches the guest's proxy port, from its own address.
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003) == OUTSIDE
    # So does the host itself (a controller probing there): the DNAT applies to its own connections.
    assert hypervisor.peer(hypervisor.host, PUBLIC, 40003) == PUBLIC
    # The site outside sees the guest's source address, not the host's.
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == SOURCES[1]
    # The host's other ports stay unpublished.
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40004).startswith("unreachable")

    # libvirtd restarted while it runs: the same rules, not twice.
    before = ours(hypervisor.rules())
    assert len(before) == 3, before
    assert hypervisor.hook("p-1", "reconnect", "begin", domain_xml("p-1")).returncode == 0
    assert ours(hypervisor.rules()) == before
    rules = hypervisor.rules()
    for chain in ("PREROUTING", "OUTPUT", "POSTROUTING", "FORWARD"):
        jumps = [line for line in rules.splitlines() if line.startswith(f"-A {chain} ")]
        assert jumps[0].startswith(f"-A {chain} -j EGRESS-PROXIES-"), jumps  # ahead of libvirt's rules

    # Destroyed (libvirt runs "stopped end" then "release end"): its rules go, and it is as before.
    hypervisor.gone("p-1")
    for operation in ("stopped", "release"):
        assert hypervisor.hook("p-1", operation, "end", domain_xml("p-1")).returncode == 0
    assert ours(hypervisor.rules()) == []
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003).startswith("unreachable")
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == PUBLIC


@pytest.mark.parametrize(("xml", "named"), [
    (domain_xml("bad", port=22), "22 is not the host's public address 10.242.0.1 with a port of 40000-40009"),
    (domain_xml("bad", source="10.242.0.1"), "source address 10.242.0.1 is not one of the host's source addresses"),
    (domain_xml("bad", guest="10.9.9.9"), "guest address 10.9.9.9 is not a guest's address in 10.241.0.0/24"),
])
def test_a_domain_asking_for_more_than_the_role_configured_does_not_start(hypervisor: Hypervisor, xml: str,
                                                                          named: str) -> None:
    refused = hypervisor.hook("bad", "started", "begin", xml)
    assert refused.returncode == 1
    assert f"domain {uuid_of('bad')}" in refused.stderr and named in refused.stderr, refused.stderr
    assert ours(hypervisor.rules()) == []


def test_domains_that_are_not_published_proxies_are_left_alone(hypervisor: Hypervisor) -> None:
    unrelated = hypervisor.hook("someone-elses", "started", "begin", domain_xml("x", metadata=False))
    assert unrelated.returncode == 0 and unrelated.stderr == ""
    assert ours(hypervisor.rules()) == []


# --- issue 38 row 5: a hook that never leaves a rule -------------------------------------------------


def start(hypervisor: Hypervisor, name: str, xml: str) -> subprocess.CompletedProcess[str]:
    """libvirtd starting the domain: its status file, then ``started begin``."""
    hypervisor.running(name, xml)
    return hypervisor.hook(name, "started", "begin", xml)


def stop(hypervisor: Hypervisor, name: str, xml: str) -> None:
    """libvirtd stopping it: ``stopped end``, its status file removed, ``release end``."""
    assert hypervisor.hook(name, "stopped", "end", xml).returncode == 0
    hypervisor.gone(name)
    assert hypervisor.hook(name, "release", "end", xml).returncode == 0


@pytest.mark.parametrize("name", ["o'neil-proxy", "p" * 300, 'with "quotes" and spaces'])
def test_a_stopped_domain_leaves_no_rule_whatever_its_name(hypervisor: Hypervisor, name: str) -> None:
    # Keyed by name, a quote or 300 characters made the rules unremovable (3 left each time): the
    # stale SNAT gave the next guest on that address the old one's source address.
    xml = domain_xml(name)
    started = start(hypervisor, name, xml)
    assert (started.returncode, started.stderr) == (0, "")
    assert len(ours(hypervisor.rules())) == 3
    assert all(f"egress-proxies:{uuid_of(name)}" in line for line in ours(hypervisor.rules()))
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == SOURCES[1]
    stop(hypervisor, name, xml)
    assert ours(hypervisor.rules()) == []
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == PUBLIC
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003).startswith("unreachable")


def test_a_domain_whose_live_metadata_was_removed_loses_its_rules_when_it_stops(hypervisor: Hypervisor) -> None:
    # `virsh metadata --live --remove` while it runs: the XML at stop says nothing of ours.
    assert start(hypervisor, "p-live", domain_xml("p-live")).returncode == 0
    assert len(ours(hypervisor.rules())) == 3
    stop(hypervisor, "p-live", domain_xml("p-live", metadata=False))
    assert ours(hypervisor.rules()) == []
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == PUBLIC


def test_rules_of_domains_that_are_not_running_go_at_the_next_reconnect(hypervisor: Hypervisor) -> None:
    # A domain that died while libvirtd was down (no stop ever ran the hook), and a rule an older
    # hook keyed by a name: both stale. The next reconnect of any domain removes them.
    dead = domain_xml("dead", port=40001, source=SOURCES[0], guest="10.241.0.21")
    assert start(hypervisor, "dead", dead).returncode == 0
    hypervisor.gone("dead")
    hypervisor.iptables("-t", "nat", "-A", "EGRESS-PROXIES-SNAT", "-s", f"{GUEST}/32", "!", "-d", GUEST_NET,
                        "-m", "comment", "--comment", "egress-proxies:o'neil-proxy", "-j", "SNAT",
                        "--to-source", SOURCES[0])
    assert len(ours(hypervisor.rules())) == 4
    live = domain_xml("live")
    hypervisor.running("live", live)
    reconnected = hypervisor.hook("live", "reconnect", "begin", live)
    assert (reconnected.returncode, reconnected.stderr) == (0, "")
    left = ours(hypervisor.rules())
    assert len(left) == 3 and all(f"egress-proxies:{uuid_of('live')}" in line for line in left), left
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == SOURCES[1]  # its own SNAT, not the stale one
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003) == OUTSIDE
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40001).startswith("unreachable")
    stop(hypervisor, "live", live)
    assert ours(hypervisor.rules()) == []


def test_without_the_status_files_showing_it_running_nothing_else_is_called_stale(hypervisor: Hypervisor) -> None:
    # A status directory that does not show the domain being started is not one the hook reads
    # right: it touches that domain's own rules only.
    other = domain_xml("other", port=40001, source=SOURCES[0], guest="10.241.0.21")
    assert start(hypervisor, "other", other).returncode == 0
    hypervisor.gone("other")  # as if libvirtd kept its status elsewhere
    unknown = domain_xml("unknown")
    started = hypervisor.hook("unknown", "started", "begin", unknown)
    assert started.returncode == 0
    assert f"domain {uuid_of('unknown')}: " in started.stderr and "does not show it running" in started.stderr
    assert len(ours(hypervisor.rules())) == 6
    for name, xml in (("unknown", unknown), ("other", other)):
        stop(hypervisor, name, xml)
    assert ours(hypervisor.rules()) == []


# --- issue 38 row 6: a hook that never shares a rule or publishes a service ------------------------


@pytest.mark.parametrize(("xml", "held"), [
    (domain_xml("same-port", source=SOURCES[0], guest="10.241.0.21"), f"published port {PUBLIC}:40003 is held"),
    (domain_xml("same-source", port=40004, guest="10.241.0.21"), f"source address {SOURCES[1]} is held"),
    (domain_xml("same-guest", port=40004, source=SOURCES[0]), f"guest address {GUEST} is held"),
])
def test_a_port_or_address_another_running_domain_holds_is_refused(hypervisor: Hypervisor, xml: str,
                                                                   held: str) -> None:
    # Accepted before: two DNATs of one port (the first won silently), two guests leaving from
    # one source address.
    holder = domain_xml("holder")
    assert start(hypervisor, "holder", holder).returncode == 0
    before = ours(hypervisor.rules())
    name = xml.split("<name>", 1)[1].split("</name>", 1)[0]
    refused = start(hypervisor, name, xml)
    assert refused.returncode == 1
    assert f"domain {uuid_of(name)}: {held} by domain {uuid_of('holder')}" in refused.stderr, refused.stderr
    stop(hypervisor, name, xml)  # libvirtd stops a domain whose start failed: the holder keeps its rules
    assert ours(hypervisor.rules()) == before
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003) == OUTSIDE
    assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == SOURCES[1]
    stop(hypervisor, "holder", holder)
    assert ours(hypervisor.rules()) == []


def test_a_proxy_port_below_1024_is_refused_so_the_guests_sshd_is_never_published(hypervisor: Hypervisor) -> None:
    hypervisor.serve(hypervisor.guest, 22, "guest-sshd")
    xml = domain_xml("sshd", proxy_port=22)
    refused = start(hypervisor, "sshd", xml)
    assert refused.returncode == 1
    assert "proxy port '22' is not a port of 1024-65535" in refused.stderr, refused.stderr
    assert ours(hypervisor.rules()) == []
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003).startswith("unreachable")
    stop(hypervisor, "sshd", xml)


def test_the_hosts_own_ports_are_never_published(hypervisor: Hypervisor) -> None:
    # The host's sshd on 22, and a service of the host's inside the publish range.
    hypervisor.serve(hypervisor.host, 22, "host-sshd")
    hypervisor.serve(hypervisor.host, 40005, "host-service")
    hypervisor.configure((20, 30))  # what an older role wrote for kvm_hypervisor_publish_ports: 20-30
    try:
        xml = domain_xml("takeover", port=22)
        refused = start(hypervisor, "takeover", xml)
        assert refused.returncode == 1
        assert "publishes ports 20-30, below 1024" in refused.stderr, refused.stderr
        stop(hypervisor, "takeover", xml)
    finally:
        hypervisor.configure(PORTS)
    xml = domain_xml("takeover", port=40005)
    refused = start(hypervisor, "takeover", xml)
    assert refused.returncode == 1
    assert f"published port {PUBLIC}:40005 is one the host itself listens on" in refused.stderr, refused.stderr
    stop(hypervisor, "takeover", xml)
    assert ours(hypervisor.rules()) == []
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 22) == f"host-sshd:{OUTSIDE}"
    assert hypervisor.peer(hypervisor.outside, PUBLIC, 40005) == f"host-service:{OUTSIDE}"


def test_a_guest_reaches_no_address_of_the_host_but_its_bridge(hypervisor: Hypervisor) -> None:
    """Issue 38 row 1, defence in depth: a service of the hypervisor's on every address (a metrics
    exporter on 0.0.0.0:9100) is out of a guest's reach at the host's public and source addresses
    once a domain of the network started, whatever the guest's squid would do."""
    hypervisor.serve(hypervisor.host, 9100, "host-exporter")
    # A host without the guard (the hook before issue 38): the guest reaches the host's service.
    for command in ("iptables", "ip6tables"):
        run("ip", "netns", "exec", hypervisor.host, command, "-w", "-F", "EGRESS-PROXIES-IN", check=False)
    for address in (PUBLIC, *SOURCES):
        assert hypervisor.peer(hypervisor.guest, address, 9100) == f"host-exporter:{GUEST}"

    xml = domain_xml("guarded")
    assert start(hypervisor, "guarded", xml).returncode == 0
    assert hypervisor.hook("guarded", "reconnect", "begin", xml).returncode == 0  # libvirtd restarted: one guard
    try:
        for address in (PUBLIC, *SOURCES):
            assert hypervisor.peer(hypervisor.guest, address, 9100).startswith("unreachable"), address
        guards = [line for line in hypervisor.rules().splitlines() if "egress-proxies-guard:" in line]
        assert guards == [(f"-A EGRESS-PROXIES-IN ! -d 10.241.0.1/32 -i {BRIDGE} -m addrtype --dst-type LOCAL -m "
                           f'conntrack ! --ctstate RELATED,ESTABLISHED -m comment --comment "egress-proxies-guard:'
                           f'{NETWORK}" -j DROP')]
        assert "-A INPUT -j EGRESS-PROXIES-IN" in hypervisor.rules()
        six = run("ip", "netns", "exec", hypervisor.host, "ip6tables", "-w", "-S", "EGRESS-PROXIES-IN").stdout
        assert six.count(f"egress-proxies-guard:{NETWORK}") == 1 and "! -p ipv6-icmp" in six, six
        # What must still pass: the crawler outside and the host itself (its replies) reach the
        # guest's proxy through the published port, and the guest leaves from its source address.
        assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003) == OUTSIDE
        assert hypervisor.peer(hypervisor.host, PUBLIC, 40003) == PUBLIC
        assert hypervisor.peer(hypervisor.guest, OUTSIDE, ECHO_PORT) == SOURCES[1]
    finally:
        stop(hypervisor, "guarded", xml)
    # The guard stays when the domain goes: it belongs to the network, not to a domain.
    assert hypervisor.peer(hypervisor.guest, PUBLIC, 9100).startswith("unreachable")


def test_only_the_crawlers_networks_reach_a_published_port(hypervisor: Hypervisor) -> None:
    """Issue 39 item 7: a client outside the Proxy's allowed sources (recorded on the domain) is
    refused by the host, before squid: the published port's FORWARD accept names each IPv4 network
    (IPv6 ones cannot reach an IPv4 published port). The host's own connections (the controller's
    probe) take no FORWARD path and still arrive."""
    xml = domain_xml("clients", clients=("198.51.100.0/24", "203.0.113.10/32", "fc00::/7"))
    assert start(hypervisor, "clients", xml).returncode == 0
    try:
        assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003).startswith("unreachable")
        assert hypervisor.peer(hypervisor.host, PUBLIC, 40003) == PUBLIC
        accepts = [line for line in ours(hypervisor.rules()) if line.startswith("-A EGRESS-PROXIES-FWD ")]
        assert [line.split()[3] for line in accepts] == ["198.51.100.0/24", "203.0.113.10/32"], accepts
    finally:
        stop(hypervisor, "clients", xml)
    xml = domain_xml("clients", clients=("10.242.0.0/24",))
    assert start(hypervisor, "clients", xml).returncode == 0
    try:
        assert hypervisor.peer(hypervisor.outside, PUBLIC, 40003) == OUTSIDE
    finally:
        stop(hypervisor, "clients", xml)
    xml = domain_xml("clients", clients=("10.242.0.1/24",))
    refused = start(hypervisor, "clients", xml)
    assert refused.returncode == 1
    assert "client network '10.242.0.1/24' is not a network" in refused.stderr, refused.stderr
    stop(hypervisor, "clients", xml)
    assert ours(hypervisor.rules()) == []


def test_a_host_without_ip6tables_still_starts_its_guests_with_the_ipv4_guard(hypervisor: Hypervisor) -> None:
    """A host booted without IPv6 (ip6tables fails): the IPv6 guard is skipped with a warning,
    the domain starts and the IPv4 guard holds."""
    commands = hypervisor.root / "no-ipv6"
    commands.mkdir(exist_ok=True)
    (commands / "ip6tables").write_text("#!/bin/sh\necho 'ip6tables: IPv6 is disabled' >&2\nexit 3\n")
    (commands / "ip6tables").chmod(0o755)
    for command in ("iptables", "ip6tables"):
        run("ip", "netns", "exec", hypervisor.host, command, "-w", "-F", "EGRESS-PROXIES-IN", check=False)
    xml = domain_xml("no-ipv6")
    hypervisor.running("no-ipv6", xml)
    started = hypervisor.hook("no-ipv6", "started", "begin", xml, commands)
    try:
        assert started.returncode == 0, started.stderr
        assert "no IPv6 guard for network default" in started.stderr, started.stderr
        assert [line for line in hypervisor.rules().splitlines() if "egress-proxies-guard:" in line]
        assert len(ours(hypervisor.rules())) == 3
    finally:
        stop(hypervisor, "no-ipv6", xml)
