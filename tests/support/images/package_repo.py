"""A local Debian package repository for a fresh Debian 12 guest, fetched once per machine.

The guest of the ``kvm_hypervisor_vm`` molecule scenario has no way out of its test network, so
the packages the role installs come from here: a flat repository of the ``.deb`` files a fresh
guest needs, served over HTTP on the guest network's bridge (see :func:`serve_repo`).

"What a fresh guest needs" is computed by apt itself, as the guest would: ``apt-get install
--download-only`` of the requested packages against the *guest image's* dpkg status (read out of
the cached qcow2), not the host's, so every dependency and recommendation the guest lacks is
fetched even when this machine has it installed already. The downloads come from the same mirror
and suite the image was built from (``tests/support/images/guest_image/build.sh``), verified with
Debian's archive keyring. The result is cached::

    /var/cache/egress-proxies-tests/package-repos/<key>/repo/*.deb, Packages, Release
                                                       /packages   (name<TAB>version)

``<key>`` covers the requested packages, the image's sha256, mirror and suite: a new image or
another package list means another fetch, nothing else does. As with the guest images, a key
directory appears only complete and a lock makes concurrent callers wait for one fetch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support.hosts.hypervisor_host import HypervisorHost
from support.images.cache import BUILDING_PREFIX, locked
from support.process import DaemonStartError, log_tail
from support.waiting import wait_for

CACHE_ROOT = Path("/var/cache/egress-proxies-tests/package-repos")
# The guest image's source (build.sh): the repository holds versions consistent with it.
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Bump when the way a repository is made changes (the key must change with it).
FORMAT = 1
# apt-get update plus the downloads; generous for a slow mirror.
FETCH_TIMEOUT = 1200.0


@dataclass(frozen=True)
class PackageRepo:
    """A flat repository: ``deb [trusted=yes] <url> ./`` once served."""

    path: Path  # the directory holding the .deb files, Packages and Release
    packages: dict[str, str]  # name -> version of every package in it
    size: int  # bytes of .deb files
    fetch_seconds: float  # 0 when it came from the cache


def cache_key(packages: Sequence[str], image_sha256: str) -> str:
    document = json.dumps({"packages": sorted(set(packages)), "image": image_sha256, "mirror": MIRROR,
                           "suite": SUITE, "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def package_repo(packages: Sequence[str], image: Path, image_sha256: str,
                 cache_root: Path = CACHE_ROOT) -> PackageRepo:
    """The repository of ``packages`` and what they need on a guest booted from ``image``."""
    key_dir = cache_root / cache_key(packages, image_sha256)
    seconds = 0.0
    if not key_dir.is_dir():
        with locked(cache_root):
            if not key_dir.is_dir():
                started = time.monotonic()
                _build(packages, image, key_dir)
                seconds = time.monotonic() - started
    key_dir.touch()
    manifest = key_dir / "packages"
    found = dict(line.split("\t", 1) for line in manifest.read_text().splitlines())
    repo = key_dir / "repo"
    size = sum(deb.stat().st_size for deb in repo.glob("*.deb"))
    return PackageRepo(repo, found, size, seconds)


def _run(cmd: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = FETCH_TIMEOUT) -> str:
    """Run a step of the fetch; on failure raise with the tail of its output."""
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def _build(packages: Sequence[str], image: Path, key_dir: Path) -> None:
    cache_root = key_dir.parent
    for stale in cache_root.glob(BUILDING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = cache_root / f"{BUILDING_PREFIX}{key_dir.name}"
    staging.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory(prefix="package-repo-", dir=cache_root) as scratch:
            work = Path(scratch)
            status = work / "status"
            status.write_bytes(guest_dpkg_status(image, work))
            repo = staging / "repo"
            repo.mkdir()
            for deb in _download(packages, status, work):
                deb.rename(repo / deb.name)
        # apt-ftparchive (apt-utils) writes the index and a Release with its hashes, which the
        # guest's apt checks; nothing is signed: the guest marks the source [trusted=yes].
        (repo / "Packages").write_text(_run(["apt-ftparchive", "packages", "."], cwd=repo))
        (repo / "Release").write_text(_run(["apt-ftparchive", "release", "."], cwd=repo))
        (staging / "packages").write_text("".join(
            f"{name}\t{version}\n" for name, version in sorted(_index_entries(repo / "Packages"))))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staging.rename(key_dir)


def _index_entries(index: Path) -> list[tuple[str, str]]:
    """(Package, Version) of every stanza of a Packages index."""
    entries = []
    for stanza in index.read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if "Package" in fields:
            entries.append((fields["Package"], fields["Version"]))
    return entries


def guest_dpkg_status(image: Path, work: Path) -> bytes:
    """``/var/lib/dpkg/status`` of the qcow2 ``image``, read without mounting or booting it.

    The image is one ext4 partition on an MBR disk (build.sh): the disk is converted to a sparse
    raw file and debugfs reads the file from the partition at its offset.
    """
    raw = work / "disk.raw"
    _run(["qemu-img", "convert", "-O", "raw", str(image), str(raw)], timeout=600)
    table = json.loads(_run(["sfdisk", "--json", str(raw)]))["partitiontable"]
    sector = int(table.get("sectorsize", 512))
    (partition,) = table["partitions"]
    out = work / "status.read"
    # e2fsprogs takes I/O options after "?" in the device name: offset= in bytes.
    _run(["debugfs", "-R", f"dump /var/lib/dpkg/status {out}", f"{raw}?offset={int(partition['start']) * sector}"])
    raw.unlink()
    data = out.read_bytes()
    if b"Package: dpkg\n" not in data:
        raise RuntimeError(f"{image} yielded no dpkg status (is it the image build.sh makes?)")
    return data


def _download(packages: Sequence[str], status: Path, work: Path) -> list[Path]:
    """Download ``packages`` and everything a system with dpkg ``status`` lacks for them."""
    (work / "lists" / "partial").mkdir(parents=True)
    archives = work / "archives"
    (archives / "partial").mkdir(parents=True)
    (work / "sources.list.d").mkdir()
    sources = work / "sources.list"
    sources.write_text(f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    options = [
        f"-oDir::Etc::SourceList={sources}", f"-oDir::Etc::SourceParts={work / 'sources.list.d'}",
        f"-oDir::State::Lists={work / 'lists'}", f"-oDir::State::status={status}",
        f"-oDir::State::extended_states={work / 'extended_states'}",
        f"-oDir::Cache={work}", f"-oDir::Cache::archives={archives}",
        "-oDir::Cache::pkgcache=", "-oDir::Cache::srcpkgcache=",
        # Private directories: nothing of the machine's own apt or dpkg state is locked or read.
        "-oDebug::NoLocking=1", "-oAPT::Architecture=amd64", "-oAPT::Architectures::=amd64",
        # As the scenario's guest is configured (its prepare step): recommended packages would
        # add qemu-system-gui and with it GTK, Mesa, PulseAudio, ... (391 packages, 898 MiB
        # installed, measured), more than the test VM's 2 GiB disk holds.
        "-oAPT::Install-Recommends=false", "-oAPT::Install-Suggests=false",
    ]
    _run(["apt-get", *options, "update"])
    _run(["apt-get", *options, "install", "--download-only", "--yes", *packages],
         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"})
    return sorted(archives.glob("*.deb"))


# --- serving it to a guest network ------------------------------------------------------------

SERVER = """\
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), handler).serve_forever()
"""


def serve_repo(host: HypervisorHost, repo: Path, address: str, port: int, log: Path) -> int:
    """Serve ``repo`` over HTTP on ``address:port`` inside ``host``'s namespace; return the pid.

    The server runs in its own session and outlives this process; stopping the host (which kills
    every process in its namespace) stops it.
    """
    with open(log, "ab") as output:
        server = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, sys.executable, "-c", SERVER, address, str(port), str(repo)],
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{address}:{port}/Release"
    wait_for(lambda: host.run_in_namespace(["curl", "-sf", "-o", "/dev/null", url], check=False).returncode == 0,
             30, f"the package repository at {url}", diagnostics=lambda: log_tail([log]), process=server,
             error=DaemonStartError)
    return server.pid
