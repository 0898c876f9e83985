"""Prometheus metrics (names and meanings are listed in docs/operations.md).

Where controller-runtime (the library most Kubernetes controllers are built on) exports the same
quantity, the name follows it, so dashboards and alerts written for other controllers apply:
``leader_election_master_status`` is client-go's leader-election gauge as controller-runtime
registers it, ``egress_proxies_active_runners`` mirrors ``controller_runtime_active_workers``.
The rest are this controller's own, under ``egress_proxies_``.
"""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import Counter, Gauge, Histogram, Info

SWEEP_SECONDS = Histogram(
    "egress_proxies_sweep_duration_seconds", "Wall time of one sweep over every provider",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600))
SWEEPS = Counter("egress_proxies_sweeps_total", "Sweeps by result (ok, failed)", ["result"])
RUNNER_CALLS = Counter(
    "egress_proxies_runner_calls_total", "ansible-runner invocations by provider and verb", ["provider", "verb"])
RUNNER_SECONDS = Histogram(
    "egress_proxies_runner_duration_seconds", "Wall time of one ansible-runner invocation", ["provider", "verb"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
PROXIES = Gauge("egress_proxies_proxies", "Proxies by status phase", ["phase"])
# provider is the Proxy's provider name ("" when a Proxy names none); error_class the contract's class.
ERRORS = Counter("egress_proxies_errors_total", "Provider operation failures by provider and error class",
                 ["provider", "error_class"])
GC_DELETIONS = Counter(
    "egress_proxies_gc_deletions_total", "Orphaned instances garbage-collected (dry_run: reported only)",
    ["provider", "dry_run"])
PROBES = Counter("egress_proxies_probes_total", "Probes through proxies by provider and outcome reason",
                 ["provider", "reason"])
PROBE_SECONDS = Histogram(
    "egress_proxies_probe_duration_seconds", "Latency of a serving probe through a proxy (all its checks)",
    ["provider"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
REPLACEMENTS = Counter("egress_proxies_replacements_total",
                       "Instances replaced because they stopped or did not serve, by provider and reason",
                       ["provider", "reason"])
SERVING = Gauge("egress_proxies_proxies_serving", "Proxies by Serving condition (True, False, Unknown)",
                ["serving"])
# 1 while this replica holds the leader Lease (always 1 without leader election), 0 while it waits.
# Same name, label and meaning as client-go's gauge in controller-runtime: name is the Lease's name.
LEADER = Gauge("leader_election_master_status",
               "1 when this replica is the leader of the named election, 0 when it is a standby", ["name"])
# ansible-runner processes running now (runs waiting for a slot are not counted), and the limit.
ACTIVE_RUNNERS = Gauge("egress_proxies_active_runners", "ansible-runner processes running now")
MAX_RUNNERS = Gauge("egress_proxies_max_concurrent_runners", "The most ansible-runner processes run at once")
# Unix time of the end of the last sweep in which nothing failed: `time() - this` is how stale
# the Proxies' status may be, whatever the sweep counters say.
LAST_SUCCESSFUL_SWEEP = Gauge("egress_proxies_last_successful_sweep_timestamp_seconds",
                              "Unix time the last successful sweep finished")
# egress_proxies_build_info{version, python_version, ansible_core_version} 1: what is running.
BUILD = Info("egress_proxies_build", "The controller's version, its Python and the ansible-core it runs modules with")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


BUILD.info({"version": _version("egress-proxies-controller"), "python_version": platform.python_version(),
            "ansible_core_version": _version("ansible-core")})
# Pools (docs/contract.md, "ProxyPool"): what each pool asks for and how many of its members serve.
POOL_DESIRED = Gauge("egress_proxies_pool_desired_replicas", "spec.replicas of each ProxyPool", ["namespace", "pool"])
POOL_READY = Gauge("egress_proxies_pool_ready_replicas", "Serving (Ready, not quarantined) members of each ProxyPool",
                   ["namespace", "pool"])
# By namespace, never by token: a token is a secret's stand-in and its name says who, not what.
QUARANTINES = Counter("egress_proxies_quarantines_total", "Proxies quarantined by crawlers, by the Proxy's namespace",
                      ["namespace"])
# Locations (a KVM host, a GCP zone, a Kubernetes namespace): this controller's instances on each, and
# the state of a location taken out of placement (sweep/locations.py): "is the host drained?".
LOCATION_INSTANCES = Gauge("egress_proxies_location_instances",
                           "This controller's instances per provider and location (last complete listing)",
                           ["provider", "location"])
LOCATION_STATE = Gauge("egress_proxies_location_state",
                       "1 for the state of a location out of placement (cordoned, draining, drained), 0 for the others",
                       ["provider", "location", "state"])
