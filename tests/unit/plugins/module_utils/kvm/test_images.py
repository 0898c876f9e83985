"""Base image downloads against a real HTTP server on 127.0.0.1.

The server counts requests per path, so "downloaded once" is measured, not assumed.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import images
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.images import (
    TransferEvent,
    TransferReport,
    fetch_image,
    redact_url,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmImage
from support.waiting import wait_for

CONTENT = os.urandom(256 * 1024)
SHA = hashlib.sha256(CONTENT).hexdigest()


class ImageServer(http.server.ThreadingHTTPServer):
    """Serves CONTENT at /image.qcow2 (optionally slowly), 404 at /missing, 503 at /busy."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ImageHandler)
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.delay_seconds = 0.0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class ImageHandler(http.server.BaseHTTPRequestHandler):
    server: ImageServer

    def do_GET(self) -> None:
        path = self.path.split("?")[0]  # a signed URL's query is the signature: not part of the name
        with self.server.lock:
            self.server.requests[path] += 1
        if path == "/image.qcow2":
            time.sleep(self.server.delay_seconds)
            self.send_response(200)
            self.send_header("Content-Length", str(len(CONTENT)))
            self.end_headers()
            self.wfile.write(CONTENT)
        elif path == "/busy":
            self.send_error(503, "Service Unavailable")
        else:
            self.send_error(404, "Not Found")

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the request counter is the log these tests read."""


@pytest.fixture
def server() -> Iterator[ImageServer]:
    httpd = ImageServer()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def image(url: str, sha256: str = SHA) -> KvmImage:
    return KvmImage(key="debian-12", url=url, sha256=sha256, format="qcow2")


def cached_files(cache_dir: Path) -> list[str]:
    """Everything in the cache except the lock files."""
    return sorted(p.name for p in cache_dir.iterdir() if p.name != "locks")


def test_fetch_downloads_and_verifies(server: ImageServer, tmp_path: Path) -> None:
    events: list[TransferEvent] = []
    path = fetch_image(image(server.url("/image.qcow2")), str(tmp_path), events.append)
    assert path == str(tmp_path / (f"{SHA}.qcow2"))
    assert Path(path).read_bytes() == CONTENT
    assert cached_files(tmp_path) == [f"{SHA}.qcow2"]  # no .part left behind
    assert server.requests["/image.qcow2"] == 1
    assert [(e.kind, e.direction, e.image, e.host) for e in events] == [
        ("start", "download", "debian-12", None), ("done", "download", "debian-12", None)]
    assert events[0].total == len(CONTENT) and events[0].bytes == 0
    assert events[-1].bytes == len(CONTENT) and events[-1].seconds > 0
    assert events[-1].text().startswith("image debian-12: 0.2 MiB downloaded and verified in ")


def test_a_cached_image_is_not_downloaded_again(server: ImageServer, tmp_path: Path) -> None:
    first = fetch_image(image(server.url("/image.qcow2")), str(tmp_path), lambda _message: None)
    second = fetch_image(image(server.url("/image.qcow2")), str(tmp_path), lambda _message: None)
    assert first == second
    assert server.requests["/image.qcow2"] == 1


def test_a_corrupted_cached_image_is_downloaded_again(server: ImageServer, tmp_path: Path) -> None:
    path = Path(fetch_image(image(server.url("/image.qcow2")), str(tmp_path), lambda _message: None))
    path.write_bytes(b"bit rot")
    assert fetch_image(image(server.url("/image.qcow2")), str(tmp_path), lambda _message: None) == str(path)
    assert path.read_bytes() == CONTENT
    assert server.requests["/image.qcow2"] == 2


def test_a_checksum_mismatch_is_permanent_and_leaves_nothing(server: ImageServer, tmp_path: Path) -> None:
    wrong = "0" * 64
    with pytest.raises(Permanent) as caught:
        fetch_image(image(server.url("/image.qcow2"), sha256=wrong), str(tmp_path), lambda _message: None)
    message = str(caught.value)
    assert message.startswith("images.debian-12.sha256: ")
    assert SHA in message
    assert wrong in message
    assert cached_files(tmp_path) == []


def test_not_found_is_permanent(server: ImageServer, tmp_path: Path) -> None:
    with pytest.raises(Permanent, match=r"^images\.debian-12\.url: .* answered 404"):
        fetch_image(image(server.url("/missing")), str(tmp_path), lambda _message: None)
    assert cached_files(tmp_path) == []


def test_service_unavailable_is_transient(server: ImageServer, tmp_path: Path) -> None:
    with pytest.raises(Transient, match=r"^images\.debian-12\.url: .* answered 503"):
        fetch_image(image(server.url("/busy")), str(tmp_path), lambda _message: None)
    assert cached_files(tmp_path) == []


def test_connection_refused_is_transient(tmp_path: Path) -> None:
    # A port that was just free and is closed again: nothing listens there.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Transient, match=r"^images\.debian-12\.url: downloading .* failed"):
        fetch_image(image(f"http://127.0.0.1:{port}/image.qcow2"), str(tmp_path), lambda _message: None)
    assert cached_files(tmp_path) == []


def test_progress_is_reported_during_a_large_download(server: ImageServer, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "PROGRESS_EVERY_BYTES", 64 * 1024)
    monkeypatch.setattr(images, "CHUNK", 16 * 1024)  # reads small enough to pass several thresholds
    assert len(CONTENT) > images.PROGRESS_EVERY_BYTES
    events: list[TransferEvent] = []
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path), events.append)
    during = [e for e in events if e.kind == "progress"]
    assert [e.bytes for e in during] == [64 * 1024, 128 * 1024, 192 * 1024, 256 * 1024]
    assert all(e.total == len(CONTENT) for e in during)
    assert during[0].text() == "image debian-12: 0.1 MiB of 0.2 MiB downloaded"
    assert [events[0].kind, events[-1].kind] == ["start", "done"]


def test_concurrent_fetches_download_once(server: ImageServer, tmp_path: Path) -> None:
    # The response is held back long enough for both threads to be inside fetch_image at once.
    server.delay_seconds = 0.3
    start = threading.Barrier(2)
    results: list[str] = []
    errors: list[BaseException] = []

    def fetch() -> None:
        start.wait(timeout=5)
        try:
            results.append(fetch_image(image(server.url("/image.qcow2")), str(tmp_path), lambda _message: None))
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which fails the test
            errors.append(error)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == []
    assert results == [str(tmp_path / (f"{SHA}.qcow2"))] * 2
    assert server.requests["/image.qcow2"] == 1
    assert cached_files(tmp_path) == [f"{SHA}.qcow2"]


def test_progress_is_reported_every_interval_on_a_slow_link(server: ImageServer, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Far below the byte threshold, so only the clock can trigger these.
    monkeypatch.setattr(images, "PROGRESS_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(images, "CHUNK", 64 * 1024)
    events: list[TransferEvent] = []
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path), events.append)
    assert [e.kind for e in events] == ["start", "progress", "progress", "progress", "progress", "done"]


@pytest.mark.parametrize(("url", "expected"), [
    ("https://user:pa55@images.example:8443/d/debian.qcow2?X-Goog-Signature=abc#x",
     "https://<redacted>@images.example:8443/d/debian.qcow2?<redacted>"),
    ("https://images.example/debian.qcow2?sig=abc", "https://images.example/debian.qcow2?<redacted>"),
    ("http://token@[::1]:8080/i.qcow2", "http://<redacted>@[::1]:8080/i.qcow2"),
    ("https://images.example/debian.qcow2", "https://images.example/debian.qcow2"),
    ("file:///var/cache/base.qcow2", "file:///var/cache/base.qcow2"),
    ("http://host:notaport/x?sig=abc", "<unparseable URL>"),
])
def test_urls_lose_their_secrets_before_they_are_shown(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_events_and_errors_never_carry_a_urls_credentials(server: ImageServer, tmp_path: Path) -> None:
    secret_url = server.url("/image.qcow2?X-Amz-Signature=TOPSECRET").replace("://", "://user:S3CRET@")
    events: list[TransferEvent] = []
    fetch_image(image(secret_url), str(tmp_path / "a"), events.append)
    assert events[0].url == server.url("/image.qcow2").replace("://", "://<redacted>@") + "?<redacted>"
    shown = " ".join(e.text() + json.dumps(e.to_dict()) for e in events)
    assert "S3CRET" not in shown and "TOPSECRET" not in shown and "user" not in shown
    for path, error in (("/missing", Permanent), ("/busy", Transient)):
        with pytest.raises(error) as caught:
            fetch_image(image(secret_url.replace("/image.qcow2", path)), str(tmp_path / "b"), events.append)
        assert "S3CRET" not in str(caught.value) and "TOPSECRET" not in str(caught.value)
        assert "127.0.0.1" in str(caught.value)  # still says which server answered
    with pytest.raises(Permanent) as mismatch:
        fetch_image(image(secret_url, sha256="0" * 64), str(tmp_path / "c"), events.append)
    assert "S3CRET" not in str(mismatch.value) and "TOPSECRET" not in str(mismatch.value)


def test_a_failed_download_reports_failed(server: ImageServer, tmp_path: Path) -> None:
    events: list[TransferEvent] = []
    with pytest.raises(Permanent):
        fetch_image(image(server.url("/image.qcow2"), sha256="0" * 64), str(tmp_path), events.append)
    assert [(e.kind, e.bytes) for e in events] == [("start", 0), ("failed", len(CONTENT))]


def test_the_report_appends_one_json_line_per_event_and_sums_up_finished_transfers(
        server: ImageServer, tmp_path: Path) -> None:
    lines: list[str] = []
    progress = tmp_path / "progress.jsonl"
    report = TransferReport(lines.append, str(progress))
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path / "cache"), report)
    report.close()
    written = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [w["kind"] for w in written] == ["start", "done"]
    assert written[0] == {"kind": "start", "direction": "download", "image": "debian-12", "host": None,
                          "url": server.url("/image.qcow2"), "bytes": 0, "total": len(CONTENT),
                          "seconds": written[0]["seconds"]}
    assert written[1]["bytes"] == len(CONTENT) and written[1]["seconds"] >= 0
    assert stat_mode(progress) == 0o600
    assert lines == [TransferEvent(**w).text() for w in written]
    (transfer,) = report.transfers()
    assert transfer == {"image": "debian-12", "host": None, "direction": "download", "bytes": len(CONTENT),
                        "seconds": written[1]["seconds"]}


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_an_unwritable_progress_file_is_a_warning_not_a_failure(server: ImageServer, tmp_path: Path) -> None:
    warnings: list[str] = []
    report = TransferReport(lambda _line: None, str(tmp_path / "no-such-dir" / "progress.jsonl"), warnings.append)
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path / "cache"), report)
    assert len(warnings) == 1 and warnings[0].startswith("progress_path: cannot write ")
    assert [t["direction"] for t in report.transfers()] == ["download"]


def test_a_run_waiting_for_anothers_download_says_so(server: ImageServer, tmp_path: Path) -> None:
    server.delay_seconds = 1.0
    events: list[TransferEvent] = []
    thread = threading.Thread(target=fetch_image, args=(image(server.url("/image.qcow2")), str(tmp_path),
                                                        lambda _event: None))
    thread.start()
    # The first fetch holds the lock from before its request until the download is verified,
    # and the server holds the answer back for a second after counting the request.
    wait_for(lambda: server.requests["/image.qcow2"] > 0, 10, "the first fetch's request", 0.01)
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path), events.append)
    thread.join(timeout=10)
    assert [(e.kind, e.direction) for e in events] == [("waiting", "download")]  # then found it cached
    assert events[0].text() == "image debian-12: waiting for another run's download"
    assert server.requests["/image.qcow2"] == 1
