"""metrics.py: the names the controller exports and its build info. That the running controller
exports every name the alerts and the dashboard use is in scenarios/test_operator_ux.py."""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from egress_proxies import metrics

# client-go's leader-election gauge, as controller-runtime registers it: its name, not ours.
CONTROLLER_RUNTIME_NAMES = {"leader_election_master_status"}


def declared() -> dict[str, MetricWrapperBase]:
    return {name: value for name, value in vars(metrics).items() if isinstance(value, MetricWrapperBase)}


def test_every_metric_is_the_controllers_own_or_controller_runtimes() -> None:
    names = {collector._name for collector in declared().values()}
    assert len(names) == len(declared())  # no name declared twice
    assert {n for n in names if not n.startswith("egress_proxies_")} == CONTROLLER_RUNTIME_NAMES


def test_every_declared_metric_is_registered() -> None:
    registered = {metric.name for metric in REGISTRY.collect()}
    for name, collector in declared().items():
        assert collector._name in registered, name


def test_the_build_info_names_the_python_and_ansible_core_that_run() -> None:
    labels = {"python_version": platform.python_version(),
              "ansible_core_version": importlib.metadata.version("ansible-core"),
              "version": importlib.metadata.version("egress-proxies-controller")}
    assert REGISTRY.get_sample_value("egress_proxies_build_info", labels) == 1.0


def test_an_uninstalled_distribution_is_an_unknown_version() -> None:
    assert metrics._version("no-such-distribution-egress-proxies") == "unknown"


def test_errors_and_replacements_are_labelled_by_provider_and_why() -> None:
    metrics.ERRORS.labels(provider="metrics-test", error_class="permanent").inc()
    metrics.REPLACEMENTS.labels(provider="metrics-test", reason="InstanceLost").inc(2)
    assert REGISTRY.get_sample_value("egress_proxies_errors_total",
                                     {"provider": "metrics-test", "error_class": "permanent"}) == 1.0
    assert REGISTRY.get_sample_value("egress_proxies_replacements_total",
                                     {"provider": "metrics-test", "reason": "InstanceLost"}) == 2.0
