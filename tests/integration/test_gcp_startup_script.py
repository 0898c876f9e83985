"""A GCP proxy on a stock image: what boots (the Compute emulator's image model) and what the
provider's startup-script then does (run for real, as root, in a private mount namespace).

Debian's GCE images run the metadata ``startup-script`` (Google's guest agent) and no
``user-data`` (no cloud-init): a Proxy whose cloudInit says ``packages: [squid]`` gets no squid
there, so the provider's script installs it. Ubuntu's images run both: the script waits for
cloud-init, whose user-data may install squid, and installs nothing then.

The script runs with ``/etc/squid`` and ``/etc/systemd/system`` fresh tmpfs and ``/usr/sbin``
hidden (this machine's squid is not "installed" for it, and its systemd is not touched);
``apt-get``, ``cloud-init`` and ``systemctl`` are stubs on its PATH that log their calls (no
package index is reachable here, and nothing may be installed on this machine). What is proved:
the order (cloud-init's end, then the install, then the policy files, whose password file needs
the group the package makes), what is installed when, and the port drop-in. That apt really
installs Debian's squid, and that squid serves with the policy, is Debian's packaging and
tests/integration/test_squid_access.py (which runs that squid with the very files).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.startup import PORT_DROPIN_PATH, startup_script
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import CONFIG_PATH
from support.collection.modules import run_module
from support.collection.provider_config import OWNER, OWNER_TAGS
from support.compute.emulator import ComputeEmulator

PROJECT, ZONE, NAME = "test-project", "europe-west1-b", "crawlers-eu-1-3f9c2a"
ACCESS = {"open": True, "allowed_sources": ["10.0.0.0/8"]}
CLOUD_CONFIG = "#cloud-config\npackages: [squid]\n"


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(ZONE,)) as running:
        yield running


def run_script(tmp_path: Path, script: str, cloud_init: bool) -> list[str]:
    """Run ``script`` as the guest agent would (root, sh); return the stubs' log, in order."""
    if os.geteuid() != 0:
        pytest.fail("the startup-script test needs root (a private mount namespace)")
    stubs, log = tmp_path / "bin", tmp_path / "calls.log"
    stubs.mkdir()
    installed = f"printf '#!/bin/sh\\nexit 0\\n' > {stubs}/squid && chmod 755 {stubs}/squid"
    stub_bodies = {
        "apt-get": f'echo "apt-get $*" >> {log}; case "$*" in *install*) {installed};; esac',
        "systemctl": f'echo "systemctl $*" >> {log}; case "$1" in is-active) exit 3;; esac',
    }
    if cloud_init:  # cloud-init's final stage runs the user-data, which installs squid
        stub_bodies["cloud-init"] = f'echo "cloud-init $*" >> {log}; {installed}'
    for name, body in stub_bodies.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\nexit 0\n")
        (stubs / name).chmod(0o755)
    (tmp_path / "startup.sh").write_text(script)
    inner = (f"mount -t tmpfs tmpfs /etc/squid && mount -t tmpfs tmpfs /usr/sbin && "
             f"mount -t tmpfs tmpfs /etc/systemd/system && "
             f"PATH={stubs}:/usr/bin:/bin sh {tmp_path}/startup.sh; "
             f"[ -f {CONFIG_PATH} ] && echo policy-written >> {log}; "
             f"cat {PORT_DROPIN_PATH} 2>/dev/null | sed 's/^/port-dropin: /' >> {log}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_a_stock_debian_image_gets_squid_from_the_startup_script(tmp_path: Path, compute: ComputeEmulator) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp", "gcp": {
        "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
        "apiEndpoint": compute.endpoint}}]}))
    created = run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", "name": NAME,
                                       "tags": OWNER_TAGS, "user_data": CLOUD_CONFIG, "access": ACCESS})
    assert created.status == "successful", json.dumps(created.result)
    boot = compute.boot(ZONE, NAME)
    assert boot.user_data is None  # nothing on Debian's GCE image reads it
    assert boot.startup_script is not None
    calls = run_script(tmp_path, boot.startup_script, cloud_init=False)
    # apt installs squid (its package configuration serves localhost only), then the policy is
    # written and systemd learns squid's new unit drop-in.
    assert calls[:3] == ["apt-get -q -o DPkg::Lock::Timeout=600 update",
                         "apt-get -q -y -o DPkg::Lock::Timeout=600 install squid",
                         "systemctl enable --now squid"], calls
    assert "systemctl daemon-reload" in calls[3:] and calls[-1] == "policy-written", calls


def test_where_cloud_init_installs_squid_the_script_waits_and_installs_nothing(tmp_path: Path) -> None:
    calls = run_script(tmp_path, startup_script(parse_access(ACCESS), 3128), cloud_init=True)
    assert calls[0] == "cloud-init status --wait" and calls[-1] == "policy-written", calls
    assert not [call for call in calls if call.startswith("apt-get")], calls


def test_a_squid_installed_for_another_port_listens_on_it(tmp_path: Path) -> None:
    calls = run_script(tmp_path, startup_script(None, 8080), cloud_init=False)
    assert "apt-get -q -y -o DPkg::Lock::Timeout=600 install squid" in calls
    assert calls[-1] == "port-dropin: http_port 8080"
