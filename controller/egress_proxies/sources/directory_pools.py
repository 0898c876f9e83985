"""ProxyPools from the directory source (``store.PoolStore`` for ``directory.DirectoryStore``).

A pool is a ``kind: ProxyPool`` file beside the Proxy files (the Proxy store ignores it). Its
record (uid, resourceVersion, generation, annotations, finalizers, status) is the hidden file
``.<file>.pool.yaml``, which no Proxy scan reads. Its members are ordinary Proxy files the
controller writes, ``<member>.yaml`` with a header saying the pool manages them, so they are
reconciled (and deleted, by removing the file) exactly like hand-written ones. Removing the pool
file deletes the pool: while its record holds the finalizer it is presented as deleting, its
member files are removed, and the record goes once none is left.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import yaml

from egress_proxies.resources import times
from egress_proxies.resources.pool import POOL_KIND, POOL_LABEL, Pool
from egress_proxies.resources.proxy import API_VERSION, NAME_RULE, is_object_name
from egress_proxies.sources.atomic_file import write_file
from egress_proxies.sources.directory import DirectoryStore, dump_yaml, load_yaml, one_line, spec_digest
from egress_proxies.sources.store import Conflict, StoreError

log = logging.getLogger(__name__)


POOL_STATE_PREFIX = "."
POOL_STATE_SUFFIX = ".pool.yaml"
MEMBER_HEADER = ("# Managed by the egress-proxies controller as a member of ProxyPool {namespace}/{pool} ({file}).\n"
                 "# Do not edit: change the pool instead. Deleting this file deletes the member (the pool makes\n"
                 "# a new one if it still needs it).\n")


class DirectoryPools:
    """``store.PoolStore`` for the directory source (see the module docstring)."""

    def __init__(self, store: DirectoryStore) -> None:
        self.store = store
        self.directory = store.directory
        self._stems: dict[str, str] = {}  # pool uid -> file stem

    def _state_path(self, stem: str) -> Path:
        return self.directory / f"{POOL_STATE_PREFIX}{stem}{POOL_STATE_SUFFIX}"

    def list_pools(self) -> list[Pool]:
        with self.store.lock:
            if not self.directory.is_dir():
                raise StoreError(f"Proxy directory {self.directory} does not exist")
            pools: list[Pool] = []
            stems: set[str] = set()
            for stem, path in self.store.spec_files().items():
                try:
                    document = load_yaml(path.read_text())
                except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
                    document, problem = None, f"{path} cannot be read or parsed ({one_line(error)})"
                else:
                    problem = f"{path} no longer holds a {POOL_KIND}"
                if not isinstance(document, dict) or document.get("kind") != POOL_KIND:
                    state = self._read_state(stem) if self._state_path(stem).exists() else None
                    if state is not None:
                        # A pool whose file cannot be read now is not a deleted pool: it stays,
                        # Failed with the reason, and its members are neither touched nor orphaned.
                        stems.add(stem)
                        pool = self._pool(stem, None, state)
                        pool.deletion_timestamp = None
                        pool.defect = f"{problem}; fix the file (or delete it to delete the pool)"
                        pools.append(pool)
                    continue  # not a pool (the Proxy scan reports files it cannot read)
                stems.add(stem)
                pools.append(self._pool(stem, document, self._read_state(stem)))
            for state_path in self.directory.glob(f"{POOL_STATE_PREFIX}*{POOL_STATE_SUFFIX}"):
                stem = state_path.name[len(POOL_STATE_PREFIX):-len(POOL_STATE_SUFFIX)]
                if stem in stems:
                    continue
                state = self._read_state(stem)
                if state is None or not state.get("metadata", {}).get("finalizers"):
                    state_path.unlink(missing_ok=True)  # file gone, nothing holds it: deleted
                    continue
                pool = self._pool(stem, None, state)
                pools.append(pool)
            return pools

    def _read_state(self, stem: str) -> dict[str, Any] | None:
        try:
            data = load_yaml(self._state_path(stem).read_text())
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise StoreError(f"{self._state_path(stem)}: unreadable ({one_line(error)}); fix or delete it "
                             "(deleting it gives the pool a new identity: its members are then strays)") from error
        return data if isinstance(data, dict) else None

    def _pool(self, stem: str, document: dict[str, Any] | None, state: dict[str, Any] | None) -> Pool:
        stored = Pool.from_object(state) if state is not None else None
        metadata = (document or {}).get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        name = str(metadata.get("name") or (stored.name if stored else "") or stem)
        namespace = str(metadata.get("namespace") or (stored.namespace if stored else "") or self.store.namespace)
        spec = document.get("spec") if document is not None else (stored.spec if stored else None)
        generation = stored.generation if stored is not None else 1
        digest = spec_digest(spec) if document is not None else None
        if stored is not None and digest and (state or {}).get("metadata", {}).get("specDigest") not in (None, digest):
            generation += 1
        found = metadata.get("annotations")
        file_annotations: dict[str, Any] = found if isinstance(found, dict) else {}
        pool = Pool(namespace=namespace, name=name, uid=stored.uid if stored and stored.uid else str(uuid.uuid4()),
                    spec=spec, status=dict(stored.status) if stored else {}, generation=generation,
                    resource_version=stored.resource_version if stored else "0",
                    annotations={**(stored.annotations if stored else {}),
                                 **{str(k): str(v) for k, v in file_annotations.items()}},
                    finalizers=list(stored.finalizers) if stored else [],
                    deletion_timestamp=None if document is not None else times.stamp(),
                    raw={"metadata": {"name": name, "namespace": namespace, "specDigest": digest}})
        self._stems[pool.uid] = stem
        if stored is None:
            self._save(pool, "0")  # first sight: its identity, now
        return pool

    def _save(self, pool: Pool, expected: str) -> Pool:
        with self.store.lock:
            stem = self._stems.get(pool.uid, pool.name)
            path = self._state_path(stem)
            current = self._read_state(stem) if path.exists() else None
            metadata = (current or {}).get("metadata") or {}
            version = str(metadata.get("resourceVersion") or "0")
            if current is not None and (metadata.get("uid") != pool.uid or version != expected):
                raise Conflict(f"pool {pool.key}: {path.name} changed since it was read")
            if pool.deleting and not pool.finalizers:
                path.unlink(missing_ok=True)
                return pool
            raw_metadata = (pool.raw or {}).get("metadata") or {}
            data = {"apiVersion": API_VERSION, "kind": f"{POOL_KIND}State",
                    "metadata": {"name": pool.name, "namespace": pool.namespace, "uid": pool.uid,
                                 "resourceVersion": str(int(version) + 1), "generation": pool.generation,
                                 "specDigest": raw_metadata.get("specDigest") or metadata.get("specDigest"),
                                 "annotations": pool.annotations, "finalizers": pool.finalizers},
                    "spec": pool.spec, "status": pool.status}
            try:
                write_file(path, dump_yaml(data), 0o600)
            except OSError as error:
                raise StoreError(f"pool {pool.key}: cannot write {path} ({error.strerror})") from error
            pool.resource_version = str(int(version) + 1)
            return pool

    def replace_pool_status(self, pool: Pool) -> Pool:
        return self._save(pool, pool.resource_version)

    def replace_pool_metadata(self, pool: Pool) -> Pool:
        return self._save(pool, pool.resource_version)

    def _member_path(self, name: str) -> Path:
        """``<name>.yaml`` in the directory; a name that is no Kubernetes name (``../x``) never names
        a file (the sweep refuses such a pool before it gets here)."""
        if not is_object_name(name):
            raise StoreError(f"member name {name!r} {NAME_RULE}; no file is written for it")
        return self.directory / f"{name}.yaml"

    def create_proxy(self, namespace: str, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        path = self._member_path(name)
        pool = (body["metadata"].get("labels") or {}).get(POOL_LABEL, "?")
        with self.store.lock:
            if path.exists() or self.store.status_path(name).exists():
                raise Conflict(f"{path.name} exists already")
            header = MEMBER_HEADER.format(namespace=namespace, pool=pool, file=path.name)
            try:
                write_file(path, header + dump_yaml(body), 0o600)
            except OSError as error:
                raise StoreError(f"cannot write {path} ({error.strerror})") from error

    def delete_proxy(self, namespace: str, name: str) -> None:
        # Only a file the controller wrote for a pool: a hand-written Proxy is never removed here.
        path = self._member_path(name)
        with self.store.lock:
            try:
                text = path.read_text()
            except FileNotFoundError:
                return
            except OSError as error:
                raise StoreError(f"cannot read {path} ({error.strerror})") from error
            if not text.startswith("# Managed by the egress-proxies controller as a member of ProxyPool "
                                   f"{namespace}/"):
                raise StoreError(f"{path} is not a pool member file the controller wrote; not deleting it")
            path.unlink(missing_ok=True)

    def record_pool_event(self, pool: Pool, event_type: str, reason: str, message: str) -> None:
        log.log(logging.WARNING if event_type == "Warning" else logging.INFO, "event pool %s %s: %s: %s", pool.key,
                event_type, reason, message)
