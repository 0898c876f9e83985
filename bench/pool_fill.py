"""``pool_bench.py --fill N``: a ProxyPool of N members from 0, through the real ``egress-proxies``
command (a child process: its sweeps, its memory, a SIGKILL hits the real thing), on both sources.

For each source (the Kubernetes API emulator in a process of its own, then a directory), one KVM
provider ``lab`` whose hosts are libvirt test-driver daemons (``--per-host`` members each, a
daemon's pool holding 99 1-GiB overlays), ``probe: none`` (the test driver's addresses are made
up: nothing is sent to them; Ready is running with an address). Measured:

- ``replicas: 0 -> N`` until the pool's ``readyReplicas == N`` (the figure's target: 6 min);
- every sweep's duration during the fill, from the controller's own "sweep N (S s)" log lines
  (target: none over 30 s);
- a bare Proxy created when half the members exist: the sweeps the controller finished from its
  creation until it was Ready (target: two; the sweep in flight when it was created counts);
- the controller process's peak RSS (``VmHWM``; its runner children are apart) (target: 400 MiB).

Then, on the Kubernetes source (a pool of ``--rotation-replicas``, default 300, ``maxSurge`` a
tenth of it): a template edited mid-rotation, the controller SIGKILLed at once and restarted on
the same work dir; the restarted controller's sweeps until every member is on the new template
and Ready, against the bound ``ceil(replicas / maxSurge) + 2``, with the ready floor and the surge
bound read from the API all along.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from controller_bench import REPO, emulator_process, say
from kubernetes import client

from egress_proxies.resources.pool import POOL_LABEL, POOL_PLURAL, RETIRING_ANNOTATION
from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from support.collection.provider_config import kvm_host, make_base_image, write_kubeconfig, write_kvm_config
from support.controller.command import ControllerProcess
from support.hosts.libvirt_daemon import LibvirtTestDaemon

NAMESPACE = "bench"
POOL = "fill"
API_VERSION = f"{GROUP}/{VERSION}"
# The Kubernetes API emulator with the Proxy and ProxyPool CRDs: argv[1] the ProxyPool CRD's file,
# the rest the namespaces it starts with (pool_bench.py uses it too).
KUBE_LAUNCHER = """
import sys, yaml
from support.kube.emulator import KubeEmulator
from support.kube.resources import proxy_crd
pool_crd = yaml.safe_load(open(sys.argv[1]).read())
emulator = KubeEmulator(port=0, namespaces=tuple(sys.argv[2:]), crds=[proxy_crd(), pool_crd]).start()
sys.stdout.write(emulator.url + "\\n")
sys.stdout.flush()
sys.stdin.read()
emulator.stop()
"""
POOL_CRD = REPO / "controller" / "manifests" / "crd-proxypool.yaml"


@dataclass
class Fill:
    """What one fill measured."""

    source: str
    seconds: float = 0.0
    sweeps: list[float] = field(default_factory=list)  # durations of the sweeps during the fill
    bare_sweeps: int = 0  # sweeps finished between the bare Proxy's creation and its Ready
    rss_mib: float = 0.0

    def line(self, n: int) -> str:
        longest = max(self.sweeps, default=0.0)
        median = sorted(self.sweeps)[len(self.sweeps) // 2] if self.sweeps else 0.0
        return (f"{self.source}: 0 -> {n} all ready in {self.seconds:.0f} s ({verdict(self.seconds <= 360)} <= 360 s), "
                f"{len(self.sweeps)} sweeps, longest {longest:.1f} s ({verdict(longest <= 30)} <= 30 s), median "
                f"{median:.1f} s; bare Proxy mid-fill Ready after {self.bare_sweeps} sweep(s) "
                f"({verdict(self.bare_sweeps <= 2)} <= 2); controller peak RSS {self.rss_mib:.0f} MiB "
                f"({verdict(self.rss_mib <= 400)} <= 400)")


def verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


class Source:
    """Where the pool lives, read and written the way an operator would."""

    def create_pool(self, spec: dict[str, Any]) -> None:
        raise NotImplementedError

    def set_replicas(self, replicas: int) -> None:
        raise NotImplementedError

    def pool_status(self) -> dict[str, Any]:
        raise NotImplementedError

    def member_count(self) -> int:
        raise NotImplementedError

    def create_bare(self, name: str) -> None:
        raise NotImplementedError

    def phase_of(self, name: str) -> str | None:
        raise NotImplementedError

    def controller_args(self) -> list[str]:
        raise NotImplementedError


class KubeSource(Source):
    def __init__(self, url: str, api: client.ApiClient, work: Path) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.kubeconfig = write_kubeconfig(work / "kubeconfig", url)

    def create_pool(self, spec: dict[str, Any]) -> None:
        self.objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, {
            "apiVersion": API_VERSION, "kind": "ProxyPool", "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": spec})

    def set_replicas(self, replicas: int) -> None:
        self.objects.patch_namespaced_custom_object_scale(GROUP, VERSION, NAMESPACE, POOL_PLURAL, POOL,
                                                          {"spec": {"replicas": replicas}})

    def pool(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                                              POOL_PLURAL, POOL))

    def pool_status(self) -> dict[str, Any]:
        return dict(self.pool().get("status") or {})

    def members(self) -> list[dict[str, Any]]:
        listing = self.objects.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                             label_selector=f"{POOL_LABEL}={POOL}")
        return list(cast(dict[str, Any], listing)["items"])

    def member_count(self) -> int:
        return int(self.pool_status().get("replicas") or 0)

    def create_bare(self, name: str) -> None:
        self.objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, {
            "apiVersion": API_VERSION, "kind": "Proxy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"provider": "lab"}})

    def phase_of(self, name: str) -> str | None:
        proxy = cast(dict[str, Any], self.objects.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name))
        return (proxy.get("status") or {}).get("phase")

    def controller_args(self) -> list[str]:
        return ["--source", "kubernetes", "--kubeconfig", str(self.kubeconfig), "--namespace", NAMESPACE]


class DirectorySource(Source):
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.spec: dict[str, Any] = {}

    def create_pool(self, spec: dict[str, Any]) -> None:
        self.spec = dict(spec)
        self._write()

    def _write(self) -> None:
        (self.directory / "pool.yaml").write_text(yaml.safe_dump({
            "apiVersion": API_VERSION, "kind": "ProxyPool", "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": self.spec}))

    def set_replicas(self, replicas: int) -> None:
        self.spec["replicas"] = replicas
        self._write()

    def pool_status(self) -> dict[str, Any]:
        with contextlib.suppress(FileNotFoundError):
            record = yaml.load((self.directory / ".pool.pool.yaml").read_text(), Loader=yaml.CSafeLoader)
            return dict((record or {}).get("status") or {})
        return {}

    def member_count(self) -> int:
        return sum(1 for path in self.directory.glob(f"{POOL}-*.yaml") if not path.name.endswith(".status.yaml"))

    def create_bare(self, name: str) -> None:
        (self.directory / f"{name}.yaml").write_text(yaml.safe_dump({
            "apiVersion": API_VERSION, "kind": "Proxy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"provider": "lab"}}))

    def phase_of(self, name: str) -> str | None:
        with contextlib.suppress(FileNotFoundError):
            record = yaml.load((self.directory / f"{name}.status.yaml").read_text(), Loader=yaml.CSafeLoader)
            return ((record or {}).get("status") or {}).get("phase")
        return None

    def controller_args(self) -> list[str]:
        return ["--source", "directory", "--proxy-dir", str(self.directory)]


def controller(source: Source, config: Path, work: Path, batch_size: int) -> ControllerProcess:
    return ControllerProcess([*source.controller_args(), "--provider-config", str(config), "--work-dir",
                              str(work / "controller"), "--listen", "127.0.0.1:0", "--interval", "2",
                              "--batch-size", str(batch_size), "--gc-grace", "86400"], work_dir=work / "controller")


def poll(done: Callable[[], bool], seconds: float, what: str, running: ControllerProcess,
         every: Callable[[], None] | None = None) -> None:
    running.wait_for(lambda: (every() if every is not None else None, done())[1], seconds, what, interval=1.0)


def fill(name: str, source: Source, n: int, config: Path, work: Path, batch_size: int) -> Fill:
    """0 -> n through the real command; the bare Proxy goes in when half the members exist."""
    result = Fill(name)
    source.create_pool({"replicas": 0, "template": {}, "placement": [{"provider": "lab"}]})
    with controller(source, config, work, batch_size) as running:
        running.wait_sweeps(1, 300)
        before = running.sweeps()
        started = time.monotonic()
        source.set_replicas(n)
        bare: dict[str, int] = {}

        def bare_proxy() -> None:
            if "created" not in bare and source.member_count() >= n // 2:
                bare["created"] = running.sweeps()
                source.create_bare("bare-mid-fill")
            elif "created" in bare and "ready" not in bare and source.phase_of("bare-mid-fill") == "Ready":
                bare["ready"] = running.sweeps()

        poll(lambda: source.pool_status().get("readyReplicas") == n, 3600, f"{n} ready", running, bare_proxy)
        result.seconds = time.monotonic() - started
        poll(lambda: "ready" in bare, 300, "the bare Proxy Ready", running, bare_proxy)
        result.sweeps = running.sweep_seconds()[before:]
        result.bare_sweeps = bare["ready"] - bare["created"]
        result.rss_mib = running.peak_rss_mib()
    return result


def rotation_after_restart(source: KubeSource, replicas: int, config: Path, work: Path, batch_size: int) -> str:
    """Row 9: a template edited mid-rotation, the controller killed and restarted."""
    surge = max(1, replicas // 10)
    source.create_pool({"replicas": replicas, "template": {"cloudInit": "#cloud-config\n# v1\n"},
                        "rotation": {"maxAge": "30s", "maxSurge": surge, "maxUnavailable": 0, "jitter": 0},
                        "placement": [{"provider": "lab"}]})
    with controller(source, config, work, batch_size) as first:
        poll(lambda: any((m["metadata"].get("annotations") or {}).get(RETIRING_ANNOTATION)
                         for m in source.members()), 1200, "a rotation under way", first)
        source.objects.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POOL_PLURAL, POOL, {"spec": {
            "template": {"cloudInit": "#cloud-config\n# v2\n"}, "rotation": {"maxAge": "24h"}}})
        first.kill()
    floor, most = replicas, 0
    with controller(source, config, work, batch_size) as restarted:
        def converged() -> bool:
            nonlocal floor, most
            items = [m for m in source.members() if not m["metadata"].get("deletionTimestamp")]
            floor = min(floor, sum(1 for m in items if (m.get("status") or {}).get("phase") == "Ready"))
            most = max(most, len(items))
            return len(items) == replicas and all(
                m["spec"].get("cloudInit", "").endswith("v2\n") and (m.get("status") or {}).get("phase") == "Ready"
                for m in items)
        started = time.monotonic()
        poll(converged, 1800, "every member on the new template", restarted)
        sweeps, seconds = restarted.sweeps(), time.monotonic() - started
    bound = math.ceil(replicas / surge) + 2
    return (f"template edited mid-rotation ({replicas} members, maxSurge {surge}), controller SIGKILLed and "
            f"restarted: converged after {sweeps} sweeps of the restarted controller, {seconds:.0f} s "
            f"({verdict(sweeps <= bound)} <= {bound}); ready never below {floor} (floor {replicas}), "
            f"members at most {most} (bound {replicas + surge})")


@contextlib.contextmanager
def kube_source(work: Path) -> Iterator[KubeSource]:
    with emulator_process(KUBE_LAUNCHER, str(POOL_CRD), NAMESPACE, "egress-proxies") as url, \
            client.ApiClient(client.Configuration(host=url)) as api:
        yield KubeSource(url, api, work)


def run_fill(n: int, per_host: int, batch_size: int, rotation_replicas: int, stack: contextlib.ExitStack) -> None:
    work = Path(tempfile.mkdtemp(prefix="egress-proxies-pool-fill-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    os.environ["EGRESS_PROXIES_CACHE_DIR"] = str(work / "image-cache")
    daemons = [stack.enter_context(LibvirtTestDaemon()) for _ in range(math.ceil(n / per_host))]
    config = write_kvm_config(work / "providers.yaml",
                              [kvm_host(f"h{i:03d}", d.uri, pool="default-pool") for i, d in enumerate(daemons)],
                              make_base_image(work))
    say(f"fill: a pool of {n} over {len(daemons)} KVM test-driver hosts, the real egress-proxies command, "
        f"--batch-size {batch_size} (a step of {batch_size * 4} members a sweep); load {os.getloadavg()}")
    results: list[str] = []
    for name in ("kubernetes", "directory"):
        for daemon in daemons:
            daemon.reset()
        run_work = work / name
        run_work.mkdir()
        with contextlib.ExitStack() as inner:
            source = inner.enter_context(kube_source(run_work)) if name == "kubernetes" else \
                DirectorySource(run_work / "proxies")
            measured = fill(name, source, n, config, run_work, batch_size)
        results.append(measured.line(n) + f"; load after {os.getloadavg()[0]:.1f}")
        say(results[-1])
    for daemon in daemons:
        daemon.reset()
    (work / "rotation").mkdir()
    with kube_source(work / "rotation") as kube:
        results.append(rotation_after_restart(kube, rotation_replicas, config, work / "rotation", batch_size))
        say(results[-1])
    say("summary:")
    for line in results:
        say(f"  {line}")
