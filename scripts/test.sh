#!/usr/bin/env bash
# Every check the project has, in order, stopping at the first failure:
# ruff, mypy, import-linter (the controller's layers), ansible-test sanity, ansible-lint, pytest,
# the crawler client's Scrapy crawls again on the oldest Scrapy line it supports (.venv-scrapy-2.13),
# then ansible-test sanity and the module tests again on the current ansible-core line
# (.venv-current: 2.21 on Python 3.13).
# Needs scripts/setup.sh first. Ends with every step's time against its budget (setup's, as
# scripts/setup.sh recorded it, too), pytest's time per test directory, its slowest tests, a
# WARNING line for each budget passed (scripts/suite_report.py), and last the line CI reads:
# "pytest: N passed, N failed, N skipped".
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k cloudinit` (all checks still run);
# -m is taken: it splits pytest into its two streams (run_pytest below).
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

# Each step's time goes to $steps (scripts/suite_report.py prints them against their budgets).
report() {
    local junits=() apart=()
    [[ -s $junit ]] && junits+=("$junit")
    [[ -s $junit_side ]] && junits+=("$junit_side")
    [[ -s $junit_scrapy ]] && apart+=("$junit_scrapy")
    [[ -s $junit_current ]] && apart+=("$junit_current")
    echo
    "$VENV/bin/python" scripts/suite_report.py --steps "$steps" --setup "$VENV/.setup-seconds" \
        --junit "${junits[@]}" --junit-apart "${apart[@]}"
}

# step NAME COMMAND...: run one check, time it, stop everything when it fails.
step() {
    local name=$1 start status=0
    shift
    echo
    echo "== $name: $*"
    start=$SECONDS
    "$@" || status=$?
    printf '%s\t%s\t%s\n' "$name" $((SECONDS - start)) "$([[ $status == 0 ]] && echo ok || echo "FAILED ($status)")" >>"$steps"
    if [[ $status != 0 ]]; then
        report
        echo "test.sh: $name failed" >&2
        exit "$status"
    fi
}

# run_pytest: pytest in its two streams side by side; run_oldest_scrapy_pytest: the crawls on Scrapy 2.13.
# shellcheck source=scripts/pytest_streams.sh
source "$ROOT/scripts/pytest_streams.sh"

junit=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit.XXXXXX.xml")
junit_side=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit-side.XXXXXX.xml")
junit_scrapy=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit-scrapy.XXXXXX.xml")
junit_current=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-junit-current.XXXXXX.xml")
side_log=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-side-stream.XXXXXX.log")
steps=$(mktemp "${TMPDIR:-/tmp}/egress-proxies-steps.XXXXXX")
trap 'rm -f "$junit" "$junit_side" "$junit_scrapy" "$junit_current" "$side_log" "$steps"' EXIT

step ruff ruff check --output-format=concise .
step mypy mypy
# The controller's layers: imports run downward only, one module per edge (pyproject.toml).
step imports lint-imports --no-cache --no-logo
step sanity bash scripts/sanity.sh
step ansible-lint ansible-lint --nocolor
# The slowest tests, printed on every run (each stream's, and both together in the report): the
# whole run has a 45-minute budget on a fresh clone.
step pytest run_pytest "$junit" "$junit_side" "$side_log" "$@"

# The oldest Scrapy line the crawler client supports (2.13; .venv-scrapy-2.13 holds it and the
# client): the middleware and scenario crawls again, each `scrapy runspider` on that Scrapy
# (tests/support/crawl.py), pytest and the squids as above. Not test_scrapy_crawl.py: 90 s of the
# controller managing the proxies, through the same middleware calls these tests make. Without
# that venv the step fails: a supported line left untested is no pass.
step clients-scrapy-2.13 run_oldest_scrapy_pytest "$ROOT/.venv-scrapy-2.13/bin/scrapy" "$junit_scrapy" \
    tests/clients/test_scrapy_middleware.py tests/clients/test_scrapy_scenarios.py

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
