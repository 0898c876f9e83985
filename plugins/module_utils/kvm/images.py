# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Base images: downloaded once, sha256-verified while streaming, cached per host.

Two levels of cache, each behind its own lock so concurrent module runs never
download or upload the same thing twice:
- a local file ``<cache_dir>/<sha256>.<format>`` on the machine running the module
  (shared by every host), locked per sha256;
- a volume ``base-<key>.<format>`` in each host's pool, uploaded with a libvirt stream
  and locked per host and image key.

libvirt's test driver does not implement volume upload (measured with libvirt 9.0),
so on a test-driver connection (``getType()`` is ``TEST``) the base volume is created with the image's size and no
content. Everything else (naming, locking, the download and its checksum) runs the
same; real content is covered by the integration tests on a real libvirtd.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from typing import Any, Callable, Iterator, Optional
from urllib.error import HTTPError, URLError

try:
    import libvirt
except ImportError:  # pragma: no cover - the modules report it via missing_required_lib
    libvirt = None

from ansible.module_utils.urls import open_url

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import KvmImage
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.connection import classify

CHUNK = 1024 * 1024
DOWNLOAD_TIMEOUT_SECONDS = 60
PROGRESS_EVERY_BYTES = 64 * CHUNK
Progress = Callable[[str], None]


def default_cache_dir() -> str:
    """``$EGRESS_PROXIES_CACHE_DIR``, else ``$XDG_CACHE_HOME/egress-proxies/images``."""
    configured = os.environ.get("EGRESS_PROXIES_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "egress-proxies", "images")


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock; released when the process dies, so never stale."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_image(image: KvmImage, cache_dir: str, progress: Progress) -> str:
    """The verified local copy of ``image``, downloading it when needed."""
    target = os.path.join(cache_dir, "%s.%s" % (image.sha256, image.format))
    with file_lock(os.path.join(cache_dir, "locks", "download-%s.lock" % image.sha256)):
        if os.path.exists(target):
            if _sha256_of(target) == image.sha256:
                return target
            os.unlink(target)  # corrupted on disk; fetch again
        _download(image, target, progress)
    return target


def _download(image: KvmImage, target: str, progress: Progress) -> None:
    partial = target + ".part"
    digest = hashlib.sha256()
    started = time.monotonic()
    received = 0
    try:
        with open_url(image.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            next_report = PROGRESS_EVERY_BYTES
            for chunk in iter(lambda: response.read(CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
                received += len(chunk)
                if received >= next_report:
                    next_report += PROGRESS_EVERY_BYTES
                    progress("image %s: %d MiB%s downloaded" % (
                        image.key, received // CHUNK, " of %d MiB" % (total // CHUNK) if total else ""))
    except HTTPError as error:
        _remove(partial)
        if error.code in (401, 403, 404, 410):
            raise Permanent("images.%s.url: %s answered %d %s; fix the URL" % (
                image.key, image.url, error.code, error.reason)) from error
        raise Transient("images.%s.url: %s answered %d %s" % (
            image.key, image.url, error.code, error.reason)) from error
    except ValueError as error:  # the word for a URL that cannot even be parsed
        _remove(partial)
        raise Permanent("images.%s.url: %r is not a URL: %s" % (image.key, image.url, error)) from error
    except (URLError, OSError) as error:
        _remove(partial)
        raise Transient("images.%s.url: downloading %s failed: %s" % (image.key, image.url, error)) from error
    actual = digest.hexdigest()
    if actual != image.sha256:
        _remove(partial)
        raise Permanent("images.%s.sha256: the download of %s has sha256 %s, the config says %s; "
                        "fix the checksum or the URL" % (image.key, image.url, actual, image.sha256))
    os.replace(partial, target)
    progress("image %s: %d MiB downloaded and verified in %.1f s" % (
        image.key, received // CHUNK, time.monotonic() - started))


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def lookup_volume(pool: Any, name: str) -> Optional[Any]:
    """The volume, or None when the pool has no such volume."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise classify(error, "looking up volume %s" % name) from error


def volume_xml(name: str, capacity: int, volume_format: str, backing_path: Optional[str] = None,
               backing_format: Optional[str] = None) -> str:
    backing = ""
    if backing_path:
        backing = "<backingStore><path>%s</path><format type='%s'/></backingStore>" % (
            _xml_escape(backing_path), backing_format)
    return ("<volume><name>%s</name><capacity unit='bytes'>%d</capacity>"
            "<target><format type='%s'/></target>%s</volume>" % (_xml_escape(name), capacity, volume_format, backing))


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&apos;")


def upload(connection: Any, volume: Any, source: Any, size: int) -> None:
    """Stream ``size`` bytes from the file object ``source`` into ``volume``."""
    if connection.getType().lower() == "test":
        return  # the test driver has no virStorageVolUpload; see the module docstring
    stream = connection.newStream(0)
    try:
        volume.upload(stream, 0, size, 0)
        for chunk in iter(lambda: source.read(CHUNK), b""):
            stream.send(chunk)
        stream.finish()
    except libvirt.libvirtError as error:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise classify(error, "uploading into volume %s" % volume.name()) from error


def create_volume_with_content(connection: Any, pool: Any, name: str, volume_format: str, source: Any,
                               size: int) -> Any:
    """Create ``name`` and fill it; on any failure the half-made volume is deleted."""
    try:
        volume = pool.createXML(volume_xml(name, size, volume_format), 0)
    except libvirt.libvirtError as error:
        raise classify(error, "creating volume %s" % name) from error
    try:
        upload(connection, volume, source, size)
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            volume.delete(0)
        raise
    return volume


def ensure_base_volume(connection: Any, pool: Any, host_name: str, image: KvmImage, cache_dir: str,
                       progress: Progress) -> Any:
    """The host's ``base-<key>.<format>`` volume, creating it from the image when missing."""
    existing = lookup_volume(pool, image.volume_name)
    if existing is not None:
        return existing
    with file_lock(os.path.join(cache_dir, "locks", "upload-%s-%s.lock" % (host_name, image.key))):
        existing = lookup_volume(pool, image.volume_name)  # another run may have finished it meanwhile
        if existing is not None:
            return existing
        local = fetch_image(image, cache_dir, progress)
        size = os.path.getsize(local)
        progress("image %s: uploading %d MiB to host %s as %s" % (
            image.key, size // CHUNK, host_name, image.volume_name))
        with open(local, "rb") as source:
            volume = create_volume_with_content(connection, pool, image.volume_name, image.format, source, size)
        try:
            pool.refresh(0)
        except libvirt.libvirtError as error:
            raise classify(error, "refreshing pool on host %s" % host_name) from error
        return volume
