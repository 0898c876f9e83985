"""A fresh Debian 12 VM to bootstrap with the kvm_hypervisor role: the ``kvm_hypervisor_vm`` scenario.

The VM boots from the cached guest image (:mod:`support.images.guest_image`) under software emulation,
inside a :class:`~support.hosts.hypervisor_host.HypervisorHost`: libvirtd and sshd in a network
namespace this machine creates. Its only network is a libvirt network inside that namespace
without ``<forward>`` (libvirt's DHCP hands out no router), so it reaches nothing but the
namespace. The role's Debian packages come from a flat repository (:mod:`support.images.package_repo`)
served over HTTP inside the namespace.

The guest image has no SSH server, as a cloud image would. Its first boot installs one
(cloud-init, from the local repository) and then removes the repository's source and the package
lists again, so the guest starts the scenario as a cloud image does: sshd running, no package
lists. Everything SSH needs is made here, per run, before the VM first boots:

- the guest's host keys (ed25519, ECDSA, RSA), written by cloud-init before openssh-server is
  installed (its postinst then makes none), so the known_hosts file molecule checks against is
  exact before first contact;
- the key molecule logs in as root with (the role's own key is a third one, which it authorizes
  for its user).

Ansible reaches the guest from this machine through the namespace's sshd (``ssh -W``, both hops
verifying their host keys). Commands that must come from inside the namespace (the verify
step's ``virsh``) run under ``ip netns exec``.

    cd tests && python -m support.hosts.hypervisor_vm up --state FILE --lab FILE --inventory FILE
    cd tests && python -m support.hosts.hypervisor_host down --state FILE

``up`` starts the host, serves the repository, makes keys, seed ISO and overlay disk, and writes
the lab file (JSON: what create.yml defines with community.libvirt, what verify.yml checks) and
the Ansible inventory. It does not define the network or the domain: create.yml does. Stopping
the host kills the VM and the repository's server with everything else in the namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import yaml

from support import REPO
from support.hosts.hypervisor_host import INVENTORY_GROUP, INVENTORY_HOST, HypervisorHost
from support.images.guest_image import guest_image
from support.images.package_repo import PackageRepo, package_repo, serve_repo

ROLE_DEFAULTS = REPO / "roles" / "kvm_hypervisor" / "defaults" / "main.yml"
IMAGE_VARIANT = "agent"
# Beyond the role's packages: the SSH server the first boot installs, and python3-apt, which
# the image lacks and Ansible's apt module installs itself before anything else.
EXTRA_PACKAGES = ("openssh-server", "python3-apt")
HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")

NETWORK_NAME = "vmlab"
BRIDGE = "egpvmbr0"
DOMAIN_NAME = "kvm-hypervisor-vm"
# A fixed MAC with a DHCP host entry: the guest's address is known before it boots.
GUEST_MAC = "52:54:00:e9:16:0a"
GUEST_HOST_PART = 10
# apt, dpkg and then libvirtd and its python modules: 1 GiB was tight under apt's cache build.
MEMORY_MIB = 1536
VCPUS = 2
REPO_PORT = 8016
DPKG_TEST_CONFIG = (
    "force-unsafe-io\n"
    "path-exclude=/usr/share/doc/*\n"
    "path-include=/usr/share/doc/*/copyright\n"
    "path-exclude=/usr/share/man/*\n"
    "path-exclude=/usr/share/info/*\n"
    "path-exclude=/usr/share/locale/*\n"
)
APT_SOURCE_NAME = "egress-proxies-test"


def role_packages() -> list[str]:
    """The role's default ``kvm_hypervisor_packages``: what converge installs."""
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    return [str(name) for name in defaults["kvm_hypervisor_packages"]]


def _ssh_keygen(path: Path, key_type: str) -> str:
    """Make a key pair at ``path``; return the public key's ``type base64`` part."""
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", "egress-proxies-test-vm", "-f", str(path)],
                   check=True, capture_output=True)
    key_type_name, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{key_type_name} {blob}"


def apt_source_line(url: str) -> str:
    # [trusted=yes]: the repository is unsigned; it exists only for this run, inside the test's
    # namespace, and its files were verified against Debian's keyring when they were fetched.
    return f"deb [trusted=yes] {url} ./"


