#!/usr/bin/env bash
# Every check the project has, in order, stopping at the first failure:
# ruff, mypy, ansible-test sanity, ansible-lint, pytest. Needs scripts/setup.sh first.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k cloudinit` (all checks still run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
[[ -x $VENV/bin/pytest ]] || {
    echo "test.sh: $VENV is not set up; run: bash scripts/setup.sh" >&2
    exit 1
}
cd "$ROOT"
# ansible-lint warns unless the venv's bin is on PATH; Ansible finds this collection via the
# link scripts/setup.sh made.
export PATH=$VENV/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$VENV/collections
export NO_COLOR=1 PY_COLORS=0

summary=()
report() {
    local line
    echo
    echo "== timing"
    for line in "${summary[@]}"; do
        echo "$line"
    done
}

# step NAME COMMAND...: run one check, time it, stop everything when it fails.
step() {
    local name=$1 start status=0
    shift
    echo
    echo "== $name: $*"
    start=$SECONDS
    "$@" || status=$?
    summary+=("$(printf '%-12s %4ds  %s' "$name" $((SECONDS - start)) "$([[ $status == 0 ]] && echo ok || echo "FAILED ($status)")")")
    if [[ $status != 0 ]]; then
        report
        echo "test.sh: $name failed" >&2
        exit "$status"
    fi
}

# pytest's exit code 5 means no test was collected: a broken test tree, never a success.
run_pytest() {
    local status=0
    pytest --junitxml="$junit" "$@" || status=$?
    if [[ $status == 5 ]]; then
        echo "test.sh: pytest collected no tests; a test run must run tests" >&2
    fi
    return "$status"
}

# The closing line CI reads: "pytest: N passed, N failed, N skipped", from pytest's JUnit XML.
count_tests() {
    python - "$junit" <<'PYTHON'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
total, failed, skipped = (sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "skipped"))
failed += sum(int(s.get("errors", 0)) for s in suites)
print(f"pytest: {total - failed - skipped} passed, {failed} failed, {skipped} skipped")
PYTHON
}

junit=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit.XXXXXX.xml")
trap 'rm -f "$junit"' EXIT

step ruff ruff check --output-format=concise .
step mypy mypy
step sanity bash scripts/sanity.sh
step ansible-lint ansible-lint --nocolor
step pytest run_pytest "$@"
report
count_tests
