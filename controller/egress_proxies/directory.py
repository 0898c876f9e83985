"""Proxies from a local directory: the embedded default for a single host with no cluster.

Each ``<file>.yaml`` holds one Proxy (the same shape as the Kubernetes resource; its
``metadata.name`` and ``metadata.namespace`` name it, the file name when they are absent).
The controller writes ``<file>.status.yaml`` beside it with what the API server would keep
for it: uid, resourceVersion, generation, finalizers, annotations and status. Removing
the Proxy's file is deleting the Proxy: while its status file still carries our
finalizer, it is presented with a ``deletionTimestamp``, so the same deletion path as on
Kubernetes runs, and releasing the finalizer removes the status file.

Writes are whole-file replacements (write + rename) and carry an optimistic
resourceVersion, so the semantics match what the reconciler expects from the API.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from egress_proxies.model import API_VERSION, KIND, Proxy
from egress_proxies.store import Conflict, Gone, StoreError, WatchEvent

log = logging.getLogger(__name__)

STATUS_SUFFIX = ".status.yaml"


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class DirectoryStore:
    def __init__(self, directory: Path, namespace: str = "default") -> None:
        self.directory = directory
        self.namespace = namespace
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], str] = {}  # (namespace, name) -> file stem

    # -- files ---------------------------------------------------------------------------------

    def _spec_files(self) -> dict[str, Path]:
        files = {}
        for path in sorted(self.directory.glob("*.yaml")):
            if path.name.endswith(STATUS_SUFFIX) or path.name.startswith("."):
                continue
            files[path.name[: -len(".yaml")]] = path
        return files

    def _status_path(self, name: str) -> Path:
        return self.directory / f"{name}{STATUS_SUFFIX}"

    def _read_spec(self, path: Path) -> dict[str, Any] | None:
        try:
            document = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            log.error("%s: not a readable Proxy (%s); ignored until fixed", path, error)
            return None
        if not isinstance(document, dict) or document.get("kind") != KIND:
            log.error("%s: not a Proxy (kind must be %s); ignored", path, KIND)
            return None
        return document

    def _read_state(self, name: str) -> dict[str, Any]:
        try:
            state = yaml.safe_load(self._status_path(name).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, yaml.YAMLError) as error:
            raise StoreError(f"{self._status_path(name)}: {error}") from error
        return state if isinstance(state, dict) else {}

    def _load(self, stem: str, path: Path | None) -> Proxy | None:
        state = self._read_state(stem)
        document = self._read_spec(path) if path is not None else None
        metadata = state.get("metadata") or {}
        if document is None and path is not None:
            if not metadata:
                return None  # never seen before: nothing to protect, nothing to do
            # Unreadable now, known before: present the last good spec, so a typo in the file
            # neither deletes the Proxy nor lets garbage collection take its instance.
            document = {"metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace")},
                        "spec": state.get("spec") or {}}
        if document is None:
            if not metadata.get("finalizers"):
                return None
            spec = state.get("spec") or {}
            deletion = metadata.get("deletionTimestamp") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        else:
            spec = document.get("spec") or {}
            deletion = None
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
        generation = int(metadata.get("generation") or 1)
        if metadata.get("specDigest") and metadata["specDigest"] != digest:
            generation += 1
        doc_metadata = (document or {}).get("metadata") or {}
        annotations = {**(doc_metadata.get("annotations") or {}), **(metadata.get("annotations") or {})}
        proxy = Proxy(
            namespace=str(doc_metadata.get("namespace") or metadata.get("namespace") or self.namespace),
            name=str(doc_metadata.get("name") or metadata.get("name") or stem),
            uid=str(metadata.get("uid") or uuid.uuid4()), spec=spec,
            status=dict(state.get("status") or {}), generation=generation,
            resource_version=str(metadata.get("resourceVersion") or "0"),
            finalizers=list(metadata.get("finalizers") or []), annotations=annotations,
            deletion_timestamp=deletion, creation_timestamp=metadata.get("creationTimestamp"),
        )
        self._files[(proxy.namespace, proxy.name)] = stem
        return proxy

    def _stem(self, proxy: Proxy) -> str:
        return self._files.get((proxy.namespace, proxy.name), proxy.name)

    def _save(self, proxy: Proxy, expected_version: str) -> Proxy:
        """Write everything the API server would keep; optimistic on resourceVersion."""
        stem = self._stem(proxy)
        with self._lock:
            current = self._read_state(stem)
            current_version = str((current.get("metadata") or {}).get("resourceVersion") or "0")
            if current and current_version != expected_version:
                raise Conflict(f"{proxy.key}: resourceVersion {expected_version} is stale ({current_version})")
            if proxy.deleting and not proxy.finalizers:
                self._status_path(stem).unlink(missing_ok=True)
                return proxy
            version = str(int(current_version) + 1)
            state = {
                "apiVersion": API_VERSION, "kind": f"{KIND}State",
                "metadata": {
                    "name": proxy.name, "namespace": proxy.namespace, "uid": proxy.uid, "resourceVersion": version,
                    "generation": proxy.generation,
                    "specDigest": hashlib.sha256(json.dumps(proxy.spec, sort_keys=True).encode()).hexdigest(),
                    "finalizers": proxy.finalizers, "annotations": proxy.annotations,
                    "creationTimestamp": proxy.creation_timestamp
                    or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "deletionTimestamp": proxy.deletion_timestamp,
                },
                # Kept so a Proxy whose file is gone can still be deleted from its instance.
                "spec": proxy.spec,
                "status": proxy.status,
            }
            _atomic_write(self._status_path(stem), yaml.safe_dump(state, sort_keys=False))
            proxy.resource_version = version
            return proxy

    # -- ProxyStore ----------------------------------------------------------------------------

    def list_proxies(self) -> tuple[list[Proxy], str]:
        if not self.directory.is_dir():
            raise StoreError(f"Proxy directory {self.directory} does not exist")
        files = self._spec_files()
        stems = set(files) | {p.name[: -len(STATUS_SUFFIX)] for p in self.directory.glob(f"*{STATUS_SUFFIX}")}
        proxies = [proxy for stem in sorted(stems) if (proxy := self._load(stem, files.get(stem))) is not None]
        keys = [proxy.key for proxy in proxies]
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise StoreError(f"{self.directory}: more than one file defines Proxy {', '.join(duplicates)}")
        for proxy in proxies:
            if proxy.resource_version == "0":  # first sight: give it its identity now
                self._save(proxy, "0")
        return proxies, ""

    def get_proxy(self, namespace: str, name: str) -> Proxy:
        stem = self._files.get((namespace, name), name)
        proxy = self._load(stem, self._spec_files().get(stem))
        if proxy is None or proxy.namespace != namespace:
            raise Gone(f"{namespace}/{name}")
        return proxy

    def watch_proxies(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:  # noqa: ARG002
        """Files have no change feed; the periodic sweep covers them. Waits, then ends."""
        time.sleep(timeout_seconds)
        return iter(())

    def replace_metadata(self, proxy: Proxy) -> Proxy:
        return self._save(proxy, proxy.resource_version)

    def replace_status(self, proxy: Proxy) -> Proxy:
        return self._save(proxy, proxy.resource_version)

    def record_event(self, proxy: Proxy, event_type: str, reason: str, message: str) -> None:
        log.log(logging.WARNING if event_type == "Warning" else logging.INFO, "event %s %s: %s: %s", proxy.key,
                event_type, reason, message)
