"""``--check-config`` on GCP providers through the real command, against the Compute emulator
(issue 39 rows 1 and 2): per provider what will be reachable from where, and a network whose
instances would have no way out (neither external addresses nor a Cloud NAT) found before any
Proxy is made. Nothing is sent anywhere but the emulator on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support.collection.modules import collections_path
from support.collection.provider_config import OWNER
from support.compute.emulator import ComputeEmulator
from support.netns.probe_target import EGRESS_PROXIES

ZONES = ("europe-west1-b", "europe-west4-a")


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(zones=ZONES) as emulator:
        yield emulator


def check_config(tmp_path: Path, document: dict[str, object]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
    return subprocess.run([EGRESS_PROXIES, "--check-config", "--provider-config", str(path), "--source", "directory",
                           "--proxy-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_check_config_says_who_reaches_what_and_finds_a_network_without_a_way_out(
        tmp_path: Path, compute: ComputeEmulator) -> None:
    def gcp(**settings: object) -> dict[str, object]:
        return {"project": "test-project", "zones": list(ZONES), "machineTypes": {"small": "e2-small"},
                "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
                "apiEndpoint": compute.endpoint, **settings}

    document: dict[str, object] = {"owner": OWNER, "probeSources": ["192.0.2.10/32"], "providers": [
        {"name": "public", "type": "gcp", "allowedSources": ["198.51.100.0/24"], "gcp": gcp()},
        {"name": "inside", "type": "gcp", "gcp": gcp(externalIP=False)}]}
    checked = check_config(tmp_path, document)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[:2] == ["provider public (gcp): ok", "provider inside (gcp): NOT USABLE"], checked.stdout
    assert lines[2].startswith("  providers[1].gcp.externalIP: false, but network default has no Cloud NAT in "
                               "region(s) europe-west1, europe-west4: instances there would have no way out"), lines[2]
    section = lines[lines.index("reachability:"):]
    assert section[:5] == [
        "reachability:", "  provider public:",
        "    proxies: at their external IPv4 addresses, each on its Proxy's port (default 3128), from the internet",
        ("    crawlers from: 198.51.100.0/24 (allowedSources, or a Proxy's own spec.allowedSources; the managed "
        "firewall rule and squid admit exactly these)"),
        ("    the controller's probe from: 192.0.2.10/32 (probeSources; admitted on every instance besides the "
        "crawlers' sources)")], checked.stdout
    assert section[5] == "  provider inside:" and "(externalIP: false)" in section[6]
    assert lines[-1].endswith("1 error(s)")

    compute.add_cloud_nat("europe-west1", ("198.51.100.20",))
    compute.add_cloud_nat("europe-west4", ("198.51.100.30",), name="nat-4")
    checked = check_config(tmp_path, document)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[-1].endswith(": valid")

    # Public without the crawlers' sources: refused, naming the field and the fix.
    del document["providers"][0]["allowedSources"]  # type: ignore[index]
    checked = check_config(tmp_path, document)
    assert checked.returncode == 1
    assert "  providers[0].allowedSources: required: gcp.externalIP is true (the default)" in checked.stdout
