"""scripts/test.sh's own machinery, run for real on a small test tree of its own: pytest in two
streams side by side (scripts/pytest_streams.sh) and the closing report against the budgets
(scripts/suite_report.py)."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from support import REPO

STREAMS = REPO / "scripts" / "pytest_streams.sh"
REPORT = REPO / "scripts" / "suite_report.py"
BIN = Path(sys.executable).parent

# Each stream's first test waits until the other stream's has started: run one after the other,
# they would wait out their 60 s and fail.
RENDEZVOUS = """\
import os
import time
from pathlib import Path


def meet(mine: str, theirs: str) -> None:
    here = Path(os.environ["RENDEZVOUS"])
    (here / mine).touch()
    deadline = time.monotonic() + 60
    while not (here / theirs).exists():
        assert time.monotonic() < deadline, f"{theirs} never started beside {mine}"
        time.sleep(0.05)
"""
TREE = {
    "pytest.ini": "[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib\nmarkers =\n"
                  "    vm: real guests\n    clock: real timers\n",
    "rendezvous.py": RENDEZVOUS,
    "tests/unit/test_fast.py": "from rendezvous import meet\n\n\ndef test_one():\n    meet('main', 'side')\n\n\n"
                               "def test_two():\n    print('main stream output')\n",
    "tests/integration/test_guest.py": "import pytest\nfrom rendezvous import meet\n\npytestmark = pytest.mark.vm\n\n\n"
                                       "def test_boot():\n    meet('side', 'main')\n    print('side stream output')\n",
    "tests/controller/test_timers.py": "import os\nimport pytest\n\n\n@pytest.mark.clock\ndef test_wait():\n"
                                       "    assert not os.environ.get('FAIL_SIDE')\n",
}


@dataclass(frozen=True)
class Streams:
    status: int
    output: str
    junit: Path
    junit_side: Path


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run_streams(tree: Path, *arguments: str, **env: str) -> Streams:
    """``run_pytest`` with ``arguments`` for pytest, as scripts/test.sh calls it, in ``tree``."""
    junit, junit_side = tree / "junit.xml", tree / "junit-side.xml"
    script = f'source "{STREAMS}"; run_pytest "{junit}" "{junit_side}" "{tree}/side.log" "$@"'
    rendezvous = tree / "rendezvous"
    shutil.rmtree(rendezvous, ignore_errors=True)  # an earlier run's meeting proves nothing
    rendezvous.mkdir()
    done = subprocess.run(["bash", "-c", script, "run_pytest", *arguments], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                               "RENDEZVOUS": str(rendezvous), "PYTHONPATH": str(tree), **env}, timeout=240)
    return Streams(done.returncode, done.stdout + done.stderr, junit, junit_side)


def report(steps: str, *arguments: str | Path, cwd: Path) -> list[str]:
    (cwd / "steps").write_text(steps)
    done = subprocess.run([sys.executable, str(REPORT), "--steps", str(cwd / "steps"), *map(str, arguments)],
                          capture_output=True, text=True, check=True, cwd=cwd)
    return done.stdout.splitlines()


def test_the_two_streams_run_side_by_side_and_together_cover_every_test(tmp_path: Path) -> None:
    streams = run_streams(make_tree(tmp_path, TREE), "-s")

    assert streams.status == 0, streams.output
    main = streams.junit.read_text()
    side = streams.junit_side.read_text()
    assert 'name="test_one"' in main and 'name="test_two"' in main and "test_boot" not in main
    assert 'name="test_boot"' in side and 'name="test_wait"' in side and "test_one" not in side
    # The side stream's output comes after the main one's, whole.
    assert streams.output.index("main stream output") < streams.output.index("== pytest, the side stream") < \
        streams.output.index("side stream output")


def test_a_failure_in_either_stream_fails_the_run_and_no_test_collected_is_never_a_success(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, TREE)
    failing = run_streams(tree, "-s", FAIL_SIDE="1")
    selected = run_streams(tree, "-k", "two")  # a selection only the main stream holds
    nothing = run_streams(tree, "-k", "no_such_test")
    unmarked = make_tree(tmp_path / "unmarked", {"pytest.ini": TREE["pytest.ini"],
                                                 "tests/unit/test_plain.py": "def test_plain():\n    pass\n"})
    selected_unmarked = run_streams(unmarked, "-k", "plain")
    bare = run_streams(unmarked)

    assert failing.status == 1, failing.output
    assert selected.status == 0, selected.output
    assert nothing.status == 5, nothing.output
    assert "pytest collected no tests" in nothing.output
    assert selected_unmarked.status == 0, selected_unmarked.output
    # Without arguments, a stream with no test at all is a broken tree: the side stream's tests
    # gone (a marker dropped) must not pass unnoticed.
    assert bare.status == 5, bare.output


def test_the_report_holds_each_step_against_its_budget_and_ends_with_the_count(tmp_path: Path) -> None:
    streams = run_streams(make_tree(tmp_path, TREE), "-s")
    (tmp_path / "setup-seconds").write_text("301\n")

    lines = report("ruff\t3\tok\npytest\t1900\tok\n", "--setup", tmp_path / "setup-seconds",
                   "--junit", streams.junit, streams.junit_side, cwd=tmp_path)

    text = "\n".join(lines)
    assert lines[-1] == "pytest: 4 passed, 0 failed, 0 skipped", text
    assert [line.split()[:3] for line in lines if line.startswith(("setup ", "ruff ", "pytest "))] == [
        ["setup", "301s", "240s"], ["ruff", "3s", "15s"], ["pytest", "1900s", "1800s"]], text
    assert "WARNING: setup took 301 s, over its budget of 240 s" in lines
    assert "WARNING: pytest took 1900 s, over its budget of 1800 s" in lines
    assert not any("ruff took" in line for line in lines)
    assert {line.split()[0] for line in lines if line.startswith("tests/")} == {
        "tests/unit", "tests/integration", "tests/controller"}, text
    assert any(line.endswith("tests/integration/test_guest.py::test_boot") for line in lines), text
    assert "== failures" not in lines, text


def test_the_report_ends_with_each_failure_and_its_assertion_where_a_cut_log_keeps_them(tmp_path: Path) -> None:
    """A CI page keeps a log's head and tail: the assertion a failed test printed must be in the
    tail, after the slowest tests, not only in pytest's traceback in the middle."""
    streams = run_streams(make_tree(tmp_path, TREE), "-s", FAIL_SIDE="1")

    lines = report("pytest\t10\tFAILED (1)\n", "--junit", streams.junit, streams.junit_side, cwd=tmp_path)

    text = "\n".join(lines)
    failures = lines.index("== failures")
    assert failures > next(i for i, line in enumerate(lines) if "slowest tests" in line), text
    assert lines[failures + 1] == "FAILED tests/controller/test_timers.py::test_wait (failure)", text
    assert lines[failures + 2] == "    AssertionError: assert not '1'", text
    assert lines[-1] == "pytest: 3 passed, 1 failed, 0 skipped", text


