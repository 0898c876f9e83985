"""The predecessor's release validation, automated: a real hypervisor, a real guest, a real proxy.

A hypervisor host (libvirtd with qemu under software emulation, an isolated libvirt network with
DHCP and no way out, sshd) lives in a network namespace this test creates and is bootstrapped by
``playbooks/bootstrap_hypervisor.yml``. The controller runs as its own process, as in a cluster,
with the Kubernetes API emulator as its API server, and reaches the host over ``qemu+ssh`` with
the key the bootstrap authorized and the host key it printed. The guest is the Debian 12 image that
``tests/support/guest_image`` builds (cached per machine): cloud-init, squid and, in one
variant, qemu-guest-agent; nothing is fetched at boot.

The test prints its timings (image build, boot to IP, boot to 204, controller overhead);
docs/performance.md records them. Guests boot one after another: CI has two cores.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import libvirt
import pytest
import yaml
from kubernetes import client

from egress_proxies.model import GROUP, PLURAL, VERSION
from support.ansible_modules import collections_path, run_module
from support.guest_agent import agent_answers, guest_exec, read_guest_file
from support.guest_image import guest_image
from support.hypervisor_host import HypervisorHost, bootstrap
from support.kube_emulator import KubeEmulator
from support.libvirt_daemon import stop_process_group, wait_until
from support.provider_config import OWNER, BaseImage, kvm_host, write_kubeconfig, write_kvm_config

pytestmark = pytest.mark.timeout(1800)

HOST = "hv"
NAMESPACE = "crawlers"
SQUID_PORT = 3128
WEB_PORT = 8204
# Under software emulation a guest answers through squid 40-65 s after it starts; a loaded CI
# machine may be twice as slow.
BOOT_SECONDS = 300.0

# The case that broke the predecessor: the user's cloud-config has its own `packages` key and
# writes squid's configuration. It must reach the guest byte for byte (the guest agent comes as
# vendor-data, never merged into it).
CLOUD_INIT = """\
#cloud-config
packages: [squid]
write_files:
- path: /etc/squid/conf.d/zz-crawlers.conf
  permissions: "0644"
  content: |
    # Only the hypervisor's own network may use this proxy.
    acl crawlers src 10.214.0.0/16
    http_access allow crawlers
    http_access deny all
