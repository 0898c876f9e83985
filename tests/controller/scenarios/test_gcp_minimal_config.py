"""The minimal GCP config of docs/gcp-provider.md, applied by the real ``egress-proxies`` command
against the Compute emulator with a network (issue 39 item 7, and row 1 of issue 38 for GCP).

The config is the docs' block as written; the test adds only what points at its own world: the
emulator's ``apiEndpoint`` and its probe target for ``probe.httpUrl``/``keyFile``. The world, all
in network namespaces the test makes (nothing is sent anywhere else):

- ``inet`` plays the internet: the crawler at 198.51.100.7 (in the config's ``allowedSources``),
  a stranger at 192.0.2.99 (not), and the probe target at 198.51.100.80 (HTTP on 8080, its
  CONNECT target on 443). The controller, in the root namespace, reaches the internet through it
  and leaves from 192.0.2.10, the config's ``probeSources`` (a source NAT, as a controller behind
  its own NAT gateway would);
- ``vpc`` plays the VPC: the instance's external address (handed out by the emulator), its squid
  booted from its own startup-script, and the VPC firewall as a packet filter written from the
  emulator's rules (tests/support/compute/guests.py).

Shown: the Proxy goes Ready on the controller's own probe (through the endpoint discovery hands
out, from the probe source the config names); the crawler gets its 204 through that endpoint with
the credentials discovery gives it; the stranger's connection is dropped before squid (nothing in
squid's log); and a request for the instance's own external address is refused (issue 38 row 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.collection.modules import collections_path
from support.compute.emulator import ComputeEmulator
from support.compute.guests import ComputeGuests
from support.netns.namespace import NetworkNamespace
from support.netns.probe_target import EGRESS_PROXIES, ProbeTargetProcess
from support.process import run_checked
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

DOC = Path(__file__).resolve().parents[3] / "docs" / "gcp-provider.md"
EXTERNAL = "203.0.113.10"  # the instance's external address, as the emulator hands it out
CRAWLER, STRANGER, TARGET, PROBE_SOURCE = "198.51.100.7", "192.0.2.99", "198.51.100.80", "192.0.2.10"
LINK_INET, LINK_VPC = "198.18.0.1", "198.18.0.2"  # the internet's and the VPC's ends of their link
TOKEN = "gcp-minimal-crawler-token"


def minimal_config() -> dict[str, Any]:
    """The YAML block after "The minimal config" in docs/gcp-provider.md."""
    text = DOC.read_text()
    block = re.search(r"The minimal config.*?```yaml\n(.*?)```", text, re.DOTALL)
    assert block is not None, "docs/gcp-provider.md has no minimal config block"
    document = yaml.safe_load(block.group(1))
    assert isinstance(document, dict)
    return document


@pytest.fixture
def world() -> Iterator[tuple[NetworkNamespace, NetworkNamespace]]:
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces); run the tests as root, as CI does", pytrace=False)
    with NetworkNamespace() as inet, NetworkNamespace() as vpc:
        inet.link(vpc, LINK_INET, LINK_VPC)
        vpc.route("default", LINK_INET)
        inet.route(f"{EXTERNAL}/32", LINK_VPC)
        for address in (CRAWLER, STRANGER, TARGET):
            inet.add_address(address)
        run_checked(inet.command(["sysctl", "-qw", "net.ipv4.ip_forward=1"]))
        run_checked(inet.command(["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", inet.gateway, "-d",
                                  f"{EXTERNAL}/32", "-j", "SNAT", "--to-source", PROBE_SOURCE]))
        # The root namespace reaches the instance and the target through the internet namespace;
        # these routes go with its veth when it is deleted.
        for address in (EXTERNAL, TARGET):
            run_checked(["ip", "route", "replace", f"{address}/32", "via", inet.address])
        yield inet, vpc


def crawl(inet: NetworkNamespace, source: str, proxy: str, url: str) -> str:
    """curl from ``source`` in the internet namespace through ``proxy``: the HTTP status, or
    curl's exit code when it got none (28: the connection timed out)."""
    result = subprocess.run(inet.command(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--interface",
                                          source, "--connect-timeout", "3", "-m", "10", "-x", proxy, url]),
                            capture_output=True, text=True, timeout=30, check=False)
    return result.stdout if result.returncode == 0 else f"curl exit {result.returncode}"


def discovery(port: int) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/proxies",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        body = json.loads(answer.read())
    return list(body["proxies"] if isinstance(body, dict) else body)


