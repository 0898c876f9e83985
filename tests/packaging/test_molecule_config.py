"""Molecule's view of extensions/molecule, without running a scenario's hosts.

Molecule (25.x and later) looks up a scenario named ``default`` before every run, to decide
whether scenarios share state; when there is none it logs ``CRITICAL '.../default/molecule.yml'
glob failed`` and carries on, which reads like a failure on every run. extensions/molecule/default
is the do-nothing scenario that keeps that line away. ``molecule syntax`` goes through the same
lookup as ``molecule test`` (molecule/command/base.py) and only needs ansible-playbook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO
from support.collection.modules import collections_path

pytestmark = pytest.mark.timeout(180)

MOLECULE = Path(sys.executable).parent / "molecule"


def molecule(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    collections = os.pathsep.join(str(Path(path).resolve()) for path in collections_path().split(os.pathsep))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections, "NO_COLOR": "1", "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{MOLECULE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule")}
    return subprocess.run([str(MOLECULE), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=150, check=False)


@pytest.mark.parametrize("scenario", ["kvm_hypervisor", "kvm_hypervisor_vm"])
def test_a_scenario_runs_without_the_default_scenario_critical_line(scenario: str, tmp_path: Path) -> None:
    run = molecule("syntax", "--scenario-name", scenario, tmp_path=tmp_path)
    output = run.stdout + run.stderr

    assert run.returncode == 0, output
    assert f"[{scenario} > syntax] Executing" in output, output  # the scenario itself ran
    assert "CRITICAL" not in output, output
    assert "default scenario not found" not in output, output


def test_the_default_scenario_does_nothing(tmp_path: Path) -> None:
    """`molecule test` with no -s runs it: it must succeed without creating anything."""
    run = molecule("test", tmp_path=tmp_path)
    output = run.stdout + run.stderr

    assert run.returncode == 0, output
    assert "CRITICAL" not in output and "Executing" not in output, output
