"""The closing report of scripts/test.sh: each step's time against its budget, pytest's time per
test directory and its slowest tests (from the JUnit XML of every pytest run), a WARNING line for
each budget passed, and last the line CI reads: ``pytest: N passed, N failed, N skipped``.

    python scripts/suite_report.py --steps FILE [--setup FILE] [--junit FILE ...] [--junit-apart FILE ...]

``--steps``: one line per step run, ``NAME<TAB>SECONDS<TAB>RESULT``. ``--setup``: the seconds
scripts/setup.sh's last run took (it writes them there); its modification time says when.
``--junit``: the main pytest run's JUnit XML files (one per stream), ``--junit-apart``: the runs
timed as steps of their own (the oldest Scrapy line's crawls, the current ansible-core line's
tests): counted in the closing line, not in the directory table; without any, no count line is
printed (no test ran).

The budgets are for a quiet 2-core machine, the whole run (setup included) within 45 minutes.
The per-directory budgets are on the sum of that directory's test times (setup and teardown
included): pytest runs in two streams side by side (scripts/test.sh), so a directory has no wall
time of its own.
"""

from __future__ import annotations

import argparse
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

RUN_BUDGET = 45 * 60
# Seconds. Setup: 145 s measured on a fresh clone (pip from a warm cache), and .venv-scrapy-2.13
# since: 17 s more (load 3.5); the static checks 78 s
# together; pytest's wall time with its two streams; the crawl tests again on Scrapy 2.13 (36-40 s
# measured, load 3-3.4 on 2 cores shared); the 2.21 steps after it.
STEP_BUDGETS = {
    "setup": 240,
    "ruff": 15,
    "mypy": 60,
    "imports": 15,
    "sanity": 90,
    "ansible-lint": 60,
    "pytest": 1800,
    "clients-scrapy-2.13": 45,
    "sanity-2.21": 120,
    "modules-2.21": 240,
}
# Seconds of test time per directory of tests/ (both streams; the 2.21 run's tests count apart,
# in its step). integration holds the real guests (molecule on a VM, the real-guest end-to-end
# test, the demo: about 900 s together).
DIRECTORY_BUDGETS = {
    "tests/unit": 120,
    "tests/contract": 120,
    # Measured (2 cores shared): 113 s at load 4 falling to 2.8, about the suite's own two streams;
    # 145 s at load 7.5 to 4.3. test_scrapy_crawl.py's one controller-managed crawl is 61-88 s of it.
    "tests/clients": 130,
    "tests/controller": 1200,
    "tests/integration": 1500,
    "tests/packaging": 360,
    "clients/python": 30,  # the crawler client's own unit tests (testpaths)
}
SLOWEST = 15
# A failure's ``E`` lines kept in the closing report, each cut to this many characters.
FAILURE_LINES = 12
FAILURE_LINE = 400


@dataclass(frozen=True)
class TestTime:
    name: str
    """``tests/<dir>/<file>.py::<test>``, as pytest names it."""
    seconds: float

    @property
    def directory(self) -> str:
        return "/".join(self.name.split("/")[:2])


@dataclass
class Counts:
    total: int = 0
    failed: int = 0
    skipped: int = 0

    def line(self) -> str:
        return f"pytest: {self.total - self.failed - self.skipped} passed, {self.failed} failed, {self.skipped} skipped"


def suites(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def count(paths: list[Path]) -> Counts:
    counts = Counts()
    for suite in (s for path in paths for s in suites(path)):
        counts.total += int(suite.get("tests", 0))
        counts.failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        counts.skipped += int(suite.get("skipped", 0))
    return counts


def case_name(case: ET.Element) -> str:
    """The test's name from the JUnit classname (``tests.unit.test_x`` or, for a test in a class,
    ``tests.unit.test_x.TestY``), the file being the first ``test_*`` part."""
    parts = case.get("classname", "").split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[:module + 1]) + ".py::" + "::".join([*parts[module + 1:], case.get("name", "")])


def case_times(path: Path) -> list[TestTime]:
    """Each test case's time."""
    return [TestTime(case_name(c), float(c.get("time", 0))) for suite in suites(path) for c in suite.iter("testcase")]


