"""The ansible-runner edge for real: batches, templating safety, timeouts, artifacts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from egress_proxies.providers.client import ProviderClient, ProviderType
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.runner import (
    RUN_MARKER,
    RUN_MEMORY_BYTES,
    AnsibleRunner,
    Operation,
    OperationResult,
    build_playbook,
    concurrency_for_memory,
    results_from_events,
    run_failure,
    run_temp_dir,
)
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, OWNER_TAGS, BaseImage, kvm_host, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.waiting import wait_for

POOL = "default-pool"


@pytest.fixture
def config(testdriver_config: Path) -> Path:
    return testdriver_config


@pytest.fixture
def runner(tmp_path: Path) -> AnsibleRunner:
    return AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=2, keep_artifacts=3,
                         collections_path=collections_path())


def info(config: Path, key: str = "") -> Operation:
    return Operation("kvm_proxy_info", {"provider_config": str(config), "provider": "lab", "tags": OWNER_TAGS},
                     key=key)


def test_a_batch_returns_one_result_per_operation_in_order(runner: AnsibleRunner, config: Path,
                                                           tmp_path: Path) -> None:
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    results = runner.run("lab", "create", [
        Operation("kvm_proxy", {**base, "name": "first", "tags": OWNER_TAGS}),
        Operation("kvm_proxy", {**base, "name": "Not_A_Name"}),  # fails; the batch goes on
        Operation("kvm_proxy", {**base, "name": "third", "tags": OWNER_TAGS}),
    ])
    assert [r.ok for r in results] == [True, False, True]
    assert results[0].result["provider_id"] == "kvm://hosts/h1/domains/first"
    assert results[1].error_class == "permanent" and "name" in results[1].message
    assert results[2].result["provider_id"] == "kvm://hosts/h1/domains/third"


def test_a_listings_events_stay_in_memory_and_other_runs_keep_theirs_in_the_artifacts(
        runner: AnsibleRunner, config: Path, tmp_path: Path) -> None:
    """A listing's result is every instance of a provider: read from ansible-runner as it hands the
    events over, not written to the artifacts. A run that changes something keeps its events there."""
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    (created,) = runner.run("lab", "create", [Operation("kvm_proxy", {**base, "name": "first", "tags": OWNER_TAGS})])
    (listed,) = runner.run("lab", "list", [info(config)])
    assert created.ok and listed.ok
    assert [i["provider_id"] for i in listed.result["instances"]] == ["kvm://hosts/h1/domains/first"]

    def task_events(verb: str) -> list[str]:
        (artifact,) = [d for d in runner.artifact_dir.iterdir() if f"-lab-{verb}-" in d.name]
        return sorted(f.name for f in (artifact / "job_events").glob("*.json")
                      if json.loads(f.read_text())["event"].startswith("runner_on_"))

    assert len(task_events("create")) >= 2  # runner_on_start and runner_on_ok at least
    assert task_events("list") == []


def test_nothing_from_a_proxy_is_templated(runner: AnsibleRunner, config: Path, tmp_path: Path,
                                           libvirt_test: LibvirtTestDaemon) -> None:
    marker = tmp_path / "template-code-ran"
    attack = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    results = runner.run("lab", "create", [
        Operation("kvm_proxy", {**base, "name": "tagged", "tags": {**OWNER_TAGS, "crawl.example.com/proxy": attack}}),
        Operation("kvm_proxy", {**base, "name": "located", "location": attack}),
    ])
    assert results[0].ok, results[0].message
    # The tag value reached libvirt unchanged ...
    assert results[0].result["instance"]["tags"]["crawl.example.com/proxy"] == attack
    xml = libvirt_test.connection.lookupByName("tagged").XMLDesc()
    assert "lookup(&apos;pipe&apos;" in xml or "lookup('pipe'" in xml
    # ... and an unknown location is reported as such, verbatim, not evaluated.
    assert results[1].error_class == "permanent" and attack in results[1].message
    assert not marker.exists()


def test_the_playbook_marks_every_string_that_could_be_a_template_unsafe_and_keeps_strings_strings() -> None:
    from ansible.parsing.yaml.loader import AnsibleLoader

    args = {"name": "{{ x }}", "tags": {"k": "{% raw %}", "spec-hash": "2937465012345678", "flag": "true"},
            "port": 3128}
    text = build_playbook([Operation("kvm_proxy", args)])
    assert "name: !unsafe '{{ x }}'" in text
    assert "k: !unsafe '{% raw %}'" in text
    assert "port: 3128" in text
    # What the module gets: every string a string (an !unsafe scalar of digits loads as an int).
    (play,) = AnsibleLoader(text).get_single_data()
    assert play["tasks"][0]["crawl.egress_proxies.kvm_proxy"] == args


def test_a_result_ansible_runner_dropped_for_its_size_fails_instead_of_reading_as_empty(
        tmp_path: Path, config: Path) -> None:
    """The real ansible-runner: above MAX_EVENT_RES it swaps the module's result for {} (a
    listing of ~1,500 instances read as "no instances" had a 10,000-Proxy fleet created twice).
    A small limit stands in for a big fleet here; the default keeps the same listing whole."""
    base = {"provider_config": str(config), "provider": "lab", "image_cache_dir": str(tmp_path / "cache")}
    small = AnsibleRunner(tmp_path / "small", timeout_seconds=120, max_concurrent=1,
                          collections_path=collections_path(), max_result_chars=200)
    (created,) = small.run("lab", "create", [Operation("kvm_proxy", {**base, "name": "big", "tags": OWNER_TAGS})])
    # The create's own result is longer than 200 characters too: dropped, so not ok, and
    # transient (the next listing shows what it did), never an instance-less success.
    assert not created.ok and created.error_class == "transient", created
    assert "dropped the module's result" in created.message and "200 characters" in created.message

    (listed,) = small.run("lab", "list", [info(config)])
    assert not listed.ok and listed.error_class == "transient" and "MAX_EVENT_RES" in listed.message
    client = ProviderClient(small, str(config), "lab", ProviderType.KVM)
    listing = client.list_instances(OWNER)
    assert listing.error is not None and not listing.instances

    whole = AnsibleRunner(tmp_path / "whole", timeout_seconds=120, max_concurrent=1,
                          collections_path=collections_path())
    (listed,) = whole.run("lab", "list", [info(config)])
    assert listed.ok and [i["name"] for i in listed.result["instances"]] == ["big"]


def test_a_successful_listing_without_instances_is_an_error_not_an_empty_fleet() -> None:
    class Answers:
        def run(self, _provider: str, _verb: str, _operations: Sequence[Operation]) -> list[OperationResult]:
            return [OperationResult(ok=True, result={"changed": False})]

    listing = ProviderClient(Answers(), "providers.yaml", "lab", ProviderType.KVM).list_instances("owner")
    assert listing.error is not None and listing.error.error_class is ErrorClass.TRANSIENT
    assert "no 'instances' list" in listing.error.message


def test_results_missing_from_the_events_are_transient() -> None:
    events = [{"event": "runner_on_ok", "event_data": {"task": "op 0", "res": {"changed": False}}},
              {"event": "runner_on_failed", "event_data": {"task": "op 1", "res": {"msg": "boom"}}}]
    results = results_from_events(events, 3, "timeout")
    assert results[0].ok
    assert results[1].error_class == "transient" and results[1].message == "boom"  # unclassified
    assert results[2].error_class == "transient" and "timed out" in results[2].message


@pytest.fixture
def silent_ssh_port() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a hung sshd)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    server.close()


def run_processes(provider: str) -> set[int]:
    """Processes of runs for ``provider`` (other tests and benchmarks may run modules meanwhile)."""
    marker = f"{RUN_MARKER}=".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                variables = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(marker) and f"-{provider}-".encode() in v for v in variables):
                found.add(int(entry.name))
    return found


def hung_host_config(tmp_path: Path, port: int, image: BaseImage) -> Path:
    """A provider config whose one host is an sshd that never answers: module calls hang."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("127.0.0.1 " + " ".join(Path(f"{key}.pub").read_text().split()[:2]) + "\n")
    return write_kvm_config(tmp_path / "providers.yaml",
                            [kvm_host("hung", f"qemu+libssh://root@127.0.0.1:{port}/system")],
                            image, ssh={"keyFile": str(key), "knownHostsFile": str(known_hosts)})


