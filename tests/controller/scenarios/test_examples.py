"""Every example of controller/examples/ serves as written (issue 40 item 7): each file, unchanged,
through the real ``egress-proxies`` command (directory source) with the provider config the docs
give for its provider, its values set to this test's world only.

- ``proxy-minimal.yaml`` (Kubernetes): the production page's test applies it in the cluster the
  page deploys (tests/packaging/test_deploy_controller.py): Ready, and a crawler's 204 through it;
- ``proxy-kvm-squid.yaml`` and ``proxy-jinja-template.yaml`` (KVM): placed on README's host
  ``beelink`` by the KVM provider, here a libvirtd serving libvirt's test driver (its guests do not
  boot: scripts/demo.py, run by tests/integration/test_demo.py, takes ``proxy-kvm-squid.yaml``
  unchanged to Ready on a real guest and a crawler's 204 through it), Ready as a KVM Proxy without
  a probe is once its domain runs;
- ``proxypool-kvm-gcp.yaml``: its six members spread 2:1 over README's ``home-kvm`` (the test
  driver) and docs/gcp-provider.md's ``gcp-eu`` (the Compute emulator, whose instances boot their
  startup-script's squid in the test's namespaces: tests/support/compute/gcp_world.py); the GCP
  members go Ready on the controller's own probe and a crawler gets its 204 through one.

The KVM provider's probe is ``none`` here: the test driver's addresses are made up and nothing is
ever sent to them (and ``--probe-allow`` admits only the GCP instances' addresses).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import REPO
from support.collection.provider_config import BaseImage
from support.compute.emulator import ComputeEmulator
from support.compute.gcp_world import CRAWLER, TARGET, Controller, GcpWorld
from support.compute.guests import ComputeGuests
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.netns.probe_target import ProbeTargetProcess

pytestmark = pytest.mark.timeout(420)

EXAMPLES = REPO / "controller" / "examples"
TEST_DRIVER_POOL = "default-pool"
GCP_EXTERNAL = ("203.0.113.31", "203.0.113.32", "203.0.113.33", "203.0.113.34")
# Where each example is shown serving: a new example must be added here, and to a test.
COVERED = {"proxy-minimal.yaml": "tests/packaging/test_deploy_controller.py",
           "proxy-kvm-squid.yaml": __name__, "proxy-jinja-template.yaml": __name__,
           "proxypool-kvm-gcp.yaml": __name__}


def doc_block(path: Path, pattern: str) -> dict[str, Any]:
    """The YAML block of ``path`` that ``pattern`` (a regular expression with one group) finds."""
    found = re.search(pattern, path.read_text(), re.S)
    assert found is not None, f"{path} has no block matching {pattern!r}"
    document = yaml.safe_load(found.group(1))
    assert isinstance(document, dict)
    return document


def readme_kvm_provider(uri: str, image: BaseImage) -> dict[str, Any]:
    """README's ``home-kvm`` provider, set to this test's world: the host ``beelink`` is the
    test-driver daemon (its pool), the image this test's file, no ``ssh`` (a local socket), probe
    ``none`` (made-up addresses). No other key changes."""
    (provider,) = doc_block(REPO / "README.md", r"```yaml\n(owner: .*?- name: home-kvm.*?)```")["providers"]
    (host,) = provider["kvm"]["hosts"]
    host.update(uri=uri, pool=TEST_DRIVER_POOL)
    provider["kvm"]["images"]["debian-12"] = {"url": image.url, "sha256": image.sha256, "format": "qcow2"}
    del provider["kvm"]["ssh"]
    provider["probe"] = "none"
    return dict(provider)


def our_domains(daemon: LibvirtTestDaemon) -> dict[str, str]:
    """The domains the controller made on the test driver: name -> XML."""
    return {d.name(): d.XMLDesc() for d in daemon.connection.listAllDomains() if d.name() != "test"}


def test_every_example_is_one_a_test_serves() -> None:
    assert {path.name for path in EXAMPLES.iterdir()} == set(COVERED)


def test_the_kvm_proxy_examples_are_placed_on_the_readme_host(libvirt_test: LibvirtTestDaemon, image: BaseImage,
                                                              tmp_path: Path) -> None:
    document = {"owner": "prod-cluster-1", "providers": [readme_kvm_provider(libvirt_test.uri, image)]}
    controller = Controller(tmp_path, document, ["127.0.0.1/32"])
    names = {}
    for example in ("proxy-kvm-squid.yaml", "proxy-jinja-template.yaml"):
        (controller.proxies / example).write_bytes((EXAMPLES / example).read_bytes())
        names[example.removesuffix(".yaml")] = yaml.safe_load((EXAMPLES / example).read_text())
    with controller:
        for stem in names:
            controller.wait(f"{stem} placed and running",
                            lambda stem=stem: controller.status(stem).get("phase") == "Ready")
    domains = our_domains(libvirt_test)
    assert len(domains) == 2
    for stem, proxy in names.items():
        status = controller.status(stem)
        assert status["location"] == "beelink" == proxy["spec"]["location"], status
        assert str(status["providerID"]).startswith("kvm://hosts/beelink/"), status
        assert str(status["providerID"]).rsplit("/", 1)[1] in domains
        assert status["endpoint"].endswith(f":{proxy['spec']['port']}"), status


def test_the_pool_example_spreads_over_kvm_and_gcp_and_serves_a_crawler(
        libvirt_test: LibvirtTestDaemon, image: BaseImage, tmp_path: Path) -> None:
    gcp_document = doc_block(REPO / "docs" / "gcp-provider.md", r"The minimal config.*?```yaml\n(.*?)```")
    (gcp,) = gcp_document["providers"]
    settings = gcp["gcp"]
    emulator = ComputeEmulator(project=settings["project"], zones=tuple(settings["zones"]),
                               external_addresses=list(GCP_EXTERNAL))  # it hands them out (pops)
    pool = yaml.safe_load((EXAMPLES / "proxypool-kvm-gcp.yaml").read_text())
    with GcpWorld() as world, emulator as compute, ProbeTargetProcess(world.inet, address=TARGET, tunnel_port=443) \
            as target, ComputeGuests(compute, world.vpc) as guests:
        for address in GCP_EXTERNAL:
            world.external(address)
        settings["apiEndpoint"] = compute.endpoint
        gcp["probe"] = {**gcp["probe"], "httpUrl": target.url(), "keyFile": str(target.key_file)}
        document = {**gcp_document, "providers": [readme_kvm_provider(libvirt_test.uri, image), gcp]}
        controller = Controller(tmp_path, document, [f"{address}/32" for address in GCP_EXTERNAL])
        (controller.proxies / "proxypool-kvm-gcp.yaml").write_bytes((EXAMPLES / "proxypool-kvm-gcp.yaml").read_bytes())
        with controller:
            controller.wait("the pool's six members Ready",
                            lambda: controller.status("proxypool-kvm-gcp").get("readyReplicas") == 6,
                            diagnostics=lambda: f"pool: {controller.status('proxypool-kvm-gcp')}\n"
                                                f"guests: {guests.errors}")
            assert guests.errors == []
            members = [yaml.safe_load(path.read_text()) for path in controller.proxies.glob("eu-*.yaml")
                       if not path.name.endswith(".status.yaml")]
            providers = sorted(member["spec"]["provider"] for member in members)
            assert providers == ["gcp-eu"] * 2 + ["home-kvm"] * 4  # weights 2:1 of six
            assert pool["spec"]["replicas"] == 6 and len(our_domains(libvirt_test)) == 4
            on_gcp = [entry for entry in controller.discovery() if entry["endpoint"].split(":")[0] in GCP_EXTERNAL]
            assert len(on_gcp) == 2 and all(entry["serving"] == "True" for entry in on_gcp), on_gcp
            # A crawler in the GCP provider's allowedSources, through a member discovery hands out.
            assert world.crawl(CRAWLER, on_gcp[0]["url"], f"http://{TARGET}:8080/generate_204") == "204"
