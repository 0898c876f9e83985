"""Run one of the collection's modules the way the controller does: through its ansible-runner edge.

Each call is one run of ``egress_proxies.providers.runner.AnsibleRunner`` (so every value is written
``!unsafe`` into the playbook, exactly as for the controller) in a throwaway directory.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from egress_proxies.providers.runner import AnsibleRunner, Operation
from support import REPO


@dataclass
class ModuleRun:
    status: str  # "successful" or "failed"
    result: dict[str, Any]

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def collections_path() -> str:
    """Where Ansible finds the collection: the installed tree if set, else the source symlink."""
    return os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".venv" / "collections")


def run_module(module: str, args: dict[str, Any], check_mode: bool = False,
               workdir: str | None = None, timeout: int = 300) -> ModuleRun:
    """Run ``crawl.egress_proxies.<module>`` once on localhost and return its result."""
    with tempfile.TemporaryDirectory(dir=workdir) as private:
        runner = AnsibleRunner(Path(private), timeout_seconds=timeout, max_concurrent=1,
                               collections_path=collections_path())
        (outcome,) = runner.run("test", module, [Operation(module, args, check_mode=check_mode)])
    return ModuleRun(status="successful" if outcome.ok else "failed", result=outcome.result)
