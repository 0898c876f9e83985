"""KVM connections: host-key pinning in the URI, lazy SSH material checks, libvirt error classes.

Keys and known_hosts lines are made by the real ``ssh-keygen``; the plain-ssh wrapper is run
with ``ssh -G``, which prints the options ssh would use without connecting anywhere.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import libvirt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NotFound,
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import classify
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.connection import (
    check_known_hosts,
    check_private_key,
    connection_uri,
    transport_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import SshSettings

SSH = SshSettings(key_file="/etc/egress-proxies/kvm-ssh/id_ed25519",
                  known_hosts_file="/etc/egress-proxies/kvm-ssh/known_hosts")


def query_of(uri: str) -> dict[str, str]:
    """The URI's query as a dict; each parameter must appear exactly once."""
    parsed = parse_qs(urlsplit(uri).query, keep_blank_values=True, strict_parsing=True)
    assert all(len(values) == 1 for values in parsed.values()), parsed
    return {key: values[0] for key, values in parsed.items()}


@pytest.mark.parametrize(
    ("uri", "transport"),
    [
        ("qemu+libssh://root@beelink/system", "libssh"),
        ("qemu+libssh2://root@beelink/system", "libssh2"),
        ("qemu+ssh://root@beelink:2222/system", "ssh"),
        ("qemu+unix:///system?socket=/run/x.sock", "unix"),
        ("qemu+tcp://beelink/system", "tcp"),
        ("qemu:///system", ""),
        ("test:///default", ""),
    ],
)
def test_transport_of(uri: str, transport: str) -> None:
    assert transport_of(uri) == transport


def test_libssh_travels_over_libssh2_with_key_and_known_hosts_pinned() -> None:
    # libvirt 9.0's libssh transport stalls on replies over 4 KiB (a running domain's XML).
    uri = connection_uri("qemu+libssh://root@beelink/system", SSH)
    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc, parts.path) == ("qemu+libssh2", "root@beelink", "/system")
    assert query_of(uri) == {"keyfile": SSH.key_file, "known_hosts": SSH.known_hosts_file, "sshauth": "privkey",
                             "known_hosts_verify": "normal", "no_verify": "0"}


def test_libssh2_also_asks_for_normal_host_key_verification() -> None:
    uri = connection_uri("qemu+libssh2://root@beelink:2222/system", SSH)
    assert urlsplit(uri).netloc == "root@beelink:2222"
    assert query_of(uri) == {"keyfile": SSH.key_file, "known_hosts": SSH.known_hosts_file, "sshauth": "privkey",
                             "known_hosts_verify": "normal", "no_verify": "0"}


def test_existing_query_parameters_are_kept() -> None:
    uri = connection_uri("qemu+libssh://root@beelink/system?socket=/run/libvirt/libvirt-sock&mode=legacy", SSH)
    query = query_of(uri)
    assert query["socket"] == "/run/libvirt/libvirt-sock"
    assert query["mode"] == "legacy"
    assert query["known_hosts"] == SSH.known_hosts_file


def test_configured_ssh_parameters_are_overridden_by_ours() -> None:
    uri = connection_uri("qemu+libssh://root@beelink/system?known_hosts=/dev/null&no_verify=0", SSH)
    query = query_of(uri)
    assert query["known_hosts"] == SSH.known_hosts_file
    assert query["no_verify"] == "0"


def test_paths_with_special_characters_survive_the_query() -> None:
    ssh = SshSettings(key_file="/keys/a b&c=d/id", known_hosts_file="/keys/known hosts+1")
    query = query_of(connection_uri("qemu+libssh://root@beelink/system", ssh))
    assert (query["keyfile"], query["known_hosts"]) == (ssh.key_file, ssh.known_hosts_file)


@pytest.mark.parametrize("scheme", ["qemu+libssh", "qemu+libssh2", "qemu+ssh"])
def test_no_verify_in_the_config_is_permanent(scheme: str, tmp_path: Path) -> None:
    with pytest.raises(Permanent, match="no_verify"):
        connection_uri(f"{scheme}://root@beelink/system?no_verify=1", SSH, str(tmp_path))


def test_an_ssh_uri_without_ssh_settings_is_permanent() -> None:
    with pytest.raises(Permanent, match=r"^kvm\.ssh: "):
        connection_uri("qemu+libssh://root@beelink/system", None)


@pytest.mark.parametrize(
    "uri",
    ["qemu:///system", "qemu+unix:///system?socket=/run/x.sock", "test+unix:///default?socket=/tmp/t.sock",
     "test:///default", "qemu+tcp://beelink/system"],
)
def test_uris_without_ssh_are_unchanged(uri: str) -> None:
    assert connection_uri(uri, None) == uri
    assert connection_uri(uri, SSH) == uri


