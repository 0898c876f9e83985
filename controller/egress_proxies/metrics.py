"""Prometheus metrics (names and meanings are listed in docs/operations.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
ERRORS = Counter("egress_proxies_errors_total", "Provider operation failures by error class", ["error_class"])
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
