"""Host keys can never be switched off: refused KVM host URIs never reach libvirt, accepted ones do.

A fake ``ssh`` first on PATH records every run (its arguments) in a marker file and exits 255;
a loopback listener that sends an SSH banner records every TCP connection. Both are what
libvirt 9.0 itself uses: its ssh transport runs ``ssh`` from PATH (or ``command=``), its
tcp/libssh/libssh2 transports connect. Nothing here leaves 127.0.0.1.

1. The premise, measured with a real ``libvirt.open``: given each refused URI directly,
   libvirt runs the fake ssh with ``StrictHostKeyChecking=no`` or connects to the listener,
   so the refusals below guard something real (and these tests can fail).
2. Through the connection layer (``KvmConnections.open``) and through the module run by
   ansible, every refused URI fails ``permanent`` naming the URI, and neither ssh nor the
   listener ever sees anything.
3. An accepted URI does reach libvirt: the fake ssh runs, through the wrapper that pins
   ``StrictHostKeyChecking=yes`` and our known_hosts, whatever the case of the transport.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, ProxyError
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.connection import KvmConnections
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost, SshSettings
from support.collection.modules import run_module
from support.collection.provider_config import OWNER, OWNER_TAGS, make_base_image

# {port}, {ssh}: the listener's port and the fake ssh's path, filled in per test.
REFUSED = [
    "qemu+ssh://root@127.0.0.1:{port}/system?no_verify=1",
    "qemu+SSH://root@127.0.0.1:{port}/system?no_verify=1",  # the upper-case transport
    "qemu+ssh://root@127.0.0.1:{port}/system?NO_VERIFY=1",  # libvirt compares names case-insensitively
    "qemu+ssh://root@127.0.0.1:{port}/system?no%5Fverify=1",  # ... and unescapes them
    "qemu+ssh://root@127.0.0.1:{port}/system?socket=/run/x;no_verify=1",  # ... and splits on ';' too
    "qemu+ssh://root@127.0.0.1:{port}/system?command={ssh}",
    "qemu+ssh://root@127.0.0.1:{port}/system?netcat=/tmp/evil",
    "qemu+ext:///system?command={ssh}",
    "qemu+tcp://127.0.0.1:{port}/system",
    "qemu+libssh2://root@127.0.0.1:{port}/system?known_hosts_verify=ignore",
    "qemu+libssh://root@127.0.0.1:{port}/system?known_hosts_verify=auto",
    "qemu+libssh2://root@127.0.0.1:{port}/system?known_hosts=/dev/null",
    "qemu+tls://127.0.0.1:{port}/system?no_verify=1",
    "qemu://127.0.0.1:{port}/system",
]
# libvirt 9.0 stops at the missing CA certificate (/etc/pki/CA/cacert.pem) before it connects:
# the premise cannot be observed for these here, their refusal is checked all the same.
TLS = ("qemu+tls://", "qemu://")


@dataclass
class Witness:
    """What would show that a URI reached libvirt: an ssh run, a TCP connection, a libvirt.open."""

    marker: Path
    ssh: Path
    port: int
    connections: list[tuple[str, int]] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)

    def ssh_runs(self) -> list[list[str]]:
        """The argument lists of every fake-ssh run so far."""
        if not self.marker.exists():
            return []
        runs = self.marker.read_text().split("\0--end--\0")
        return [run.split("\0")[:-1] for run in runs if run]

    def reset(self) -> None:
        self.marker.unlink(missing_ok=True)
        self.connections.clear()
        self.opened.clear()

    def uri(self, template: str) -> str:
        return template.format(port=self.port, ssh=self.ssh)


@pytest.fixture
def witness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Witness]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ssh-ran"
    fake = bin_dir / "ssh"
    # Each run appends its arguments, NUL-separated, then a terminator.
    fake.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >> {marker}\n"
                    f"printf -- '--end--\\0' >> {marker}\nexit 255\n")
    fake.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    witness = Witness(marker=marker, ssh=fake, port=listener.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            witness.connections.append(peer)
            with conn:
                try:
                    conn.sendall(b"SSH-2.0-witness\r\n")
                    conn.settimeout(1)
                    conn.recv(4096)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    real_open: Callable[..., Any] = libvirt.open

    def recording_open(uri: str | None = None) -> Any:
        witness.opened.append(uri or "")
        return real_open(uri)

    monkeypatch.setattr(libvirt, "open", recording_open)
    try:
        yield witness
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.fixture
def ssh_settings(tmp_path: Path, witness: Witness) -> SshSettings:
    """A real client key and a known_hosts naming a (made-up, never used) host key for the listener."""
    key = tmp_path / "id_ed25519"
    host_key = tmp_path / "host_ed25519"
    for path in (key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True,
                       timeout=30)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{witness.port} {(host_key.with_suffix('.pub')).read_text()}")
    return SshSettings(key_file=str(key), known_hosts_file=str(known_hosts))


def settle(witness: Witness) -> None:
    """Let the listener thread record a connection libvirt may just have made."""
    threading.Event().wait(0.3)
    del witness


@pytest.mark.parametrize("template", REFUSED)
def test_libvirt_itself_would_act_on_each_refused_uri(witness: Witness, template: str) -> None:
    uri = witness.uri(template)
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    with pytest.raises(libvirt.libvirtError):
        libvirt.open(uri)
    settle(witness)
    if template.startswith(TLS):
        assert not witness.ssh_runs()
        assert not witness.connections
        return
    runs = witness.ssh_runs()
    assert runs or witness.connections, f"libvirt neither ran ssh nor connected for {uri}"
    if "no_verify" in template.lower() or "no%5fverify" in template.lower():
        (run,) = runs
        assert "StrictHostKeyChecking=no" in run  # what the refusal prevents


@pytest.mark.parametrize("template", REFUSED)
def test_refused_uris_never_reach_libvirt_through_the_connection_layer(witness: Witness, ssh_settings: SshSettings,
                                                                       template: str) -> None:
    uri = witness.uri(template)
    connections = KvmConnections(ssh_settings)
    try:
        with pytest.raises(Permanent) as caught:
            connections.open(KvmHost(name="h1", uri=uri))
    finally:
        connections.close()
    settle(witness)
    assert str(caught.value).startswith(f"kvm.hosts[h1].uri: {uri!r} ")
    assert witness.opened == []
    assert witness.ssh_runs() == []
    assert witness.connections == []


@pytest.mark.parametrize("transport", ["ssh", "SSH", "Ssh"])
def test_an_accepted_ssh_uri_runs_ssh_with_host_keys_pinned(witness: Witness, ssh_settings: SshSettings,
                                                            transport: str) -> None:
    uri = f"qemu+{transport}://root@127.0.0.1:{witness.port}/system"
    connections = KvmConnections(ssh_settings)
    try:
        with pytest.raises(ProxyError):  # the fake ssh exits 255: libvirt reads nothing back
            connections.open(KvmHost(name="h1", uri=uri))
    finally:
        connections.close()
    (opened,) = witness.opened
    assert "command=" in opened and "no_verify=0" in opened
    (run,) = witness.ssh_runs()
    # The wrapper's options come first, and ssh keeps the first value it reads for an option.
    assert run[:8] == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
                       f"UserKnownHostsFile={ssh_settings.known_hosts_file}", "-o", "GlobalKnownHostsFile=/dev/null"]
    assert "StrictHostKeyChecking=no" not in run
    assert "127.0.0.1" in run


def test_an_accepted_libssh2_uri_reaches_libvirt_with_our_known_hosts(witness: Witness,
                                                                      ssh_settings: SshSettings) -> None:
    uri = f"qemu+LIBSSH2://root@127.0.0.1:{witness.port}/system"
    connections = KvmConnections(ssh_settings)
    try:
        with pytest.raises(ProxyError):  # the witness is no sshd: the handshake fails
            connections.open(KvmHost(name="h1", uri=uri))
    finally:
        connections.close()
    settle(witness)
    (opened,) = witness.opened
    assert f"known_hosts={ssh_settings.known_hosts_file}" in opened
    assert "known_hosts_verify=normal" in opened
    # One connection is the module's own banner probe, the other libvirt's handshake.
    assert len(witness.connections) == 2
    assert witness.ssh_runs() == []


# --- Through the module, as the controller runs it ---------------------------------------------


def write_config(path: Path, witness: Witness, ssh: SshSettings, lab_uris: list[str]) -> Path:
    """Provider ``lab`` with one host per refused URI; provider ``good`` with one accepted ssh host."""
    image = make_base_image(path.parent)

    def kvm(uris: list[str]) -> dict[str, Any]:
        return {
            "ssh": {"keyFile": ssh.key_file, "knownHostsFile": ssh.known_hosts_file},
            "hosts": [{"name": f"h{index}", "uri": uri, "domainType": "qemu"} for index, uri in enumerate(uris)],
            "images": {"debian-12": {"url": image.url, "sha256": image.sha256}},
            "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}},
        }

    document = {"owner": OWNER, "providers": [
        {"name": "lab", "type": "kvm", "kvm": kvm(lab_uris)},
        {"name": "good", "type": "kvm", "kvm": kvm([f"qemu+ssh://root@127.0.0.1:{witness.port}/system"])},
    ]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_the_module_refuses_every_bad_uri_and_still_serves_the_good_provider(
        tmp_path: Path, witness: Witness, ssh_settings: SshSettings) -> None:
    uris = [witness.uri(template) for template in REFUSED]
    config = write_config(tmp_path / "providers.yaml", witness, ssh_settings, uris)

    refused = run_module("kvm_proxy_info", {"provider_config": str(config), "provider": "lab", "tags": OWNER_TAGS})
    assert refused.failed and refused.result["error_class"] == "permanent", refused.result
    message = refused.result["msg"]
    assert f"{len(uris)} errors:" in message
    for index, uri in enumerate(uris):
        assert f"providers[0].kvm.hosts[{index}].uri: {uri!r} " in message
    settle(witness)
    assert witness.ssh_runs() == []
    assert witness.connections == []

    # The other provider in the same file works: its module run reaches the (fake) host.
    served = run_module("kvm_proxy_info", {"provider_config": str(config), "provider": "good", "tags": OWNER_TAGS})
    assert served.failed, served.result  # the witness is no hypervisor
    assert served.result["failed_locations"]["h0"]["error_class"] in ("transient", "permanent")
    (run,) = witness.ssh_runs()
    assert "StrictHostKeyChecking=yes" in run and "StrictHostKeyChecking=no" not in run