def user_data(host_keys: dict[str, tuple[str, str]], root_key: str, repo_url: str) -> bytes:
    """The first boot's cloud-config: host keys, root's key, openssh-server, then a clean apt."""
    files: list[dict[str, Any]] = [
        {"path": "/root/.ssh/authorized_keys", "permissions": "0600", "content": root_key + "\n"},
        # What Debian's own container images set, for speed under software emulation: no
        # documentation, manual pages or translations unpacked (and no man-db index to rebuild),
        # no fsync per unpacked file. The role's apt tasks run unchanged.
        {"path": "/etc/dpkg/dpkg.cfg.d/egress-proxies-test", "permissions": "0644", "content": DPKG_TEST_CONFIG},
    ]
    for key_type, (private, public) in host_keys.items():
        files.append({"path": f"/etc/ssh/ssh_host_{key_type}_key", "permissions": "0600", "content": private})
        files.append({"path": f"/etc/ssh/ssh_host_{key_type}_key.pub", "permissions": "0644", "content": public})
    document = {
        "write_files": files,
        "apt": {
            # What the scenario's prepare step sets too (see package_repo: recommended packages
            # do not fit the disk).
            "conf": 'APT::Install-Recommends "false";\n',
            "sources": {APT_SOURCE_NAME: {"source": apt_source_line(repo_url)}},
        },
        "packages": ["openssh-server"],
        # The guest then has what a cloud image has: sshd, no sources, no package lists. The
        # scenario's prepare step adds the source; the role's apt task fetches the lists.
        "runcmd": [
            ["rm", "-f", f"/etc/apt/sources.list.d/{APT_SOURCE_NAME}.list", "/etc/apt/apt.conf.d/94cloud-init-config"],
            ["sh", "-c", "rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb"],
        ],
    }
    return b"#cloud-config\n" + yaml.safe_dump(document, sort_keys=False).encode()


def network_xml(host: HypervisorHost) -> str:
    prefix = host.guest_network_address.rsplit(".", 1)[0]
    return (
        f"<network><name>{NETWORK_NAME}</name><bridge name='{BRIDGE}'/><dns enable='no'/>"
        f"<ip address='{host.guest_network_address}' netmask='255.255.255.0'><dhcp>"
        f"<range start='{prefix}.100' end='{prefix}.199'/>"
        f"<host mac='{GUEST_MAC}' ip='{prefix}.{GUEST_HOST_PART}'/>"
        "</dhcp></ip></network>"
    )


def domain_xml(disk: Path, seed: Path, console_log: Path) -> str:
    return (
        f"<domain type='qemu'><name>{DOMAIN_NAME}</name>"
        f"<memory unit='MiB'>{MEMORY_MIB}</memory><vcpu>{VCPUS}</vcpu>"
        "<os><type arch='x86_64'>hvm</type><boot dev='hd'/></os><features><acpi/><apic/></features>"
        "<on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot><on_crash>destroy</on_crash>"
        "<devices>"
        # cache='unsafe': the guest's flushes are not passed on. The VM is thrown away after the run,
        # and dpkg's fsync per file is most of a package install's time under software emulation.
        f"<disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='unsafe'/>"
        f"<source file={quoteattr(str(disk))}/>"
        "<target dev='vda' bus='virtio'/></disk>"
        f"<disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file={quoteattr(str(seed))}/>"
        "<target dev='sda' bus='sata'/><readonly/></disk>"
        f"<interface type='network'><mac address='{GUEST_MAC}'/><source network='{NETWORK_NAME}'/>"
        "<model type='virtio'/></interface>"
        # The boot log, for a guest that never answers on SSH.
        f"<serial type='file'><source path={quoteattr(str(console_log))}/><target port='0'/></serial>"
        "<rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>"
        "</devices></domain>"
    )


def _seed_iso(user: bytes, instance: str) -> bytes:
    # The collection's own NoCloud seed builder, as the KVM provider uses it.
    from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import (
        build_meta_data,
        build_seed_iso,
        new_instance_id,
    )

    return build_seed_iso(user, build_meta_data(new_instance_id(instance), instance), None)


def _prepare_vm(host: HypervisorHost, repo: PackageRepo, image: Path) -> dict[str, Any]:
    """Keys, seed ISO and overlay disk under the host's directory; the lab's description."""
    vm = host.root / "vm"
    vm.mkdir(mode=0o700)
    guest_address = f"{host.guest_network_address.rsplit('.', 1)[0]}.{GUEST_HOST_PART}"
    host_keys = {}
    known_lines = []
    for key_type in HOST_KEY_TYPES:
        path = vm / f"ssh_host_{key_type}_key"
        public = _ssh_keygen(path, key_type)
        host_keys[key_type] = (path.read_text(), path.with_name(path.name + ".pub").read_text())
        known_lines.append(f"{guest_address} {public}")
    known_hosts = vm / "known_hosts"
    known_hosts.write_text("".join(line + "\n" for line in known_lines))
    root_key = vm / "root_id_ed25519"
    root_public = _ssh_keygen(root_key, "ed25519")
    # A key nobody authorizes: the verify step's "wrong key is refused".
    wrong_key = vm / "wrong_id_ed25519"
    _ssh_keygen(wrong_key, "ed25519")
    repo_url = f"http://{host.guest_network_address}:{REPO_PORT}/"
    seed = vm / "seed.iso"
    seed.write_bytes(_seed_iso(user_data(host_keys, root_public, repo_url), DOMAIN_NAME))
    disk = vm / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image), str(disk)],
                   check=True, capture_output=True)
    console_log = vm / "console.log"
    return {
        "namespace": host.namespace,
        "jump_address": host.address,
        "libvirt_uri": host.uri(),
        "network_name": NETWORK_NAME,
        "network_xml": network_xml(host),
        "domain_name": DOMAIN_NAME,
        "domain_xml": domain_xml(disk, seed, console_log),
        "console_log": str(console_log),
        "guest_address": guest_address,
        "guest_known_hosts": str(known_hosts),
        "guest_host_key_lines": known_lines,
        "root_key_file": str(root_key),
        "wrong_key_file": str(wrong_key),
        "repo_url": repo_url,
        "apt_source_line": apt_source_line(repo_url),
        "apt_source_name": APT_SOURCE_NAME,
        "repo_package_lines": [f"{name}\t{version}" for name, version in sorted(repo.packages.items())],
        "role_packages": role_packages(),
    }


