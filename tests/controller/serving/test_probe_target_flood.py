"""The probe target under a flood (issue 38 row 4: 4,200 idle connections reset the controller's own
check of the target, and a connection sending a request every 20 s kept its slot past the idle
limit; with the target unreachable, every proxy went Unknown and nothing was probed).

The real command (``egress-proxies probe-target``) and real squid in a network namespace of the
test's own; strangers are a flood process in the same namespace holding idle connections from
addresses of its own (tests/support/netns/flood.py); the controller's checks are the real
``Prober`` in this process, whose packets come from the namespace's gateway address. The target's
idle and lifetime limits are set far beyond the test's length in the flood, so what holds there is
the connection limits alone.

The controller's network also holds a neighbour (another host behind the controller's egress NAT)
that can fill the controller's reserved slots on the public listeners; the target's control
listener (``--control-listen``, the provider's ``probe.controlUrl``) is what the controller's
direct check then still reaches, through the real ``ServingMonitor`` round.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import parse_provider_config
from egress_proxies.providers.client import Instance, ProbeSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.monitor import ServingMonitor, Watched, probe_target
from egress_proxies.serving.probe import ProbeDestination, ProbeOutcome, Prober, ProbeReason, ProbeTarget
from egress_proxies.serving.target import Limits
from support.collection.config_documents import valid_document
from support.figures import show
from support.netns.flood import Flood
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import HTTP_PORT, TUNNEL_PORT, ProbeTargetProcess
from support.netns.squid import Squid
from support.process import tcp_port_accepts
from support.waiting import wait_for

PER_SOURCE = 64
MAX_CONNECTIONS = 1000
CONTROL_PORT = 8081


@dataclass
class Lab:
    ns: NetworkNamespace
    target: ProbeTargetProcess
    squid: Squid
    egress: str  # squid's outgoing address: what the target sees of the proxy
    neighbour: str  # an address inside the controller's network that is not the controller

    @property
    def control_url(self) -> str:
        return f"http://{self.target.address}:{CONTROL_PORT}/generate_204"

    def destination(self, control: bool = False) -> ProbeDestination:
        destination = self.target.destination(check_timeout=5.0)
        return dataclasses.replace(destination, control_url=self.control_url) if control else destination

    def probe(self) -> ProbeOutcome:
        target = ProbeTarget(key="healthy", host=self.squid.address, port=self.squid.port,
                             destination=self.destination())
        return asyncio.run(Prober(allowed_networks=[self.ns.network]).probe_one(target, full=True))

    def controller_check(self, control: bool = False) -> str | None:
        return asyncio.run(Prober(allowed_networks=[self.ns.network]).check_destination(self.destination(control)))

    def verdict(self, control: bool) -> ProbeOutcome:
        """The real monitor's verdict on the healthy proxy after one round, the provider's probe
        settings read by the collection's validator (with ``controlUrl`` or without)."""
        probe = self.target.probe_settings(timeoutSeconds=5, **({"controlUrl": self.control_url} if control else {}))
        document = valid_document()
        document["providers"][0]["probe"] = probe
        settings = ProbeSettings.from_result(parse_provider_config(document).provider("home-kvm").probe.as_dict())
        instance = Instance(provider_id="kvm://hosts/h1/domains/healthy", name="healthy", state="running",
                            ip=self.squid.address, endpoint=f"{self.squid.address}:{self.squid.port}")
        target = probe_target(settings, Proxy("crawlers", "eu-1", "uid-1", {}), instance, self.target.key)
        monitor = ServingMonitor(Prober(allowed_networks=[self.ns.network]))
        monitor.watch({target.key: Watched("home-kvm", target)}, {"home-kvm": settings})
        monitor.probe_now()
        outcome = monitor.outcome(target.key)
        assert outcome is not None
        return outcome


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the flood tests need root (network namespaces); run them as root, as CI does", pytrace=False)
    with NetworkNamespace() as ns:
        address, neighbour = ns.add_address(), ns.add_address()
        options = ["--max-per-source", str(PER_SOURCE), "--max-connections", str(MAX_CONNECTIONS),
                   "--idle-timeout", "600", "--connection-lifetime", "600", "--controller-network", f"{ns.gateway}/32",
                   "--controller-network", f"{neighbour}/32", "--control-listen", f"{address}:{CONTROL_PORT}"]
        egress = ns.add_address()
        with ProbeTargetProcess(ns, address, options=options) as target, \
                Squid(ns, f"http_access allow all\ntcp_outgoing_address {egress}\n", port=3128, name="open") as squid:
            wait_for(lambda: tcp_port_accepts(address, CONTROL_PORT), 10, "the probe target's control listener")
            yield Lab(ns, target, squid, egress, neighbour)


