# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connections to KVM hosts: one per host and run, with host-key verification pinned in the URI.

SSH transports always verify the host key against the configured known_hosts:
- ``qemu+libssh://`` / ``qemu+libssh2://``: libvirt's own SSH clients, which honour
  ``keyfile=``, ``known_hosts=`` and ``sshauth=privkey`` (measured with libvirt 9.0). Both
  are carried over libssh2: libvirt 9.0's libssh transport stalls on any reply over 4 KiB
  (a running domain's XML) until more traffic arrives, which without an event loop is never.
- ``qemu+ssh://``: libvirt 9's plain transport ignores ``known_hosts=``, so it is run
  through a small ssh wrapper that adds ``UserKnownHostsFile`` and
  ``StrictHostKeyChecking=yes``.
Local URIs (``qemu:///system``, ``qemu+unix://...?socket=``, ``test+unix://...``) need
no SSH material at all. Every other transport, and every URI parameter that could switch
verification off or run a command, is refused before libvirt sees the URI
(``settings.libvirt_uri_problem``, checked again in ``KvmConnections.open``). Transports are
compared case-insensitively, as libvirt compares them.

The SSH key and known_hosts are read lazily, at the first connection that needs them:
a missing file is ``Transient`` (the Secret may be mounted later and the next
reconcile heals with no restart), a file that does not parse is ``Permanent``.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import quote, urlsplit, urlunsplit

try:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
except ImportError:  # pragma: no cover - cryptography ships with ansible-core
    serialization = None  # type: ignore[assignment]
    UnsupportedAlgorithm = ValueError  # type: ignore[assignment,misc]

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    Permanent,
    ProxyError,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    close_connection,
    open_connection,
    silence_stderr,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import (
    KvmHost,
    SshSettings,
    libvirt_transport,
    libvirt_uri_problem,
    uri_query_parameters,
)

SSH_TRANSPORTS = ("ssh", "libssh", "libssh2")
# How long a host may take to accept a TCP connection before we call it down.
CONNECT_TIMEOUT_SECONDS = 10.0
# Key types a known_hosts line may carry (the SSH wire names).
KNOWN_HOST_KEY_TYPES = (
    "ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
)


def transport_of(uri: str) -> str:
    """``qemu+libssh://...`` -> ``libssh``; ``qemu+SSH://...`` -> ``ssh``; ``qemu:///system`` -> ``""``.

    Lower-cased: libvirt compares transports case-insensitively, so ``qemu+SSH://`` is the
    ssh transport and must get the same host-key pinning."""
    return libvirt_transport(uri)


def _read_material(path: str, field: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError as error:
        raise Transient("%s: %s does not exist (yet): the kvm-ssh Secret may not be mounted; will retry" % (
            field, path)) from error
    except OSError as error:
        raise Transient("%s: cannot read %s: %s; will retry" % (field, path, error.strerror)) from error


def check_private_key(path: str) -> None:
    """Missing -> Transient; present but not an unencrypted private key -> Permanent."""
    data = _read_material(path, "kvm.ssh.keyFile")
    if serialization is None:
        raise Permanent("kvm.ssh.keyFile: the cryptography library is required to check the key")
    loaders: List[Callable[..., Any]] = [serialization.load_ssh_private_key, serialization.load_pem_private_key]
    for loader in loaders:
        try:
            loader(data, password=None)
            return
        except TypeError as error:  # cryptography's way of saying "this key is encrypted"
            raise Permanent("kvm.ssh.keyFile: %s is encrypted; the controller needs a key without a passphrase"
                            % path) from error
        except (ValueError, UnsupportedAlgorithm):
            continue  # not this format; try the next one
    raise Permanent("kvm.ssh.keyFile: %s is not an SSH private key (OpenSSH or PEM); replace the Secret's key"
                    % path)


def check_known_hosts(path: str) -> None:
    """Missing -> Transient; a line that is not ``hosts keytype base64 [comment]`` -> Permanent."""
    data = _read_material(path, "kvm.ssh.knownHostsFile")
    entries = 0
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0].startswith("@"):  # @cert-authority / @revoked markers
            fields = fields[1:]
        if len(fields) < 3 or fields[1] not in KNOWN_HOST_KEY_TYPES or not _is_key_blob(fields[1], fields[2]):
            raise Permanent("kvm.ssh.knownHostsFile: %s line %d is not a known_hosts entry "
                            "('<host> <key-type> <base64-key>'); regenerate it with ssh-keyscan" % (path, number))
        entries += 1
    if entries == 0:
        raise Permanent("kvm.ssh.knownHostsFile: %s has no host keys, so no host could be verified; "
                        "add the hosts' key lines" % path)


def _is_key_blob(key_type: str, blob: str) -> bool:
    """The base64 part decodes and starts with its own key type, as SSH wire format does."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        return False
    name = key_type.encode()
    return len(raw) > 4 + len(name) and raw[4:4 + len(name)] == name


def _ssh_wrapper(ssh: SshSettings, directory: str) -> str:
    """An ssh command that always verifies host keys against our known_hosts. Written once per
    directory: rewriting it while another connection's ssh runs it (host entries sharing a URI,
    connected side by side) made libvirt's exec of it fail with "Text file busy"."""
    path = os.path.join(directory, "ssh")
    if os.path.exists(path):
        return path
    with open(path, "w") as handle:
        handle.write(
            "#!/bin/sh\nexec ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=%s "
            "-o GlobalKnownHostsFile=/dev/null -i %s \"$@\"\n" % (_shell_quote(ssh.known_hosts_file),
                                                                  _shell_quote(ssh.key_file)))
    os.chmod(path, stat.S_IRWXU)
    return path


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def connection_uri(uri: str, ssh: Optional[SshSettings], wrapper_dir: Optional[str] = None) -> str:
    """The configured URI with the parameters that pin host-key verification to our files."""
    transport = transport_of(uri)
    if transport not in SSH_TRANSPORTS:
        return uri
    if ssh is None:
        raise Permanent("kvm.ssh: %s is an SSH URI, so kvm.ssh.keyFile and knownHostsFile are required" % uri)
    parts = urlsplit(uri)
    # Read the query as libvirt does (names case-insensitive, '&' or ';'), so what we override is
    # what libvirt would have used.
    params = dict(uri_query_parameters(parts.query))
    if params.get("no_verify", "0") != "0":
        raise Permanent("kvm.hosts[].uri: %s sets no_verify; host keys are always verified, remove it" % uri)
    scheme = parts.scheme
    if transport in ("libssh", "libssh2"):
        # libvirt 9.0's libssh transport stalls on any reply over 4 KiB (a running domain's
        # XML) until more traffic arrives, i.e. forever without an event loop (measured):
        # both take the same parameters, so libssh2 carries both.
        scheme = scheme.split("+", 1)[0] + "+libssh2"
        params.update(keyfile=ssh.key_file, known_hosts=ssh.known_hosts_file, sshauth="privkey",
                      known_hosts_verify="normal")
    else:
        if wrapper_dir is None:
            raise Permanent("internal: the ssh transport needs a directory for its command wrapper")
        params.update(command=_ssh_wrapper(ssh, wrapper_dir), keyfile=ssh.key_file)
    params["no_verify"] = "0"
    query = "&".join("%s=%s" % (key, quote(value, safe="/")) for key, value in params.items())
    return urlunsplit((scheme, parts.netloc, parts.path, query, parts.fragment))


def _check_reachable(uri: str) -> None:
    """Fail fast and transient when an SSH host does not accept TCP connections."""
    parts = urlsplit(uri)
    if not parts.hostname:
        return
    where = "%s:%s" % (parts.hostname, parts.port or 22)
    try:
        with socket.create_connection((parts.hostname, parts.port or 22), timeout=CONNECT_TIMEOUT_SECONDS) as sock:
            # libssh2 waits forever for a banner that never comes (a hung sshd): ask for it here.
            banner = sock.recv(255)
    except OSError as error:
        raise Transient("host %s does not answer: %s" % (where, error)) from error
    if not banner.startswith(b"SSH-"):
        raise Transient("host %s accepted the connection but sent no SSH banner within %d s" % (
            where, CONNECT_TIMEOUT_SECONDS))


class KvmConnections:
    """One connection per host for one module run, shared by the run's threads; SSH material
    is checked lazily, once.

    A batch's items run in threads (proxy_module.run_items) and share these connections:
    libvirt is thread safe since 0.6.0, so one virConnect may serve several threads at once
    (libvirt's FAQ and "Thread safety" page; its errors are kept per thread), and the Python
    binding releases the GIL around every call, so the threads' RPCs overlap on the one
    connection. A host that cannot be reached fails every item bound for it with the same
    error, tried once per run: each item retrying would only wait out the same timeout again.
    """

    def __init__(self, ssh: Optional[SshSettings]) -> None:
        self.ssh = ssh
        self._connections: Dict[str, Any] = {}
        self._failures: Dict[str, ProxyError] = {}
        self._ssh_checked = False
        self._wrapper_dir: Optional[str] = None
        self._lock = threading.Lock()  # guards the dicts, the SSH check and the wrapper dir
        self._host_locks: Dict[str, threading.Lock] = {}
        silence_stderr()

    def open(self, host: KvmHost) -> Any:
        with self._lock:
            host_lock = self._host_locks.setdefault(host.name, threading.Lock())
        # Per host, so that a slow host never holds up the threads bound for another one.
        with host_lock:
            if host.name in self._connections:
                return self._connections[host.name]
            failure = self._failures.get(host.name)
            if failure is not None:
                raise type(failure)(str(failure))  # a fresh one: threads must not share a traceback
            try:
                connection = self._open(host)
            except ProxyError as error:
                self._failures[host.name] = error
                raise
            self._connections[host.name] = connection
            return connection

    def _open(self, host: KvmHost) -> Any:
        uri = host.uri
        # The config refuses these already; checked again here because this is the one place
        # a URI reaches libvirt, whoever built the KvmHost.
        problem = libvirt_uri_problem(uri)
        if problem is not None:
            raise Permanent("kvm.hosts[%s].uri: %r %s" % (host.name, uri, problem))
        if transport_of(uri) in SSH_TRANSPORTS:
            if self.ssh is None:
                raise Permanent("kvm.ssh: host %s uses SSH, so kvm.ssh is required" % host.name)
            with self._lock:
                if not self._ssh_checked:
                    check_private_key(self.ssh.key_file)
                    check_known_hosts(self.ssh.known_hosts_file)
                    self._ssh_checked = True
                if transport_of(uri) == "ssh" and self._wrapper_dir is None:
                    self._wrapper_dir = tempfile.mkdtemp(prefix="egress-proxies-ssh-")
                # Under the lock: the wrapper is written by the first connection, before any runs it.
                uri = connection_uri(uri, self.ssh, self._wrapper_dir)
            _check_reachable(uri)
        return open_connection(uri, "connecting to KVM host %s" % host.name)

    def close(self) -> None:
        for connection in self._connections.values():
            close_connection(connection)
        self._connections.clear()
        self._failures.clear()
        if self._wrapper_dir is not None:
            for name in os.listdir(self._wrapper_dir):
                os.unlink(os.path.join(self._wrapper_dir, name))
            os.rmdir(self._wrapper_dir)
            self._wrapper_dir = None
