"""The collection as users get it: built by ``scripts/build_collection.sh`` (``ansible-galaxy
collection build`` on the files git tracks) and installed from the tarball into a clean
directory, so tests run it without the source tree's symlink.

``installed_env`` is the environment an Ansible run needs to see only that install: the clean
path first, then the ``site-packages`` of the pinned ``ansible`` package for the dependencies
(``kubernetes.core`` and friends, which Galaxy would otherwise provide), and no scanning of
``sys.path`` (which would find the source tree through pytest's ``pythonpath``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from support import REPO

GALAXY = Path(sys.executable).parent / "ansible-galaxy"


@dataclass(frozen=True)
class InstalledCollection:
    artifact: Path
    """The tarball ``ansible-galaxy collection build`` made."""
    collections_path: Path
    """The clean ``ANSIBLE_COLLECTIONS_PATH`` it was installed into."""
    install_log: str

    @property
    def root(self) -> Path:
        return self.collections_path / "ansible_collections" / "crawl" / "egress_proxies"

    def env(self, home: Path) -> dict[str, str]:
        """Environment for ansible-* commands that must use this install (``home``: a scratch HOME)."""
        return {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(self.collections_path), dependencies_path()]),
            "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
            "HOME": str(home),
            "TMPDIR": str(home),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
        }


def dependencies_path() -> str:
    """Where the pinned ``ansible`` package put community.libvirt, ansible.posix, kubernetes.core."""
    return sysconfig.get_paths()["purelib"]


def build_artifact(output: Path, source: Path = REPO) -> Path:
    """The artifact as ``scripts/build_collection.sh`` builds it: from the files git tracks in
    ``source`` (a checkout), whatever else lies there."""
    subprocess.run(["bash", str(source / "scripts" / "build_collection.sh"), str(output)],
                   env={**os.environ, "ANSIBLE_GALAXY": str(GALAXY)}, check=True, capture_output=True, text=True)
    (artifact,) = output.glob("crawl-egress_proxies-*.tar.gz")
    return artifact


def install_artifact(artifact: Path, collections_path: Path) -> InstalledCollection:
    """Install offline, as on a machine without Galaxy: dependencies must already be present."""
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": dependencies_path()}
    done = subprocess.run([str(GALAXY), "collection", "install", "--offline", "-p", str(collections_path),
                           str(artifact)], check=True, capture_output=True, text=True, env=env)
    return InstalledCollection(artifact, collections_path, done.stdout + done.stderr)
