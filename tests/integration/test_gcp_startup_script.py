"""A GCP proxy on a stock image: what boots (the Compute emulator's image model) and what the
provider's startup-script then does (run for real, as root, in a private mount namespace).

Debian's GCE images run the metadata ``startup-script`` (Google's guest agent) and no
``user-data`` (no cloud-init): a Proxy whose cloudInit says ``packages: [squid]`` gets no squid
there, so the provider's script installs it. Ubuntu's images run both: the script waits for
cloud-init, whose user-data may install squid, and installs nothing then.

The script runs with ``/etc/squid`` and ``/etc/systemd/system`` fresh tmpfs and ``/usr/sbin``
hidden (this machine's squid is not "installed" for it, and its systemd is not touched), in a
network namespace of its own: its NIC holds only its internal address (as a VM's does), a
metadata server on 169.254.169.254 says its external address, and it has a way out (a default
route, on a veth pair that ends in the same namespace: nothing leaves it) exactly when the
Compute emulator says the instance has one (``BootReport.egress``: an external address or its
region's Cloud NAT). ``apt-get``, ``cloud-init``, ``systemctl`` and ``sleep`` are stubs on its
PATH that log their calls (no package index is reachable here, and nothing may be installed on
this machine); the ``apt-get`` stub fails, as apt-get does, when there is no route to its
mirror. What is proved: the order (cloud-init's end, then the install, then the policy files,
whose password file needs the group the package makes), what is installed when, the port
drop-in, no install without a way out, and the external address among the addresses squid
never connects to. That apt really installs Debian's squid, and that squid serves with the
policy and refuses its own addresses, is Debian's packaging and
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
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import CONFIG_PATH, OWN_ADDRESSES
from support.collection.modules import run_module
from support.collection.provider_config import OWNER, OWNER_TAGS
from support.compute.emulator import ComputeEmulator
from support.compute.guest_metadata import serve_in_shell

PROJECT, ZONE, NAME = "test-project", "europe-west1-b", "crawlers-eu-1-3f9c2a"
ACCESS = {"open": True, "allowed_sources": ["10.0.0.0/8"]}
CLOUD_CONFIG = "#cloud-config\npackages: [squid]\n"


@pytest.fixture
def compute() -> Iterator[ComputeEmulator]:
    with ComputeEmulator(project=PROJECT, zones=(ZONE,)) as running:
        yield running


# Where the apt-get stub's package mirror would be (a documentation address: only a route to it is
# looked up, nothing is sent).
MIRROR = "192.0.2.80"
INTERNAL = "10.128.0.2"  # the instance's NIC address


def run_script(tmp_path: Path, script: str, cloud_init: bool, way_out: bool = True,
               external: str | None = None) -> list[str]:
    """Run ``script`` as the guest agent would (root, sh), its NIC holding only its internal
    address (as a VM's does), with a way out when ``way_out`` and a metadata server that says
    ``external``;
    return the stubs' log, in order. The addresses squid then never connects to are left in
    ``tmp_path / "own-addresses"``."""
    if os.geteuid() != 0:
        pytest.fail("the startup-script test needs root (a private mount namespace)")
    stubs, log = tmp_path / "bin", tmp_path / "calls.log"
    stubs.mkdir(parents=True)
    installed = f"printf '#!/bin/sh\\nexit 0\\n' > {stubs}/squid && chmod 755 {stubs}/squid"
    offline = f'ip route get {MIRROR} >/dev/null 2>&1 || {{ echo "apt-get $* (no way out)" >> {log}; exit 100; }}'
    stub_bodies = {
        "apt-get": f'{offline}; echo "apt-get $*" >> {log}; case "$*" in *install*) {installed};; esac',
        "systemctl": f'echo "systemctl $*" >> {log}; case "$1" in is-active) exit 3;; esac',
        "sleep": f'echo "sleep $*" >> {log}',
    }
    if cloud_init:  # cloud-init's final stage runs the user-data, which installs squid
        stub_bodies["cloud-init"] = f'echo "cloud-init $*" >> {log}; {installed}'
    for name, body in stub_bodies.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\nexit 0\n")
        (stubs / name).chmod(0o755)
    (tmp_path / "startup.sh").write_text(script)
    nic = (f"ip link add nic0 type veth peer name nic0p && ip link set nic0p up && "
           f"ip addr add {INTERNAL}/32 dev nic0 && ip link set nic0 up && "
           f"{'ip route add default dev nic0 && ' if way_out else ''}true || exit 1; ")
    metadata = serve_in_shell(tmp_path / "metadata-ready", external)
    inner = (f"{nic}{metadata}mount -t tmpfs tmpfs /etc/squid && mount -t tmpfs tmpfs /usr/sbin && "
             f"mount -t tmpfs tmpfs /etc/systemd/system && "
             f"PATH={stubs}:/usr/bin:/bin sh {tmp_path}/startup.sh; "
             f"[ -f {CONFIG_PATH} ] && echo policy-written >> {log}; "
             f"cat {PORT_DROPIN_PATH} 2>/dev/null | sed 's/^/port-dropin: /' >> {log}; "
             f"cat {OWN_ADDRESSES} > {tmp_path}/own-addresses 2>/dev/null; kill $metadata")
    result = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", inner],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_a_stock_debian_image_gets_squid_from_the_startup_script(tmp_path: Path, compute: ComputeEmulator) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": {
        "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"},
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
        "apiEndpoint": compute.endpoint}}]}))
    created = run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", "name": NAME,
                                       "tags": OWNER_TAGS, "user_data": CLOUD_CONFIG, "access": ACCESS})
    assert created.status == "successful", json.dumps(created.result)
    boot = compute.boot(ZONE, NAME)
    assert boot.user_data is None  # nothing on Debian's GCE image reads it
    assert boot.startup_script is not None
    assert boot.egress is not None and boot.egress.startswith("203.0.113.")  # its external address
    calls = run_script(tmp_path, boot.startup_script, cloud_init=False, way_out=boot.internet, external=boot.egress)
    # apt installs squid (its package configuration serves localhost only), then the policy is
    # written and systemd learns squid's new unit drop-in.
    assert calls[:3] == ["apt-get -q -o DPkg::Lock::Timeout=600 update",
                         "apt-get -q -y -o DPkg::Lock::Timeout=600 install squid",
                         "systemctl enable --now squid"], calls
    assert "systemctl daemon-reload" in calls[3:] and calls[-1] == "policy-written", calls
    # Issue 38 row 1: its external address (on none of its interfaces: the metadata server says it)
    # is among the addresses squid never connects to, with the ones its interfaces have; squid was
    # reloaded onto it (tests/integration/test_squid_access.py refuses every own address for real).
    own = (tmp_path / "own-addresses").read_text().split()
    assert boot.egress in own and INTERNAL in own, own
    assert calls[-2] == "systemctl try-reload-or-restart squid", calls


def test_without_an_external_address_or_cloud_nat_squid_never_installs(tmp_path: Path,
                                                                        compute: ComputeEmulator) -> None:
    # externalIP: false on a network without Cloud NAT: the instance boots with no way out, so the
    # startup-script's apt-get fails every try (issue 39 row 2). With a Cloud NAT in the region the
    # same instance installs squid, and leaves from the NAT's address.
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": OWNER, "providers": [{"name": "cloud", "type": "gcp",
        "allowedSources": ["198.51.100.0/24"], "gcp": {
        "project": PROJECT, "zones": [ZONE], "machineTypes": {"small": "e2-small"}, "externalIP": False,
        "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
        "apiEndpoint": compute.endpoint}}]}))
    created = run_module("gcp_proxy", {"provider_config": str(config), "provider": "cloud", "name": NAME,
                                       "tags": OWNER_TAGS, "access": ACCESS})
    assert created.status == "successful", json.dumps(created.result)
    boot = compute.boot(ZONE, NAME)
    assert boot.startup_script is not None and boot.egress is None
    offline = run_script(tmp_path / "offline", boot.startup_script, cloud_init=False, way_out=boot.internet)
    assert [call for call in offline if call.startswith("apt-get")] == [
        "apt-get -q -o DPkg::Lock::Timeout=600 update (no way out)"] * 5, offline
    assert "systemctl enable --now squid" not in offline and "policy-written" not in offline, offline
    assert (tmp_path / "offline" / "own-addresses").read_text() == ""  # squid never installed: no policy either

    compute.add_cloud_nat("europe-west1", ("198.51.100.20",))
    boot = compute.boot(ZONE, NAME)
    assert boot.egress == "198.51.100.20" and boot.startup_script is not None
    online = run_script(tmp_path / "online", boot.startup_script, cloud_init=False, way_out=boot.internet)
    assert "apt-get -q -y -o DPkg::Lock::Timeout=600 install squid" in online and online[-1] == "policy-written"


def test_where_cloud_init_installs_squid_the_script_waits_and_installs_nothing(tmp_path: Path) -> None:
    calls = run_script(tmp_path, startup_script(parse_access(ACCESS), 3128), cloud_init=True)
    assert calls[0] == "cloud-init status --wait" and calls[-1] == "policy-written", calls
    assert not [call for call in calls if call.startswith("apt-get")], calls


def test_a_squid_installed_for_another_port_listens_on_it(tmp_path: Path) -> None:
    calls = run_script(tmp_path, startup_script(None, 8080), cloud_init=False)
    assert "apt-get -q -y -o DPkg::Lock::Timeout=600 install squid" in calls
    assert calls[-1] == "port-dropin: http_port 8080"
