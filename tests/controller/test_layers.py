"""The controller's layers (pyproject.toml, [tool.importlinter]) hold, and breaking one fails:
import-linter run on the real package, and on a copy with one deliberate upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(package_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
                          cwd=package_root, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_contracts_hold() -> None:
    result = lint(REPO / "controller")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    copy = tmp_path / "controller"
    shutil.copytree(REPO / "controller" / "egress_proxies", copy / "egress_proxies",
                    ignore=shutil.ignore_patterns("__pycache__"))
    model = copy / "egress_proxies" / "resources" / "proxy.py"
    model.write_text(model.read_text() + "\nfrom egress_proxies.sweep import reconcile  # an upward import\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "The controller's stages import downward only BROKEN" in result.stdout
    assert "egress_proxies.resources.proxy -> egress_proxies.sweep.reconcile" in result.stdout


def test_a_second_kubernetes_importer_breaks_the_edge(tmp_path: Path) -> None:
    copy = tmp_path / "controller"
    shutil.copytree(REPO / "controller" / "egress_proxies", copy / "egress_proxies",
                    ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "egress_proxies" / "loop.py"
    loop.write_text(loop.read_text() + "\nimport kubernetes  # a second edge\n")
    result = lint(copy)
    assert result.returncode != 0
    assert "Only sources.kube imports the kubernetes client BROKEN" in result.stdout