def test_a_flood_of_5000_connections_locks_out_neither_the_proxies_nor_the_controller(
        lab: Lab, pytestconfig: pytest.Config) -> None:
    strangers = [lab.ns.add_address() for _ in range(10)]
    with Flood(lab.ns, lab.target.address, HTTP_PORT, strangers, per_source=500) as flood:
        status = flood.settle(len(strangers) * PER_SOURCE)
        # 5,000 tried: 64 held per address, the other 4,360 closed at once.
        assert (status["attempted"], status["connected"] - status["open"]) == (5000, 5000 - 640), status
        started = time.monotonic()
        outcome = lab.probe()
        probe_seconds = time.monotonic() - started
        assert outcome.serving and outcome.egress_ip == lab.egress, outcome.message
        started = time.monotonic()
        assert lab.controller_check() is None
        check_seconds = time.monotonic() - started
        show(pytestconfig, "probe target under a flood of 5,000 connections from 10 addresses (640 held)",
             [f"full probe through squid: {probe_seconds * 1000:.1f} ms",
              f"controller's direct check: {check_seconds * 1000:.1f} ms",
              f"load: {os.getloadavg()[0]:.2f}"])

        # Strangers from ten more addresses take every slot that is left (1,000 in all, less the
        # few squid keeps open to the target for its next requests): the controller's connections
        # have slots of their own and still get their answers.
        more = [lab.ns.add_address() for _ in range(10)]
        with Flood(lab.ns, lab.target.address, HTTP_PORT, more, per_source=250, name="flood-2") as second:
            left = MAX_CONNECTIONS - len(strangers) * PER_SOURCE
            second.settle(left - 4, left)
            assert flood.status()["open"] == len(strangers) * PER_SOURCE
            assert lab.controller_check() is None
    # The flood gone, its slots are free again.
    assert lab.probe().serving


def test_the_controllers_direct_check_on_its_control_listener_outlasts_a_flood_of_every_public_slot(
        lab: Lab, pytestconfig: pytest.Config) -> None:
    """Row 4's last gap: the controller's reserved slots on the public listeners are shared with
    whoever else is in its network (a neighbour behind the same egress NAT fills them), and then
    its direct check of the target failed, which turned a healthy proxy's verdict into "probe
    target unreachable". Asked at the control listener, the check answers and the verdict stands;
    strangers never get an answer there; and it still answers when every strangers' slot is full."""
    strangers = [lab.ns.add_address() for _ in range(10)]
    slots = Limits().controller_slots
    with Flood(lab.ns, lab.target.address, HTTP_PORT, strangers, per_source=250, name="flood-3") as flood, \
            Flood(lab.ns, lab.target.address, TUNNEL_PORT, [lab.neighbour], per_source=200, name="neighbour"):
        flood.settle(len(strangers) * PER_SOURCE)
        wait_for(lambda: lab.controller_check() is not None, 10, "the neighbour to hold the controller's public slots")
        # Without controlUrl (before): the healthy proxy is not even probed.
        before = lab.verdict(control=False)
        assert before.reason is ProbeReason.PROBE_TARGET_UNREACHABLE, before.message
        started = time.monotonic()
        after = lab.verdict(control=True)
        verdict_seconds = time.monotonic() - started
        assert after.serving and after.egress_ip == lab.egress, after.message
        # Strangers at the control listener: closed at once, nothing held, nothing answered.
        with Flood(lab.ns, lab.target.address, CONTROL_PORT, strangers[:2], per_source=100, name="stranger") as probe:
            status = probe.settle(0)
            assert status["attempted"] == 200 and status["refused"] + status["connected"] == 200, status

        more = [lab.ns.add_address() for _ in range(10)]
        with Flood(lab.ns, lab.target.address, HTTP_PORT, more, per_source=250, name="flood-4") as second:
            left = MAX_CONNECTIONS - len(strangers) * PER_SOURCE
            second.settle(left - 4, left)
            started = time.monotonic()
            assert lab.controller_check(control=True) is None
            check_seconds = time.monotonic() - started
            show(pytestconfig, f"probe target: the controller's {slots} public slots held by a neighbour, 5,000 "
                 f"connections from 20 stranger addresses holding all {MAX_CONNECTIONS} strangers' slots",
                 [f"monitor round with controlUrl (healthy proxy, full probe): {verdict_seconds * 1000:.1f} ms",
                  f"direct check on the control listener, every slot full: {check_seconds * 1000:.1f} ms",
                  f"load: {os.getloadavg()[0]:.2f}"])


