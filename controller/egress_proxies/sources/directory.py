"""Proxies from a local directory: the embedded default for a single host with no cluster.

Each ``<file>.yaml`` holds one Proxy (the same shape as the Kubernetes resource; its
``metadata.name`` and ``metadata.namespace`` name it, the file name when they are absent).
The controller writes ``<file>.status.yaml`` beside it with what the API server would keep
for it: uid, resourceVersion, generation, finalizers, annotations and status. Removing
the Proxy's file is deleting the Proxy: while its status file still carries our
finalizer, it is presented with a ``deletionTimestamp``, so the same deletion path as on
Kubernetes runs, and releasing the finalizer removes the status file.

Writes are whole-file replacements (a 0600 temporary file, fsync, rename) and carry an
optimistic resourceVersion, so the semantics match what the reconciler expects from the API.
A listing reads and parses only the files changed since the one before (``file_cache``); an
unchanged file costs one ``stat(2)``.

Safe to operate:

- **One controller per directory.** The store holds an exclusive ``flock(2)`` on
  ``.egress-proxies.lock`` in the directory for its whole life; a second controller (another
  process, or a second store in this one) fails with :class:`DirectoryLocked`, naming the pid
  and host that hold it. The kernel drops the lock when its holder exits, however it exits,
  so a SIGKILLed controller never leaves a stale lock behind.
- **Renaming a Proxy file is a rename.** A status file belongs to the namespace/name it
  records, and follows the file that defines it: a file with no status file of its own that
  defines the Proxy of a status file whose Proxy file is gone takes that status file over (it
  is moved beside it): same uid, finalizer, status and instance. Re-creating a Proxy file
  while that Proxy's deletion is still in progress cancels the deletion the same way.
  Changing ``metadata.name`` (or, without one, the file name) makes a different Proxy, as on
  Kubernetes: the old one's status file is moved aside (``<file>~<uid>.status.yaml``) and it
  is deleted, unless another file now defines it; the new one starts fresh. A status file
  whose Proxy file is gone and that no finalizer holds is removed, as the API server removes
  an object once its last finalizer is released.
- **One bad file fails only its own Proxy.** A Proxy file that cannot be read or parsed, has
  the wrong shape (``spec`` a list, ``metadata`` a string), or a status file that is corrupt
  (not YAML, not a mapping, ``generation: abc``, wrong-typed fields), or two files defining
  one namespace/name: each is returned with ``Proxy.defect`` saying which file, what is wrong
  and the fix, and every other Proxy is returned as usual. The reconciler acts on nothing for a
  defective Proxy (no create, no delete, no garbage collection of its instance).
- **What the Proxy file says wins.** Annotations in the Proxy file override the stored ones;
  the status file keeps only annotations the file does not set (the controller's own, and any
  an operator puts there for a Proxy whose file is gone).
- **Status files hold no secrets.** ``cloudInit`` (user-data) is never written to them: the
  stored spec only serves to delete the instance of a Proxy whose file is gone, and to present
  the last good spec while the file cannot be read. They are never readable by more users than
  the Proxy file (group and others get read access only where the Proxy file grants it) and
  never writable by anyone but their owner. Older status files are rewritten on first sight.

What an operator does about each of these faults is in docs/operations.md ("What happens when
..."); each defect message says it too.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from egress_proxies.resources import times
from egress_proxies.resources.proxy import API_VERSION, KIND, Proxy
from egress_proxies.sources.atomic_file import write_file
from egress_proxies.sources.file_cache import ParsedFiles
from egress_proxies.sources.store import Conflict, Gone, StoreError, WatchEvent

log = logging.getLogger(__name__)

STATUS_SUFFIX = ".status.yaml"
LOCK_NAME = ".egress-proxies.lock"
# write_file's temporary files, of every YAML file the controller writes in the directory.
TEMPORARY_GLOB = ".*.yaml.*.tmp"
# Spec fields never written to a status file: user-data may carry credentials, and nothing
# the status file is for (deleting an instance, presenting the last good spec) needs it.
NOT_STORED = frozenset({"cloudInit"})
# A uid as the status file writes it, found even when the file no longer parses, so a
# defective Proxy still protects its instance (tagged with that uid) from garbage collection.
_UID_LINE = re.compile(r"^\s*uid:\s*['\"]?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})['\"]?\s*$",
                       re.MULTILINE)
_SCAN_ATTEMPTS = 3
# libyaml's loader and dumper when PyYAML has them: the same YAML 1.1 and safe types, several
# times faster, and a sweep parses every Proxy file and status file.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # a safe loader (C or Python): never arbitrary objects


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False, allow_unicode=True)


_CORRUPT_STATE_FIX = (
    "it is the controller's only record of this Proxy's uid and finalizer, so nothing is done for the Proxy "
    "and the file is left as it is. Fix: repair it (the uid is the crawl.example.com/uid tag on the Proxy's "
    "instance), or delete it to start the Proxy over (a new uid and instance; the old instance is "
    "garbage-collected after --gc-grace)")


class DirectoryLocked(StoreError):
    """Another controller holds this Proxy directory; this one must not start."""


class _Vanished(Exception):
    """A Proxy file disappeared between listing the directory and reading it (a rename)."""


# Frozen, as are the documents in them by convention: ParsedFiles hands the same ones to every
# listing while the file is unchanged, and _entry copies what a Proxy may change.
@dataclass(frozen=True)
class _ProxyFile:
    """A Proxy file as read: the document, or why there is none."""

    path: Path
    document: dict[str, Any] | None
    problem: str | None = None
    not_a_proxy: str | None = None  # parsed, but not a Proxy (another kind of YAML file)


@dataclass(frozen=True)
class _StatusFile:
    """A status file as read. ``data`` is set only when it is sound; ``stored`` is a best-effort
    reading either way (its uid and name still protect and name a defective Proxy)."""

    path: Path
    data: dict[str, Any] | None
    stored: Proxy | None
    problem: str | None
    uid: str | None

    @property
    def key(self) -> tuple[str, str] | None:
        if self.stored is None or not self.stored.name:
            return None
        return (self.stored.namespace, self.stored.name)


@dataclass
class _FoundProxy:
    stem: str
    proxy: Proxy
    writable: bool
    key_known: bool
    files: list[str]
    state: _StatusFile | None


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def spec_digest(spec: Any) -> str:
    try:
        text = json.dumps(spec, sort_keys=True)
    except (TypeError, ValueError):
        # YAML can hold what JSON cannot (dates, non-string keys): digest its YAML form instead.
        text = yaml.safe_dump(spec, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _allowed_mode(source_mode: int) -> int:
    """Owner read/write; group and others may read only where the source grants them read."""
    return 0o600 | (source_mode & 0o044)


def _read_problem(error: OSError | UnicodeDecodeError) -> str:
    return f"cannot be read ({getattr(error, 'strerror', None) or one_line(error)})"


def _parse_spec(path: Path, text: str) -> _ProxyFile:
    try:
        document = load_yaml(text)
    except yaml.YAMLError as error:
        return _ProxyFile(path, None, f"is not valid YAML ({one_line(error)})")
    if not isinstance(document, dict):
        return _ProxyFile(path, None, not_a_proxy=f"holds a {type(document).__name__}, not a {KIND}")
    if document.get("kind") != KIND:
        return _ProxyFile(path, None, not_a_proxy=f"has kind {document.get('kind')!r}, not {KIND}")
    return _ProxyFile(path, document)


def _unreadable_spec(path: Path, error: OSError | UnicodeDecodeError) -> _ProxyFile:
    return _ProxyFile(path, None, _read_problem(error))


def _parse_state(path: Path, text: str) -> _StatusFile:
    salvaged = match.group(1) if (match := _UID_LINE.search(text)) else None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as error:
        return _StatusFile(path, None, None, f"is not valid YAML ({one_line(error)})", salvaged)
    if not isinstance(data, dict):
        return _StatusFile(path, None, None, f"is not a mapping (it holds {type(data).__name__})", salvaged)
    stored = Proxy.from_object(data)
    problems = [stored.defect] if stored.defect else []
    found = data.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    for field_name in ("uid", "name", "namespace"):
        if not isinstance(metadata.get(field_name), str) or not metadata.get(field_name):
            problems.append(f"metadata.{field_name}: must be a non-empty string")
    version = metadata.get("resourceVersion")
    if isinstance(version, bool) or not isinstance(version, int | str) or not str(version).isdigit():
        problems.append(f"metadata.resourceVersion: must be a number, not {version!r}")
    if metadata.get("specDigest") is not None and not isinstance(metadata.get("specDigest"), str):
        problems.append("metadata.specDigest: must be a string")
    uid = stored.uid if isinstance(metadata.get("uid"), str) and metadata.get("uid") else salvaged
    if problems:
        return _StatusFile(path, None, stored, "; ".join(problems), uid)
    return _StatusFile(path, data, stored, None, uid)


def _unreadable_state(path: Path, error: OSError | UnicodeDecodeError) -> _StatusFile:
    return _StatusFile(path, None, None, _read_problem(error), None)


def _orphaned_records(specs: dict[str, _ProxyFile], states: dict[str, _StatusFile]) -> dict[tuple[str, str], list[str]]:
    """Sound records whose Proxy file is gone, by the Proxy they hold: a renamed file's record."""
    orphans: dict[tuple[str, str], list[str]] = {}
    for stem, state in states.items():
        if stem not in specs and state.data is not None and state.key is not None:
            orphans.setdefault(state.key, []).append(stem)
    return orphans


