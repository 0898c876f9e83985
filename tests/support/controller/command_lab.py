"""The real ``egress-proxies`` command, probing for real, with every instance a fake proxy in the
test's own network namespace (issue 27's harness).

- Proxies come from a directory (``--source directory``); their status is read back from the
  status files the command writes.
- Instances are Pods: each provider is a ``kubernetes`` provider on the Kubernetes API emulator
  (on 127.0.0.1), created by the collection's ``k8s_proxy`` module through ansible-runner as in
  production. ``Kubelet`` plays the scheduler and kubelet: it runs every new Pod with an address
  of the test's namespace, chosen by the test (``place``), and makes that ``address:port`` a fake
  proxy (``FakeProxies``) that knows the users of the Pod's password file, so the probe's
  credentials and identity are checked as squid would check them.
- The probe target is the project's own (``ProbeTargetProcess``), in the same namespace.
- The command probes only the namespace's /24 (``--probe-allow``); discovery, ``/metrics`` and
  its log are read from the test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, write_kubeconfig
from support.kube.emulator import KubeEmulator
from support.netns.fake_proxies import FakeProxies
from support.netns.probe_target import EGRESS_PROXIES
from support.waiting import wait_for

OPERATOR_TOKEN = "serving-lab-operator-token"
IMAGE = "ubuntu/squid:6.6-24.04_beta"
PASSWD_ANNOTATION = "crawl.example.com/squid-passwd"


@dataclass(frozen=True)
class Placement:
    """Where the kubelet runs a Pod (``address``) and how its fake proxy answers (``existing``:
    leave the endpoint as another Pod's placement made it, as when a provider reports another
    instance's address)."""

    address: str
    mode: str = "forward"
    options: Mapping[str, Any] | None = None


class Kubelet:
    """Runs every new Pod of the emulator: ``place(pod)`` says where and as what (None: leave it
    pending). Records, per Pod name, the placement it got."""

    def __init__(self, kube: KubeEmulator, fakes: FakeProxies,
                 place: Callable[[dict[str, Any]], Placement | None]) -> None:
        self.kube = kube
        self.fakes = fakes
        self.place = place
        self.placed: dict[str, Placement] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.error: Exception | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def pods(self) -> list[dict[str, Any]]:
        with client.ApiClient(client.Configuration(host=self.kube.url)) as api:
            answer: Any = client.CoreV1Api(api).list_pod_for_all_namespaces(_preload_content=False)
        return list(json.loads(answer.data)["items"])

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                for pod in self.pods():
                    self._run(pod)
            except Exception as error:  # noqa: BLE001 - surfaced by the test when it stops the kubelet
                self.error = error

    def _run(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        name = metadata["name"]
        if name in self.placed or (pod.get("status") or {}).get("podIP") or metadata.get("deletionTimestamp"):
            return
        placement = self.place(pod)
        if placement is None:
            return
        port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        passwd = (metadata.get("annotations") or {}).get(PASSWD_ANNOTATION) or ""
        users = dict(line.split(":", 1) for line in passwd.splitlines() if ":" in line)
        if placement.mode != "existing":
            self.fakes.set(placement.address, port, placement.mode, users, **dict(placement.options or {}))
        self.placed[name] = placement
        self.kube.kubelet_run(metadata["namespace"], name, pod_ip=placement.address)


def kubernetes_provider(name: str, kubeconfig: Path, namespace: str, probe: Any) -> dict[str, Any]:
    return {"name": name, "type": "kubernetes", "probe": probe,
            "kubernetes": {"kubeconfig": str(kubeconfig), "namespace": namespace, "image": IMAGE}}


class Command:
    """One ``egress-proxies`` process on a directory of Proxies (a context manager)."""

    def __init__(self, directory: Path, kube: KubeEmulator, network: str, providers: Sequence[dict[str, Any]],
                 *, interval: float = 5.0, probe_interval: float = 2.0) -> None:
        self.directory = directory
        self.proxies = directory / "proxies"
        self.proxies.mkdir(parents=True, exist_ok=True)
        self.config = directory / "providers.yaml"
        self.kubeconfig = write_kubeconfig(directory / "kubeconfig", kube.url)
        self.network = network
        self.interval = interval
        self.probe_interval = probe_interval
        self.log = directory / "controller.log"
        self.port = 0
        self.metrics_port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self.write_config(providers)

    def write_config(self, providers: Sequence[dict[str, Any]]) -> None:
        self.config.write_text(yaml.safe_dump({"owner": OWNER, "providers": list(providers)}, sort_keys=False))

    def add_proxy(self, name: str, provider: str, **spec: Any) -> None:
        document = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": name, "namespace": "crawlers"},
                    "spec": {"provider": provider, **spec}}
        (self.proxies / f"{name}.yaml").write_text(yaml.safe_dump(document))

    def status(self, name: str) -> dict[str, Any]:
        try:
            document = yaml.safe_load((self.proxies / f"{name}.status.yaml").read_text()) or {}
        except (FileNotFoundError, yaml.YAMLError):  # not written yet, or caught mid-replace
            return {}
        return dict(document.get("status") or {})

    def uid(self, name: str) -> str:
        document = yaml.safe_load((self.proxies / f"{name}.status.yaml").read_text()) or {}
        return str(document["metadata"]["uid"])

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or [] if c.get("type") == kind), {})

    def phase(self, name: str) -> str | None:
        return self.status(name).get("phase")

    def discovery(self) -> list[str]:
        """The Proxy names discovery hands out now."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/proxies",
                                         headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = json.loads(answer.read())
        entries = body["proxies"] if isinstance(body, dict) else body
        return sorted(str(entry["name"]) for entry in entries)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self) -> None:
        env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path(), "DISCOVERY_TOKEN": OPERATOR_TOKEN}
        with socket.socket() as probe, socket.socket() as metrics:
            probe.bind(("127.0.0.1", 0))
            metrics.bind(("127.0.0.1", 0))
            self.port, self.metrics_port = probe.getsockname()[1], metrics.getsockname()[1]
        command = [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(self.proxies),
                   "--provider-config", str(self.config), "--work-dir", str(self.directory / "work"),
                   "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                   "--interval", str(self.interval),
                   "--probe-interval", str(self.probe_interval), "--probe-allow", self.network,
                   "--log-level", "DEBUG"]
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: "serving metrics on" in self.log_text(), 60, "the controller to start",
                 0.1, lambda: self.log_text()[-3000:], process=self._process)

    def stop(self) -> None:
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGTERM)
                self._process.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=10)
            self._process = None

    def __enter__(self) -> Command:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def secrets_in(text: str, secrets: Sequence[str]) -> list[str]:
    """Which of ``secrets`` occur in ``text`` (case-sensitive)."""
    return [secret for secret in secrets if secret and re.search(re.escape(secret), text)]
