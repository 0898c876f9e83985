"""What an operator sees of a running controller: its log lines and its /metrics.

The real ``egress-proxies`` command (directory source, ``--log-format json``) with the real
ansible-runner and KVM modules against libvirt's test driver served by a libvirtd. One Proxy is
served by the configured provider ``lab``; one names a provider the config does not have, which
is a permanent error that must show in the log with its Proxy and provider as fields, and in
``egress_proxies_errors_total`` with its provider as a label. The same live /metrics page is what
the monitoring files (controller/manifests/monitoring/) are checked against.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import waiting
from support.collection.modules import collections_path
from support.collection.provider_config import kvm_host, make_base_image, write_kvm_config
from support.hosts.libvirt_daemon import LibvirtTestDaemon

pytestmark = pytest.mark.timeout(300)

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")
REPO = Path(__file__).resolve().parents[3]
MONITORING = REPO / "controller" / "manifests" / "monitoring"
TEST_DRIVER_POOL = "default-pool"


@dataclass
class LiveController:
    process: subprocess.Popen[str]
    proxies: Path
    port: int = 0
    metrics_port: int = 0
    lines: list[str] = field(default_factory=list)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]


def wait_for(condition: Callable[[], bool], seconds: float, what: str, controller: LiveController) -> None:
    """``support.waiting.wait_for``, failing at once when the controller exits, with its log."""
    def log() -> str:
        return "log:\n" + "\n".join(controller.lines[-40:])

    waiting.wait_for(condition, seconds, what, 0.2, log, process=controller.process)


def write_proxy(directory: Path, name: str, provider: str) -> None:
    (directory / f"{name}.yaml").write_text(yaml.safe_dump({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawlers"},
        "spec": {"provider": provider, "cloudInit": "#cloud-config\n"}}))


def phase(directory: Path, name: str) -> str | None:
    try:
        state = yaml.safe_load((directory / f"{name}.status.yaml").read_text())
    except FileNotFoundError:
        return None
    return ((state or {}).get("status") or {}).get("phase")


@pytest.fixture(scope="module")
def live_controller(libvirt_test_daemon: LibvirtTestDaemon,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveController]:
    libvirt_test_daemon.reset()
    base = tmp_path_factory.mktemp("operator-ux")
    config = write_kvm_config(base / "providers.yaml",
                              [kvm_host("h1", libvirt_test_daemon.uri, pool=TEST_DRIVER_POOL)],
                              make_base_image(base))
    proxies = base / "proxies"
    proxies.mkdir()
    write_proxy(proxies, "served", "lab")
    write_proxy(proxies, "misnamed", "nowhere")
    process = subprocess.Popen(
        [EGRESS_PROXIES, "--source", "directory", "--proxy-dir", str(proxies), "--provider-config", str(config),
         "--work-dir", str(base / "work"), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--interval", "2", "--log-format", "json"],
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": collections_path()}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    controller = LiveController(process, proxies)
    assert process.stderr is not None
    stderr = process.stderr
    reader = threading.Thread(target=lambda: controller.lines.extend(line.rstrip("\n") for line in stderr),
                              daemon=True)
    reader.start()
    try:
        def serving() -> bool:
            for line in list(controller.lines):
                if found := re.search(r"serving health and discovery on 127\.0\.0\.1:(\d+)", line):
                    controller.port = int(found.group(1))
                if found := re.search(r"serving metrics on 127\.0\.0\.1:(\d+)", line):
                    controller.metrics_port = int(found.group(1))
            return controller.port != 0 and controller.metrics_port != 0
        wait_for(serving, 60, "the HTTP server", controller)
        wait_for(lambda: phase(proxies, "served") == "Ready" and phase(proxies, "misnamed") == "Failed", 180,
                 "one Proxy Ready, one Failed", controller)
        # Two full sweeps after that, so every per-sweep gauge has been written at least once.
        ok_sweeps = _sample(controller.metrics(), 'egress_proxies_sweeps_total{result="ok"}')
        wait_for(lambda: _sample(controller.metrics(), 'egress_proxies_sweeps_total{result="ok"}') >= ok_sweeps + 2,
                 60, "two more successful sweeps", controller)
        yield controller
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        reader.join(timeout=10)
        stderr.close()


def _sample(page: str, series: str) -> float:
    for line in page.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def exported_metric_names(page: str) -> set[str]:
    """Every sample name on a /metrics page (histograms give their _bucket, _sum and _count)."""
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in page.splitlines() if line and not line.startswith("#")}


def test_json_logs_are_one_object_per_line_with_proxy_and_provider(live_controller: LiveController) -> None:
    records = live_controller.records()  # every line parses: nothing else is written to stderr

    assert records and all({"time", "level", "logger", "message"} <= set(record) for record in records)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]) for record in records)
    misnamed = [record for record in records if record.get("proxy") == "crawlers/misnamed"]
    assert misnamed, records
    assert misnamed[0]["provider"] == "nowhere" and misnamed[0]["level"] == "WARNING"
    assert "ProviderNotConfigured" in misnamed[0]["message"]
    assert any(record["message"].startswith("runner lab ") for record in records)


def test_metrics_an_operator_alerts_on(live_controller: LiveController) -> None:
    page = live_controller.metrics()

    # Directory source: no election, so this replica leads (1); the label is the Lease's name.
    assert _sample(page, 'leader_election_master_status{name="egress-proxies-leader"}') == 1.0
    build = re.search(r'^egress_proxies_build_info\{(.*)\} 1\.0$', page, re.M)
    assert build is not None, page
    labels = dict(re.findall(r'(\w+)="([^"]*)"', build.group(1)))
    assert set(labels) == {"version", "python_version", "ansible_core_version"}
    assert labels["version"] == yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert labels["ansible_core_version"] != "unknown"
    # The Proxy naming an unconfigured provider: a permanent error of that provider, once per sweep.
    assert _sample(page, 'egress_proxies_errors_total{error_class="permanent",provider="nowhere"}') >= 1
    errors = [line for line in page.splitlines() if line.startswith("egress_proxies_errors_total{")]
    assert not [line for line in errors if 'provider="lab"' in line], errors  # lab served: no error of its own
    assert _sample(page, "egress_proxies_active_runners") in (0.0, 1.0)
    assert _sample(page, "egress_proxies_max_concurrent_runners") >= 1
    last = _sample(page, "egress_proxies_last_successful_sweep_timestamp_seconds")
    assert time.time() - 120 < last <= time.time()


def declared_metric_names(page: str) -> set[str]:
    """Every series name the page declares (``# TYPE``), with a histogram's _bucket, _sum and _count:
    a labelled metric nobody has incremented yet is declared but has no samples."""
    names = exported_metric_names(page)
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


# The controller's own families and the ones it shares a name with (client-go's leader gauge,
# the Python client's process_* metrics); anything else in an expression is PromQL.
METRIC = re.compile(r"\b(?:egress_proxies_|leader_election_|process_|python_)[a-zA-Z0-9_:]*")


def test_every_metric_the_alerts_and_the_dashboard_use_is_exported(live_controller: LiveController) -> None:
    exported = declared_metric_names(live_controller.metrics())
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]["groups"]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = {f"alert {rule['alert']}": rule["expr"] for group in rules for rule in group["rules"]}
    queries |= {f"panel {panel['title']!r} {target['refId']}": target["expr"]
                for panel in dashboard["panels"] for target in panel["targets"]}
    queries["dashboard variable job"] = next(
        variable["query"] for variable in dashboard["templating"]["list"] if variable["name"] == "job")

    # Label names (in `by (...)`, `without (...)` and selectors) are not metrics: python_version is one.
    labels = re.compile(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}")
    used = {where: set(METRIC.findall(labels.sub(" ", expr))) for where, expr in queries.items()}

    assert all(used.values()), {where for where, names in used.items() if not names}  # each queries a metric
    unknown = {where: names - exported for where, names in used.items() if names - exported}
    assert unknown == {}, f"not exported by the controller: {unknown}"
    # The dashboard covers the fleet as the issue asks: phases, serving, probes, sweeps, runners,
    # replacements and errors by provider and class.
    everything = set().union(*used.values())
    assert {"egress_proxies_proxies", "egress_proxies_proxies_serving", "egress_proxies_probe_duration_seconds_bucket",
            "egress_proxies_sweep_duration_seconds_bucket", "egress_proxies_runner_duration_seconds_bucket",
            "egress_proxies_replacements_total", "egress_proxies_errors_total"} <= everything


def test_the_discovery_port_serves_strangers_no_metrics(live_controller: LiveController) -> None:
    """Issue 38 row 7: a tokenless GET /metrics on the discovery port got every pool's name and size
    per namespace. Now metrics live on their own listener only: the discovery port answers 404 with
    nothing of the page, with or without a token, whatever the path's spelling."""
    assert "egress_proxies_sweeps_total" in live_controller.metrics()  # the metrics listener serves them
    for path in ("/metrics", "/metrics/", "/metrics?format=prometheus", "//metrics", "/v1/../metrics"):
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            request = urllib.request.Request(f"http://127.0.0.1:{live_controller.port}{path}", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(request, timeout=10)
            with answer.value:
                body = answer.value.read().decode()
            assert answer.value.code == 404 and "egress_proxies" not in body and "namespace" not in body, (path, body)
    # And the metrics listener serves nothing but /metrics: no discovery there.
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(f"http://127.0.0.1:{live_controller.metrics_port}/v1/proxies", timeout=10)
    with answer.value:
        assert answer.value.code == 404
