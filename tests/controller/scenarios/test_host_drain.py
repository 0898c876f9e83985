"""Cordon and drain a KVM host through the real command (docs/operations.md, "Draining a KVM host").

The real ``egress-proxies`` command (directory source) with the real ansible-runner and KVM
module against two hosts, each a libvirtd serving libvirt's test driver. The operator's command
is an edit of the provider config, which the running controller reads again:

1. h2 ``cordoned``: every Proxy is placed on h1, nothing on h2 (one of them pinned to h1 by its
   ``spec.location``);
2. h1 ``draining``, h2 active: every unpinned Proxy's instance is replaced on h2, make before
   break, while a sampler reads every Proxy's status file and finds each Ready at every sample;
   the pinned one stays, its ``HostActive`` condition and a Warning Event say why and what to do,
   and the metrics say h1 is draining with one instance left;
3. the Proxy owner's fix, ``spec.location: h2``: it is replaced there too, its condition clears,
   and ``egress_proxies_location_state{state="drained"}`` (what an operator waits on) says h1 is
   drained; h1 ends with no domain.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import waiting
from support.collection.modules import collections_path
from support.collection.provider_config import BaseImage, kvm_host, write_kvm_config
from support.controller.metrics import scrape
from support.hosts.libvirt_daemon import LibvirtTestDaemon

pytestmark = pytest.mark.timeout(300)

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")
POOL = "default-pool"
PROXIES = ("crawl-a", "crawl-b", "crawl-c")
PINNED = "crawl-pinned"  # spec.location: h1


def our_domains(daemon: LibvirtTestDaemon) -> set[str]:
    return {d.name() for d in daemon.connection.listAllDomains()} - {"test"}


def status(directory: Path, name: str) -> dict[str, Any] | None:
    """The Proxy's status as the controller last wrote it (None: not yet, or caught mid-write)."""
    try:
        state = yaml.safe_load((directory / f"{name}.status.yaml").read_text())
    except (FileNotFoundError, yaml.YAMLError):
        return None
    found = (state or {}).get("status")
    return found if isinstance(found, dict) else None


def write_config(path: Path, first: LibvirtTestDaemon, second: LibvirtTestDaemon, image: BaseImage,
                 states: dict[str, str]) -> None:
    """The provider config, replaced in one rename (as an editor or a ConfigMap update does)."""
    hosts = [kvm_host("h1", first.uri, pool=POOL), kvm_host("h2", second.uri, pool=POOL)]
    for host in hosts:
        if host["name"] in states:
            host["state"] = states[host["name"]]
    scratch = write_kvm_config(path.with_suffix(".new"), hosts, image)
    scratch.replace(path)


def write_proxy(directory: Path, name: str, location: str | None = None) -> None:
    """A Proxy file, replaced in one rename (the controller never reads half of it)."""
    spec = {"provider": "lab", "cloudInit": "#cloud-config\n", **({"location": location} if location else {})}
    scratch = directory / f".{name}.new"
    scratch.write_text(yaml.safe_dump({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                                       "metadata": {"name": name, "namespace": "crawlers"}, "spec": spec}))
    scratch.replace(directory / f"{name}.yaml")


