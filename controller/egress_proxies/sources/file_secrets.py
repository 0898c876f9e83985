"""The directory source's store of proxy credentials (``credentials.SecretBackend``; the Kubernetes
source's is ``kube.KubeSecrets``): one YAML file per Proxy namespace, 0600 in a 0700 directory,
never readable by anyone but the controller, not even while it is written."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from egress_proxies.resources.proxy import checked_namespace, is_namespace_name
from egress_proxies.sources.atomic_file import write_file

log = logging.getLogger(__name__)


class FileSecrets:
    """The directory source's store: ``<directory>/<namespace>.yaml``, each 0600, in a 0700
    directory. Deleting a file rotates that namespace's credential. Every namespace it is given is
    checked to be a namespace name first (``checked_namespace``): it becomes a file name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, namespace: str) -> Path:
        return self.directory / f"{checked_namespace(namespace)}.yaml"

    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        path = self._path(namespace)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, yaml.YAMLError) as error:
            log.warning("credentials file of namespace %s unreadable (%s): making new ones", namespace,
                        type(error).__name__)  # never the content: it holds the password
            return None
        if not isinstance(data, dict):
            return None
        return {str(k): str(v) for k, v in data.items()}, False

    def load_all(self) -> dict[str, tuple[dict[str, str], bool]]:
        found: dict[str, tuple[dict[str, str], bool]] = {}
        for path in sorted(self.directory.glob("*.yaml")):
            namespace = path.name[:-len(".yaml")]
            if is_namespace_name(namespace) and (stored := self.load(namespace)) is not None:
                found[namespace] = stored
        return found

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        path = self._path(namespace)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        write_file(path, yaml.safe_dump(dict(data), sort_keys=True), 0o600)

    def delete(self, namespace: str) -> None:
        self._path(namespace).unlink(missing_ok=True)
