"""The minimal GCP config of docs/gcp-provider.md, applied by the real ``egress-proxies`` command
against the Compute emulator with a network (issue 39 item 7, and row 1 of issue 38 for GCP).

The config is the docs' block as written; the test adds only what points at its own world: the
emulator's ``apiEndpoint`` and its probe target for ``probe.httpUrl``/``keyFile`` (CONNECT on 443,
the default ``connect``). The world (tests/support/compute/gcp_world.py): the crawler at a public
address in ``allowedSources``, a stranger outside them, the controller leaving from the
``probeSources`` address, the instance booted from its own startup-script behind the VPC
firewall as a packet filter written from the emulator's rules (tests/support/compute/guests.py).

Shown: the Proxy goes Ready on the controller's own probe (through the endpoint discovery hands
out, from the probe source the config names); the crawler gets its 204 through that endpoint with
the credentials discovery gives it; the stranger's connection is dropped before squid (nothing in
squid's log), and it was the firewall (a rule admitting it lets it on to squid's own 403); and a
request for the instance's external address is refused (issue 38 row 1: the startup-script learnt
it from the metadata server; here the address is also on the guest's interface, so
tests/integration/test_gcp_startup_script.py proves the metadata path on its own).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.compute.emulator import ComputeEmulator
from support.compute.gcp_world import CRAWLER, PROBE_SOURCE, STRANGER, TARGET, Controller, GcpWorld
from support.compute.guests import ComputeGuests
from support.netns.probe_target import ProbeTargetProcess
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

DOC = Path(__file__).resolve().parents[3] / "docs" / "gcp-provider.md"
EXTERNAL = "203.0.113.10"  # the instance's external address, as the emulator hands it out


def minimal_config() -> dict[str, Any]:
    """The YAML block after "The minimal config" in docs/gcp-provider.md."""
    block = re.search(r"The minimal config.*?```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert block is not None, "docs/gcp-provider.md has no minimal config block"
    document = yaml.safe_load(block.group(1))
    assert isinstance(document, dict)
    return document


def test_the_documented_minimal_config_serves_a_crawler_on_the_internet(tmp_path: Path) -> None:
    document = minimal_config()
    (provider,) = document["providers"]
    gcp = provider["gcp"]
    emulator = ComputeEmulator(project=gcp["project"], zones=tuple(gcp["zones"]), external_addresses=[EXTERNAL])
    with GcpWorld() as world, emulator as compute, ProbeTargetProcess(world.inet, address=TARGET, tunnel_port=443) \
            as target, ComputeGuests(compute, world.vpc) as guests:
        world.external(EXTERNAL)
        gcp["apiEndpoint"] = compute.endpoint
        provider["probe"] = {**provider["probe"], "httpUrl": target.url(), "keyFile": str(target.key_file)}
        controller = Controller(tmp_path, document, [f"{EXTERNAL}/32"])
        controller.write("Proxy", "eu-1", {"provider": provider["name"]})
        with controller:
            # Ready on the controller's own probe, through the instance's external address.
            controller.wait("eu-1 to be Ready", lambda: controller.status("eu-1").get("phase") == "Ready",
                            diagnostics=lambda: f"status: {controller.status('eu-1')}\nguests: {guests.errors}")
            assert guests.errors == []
            serving = next(c for c in controller.status("eu-1")["conditions"] if c["type"] == "Serving")
            assert serving["status"] == "True", serving
            (guest,) = guests.guests.values()
            assert guest.address == EXTERNAL
            assert any(PROBE_SOURCE in line for line in guest.squid.access_log())  # the probe came from there

            (entry,) = controller.discovery()
            assert entry["endpoint"] == f"{EXTERNAL}:3128" and entry["serving"] == "True", entry
            url = entry["url"]
            assert url.startswith("http://") and url.endswith(f"@{EXTERNAL}:3128"), "credentials in the URL"

            # A crawler in allowedSources gets its 204 through that endpoint.
            assert world.crawl(CRAWLER, url, f"http://{TARGET}:8080/generate_204") == "204"
            # A stranger outside them never gets to squid: dropped by the firewall, nothing logged.
            assert world.crawl(STRANGER, url, f"http://{TARGET}:8080/generate_204") == "curl exit 28"
            assert not any(STRANGER in line for line in guest.squid.access_log())
            # It was the firewall: a rule admitting the stranger's address lets it on to squid, whose
            # own source check then refuses it (403, logged).
            tag = compute.instances[(gcp["zones"][0], guest.name)]["tags"]["items"][0]
            compute.firewalls[(gcp["project"], "operator-admits-stranger")] = {
                "name": "operator-admits-stranger", "network": f"projects/{gcp['project']}/global/networks/default",
                "direction": "INGRESS", "priority": 1000, "sourceRanges": [f"{STRANGER}/32"], "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}]}
            wait_for(lambda: f"{STRANGER}/32" in guests.packet_filter, 10, "the packet filter to follow the rules")
            assert world.crawl(STRANGER, url, f"http://{TARGET}:8080/generate_204") == "403"
            assert any(STRANGER in line for line in guest.squid.access_log())
            # Issue 38 row 1: the instance's own external address is no destination.
            assert world.crawl(CRAWLER, url, f"http://{EXTERNAL}:3128/") == "403"
            assert f"refusing this instance's external address {EXTERNAL}" in guest.startup_log.read_text()