def _request(path: str = "/generate_204") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: probe.test\r\n\r\n".encode()


def _answers(conn: socket.socket) -> tuple[list[bytes], bool]:
    """Every answer's head read so far, and whether the server ended the connection."""
    conn.settimeout(0.05)
    data = b""
    closed = False
    try:
        while chunk := conn.recv(65536):
            data += chunk
        closed = True
    except TimeoutError:
        pass
    except ConnectionResetError:
        closed = True
    return [head for head in data.split(b"\r\n\r\n") if head], closed


def test_a_slow_client_keeps_its_slot_no_longer_than_the_connection_lifetime(lab: Lab) -> None:
    """Row 4's slow client, at the test's scale: a request every 0.3 s, lifetime 1.5 s, idle 0.8 s,
    one connection per address. It is answered until its lifetime ends, then closed; meanwhile a
    second connection from its address is refused; afterwards one is served. A client that sends
    nothing is cut at the idle limit."""
    options = ["--max-per-source", "1", "--idle-timeout", "0.8", "--connection-lifetime", "1.5"]
    with ProbeTargetProcess(lab.ns, options=options) as target:
        address = (target.address, HTTP_PORT)
        # The start-up's own readiness connections may still hold the one slot for a moment.
        wait_for(lambda: _served_once(address), 10, "the target to serve one request from this address")
        with socket.create_connection(address, timeout=5) as slow:
            opened = time.monotonic()
            heads: list[bytes] = []
            closed = False
            while not closed and time.monotonic() - opened < 5:
                slow.sendall(_request())
                time.sleep(0.3)
                answers, closed = _answers(slow)
                heads += answers
                if len(heads) == 1:  # it holds the address's one slot: a second connection is refused
                    with socket.create_connection(address, timeout=5) as second:
                        second.sendall(_request())
                        assert _wait_closed(second) == [], "a second connection from one address was served"
            lifetime = time.monotonic() - opened
        assert closed and 1.5 <= lifetime < 3.0, (closed, lifetime)
        assert len(heads) >= 3 and all(head.startswith(b"HTTP/1.1 204 ") for head in heads)
        # The last answer says close when its request came before the end, else the wait for the next is cut.
        assert all(b"Connection: keep-alive" in head for head in heads[:-1])
        assert _served_once(address)
        with socket.create_connection(address, timeout=5) as silent:
            opened = time.monotonic()
            assert _wait_closed(silent) == []
            assert 0.8 <= time.monotonic() - opened < 2.5


def _served_once(address: tuple[str, int]) -> bool:
    """One request that ends its connection (its slot is given back before the end is sent)."""
    with socket.create_connection(address, timeout=5) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe.test\r\nConnection: close\r\n\r\n")
        answers = _wait_closed(conn)
    return bool(answers) and answers[0].startswith(b"HTTP/1.1 200 ")


def _wait_closed(conn: socket.socket, seconds: float = 5.0) -> list[bytes]:
    """The answers a connection gets until the server ends it (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    heads: list[bytes] = []
    while time.monotonic() < deadline:
        answers, closed = _answers(conn)
        heads += answers
        if closed:
            return heads
    raise AssertionError(f"the server did not end the connection within {seconds} s")