def test_plain_ssh_runs_through_a_verifying_wrapper(tmp_path: Path) -> None:
    uri = connection_uri("qemu+ssh://root@beelink/system?socket=/run/x.sock", SSH, str(tmp_path))
    query = query_of(uri)
    assert query["socket"] == "/run/x.sock"
    assert query["no_verify"] == "0"
    wrapper = Path(query["command"])
    assert wrapper.parent == tmp_path
    assert wrapper.is_file()
    assert os.access(wrapper, os.X_OK)
    script = wrapper.read_text()
    assert "StrictHostKeyChecking=yes" in script
    assert f"UserKnownHostsFile='{SSH.known_hosts_file}'" in script


def test_the_wrapper_is_written_once_and_never_rewritten_while_it_may_run(tmp_path: Path) -> None:
    """Host entries sharing a URI connect side by side; rewriting the wrapper while another
    connection's ssh ran it failed libvirt's exec with "Text file busy" (issue 39 item 5)."""
    first = Path(query_of(connection_uri("qemu+ssh://root@beelink/system", SSH, str(tmp_path)))["command"])
    written = first.stat()
    again = Path(query_of(connection_uri("qemu+ssh://root@beelink/system", SSH, str(tmp_path)))["command"])
    assert again == first
    assert (again.stat().st_ino, again.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)


def test_plain_ssh_without_a_wrapper_directory_is_permanent() -> None:
    with pytest.raises(Permanent, match="wrapper"):
        connection_uri("qemu+ssh://root@beelink/system", SSH)


def test_the_wrapper_makes_ssh_verify_against_our_known_hosts(tmp_path: Path, ed25519_key: Path) -> None:
    # A quote and a space in the key's path check the wrapper's shell quoting end to end.
    key = tmp_path / "it's a dir" / "id_ed25519"
    key.parent.mkdir()
    key.write_bytes(ed25519_key.read_bytes())
    known_hosts = tmp_path / "known_hosts"
    ssh = SshSettings(key_file=str(key), known_hosts_file=str(known_hosts))
    command = query_of(connection_uri("qemu+ssh://root@beelink/system", ssh, str(tmp_path)))["command"]
    # libvirt appends its own arguments; -G makes ssh print its effective options and exit.
    result = subprocess.run([command, "-G", "-l", "root", "beelink"], capture_output=True, text=True,
                            check=True, timeout=10)
    lines = result.stdout.splitlines()
    assert "stricthostkeychecking true" in lines
    assert f"userknownhostsfile {known_hosts}" in lines
    assert "globalknownhostsfile /dev/null" in lines
    assert "batchmode yes" in lines
    assert f"identityfile {key}" in lines


# --- SSH material, made by ssh-keygen ---------------------------------------------------------