def condition(found: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next((c for c in (found or {}).get("conditions") or [] if c.get("type") == kind), {})


class Sampler:
    """Reads every Proxy's status file until stopped; keeps each sample where one was not Ready."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.samples = 0
        self.not_ready: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for name in (*PROXIES, PINNED):
                found = status(self.directory, name)
                if found is None:
                    continue  # caught mid-write: not a sample
                self.samples += 1
                if found.get("phase") != "Ready":
                    self.not_ready.append((name, found.get("phase")))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def second_host() -> Iterator[LibvirtTestDaemon]:
    with LibvirtTestDaemon() as daemon:
        yield daemon


def test_cordon_then_drain_moves_every_proxy_make_before_break(
        libvirt_test: LibvirtTestDaemon, second_host: LibvirtTestDaemon, image: BaseImage, tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    write_config(config, libvirt_test, second_host, image, {"h2": "cordoned"})
    proxies = tmp_path / "proxies"
    proxies.mkdir()
    for name in PROXIES:
        write_proxy(proxies, name)
    write_proxy(proxies, PINNED, "h1")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}
    process = subprocess.Popen(
        [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(proxies), "--provider-config", str(config),
         "--work-dir", str(tmp_path / "work"), "--interval", "0.5", "--metrics-listen", "127.0.0.1:0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    assert process.stderr is not None
    stderr = process.stderr
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in stderr), daemon=True)
    reader.start()

    def wait_for(condition: Callable[[], object], what: str) -> None:
        waiting.wait_for(condition, 150, what, 0.1, lambda: "log:\n" + "\n".join(lines[-40:]), process=process)

    def locations() -> dict[str, Any]:
        return {name: (status(proxies, name) or {}).get("location") for name in PROXIES}

    def h1(metric: str, **labels: str) -> float | None:
        """The metrics' word on host h1 (the listener's port is in the log once it serves)."""
        port = next((found.group(1) for line in list(lines)
                     if (found := re.search(r"serving metrics on 127\.0\.0\.1:(\d+)", line))), None)
        if port is None:
            return None
        return scrape(f"http://127.0.0.1:{port}/metrics", metric, provider="lab", location="h1", **labels)

    try:
        # Cordoned: every Proxy is placed on h1, though h2 has fewer of ours.
        wait_for(lambda: all((status(proxies, n) or {}).get("phase") == "Ready" for n in (*PROXIES, PINNED)),
                 "every Proxy Ready")
        assert set(locations().values()) == {"h1"} and (status(proxies, PINNED) or {}).get("location") == "h1"
        assert len(our_domains(libvirt_test)) == 4 and our_domains(second_host) == set()
        assert condition(status(proxies, PINNED), "HostActive") == {}  # h1 is active
        before = {name: (status(proxies, name) or {}).get("providerID") for name in PROXIES}

        # The operator's command: h1 draining, h2 active again.
        with Sampler(proxies) as sampler:
            write_config(config, libvirt_test, second_host, image, {"h1": "draining"})
            # The pinned one is not moved: its status says why and what to do, with a Warning
            # Event, from the first sweep that reads the config; the host is not drained.
            wait_for(lambda: condition(status(proxies, PINNED), "HostActive"), "the pinned Proxy told")
            pinned = condition(status(proxies, PINNED), "HostActive")
            assert (pinned.get("status"), pinned.get("reason")) == ("False", "HostDraining"), pinned
            assert "host h1, whose state is draining" in pinned["message"]
            assert "change spec.location to another host" in pinned["message"]
            assert [line for line in lines if f"event crawlers/{PINNED} Warning: HostDraining: " in line]
            wait_for(lambda: h1("egress_proxies_location_state", state="draining") == 1, "h1 draining (metrics)")
            assert h1("egress_proxies_location_state", state="drained") == 0
            assert (h1("egress_proxies_location_instances") or 0) >= 1

            # The Proxy owner's fix: another location. Replaced there, make before break, beside
            # the drain's own replacements (a spec change is not held to the replacement budget).
            write_proxy(proxies, PINNED, "h2")
            # What the operator waits on.
            wait_for(lambda: h1("egress_proxies_location_state", state="drained") == 1, "h1 reported drained")
        assert sampler.samples > 0 and sampler.not_ready == [], sampler.not_ready[:10]
        assert our_domains(libvirt_test) == set() and h1("egress_proxies_location_instances") == 0
        assert set(locations().values()) == {"h2"} and (status(proxies, PINNED) or {}).get("location") == "h2"
        wait_for(lambda: condition(status(proxies, PINNED), "HostActive") == {}, "the pinned Proxy's condition cleared")
        # None lost, none doubled: one instance per Proxy, each on h2, each a new one.
        after = {name: (status(proxies, name) or {}).get("providerID") for name in (*PROXIES, PINNED)}
        assert {str(p).rsplit("/", 1)[1] for p in after.values()} == our_domains(second_host)
        assert len(our_domains(second_host)) == 4
        assert all(after[name] != before[name] and str(after[name]).startswith("kvm://hosts/h2/") for name in PROXIES)
        assert any("host h1 is draining" in line for line in lines)  # reported while instances were left
        assert any("host h1 is drained" in line for line in lines)
        # Moved by the drain (a Normal Event each), never as a fault, and the old instance deleted after.
        for name in PROXIES:
            events = [line for line in lines if f"event crawlers/{name} " in line]
            assert any("Normal: HostDraining: replacing instance kvm://hosts/h1/" in line for line in events), events
            assert any("Replaced" in line for line in events), events
            assert not [line for line in events if " Warning: " in line], events
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        reader.join(timeout=10)
        stderr.close()

    # --check-config says which host is taken out of placement, and why.
    checked = subprocess.run([EGRESS_PROXIES, "--check-config", "--provider-config", str(config)], env=env,
                             capture_output=True, text=True, timeout=120)
    assert "provider lab: host h1 is draining: takes no new proxies" in checked.stdout, checked.stdout
