"""The only place that imports ansible_runner: runs a batch of module calls as one playbook.

One ansible-runner call costs about 1.5 s and ~100 MiB whatever it does, so the
controller never spawns one per Proxy: a batch of module calls for one provider
becomes one playbook with one task per call, each ``ignore_errors`` so one failure
does not stop the rest, and each task's result is read back from the runner's events.

Nothing taken from a Proxy is ever templated: every string in the generated playbook
is tagged ``!unsafe`` (and user-data travels base64-encoded on top), so a cloudInit
with ``{{ ... }}`` reaches the instance unchanged and cannot run code here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ansible_runner
import yaml

# libyaml's emitter when PyYAML has it (build_playbook): the pure-Python one spent ~0.5 s of the
# controller's CPU on each fill batch of 1,000 creates, 5x libyaml's, the batch waiting for it.
# The same document; only its long lines are folded elsewhere.
try:
    from yaml import CSafeDumper as _SafeDumper
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper as _SafeDumper  # type: ignore[assignment]

from egress_proxies import metrics
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.transfers import ProgressTail

log = logging.getLogger(__name__)

COLLECTION = "crawl.egress_proxies"
# Memory one ansible-playbook run takes here (measured ~100 MiB), with headroom.
RUN_MEMORY_BYTES = 160 * 1024 * 1024
_TASK_NAME = re.compile(r"^op (\d+)$")
# Every process of a run inherits this variable, which is how its leftovers are found.
RUN_MARKER = "EGRESS_PROXIES_RUN"
# In each run's private data dir: "<pid> <start time>" of the controller that owns the run, so a
# later controller can tell a dead run's leftovers from a live run of another process.
_OWNER_FILE = ".owner"
# The run's temporary directory (its path is written into the private dir, in this file), named
# with this prefix directly in the system temp dir; nothing else is ever removed as a run's.
_TEMP_FILE = ".tempdir"
RUN_TEMP_PREFIX = "egress-proxies-run-"
# First error lines of runs that will fail the same way however often they are retried: the
# collection (or a module of it) cannot be found, the generated playbook does not parse, or
# ansible-playbook itself is missing. Matched case-insensitively against ansible-core 2.19's
# own wording (parsing/mod_args.py, _internal/_yaml/_errors.py; older releases said "Syntax
# Error") and pexpect's for a missing executable (checked by test_runner against real runs).
_PERMANENT_RUN_ERRORS = re.compile(
    r"couldn't resolve module/action|no module/action detected|conflicting action statements|"
    r"yaml parsing failed|syntax error|the command was not found or was not executable", re.IGNORECASE)
# Lines that start a run-level error in ansible-core's output (2.19 writes "[ERROR]: ...",
# older releases "ERROR! ..."); ansible-runner writes the missing-executable line itself.
_RUN_ERROR_LINE = re.compile(r"^(\[ERROR\]:|ERROR!|The command was not found)")
# A run-level error line is logged and stored in a status condition: cut it there.
_MAX_ERROR_LINE = 400
# ansible-runner's event callback replaces a task result longer than MAX_EVENT_RES characters
# (700,000 by default, ~1,500 listed instances) with {}, silently: read as "no instances", every
# instance would be created again. The controller raises the limit (a listing of 10,000 KVM
# instances is ~5 MB) and takes an emptied result for what it is (``DROPPED_RESULT``), never for
# an empty answer.
MAX_RESULT_CHARS = 256 * 1024 * 1024
DROPPED_RESULT = ("no result: ansible-runner dropped the module's result, longer than its MAX_EVENT_RES "
                  "limit of {limit} characters; the run's effects (if any) show in the next listing")


@dataclass(frozen=True)
class Operation:
    """One module call: ``module`` is the short name (``kvm_proxy``), ``key`` says what it is for;
    a batch-form call (``operations``, ``provider_ids``) acts for several, named in ``keys``.
    ``progress_option`` names the module's option for a progress file (``progress_path``): the
    runner points it into the run's private dir and logs the events written there while the
    run lasts (transfers.py)."""

    module: str
    args: dict[str, Any]
    key: str = ""
    check_mode: bool = False
    keys: tuple[str, ...] = ()
    progress_option: str = ""


@dataclass(frozen=True)
class OperationResult:
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error_class: ErrorClass | None = None
    message: str = ""

    @classmethod
    def failure(cls, error_class: ErrorClass, message: str, result: dict[str, Any] | None = None) -> OperationResult:
        return cls(ok=False, result=result or {}, error_class=error_class, message=message)


class Runner(Protocol):
    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        """Run the batch; one result per operation, in order. Never raises for module failures."""


def classify_failure(result: dict[str, Any]) -> ErrorClass:
    """The module's own ``error_class``; anything unclassified is transient (docs/contract.md)."""
    return ErrorClass.of(result.get("error_class"))


