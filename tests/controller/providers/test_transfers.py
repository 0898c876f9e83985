"""Base image transfers in the controller's log while a KVM create runs (issue 19, "Operator UX").

First the formatting and the tailing on their own (a file written the way ``kvm_proxy`` writes
it: one JSON object per line, appended); then the whole path for real: the controller's
``ProviderClient.create`` through ``AnsibleRunner`` runs ``kvm_proxy`` against the test-driver
libvirtd, which downloads its base image from an HTTP server on 127.0.0.1. That server holds the
second half of the image back until the test has seen the download's first line in the log, so
"logged while it happens" is measured, not assumed.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from egress_proxies.logs import JSONFormatter
from egress_proxies.providers.client import CreateRequest, ProviderClient, ProviderType
from egress_proxies.providers.runner import AnsibleRunner, Operation, OperationResult
from egress_proxies.providers.transfers import WITHHELD_URL, ProgressTail, describe, loggable_url
from support.collection.modules import collections_path, run_module
from support.collection.provider_config import OWNER_TAGS, BaseImage, kvm_host, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.waiting import wait_for

MIB = 1024 * 1024
LOGGER = "egress_proxies.providers.transfers"


def event(kind: str, direction: str = "download", done: int = 0, total: int | None = 300 * MIB,
          seconds: float = 0.0, host: str | None = None, url: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "direction": direction, "image": "debian-12", "host": host, "url": url,
            "bytes": done, "total": total, "seconds": seconds}


# --- formatting -----------------------------------------------------------------------------


def test_each_event_reads_as_one_line_with_size_share_and_rate() -> None:
    url = "https://images.example/debian-12.qcow2"
    lines = [describe("lab", e) for e in (
        event("start", url=url),
        event("progress", done=64 * MIB, seconds=4.0, url=url),
        event("done", done=300 * MIB, seconds=20.0, url=url),
        event("start", "upload", host="beelink"),
        event("progress", "upload", done=150 * MIB, seconds=3.0, host="beelink"),
        event("done", "upload", done=300 * MIB, seconds=6.0, host="beelink"),
        event("progress", done=10 * MIB, total=None, seconds=10.0, url=url),
        event("waiting", "upload", total=None, host="beelink"),
    )]
    assert [line[1] if line else None for line in lines] == [
        "provider lab: base image debian-12: downloading https://images.example/debian-12.qcow2 (300.0 MiB)",
        "provider lab: base image debian-12: downloaded 64.0 of 300.0 MiB (21%), 16.0 MiB/s",
        "provider lab: base image debian-12: downloaded and verified 300.0 MiB in 20.0 s (15.0 MiB/s)",
        "provider lab: base image debian-12: uploading to host beelink (300.0 MiB)",
        "provider lab: base image debian-12: uploaded 150.0 of 300.0 MiB to host beelink (50%), 50.0 MiB/s",
        "provider lab: base image debian-12: uploaded 300.0 MiB to host beelink in 6.0 s (50.0 MiB/s)",
        "provider lab: base image debian-12: downloaded 10.0 MiB, 1.0 MiB/s",
        "provider lab: base image debian-12: waiting for another run's upload to host beelink of this image",
    ]
    assert {line[0] for line in lines if line} == {logging.INFO}
    assert lines[2] is not None and lines[2][2] == {
        "event": "done", "direction": "download", "image": "debian-12", "host": None, "bytes": 300 * MIB,
        "total_bytes": 300 * MIB, "seconds": 20.0, "rate_mib_s": 15.0, "url": url}


def test_a_failed_transfer_is_a_warning() -> None:
    described = describe("lab", event("failed", "upload", done=100 * MIB, seconds=8.0, host="beelink"))
    assert described is not None
    level, message, _transfer = described
    assert level == logging.WARNING
    assert message == ("provider lab: base image debian-12: upload to host beelink failed after 8.0 s "
                       "(100.0 of 300.0 MiB done; the run's result says why)")


@pytest.mark.parametrize("bad", [
    {}, event("exploded"), {**event("start"), "direction": "sideways"}, {**event("start"), "image": ""},
    {**event("start"), "bytes": "12"}, {**event("start"), "bytes": -1}, {**event("start"), "seconds": None},
    {**event("start"), "bytes": True},
])
def test_anything_else_is_not_an_event(bad: dict[str, Any]) -> None:
    assert describe("lab", bad) is None


@pytest.mark.parametrize("url", ["https://u:S3CRET@images.example/d.qcow2", "https://images.example/d.qcow2?sig=S3CRET",
                                 "https://images.example/d.qcow2#S3CRET", "https://<redacted>@images.example/?S3CRET"])
def test_a_urls_secrets_never_reach_the_log_even_from_a_careless_module(url: str) -> None:
    described = describe("lab", event("start", url=url))
    assert described is not None
    _level, message, transfer = described
    assert "S3CRET" not in message + json.dumps(transfer)
    assert transfer["url"] == WITHHELD_URL


@pytest.mark.parametrize("url", ["https://<redacted>@images.example/d.qcow2?<redacted>", "file:///var/cache/base.qcow2",
                                 "https://images.example:8443/d.qcow2"])
def test_a_url_the_module_redacted_is_logged_as_it_came(url: str) -> None:
    assert loggable_url(url) == url


# --- tailing ----------------------------------------------------------------------------------


def transfer_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]


def test_the_tail_logs_whole_lines_as_they_are_appended(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    path = tmp_path / "progress-0.jsonl"
    tail = ProgressTail([path], "lab")
    tail.poll()  # the module has not written anything yet: nothing, and no error
    first = json.dumps(event("start", url="http://127.0.0.1/i.qcow2")) + "\n"
    second = json.dumps(event("done", done=300 * MIB, seconds=10.0)) + "\n"
    with path.open("ab") as out:
        out.write(first.encode() + second.encode()[:20])  # the second line is half written
    tail.poll()
    assert [r.getMessage() for r in transfer_records(caplog)] == [
        "provider lab: base image debian-12: downloading http://127.0.0.1/i.qcow2 (300.0 MiB)"]
    with path.open("ab") as out:
        out.write(second.encode()[20:] + b"not json\n" + b'["a list"]\n' + b"\n")
    tail.poll()
    records = transfer_records(caplog)
    assert [r.getMessage() for r in records][1:] == [
        "provider lab: base image debian-12: downloaded and verified 300.0 MiB in 10.0 s (30.0 MiB/s)"]
    assert tail.events == 2
    skipped = [r for r in caplog.records if r.levelno == logging.DEBUG and "not a transfer event" in r.getMessage()]
    assert len(skipped) == 2
    # --log-format json: the provider and the transfer's numbers are fields of their own.
    entry = json.loads(JSONFormatter().format(records[1]))
    assert entry["provider"] == "lab"
    assert entry["transfer"] == {"event": "done", "direction": "download", "image": "debian-12", "host": None,
                                 "bytes": 300 * MIB, "total_bytes": 300 * MIB, "seconds": 10.0, "rate_mib_s": 30.0}


def test_the_tail_follows_from_its_thread_and_drains_on_exit(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    path = tmp_path / "progress-0.jsonl"
    with ProgressTail([path], "lab", poll_seconds=0.05):
        path.write_text(json.dumps(event("start")) + "\n")
        wait_for(lambda: transfer_records(caplog), 10, "the first transfer line", 0.02)
        assert len(transfer_records(caplog)) == 1  # logged while the "run" still goes on
        with path.open("a") as out:
            out.write(json.dumps(event("done", done=300 * MIB, seconds=10.0)) + "\n")
    # Written just before the end: read by the final drain, before the run's own summary.
    assert [r.transfer["event"] for r in transfer_records(caplog)] == ["start", "done"]  # type: ignore[attr-defined]


def test_a_run_without_progress_files_starts_no_thread() -> None:
    before = threading.active_count()
    with ProgressTail([], "lab"):
        assert threading.active_count() == before


# --- the real module through the controller's runner path ------------------------------------


class HeldImageServer(http.server.ThreadingHTTPServer):
    """Serves ``content`` at /base.qcow2 whatever the query: the first half at once, the rest
    once ``release`` is set, so the download is certainly still going while the test looks."""

    daemon_threads = True

    def __init__(self, content: bytes) -> None:
        super().__init__(("127.0.0.1", 0), HeldImageHandler)
        self.content = content
        self.release = threading.Event()
        self.requests = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class HeldImageHandler(http.server.BaseHTTPRequestHandler):
    server: HeldImageServer

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/base.qcow2":
            self.send_error(404, "Not Found")
            return
        self.server.requests += 1
        content = self.server.content
        self.send_response(200)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content[: len(content) // 2])
        self.wfile.flush()
        self.server.release.wait(timeout=60)
        self.wfile.write(content[len(content) // 2:])

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def held_server(image: BaseImage) -> Iterator[HeldImageServer]:
    httpd = HeldImageServer(image.path.read_bytes())
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


class RecordingRunner:
    """The real AnsibleRunner, keeping each run's raw results (``image_transfers`` is not part of
    the typed ``Result``)."""

    def __init__(self, runner: AnsibleRunner) -> None:
        self.runner = runner
        self.outcomes: list[OperationResult] = []
        self.operations: list[Operation] = []

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        self.operations.extend(operations)
        outcomes = self.runner.run(provider, verb, operations)
        self.outcomes.extend(outcomes)
        return outcomes


def http_image_config(tmp_path: Path, daemon: LibvirtTestDaemon, image: BaseImage, url: str) -> Path:
    return write_kvm_config(tmp_path / "providers.yaml", [kvm_host("h1", daemon.uri, pool="default-pool")], image,
                            images={"debian-12": {"url": url, "sha256": image.sha256, "format": "qcow2"}})


def create_request(name: str) -> CreateRequest:
    return CreateRequest(key=f"uid-{name}", name=name, user_data_base64=base64.b64encode(b"#cloud-config\n").decode(),
                         port=3128, tags=dict(OWNER_TAGS))


def test_a_kvm_create_logs_its_download_while_it_runs(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                      image: BaseImage, held_server: HeldImageServer,
                                                      caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("EGRESS_PROXIES_CACHE_DIR", str(tmp_path / "cache"))
    # A signed URL with credentials: none of it may show in the log or the result.
    url = held_server.url("/base.qcow2?X-Amz-Signature=TOPSECRET").replace("://", "://user:S3CRET@")
    config = http_image_config(tmp_path, libvirt_test, image, url)
    runner = RecordingRunner(AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=1,
                                           collections_path=collections_path()))
    client = ProviderClient(runner, str(config), "lab", ProviderType.KVM)
    results: list[Any] = []
    create = threading.Thread(target=lambda: results.extend(client.create([create_request("eu-1-3f9c2a")])))
    create.start()
    try:
        wait_for(lambda: transfer_records(caplog) or not create.is_alive(), 90, "a transfer line or the run's end",
                 0.1)
        started = [r.getMessage() for r in transfer_records(caplog)]
        # The server still holds half the image back: this line came while the module was running.
        assert create.is_alive()
        size = f"{len(held_server.content) / MIB:.1f} MiB"
        expected_url = held_server.url("/base.qcow2").replace("://", "://<redacted>@") + "?<redacted>"
        assert started == [f"provider lab: base image debian-12: downloading {expected_url} ({size})"]
    finally:
        held_server.release.set()
        create.join(timeout=120)
    assert [r.ok for r in results] == [True], results
    assert runner.operations[0].progress_option == "progress_path"

    lines = [r.getMessage() for r in transfer_records(caplog)]
    assert len(lines) == 2, lines
    assert lines[1].startswith(f"provider lab: base image debian-12: downloaded and verified {size} in ")
    # The rate, or "n/a" where the clock saw no time pass (the last bytes and the end read in one
    # tick on a loaded machine): the same two cases the structured record allows below.
    assert lines[1].endswith((" MiB/s)", "(rate n/a)")), lines[1]
    done = transfer_records(caplog)[1]
    assert done.provider == "lab"  # type: ignore[attr-defined]
    assert done.transfer["bytes"] == len(held_server.content)  # type: ignore[attr-defined]
    assert done.transfer["rate_mib_s"] is None or done.transfer["rate_mib_s"] > 0  # type: ignore[attr-defined]
    # The transfer lines come before the run's own summary line.
    messages = [r.getMessage() for r in caplog.records]
    summary = next(i for i, m in enumerate(messages) if m.startswith("runner lab create: 1 operation(s)"))
    assert messages.index(lines[1]) < summary

    (outcome,) = runner.outcomes
    (transfer,) = outcome.result["image_transfers"]
    assert transfer["image"] == "debian-12" and transfer["host"] is None and transfer["direction"] == "download"
    assert transfer["bytes"] == len(held_server.content) and transfer["seconds"] > 0
    everything = json.dumps(outcome.result) + caplog.text
    assert "S3CRET" not in everything and "TOPSECRET" not in everything

    # The base volume exists now: the next create transfers nothing and logs no transfer line.
    caplog.clear()
    (again,) = client.create([create_request("eu-2-77aa01")])
    assert again.ok, again.error
    assert transfer_records(caplog) == []
    assert runner.outcomes[-1].result["image_transfers"] == []
    assert held_server.requests == 1


def test_the_module_reports_transfers_to_a_file_and_in_its_result(tmp_path: Path, libvirt_test: LibvirtTestDaemon,
                                                                  image: BaseImage) -> None:
    held = HeldImageServer(image.path.read_bytes())
    held.release.set()
    thread = threading.Thread(target=held.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        config = http_image_config(tmp_path, libvirt_test, image, held.url("/base.qcow2"))
        progress = tmp_path / "progress.jsonl"
        args = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache"),
                "progress_path": str(progress)}
        created = run_module("kvm_proxy", {**args, "name": "eu-1-3f9c2a", "tags": OWNER_TAGS})
    finally:
        held.shutdown()
        held.server_close()
        thread.join(timeout=5)
    assert created.status == "successful", created.result
    written = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [(w["kind"], w["direction"], w["host"]) for w in written] == [
        ("start", "download", None), ("done", "download", None)]
    assert written[0]["url"] == held.url("/base.qcow2") and written[0]["total"] == image.path.stat().st_size
    assert created.result["image_transfers"] == [
        {"image": "debian-12", "host": None, "direction": "download", "bytes": image.path.stat().st_size,
         "seconds": written[1]["seconds"]}]
    # The test driver stores no content, so no upload is reported (tests/integration/
    # test_kvm_real_libvirt.py reports the real one); the cached file is the one served.
    cached = tmp_path / "cache" / f"{image.sha256}.qcow2"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == image.sha256

    info = run_module("kvm_proxy_info", {"provider_config": str(config), "provider": "lab", "tags": OWNER_TAGS})
    assert info.status == "successful" and "image_transfers" not in info.result