def test_a_hung_run_is_killed_with_its_process_group(tmp_path: Path, silent_ssh_port: int,
                                                     image: BaseImage) -> None:
    config = hung_host_config(tmp_path, silent_ssh_port, image)
    # 6 s: long enough for ansible-playbook to start and unpack the module on 2 loaded cores
    # (3 s was not, once), shorter than libssh's own 10 s wait on the silent port, so "timed out"
    # can only be the runner's kill.
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=6, max_concurrent=1,
                           collections_path=collections_path())
    seen: set[int] = set()
    payloads: set[Path] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(run_processes("hung-test"))
            with contextlib.suppress(OSError):  # a run's dirs go as it ends
                for temp in filter(None, map(run_temp_dir, runner.runs_dir.iterdir())):
                    payloads.update(temp.glob("ansible_*_payload_*"))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    (result,) = runner.run("hung-test", "list", [info(config)])
    elapsed = time.monotonic() - started
    done.set()
    watcher.join()
    assert result.error_class == "transient"
    assert "timed out" in result.message
    assert elapsed < 12  # the kill and its clean-up, well before a run left to itself would end
    assert len(seen) >= 3  # ansible-playbook, its task worker (own session) and the module
    assert run_processes("hung-test") == set()  # nothing of the run survives it
    # Nor its temporary files: the module unpacked itself in the run's own temp dir (it never
    # got to remove it), and that went with the run.
    assert payloads, "the module's payload was not unpacked in the run's temp dir"
    assert not any(path.exists() for path in payloads)
    assert list(runner.runs_dir.iterdir()) == []