class _Unsafe(str):
    """A string Ansible must never template."""


class _Dumper(_SafeDumper):
    pass


_Dumper.add_representer(_Unsafe, lambda dumper, data: dumper.represent_scalar("!unsafe", str(data)))


def _unsafe(value: Any) -> Any:
    if isinstance(value, str):
        # Only a string with a brace can hold a template. Ansible's loader reads an !unsafe scalar
        # of digits as an int even when quoted (a spec-hash tag such as 2937465012345678 reached
        # the module as a number), while a plain string is dumped quoted and stays a string.
        return _Unsafe(value) if "{" in value or "%" in value else value
    if isinstance(value, dict):
        return {str(key): _unsafe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_unsafe(item) for item in value]
    return value


def build_playbook(operations: Sequence[Operation]) -> str:
    """The playbook text for a batch: one ``ignore_errors`` task per operation, all values unsafe."""
    tasks = [
        {"name": f"op {index}", f"{COLLECTION}.{op.module}": _unsafe(op.args), "ignore_errors": True,
         **({"check_mode": True} if op.check_mode else {})}
        for index, op in enumerate(operations)
    ]
    play = [{"name": "egress-proxies batch", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    return yaml.dump(play, Dumper=_Dumper, sort_keys=False)


def run_error(events: Sequence[dict[str, Any]], stdout: str = "") -> str | None:
    """The first run-level error line ansible printed (not a module's failure), or None.

    A missing collection or an unparsable playbook never reaches a task, so no task event
    carries it: ansible-core prints it as ``[ERROR]: ...`` on its stdout, which ansible-runner
    turns into ``verbose`` (or ``error``) events and keeps in the run's ``stdout`` artifact.
    """
    # Task results are skipped: a module's own failure (ansible-core 2.19 prints it as
    # "[ERROR]: Task failed: ...") has its result already, and its message is the module's.
    lines = [str(event.get("stdout") or "") for event in events
             if not str(event.get("event") or "").startswith("runner_on_")]
    if not events:
        lines = stdout.splitlines()  # events lost (a crash of the runner itself): the raw output
    for chunk in lines:
        for line in chunk.splitlines():
            if _RUN_ERROR_LINE.match(line.strip()):
                return line.strip()[:_MAX_ERROR_LINE]
    return None


def run_failure(status: str, error_line: str | None) -> OperationResult:
    """What an operation without a result of its own gets: why the run gave none, and whether
    retrying can help (a timeout or a cancelled run: yes; a missing collection: never)."""
    if status == "timeout":
        return OperationResult.failure(ErrorClass.TRANSIENT, "no result: the run timed out and was killed")
    if status == "canceled":
        return OperationResult.failure(ErrorClass.TRANSIENT, "no result: the run was cancelled (shutdown)")
    if error_line is None:
        return OperationResult.failure(ErrorClass.TRANSIENT, f"no result: the run ended ({status}) first")
    error_class = ErrorClass.PERMANENT if _PERMANENT_RUN_ERRORS.search(error_line) else ErrorClass.TRANSIENT
    return OperationResult.failure(error_class, f"no result: the run failed ({status}): {error_line}")


def results_from_events(events: Sequence[dict[str, Any]], count: int, status: str,
                        stdout: str = "", max_result_chars: int = MAX_RESULT_CHARS) -> list[OperationResult]:
    """One result per operation from the runner's events; a task with no result gets
    ``run_failure``'s verdict (transient unless the run's own error says retrying cannot help).
    An empty ``res`` is one ansible-runner dropped for its size: Ansible itself always sets at
    least ``changed``, so no module's answer is ever ``{}``."""
    results: list[OperationResult | None] = [None] * count
    for event in events:
        event_name = event.get("event")
        if event_name not in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            continue
        data = event.get("event_data") or {}
        match = _TASK_NAME.match(str(data.get("task") or ""))
        if match is None or int(match.group(1)) >= count:
            continue
        res = dict(data.get("res") or {})
        if not res:
            results[int(match.group(1))] = OperationResult.failure(
                ErrorClass.TRANSIENT, DROPPED_RESULT.format(limit=max_result_chars))
        elif event_name == "runner_on_ok":
            results[int(match.group(1))] = OperationResult(ok=True, result=res)
        else:
            results[int(match.group(1))] = OperationResult.failure(
                classify_failure(res), str(res.get("msg") or "module failed without a message"), res)
    if all(result is not None for result in results):
        return [result for result in results if result is not None]
    missing = run_failure(status, run_error(events, stdout))
    return [result or missing for result in results]


def kill_run_processes(ident: str, proc: Path = Path("/proc")) -> list[int]:
    """SIGKILL every process still carrying this run's marker; returns their pids.

    ansible-runner kills the ansible-playbook process group on timeout, but Ansible starts
    each task worker with ``os.setsid()``, so workers and the modules they run live in
    other process groups and would outlive the kill (measured: a module hung in an SSH
    handshake kept running after the timeout). The marker in their environment finds them.
    """
    marker = f"{RUN_MARKER}={ident}".encode()
    killed = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return killed


def _process_start(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The process's start time (clock ticks since boot), or None when it does not exist:
    with the pid it names one process for good, even after the pid is reused."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces and parentheses, so count from its end.
    return stat[stat.rindex(")") + 2:].split()[19]


def _owner_alive(private: Path) -> bool:
    try:
        pid_text, start = (private / _OWNER_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # killed before the owner was written, or not ours: a leftover either way
    return _process_start(pid) == start


def run_temp_dir(private: Path) -> Path | None:
    """The temporary directory the run with this private data dir recorded, if the record is
    there and names one of ours (a recorded path never makes the runner remove anything else)."""
    try:
        recorded = Path((private / _TEMP_FILE).read_text().strip())
    except OSError:
        return None
    ours = recorded.parent == Path(tempfile.gettempdir()) and recorded.name.startswith(RUN_TEMP_PREFIX)
    return recorded if ours else None


def _private_dir(path: Path) -> None:
    """Create (or tighten) a directory only this user can enter: it holds user-data."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)  # mkdir's mode is filtered by the umask, and an existing dir keeps its own


def memory_available_bytes() -> int:
    """What this process may still use: the cgroup limit if set, else MemAvailable."""
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        available = 2 * 1024**3
    try:
        limit_text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        usage = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit_text != "max":
            available = min(available, int(limit_text) - usage)
    except (OSError, ValueError):
        pass
    return max(available, 0)


def concurrency_for_memory(available: int, reserve: int = 256 * 1024 * 1024, cap: int = 8) -> int:
    """How many runner processes fit in memory (never fewer than one, never more than ``cap``)."""
    return max(1, min(cap, (available - reserve) // RUN_MEMORY_BYTES))


def _read_stdout(artifact: Path) -> str:
    """The run's stdout artifact (what ansible printed); empty when there is none."""
    try:
        return (artifact / "stdout").read_text(errors="replace")
    except OSError:
        return ""


def absolute_search_path(search_path: str) -> str:
    """``ANSIBLE_COLLECTIONS_PATH`` with every relative entry made absolute against the current
    directory: each run's playbook runs in a private directory, where a relative entry would
    name another folder, and the collection would not be found."""
    entries = [entry for entry in search_path.split(os.pathsep) if entry]
    return os.pathsep.join(str(Path(entry).expanduser().absolute()) for entry in entries)


class AnsibleRunner:
    """Runs batches through ansible-runner, bounded in time, concurrency and artifacts on disk."""

    def __init__(self, work_dir: Path, timeout_seconds: int = 600, max_concurrent: int | None = None,
                 keep_artifacts: int = 50, collections_path: str | None = None,
                 max_result_chars: int = MAX_RESULT_CHARS) -> None:
        self.work_dir = work_dir
        self.max_result_chars = max_result_chars
        self.timeout_seconds = timeout_seconds
        self.keep_artifacts = keep_artifacts
        self.collections_path = absolute_search_path(collections_path or os.environ.get("ANSIBLE_COLLECTIONS_PATH", ""))
        limit = max_concurrent or concurrency_for_memory(memory_available_bytes())
        self.max_concurrent = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._rotate_lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._cancelled = threading.Event()
        # Each run gets its own private data dir (ansible-runner writes env/envvars and the
        # inventory there, so concurrent runs must not share one); artifacts go to one place.
        self.runs_dir = work_dir / "runs"
        self.artifact_dir = work_dir / "artifacts"
        # Both hold user-data (the batch playbooks; the modules' results): owner only.
        _private_dir(self.runs_dir)
        _private_dir(self.artifact_dir)
        self.remove_leftovers()
        # ansible-runner looks for ansible-playbook on PATH; use the one beside this interpreter.
        bin_dir = str(Path(sys.executable).parent)
        if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")

    def run(self, provider: str, verb: str, operations: Sequence[Operation]) -> list[OperationResult]:
        if not operations:
            return []
        if self._cancelled.is_set():
            # Stopping: a sweep still in flight must start nothing new (its successor may
            # already be leading), not even a run that ansible-runner would cancel a moment later.
            stopping = OperationResult.failure(ErrorClass.TRANSIENT, "no result: the controller is stopping")
            return [stopping] * len(operations)
        ident = f"{time.strftime('%Y%m%dT%H%M%S')}-{provider}-{verb}-{uuid.uuid4().hex[:8]}"
        private = self.runs_dir / ident
        with self._rotate_lock:
            self._in_flight.add(ident)
        with self._slots, metrics.ACTIVE_RUNNERS.track_inprogress():
            started = time.monotonic()
            temp, operations, progress = self._prepare(private, operations)
            try:
                events, status, stdout = self._execute(ident, private, temp, progress, provider, verb)
            except Exception as error:  # the runner itself failing is transient by contract
                log.exception("runner %s %s failed to run", provider, verb)
                events, status, stdout = [], f"error: {error}", ""
            finally:
                self._remove_run(ident, private, temp, f"{provider} {verb}")
            elapsed = time.monotonic() - started
        results = results_from_events(events, len(operations), status, stdout, self.max_result_chars)
        self._index(ident, operations)
        with self._rotate_lock:
            self._in_flight.discard(ident)
        self._rotate()
        error_line = run_error(events, stdout) if status != "successful" else None
        self._record(provider, verb, results, elapsed, status, error_line)
        return results

    def _prepare(self, private: Path, operations: Sequence[Operation]) -> tuple[Path, list[Operation], list[Path]]:
        """The run's private data dir with its playbook, and its temp dir; returns the temp dir,
        the operations as run (progress files filled in) and the progress files to follow."""
        _private_dir(private)
        _private_dir(private / "project")
        # Every temporary file of the run goes here, removed with the run: a run killed at its
        # timeout cannot clean up after itself, and Ansible's local temp dir and the modules'
        # unpacked payloads (~200 KB a run) would pile up in /tmp, an emptyDir with a size
        # limit in the Deployment, until the kubelet evicts the controller. Short and in the
        # system temp dir, not under the work dir: ansible-core 2.21 binds a unix socket in
        # it (multiprocessing's pymp-*/listener-*), and a socket path has 107 bytes at most.
        temp = Path(tempfile.mkdtemp(prefix=RUN_TEMP_PREFIX))
        (private / _TEMP_FILE).write_text(str(temp))
        (private / _OWNER_FILE).write_text(f"{os.getpid()} {_process_start(os.getpid())}")
        # Progress files live in the private dir: fresh per run, removed with it, and the
        # module (local connection) writes them on this machine.
        progress = [private / f"progress-{index}.jsonl" if op.progress_option else None
                    for index, op in enumerate(operations)]
        prepared = [op if path is None else dataclasses.replace(op, args={**op.args, op.progress_option: str(path)})
                    for op, path in zip(operations, progress, strict=True)]
        # O_EXCL and 0600 from the first byte: the playbook holds user-data, never readable
        # by anyone else, not even between a create and a chmod.
        playbook = os.open(private / "project" / "batch.yml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(playbook, "w") as handle:
            handle.write(build_playbook(prepared))
        return temp, prepared, [path for path in progress if path is not None]

    def _execute(self, ident: str, private: Path, temp: Path, progress: Sequence[Path],
                 provider: str, verb: str) -> tuple[list[dict[str, Any]], str, str]:
        """(events, status, stdout) of one ansible-runner run of the prepared playbook."""
        events: list[dict[str, Any]] = []

        def keep(event: dict[str, Any]) -> bool:
            # The events are taken as ansible-runner hands them over, not read back from the
            # artifacts. A listing's are not written there at all: its result is every instance of
            # the provider (4.5 MB at 10,000), and ansible-runner's writing of it cost more CPU
            # than the listing itself, every sweep, while pushing the artifacts of the runs that
            # changed something out of the --keep-artifacts window.
            events.append(event)
            return verb != "list"

        # cancel_callback: without one, ansible-runner takes over SIGINT/SIGTERM for good when
        # called from the main thread (--once, --until-ready); with it, stopping the controller
        # cancels runs in flight.
        with ProgressTail(progress, provider):
            outcome = ansible_runner.run(
                private_data_dir=str(private), playbook="batch.yml", ident=ident, artifact_dir=str(self.artifact_dir),
                inventory={"all": {"hosts": {"localhost": {
                    "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}},
                envvars={"ANSIBLE_COLLECTIONS_PATH": self.collections_path, "ANSIBLE_NOCOLOR": "1",
                         "ANSIBLE_RETRY_FILES_ENABLED": "0", RUN_MARKER: ident,
                         "MAX_EVENT_RES": str(self.max_result_chars), "TMPDIR": str(temp),
                         "ANSIBLE_LOCAL_TEMP": str(temp), "ANSIBLE_REMOTE_TEMP": str(temp)},
                timeout=self.timeout_seconds, quiet=True, cancel_callback=self._cancelled.is_set,
                event_handler=keep,
            )
        status = str(outcome.status)
        stdout = ""
        if not events and status not in ("successful", "timeout", "canceled"):
            stdout = _read_stdout(self.artifact_dir / ident)
        return events, status, stdout

    @staticmethod
    def _remove_run(ident: str, private: Path, temp: Path, what: str) -> None:
        """The playbook holds user-data: it never outlives the run, and neither does any process
        of it (a timed-out run's workers sit in their own sessions)."""
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)
        leftovers = kill_run_processes(ident)
        if leftovers:
            log.warning("runner %s: killed %d leftover process(es) of the run", what, len(leftovers))

    @staticmethod
    def _record(provider: str, verb: str, results: Sequence[OperationResult], elapsed: float, status: str,
                error_line: str | None) -> None:
        """The run's metrics and log lines."""
        metrics.RUNNER_CALLS.labels(provider=provider, verb=verb).inc()
        metrics.RUNNER_SECONDS.labels(provider=provider, verb=verb).observe(elapsed)
        if error_line is not None:
            # The cause of a run that never reached its tasks (a missing collection, ...) is
            # otherwise only in the artifacts: say it where the operator looks.
            log.error("runner %s %s: the run failed: %s", provider, verb, error_line)
        failed = sum(1 for result in results if not result.ok)
        log.info("runner %s %s: %d operation(s), %d failed, %.1f s (%s)", provider, verb, len(results),
                 failed, elapsed, status)

    def remove_leftovers(self) -> list[Path]:
        """Remove the private data dirs (batch playbooks, which hold user-data) of runs whose
        controller is gone (SIGKILLed, OOM-killed, ...), and kill any process still running for
        them; returns the dirs removed. Runs of a live controller sharing the work dir are kept."""
        removed = []
        for private in sorted(self.runs_dir.iterdir()):
            if not private.is_dir() or private.name in self._in_flight or _owner_alive(private):
                continue
            # An orphaned ansible-playbook of that run would go on writing (and creating VMs).
            killed = kill_run_processes(private.name)
            temp = run_temp_dir(private)
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            shutil.rmtree(private, ignore_errors=True)
            removed.append(private)
            log.warning("runner: removed the leftovers of killed run %s%s", private.name,
                        f" and killed {len(killed)} of its processes" if killed else "")
        return removed

    def cancel(self) -> None:
        """Cancel runs in flight and refuse new ones (on shutdown); their operations end transient."""
        self._cancelled.set()

    def _rotate(self) -> None:
        """Keep the newest ``keep_artifacts`` runs' artifacts. Done here, under a lock, because
        ansible-runner's own rotation races when runs finish side by side (measured). Runs still
        in flight are never rotated away: their artifacts are being written."""
        with self._rotate_lock:
            runs = sorted((d for d in self.artifact_dir.iterdir() if d.is_dir() and d.name not in self._in_flight),
                          key=lambda d: d.stat().st_mtime)
            for stale in runs[: max(0, len(runs) - self.keep_artifacts)]:
                shutil.rmtree(stale, ignore_errors=True)

    def _index(self, ident: str, operations: Sequence[Operation]) -> None:
        """Which Proxies a run touched, so their artifacts can be purged when they go."""
        artifact = self.artifact_dir / ident
        if artifact.is_dir():
            keys = {key for op in operations for key in (op.key, *op.keys)}  # a batch-form call acts for all its keys
            (artifact / "egress-proxies-keys.json").write_text(json.dumps(sorted(keys)))

    def purge_artifacts(self, keys: set[str]) -> int:
        """Remove every run's artifacts that touched one of ``keys``; returns how many."""
        removed = 0
        for index in self.artifact_dir.glob("*/egress-proxies-keys.json"):
            try:
                touched = set(json.loads(index.read_text()))
            except (OSError, ValueError):
                continue
            if touched & keys:
                shutil.rmtree(index.parent, ignore_errors=True)
                removed += 1
        return removed