def ssh_keygen(path: Path, *args: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-f", str(path), "-C", "test", *args], check=True, timeout=30)
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys")
    ssh_keygen(directory / "ed25519", "-t", "ed25519", "-N", "")
    ssh_keygen(directory / "rsa-pem", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "")
    ssh_keygen(directory / "ed25519-encrypted", "-t", "ed25519", "-N", "correct horse")
    ssh_keygen(directory / "rsa-pem-encrypted", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "correct horse")
    return directory


@pytest.fixture
def ed25519_key(keys: Path) -> Path:
    return keys / "ed25519"


@pytest.mark.parametrize("name", ["ed25519", "rsa-pem"])
def test_unencrypted_private_keys_are_accepted(keys: Path, name: str) -> None:
    check_private_key(str(keys / name))


def test_a_missing_key_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Transient, match=r"^kvm\.ssh\.keyFile: .* does not exist"):
        check_private_key(str(tmp_path / "id_ed25519"))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"not a key\n", id="garbage"),
        pytest.param(b"", id="empty"),
        pytest.param(b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
                     id="truncated"),
    ],
)
def test_a_garbage_key_is_permanent(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "id"
    path.write_bytes(content)
    with pytest.raises(Permanent, match=r"^kvm\.ssh\.keyFile: .* is not an SSH private key"):
        check_private_key(str(path))


def test_a_public_key_in_place_of_the_private_key_is_permanent(keys: Path) -> None:
    with pytest.raises(Permanent, match="is not an SSH private key"):
        check_private_key(str(keys / "ed25519.pub"))


@pytest.mark.parametrize("name", ["ed25519-encrypted", "rsa-pem-encrypted"])
def test_an_encrypted_key_is_permanent(keys: Path, name: str) -> None:
    with pytest.raises(Permanent, match=r"^kvm\.ssh\.keyFile: .* is encrypted"):
        check_private_key(str(keys / name))


def known_hosts_line(keys: Path, host: str = "beelink") -> str:
    return f"{host} {(keys / 'ed25519.pub').read_text().strip()}"


def test_known_hosts_from_real_keys_are_accepted(keys: Path, tmp_path: Path) -> None:
    rsa = (keys / "rsa-pem.pub").read_text().strip()
    path = tmp_path / "known_hosts"
    lines = ["# our hypervisors", "", known_hosts_line(keys), f"[beelink]:2222,192.0.2.1 {rsa}",
             f"@cert-authority *.lan {rsa}"]
    path.write_text("\n".join(lines) + "\n")
    check_known_hosts(str(path))


def test_hashed_known_hosts_made_by_ssh_keygen_are_accepted(keys: Path, tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(known_hosts_line(keys) + "\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True, timeout=30)
    assert path.read_text().startswith("|1|")
    check_known_hosts(str(path))


def test_missing_known_hosts_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Transient, match=r"^kvm\.ssh\.knownHostsFile: .* does not exist"):
        check_known_hosts(str(tmp_path / "known_hosts"))


@pytest.mark.parametrize(
    "bad_line",
    [
        pytest.param("this is not a host key", id="garbage"),
        pytest.param("beelink ssh-ed25519", id="no-key"),
        pytest.param("beelink ssh-foo AAAAC3NzaC1lZDI1NTE5AAAAIB", id="unknown-type"),
        pytest.param("beelink ssh-ed25519 not*base64", id="not-base64"),
        pytest.param("beelink ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGGVQUtm", id="blob-of-another-type"),
    ],
)
def test_a_garbage_known_hosts_line_is_permanent_with_its_line_number(keys: Path, tmp_path: Path,
                                                                       bad_line: str) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n{known_hosts_line(keys)}\n{bad_line}\n")
    with pytest.raises(Permanent, match=r"^kvm\.ssh\.knownHostsFile: .* line 3 is not a known_hosts entry"):
        check_known_hosts(str(path))


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n\n   # another\n"],
                         ids=["empty", "blank", "comments"])
def test_known_hosts_without_entries_is_permanent(tmp_path: Path, content: str) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(content)
    with pytest.raises(Permanent, match="has no host keys"):
        check_known_hosts(str(path))


# --- libvirt error classes --------------------------------------------------------------------


def libvirt_error(code: int, message: str, domain: int = libvirt.VIR_FROM_NONE) -> libvirt.libvirtError:
    """A libvirtError as the bindings raise it: ``err`` is virGetLastError()'s tuple,
    (code, domain, message, level, str1, str2, str3, int1, int2)."""
    error = libvirt.libvirtError(message)
    error.err = (code, domain, message, libvirt.VIR_ERR_ERROR, message, None, None, -1, -1)
    return error


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        pytest.param(libvirt.VIR_ERR_NO_DOMAIN, "Domain not found: no domain with matching name 'x'", NotFound,
                     id="no-domain"),
        pytest.param(libvirt.VIR_ERR_NO_STORAGE_VOL, "Storage volume not found", NotFound, id="no-volume"),
        pytest.param(libvirt.VIR_ERR_NO_STORAGE_POOL, "Storage pool not found: no pool 'default'", Permanent,
                     id="no-pool"),
        pytest.param(libvirt.VIR_ERR_NO_NETWORK, "Network not found", Permanent, id="no-network"),
        pytest.param(libvirt.VIR_ERR_AUTH_FAILED, "authentication failed: no agent", Permanent,
                     id="auth-failed"),
        pytest.param(libvirt.VIR_ERR_ACCESS_DENIED, "access denied", Permanent, id="access-denied"),
        pytest.param(libvirt.VIR_ERR_XML_ERROR, "XML error: bad", Permanent, id="xml-error"),
        pytest.param(libvirt.VIR_ERR_RPC, "Cannot recv data: Connection reset by peer", Transient, id="rpc"),
        pytest.param(libvirt.VIR_ERR_SYSTEM_ERROR, "Cannot connect: No route to host", Transient,
                     id="system-error"),
        pytest.param(libvirt.VIR_ERR_OPERATION_TIMEOUT, "timed out", Transient, id="timeout"),
        pytest.param(libvirt.VIR_ERR_INTERNAL_ERROR, "something odd", Transient, id="unknown-is-transient"),
        pytest.param(libvirt.VIR_ERR_SYSTEM_ERROR, "Host key verification failed.", Permanent,
                     id="ssh-host-key"),
        pytest.param(libvirt.VIR_ERR_LIBSSH, "authentication failed: the host key has changed", Permanent,
                     id="libssh-host-key"),
        pytest.param(libvirt.VIR_ERR_LIBSSH, "Failed to add the host to known_hosts", Permanent,
                     id="libssh-known-hosts"),
    ],
)
def test_classify(code: int, message: str, expected: type[ProxyError]) -> None:
    result = classify(libvirt_error(code, message), "connecting to KVM host beelink")
    assert type(result) is expected
    assert str(result).startswith(f"connecting to KVM host beelink: {message}")


def test_a_libvirt_error_without_details_is_transient() -> None:
    libvirt.virResetLastError()  # an earlier test's global libvirt error must not leak into this one
    error = libvirt.libvirtError("connection dropped")
    error.err = None
    result = classify(error, "listing domains")
    assert type(result) is Transient
    assert str(result) == "listing domains: connection dropped"


def test_a_host_key_failure_says_how_to_fix_it() -> None:
    result = classify(libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, "Host key verification failed."), "ctx")
    assert "kvm.ssh.knownHostsFile" in str(result)