def inventory(host: HypervisorHost, lab: dict[str, Any]) -> dict[str, Any]:
    """The guest as molecule's Ansible reaches it, with the role's variables (its defaults else)."""
    jump = (
        f"ssh -i {host.key_file} -o UserKnownHostsFile={host.known_hosts_file} -o GlobalKnownHostsFile=/dev/null"
        f" -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o BatchMode=yes -W %h:%p root@{host.address}"
    )
    host_vars = {
        "ansible_host": lab["guest_address"],
        "ansible_user": "root",
        "ansible_ssh_private_key_file": lab["root_key_file"],
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={lab['guest_known_hosts']} -o GlobalKnownHostsFile=/dev/null"
            f" -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ProxyCommand=\"{jump}\""
        ),
        # One SSH connection (and one login session, whose systemd --user alone costs the emulated
        # guest ~10 s of CPU to start) for all of molecule's steps.
        "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=120s",
        "ansible_pipelining": True,
        "ansible_python_interpreter": "/usr/bin/python3",
        # Root already; the image has no sudo (the playbook's `become: true` would need it).
        "ansible_become": False,
        # The role's required variables; every other one keeps the role's default, as on a
        # user's first run (libvirtd managed, apt cache refreshed, user egress-proxies).
        "kvm_hypervisor_controller_public_key": host.controller_key_file.with_suffix(".pub").read_text().strip(),
        "kvm_hypervisor_known_hosts_file": str(host.bootstrap_known_hosts_file),
        # Not the role's: for verify.yml.
        "hypervisor_controller_key_file": str(host.controller_key_file),
        "hypervisor_vm": {key: lab[key] for key in (
            "namespace", "guest_host_key_lines", "wrong_key_file", "apt_source_line", "apt_source_name",
            "repo_package_lines", "role_packages")},
    }
    return {INVENTORY_GROUP: {"hosts": {INVENTORY_HOST: host_vars}}}


def up(state: Path, lab_file: Path, inventory_file: Path) -> None:
    timings: dict[str, float] = {}
    started = time.monotonic()
    image = guest_image(IMAGE_VARIANT)
    timings["guest image (build or cache)"] = time.monotonic() - started
    packages = [*role_packages(), *EXTRA_PACKAGES]
    started = time.monotonic()
    repo = package_repo(packages, image.path, image.sha256)
    timings["package repository (fetch or cache)"] = time.monotonic() - started
    host = HypervisorHost()
    host.start()
    try:
        host.save_state(state)
        timings["hypervisor host namespace (libvirtd, sshd)"] = host.startup_seconds
        # On every address of the namespace, so it answers before the guest network's bridge
        # exists (create.yml starts that network).
        serve_repo(host, repo.path, "0.0.0.0", REPO_PORT, host.root / "repo-server.log")
        lab = _prepare_vm(host, repo, image.path)
        lab["timings"] = timings
        origin = f"fetched in {repo.fetch_seconds:.1f} s" if repo.fetch_seconds else "from the cache"
        lab["repo_summary"] = f"{len(repo.packages)} packages, {repo.size / 2**20:.1f} MiB, {origin}"
        for path, document in ((lab_file, lab), (inventory_file, inventory(host, lab))):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document, indent=2) + "\n")
    except BaseException:
        host.stop()
        raise
    sys.stdout.write(f"hypervisor host {host.namespace} up at {host.address}; guest {lab['guest_address']}; "
                     f"package repository: {lab['repo_summary']}\n")
    for what, seconds in timings.items():
        sys.stdout.write(f"timing: {what}: {seconds:.1f} s\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m support.hosts.hypervisor_vm",
                                     description="Prepare a fresh Debian VM's host, repository, keys and disk.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="start the host; write the lab file and the inventory")
    start.add_argument("--state", type=Path, required=True, help="the host's state (for hypervisor_host down)")
    start.add_argument("--lab", type=Path, required=True, help="where to write the lab description (JSON)")
    start.add_argument("--inventory", type=Path, required=True, help="where to write the Ansible inventory (JSON)")
    args = parser.parse_args(argv)
    # The collection's module_utils come from the collections path Ansible uses.
    for path in os.environ.get("ANSIBLE_COLLECTIONS_PATH", str(REPO / ".venv" / "collections")).split(os.pathsep):
        if path and path not in sys.path:
            sys.path.append(path)
    up(args.state, args.lab, args.inventory)


if __name__ == "__main__":
    main()
