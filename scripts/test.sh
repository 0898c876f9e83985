#!/usr/bin/env bash
# Every check the project has, in order, stopping at the first failure:
# ruff, mypy, import-linter (the controller's layers), ansible-test sanity, ansible-lint, pytest,
# then ansible-test sanity and the module tests again on the current ansible-core line
# (.venv-current: 2.21 on Python 3.13).
# Needs scripts/setup.sh first.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k cloudinit` (all checks still run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
CURRENT=$ROOT/.venv-current
for venv in "$VENV" "$CURRENT"; do
    [[ -x $venv/bin/pytest ]] || {
        echo "test.sh: $venv is not set up; run: bash scripts/setup.sh" >&2
        exit 1
    }
done
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

# The closing line CI reads: "pytest: N passed, N failed, N skipped", from pytest's JUnit XML
# (both runs: the main one and the current ansible-core line's).
count_tests() {
    python - "$junit" "$junit_current" <<'PYTHON'
import sys
import xml.etree.ElementTree as ET

suites = []
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    suites += [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
total, failed, skipped = (sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "skipped"))
failed += sum(int(s.get("errors", 0)) for s in suites)
print(f"pytest: {total - failed - skipped} passed, {failed} failed, {skipped} skipped")
PYTHON
}

junit=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit.XXXXXX.xml")
junit_current=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit-current.XXXXXX.xml")
trap 'rm -f "$junit" "$junit_current"' EXIT

step ruff ruff check --output-format=concise .
step mypy mypy
# The controller's layers: imports run downward only, one module per edge (pyproject.toml).
step imports lint-imports --no-cache --no-logo
step sanity bash scripts/sanity.sh
step ansible-lint ansible-lint --nocolor
# The slowest tests, printed on every run: the suite has a 45-minute budget on a fresh clone.
step pytest run_pytest --durations=15 "$@"

# The current ansible-core line: the same sanity run, and every test that runs the modules or
# imports module_utils, on .venv-current. The controller there is this tree too (editable), so
# the modules run through ansible-runner exactly as in the main run, on ansible-core 2.21.
# Every module test took 646 s here on 2.21 (2 cores shared): a representative subset instead,
# the unit tests, the validator module and each provider's full round trip through ansible-runner,
# plus the contract (every verb's result parsed by the controller's types).
CURRENT_TESTS=(
    tests/unit
    tests/integration/test_provider_config_info.py
    tests/integration/test_kvm_modules_testdriver.py::test_create_get_list_delete_round_trip
    tests/integration/test_k8s_modules.py::test_create_get_list_delete_round_trip
    tests/integration/test_gcp_modules.py::test_create_get_list_delete_round_trip
    tests/contract/test_module_contract.py
)
run_current_pytest() {
    PATH=$CURRENT/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$CURRENT/collections \
        "$CURRENT/bin/pytest" -p no:cacheprovider --junitxml="$junit_current" "${CURRENT_TESTS[@]}"
}
step sanity-2.21 env VENV="$CURRENT" bash scripts/sanity.sh
step modules-2.21 run_current_pytest
report
count_tests
