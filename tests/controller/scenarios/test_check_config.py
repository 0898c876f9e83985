"""``egress-proxies --check-config`` as a person runs it (issue 40, rows 6 and 9): the real command,
ansible-runner and the collection's validator. Every error on a line of its own with its field
path and the fix; exactly the files it is given; a GCP backend it cannot reach named with its
endpoint and the cause; a relative ANSIBLE_COLLECTIONS_PATH works; and every KVM publishing
mistake of row 6 refused before run time."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import yaml

from support.collection.modules import collections_path
from support.controller.command import environment, run_refused

SSH = {"keyFile": "/etc/egress-proxies/kvm-ssh/id_ed25519", "knownHostsFile": "/etc/egress-proxies/kvm-ssh/known_hosts"}
IMAGES = {"debian-12": {"url": "https://images.example.invalid/debian-12.qcow2", "sha256": "a" * 64}}


def kvm_provider(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "home-kvm", "type": "kvm", "allowedSources": ["198.51.100.0/24"],
            "kvm": {"ssh": SSH, "hosts": hosts, "images": IMAGES,
                    "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 10}}}}


def host(name: str, **networking: Any) -> dict[str, Any]:
    return {"name": name, "uri": f"qemu+libssh://egress-proxies@{name}.example.net/system", **networking}


def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released): connecting is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def check(tmp_path: Path, *arguments: str) -> tuple[int, list[str]]:
    done = run_refused(["--check-config", "--work-dir", str(tmp_path / "work"), *arguments], timeout=180)
    assert "Traceback" not in done.stderr, done.stderr
    # A check writes nothing where the controller keeps its runs (it ran the validator in a scratch directory).
    assert not (tmp_path / "work").exists()
    return done.returncode, done.stdout.splitlines()


def test_every_row_6_publishing_mistake_is_refused_and_an_unreachable_backend_is_named(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": "prod-cluster-1", "providers": [
        kvm_provider([
            host("routed", networkMode="route", publicAddress="203.0.113.10"),
            host("six", publicAddress="2001:db8::1", publishPorts="40000-40999"),
            host("reversed", publicAddress="203.0.113.11", publishPorts="40999-40000"),
            host("typo", sourceAddresses=["not-an-ip"]),
            host("half", publishPorts="41000-41999"),
            host("good", publicAddress="203.0.113.12", publishPorts="42000-42999"),
        ]),
        {"name": "gcp-eu", "type": "gcp", "allowedSources": ["192.0.2.0/24"], "gcp": {
            "project": "my-project", "zones": ["europe-west1-b"], "machineTypes": {"small": "e2-small"},
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "apiEndpoint": endpoint}},
    ]}))

    code, lines = check(tmp_path, "--provider-config", str(config))

    assert code == 1, lines
    hosts = "providers[0].kvm.hosts"
    expected = [
        f"{hosts}[0].publicAddress: only with networkMode nat (this host's is route",
        f"{hosts}[1].publicAddress: '2001:db8::1' is not an IPv4 address of the host",
        f"{hosts}[2].publishPorts: '40999-40000' is not a port range first-last within 1024-65535",
        f"{hosts}[3].sourceAddresses[0]: 'not-an-ip' is not an IPv4 address of the host",
        f"{hosts}[4].publicAddress: required with publishPorts",
    ]
    for start in expected:  # each on a line of its own, indented under its provider
        assert sum(line.startswith(f"  {start}") for line in lines) == 1, (start, lines)
    assert not any(line.startswith(f"  {hosts}[5]") for line in lines), lines
    assert "provider home-kvm (kvm): INVALID for some locations (the others take new proxies)" in lines
    # The backend that cannot be reached: its endpoint and the cause, not a bare "ConnectionError".
    assert "provider gcp-eu (gcp): NOT USABLE" in lines
    (unreachable,) = [line for line in lines if line.startswith("  providers[1].gcp: ")]
    assert f"cannot reach {endpoint}: ConnectionError: [Errno 111] Connection refused" in unreachable, unreachable
    assert lines[-1] == f"{config}: 6 error(s)"


def test_a_root_error_lists_every_error_on_its_own_line(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"providers": [
        kvm_provider([host("six", publicAddress="2001:db8::1", publishPorts="40000-40999")]),
        {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "Egress", "image": "squid:6"}},
    ]}))

    code, lines = check(tmp_path, "--provider-config", str(config))

    assert code == 1
    assert lines[0] == f"INVALID: provider config {config}"
    errors = [line for line in lines if line.startswith("  ")]
    assert [error.split(":")[0].strip() for error in errors] == [
        "owner", "providers[0].kvm.hosts[0].publicAddress", "providers[1].kubernetes.namespace"], lines
    assert not any(";" in error for error in errors[:1]), errors
    assert lines[-1] == f"{config}: 3 error(s)"


def test_the_tokens_file_alone_is_checked_alone(tmp_path: Path) -> None:
    """docs/operations.md's ``--check-config --discovery-tokens FILE``: the default provider
    config path (absent here) is not read."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "crawlers", "namespaces": ["crawlers"], "sha256": "b" * 64}]))
    assert check(tmp_path, "--discovery-tokens", str(tokens)) == (0, [f"{tokens}: valid"])

    tokens.write_text(yaml.safe_dump([{"name": "a", "namespaces": "crawlers", "sha256": "x"}]))
    code, lines = check(tmp_path, "--discovery-tokens", str(tokens))
    assert code == 1 and lines[0] == f"INVALID: discovery tokens {tokens}", lines
    assert [line.split(":")[0] for line in lines[1:-1]] == ["  entry[0] (a)", "  entry[0] (a)"], lines
    assert lines[-1] == f"{tokens}: 2 error(s)"


def test_a_relative_collections_path_finds_the_collection(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": "prod-cluster-1", "providers": [
        kvm_provider([host("good", publicAddress="203.0.113.12", publishPorts="42000-42999")])]}))
    relative = os.path.relpath(collections_path(), tmp_path)
    assert not os.path.isabs(relative)
    done = run_refused(["--check-config", "--work-dir", "work", "--provider-config", "providers.yaml"],
                       timeout=180, cwd=tmp_path, env={**environment(), "ANSIBLE_COLLECTIONS_PATH": relative})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["provider home-kvm (kvm): ok", f"{config}: valid"]