def test_every_budget_names_a_step_test_sh_runs_and_a_directory_the_suite_has() -> None:
    budgets = runpy.run_path(str(REPORT))
    script = (REPO / "scripts" / "test.sh").read_text()
    steps = {line.split()[1] for line in script.splitlines() if line.startswith("step ")}
    side_stream = (REPO / "scripts" / "pytest_streams.sh").read_text()

    assert set(budgets["STEP_BUDGETS"]) == steps | {"setup"}
    pytest_options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    # tests/<dir>, and each other test path by its first two parts (clients/python/tests: clients/python).
    other_paths = {"/".join(path.split("/")[:2]) for path in pytest_options["testpaths"] if path != "tests"}
    assert set(budgets["DIRECTORY_BUDGETS"]) == {
        f"tests/{p.name}" for p in (REPO / "tests").iterdir() if p.is_dir() and any(p.rglob("test_*.py"))} | other_paths
    assert sum(budgets["STEP_BUDGETS"].values()) <= budgets["RUN_BUDGET"]
    # The markers the streams split on are the project's (--strict-markers refuses any other).
    assert 'SIDE_STREAM="vm or clock"' in side_stream
    assert {marker.split(":")[0] for marker in pytest_options["markers"]} == {"vm", "clock"}


OLDEST_SCRAPY_TREE = {
    "pytest.ini": "[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib\n",
    "tests/clients/test_crawl.py": "import os\nimport subprocess\n\n\ndef test_crawl():\n"
                                   "    scrapy = os.environ['EGRESS_PROXIES_TEST_SCRAPY']\n"
                                   "    version = subprocess.run([scrapy, 'version'], capture_output=True,\n"
                                   "                             text=True).stdout\n"
                                   "    assert version.startswith('Scrapy 2.13.'), version\n",
}


def run_oldest_scrapy(tree: Path, scrapy: Path, junit: Path) -> subprocess.CompletedProcess[str]:
    """``run_oldest_scrapy_pytest`` with ``scrapy``, as scripts/test.sh's clients-scrapy-2.13 step calls it."""
    script = f'source "{STREAMS}"; run_oldest_scrapy_pytest "{scrapy}" "{junit}" tests/clients'
    return subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})


def test_the_oldest_scrapy_step_runs_the_crawls_on_it_and_fails_without_it(tmp_path: Path) -> None:
    """The step's tests see .venv-scrapy-2.13's Scrapy (scripts/setup.sh makes it); no such venv, or
    one of another line (.venv's newest Scrapy), fails the step before pytest, never skips."""
    tree = make_tree(tmp_path, OLDEST_SCRAPY_TREE)
    junit, missing_junit, newest_junit = tmp_path / "junit.xml", tmp_path / "missing.xml", tmp_path / "newest.xml"

    oldest = run_oldest_scrapy(tree, REPO / ".venv-scrapy-2.13" / "bin" / "scrapy", junit)
    missing = run_oldest_scrapy(tree, tmp_path / "no-venv" / "bin" / "scrapy", missing_junit)
    newest = run_oldest_scrapy(tree, BIN / "scrapy", newest_junit)

    assert oldest.returncode == 0, oldest.stdout + oldest.stderr
    assert 'name="test_crawl"' in junit.read_text()
    assert missing.returncode == 1 and not missing_junit.exists(), missing.stdout
    assert f"no Scrapy 2.13 at {tmp_path}/no-venv/bin/scrapy; run: bash scripts/setup.sh" in missing.stderr
    assert newest.returncode == 1 and not newest_junit.exists(), newest.stdout
    assert "is Scrapy 2.19.0, not Scrapy 2.13; run: bash scripts/setup.sh" in newest.stderr
    # Its tests are counted in the closing line, its time is its step's, not tests/clients'.
    lines = report("clients-scrapy-2.13\t30\tok\n", "--junit-apart", junit, cwd=tmp_path)
    assert lines[-1] == "pytest: 1 passed, 0 failed, 0 skipped", lines
    assert not any(line.startswith("tests/clients") for line in lines), lines
    assert any(line.split()[:3] == ["clients-scrapy-2.13", "30s", "45s"] for line in lines), lines
