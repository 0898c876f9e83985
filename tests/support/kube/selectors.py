# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Label and field selectors, as the real server parses and matches them, and the filter a list or watch applies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from support.kube.errors import ApiError
from support.kube.resources import Obj, ResourceType

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]"
_VALUE = r"(?:(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_SET_TERM = re.compile(rf"\s*({_KEY})\s+(in|notin)\s*\(([^()]*)\)\s*")
_EQ_TERM = re.compile(rf"\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*")
_EXISTS_TERM = re.compile(rf"\s*(!?)\s*({_KEY})\s*")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # "notin" and "!=" match objects without the key, as in the real selector semantics.
        return self.key not in labels or labels[self.key] not in self.values


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` is two terms)."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [term for term in terms if term.strip()]


def parse_label_selector(selector: str) -> list[Requirement]:
    """Parse a label selector string; raises 400 BadRequest like the real server."""
    requirements = []
    for term in _split_terms(selector):
        if match := _SET_TERM.fullmatch(term):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append(Requirement(match.group(1), match.group(2), values))
        elif match := _EQ_TERM.fullmatch(term):
            op = "notin" if match.group(2) == "!=" else "in"
            requirements.append(Requirement(match.group(1), op, frozenset({match.group(3)})))
        elif match := _EXISTS_TERM.fullmatch(term):
            requirements.append(
                Requirement(match.group(2), "!exists" if match.group(1) else "exists")
            )
        else:
            raise ApiError(400, f"unable to parse requirement: {term.strip()!r}")
    return requirements


_FIELDS = {"metadata.name": "name", "metadata.namespace": "namespace"}
_FIELD_TERM = re.compile(r"\s*([a-zA-Z.]+)\s*(==|=|!=)\s*([^,]*?)\s*")


def parse_field_selector(selector: str) -> list[Requirement]:
    """Parse a field selector over ``metadata.name`` and ``metadata.namespace`` (all we serve)."""
    requirements = []
    for term in _split_terms(selector):
        match = _FIELD_TERM.fullmatch(term)
        if not match:
            raise ApiError(400, f"invalid selector: {term.strip()!r}")
        if match.group(1) not in _FIELDS:
            raise ApiError(
                400,
                f'"{match.group(1)}" is not a known field selector: only "metadata.name", '
                '"metadata.namespace"',
            )
        op = "notin" if match.group(2) == "!=" else "in"
        requirements.append(Requirement(_FIELDS[match.group(1)], op, frozenset({match.group(3)})))
    return requirements


@dataclass(frozen=True)
class Filter:
    """Which objects of one resource a list or watch sees."""

    rtype: ResourceType
    namespace: str | None
    labels: list[Requirement]
    fields: list[Requirement]

    def matches(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        fields = {"name": meta["name"], "namespace": meta.get("namespace", "")}
        return all(r.matches(labels) for r in self.labels) and all(
            r.matches(fields) for r in self.fields
        )
