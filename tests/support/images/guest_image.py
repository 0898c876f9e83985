"""The Debian 12 guest images the end-to-end tests boot, built once per machine and cached.

``tests/support/images/guest_image/build.sh`` builds both variants in one debootstrap run (130-200 s
here, most of it debootstrap): ``agent`` has qemu-guest-agent, ``no-agent`` is the same disk
with it purged, so the provider must find the IP from DHCP leases or ARP. In ``no-agent`` the
vendor-data agent install fails at once (the image has no apt sources), which cloud-init
records as a ``scripts-vendor`` error: its status there is ``error``, the user's parts still
run. The cache lives outside the repository, so every clone and CI run on a machine shares it::

    /var/cache/egress-proxies-tests/guest-images/<key>/<variant>.qcow2
                                                      <variant>.qcow2.sha256
                                                      <variant>.packages   (name<TAB>version)
                                                      build.log

``<key>`` is derived from the build script's content, so editing the script means a new build,
and nothing else does. A key directory appears only complete (it is built under a temporary
name and renamed), and a file lock makes concurrent callers wait for one build instead of
starting their own. Keys no caller has used for a day are pruned after a build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from support.collection.provider_config import BaseImage
from support.images.cache import BUILDING_PREFIX, locked, prune
from support.process import log_tail, stop_process_group

BUILD_SCRIPT = Path(__file__).resolve().parent / "guest_image" / "build.sh"
CACHE_ROOT = Path("/var/cache/egress-proxies-tests/guest-images")
VARIANTS = ("agent", "no-agent")
# Far above a build's 130-200 s, for a slow mirror; pytest's own timeout usually ends it first.
BUILD_TIMEOUT = 1800.0


def cache_key(script: bytes) -> str:
    """The cache key for a build script's content."""
    return hashlib.sha256(script).hexdigest()[:16]


def guest_image(variant: str, cache_root: Path = CACHE_ROOT) -> BaseImage:
    """The qcow2 image of ``variant`` (``agent`` or ``no-agent``), building both if not cached."""
    path = _image_dir(variant, cache_root) / f"{variant}.qcow2"
    sha256 = path.with_name(path.name + ".sha256").read_text().split()[0]
    return BaseImage(path, sha256)


def installed_packages(variant: str, cache_root: Path = CACHE_ROOT) -> dict[str, str]:
    """The packages installed in ``variant``'s image, name to version (the build's manifest)."""
    manifest = _image_dir(variant, cache_root) / f"{variant}.packages"
    return dict(line.split("\t", 1) for line in manifest.read_text().splitlines())


def _image_dir(variant: str, cache_root: Path) -> Path:
    if variant not in VARIANTS:
        raise ValueError(f"unknown guest image variant {variant!r}; expected one of {VARIANTS}")
    return cached_build(cache_root)


def cached_build(cache_root: Path = CACHE_ROOT, script: Path = BUILD_SCRIPT) -> Path:
    """The directory holding ``script``'s output, built first when it does not exist yet."""
    key_dir = cache_root / cache_key(script.read_bytes())
    if not key_dir.is_dir():
        with locked(cache_root):
            # Another caller may have built it while this one waited for the lock.
            if not key_dir.is_dir():
                _build(script, key_dir)
                prune(cache_root, keep=key_dir)
    # Marks the key as in use, for pruning.
    os.utime(key_dir)
    return key_dir


def _build(script: Path, key_dir: Path) -> None:
    """Run ``script`` into a temporary directory and rename that to ``key_dir``.

    Runs under the lock, so a leftover temporary directory belongs to a build that died.
    """
    cache_root = key_dir.parent
    for stale in cache_root.glob(BUILDING_PREFIX + "*"):
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    staging = cache_root / f"{BUILDING_PREFIX}{key_dir.name}"
    staging.mkdir()
    log = cache_root / f"{BUILDING_PREFIX}{key_dir.name}.log"
    start = time.monotonic()
    with open(log, "wb") as output:
        # Its own session, so a timeout (ours or pytest's) stops the whole build with SIGTERM,
        # which lets the script unmount and detach its loop device.
        process = subprocess.Popen(["bash", str(script), str(staging)], stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = process.wait(timeout=BUILD_TIMEOUT)
        finally:
            if process.poll() is None:
                stop_process_group(process, timeout=30)
    if status != 0:
        shutil.rmtree(staging)
        raise RuntimeError(f"guest image build failed with status {status}:\n{log_tail([log], lines=40)}")
    log.rename(staging / "build.log")
    staging.rename(key_dir)
    # Rare and slow, so worth a line wherever output is shown (pytest -s, a failed test's report).
    print(f"guest images {key_dir.name}: built in {time.monotonic() - start:.0f} s into {key_dir}",  # noqa: T201
          file=sys.stderr)
