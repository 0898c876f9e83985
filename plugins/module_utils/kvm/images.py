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

A transfer can take minutes (hundreds of MiB), so each one reports ``TransferEvent``s
(start, progress, done or failed, and waiting for another run's lock) to a ``Progress``
callback; ``TransferReport`` turns them into log lines, a JSON-lines file the controller
follows while the module runs, and the result's ``image_transfers``. URLs in events and
error messages are stripped of userinfo and query (``redact_url``): signed URLs carry secrets.

libvirt's test driver does not implement volume upload (measured with libvirt 9.0),
so on a test-driver connection (``getType()`` is ``TEST``) the base volume is created with the image's size and no
content (and no upload is reported). Everything else (naming, locking, the download and its checksum) runs the
same; real content is covered by the integration tests on a real libvirtd.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit, urlunsplit

from ansible.module_utils.urls import open_url

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, ProxyError, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import (
    create_volume,
    delete_volume,
    find_volume,
    is_test_driver,
    upload_volume,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmImage

MIB = 1024 * 1024
CHUNK = MIB
DOWNLOAD_TIMEOUT_SECONDS = 60
# A progress event every 64 MiB or every 10 s, whichever comes first: a slow link still shows
# movement every 10 s, a fast one writes at most one line per 64 MiB (32 for a 2 GiB image).
PROGRESS_EVERY_BYTES = 64 * MIB
PROGRESS_EVERY_SECONDS = 10.0
# The event vocabulary the controller reads (controller/egress_proxies/providers/transfers.py defines the
# same; tests/contract/test_module_contract.py holds the two to each other).
KINDS = ("start", "progress", "done", "failed", "waiting")
DIRECTIONS = ("download", "upload")
# What stands in for a URL's userinfo and query.
REDACTED = "<redacted>"


@dataclass(frozen=True)
class TransferEvent:
    """One step of one base image transfer (docs/contract.md, "Image transfer progress").

    ``kind``: ``start``, ``progress``, ``done``, ``failed``, or ``waiting`` (for another run's
    lock on the same download or upload); ``direction``: ``download`` (to the machine running
    the module; ``host`` is None) or ``upload`` (to ``host``'s pool). ``url`` is set on a
    download's events, already redacted. ``total`` is None when the server sent no length.
    """

    kind: str
    direction: str
    image: str
    host: Optional[str]
    bytes: int
    total: Optional[int]
    seconds: float
    url: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.direction not in DIRECTIONS:
            raise ValueError("not a transfer event: kind %r, direction %r" % (self.kind, self.direction))

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "direction": self.direction, "image": self.image, "host": self.host,
                "url": self.url, "bytes": self.bytes, "total": self.total, "seconds": round(self.seconds, 3)}

    def text(self) -> str:
        """The event as one log line on the machine running the module (``module.log``)."""
        where = "" if self.host is None else " to host %s" % self.host
        size = _mib(self.bytes) + ("" if self.total is None else " of " + _mib(self.total))
        if self.kind == "start":
            what = ("downloading %s" % self.url if self.direction == "download" else "uploading") + where
            total = _mib(self.total) if self.total is not None else "size unknown"
            return "image %s: %s (%s)" % (self.image, what, total)
        if self.kind == "progress":
            return "image %s: %s %sed%s" % (self.image, size, self.direction, where)
        if self.kind == "done":
            return "image %s: %s %sed%s%s in %.1f s" % (
                self.image, _mib(self.bytes), self.direction, " and verified" if self.direction == "download" else "",
                where, self.seconds)
        if self.kind == "failed":
            return "image %s: %s failed%s after %.1f s (%s)" % (self.image, self.direction, where, self.seconds, size)
        return "image %s: waiting for another run's %s%s" % (self.image, self.direction, where)


Progress = Callable[[TransferEvent], None]


def _mib(count: int) -> str:
    return "%.1f MiB" % (count / float(MIB))


def redact_url(url: str) -> str:
    """``url`` without anything that may be a secret: userinfo (``user:password@``) and the query
    and fragment (a signed URL's signature) are replaced by ``<redacted>``; scheme, host, port and
    path stay, which is what an operator needs to tell which download it is."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    netloc = (REDACTED + "@" if "@" in parts.netloc else "") + host + ("" if port is None else ":%d" % port)
    redacted = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    if parts.query or parts.fragment:
        redacted += "?" + REDACTED
    return redacted


def _scrub(text: str, url: str) -> str:
    """``text`` (an error's message, which may quote the URL) with ``url`` redacted."""
    return text.replace(url, redact_url(url)) if url else text


class _Meter:
    """Reports one transfer: start when made, then progress, done or failed."""

    def __init__(self, progress: Progress, direction: str, image: str, host: Optional[str], total: Optional[int],
                 url: Optional[str] = None) -> None:
        self.progress = progress
        self.direction = direction
        self.image = image
        self.host = host
        self.total = total
        self.url = url
        self.started = time.monotonic()
        self.count = 0
        self._next_bytes = PROGRESS_EVERY_BYTES
        self._next_time = self.started + PROGRESS_EVERY_SECONDS
        self._emit("start")

    def _emit(self, kind: str) -> None:
        self.progress(TransferEvent(kind=kind, direction=self.direction, image=self.image, host=self.host,
                                    bytes=self.count, total=self.total, seconds=time.monotonic() - self.started,
                                    url=self.url))

    def add(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if self.count >= self._next_bytes or now >= self._next_time:
            while self._next_bytes <= self.count:
                self._next_bytes += PROGRESS_EVERY_BYTES
            self._next_time = now + PROGRESS_EVERY_SECONDS
            self._emit("progress")

    def done(self) -> None:
        self._emit("done")

    def failed(self) -> None:
        self._emit("failed")


class TransferReport:
    """Where a module run's transfer events go: ``log`` (a line each), the JSON-lines file at
    ``path`` if given (one object per event, appended, for the controller to follow), and the
    summary of finished transfers for the result (``image_transfers``).

    Thread-safe: a batch's items transfer side by side. The file is a side channel: when it
    cannot be written, ``warn`` says so once and the run goes on (a create never fails for it).
    """

    def __init__(self, log: Callable[[str], None], path: Optional[str] = None,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        self.log = log
        self.path = path
        self.warn = warn or log
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._broken = False
        self._done: List[Dict[str, Any]] = []

    def __call__(self, event: TransferEvent) -> None:
        self.log(event.text())
        line = json.dumps(event.to_dict(), sort_keys=True) + "\n"
        with self._lock:
            if event.kind == "done":
                self._done.append({"image": event.image, "host": event.host, "direction": event.direction,
                                   "bytes": event.bytes, "seconds": round(event.seconds, 3)})
            if self.path and not self._broken:
                self._write(line.encode("utf-8"))

    def _write(self, data: bytes) -> None:
        try:
            if self._fd is None:
                # O_APPEND: one write per event, so a reader never sees two events interleaved.
                self._fd = os.open(self.path or "", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, data)
        except OSError as error:
            self._broken = True
            self.warn("progress_path: cannot write %s (%s); image transfer progress goes to the log only"
                      % (self.path, error.strerror))

    def transfers(self) -> List[Dict[str, Any]]:
        """Every finished transfer of the run, in the order they finished."""
        with self._lock:
            return [dict(entry) for entry in self._done]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


def default_cache_dir() -> str:
    """``$EGRESS_PROXIES_CACHE_DIR``, else ``$XDG_CACHE_HOME/egress-proxies/images``."""
    configured = os.environ.get("EGRESS_PROXIES_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "egress-proxies", "images")


@contextlib.contextmanager
def file_lock(path: str, on_wait: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """An exclusive advisory lock; released when the process dies, so never stale.

    ``on_wait`` is called when another holder makes us wait (another run transferring the same
    image): without it, that wait is a silent pause of minutes.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
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


def _waiting(progress: Progress, direction: str, image: KvmImage, host: Optional[str]) -> Callable[[], None]:
    def report() -> None:
        progress(TransferEvent(kind="waiting", direction=direction, image=image.key, host=host, bytes=0, total=None,
                               seconds=0.0, url=redact_url(image.url) if direction == "download" else None))
    return report


def fetch_image(image: KvmImage, cache_dir: str, progress: Progress) -> str:
    """The verified local copy of ``image``, downloading it when needed."""
    target = os.path.join(cache_dir, "%s.%s" % (image.sha256, image.format))
    with file_lock(os.path.join(cache_dir, "locks", "download-%s.lock" % image.sha256),
                   _waiting(progress, "download", image, None)):
        if os.path.exists(target):
            if _sha256_of(target) == image.sha256:
                return target
            os.unlink(target)  # corrupted on disk; fetch again
        _download(image, target, progress)
    return target


def _download(image: KvmImage, target: str, progress: Progress) -> None:
    partial = target + ".part"
    digest = hashlib.sha256()
    url = redact_url(image.url)
    meters: List[_Meter] = []
    with _reporting(meters):
        try:
            with open_url(image.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response, open(partial, "wb") as out:
                length = response.headers.get("Content-Length")
                meter = _Meter(progress, "download", image.key, None, int(length) if length else None, url)
                meters.append(meter)
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    meter.add(len(chunk))
        except HTTPError as error:
            _remove(partial)
            error.close()  # it holds the answer's socket; the message needs only code and reason
            if error.code in (401, 403, 404, 410):
                raise Permanent("images.%s.url: %s answered %d %s; fix the URL" % (
                    image.key, url, error.code, error.reason)) from error
            raise Transient("images.%s.url: %s answered %d %s" % (image.key, url, error.code, error.reason)) from error
        except ValueError as error:  # the word for a URL that cannot even be parsed
            _remove(partial)
            raise Permanent("images.%s.url: %r is not a URL: %s" % (
                image.key, url, _scrub(str(error), image.url))) from error
        except (URLError, OSError) as error:
            _remove(partial)
            raise Transient("images.%s.url: downloading %s failed: %s" % (
                image.key, url, _scrub(str(error), image.url))) from error
        actual = digest.hexdigest()
        if actual != image.sha256:
            _remove(partial)
            raise Permanent("images.%s.sha256: the download of %s has sha256 %s, the config says %s; "
                            "fix the checksum or the URL" % (image.key, url, actual, image.sha256))
        os.replace(partial, target)


@contextlib.contextmanager
def _reporting(meters: List[_Meter]) -> Iterator[None]:
    """Ends the transfers of the meters ``meters`` holds by the end of the block (a download's
    starts once the answer's headers are in): ``done`` when the block completes, ``failed`` when
    it raises."""
    try:
        yield
    except BaseException:
        for meter in meters:
            meter.failed()
        raise
    for meter in meters:
        meter.done()


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def lookup_volume(pool: Any, name: str) -> Optional[Any]:
    """The volume, or None when the pool has no such volume."""
    return find_volume(pool, name)


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


def upload(connection: Any, volume: Any, source: Any, size: int,
           sent: Optional[Callable[[int], None]] = None) -> None:
    """Stream ``size`` bytes from the file object ``source`` into ``volume``; ``sent`` is told
    each chunk's length once libvirt took it."""
    if is_test_driver(connection):
        return  # the test driver has no virStorageVolUpload; see the module docstring
    upload_volume(connection, volume, source, size, sent)


def create_volume_with_content(connection: Any, pool: Any, name: str, volume_format: str, source: Any,
                               size: int, sent: Optional[Callable[[int], None]] = None) -> Any:
    """Create ``name`` and fill it; on any failure the half-made volume is deleted."""
    volume = create_volume(pool, volume_xml(name, size, volume_format), "creating volume %s" % name)
    try:
        upload(connection, volume, source, size, sent)
    except BaseException:
        with contextlib.suppress(ProxyError):
            delete_volume(volume, "deleting half-made volume %s" % name)
        raise
    return volume


def ensure_base_volume(connection: Any, pool: Any, host_name: str, image: KvmImage, cache_dir: str,
                       progress: Progress) -> Any:
    """The host's ``base-<key>.<format>`` volume, creating it from the image when missing."""
    existing = lookup_volume(pool, image.volume_name)
    if existing is not None:
        return existing
    with file_lock(os.path.join(cache_dir, "locks", "upload-%s-%s.lock" % (host_name, image.key)),
                   _waiting(progress, "upload", image, host_name)):
        existing = lookup_volume(pool, image.volume_name)  # another run may have finished it meanwhile
        if existing is not None:
            return existing
        local = fetch_image(image, cache_dir, progress)
        size = os.path.getsize(local)
        # The test driver stores no content: reporting an upload there would be a made-up figure.
        meters = [] if is_test_driver(connection) else [_Meter(progress, "upload", image.key, host_name, size)]
        with _reporting(meters), open(local, "rb") as source:
            # No pool refresh after it: libvirt refreshes the pool itself once an upload's stream
            # closes, and an explicit virStoragePoolRefresh is refused ("has asynchronous jobs
            # running") while any other upload into the pool is in flight, such as another
            # instance's seed: that failed a create for nothing (seen in the real-guest test).
            return create_volume_with_content(connection, pool, image.volume_name, image.format, source, size,
                                              meters[0].add if meters else None)
