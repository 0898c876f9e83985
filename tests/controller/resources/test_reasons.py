"""The names of reasons (resources/reasons.py) and condition types (resources/conditions.py)
against docs/contract.md: every one the contract lists for a Proxy or a ProxyPool is named once in
the code, and every name there is in the contract. That the controller writes reasons only by
these names: tests/contract/test_module_contract.py."""

from __future__ import annotations

import re
from pathlib import Path

from egress_proxies.resources import conditions, reasons

CONTRACT = Path(__file__).resolve().parents[3] / "docs" / "contract.md"
CODE_SPAN = re.compile(r"`([A-Z][A-Za-z]+)`")
# A condition's status and reason as the contract writes them: `True`/`CredentialsRequired`.
STATUS_AND_REASON = re.compile(r"`(?:True|False|Unknown)`/`([A-Z][A-Za-z]+)`")


def names_in(module: object) -> dict[str, str]:
    return {name: value for name, value in vars(module).items() if name.isupper() and isinstance(value, str)}


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.compile(rf"^#{{1,{len(level)}}} ", re.MULTILINE).search(text, start)
    return text[start:following.start() if following else len(text)]


def column(table: str, index: int) -> set[str]:
    """The code spans in one column of a markdown table's rows (not its header)."""
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("|")][2:]
    return {name for row in rows for name in CODE_SPAN.findall(row[index])}


def contract() -> tuple[str, str]:
    text = CONTRACT.read_text()
    return section(text, "## The `Proxy` resource"), section(text, "## The `ProxyPool` resource")


def test_every_reason_of_the_contract_is_named_once_and_every_name_is_in_it() -> None:
    proxy, pool = contract()
    pool_status = section(pool, "### Status")
    pool_events = next(text for text in pool_status.split("\n\n") if text.startswith("Events on the pool:"))
    (distinct_egress,) = re.findall(r"condition `DistinctEgressIPs` \(([^)]*)\)", pool)
    documented = {
        "a Proxy's Ready reasons": column(section(proxy, "### Reasons"), 0),
        "a Proxy's Event reasons": column(section(proxy, "### Events"), 1),
        "a Proxy's other conditions": set(STATUS_AND_REASON.findall(section(proxy, "### Conditions"))),
        "a ProxyPool's conditions": set(STATUS_AND_REASON.findall(pool_status)),
        "a ProxyPool's Events": set(CODE_SPAN.findall(pool_events)),
        "a ProxyPool's DistinctEgressIPs": set(CODE_SPAN.findall(distinct_egress)),
    }
    # The reader finds what it is meant to (else this could pass on nothing).
    assert {len(found) > 1 for found in documented.values()} == {True}, documented
    named = names_in(reasons)
    assert len(set(named.values())) == len(named), "a reason named twice"
    assert set().union(*documented.values()) == set(named.values())


def test_every_condition_type_of_the_contract_is_named_and_every_name_is_in_it() -> None:
    proxy, pool = contract()
    proxy_types = re.findall(r"^- \*\*`([A-Z][A-Za-z]+)`\*\*", section(proxy, "### Conditions"), re.MULTILINE)
    pool_types = re.findall(r"\*\*`([A-Z][A-Za-z]+)`\*\*", section(pool, "### Status"))
    pool_types += re.findall(r"condition `([A-Z][A-Za-z]+)` \(", pool)
    assert proxy_types == ["Ready", "Serving", "Private", "Replacing", "ProviderListed", "HostActive"]
    assert pool_types == ["Available", "Progressing", "PlacementDegraded", "DistinctEgressIPs"]
    named = names_in(conditions)
    assert len(set(named.values())) == len(named), "a condition type named twice"
    assert set(proxy_types + pool_types) == set(named.values())
