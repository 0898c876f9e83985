# shellcheck shell=bash
# Sourced by scripts/test.sh (and tests/packaging/test_suite_script.py): pytest's runs.
#
# run_pytest JUNIT JUNIT_SIDE SIDE_LOG ARGS... runs pytest in two streams side by side, each its
# own pytest run (its own TMPDIR, tests/conftest.py), and returns their exit codes as one: the
# tests marked `vm` or `clock` in one (real guests under software emulation keep one core busy;
# tests waiting out real timers barely use the other), everything else in the other, on the
# second core. Serially the suite took 2,802 s, over the 45-minute budget with setup and the
# checks. JUNIT and JUNIT_SIDE are the streams' JUnit XML files; SIDE_LOG is where the side
# stream's output waits, to be shown when both have ended, so the two never interleave. The side
# stream's pytest starts with SIGINT at its default (a background job of a script starts with it
# ignored), so Ctrl-C stops both streams and their fixtures' teardown runs.
SIDE_STREAM="vm or clock"
run_pytest() {
    local junit=$1 junit_side=$2 side_log=$3 status=0 side_status=0 side_pid
    shift 3
    env --default-signal=INT pytest --junitxml="$junit_side" --durations=15 -m "$SIDE_STREAM" "$@" \
        >"$side_log" 2>&1 &
    side_pid=$!
    pytest --junitxml="$junit" --durations=15 -m "not ($SIDE_STREAM)" "$@" || status=$?
    wait "$side_pid" || side_status=$?
    echo
    echo "== pytest, the side stream (-m '$SIDE_STREAM'), run beside the above"
    cat "$side_log"
    collected_something "$status" "$side_status" $#
}

# run_oldest_scrapy_pytest SCRAPY JUNIT ARGS... runs pytest on ARGS (the crawl tests) with every
# crawl's `scrapy runspider` on SCRAPY (tests/support/crawl.py reads EGRESS_PROXIES_TEST_SCRAPY),
# the oldest Scrapy line's command in .venv-scrapy-2.13. SCRAPY is checked first: a missing venv,
# or one holding another line, fails the step, since the crawls would otherwise run on .venv's
# Scrapy or not at all and the oldest line would pass untested.
SCRAPY_OLDEST_LINE=2.13
run_oldest_scrapy_pytest() {
    local scrapy=$1 junit=$2 version
    shift 2
    version=$("$scrapy" version 2>/dev/null) || {
        echo "test.sh: no Scrapy $SCRAPY_OLDEST_LINE at $scrapy; run: bash scripts/setup.sh" >&2
        return 1
    }
    if [[ $version != "Scrapy $SCRAPY_OLDEST_LINE."* ]]; then
        echo "test.sh: $scrapy is $version, not Scrapy $SCRAPY_OLDEST_LINE; run: bash scripts/setup.sh" >&2
        return 1
    fi
    EGRESS_PROXIES_TEST_SCRAPY=$scrapy pytest --junitxml="$junit" --durations=5 "$@"
}

# Both streams' exit codes as one. pytest's exit code 5 means no test was collected: a broken
# test tree, never a success. With no arguments each stream must run tests; with a selection
# (`-k cloudinit`, a path) one stream may hold none of it, but the run as a whole must run some.
collected_something() {
    local status=$1 side_status=$2 arguments=$3
    local nothing=0
    if [[ $status == 5 && $side_status == 5 ]]; then
        nothing=1
    elif ((arguments == 0)) && [[ $status == 5 || $side_status == 5 ]]; then
        nothing=1
    fi
    if ((nothing)); then
        echo "test.sh: pytest collected no tests (exit codes: $status, side stream $side_status); a test run must run tests" >&2
        return 5
    fi
    [[ $status == 5 ]] && status=0
    [[ $side_status == 5 ]] && side_status=0
    ((status != 0)) && return "$status"
    return "$side_status"
}
