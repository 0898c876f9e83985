"""controller/manifests/monitoring: the alerting rules, checked and unit-tested by Prometheus's own
promtool (Debian's `prometheus` package, installed by scripts/setup.sh), and the component's shape.
That every metric the rules and the dashboard use is one the controller exports is checked
against a running controller in tests/controller/scenarios/test_operator_ux.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
MONITORING = REPO / "controller" / "manifests" / "monitoring"
PROMTOOL = "/usr/bin/promtool"


def rules_file(tmp_path: Path) -> Path:
    """The PrometheusRule's spec is a Prometheus rules file (groups: ...), as the Operator mounts it."""
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    path = rules_file(tmp_path)
    count = sum(len(group["rules"]) for group in yaml.safe_load(path.read_text())["groups"])

    done = promtool("check", "rules", path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_of_the_alerts_pass(tmp_path: Path) -> None:
    rules_file(tmp_path)
    shutil.copy(Path(__file__).with_name("monitoring_rules_test.yml"), tmp_path / "rules_test.yml")

    done = promtool("test", "rules", tmp_path / "rules_test.yml")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests see the rules: with one threshold changed, promtool reports the alert that no longer fires."""
    path = rules_file(tmp_path)
    path.write_text(path.read_text().replace("> 900", "> 9000"))
    shutil.copy(Path(__file__).with_name("monitoring_rules_test.yml"), tmp_path / "rules_test.yml")

    done = promtool("test", "rules", tmp_path / "rules_test.yml")

    assert done.returncode != 0
    assert "EgressProxiesStatusStale" in done.stdout + done.stderr


def test_the_component_lists_its_files_and_selects_the_metrics_service() -> None:
    component = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    (generator,) = component["configMapGenerator"]
    listed = set(component["resources"]) | set(generator["files"])
    assert listed == {path.name for path in MONITORING.iterdir()} - {"kustomization.yaml"}

    service = yaml.safe_load((REPO / "controller" / "manifests" / "service-metrics.yaml").read_text())
    monitor: dict[str, Any] = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == [
        port["name"] for port in service["spec"]["ports"]]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert all(target["expr"] for panel in dashboard["panels"] for target in panel["targets"])


def test_the_documented_scrape_config_is_valid_and_keeps_the_metrics_service(tmp_path: Path) -> None:
    """docs/operations.md's scrape config for a Prometheus without the Operator: promtool accepts it
    (with the rules file it names; its discovery aside, below), and its keep rule matches the shipped
    metrics Service and port."""
    text = (REPO / "docs" / "operations.md").read_text()
    found = re.search(r"```yaml\n(# prometheus\.yml:.*?)```", text, re.S)
    assert found is not None, "docs/operations.md: the prometheus.yml example is gone"
    config = yaml.safe_load(found.group(1))
    (job,) = config["scrape_configs"]
    (rules,) = config["rule_files"]
    # Debian's promtool is built without the Kubernetes service discovery: the rest of the job
    # (its relabelling, the rules file) is checked with a static target in its place.
    checked = {**job, "static_configs": [{"targets": ["10.0.0.1:9090"]}]}
    del checked["kubernetes_sd_configs"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({**config, "scrape_configs": [checked]}))
    rules_file(tmp_path).rename(tmp_path / rules)

    done = promtool("check", "config", tmp_path / "prometheus.yml")

    assert done.returncode == 0, done.stdout + done.stderr
    service = yaml.safe_load((REPO / "controller" / "manifests" / "service-metrics.yaml").read_text())
    keep = next(rule for rule in job["relabel_configs"] if rule.get("action") == "keep")
    (port,) = service["spec"]["ports"]
    assert re.fullmatch(keep["regex"], f"{service['metadata']['name']};{port['name']}")
    assert job["kubernetes_sd_configs"] == [{"role": "endpoints",
                                             "namespaces": {"names": [service["metadata"]["namespace"]]}}]
