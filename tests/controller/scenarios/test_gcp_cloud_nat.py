"""GCP proxies without external addresses, behind one Cloud NAT, through the real command
(issue 39 row 2): every proxy of the region leaves from the NAT's address, the status says so
(``egressIP``: what the probe's echo saw, not the internal address the provider reports), and a
ProxyPool with ``distinctEgressIPs`` counts the members behind that one NAT as one address.

The world (tests/support/compute/gcp_world.py): the instances booted in the VPC namespace from
their own startup-scripts at internal addresses the test chose, the region's Cloud NAT a source
NAT there (tests/support/compute/guests.py); the controller probes them from inside the VPC,
through the probe target on the internet, with its egress echo.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.collection.provider_config import OWNER
from support.compute.emulator import ComputeEmulator
from support.compute.gcp_world import TARGET, Controller, GcpWorld
from support.compute.guests import ComputeGuests
from support.netns.probe_target import ProbeTargetProcess

pytestmark = pytest.mark.timeout(600)

ZONE, NAT = "europe-west1-b", "203.0.113.20"
INTERNAL = ("10.128.7.2", "10.128.7.3")


def test_members_behind_one_cloud_nat_leave_from_its_address_and_count_as_one(tmp_path: Path) -> None:
    emulator = ComputeEmulator(project="my-project", zones=(ZONE,), internal_addresses=list(INTERNAL))
    with GcpWorld() as world, emulator as compute, ProbeTargetProcess(world.inet, address=TARGET, tunnel_port=443) \
            as target, ComputeGuests(compute, world.vpc) as guests:
        compute.add_cloud_nat("europe-west1", (NAT,))
        world.cloud_nat(NAT)
        for address in INTERNAL:
            world.internal(address)
        document = {"owner": OWNER, "providers": [{"name": "gcp-nat", "type": "gcp", "probe": target.probe_settings(),
                                                  "gcp": {"project": "my-project", "zones": [ZONE], "externalIP": False,
                                                          "machineTypes": {"small": "e2-small"},
                                                          "images": {"debian-12": "projects/debian-cloud/global/images/"
                                                                                  "family/debian-12"},
                                                          "apiEndpoint": compute.endpoint}}]}
        controller = Controller(tmp_path, document, ["10.128.7.0/24"])
        controller.write("ProxyPool", "eu", {"replicas": 2, "distinctEgressIPs": True, "template": {},
                                             "placement": [{"provider": "gcp-nat"}]})
        with controller:
            def members() -> dict[str, dict[str, object]]:
                return {entry.name.removesuffix(".status.yaml"): controller.status(entry.name.removesuffix(
                    ".status.yaml")) for entry in controller.proxies.glob("eu-*.status.yaml")}

            def diagnostics() -> str:
                return f"members: {members()}\npool: {controller.status('eu')}\nguests: {guests.errors}"

            controller.wait("both members probed, with the egress address their echo saw",
                            lambda: len(members()) == 2 and all(m.get("egressIP") for m in members().values()),
                            diagnostics=diagnostics)
            assert guests.errors == [] and len(guests.guests) == 2
            # The provider reports each instance at its internal address; the probe's echo saw the NAT's.
            statuses = members()
            assert sorted(str(m["ip"]) for m in statuses.values()) == sorted(INTERNAL), statuses
            assert {m["egressIP"] for m in statuses.values()} == {NAT}, statuses
            # distinctEgressIPs: one address among them, so one member counts; the pool says why.
            def distinct() -> dict[str, object]:
                conditions = controller.status("eu").get("conditions") or []
                return next((c for c in conditions if c["type"] == "DistinctEgressIPs"), {})

            controller.wait("the pool to find the members sharing one egress address",
                            lambda: distinct().get("reason") == "EgressIPShared", diagnostics=diagnostics)
            pool, condition = controller.status("eu"), distinct()
            assert condition["status"] == "False" and f"leaves from {NAT}" in str(condition["message"]), condition
            assert (pool["readyReplicas"], pool["egressIPs"]) == (1, 1), pool