class DirectoryStore:
    def __init__(self, directory: Path, namespace: str = "default") -> None:
        self.directory = directory
        self.namespace = namespace
        self.lock = threading.RLock()
        self._lock_fd: int | None = None
        # Where each Proxy's record lives, by uid (two files may name one Proxy, so not by key).
        self._stems: dict[str, str] = {}
        self._by_key: dict[str, str] = {}
        self._readonly: set[str] = set()  # uids whose record must not be written
        self._reported: set[str] = set()  # problems already logged, so a sweep does not repeat them
        self._noted: set[str] = set()  # problems seen by the scan in progress
        # Each file's parse, reused while the file is unchanged (file_cache): a listing reads
        # only the files written since the last one.
        self._proxy_files = ParsedFiles(_parse_spec, _unreadable_spec)
        self._status_files = ParsedFiles(_parse_state, _unreadable_state)
        if directory.is_dir():
            # Taken now, so a second controller refuses to start; a directory that does not
            # exist yet is locked by the first listing that finds it.
            self._acquire()

    # -- the directory lock --------------------------------------------------------------------

    def _acquire(self) -> None:
        if self._lock_fd is not None:
            return
        path = self.directory / LOCK_NAME
        try:
            # os.open's descriptors are close-on-exec (PEP 446): ansible-runner's children never
            # inherit the lock, so it cannot outlive this process.
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise StoreError(f"{path}: cannot create the lock file ({error.strerror}); the controller needs write "
                             f"access to its Proxy directory") from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(f"{path}: cannot lock ({error.strerror})") from error
            if holder == self._holder():
                holder += ", this very process"
            raise DirectoryLocked(
                f"Proxy directory {self.directory} is in use by another controller ({holder or 'holder unknown'}); "
                f"two controllers on one directory would each create every instance. Stop the other one, or give "
                f"this one its own --proxy-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self._holder()}\n".encode(), 0)
        self._lock_fd = fd
        self._remove_leftovers()

    @staticmethod
    def _holder() -> str:
        return f"pid {os.getpid()} on {socket.gethostname()}"

    def _remove_leftovers(self) -> None:
        """Temporary files of a controller killed mid-write (``write_file``'s, of every file it
        writes here: status files, pool members, which may hold a template's cloudInit, and pool
        records): nobody else writes here (we hold the lock)."""
        for leftover in self.directory.glob(TEMPORARY_GLOB):
            leftover.unlink(missing_ok=True)
            log.info("removed %s, left by a controller stopped while writing it", leftover)

    def close(self) -> None:
        """Release the directory (another controller may take it)."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> DirectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading files -------------------------------------------------------------------------

    def spec_files(self) -> dict[str, Path]:
        files = {}
        for path in sorted(self.directory.glob("*.yaml"), key=lambda path: path.name):  # one directory: by name
            if path.name.endswith(STATUS_SUFFIX) or path.name.startswith("."):
                continue
            files[path.name[: -len(".yaml")]] = path
        return files

    def status_path(self, stem: str) -> Path:
        return self.directory / f"{stem}{STATUS_SUFFIX}"

    def _read_spec(self, path: Path) -> _ProxyFile:
        try:
            return self._proxy_files.get(path)
        except FileNotFoundError as error:
            raise _Vanished(str(path)) from error

    def _read_state(self, stem: str) -> _StatusFile | None:
        try:
            return self._status_files.get(self.status_path(stem))
        except FileNotFoundError:
            return None

    # -- building Proxies ----------------------------------------------------------------------

    def _key_of(self, stem: str, document: dict[str, Any] | None, state: _StatusFile | None) -> tuple[str, str]:
        metadata = document.get("metadata") if document is not None else None
        metadata = metadata if isinstance(metadata, dict) else {}
        stored = state.stored if state is not None else None

        def pick(field_name: str, fallback: str) -> str:
            value = metadata.get(field_name)
            if isinstance(value, str) and value:
                return value
            if stored is not None and getattr(stored, field_name):
                return str(getattr(stored, field_name))
            return fallback

        return pick("namespace", self.namespace), pick("name", stem)

    def _entry(self, stem: str, spec: _ProxyFile | None, state: _StatusFile | None) -> _FoundProxy | None:
        """One Proxy from its file (``spec``, None when the file is gone) and its status file."""
        defects: list[str] = []
        sound = state is not None and state.data is not None
        stored = state.stored if state is not None else None
        # The Proxy gets its own document (raw), spec and status: parses are kept between listings
        # and callers change these in place. deepcopy keeps YAML aliases as a fresh parse would.
        document = copy.deepcopy(spec.document) if spec is not None else None
        if spec is None and (sound and stored is not None and not stored.finalizers):
            return None  # file gone and nothing of ours on it: nothing to protect, nothing to do
        from_file = Proxy.from_object(document) if document is not None else None
        if spec is not None and from_file is not None:
            metadata = document.get("metadata") if document is not None else None
            if from_file.defect:
                defects.append(f"{spec.path}: {from_file.defect}; fix the file")
            if isinstance(metadata, dict):
                for field_name in ("name", "namespace"):
                    value = metadata.get(field_name)
                    if value is not None and not isinstance(value, str):
                        defects.append(f"{spec.path}: metadata.{field_name}: must be a string, not {value!r}; "
                                       f"fix the file")
        if spec is not None and spec.problem is not None:
            kept = "its last good spec is kept and " if sound else ""
            defects.append(f"{spec.path}: {spec.problem}; {kept}nothing is done for this Proxy until the file is fixed")
        if state is not None and state.problem is not None:
            defects.append(f"{state.path}: {state.problem}; {_CORRUPT_STATE_FIX}")
        # Identity is created only for what can be read: never for a corrupt record (it would
        # bury the one that exists) nor for a file that has never parsed.
        writable = (state is None or sound) and not (spec is not None and spec.document is None and not sound)

        namespace, name = self._key_of(stem, document, state)
        key_known = document is not None or (state is not None and state.key is not None)
        if from_file is not None:
            spec_dict = from_file.spec
            deletion = None
        else:
            spec_dict = copy.deepcopy(stored.spec) if stored is not None else {}
            deletion = None
            if spec is None:  # the Proxy's file is gone: it is being deleted
                deletion = (stored.deletion_timestamp if stored is not None else None) or times.stamp()
        generation = stored.generation if stored is not None else 1
        stored_digest = (state.data or {}).get("metadata", {}).get("specDigest") if sound and state else None
        if document is not None and stored_digest and stored_digest != spec_digest(document.get("spec") or {}):
            generation += 1
        uid = (state.uid if state is not None else None) or (
            str(uuid.uuid4()) if writable else str(uuid.uuid5(uuid.NAMESPACE_URL, f"file://{self.directory}/{stem}")))
        annotations = {**(stored.annotations if stored is not None else {}),
                       **(from_file.annotations if from_file is not None else {})}
        proxy = Proxy(
            namespace=namespace, name=name, uid=uid, spec=spec_dict,
            status=copy.deepcopy(stored.status) if stored is not None else {}, generation=generation,
            resource_version=(stored.resource_version or "0") if sound and stored is not None else "0",
            finalizers=list(stored.finalizers) if stored is not None else [], annotations=annotations,
            deletion_timestamp=deletion, creation_timestamp=stored.creation_timestamp if stored is not None else None,
            raw=document, defect="; ".join(defects) or None,
        )
        files = [spec.path.name] if spec is not None else [f"{state.path.name} (its Proxy file is gone)"
                                                          if state is not None else stem]
        return _FoundProxy(stem, proxy, writable, key_known, files, state)

    def _scan(self) -> list[_FoundProxy]:
        for _ in range(_SCAN_ATTEMPTS):
            try:
                return self._scan_once()
            except _Vanished:
                continue  # a file was renamed under us: look again rather than see it deleted
        raise StoreError(f"{self.directory}: Proxy files kept disappearing while being read; trying again next sweep")

    def _scan_once(self) -> list[_FoundProxy]:
        if not self.directory.is_dir():
            raise StoreError(f"Proxy directory {self.directory} does not exist")
        self._acquire()
        self._noted = set()
        specs, states = self._read_files()
        self._set_aside_records(specs, states)
        entries, adopted = self._entries_with_file(specs, states, _orphaned_records(specs, states))
        entries += self._entries_without_file(specs, states, adopted)
        self._mark_duplicates(entries)
        for entry in entries:
            if entry.writable and entry.state is not None and entry.state.data is not None:
                self._narrow(entry.state.path, self._mode_for(entry.stem))
        self._remember(entries)
        return entries

    def _read_files(self) -> tuple[dict[str, _ProxyFile], dict[str, _StatusFile]]:
        """Every Proxy file and every status file, by stem; the parses of files no longer here
        are forgotten."""
        spec_paths = self.spec_files()
        specs = {stem: self._read_spec(path) for stem, path in spec_paths.items()}
        status_stems = sorted(p.name[: -len(STATUS_SUFFIX)] for p in self.directory.glob(f"*{STATUS_SUFFIX}")
                              if not p.name.startswith("."))
        states = {stem: state for stem in status_stems if (state := self._read_state(stem)) is not None}
        self._proxy_files.keep_only(set(spec_paths.values()))
        self._status_files.keep_only({state.path for state in states.values()})
        return specs, states

    def _set_aside_records(self, specs: dict[str, _ProxyFile], states: dict[str, _StatusFile]) -> None:
        """A record belongs to the Proxy it names. When its file now defines another one (its
        metadata.name was changed), the Proxy it names no longer has a file: move the record
        aside, under a stem no file has, so that Proxy is deleted (or found again, by a renamed
        file adopting it)."""
        for stem, spec in specs.items():
            state = states.get(stem)
            if (state is not None and state.data is not None and state.key is not None
                    and spec.document is not None and self._key_of(stem, spec.document, None) != state.key):
                aside = self._free_stem(stem, state.uid, set(specs) | set(states))
                states[aside] = self._move(state, aside)
                del states[stem]
                log.info("%s now defines %s/%s, no longer %s/%s: that Proxy's record moves to %s",
                         spec.path.name, *self._key_of(stem, spec.document, None), *state.key,
                         states[aside].path.name)

    def _entries_with_file(self, specs: dict[str, _ProxyFile], states: dict[str, _StatusFile],
                           orphans: dict[tuple[str, str], list[str]]) -> tuple[list[_FoundProxy], set[str]]:
        """The Proxies that have a file, and the stems of the records renamed files adopted."""
        entries: list[_FoundProxy] = []
        adopted: set[str] = set()
        for stem, spec in specs.items():
            state = states.get(stem)
            if spec.not_a_proxy is not None:
                if state is None:
                    self._note(f"{spec.path}: {spec.not_a_proxy}; ignored", logging.INFO)
                    continue
                # It was a Proxy (it has a record): keep it, as for any unreadable file.
                spec = _ProxyFile(spec.path, None, f"is no longer a Proxy: it {spec.not_a_proxy}")
            if state is None and spec.document is not None:
                state = self._adopt(stem, spec, states, orphans.get(self._key_of(stem, spec.document, None), []),
                                    adopted)
            entry = self._entry(stem, spec, state)
            if entry is not None:
                entries.append(entry)
        return entries, adopted

    def _adopt(self, stem: str, spec: _ProxyFile, states: dict[str, _StatusFile], candidates: list[str],
               adopted: set[str]) -> _StatusFile | None:
        """A file with no record of its own takes over the record of the Proxy it defines, when
        exactly one record whose file is gone holds it and no other file took it (a rename):
        the record is moved beside it and its stem added to ``adopted``."""
        if len(candidates) != 1 or candidates[0] in adopted:
            return None
        old = candidates[0]
        state = self._move(states[old], stem)
        adopted.add(old)
        log.info("%s now defines Proxy %s/%s, whose file was %s.yaml: a rename; it keeps uid %s",
                 spec.path.name, *(state.key or ("?", "?")), old, state.uid)
        return state

    def _entries_without_file(self, specs: dict[str, _ProxyFile], states: dict[str, _StatusFile],
                              adopted: set[str]) -> list[_FoundProxy]:
        """The Proxies whose file is gone that a finalizer still holds; the records of the others
        are removed."""
        entries: list[_FoundProxy] = []
        for stem, state in states.items():
            if stem in specs or stem in adopted:
                continue
            if (entry := self._entry(stem, None, state)) is not None:
                entries.append(entry)
            else:
                # Its file is gone and no finalizer holds it: the Proxy is deleted, as the API
                # server deletes an object once its last finalizer is released.
                state.path.unlink(missing_ok=True)
                log.info("%s: removed; its Proxy file is gone and no finalizer holds it", state.path.name)
        return entries

    def _remember(self, entries: list[_FoundProxy]) -> None:
        """Where each Proxy's record lives and which may be written, for the writes until the next
        scan; and each defect logged once while it lasts."""
        self._stems = {e.proxy.uid: e.stem for e in entries}
        self._by_key = {e.proxy.key: e.stem for e in reversed(entries)}
        self._readonly = {e.proxy.uid for e in entries if not e.writable}
        for entry in entries:
            if entry.proxy.defect:
                self._note(entry.proxy.defect, logging.WARNING)
        self._reported = self._noted

    def _note(self, message: str, level: int) -> None:
        """Log a problem once while it lasts, not once per sweep."""
        if message not in self._reported and message not in self._noted:
            log.log(level, "%s", message)
        self._noted.add(message)

    def _move(self, state: _StatusFile, stem: str) -> _StatusFile:
        target = self.status_path(stem)
        try:
            os.replace(state.path, target)
        except OSError as error:
            raise StoreError(f"{state.path}: cannot move it to {target.name} ({error.strerror})") from error
        return _StatusFile(target, state.data, state.stored, state.problem, state.uid)

    def _free_stem(self, stem: str, uid: str | None, taken: set[str]) -> str:
        """A stem no Proxy file has, for a record whose Proxy no longer has a file."""
        base = f"{stem}~{(uid or 'record')[:8]}"
        candidate, number = base, 1
        while candidate in taken or self.status_path(candidate).exists() or (
                self.directory / f"{candidate}.yaml").exists():
            number += 1
            candidate = f"{base}-{number}"
        return candidate

    @staticmethod
    def _mark_duplicates(entries: list[_FoundProxy]) -> None:
        by_key: dict[tuple[str, str], list[_FoundProxy]] = {}
        for entry in entries:
            if entry.key_known:
                by_key.setdefault((entry.proxy.namespace, entry.proxy.name), []).append(entry)
        for (namespace, name), group in by_key.items():
            if len(group) < 2:
                continue
            files = ", ".join(f for entry in group for f in entry.files)
            message = (f"Proxy {namespace}/{name} is defined more than once ({files}); nothing is done for it until "
                       f"one definition remains: delete the extra file or give it another metadata.name")
            for entry in group:
                entry.proxy.defect = f"{entry.proxy.defect}; {message}" if entry.proxy.defect else message
                # A definition with no record of its own gets none while the conflict lasts:
                # creating one would make a second identity for the same name.
                if entry.proxy.resource_version == "0":
                    entry.writable = False

    def _mode_for(self, stem: str) -> int:
        for source in (self.directory / f"{stem}.yaml", self.status_path(stem)):
            try:
                return _allowed_mode(source.stat().st_mode)
            except FileNotFoundError:
                continue
        return 0o600

    @staticmethod
    def _narrow(path: Path, mode: int) -> None:
        """A record no wider than its Proxy file, even after that file was narrowed (chmod)."""
        try:
            if stat.S_IMODE(path.stat().st_mode) & ~mode:
                os.chmod(path, mode)
        except OSError as error:
            log.warning("%s: cannot narrow its mode to its Proxy file's (%s); trying again next sweep", path,
                        error.strerror)

    # -- writing -------------------------------------------------------------------------------

    def _save(self, proxy: Proxy, expected_version: str) -> Proxy:
        """Write everything the API server would keep; optimistic on resourceVersion."""
        with self.lock:
            if proxy.uid in self._readonly:
                # Its record is corrupt (evidence to keep) or it has none it may create: the
                # defect is logged and reported by the reconciler; the files stay as they are.
                log.debug("%s: not written (%s)", proxy.key, proxy.defect)
                return proxy
            stem = self._stems.get(proxy.uid) or self._by_key.get(proxy.key) or proxy.name
            current = self._read_state(stem)
            if current is not None and current.data is None:
                raise Conflict(f"{proxy.key}: {current.path} changed since it was read and {current.problem}")
            data = current.data if current is not None and current.data is not None else {}
            metadata = data.get("metadata") or {}
            if metadata and metadata.get("uid") != proxy.uid:
                raise Conflict(f"{proxy.key}: {self.status_path(stem)} now holds another Proxy")
            current_version = str(metadata.get("resourceVersion") or "0")
            if data and current_version != expected_version:
                raise Conflict(f"{proxy.key}: resourceVersion {expected_version} is stale ({current_version})")
            if proxy.deleting and not proxy.finalizers:
                self.status_path(stem).unlink(missing_ok=True)
                return proxy
            version = str(int(current_version) + 1)
            # A defective Proxy's spec is not a spec to delete an instance with: keep the last good one.
            previous = data.get("spec")
            spec = previous if proxy.defect and isinstance(previous, dict) else proxy.spec
            if isinstance(proxy.raw, dict):
                digest = spec_digest(proxy.raw.get("spec") or {})
                from_file = proxy.raw.get("metadata")
                file_annotations = from_file.get("annotations") if isinstance(from_file, dict) else None
            else:  # no readable file: what was last read from it still stands
                digest = metadata.get("specDigest") or spec_digest(proxy.spec)
                file_annotations = None
            file_annotations = file_annotations if isinstance(file_annotations, dict) else {}
            state = {
                "apiVersion": API_VERSION, "kind": f"{KIND}State",
                "metadata": {
                    "name": proxy.name, "namespace": proxy.namespace, "uid": proxy.uid, "resourceVersion": version,
                    "generation": proxy.generation, "specDigest": digest, "finalizers": proxy.finalizers,
                    # Only what the Proxy file does not say: the file's own stay the file's to change.
                    "annotations": {k: v for k, v in proxy.annotations.items() if file_annotations.get(k) != v},
                    "creationTimestamp": proxy.creation_timestamp
                    or times.stamp(),
                    "deletionTimestamp": proxy.deletion_timestamp,
                },
                # Kept so a Proxy whose file is gone can still be deleted from its instance.
                "spec": {k: v for k, v in spec.items() if k not in NOT_STORED},
                "status": proxy.status,
            }
            path = self.status_path(stem)
            try:
                write_file(path, dump_yaml(state), self._mode_for(stem))
            except OSError as error:
                raise StoreError(f"{proxy.key}: cannot write {path} ({error.strerror})") from error
            proxy.resource_version = version
            return proxy

    # -- ProxyStore ----------------------------------------------------------------------------

    def list_proxies(self) -> tuple[list[Proxy], str]:
        with self.lock:
            entries = self._scan()
            for entry in entries:
                if entry.writable and entry.proxy.resource_version == "0":  # first sight: its identity, now
                    self._save(entry.proxy, "0")
        return [entry.proxy for entry in entries], ""

    def get_proxy(self, namespace: str, name: str) -> Proxy:
        with self.lock:
            for entry in self._scan():
                if entry.proxy.namespace == namespace and entry.proxy.name == name:
                    return entry.proxy
        raise Gone(f"{namespace}/{name}")

    def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:  # noqa: ARG002
        """Files have no change feed; the periodic sweep covers them. Waits, then ends."""
        time.sleep(timeout_seconds)
        return iter(())

    def replace_metadata(self, proxy: Proxy) -> Proxy:
        return self._save(proxy, proxy.resource_version)

    def replace_status(self, proxy: Proxy) -> Proxy:
        return self._save(proxy, proxy.resource_version)

    def namespace_identities(self, namespaces: Collection[str]) -> dict[str, str]:
        """A namespace here is only a name in this directory, with no object of its own to be
        deleted and made again: its identity is the directory (resolved), so a work directory's
        credentials never pass to another Proxy directory's namespace of the same name. Within
        one directory a namespace ends when its last Proxy file has been gone for the credential
        grace period (``credentials.Credentials``)."""
        identity = f"directory:{self.directory.resolve()}"
        return dict.fromkeys(namespaces, identity)

    def record_event(self, proxy: Proxy, event_type: str, reason: str, message: str) -> None:
        log.log(logging.WARNING if event_type == "Warning" else logging.INFO, "event %s %s: %s: %s", proxy.key,
                event_type, reason, message)
