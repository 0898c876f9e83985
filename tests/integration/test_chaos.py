"""The chaos run of bench/chaos_bench.py at 100 Proxies: the real ``egress-proxies`` process
against the Kubernetes API emulator and two test-driver libvirtds, with 5 % of API requests
failed (500/409), module runs cut at the libvirt connection, malformed Proxies, Proxies created
and deleted throughout and three SIGKILLs of the controller. Afterwards nothing may be missing,
doubled, leaked or wedged, and the fleet must settle within a bound.

Between three restarts a fleet of 100 makes only a handful of module runs in the 60 s of chaos
(a batch create is one run for up to 50 instances; measured: 2-16 libvirt connections, fewer the
higher the machine's load), so 5 % would cut none: here half the module runs are cut (29 % of the
connections), and the bench keeps the faults on until at least one connection was cut.

The 1,000-Proxy run and its figures: docs/performance.md, "Chaos".
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import chaos_bench  # noqa: E402

# It was opt-in for a while: most runs stopped with many Proxies lacking an instance and nothing
# being created. Two causes, both backoff counted against each Proxy for its provider's failure:
# create batches failing together (now the provider's backoff, 30 s cap) and failed listings (the
# report's not-Ready breakdown showed 50 of 100 Proxies "ListFailed"; a listing now backs off
# nothing). After both fixes: converged 8.2 s after the last fault (seed 7, load ~2).
# Measured 2026-12-03 on the 2 shared cores (load average 5-15): converged 25-67 s after the
# last fault (the sweep in flight ends, then creates cut mid-run are retried after their backoff,
# orphans go after the 5 s GC grace); the whole test takes 75-135 s. The bound leaves room for a
# loaded machine and still fails a controller that never settles.
CONVERGE_BOUND_SECONDS = 120.0


def test_chaos_run_of_100_proxies_loses_doubles_leaks_and_wedges_nothing() -> None:
    fleet = chaos_bench.chaos(["--proxies", "100", "--seed", "7", "--chaos-seconds", "60",
                               "--module-fault-rate", "0.5", "--converge-timeout", str(CONVERGE_BOUND_SECONDS)])
    chaos_bench.report(fleet)  # shown with -s, and in the failure output

    # The chaos happened (a run without faults would prove nothing).
    assert len(fleet.kills) == 3
    assert sum(fleet.api_injected.values()) > 0
    assert fleet.relay_cut > 0
    assert fleet.created > 0 and fleet.deleted > 0

    assert fleet.counts == {
        "live Proxies without their instance": 0,
        "duplicate instances": 0,
        "leaked instances (owned, no Proxy)": 0,
        "wedged finalizers": 0,
    }
    assert fleet.converge_seconds is not None, f"not converged within {CONVERGE_BOUND_SECONDS:.0f} s"
    assert fleet.ready == fleet.live
    # Each malformed Proxy failed alone, with no instance (a leak count of 0 covers that).
    assert fleet.malformed_failed == len(fleet.malformed) == 3