runcmd:
- [systemctl, restart, squid]
"""

# A web server that answers every GET with 204, run inside the host's namespace so the guest
# can reach it on its network's bridge address (the guest has no other way out).
NO_CONTENT_SERVER = """\
import http.server, sys
class NoContent(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(204)
        self.end_headers()
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), NoContent).serve_forever()
"""


@dataclass
class Timings:
    """What the test measured, printed at the end of the module."""

    lines: list[str] = field(default_factory=list)

    def add(self, what: str, seconds: float) -> None:
        self.lines.append(f"{what:<62} {seconds:7.1f} s")


# --- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest) -> Iterator[Timings]:
    found = Timings()
    yield found
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and found.lines:
        # Past pytest's capture, so CI's log shows the figures of a passing run too.
        with capture.global_and_fixture_disabled():
            sys.stdout.write("\nKVM end to end (software emulation, 2 vCPU, 1 GiB):\n")
            sys.stdout.writelines(f"  {line}\n" for line in found.lines)


@pytest.fixture(scope="module")
def images(timings: Timings) -> dict[str, BaseImage]:
    """Both guest image variants; built on the first run on a machine, then taken from the cache."""
    built = {}
    for variant in ("agent", "no-agent"):
        started = time.monotonic()
        built[variant] = guest_image(variant)
        timings.add(f"guest image '{variant}' (build or cache)", time.monotonic() - started)
    return built


@dataclass
class Bootstrapped:
    host: HypervisorHost
    known_hosts_file: Path  # what the role printed and wrote for the controller


@pytest.fixture(scope="module")
def bootstrapped(timings: Timings) -> Iterator[Bootstrapped]:
    """The hypervisor host, bootstrapped by the role: pool and isolated network ``default``."""
    if os.geteuid() != 0:
        pytest.fail("the end-to-end test needs root (network and mount namespaces)", pytrace=False)
    with HypervisorHost() as hypervisor:
        run = bootstrap(hypervisor)
        timings.add("hypervisor bootstrap (playbooks/bootstrap_hypervisor.yml)", run.seconds)
        yield Bootstrapped(hypervisor, run.known_hosts_file)


@pytest.fixture(scope="module")
def web_url(bootstrapped: Bootstrapped) -> Iterator[str]:
    """The 204 server inside the host's namespace, listening on the guests' bridge too."""
    host = bootstrapped.host
    server = subprocess.Popen(
        ["ip", "netns", "exec", host.namespace, sys.executable, "-c", NO_CONTENT_SERVER, str(WEB_PORT)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: host.run_in_namespace(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{WEB_PORT}/"],
                                                 check=False).returncode == 0,
                   what="the 204 server", timeout=30, process=server, logs=[])
        yield f"http://{host.guest_network_address}:{WEB_PORT}/"
    finally:
        stop_process_group(server)


@dataclass
class Controller:
    """``egress-proxies`` as its own process (restartable), on the Kubernetes API emulator."""

    command: list[str]
    log: Path
    health_url: str
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False


@dataclass
class Lab:
    host: HypervisorHost
    config: Path
    key_file: Path
    objects: client.CustomObjectsApi
    controller: Controller
    timings: Timings

    @property
    def conn(self) -> libvirt.virConnect:
        return self.host.connection

    def create_proxy(self, name: str, **spec: Any) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"provider": "lab", "location": HOST, "port": SQUID_PORT, "cloudInit": CLOUD_INIT, **spec}}
        self.objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    def delete_proxy(self, name: str) -> None:
        self.objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

    def proxy(self, name: str) -> dict[str, Any] | None:
        try:
            found = self.objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise
        assert isinstance(found, dict)
        return found

    def status(self, name: str) -> dict[str, Any]:
        proxy = self.proxy(name)
        return dict(proxy.get("status") or {}) if proxy else {}

    def ready_condition(self, name: str) -> dict[str, Any]:
        conditions = self.status(name).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Ready"), {})

    def domain(self, name: str) -> libvirt.virDomain | None:
        provider_id = self.status(name).get("providerID")
        if not provider_id:
            return None
        try:
            return self.conn.lookupByName(str(provider_id).rsplit("/", 1)[1])
        except libvirt.libvirtError as error:
            if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def pool_volumes(self) -> set[str]:
        pool = self.conn.storagePoolLookupByName("default")
        pool.refresh(0)
        return set(pool.listVolumes())

    def curl_through(self, proxy_ip: str, url: str) -> str:
        """The HTTP status a client in the host's namespace gets for ``url`` through the proxy."""
        result = self.host.run_in_namespace(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "--noproxy", "",
             "-x", f"http://{proxy_ip}:{SQUID_PORT}", url], check=False, timeout=30)
        return result.stdout.strip()


