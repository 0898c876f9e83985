"""The operator's documents match what the code ships (issue 40 row 11): docs/operations.md lists
every metric the controller exports and no other, and every alert's runbook link lands on a
section there; the `kubectl get` columns README.md and docs/operations.md show are the CRDs'
``additionalPrinterColumns``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY

from egress_proxies import metrics

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
MANIFESTS = REPO / "controller" / "manifests"
OWN = ("egress_proxies_", "leader_election_")


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def exported() -> set[str]:
    """The controller's own metric names as a scrape shows them (a counter's ``_total``, an Info's ``_info``)."""
    assert metrics.SWEEPS is not None  # imported: every metric is registered
    suffix = {"counter": "_total", "info": "_info"}
    return {family.name + suffix.get(family.type, "") for family in REGISTRY.collect() if family.name.startswith(OWN)}


def test_the_metrics_table_lists_exactly_what_the_controller_exports() -> None:
    table = section(OPERATIONS.read_text(), "Metrics")
    documented = set(re.findall(r"^\| `([a-z_:]+)` \|", table, re.M))
    assert documented == exported(), {"undocumented": exported() - documented,
                                      "documented, not exported": documented - exported()}


def slugs(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but - and _ dropped,
    spaces as -."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_alert_has_a_description_and_a_runbook_section_in_operations() -> None:
    rule = yaml.safe_load((MANIFESTS / "monitoring" / "prometheusrule.yaml").read_text())
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    anchors = slugs(OPERATIONS.read_text())
    assert len(alerts) >= 14
    for alert in alerts:
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        assert len(annotations["description"]) > 40, alert["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor == alert["alert"].lower(), annotations["runbook_url"]
        assert anchor in anchors, f"{alert['alert']}: no section #{anchor} in docs/operations.md"
    names = {alert["alert"] for alert in alerts}
    assert {"EgressProxiesPoolBelowDesired", "EgressProxiesProbeTargetUnreachable",
            "EgressProxiesQuarantineSpike"} <= names


def printer_columns(crd: str, wide: bool = False) -> list[str]:
    document: dict[str, Any] = yaml.safe_load((MANIFESTS / crd).read_text())
    (version,) = [v for v in document["spec"]["versions"] if v.get("storage")]
    return [column["name"].upper() for column in version["additionalPrinterColumns"]
            if wide or not column.get("priority")]


def test_the_kubectl_get_columns_shown_are_the_crds() -> None:
    readme = REPO.joinpath("README.md").read_text()
    shown = re.search(r"kubectl get proxies -n crawlers --watch\n```\n```\n(NAME .*)\n", readme)
    assert shown is not None, "README.md: the sample of `kubectl get proxies` is gone"
    assert shown.group(1).split() == ["NAME", *printer_columns("crd.yaml")]
    pools = re.search(r"kubectl get ppool -n crawlers +# (.*)\n", readme)
    assert pools is not None
    assert ["NAME", *pools.group(1).split(), "AGE"] == ["NAME", *printer_columns("crd-proxypool.yaml")]
    operations = re.search(r"`kubectl get proxies -A` shows the printer columns \(([^;]+);\s+`-o wide` adds (\w+)",
                           OPERATIONS.read_text())
    assert operations is not None
    assert [c.strip().upper() for c in operations.group(1).split(",")] == printer_columns("crd.yaml")
    assert printer_columns("crd.yaml", wide=True) == [*printer_columns("crd.yaml"), operations.group(2).upper()]