def test_artifacts_are_rotated_and_purged_per_proxy(runner: AnsibleRunner, config: Path) -> None:
    for key in ("uid-a", "uid-b", "uid-c", "uid-d"):
        runner.run("lab", "list", [info(config, key=key)])
    artifacts = runner.artifact_dir
    kept = [d for d in artifacts.iterdir() if d.is_dir()]
    assert len(kept) == 3  # keep_artifacts
    assert list(runner.runs_dir.iterdir()) == []  # playbooks (they hold user-data) are gone
    assert runner.purge_artifacts({"uid-c"}) == 1
    remaining = sorted((d / "egress-proxies-keys.json").read_text() for d in artifacts.iterdir() if d.is_dir())
    assert remaining == ['["uid-b"]', '["uid-d"]']


@pytest.mark.parametrize(
    ("available", "expected"),
    [(0, 1), (256 * 2**20, 1), (256 * 2**20 + 3 * RUN_MEMORY_BYTES, 3), (64 * 2**30, 8)],
)
def test_concurrency_is_set_by_memory(available: int, expected: int) -> None:
    assert concurrency_for_memory(available) == expected


def test_concurrent_runs_never_exceed_the_cap(runner: AnsibleRunner, config: Path) -> None:
    assert runner.max_concurrent == 2
    peak = 0
    running = 0
    lock = threading.Lock()
    original = runner._slots

    class Counting:
        def __enter__(self) -> None:
            nonlocal running, peak
            original.acquire()
            with lock:
                running += 1
                peak = max(peak, running)

        def __exit__(self, *_exc: object) -> None:
            nonlocal running
            with lock:
                running -= 1
            original.release()

    runner._slots = Counting()  # type: ignore[assignment]
    outcomes: list[bool] = []

    def one(provider: str) -> None:
        outcomes.extend(result.ok for result in runner.run(provider, "list", [info(config)]))

    threads = [threading.Thread(target=one, args=(f"p{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak == 2
    # Concurrent runs never share state (each has its own private data dir and marker).
    assert outcomes == [True] * 4
    assert os.environ.get("PATH", "").split(os.pathsep)[0]  # the runner put its bin dir on PATH


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


_KILLED_CONTROLLER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from egress_proxies.providers.runner import AnsibleRunner, Operation
    runner = AnsibleRunner(Path(sys.argv[1]), timeout_seconds=300, max_concurrent=1, collections_path=sys.argv[3])
    runner.run("killed-test", "create", [Operation("kvm_proxy_info", {
        "provider_config": sys.argv[2], "provider": "lab", "tags": {"secret-user-data": "s3cret"}})])
""")


def test_a_killed_runs_playbook_is_private_and_removed_when_the_next_runner_starts(
        tmp_path: Path, silent_ssh_port: int, image: BaseImage) -> None:
    config = hung_host_config(tmp_path, silent_ssh_port, image)
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3] / "controller"),
                                                        os.environ.get("PYTHONPATH", "")])}
    # A controller in the middle of a batch whose module hangs, then SIGKILLed as an OOM kill
    # or `kill -9` would: no finally block runs.
    controller = subprocess.Popen([sys.executable, "-c", _KILLED_CONTROLLER, str(work), str(config),
                                   collections_path()], env=env, start_new_session=True)
    try:
        # A condition, not a clock: generous because ansible-playbook's start on 2 loaded cores
        # (two test streams side by side in CI) has taken over 60 s; quiet it takes about 2 s.
        wait_for(lambda: len(run_processes("killed-test")) >= 3, 240, "the run to reach its module", 0.2)
        (playbook,) = (work / "runs").glob("*/project/batch.yml")
        temp = run_temp_dir(playbook.parent.parent)
        assert temp is not None and temp.is_dir() and mode(temp) == 0o700  # the run's temporary files, owner-only too
        # While it runs: the playbook (it holds user-data) is owner-only, in owner-only dirs.
        assert mode(playbook) == 0o600
        assert mode(playbook.parent) == mode(playbook.parent.parent) == mode(work / "runs") == 0o700
        assert mode(work / "artifacts") == 0o700
        assert "s3cret" in playbook.read_text()
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait(timeout=10)
        assert playbook.exists()  # what a SIGKILLed run leaves behind (today: forever)
        assert run_processes("killed-test")  # and its ansible-playbook keeps running, orphaned
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    assert temp.is_dir()
    AnsibleRunner(work, timeout_seconds=60, max_concurrent=1, collections_path=collections_path())
    assert list((work / "runs").iterdir()) == []
    assert not temp.exists()
    wait_for(lambda: run_processes("killed-test") == set(), 5, "the orphaned run's processes to go", 0.1)


def test_runs_of_a_live_controller_sharing_the_work_dir_are_left_alone(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = AnsibleRunner(work, max_concurrent=1, collections_path=collections_path())
    live = subprocess.Popen(["sleep", "60"])
    try:
        stat_fields = Path(f"/proc/{live.pid}/stat").read_text().rsplit(")", 1)[1].split()
        running = first.runs_dir / "20261203T000000-other-create-live"
        (running / "project").mkdir(parents=True)
        (running / ".owner").write_text(f"{live.pid} {stat_fields[19]}")
        dead = first.runs_dir / "20261203T000000-other-create-dead"
        (dead / "project").mkdir(parents=True)
        (dead / "project" / "batch.yml").write_text("user-data")
        # A dead owner whose pid was reused: same pid, other start time.
        reused = first.runs_dir / "20261203T000000-other-create-reused"
        reused.mkdir()
        (reused / ".owner").write_text(f"{live.pid} 1")
        AnsibleRunner(work, max_concurrent=1, collections_path=collections_path())
        assert sorted(p.name for p in first.runs_dir.iterdir()) == [running.name]
    finally:
        live.kill()
        live.wait()


def test_a_missing_collection_is_permanent_with_ansibles_own_error(tmp_path: Path, config: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "no-collections"
    empty.mkdir()
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=1, collections_path=str(empty))
    with caplog.at_level(logging.INFO, logger="egress_proxies.providers.runner"):
        results = runner.run("lab", "list", [info(config), info(config)])
    for result in results:
        assert result.error_class == "permanent", result.message
        assert "couldn't resolve module/action 'crawl.egress_proxies.kvm_proxy_info'" in result.message
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("couldn't resolve module/action" in message for message in errors), errors


def test_ansible_not_installed_is_permanent_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    # No ansible-playbook anywhere on PATH (the runner adds its interpreter's dir: point that away too).
    monkeypatch.setattr(sys, "executable", str(bare / "python3"))
    monkeypatch.setenv("PATH", str(bare))
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=60, max_concurrent=1, collections_path=collections_path())
    (result,) = runner.run("lab", "list", [Operation("kvm_proxy_info", {})])
    assert result.error_class == "permanent", result.message
    assert "ansible-playbook" in result.message


@pytest.mark.parametrize(("status", "line", "expected"), [
    ("failed", "[ERROR]: YAML parsing failed: While parsing a flow sequence did not find expected ','.", "permanent"),
    ("failed", "ERROR! Syntax Error while loading YAML.", "permanent"),
    ("failed", "[ERROR]: conflicting action statements: a, b", "permanent"),
    ("failed", "[ERROR]: Unexpected Exception, this is probably a bug: [Errno 28] No space left on device",
     "transient"),
    ("timeout", None, "transient"),
    ("canceled", None, "transient"),
    ("failed", None, "transient"),
])
def test_run_failures_are_permanent_only_when_retrying_cannot_help(status: str, line: str | None,
                                                                   expected: str) -> None:
    events = [{"event": "verbose", "stdout": "[WARNING]: something else"}]
    if line is not None:
        events.append({"event": "verbose", "stdout": line})
        assert run_failure(status, line).error_class == expected
    (result,) = results_from_events(events, 1, status)
    assert result.error_class == expected
    if line is not None:
        assert line in result.message


def test_a_modules_own_failure_line_is_not_taken_for_the_runs_error() -> None:
    events = [{"event": "runner_on_failed", "stdout": "[ERROR]: Task failed: Module failed: syntax error in x",
               "event_data": {"task": "op 0", "res": {"msg": "syntax error in x", "error_class": "transient"}}}]
    first, second = results_from_events(events, 2, "failed")
    assert first.error_class == "transient" and first.message == "syntax error in x"
    assert second.error_class == "transient" and "syntax" not in second.message


def test_after_cancel_no_run_starts(tmp_path: Path) -> None:
    runner = AnsibleRunner(tmp_path / "work", max_concurrent=1, collections_path=collections_path())
    runner.cancel()
    started = time.monotonic()
    results = runner.run("lab", "create", [Operation("kvm_proxy", {}), Operation("kvm_proxy", {})])
    assert time.monotonic() - started < 0.5
    assert [(r.ok, r.error_class) for r in results] == [(False, "transient")] * 2
    assert "stopping" in results[0].message
    assert list(runner.artifact_dir.iterdir()) == [] and list(runner.runs_dir.iterdir()) == []