@pytest.fixture(scope="module")
def lab(bootstrapped: Bootstrapped, images: dict[str, BaseImage], kube_module: KubeEmulator, timings: Timings,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    host = bootstrapped.host
    directory = tmp_path_factory.mktemp("e2e")
    # The controller's own copy of the key the role authorized, so the negative step can take
    # it away; the known_hosts file is the one the role wrote.
    key_file = directory / "kvm-ssh-key"
    key_file.write_bytes(host.controller_key_file.read_bytes())
    key_file.chmod(0o600)
    disk_gib = max(2, math.ceil(max(_virtual_size(image) for image in images.values()) / 2**30))
    config = write_kvm_config(
        directory / "providers.yaml", [kvm_host(HOST, f"qemu+ssh://root@{host.address}/system")],
        images["agent"], ssh={"keyFile": str(key_file), "knownHostsFile": str(bootstrapped.known_hosts_file)},
        machineTypes={"small": {"vcpus": 2, "memoryMiB": 1024, "diskGiB": disk_gib}})
    _add_image(config, "debian-12-no-agent", images["no-agent"])
    port = _free_port()
    controller = Controller(
        command=[str(Path(sys.executable).parent / "egress-proxies"), "--source", "kubernetes",
                 "--kubeconfig", str(write_kubeconfig(directory / "kubeconfig", kube_module.url)),
                 "--provider-config", str(config), "--work-dir", str(directory / "work"),
                 "--interval", "2", "--listen", f"127.0.0.1:{port}", "--log-level", "INFO"],
        log=directory / "controller.log", health_url=f"http://127.0.0.1:{port}/healthz")
    controller.start()
    try:
        with client.ApiClient(client.Configuration(host=kube_module.url)) as api:
            yield Lab(host, config, key_file, client.CustomObjectsApi(api), controller, timings)
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def kube_module() -> Iterator[KubeEmulator]:
    """The API server the controller process talks to, for the whole module."""
    with KubeEmulator() as emulator:
        yield emulator


def _virtual_size(image: BaseImage) -> int:
    info = subprocess.run(["qemu-img", "info", "--output=json", str(image.path)], capture_output=True,
                          check=True, text=True)
    return int(json.loads(info.stdout)["virtual-size"])


def _add_image(config: Path, name: str, image: BaseImage) -> None:
    document = yaml.safe_load(config.read_text())
    document["providers"][0]["kvm"]["images"][name] = {"url": image.url, "sha256": image.sha256, "format": "qcow2"}
    config.write_text(yaml.safe_dump(document, sort_keys=False))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def poll(condition: Callable[[], Any], seconds: float, what: str, lab: Lab, interval: float = 0.5) -> Any:
    """Wait for ``condition`` to return something truthy; fail with the controller's log tail."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = "\n".join(lab.controller.log.read_text(errors="replace").splitlines()[-40:])
            listed = lab.objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
            proxies = cast(dict[str, Any], listed)["items"]
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}\n--- Proxies ---\n"
                                 f"{yaml.safe_dump(proxies)}\n--- controller log ---\n{tail}")
        time.sleep(interval)


@dataclass
class Boot:
    name: str
    domain: libvirt.virDomain
    ip: str
    started: float  # when the domain was seen running


def boot_proxy(lab: Lab, name: str, label: str, **spec: Any) -> Boot:
    """Create a Proxy and follow it to Ready, recording the controller's and the guest's share."""
    created = time.monotonic()
    lab.create_proxy(name, **spec)
    domain = poll(lambda: (d := lab.domain(name)) is not None and d.isActive() and d, 300, f"{name}'s domain", lab)
    running = time.monotonic()
    lab.timings.add(f"{label}: Proxy applied -> domain running (controller)", running - created)
    poll(lambda: lab.status(name).get("phase") == "Ready", BOOT_SECONDS, f"{name} to be Ready", lab)
    lab.timings.add(f"{label}: domain running -> Ready with IP", time.monotonic() - running)
    status = lab.status(name)
    assert status["endpoint"] == f"{status['ip']}:{SQUID_PORT}"
    return Boot(name, domain, str(status["ip"]), running)


def proxies_204(lab: Lab, boot: Boot, web_url: str, label: str) -> None:
    poll(lambda: lab.curl_through(boot.ip, web_url) == "204", BOOT_SECONDS, f"a 204 through {boot.ip}", lab,
         interval=1.0)
    lab.timings.add(f"{label}: domain running -> 204 through squid", time.monotonic() - boot.started)


def delete_and_check_cleanup(lab: Lab, boot: Boot) -> None:
    domain_name = boot.domain.name()
    instance_volumes = {f"{domain_name}.qcow2", f"{domain_name}-seed.iso"}
    before = lab.pool_volumes()
    assert instance_volumes <= before
    bases = {v for v in before if v.startswith("base-")}
    assert bases, before
    started = time.monotonic()
    lab.delete_proxy(boot.name)
    poll(lambda: lab.proxy(boot.name) is None, 120, f"{boot.name} to be deleted", lab)
    lab.timings.add(f"{boot.name}: Proxy deleted -> finalizer released", time.monotonic() - started)
    assert domain_name not in {d.name() for d in lab.conn.listAllDomains(0)}
    # Every volume of the instance is gone; the cached base images stay for the next one.
    assert lab.pool_volumes() == before - instance_volumes
    assert bases <= lab.pool_volumes()


def agent_address(domain: libvirt.virDomain) -> str | None:
    try:
        interfaces = domain.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0) or {}
    except libvirt.libvirtError:
        return None
    for interface in interfaces.values():
        for address in interface.get("addrs") or []:
            if address["type"] == libvirt.VIR_IP_ADDR_TYPE_IPV4 and not address["addr"].startswith("127."):
                return str(address["addr"])
    return None


# --- the tests -------------------------------------------------------------------------------------


def test_a_proxy_boots_serves_recovers_and_leaves_nothing_behind(lab: Lab, web_url: str) -> None:
    # 1. Through the controller and the modules, over qemu+ssh with the host key verified.
    boot = boot_proxy(lab, "eu-1", "with agent")
    # The DHCP lease may name the IP a few seconds before the agent is up; the agent must agree.
    assert poll(lambda: agent_address(boot.domain), BOOT_SECONDS, "the guest agent's IP", lab) == boot.ip
    lab.timings.add("with agent: domain running -> agent reports the IP", time.monotonic() - boot.started)

    # 2. A crawler's request through squid reaches the 204 server.
    proxies_204(lab, boot, web_url, "with agent")

    # 3. Inside the guest, through the agent: cloud-init finished cleanly, the agent runs, and
    #    the Proxy's cloudInit arrived byte for byte.
    finished = guest_exec(boot.domain, ["cloud-init", "status", "--wait", "--long"], timeout=BOOT_SECONDS)
    assert finished.exit_code == 0 and "status: done" in finished.stdout, finished
    result = json.loads(read_guest_file(boot.domain, "/run/cloud-init/result.json"))
    assert result["v1"]["errors"] == [], result
    agent = guest_exec(boot.domain, ["systemctl", "is-active", "qemu-guest-agent"])
    assert agent.stdout.strip() == "active", agent
    assert read_guest_file(boot.domain, "/var/lib/cloud/instance/user-data.txt") == CLOUD_INIT.encode()

    # 4. The info module finds it by its tags.
    listed = run_module("kvm_proxy_info", {"provider_config": str(lab.config), "provider": "lab",
                                           "tags": {"crawl.example.com/owner": OWNER,
                                                    "crawl.example.com/proxy": f"{NAMESPACE}/eu-1"}})
    assert not listed.failed, listed.result
    assert [i["provider_id"] for i in listed.result["instances"]] == [lab.status("eu-1")["providerID"]]
    assert listed.result["instances"][0]["ip"] == boot.ip

    # 5. The SSH key goes away and the controller restarts: it stays up and reports a transient
    #    condition; the key comes back and the Proxy recovers without another restart.
    hidden = lab.key_file.with_name("kvm-ssh-key.away")
    lab.controller.stop()
    lab.key_file.rename(hidden)
    try:
        lab.controller.start()
        condition = poll(lambda: (c := lab.ready_condition("eu-1")).get("status") == "False" and c, 120,
                         "a transient condition", lab)
        assert str(condition["message"]).startswith("transient:"), condition
        assert lab.controller.alive()
    finally:
        hidden.rename(lab.key_file)
    recovered = time.monotonic()
    poll(lambda: lab.ready_condition("eu-1").get("status") == "True", 120, "recovery", lab)
    lab.timings.add("key restored -> Ready again (no restart)", time.monotonic() - recovered)
    assert lab.controller.alive()
    assert lab.status("eu-1")["ip"] == boot.ip

    # 6. Deleting the Proxy removes the domain and every volume of it; the base stays.
    delete_and_check_cleanup(lab, boot)


def test_a_guest_without_the_agent_gets_its_ip_from_the_dhcp_lease(lab: Lab, web_url: str) -> None:
    boot = boot_proxy(lab, "eu-2", "without agent", image="debian-12-no-agent")
    assert not agent_answers(boot.domain)
    leases = lab.conn.networkLookupByName("default").DHCPLeases()
    assert boot.ip in {lease["ipaddr"] for lease in leases}
    proxies_204(lab, boot, web_url, "without agent")
    delete_and_check_cleanup(lab, boot)

