"""The README's first command: the controller on the embedded default, making a proxy VM that serves.

``bash scripts/demo.sh`` runs this with the venv's Python. Without ``--fast``, on this machine:

1. the Debian 12 guest image (squid, cloud-init, qemu-guest-agent), built on first use and cached
   in /var/cache/egress-proxies-tests (the end-to-end tests share that cache);
2. a KVM hypervisor host: libvirtd and sshd in a network namespace of their own, bootstrapped
   by ``playbooks/bootstrap_hypervisor.yml`` (pool, an isolated guest network, the controller's
   SSH key authorized, the host's key written to a known_hosts file);
3. the controller (``egress-proxies --source directory``, the embedded default) on the example
   Proxy ``controller/examples/proxy-kvm-squid.yaml`` (its cloudInit unchanged), until Ready:
   the controller has probed through its squid;
4. the crawler's side: the proxy list from the discovery endpoint with a token scoped to the
   Proxy's namespace, then ``curl -x`` with the credentials it handed out to a small web server
   (-> 204), and without them (-> 407);
5. a timeline and the Proxy's status, then everything it started is removed (the image cache
   stays).

Network rule: the guest's network has no way out of the namespace (no forwarding, no DNS); the
controller, the web server and curl run inside the namespace, and the controller probes only
the guests' /24 (``--probe-allow``). From the root namespace the demo only talks to the
namespace's end of a private veth pair (sshd, the discovery endpoint).

``--fast`` is the seconds-long run on libvirt's test driver: it boots nothing, its addresses
are made up, the provider config says ``probe: none`` and nothing is ever sent to them.

The hypervisor host, guest image and bootstrap come from ``tests/support`` (imported, not
copied): they are the project's one implementation of "a hypervisor in a namespace", kept
working by the end-to-end tests; a second copy here would drift from it. Everything the demo
itself decides (config, Proxies, the crawler's checks, the timeline, clean-up) is in this file.

Ctrl-C (SIGINT), SIGTERM or SIGHUP at any point: everything is stopped and removed.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import waiting  # noqa: E402
from support.hosts.hypervisor_host import HypervisorHost, bootstrap  # noqa: E402
from support.hosts.libvirt_daemon import LibvirtTestDaemon  # noqa: E402
from support.images.guest_image import BUILD_SCRIPT, CACHE_ROOT, cache_key, guest_image  # noqa: E402
from support.process import stop_process_group  # noqa: E402

EXAMPLE = ROOT / "controller" / "examples" / "proxy-kvm-squid.yaml"
PROVIDER, LOCATION = "home-kvm", "beelink"  # what the example Proxies name
WEB_PORT = 8204
# The probe's CONNECT target: Debian's squid.conf tunnels only to port 443.
TUNNEL_PORT = 443
DISCOVERY_PORT = 8080
READY_TIMEOUT = 900.0  # per step; a guest serves ~35 s after it starts on a quiet machine, 10 min at load 12
TEAM = "crawlers-team"

# The web server the crawler's curl fetches from and the probe target in one: the project's own
# ``egress-proxies probe-target`` (204 for any path, ``/echo`` the caller's address), in a namespace
# of its own on the guests' network (host part SITE_HOST, above the DHCP range), not on the host:
# a proxy never reaches the machine it runs on. Its key file lives in the demo's directory, so
# every process the demo starts names that directory (how leftovers are found).
SITE_HOST = 254


class DemoFailed(Exception):
    """A step did not work; the message says which and where its log is."""


def say(line: str = "") -> None:
    print(line, flush=True)  # noqa: T201


def _stop_signal(signum: int, _frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt(signal.Signals(signum).name)


class Timeline:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float]] = []

    def add(self, what: str, seconds: float) -> None:
        self.rows.append((what, seconds))

    def show(self) -> None:
        say("== timeline")
        for what, seconds in self.rows:
            say(f"  {what:<68} {seconds:6.1f} s")


# --- the real thing ------------------------------------------------------------------------------


def image_with_progress(timeline: Timeline) -> Any:
    """The cached guest image; on first use it is built, with a line of progress every 15 s."""
    key = cache_key(BUILD_SCRIPT.read_bytes())
    started = time.monotonic()
    if (CACHE_ROOT / key).is_dir():
        image = guest_image("agent")
        timeline.add("guest image (cached)", time.monotonic() - started)
        say(f"== guest image: cached ({image.path})")
        return image
    log = CACHE_ROOT / f".building-{key}.log"
    say("== guest image: not cached yet, building it once (debootstrap; 2-5 min on two cores)")
    say(f"   log: {log}; cached in {CACHE_ROOT} for every later run")
    done = threading.Event()

    def progress() -> None:
        while not done.wait(15):
            try:
                last = log.read_text(errors="replace").strip().splitlines()[-1]
            except (OSError, IndexError):
                last = "(waiting for another build of the same image)"
            say(f"   {time.monotonic() - started:5.0f} s  {last[:90]}")

    reporter = threading.Thread(target=progress, daemon=True)
    reporter.start()
    try:
        image = guest_image("agent")
    finally:
        done.set()
    timeline.add("guest image (built on first use)", time.monotonic() - started)
    say(f"   built in {time.monotonic() - started:.0f} s")
    return image


def provider_config(path: Path, host: HypervisorHost, known_hosts: Path, image: Any, target: str) -> None:
    bridge = host.guest_network_address
    size = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(image.path)], capture_output=True,
                                     text=True, check=True).stdout)["virtual-size"]
    document = {
        "owner": "demo",
        "providers": [{
            "name": PROVIDER, "type": "kvm",
            # Everything the probe fetches is served by a site on the guests' network (a proxy
            # never reaches the machine it runs on, so not on the host's bridge address).
            "probe": {"httpUrl": f"http://{target}:{WEB_PORT}/generate_204",
                      "keyFile": str(path.with_name("probe.key")), "connect": f"{target}:{TUNNEL_PORT}",
                      "egressEchoUrl": f"http://{target}:{WEB_PORT}/echo", "timeoutSeconds": 5,
                      # Under software emulation on a loaded machine a guest may take minutes
                      # to boot: no replacement of a guest that is merely slow within the demo.
                      "unhealthyAfterSeconds": 1800},
            # The crawlers' network: the namespace's side of the guests' bridge.
            "allowedSources": [f"{bridge.rsplit('.', 1)[0]}.0/24"],
            # The probe's target is on a private network: opened on purpose, that address only.
            "allowedDestinations": [f"{target}/32"],
            "kvm": {
                "hosts": [{"name": LOCATION, "uri": f"qemu+ssh://root@{host.address}/system", "pool": "default",
                           "network": "default", "domainType": "qemu"}],
                "ssh": {"keyFile": str(host.controller_key_file), "knownHostsFile": str(known_hosts)},
                "images": {"debian-12": {"url": image.url, "sha256": image.sha256, "format": "qcow2"}},
                "machineTypes": {"small": {"vcpus": 2, "memoryMiB": 1024, "diskGiB": max(2, math.ceil(size / 2**30))}},
                "defaultMachineType": "small",
                "defaultImage": "debian-12",
            },
        }],
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def read_status(proxies: Path) -> dict[str, Any]:
    for path in proxies.glob("*.status.yaml"):
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            return {}  # being replaced right now
        return dict(document.get("status") or {})
    return {}


def in_namespace(namespace: str, command: list[str], stdin: str = "", timeout: float = 30) -> str:
    result = subprocess.run(["ip", "netns", "exec", namespace, *command], input=stdin, capture_output=True,
                            text=True, timeout=timeout, check=False)
    return result.stdout.strip()


def curl_through(namespace: str, proxy_url: str, url: str) -> str:
    """The HTTP status curl gets for ``url`` through ``proxy_url``, from inside the namespace. The
    proxy URL (with its password) goes in on stdin as curl config, never on a command line."""
    config = f'proxy = "{proxy_url}"\nnoproxy = ""\nmax-time = 10\nsilent\noutput = "/dev/null"\n'
    return in_namespace(namespace, ["curl", "-K", "-", "-w", "%{http_code}", url], stdin=config) or "000"


def masked(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":****@", 1)


def wait_for(what: str, check: Any, timeout: float, controller: subprocess.Popen[bytes], log: Path) -> Any:
    """What ``check`` returns once it is truthy; DemoFailed with the controller's log when it exits first
    or ``timeout`` passes."""
    return waiting.wait_for(check, timeout, what, 0.5, lambda: f"the controller's log:\n{tail(log)}",
                            process=controller, error=DemoFailed)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


def internet_beside(host: HypervisorHost, stack: ExitStack) -> tuple[str, str]:
    """A network namespace of its own standing for a site on the guests' network, joined to the
    guests' bridge by a veth pair: (its name, its address). The guests reach it as another machine
    on their LAN (the demo's network has no way out); it is no address of the host's, which a proxy
    never reaches."""
    namespace = f"egress-proxies-demo-net-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
    stack.callback(subprocess.run, ["ip", "netns", "del", namespace], check=False, capture_output=True)
    bridge = host.guest_network_address
    found = subprocess.run(["ip", "-n", host.namespace, "-o", "address", "show", "to", bridge],
                           check=True, capture_output=True, text=True).stdout.split()
    device, address = found[1], f"{bridge.rsplit('.', 1)[0]}.{SITE_HOST}"
    commands = [
        ["ip", "link", "add", "epdnet0", "netns", host.namespace, "type", "veth",
         "peer", "epdnet1", "netns", namespace],
        ["ip", "-n", host.namespace, "link", "set", "epdnet0", "master", device],
        ["ip", "-n", host.namespace, "link", "set", "epdnet0", "up"],
        ["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "epdnet1"],
        ["ip", "-n", namespace, "link", "set", "epdnet1", "up"],
        ["ip", "-n", namespace, "link", "set", "lo", "up"],
    ]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True)
    return namespace, address


def start_probe_target(demo: Path, namespace: str, stack: ExitStack) -> None:
    """The probe target (and the crawler's web server) in ``namespace``, with a new key in
    ``demo/probe.key`` (the file the provider config names); stopped by ``stack``."""
    key = demo / "probe.key"
    key.write_text(secrets.token_urlsafe(32) + "\n")
    key.chmod(0o600)
    egress_proxies = str(Path(sys.executable).parent / "egress-proxies")
    server = subprocess.Popen(
        ["ip", "netns", "exec", namespace, egress_proxies, "probe-target", "--key-file", str(key),
         "--listen", f"0.0.0.0:{WEB_PORT}", "--listen", f"0.0.0.0:{TUNNEL_PORT}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stack.callback(stop_process_group, server)


def real(demo: Path, stack: ExitStack) -> int:
    timeline = Timeline()
    started = time.monotonic()
    say("== egress-proxies demo: a proxy VM on a KVM hypervisor in a network namespace on this machine")
    image = image_with_progress(timeline)

    say("== hypervisor: libvirtd + sshd in a network namespace, bootstrapped by playbooks/bootstrap_hypervisor.yml")
    host = stack.enter_context(HypervisorHost())
    say(f"   namespace {host.namespace}, sshd at {host.address}, guests on {host.guest_network_address}/24 "
        "(no way out of the namespace)")
    run = bootstrap(host)
    timeline.add("hypervisor bootstrap (playbook)", run.seconds)
    say(f"   bootstrapped in {run.seconds:.0f} s: {' '.join(run.stdout.strip().splitlines()[-1].split())}")

    internet, target = internet_beside(host, stack)
    start_probe_target(demo, internet, stack)
    web_url = f"http://{target}:{WEB_PORT}/"

    proxies, work = demo / "proxies", demo / "work"
    proxies.mkdir()
    config = demo / "providers.yaml"
    provider_config(config, host, run.known_hosts_file, image, target)
    token = secrets.token_urlsafe(24)
    tokens = demo / "discovery-tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": TEAM, "sha256": hashlib.sha256(token.encode()).hexdigest(),
                                       "namespaces": ["crawlers"]}]))
    tokens.chmod(0o600)
    shutil.copy(EXAMPLE, proxies / EXAMPLE.name)
    guests = f"{host.guest_network_address.rsplit('.', 1)[0]}.0/24"
    log = demo / "controller.log"
    say(f"== controller: --source directory on {EXAMPLE.relative_to(ROOT)} (its cloudInit unchanged), "
        "inside the namespace")
    say(f"   log: {log}")
    applied = time.monotonic()
    with open(log, "wb") as output:
        controller = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, str(Path(sys.executable).parent / "egress-proxies"),
             "--source", "directory", "--proxy-dir", str(proxies), "--provider-config", str(config),
             "--work-dir", str(work), "--interval", "2", "--probe-interval", "3", "--probe-allow", guests,
             "--listen", f"{host.address}:{DISCOVERY_PORT}", "--discovery-tokens", str(tokens)],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    stack.callback(stop_process_group, controller)

    status = wait_for("instance", lambda: (s := read_status(proxies)).get("providerID") and s, 300, controller, log)
    created = time.monotonic()
    timeline.add("Proxy applied -> domain running (controller: upload, define, start)", created - applied)
    say(f"   {created - applied:5.1f} s  running: instance {status['providerID']}")
    status = wait_for("address", lambda: (s := read_status(proxies)).get("ip") and s, READY_TIMEOUT, controller, log)
    running = time.monotonic()
    timeline.add(f"-> the guest has an address ({status['ip']})", running - created)
    say(f"   {running - applied:5.1f} s  address {status['ip']}: the guest has booted; cloud-init starts squid")
    status = wait_for("Ready (serving)", lambda: (s := read_status(proxies)).get("phase") == "Ready" and s,
                      READY_TIMEOUT, controller, log)
    ready = time.monotonic()
    timeline.add("-> Ready (the controller's probe went through squid)", ready - running)
    say(f"   {ready - applied:5.1f} s  Ready: the controller's probe went through its squid")

    say("== the crawler's side (inside the namespace)")
    discovery = f"http://{host.address}:{DISCOVERY_PORT}/v1/proxies"
    request = urllib.request.Request(discovery, headers={"Authorization": f"Bearer {token}"})
    entries = wait_for("discovery entry", lambda: _discover(request), 60, controller, log)
    say(f"   GET {discovery} (token scoped to namespace crawlers): {len(entries)} proxy")
    failed = False
    first_204 = None
    for entry in entries:
        url = str(entry["url"])
        code = curl_through(host.namespace, url, web_url)
        first_204 = first_204 or (time.monotonic() if code == "204" else None)
        say(f"   curl -x {masked(url)} {web_url}  -> {code}")
        endpoint = f"http://{entry['endpoint']}"
        bare = curl_through(host.namespace, endpoint, web_url)
        say(f"   curl -x {endpoint} {web_url}  -> {bare} (no credentials)")
        failed = failed or code != "204" or bare != "407"
    # The network rule, shown: a server outside the namespace (our end of the veth pair, in the
    # root namespace) is out of the guest's reach, even with the credentials.
    with outside_server(host.gateway) as outside_url:
        escaped = curl_through(host.namespace, str(entries[0]["url"]), outside_url)
    say(f"   curl -x {masked(str(entries[0]['url']))} {outside_url}  -> {escaped} "
        "(outside the namespace: the guest has no way there)")
    failed = failed or escaped == "204"
    if first_204 is not None:
        timeline.add("-> first 204 through the proxy (crawler's curl)", first_204 - ready)
    timeline.add("Proxy applied -> first 204", (first_204 or time.monotonic()) - applied)
    timeline.add("whole demo so far", time.monotonic() - started)
    say()
    timeline.show()
    say()
    say("== status of the Proxy crawlers/eu-1 (written beside it by the directory source)")
    say(yaml.safe_dump({"status": read_status(proxies)}, sort_keys=False).rstrip())
    if failed:
        say("demo.sh: expected 204 with the credentials and 407 without; see above")
        return 1
    return 0


@contextmanager
def outside_server(address: str) -> Iterator[str]:
    """A 204 server in the root namespace on ``address``, from a thread of this process."""

    class NoContent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), NoContent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{address}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _discover(request: urllib.request.Request) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return list(json.loads(response.read())["proxies"])
    except (OSError, ValueError):
        return []


# --- --fast: libvirt's test driver ---------------------------------------------------------------


def fast(demo: Path, stack: ExitStack) -> int:
    say("== egress-proxies demo --fast: the controller's loop on libvirt's TEST DRIVER")
    say("   The test driver boots nothing: no VM, no squid, and the addresses below are made up.")
    say("   The provider config says `probe: none`, so nothing is ever sent to them.")
    # The daemon holds a connection open for the whole run: the test driver forgets its domains
    # when its last connection closes, i.e. between two sweeps.
    daemon = stack.enter_context(LibvirtTestDaemon())
    base = demo / "debian-12.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "64M"], check=True)
    config = demo / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": "demo", "providers": [{
        "name": PROVIDER, "type": "kvm", "probe": "none",
        "kvm": {"hosts": [{"name": LOCATION, "uri": daemon.uri, "pool": "default-pool", "network": "default",
                           "domainType": "qemu"}],
                "images": {"debian-12": {"url": base.as_uri(), "format": "qcow2",
                                         "sha256": hashlib.sha256(base.read_bytes()).hexdigest()}},
                "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 10}}}}]}, sort_keys=False))
    proxies = demo / "proxies"
    proxies.mkdir()
    for example in sorted((ROOT / "controller" / "examples").glob("*.yaml")):
        # The examples for the demo's KVM provider (and its pool); the Kubernetes provider's
        # example names a provider this demo does not have.
        if (yaml.safe_load(example.read_text()).get("spec") or {}).get("provider") in (None, PROVIDER):
            shutil.copy(example, proxies / example.name)
    say(f"== {len(list(proxies.iterdir()))} example Proxies from controller/examples/")
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    code = subprocess.run([str(Path(sys.executable).parent / "egress-proxies"), "--source", "directory",
                           "--proxy-dir", str(proxies), "--provider-config", str(config), "--work-dir",
                           str(demo / "work"), "--listen", f"127.0.0.1:{port}", "--until-ready", "120"],
                          stdin=subprocess.DEVNULL, check=False).returncode
    domains = sorted(d.name() for d in daemon.connection.listAllDomains(0))
    say(f"== the test driver's domains (kept across sweeps by the held connection): {', '.join(domains)}")
    first = sorted(proxies.glob("*.status.yaml"))[:1]
    if first:
        say(f"== status written beside the first Proxy ({first[0].name}):")
        say(yaml.safe_dump({"status": yaml.safe_load(first[0].read_text())["status"]}, sort_keys=False).rstrip())
    say("(made-up addresses from libvirt's test driver: nothing listens there. "
        "Run `bash scripts/demo.sh` without --fast for a real proxy VM.)")
    return code


# --- clean-up ------------------------------------------------------------------------------------


def leftover_processes(demo: Path) -> list[int]:
    """Processes whose command line names the demo's directory: everything the demo started
    does (daemons' configs, qemu's disks, the controller's files, Ansible's ssh)."""
    found = []
    marker = str(demo).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_leftovers(demo: Path) -> int:
    """SIGTERM, then SIGKILL, what a step interrupted half-way left running (a playbook's ssh)."""
    pids = leftover_processes(demo)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in leftover_processes(demo):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        waiting.poll(lambda: not leftover_processes(demo), 5, interval=0.1)
    return len(pids)


@contextmanager
def demo_directory() -> Iterator[Path]:
    demo = Path(tempfile.mkdtemp(prefix="egress-proxies-demo."))
    # Every temporary directory the support code makes (host root, playbook inventory, libvirtd
    # state) lands in here, so one path finds all of it.
    previous, tempfile.tempdir = tempfile.tempdir, str(demo)
    try:
        yield demo
    finally:
        tempfile.tempdir = previous


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true",
                        help="seconds-long run on libvirt's test driver: boots nothing, made-up addresses")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("demo.sh: needs root (network and mount namespaces, libvirtd)")
        return 1
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_signal)
    code = 1
    with demo_directory() as demo:
        say(f"   (working directory {demo})")
        stack = ExitStack()
        try:
            code = (fast if args.fast else real)(demo, stack)
        except KeyboardInterrupt:
            say("\n== interrupted")
            code = 130
        except DemoFailed as error:
            say(f"demo.sh: {error}")
            code = 1
        finally:
            # A second Ctrl-C must not cut the clean-up short.
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            say("== cleaning up: controller, web server, domains, libvirtd, sshd, namespace, files "
                "(the guest image cache stays)")
            try:
                stack.close()
            except Exception as error:  # noqa: BLE001 -- what is left is still removed below
                say(f"   clean-up step failed ({error}); removing what is left")
            stragglers = kill_leftovers(demo)
            shutil.rmtree(demo, ignore_errors=True)
            say(f"   done{f' ({stragglers} leftover processes stopped)' if stragglers else ''}")
    return code


if __name__ == "__main__":
    sys.exit(main())
