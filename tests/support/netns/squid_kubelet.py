"""A kubelet for the Kubernetes provider's Pods that runs each one for real: squid with the Pod's own
generated squid.conf, in a network namespace the test made (tests/support/netns/squid.py).

The Kubernetes API emulator has no kubelet (``KubeEmulator.kubelet_run`` only writes the status a
kubelet would). :class:`SquidKubelet` watches one namespace's Pods (a list every ``poll`` seconds)
and, for each new Pod the provider made, does what a kubelet and a container runtime would:

- **volumes**: every ``downwardAPI`` item that projects an annotation is written to the Pod's own
  directory (with the item's ``mode``): the provider's ``crawl.example.com/squid-conf`` and
  ``squid-passwd``; an ``emptyDir`` is an empty directory of the Pod's. The container's mount
  paths in the Pod's files and command are those directories;
- **network**: a Pod has a network namespace of its own; here all Pods share the test's, and each
  gets its own address in it (:meth:`NetworkNamespace.add_address`). squid listens on that
  address (``http_port <address>:<port>`` for the Pod's ``http_port <port>``) and fetches from it
  (``tcp_outgoing_address``), so a site sees each Pod's own egress address, as it would see each
  proxy's;
- **container**: the container's command (its ``/bin/sh -c`` preamble, which writes the error
  pages and the Pod's own addresses, then ``squid -N -f <conf>``) as :class:`~support.netns.squid.Squid`
  runs it: the preamble as the launcher with the Pod's downward-API environment (``POD_IPS``,
  ``NODE_IP``), the same binary and flags, the Pod's config plus the harness's housekeeping lines;
- **status**: once squid accepts connections (what the Pod's tcpSocket readiness probe checks),
  ``kubelet_run`` reports the Pod Running and Ready with its address as ``podIP``;
- **termination**: a Pod that is deleting (``deletionTimestamp``) or gone gets SIGTERM.

Nothing is sent anywhere but the emulator (127.0.0.1) and the namespace's own addresses.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.kube.emulator import KubeEmulator
from support.netns.namespace import NetworkNamespace
from support.netns.squid import SQUID_USER, Squid
from support.process import DaemonStartError

LOG = logging.getLogger(__name__)

MANAGED_BY = ("app.kubernetes.io/managed-by", "egress-proxies")
_ANNOTATION_REF = re.compile(r"^metadata\.annotations\['([^']+)'\]$")
_HTTP_PORT = re.compile(r"^http_port\s+(\d+)\s*$", re.MULTILINE)


@dataclass
class RunningPod:
    name: str
    address: str
    squid: Squid
    started: float


@contextmanager
def squid_kubelet(kube: KubeEmulator, netns: NetworkNamespace, namespace: str) -> Iterator[SquidKubelet]:
    """A started :class:`SquidKubelet`, stopped with every squid it runs on the way out."""
    kubelet = SquidKubelet(kube, netns, namespace)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


class SquidKubelet:
    """Runs the managed Pods of ``namespace`` as real squids in ``netns`` (``start``, ``stop``).

    ``pods`` maps a Pod's name to what runs for it; ``errors`` collects Pods that could not be
    started (a test asserts it stays empty)."""

    def __init__(self, kube: KubeEmulator, netns: NetworkNamespace, namespace: str, poll: float = 0.1) -> None:
        self.kube = kube
        self.netns = netns
        self.namespace = namespace
        self.poll = poll
        self.pods: dict[str, RunningPod] = {}
        self.errors: list[str] = []
        self._failed: set[str] = set()  # never started again: a kubelet would back off, not retry each poll
        self._stopped: list[Squid] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def address_of(self, pod: str) -> str:
        with self._lock:
            return self.pods[pod].address

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="squid-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            squids = [pod.squid for pod in self.pods.values()] + self._stopped
            self.pods.clear()
        for squid in squids:  # SIGTERM to all first: each takes a moment to go
            squid.terminate()
        for squid in squids:
            squid.stop()

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                pods = self._list()
            except OSError as error:  # the emulator is stopping
                LOG.debug("squid kubelet: listing Pods failed: %s", error)
                continue
            live = {pod["metadata"]["name"]: pod for pod in pods
                    if (pod["metadata"].get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1]}
            for name in [name for name in self.pods if name not in live or
                         live[name]["metadata"].get("deletionTimestamp")]:
                self._terminate(name)
            for name, pod in live.items():
                if name not in self.pods and name not in self._failed and not pod["metadata"].get("deletionTimestamp") \
                        and not (pod.get("spec") or {}).get("nodeName"):
                    self._run_pod(pod)

    def _list(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.kube.url}/api/v1/namespaces/{self.namespace}/pods", timeout=5) as answer:
            return list(json.loads(answer.read())["items"])

    def _terminate(self, name: str) -> None:
        with self._lock:
            pod = self.pods.pop(name)
            self._stopped.append(pod.squid)
        pod.squid.terminate()
        LOG.info("squid kubelet: Pod %s terminating (squid on %s)", name, pod.address)

    def _run_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        try:
            address = self.netns.add_address()
            config, launcher = self._container(pod, address)
            squid = Squid(self.netns, config, address=address, ports=(_pod_port(pod),), name=f"pod-{name}",
                          launcher=launcher, env={"POD_IPS": address, "NODE_IP": self.netns.address})
            squid.start()
        except (DaemonStartError, OSError, KeyError, ValueError, AssertionError) as error:
            self._failed.add(name)
            self.errors.append(f"{name}: {type(error).__name__}: {error}")
            LOG.exception("squid kubelet: Pod %s could not be started", name)
            return
        with self._lock:
            self.pods[name] = RunningPod(name, address, squid, time.monotonic())
        self.kube.kubelet_run(self.namespace, name, pod_ip=address, host_ip=self.netns.address)
        LOG.info("squid kubelet: Pod %s Running on %s", name, address)

    def _container(self, pod: dict[str, Any], address: str) -> tuple[str, list[str]]:
        """The squid.conf the container would read and the preamble its command runs squid
        through, its mount paths mapped to the Pod's directories and its port bound to the Pod's
        address."""
        (container,) = pod["spec"]["containers"]
        replacements = self._volumes(pod, container)
        command = container["command"]
        assert command[-4:-1] == ["squid", "-N", "-f"], f"a container command this kubelet does not run: {command}"
        config = _mapped(command[-1], replacements).read_text()
        launcher = list(command[:-4])
        for mount, own_path in replacements.items():
            config = config.replace(mount + "/", own_path + "/")
            launcher = [part.replace(mount, own_path) for part in launcher]
        return _HTTP_PORT.sub(rf"http_port {address}:\1", config) + f"tcp_outgoing_address {address}\n", launcher

    def _volumes(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """Each mounted volume as a directory of the Pod's (mount path -> directory): a
        ``downwardAPI`` one with its annotations written, an ``emptyDir`` empty and squid's."""
        directory = self.netns.root / f"volumes-{pod['metadata']['name']}"
        directory.mkdir()
        shutil.chown(directory, SQUID_USER, SQUID_USER)
        mounts = {mount["name"]: mount["mountPath"] for mount in container.get("volumeMounts") or []}
        annotations = pod["metadata"].get("annotations") or {}
        replacements: dict[str, str] = {}
        for volume in pod["spec"].get("volumes") or []:
            if volume["name"] not in mounts:
                continue
            own = directory / volume["name"]
            own.mkdir()
            replacements[mounts[volume["name"]].rstrip("/")] = str(own)
            if "emptyDir" in volume:
                shutil.chown(own, SQUID_USER, SQUID_USER)
                continue
            assert volume.get("downwardAPI") is not None, f"a volume this kubelet does not mount: {volume}"
            for item in volume["downwardAPI"]["items"]:
                annotation = _ANNOTATION_REF.match(item["fieldRef"]["fieldPath"])
                assert annotation is not None, f"a downwardAPI field this kubelet does not project: {item}"
                target = own / item["path"]
                target.write_text(annotations[annotation.group(1)])
                target.chmod(item.get("mode", 0o644))
        return replacements


def _mapped(path: str, replacements: dict[str, str]) -> Path:
    for mount, own in replacements.items():
        if path.startswith(mount + "/"):
            return Path(own + path[len(mount):])
    raise AssertionError(f"{path} is on no volume of the Pod")


def _pod_port(pod: dict[str, Any]) -> int:
    (container,) = pod["spec"]["containers"]
    return int(container["ports"][0]["containerPort"])
