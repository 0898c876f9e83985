"""The controller's ``/metrics`` as a test reads it: one sample by name and labels, parsed with
prometheus-client's own text parser (the format Prometheus scrapes)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def gauge(metrics: str, name: str, **labels: str) -> float | None:
    """One sample of a ``/metrics`` text whose labels are exactly ``labels`` (None: not exported)."""
    return next((sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
                 if sample.name == name and sample.labels == labels), None)


def scrape(url: str, name: str, **labels: str) -> float | None:
    """``gauge`` of what ``url`` (a ``/metrics`` address) answers now."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return gauge(response.read().decode(), name, **labels)