def failure_lines(paths: list[Path]) -> list[str]:
    """Each failed test's name and why, last thing before the count: a CI page that keeps only a
    log's head and tail cuts pytest's traceback in the middle, where the assertion's message is.
    Why: pytest's ``E`` lines of the failure (the assertion with its values), else its message."""
    lines = []
    for case in (c for path in paths for suite in suites(path) for c in suite.iter("testcase")):
        for failure in (f for f in case if f.tag in ("failure", "error")):
            told = [line[1:].strip() for line in (failure.text or "").splitlines() if line.startswith("E ")]
            why = told or (failure.get("message") or "").splitlines() or ["(no message)"]
            lines.append(f"FAILED {case_name(case)} ({failure.tag})")
            lines += [f"    {line[:FAILURE_LINE]}" for line in why[:FAILURE_LINES]]
    return ["", "== failures", *lines] if lines else []


def over(name: str, seconds: float, budget: int | None) -> str:
    """The WARNING line when ``seconds`` passed the budget, else nothing."""
    if budget is None or seconds <= budget:
        return ""
    return f"WARNING: {name} took {seconds:.0f} s, over its budget of {budget} s"


def read_steps(path: Path) -> list[tuple[str, int, str]]:
    steps = []
    for line in path.read_text().splitlines():
        name, seconds, result = line.split("\t", 2)
        steps.append((name, int(seconds), result))
    return steps


def setup_step(path: Path | None) -> list[tuple[str, int, str]]:
    if path is None or not path.is_file():
        return []
    ran = time.strftime("%H:%M", time.localtime(path.stat().st_mtime))
    return [("setup", int(path.read_text().strip()), f"ok (scripts/setup.sh's last run, ended {ran})")]


def budget_text(budget: int | None) -> str:
    return "-" if budget is None else f"{budget}s"


def step_table(steps: list[tuple[str, int, str]]) -> tuple[list[str], list[str]]:
    """The steps' lines and their warnings (the whole run's too)."""
    lines = ["== timing (budgets: a quiet 2-core machine, the whole run within 45 min)",
             f"{'step':<18} {'time':>6} {'budget':>7}  result"]
    warnings = []
    for name, seconds, result in steps:
        budget = STEP_BUDGETS.get(name)
        lines.append(f"{name:<18} {seconds:>5}s {budget_text(budget):>7}  {result}")
        warnings.append(over(name, seconds, budget))
    total = sum(seconds for _, seconds, _ in steps)
    lines.append(f"{'total':<18} {total:>5}s {budget_text(RUN_BUDGET):>7}")
    warnings.append(over("the whole run", total, RUN_BUDGET))
    return lines, warnings


def pytest_tables(times: list[TestTime]) -> tuple[list[str], list[str]]:
    """Each directory's test time and the slowest tests' lines, and the directories' warnings."""
    per_directory: dict[str, float] = defaultdict(float)
    for test in times:
        per_directory[test.directory] += test.seconds
    lines = ["", "== pytest: test time per directory (both streams)"]
    warnings = []
    for directory, seconds in sorted(per_directory.items()):
        budget = DIRECTORY_BUDGETS.get(directory)
        lines.append(f"{directory:<18} {seconds:>5.0f}s {budget_text(budget):>7}")
        warnings.append(over(directory, seconds, budget))
    lines += ["", f"== pytest: the {SLOWEST} slowest tests (both streams)"]
    lines += [f"{t.seconds:>7.1f}s  {t.name}" for t in sorted(times, key=lambda t: -t.seconds)[:SLOWEST]]
    return lines, warnings


def report(steps: list[tuple[str, int, str]], junits: list[Path], apart: list[Path]) -> list[str]:
    """Lines: the step table, the directory table, the slowest tests, each failure's why, the
    warnings, the count."""
    lines, warnings = step_table(steps)
    times = [t for path in junits for t in case_times(path)]
    if times:
        more_lines, more_warnings = pytest_tables(times)
        lines += more_lines
        warnings += more_warnings
    lines += failure_lines(junits + apart)
    lines += [w for w in warnings if w]
    if junits or apart:
        lines.append(count(junits + apart).line())
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=Path, required=True)
    parser.add_argument("--setup", type=Path)
    parser.add_argument("--junit", type=Path, nargs="*", default=[],
                        help="the main pytest run's (its directories and slowest tests are reported)")
    parser.add_argument("--junit-apart", type=Path, nargs="*", default=[],
                        help="the runs timed as steps of their own (counted in the closing line too)")
    args = parser.parse_args()
    written = [[p for p in paths if p.is_file() and p.stat().st_size] for paths in (args.junit, args.junit_apart)]
    lines = report(setup_step(args.setup) + read_steps(args.steps), *written)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
