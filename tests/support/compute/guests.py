"""The GCP provider's instances run for real: what a booted VM and its VPC network would do, in a
network namespace the test made (the Compute emulator itself has no machines).

:class:`ComputeGuests` watches the emulator's instances and, for each new RUNNING one, does what the
VM would, at the address it is dialled at (its external one, else its internal one; the emulator
hands out the test's ``external_addresses`` and ``internal_addresses``):

- **way out**: an instance with neither an external address nor a Cloud NAT in its region never
  gets squid (its startup-script's package install fails: ``stranded``); one behind a Cloud NAT
  leaves from the NAT's address (a source NAT in the VPC namespace);
- **addresses**: the internal address goes on the VPC namespace (``vpc``), where only this
  instance's squid listens on it; the external one is a one-to-one NAT to it in the VPC namespace
  (incoming connections translated to the internal address, what it sends out from the external
  one), as at Google's edge: the guest never holds it, so only the metadata server tells it. The
  test routes the addresses from where crawlers and the controller are;
- **boot**: the instance's own metadata ``startup-script``, as Google's guest agent runs it (root,
  sh), in the VPC namespace and a private mount namespace whose ``/etc/squid`` is a copy of this
  machine's Debian squid configuration (the package the script finds installed) and whose
  ``/etc/systemd/system`` is a fresh tmpfs; ``systemctl`` is a stub that logs. The metadata
  server on 169.254.169.254 says the instance's external address (``guest_metadata.py``);
- **squid**: Debian's squid with the files the script wrote (every ``/etc/squid/`` path moved to
  the copy), listening on ``<internal address>:<port>`` and fetching from it, so a site sees the
  instance's external address (or its Cloud NAT's) as its egress;
- **firewall**: the VPC firewall as a real packet filter in the VPC namespace (iptables, INPUT),
  rewritten whenever the emulator's rules change: for each instance's proxy port (as dialled,
  before the edge's translation), at an external address sources the internet does not route
  are dropped (``UNROUTED_SOURCES``), then the network's rules that apply to the instance's tags
  in the order the API weighs them (``firewall.decisions``), then the implied deny. So a source
  outside the rules is refused before squid sees a packet.

``errors`` collects instances that could not be booted (a test asserts it stays empty).
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.compute.emulator import UNROUTED_SOURCES, ComputeEmulator, GuestView
from support.compute.firewall import decisions
from support.compute.guest_metadata import serve_in_shell
from support.netns.namespace import NetworkNamespace
from support.netns.squid import Squid
from support.process import DaemonStartError, run_checked

LOG = logging.getLogger(__name__)
STOCK_SQUID = Path("/etc/squid")  # Debian's package configuration, as on the image


@dataclass
class Guest:
    zone: str
    name: str
    address: str
    port: int
    squid: Squid
    startup_log: Path


class ComputeGuests:
    """Boots the emulator's instances in ``vpc`` (``start``, ``stop``; see the module docstring)."""

    def __init__(self, emulator: ComputeEmulator, vpc: NetworkNamespace, poll: float = 0.1) -> None:
        self.emulator = emulator
        self.vpc = vpc
        self.poll = poll
        self.guests: dict[str, Guest] = {}
        self.errors: list[str] = []
        self._failed: set[str] = set()
        self.stranded: set[str] = set()  # instances with no way out: their squid never installs
        self.packet_filter = ""  # the iptables-restore input in force
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="compute-guests", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for guest in self.guests.values():
            guest.squid.terminate()
        for guest in self.guests.values():
            guest.squid.stop()

    def __enter__(self) -> ComputeGuests:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                instances, rules = self.emulator.network_view()
                self._apply_filter(instances, rules)
                for instance in instances:
                    if instance.name not in self.guests and instance.name not in self._failed | self.stranded:
                        self._boot(instance)
            except Exception as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                LOG.exception("compute guests: a round failed")

    def _boot(self, instance: GuestView) -> None:
        name, port = instance.name, instance.port
        if instance.egress is None:
            # Neither an external address nor a Cloud NAT: the startup-script's package install
            # fails (tests/integration/test_gcp_startup_script.py), so no squid ever listens.
            self.stranded.add(name)
            LOG.info("compute guests: %s has no way out; its squid never installs", name)
            return
        try:
            self._attach(instance)
            report = self.emulator.boot(instance.zone, name)
            assert report.startup_script is not None, f"{name}: its image runs no startup-script"
            etc, log = self._startup_script(name, report.startup_script, instance.external)
            squid = Squid(self.vpc, self._squid_config(etc, instance.internal, port), address=instance.address,
                          port=port, name=f"squid-{name}", extra=f"tcp_outgoing_address {instance.internal}\n")
            squid.start()
        except (DaemonStartError, OSError, AssertionError, subprocess.SubprocessError) as error:
            self._failed.add(name)
            self.errors.append(f"{name}: {type(error).__name__}: {error}")
            LOG.exception("compute guests: %s could not be booted", name)
            return
        self.guests[name] = Guest(instance.zone, name, instance.address, port, squid, log)
        LOG.info("compute guests: %s serving on %s:%d", name, instance.address, port)

    def _attach(self, instance: GuestView) -> None:
        """The NIC's internal address in the VPC; the external one a one-to-one NAT to it (both
        ways, as Google's edge translates it: the VM never holds it), or the region's Cloud NAT for
        what it sends out."""
        self.vpc.add_address(instance.internal)
        nat: list[list[str]] = []
        if instance.external:
            nat.append(["PREROUTING", "-d", f"{instance.external}/32", "-j", "DNAT", "--to-destination",
                        instance.internal])
        if instance.egress:
            nat.append(["POSTROUTING", "-s", f"{instance.internal}/32", "-j", "SNAT", "--to-source", instance.egress])
        for rule in nat:
            run_checked(self.vpc.command(["iptables", "-t", "nat", "-A", *rule]))

    def _startup_script(self, name: str, script: str, external: str | None) -> tuple[Path, Path]:
        """Run the instance's startup-script (see the module docstring); its /etc/squid and its log."""
        root = self.vpc.root / f"guest-{name}"
        stubs, etc, log = root / "bin", root / "etc-squid", root / "startup.log"
        stubs.mkdir(parents=True)
        shutil.copytree(STOCK_SQUID, etc, symlinks=True)
        (stubs / "systemctl").write_text(f"#!/bin/sh\necho \"systemctl $*\" >> {root}/systemctl.calls\n"
                                         "case \"$1\" in is-active) exit 3;; esac\nexit 0\n")
        (stubs / "systemctl").chmod(0o755)
        (root / "startup.sh").write_text(script)
        inner = (serve_in_shell(root / "metadata-ready", external)
                 + f"mount --bind {etc} /etc/squid && mount -t tmpfs tmpfs /etc/systemd/system && "
                 f"PATH={stubs}:/usr/bin:/bin sh {root}/startup.sh > {log} 2>&1; status=$?; kill $metadata; "
                 "exit $status")
        result = subprocess.run(self.vpc.command(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                                  inner]), capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise DaemonStartError(f"{name}: its startup-script failed ({result.returncode}): "
                                   f"{log.read_text(errors='replace')[-2000:]}{result.stderr[-500:]}")
        return etc, log

    @staticmethod
    def _squid_config(etc: Path, address: str, port: int) -> str:
        """The instance's squid.conf (the policy around Debian's), its paths moved to the copy and
        the package's ``http_port 3128`` replaced by the instance's address and port."""
        for path in (etc / "squid.conf", etc / "egress-proxies" / "squid.conf", etc / "egress-proxies" / "refresh"):
            path.write_text(path.read_text().replace("/etc/squid/", f"{etc}/"))
        stock = etc / "squid.conf"
        stock.write_text(stock.read_text().replace("\nhttp_port 3128\n", "\n"))
        return f"http_port {address}:{port}\n" + (etc / "egress-proxies" / "squid.conf").read_text()

    # -- the VPC firewall as a packet filter ------------------------------------------------------

    def _apply_filter(self, instances: list[GuestView], rules: list[dict[str, Any]]) -> None:
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
                 "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
        for instance in instances:
            # Matched on the destination the client dialled, before the edge's translation.
            match = (f"-A INPUT -p tcp -m conntrack --ctstate NEW --ctorigdst {instance.address}/32 "
                     f"--ctorigdstport {instance.port}")
            if instance.external:  # at an external address, what the internet does not route never arrives
                lines += [f"{match} -s {network} -j DROP" for network in UNROUTED_SOURCES if network.version == 4]
            for allows, ranges in decisions(rules, instance.network, instance.tags, instance.port):
                for source in ranges:
                    if ipaddress.ip_network(source, strict=False).version == 4:
                        lines.append(f"{match} -s {source} -j {'ACCEPT' if allows else 'DROP'}")
            lines.append(f"{match} -j DROP")  # the implied deny
        text = "\n".join([*lines, "COMMIT", ""])
        if text != self.packet_filter:
            run_checked(self.vpc.command(["iptables-restore"]), stdin=text)
            self.packet_filter = text