def status(proxies: Path, name: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load((proxies / f"{name}.status.yaml").read_text()) or {}
    except (FileNotFoundError, yaml.YAMLError):
        return {}
    return dict(document.get("status") or {})


def test_the_documented_minimal_config_serves_a_crawler_on_the_internet(
        tmp_path: Path, world: tuple[NetworkNamespace, NetworkNamespace]) -> None:
    inet, vpc = world
    document = minimal_config()
    (provider,) = document["providers"]
    gcp = provider["gcp"]
    with ComputeEmulator(project=gcp["project"], zones=tuple(gcp["zones"]), external_addresses=[EXTERNAL]) as compute, \
            ProbeTargetProcess(inet, address=TARGET, tunnel_port=443) as target, \
            ComputeGuests(compute, vpc) as guests:
        gcp["apiEndpoint"] = compute.endpoint
        provider["probe"] = {**provider["probe"], "httpUrl": target.url(), "keyFile": str(target.key_file)}
        config, proxies, tokens = tmp_path / "providers.yaml", tmp_path / "proxies", tmp_path / "tokens.yaml"
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        proxies.mkdir()
        (proxies / "eu-1.yaml").write_text(yaml.safe_dump({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "eu-1", "namespace": "crawlers"}, "spec": {"provider": provider["name"]}}))
        tokens.write_text(yaml.safe_dump([{"name": "crawlers", "namespaces": ["crawlers"],
                                           "sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]))
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        log = tmp_path / "controller.log"
        command = [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(proxies), "--provider-config",
                   str(config), "--work-dir", str(tmp_path / "work"), "--listen", f"127.0.0.1:{port}",
                   "--interval", "2", "--probe-interval", "1", "--probe-allow", f"{EXTERNAL}/32",
                   "--discovery-tokens", str(tokens)]
        with open(log, "ab") as output:
            process = subprocess.Popen(command, env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()},
                                       stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        try:
            def diagnostics() -> str:
                return (f"status: {status(proxies, 'eu-1')}\nguests: {guests.errors}\n"
                        f"{log.read_text(errors='replace')[-3000:]}")

            # Ready on the controller's own probe, through the instance's external address.
            wait_for(lambda: status(proxies, "eu-1").get("phase") == "Ready", 300, "eu-1 to be Ready", 0.5,
                     diagnostics, process=process)
            assert guests.errors == []
            serving = next(c for c in status(proxies, "eu-1")["conditions"] if c["type"] == "Serving")
            assert serving["status"] == "True", serving
            guest = guests.guests[next(iter(guests.guests))]
            assert guest.address == EXTERNAL
            assert any(PROBE_SOURCE in line for line in guest.squid.access_log())  # the probe came from there

            (entry,) = discovery(port)
            assert entry["endpoint"] == f"{EXTERNAL}:3128" and entry["serving"] == "True", entry
            url = entry["url"]
            assert url.startswith("http://") and url.endswith(f"@{EXTERNAL}:3128"), "credentials in the URL"

            # A crawler in allowedSources gets its 204 through that endpoint.
            assert crawl(inet, CRAWLER, url, f"http://{TARGET}:8080/generate_204") == "204"
            # A stranger outside them never gets to squid: dropped by the firewall, nothing logged.
            assert crawl(inet, STRANGER, url, f"http://{TARGET}:8080/generate_204") == "curl exit 28"
            assert not any(STRANGER in line for line in guest.squid.access_log())
            # It was the firewall: a rule admitting the stranger's address lets it reach squid, whose
            # own source check then refuses it (403, logged).
            tag = compute.instances[(gcp["zones"][0], guest.name)]["tags"]["items"][0]
            compute.firewalls[(gcp["project"], "operator-admits-stranger")] = {
                "name": "operator-admits-stranger", "network": f"projects/{gcp['project']}/global/networks/default",
                "direction": "INGRESS", "priority": 1000, "sourceRanges": [f"{STRANGER}/32"], "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}]}
            wait_for(lambda: f"{STRANGER}/32" in guests.packet_filter, 10, "the packet filter to follow the rules")
            assert crawl(inet, STRANGER, url, f"http://{TARGET}:8080/generate_204") == "403"
            assert any(STRANGER in line for line in guest.squid.access_log())
            # Issue 38 row 1: the instance's own external address is no destination.
            assert crawl(inet, CRAWLER, url, f"http://{EXTERNAL}:3128/") == "403"
            assert EXTERNAL in (guest.startup_log.read_text())
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
