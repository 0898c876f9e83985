"""Run one of the collection's modules the way the controller does: through ansible-runner.

Every value is written into the playbook as ``!unsafe``, so Ansible never templates
what a test passes (a Jinja user-data must reach the seed unchanged).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

REPO = Path(__file__).resolve().parents[2]
# ansible-runner finds ansible-playbook on PATH: use the one beside this interpreter.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


class _Unsafe(str):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Unsafe, lambda dumper, data: dumper.represent_scalar("!unsafe", str(data)))


def _mark_unsafe(value: Any) -> Any:
    if isinstance(value, str):
        return _Unsafe(value)
    if isinstance(value, dict):
        return {key: _mark_unsafe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mark_unsafe(item) for item in value]
    return value


@dataclass
class ModuleRun:
    status: str
    result: dict[str, Any]
    event: str = ""

    @property
    def failed(self) -> bool:
        return self.event == "runner_on_failed"


def collections_path() -> str:
    """Where Ansible finds the collection: the installed tree if set, else the source symlink."""
    return os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".venv" / "collections")


def run_module(module: str, args: dict[str, Any], check_mode: bool = False,
               workdir: str | None = None, timeout: int = 300) -> ModuleRun:
    """Run ``crawl.egress_proxies.<module>`` once on localhost and return its result."""
    task = {"name": module, f"crawl.egress_proxies.{module}": _mark_unsafe(args), "check_mode": check_mode}
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]
    with tempfile.TemporaryDirectory(dir=workdir) as private:
        project = Path(private, "project")
        project.mkdir()
        (project / "run.yml").write_text(yaml.dump(play, Dumper=_Dumper))
        inventory = {"all": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": os.environ.get(
                "EGRESS_PROXIES_TEST_PYTHON", sys.executable)}}}}
        runner = ansible_runner.run(
            private_data_dir=private, playbook="run.yml",
            inventory=inventory, quiet=True, timeout=timeout,
            envvars={"ANSIBLE_COLLECTIONS_PATH": collections_path(), "ANSIBLE_NOCOLOR": "1"},
        )
        result: dict[str, Any] = {}
        outcome = ""
        for event in runner.events:
            if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
                outcome = event["event"]
                result = dict(event["event_data"]["res"])
        return ModuleRun(status=runner.status, result=result, event=outcome)
