"""A GCP deployment in network namespaces, for the real ``egress-proxies`` command against the
Compute emulator (tests/controller/scenarios/test_gcp_*.py). Nothing is sent anywhere but
loopback and these namespaces.

- ``inet`` plays the internet: the crawler at ``CRAWLER`` (in the docs' ``allowedSources``), a
  stranger at ``STRANGER`` (not), the probe target at ``TARGET``. The controller, in the root
  namespace, reaches the instances' external addresses through it and leaves from
  ``PROBE_SOURCE``, the docs' ``probeSources`` (a source NAT, as behind its own NAT gateway);
- ``vpc`` plays the VPC network, linked to the internet (``LINK_INET``/``LINK_VPC``): the
  instances, booted by :class:`~support.compute.guests.ComputeGuests`. The controller reaches
  internal addresses over the namespace's own veth, as from inside the VPC.

:class:`Controller` runs the command on a directory of Proxies (and ProxyPools) with a crawler
token for discovery.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from support.collection.modules import collections_path
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import EGRESS_PROXIES
from support.process import run_checked
from support.waiting import wait_for

CRAWLER, STRANGER, TARGET, PROBE_SOURCE = "198.51.100.7", "192.0.2.99", "198.51.100.80", "192.0.2.10"
LINK_INET, LINK_VPC = "198.18.0.1", "198.18.0.2"
TOKEN = "gcp-world-crawler-token"


class GcpWorld:
    """The two namespaces and their routes (a context manager)."""

    def __init__(self) -> None:
        self.inet = NetworkNamespace()
        self.vpc = NetworkNamespace()

    def __enter__(self) -> GcpWorld:
        if os.geteuid() != 0:
            raise PermissionError("needs root (network namespaces); run the tests as root, as CI does")
        try:
            self.inet.start()
            self.vpc.start()
            self.inet.link(self.vpc, LINK_INET, LINK_VPC)
            self.vpc.route("default", LINK_INET)
            for address in (CRAWLER, STRANGER, TARGET):
                self.inet.add_address(address)
            run_checked(self.inet.command(["sysctl", "-qw", "net.ipv4.ip_forward=1"]))
            # Root routes go with the namespaces' veths when they are deleted.
            run_checked(["ip", "route", "replace", f"{TARGET}/32", "via", self.inet.address])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.vpc.stop()
        self.inet.stop()

    def external(self, address: str) -> None:
        """An instance's external address: the internet routes it to the VPC, and the controller
        reaches it through the internet, from ``PROBE_SOURCE``."""
        self.inet.route(f"{address}/32", LINK_VPC)
        run_checked(self.inet.command(["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", self.inet.gateway, "-d",
                                       f"{address}/32", "-j", "SNAT", "--to-source", PROBE_SOURCE]))
        run_checked(["ip", "route", "replace", f"{address}/32", "via", self.inet.address])

    def internal(self, address: str) -> None:
        """An instance's internal address: the controller reaches it from inside the VPC."""
        run_checked(["ip", "route", "replace", f"{address}/32", "via", self.vpc.address])

    def cloud_nat(self, address: str) -> None:
        """A Cloud NAT's address: the internet routes it back to the VPC."""
        self.inet.route(f"{address}/32", LINK_VPC)

    def crawl(self, source: str, proxy: str, url: str) -> str:
        """curl from ``source`` on the internet through ``proxy``: the HTTP status, or curl's exit
        code when it got none (28: the connection timed out)."""
        result = subprocess.run(self.inet.command([
            "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--interface", source, "--connect-timeout", "3",
            "-m", "10", "-x", proxy, url]), capture_output=True, text=True, timeout=30, check=False)
        return result.stdout if result.returncode == 0 else f"curl exit {result.returncode}"


class Controller:
    """``egress-proxies`` on ``directory`` (Proxies and ProxyPools as files) with the provider
    config ``document``, probing only ``probe_allow``; discovery with a crawler token."""

    def __init__(self, directory: Path, document: dict[str, Any], probe_allow: Sequence[str]) -> None:
        self.directory = directory
        self.proxies = directory / "proxies"
        self.proxies.mkdir(parents=True)
        self.config = directory / "providers.yaml"
        self.config.write_text(yaml.safe_dump(document, sort_keys=False))
        self.tokens = directory / "tokens.yaml"
        self.tokens.write_text(yaml.safe_dump([{"name": "crawlers", "namespaces": ["crawlers"],
                                                "sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]))
        self.log = directory / "controller.log"
        self.probe_allow = list(probe_allow)
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def write(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        (self.proxies / f"{name}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": "crawlers"}, "spec": spec}))

    def status(self, name: str) -> dict[str, Any]:
        """A Proxy's status (``<name>.status.yaml``), or a ProxyPool's (``.<name>.pool.yaml``)."""
        for path in (self.proxies / f"{name}.status.yaml", self.proxies / f".{name}.pool.yaml"):
            try:
                document = yaml.safe_load(path.read_text()) or {}
            except (FileNotFoundError, yaml.YAMLError):  # not written yet, or caught mid-replace
                continue
            return dict(document.get("status") or {})
        return {}

    def discovery(self) -> list[dict[str, Any]]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/proxies",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = json.loads(answer.read())
        return list(body["proxies"] if isinstance(body, dict) else body)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def wait(self, what: str, condition: Any, timeout: float = 300, diagnostics: Any = None) -> None:
        wait_for(condition, timeout, what, 0.5, lambda: f"{diagnostics() if diagnostics else ''}\n{self.log_tail()}",
                 process=self._process)

    def __enter__(self) -> Controller:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            self.port = free.getsockname()[1]
        command = [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(self.proxies), "--provider-config",
                   str(self.config), "--work-dir", str(self.directory / "work"), "--listen", f"127.0.0.1:{self.port}",
                   "--interval", "2", "--probe-interval", "1", "--discovery-tokens", str(self.tokens)]
        command += [argument for network in self.probe_allow for argument in ("--probe-allow", network)]
        env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
        with open(self.log, "ab") as output:
            self._process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *_: object) -> None:
        if self._process is not None:
            os.killpg(self._process.pid, signal.SIGTERM)
            self._process.wait(timeout=60)
            self._process = None
