"""Base image downloads against a real HTTP server on 127.0.0.1.

The server counts requests per path, so "downloaded once" is measured, not assumed.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import KvmImage
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import images
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.images import fetch_image

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
        with self.server.lock:
            self.server.requests[self.path] += 1
        if self.path == "/image.qcow2":
            time.sleep(self.server.delay_seconds)
            self.send_response(200)
            self.send_header("Content-Length", str(len(CONTENT)))
            self.end_headers()
            self.wfile.write(CONTENT)
        elif self.path == "/busy":
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
    messages: list[str] = []
    path = fetch_image(image(server.url("/image.qcow2")), str(tmp_path), messages.append)
    assert path == str(tmp_path / (f"{SHA}.qcow2"))
    assert Path(path).read_bytes() == CONTENT
    assert cached_files(tmp_path) == [f"{SHA}.qcow2"]  # no .part left behind
    assert server.requests["/image.qcow2"] == 1
    assert messages[-1].startswith("image debian-12: 0 MiB downloaded and verified in ")


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
    assert len(CONTENT) > images.PROGRESS_EVERY_BYTES
    messages: list[str] = []
    fetch_image(image(server.url("/image.qcow2")), str(tmp_path), messages.append)
    during = [m for m in messages if "verified" not in m]
    assert during
    assert all(m.startswith("image debian-12: ") and m.endswith(" downloaded") for m in during)
    assert "verified" in messages[-1]


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
