"""Validation against the CRDs' own openAPIV3Schemas (``crd.yaml`` and ``crd-proxypool.yaml``,
links to ``controller/manifests/``): one source of truth for the API server's admission and for
the controller, which must validate too, because the directory source has no admission and a
Kubernetes object stored before its schema tightened never passed the current one.

``validation_errors``: every Proxy of a sweep (``reconcile``, through ``ValidationMemo``), its
namespace and name included (``identity_errors``); an invalid one fails alone.
``pool_spec_errors``: every ProxyPool's spec (``resources.pool.parse_spec``, which adds the checks across
fields that a schema cannot express).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from egress_proxies.resources.proxy import (
    API_VERSION,
    KIND,
    NAME_RULE,
    NAMESPACE_RULE,
    Proxy,
    is_namespace_name,
    is_object_name,
)

CRD_PATH = Path(__file__).with_name("crd.yaml")
POOL_CRD_PATH = Path(__file__).with_name("crd-proxypool.yaml")

# What a value must look like, for each pattern the CRDs use: the regular expression itself is
# no fix a user can read. tests/controller/resources/test_schema.py checks every pattern has one.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"
PATTERN_HINTS = {
    DURATION_PATTERN: 'must be a duration such as "90s", "5m", "6h" or "1h30m" (units h, m, s, ms)',
    r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$": ("must be a network in CIDR notation with no host bits set, such as 10.0.0.0/8 "
                                     "or 2001:db8::/32"),
    r"^http://\S+$": "must be a plain-HTTP URL (http://host/path)",
    r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$": ("must be host:port, such as example.com:443 or "
                                                          "[2001:db8::1]:443"),
}


@functools.cache
def crd_schema(path: Path) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's storage version."""
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def proxy_schema() -> dict[str, Any]:
    return crd_schema(CRD_PATH)


def pool_schema() -> dict[str, Any]:
    return crd_schema(POOL_CRD_PATH)


# The formats the CRDs name that the controller checks itself. The API server validates "cidr" with
# Go's net.ParseCIDR (JSONSchemaProps.format in the apiextensions v1 API reference), which takes
# host bits; the modules take a network only with its host bits clear, so a Proxy fails here,
# naming the field, rather than at its instance's create.
FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("cidr", raises=ValueError)
def _is_cidr(value: object) -> bool:
    return not isinstance(value, str) or bool(ipaddress.ip_network(value, strict=True))


@functools.cache
def _validator(path: Path) -> jsonschema.protocols.Validator:
    schema = crd_schema(path)
    # The status is the controller's own to write; only what users write is checked.
    checked = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "status"}}
    return jsonschema.Draft7Validator(checked, format_checker=FORMATS)


def _as_object(proxy: Proxy) -> Any:
    if proxy.raw is not None:
        return {key: value for key, value in proxy.raw.items() if key != "status"}
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": proxy.name, "namespace": proxy.namespace}, "spec": proxy.spec}


def _an(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _shape(rule: Mapping[str, Any]) -> str:
    """An object's fields as ``{required, optional?}``, in the schema's order."""
    required = rule.get("required") or []
    return "{" + ", ".join(name if name in required else f"{name}?" for name in rule["properties"]) + "}"


def _hint(rule: Mapping[str, Any], failed: str | None = None) -> str:
    """What the field must be, from its schema: the fix, in the schema's own words. ``failed``:
    the keyword the value broke (a wrong type gets the YAML quoting hint, an empty string not)."""
    json_type = rule.get("type")
    low, high = rule.get("minimum"), rule.get("maximum")
    if "enum" in rule:
        return "must be one of " + ", ".join(str(v) for v in rule["enum"])
    if json_type == "integer" and low is not None and high is not None:
        return f"must be an integer {low}-{high}"
    if json_type == "number" and low is not None and high is not None:
        return f"must be a number from {low} to {high}"
    if json_type in ("integer", "number") and low is not None:
        return f"must be {_an(json_type)} >= {low}"
    if json_type == "string" and rule.get("pattern") in PATTERN_HINTS:
        return PATTERN_HINTS[rule["pattern"]]
    if json_type == "string" and "maxLength" in rule:
        return f"must be a string of at most {rule['maxLength']} characters"
    if json_type == "string" and rule.get("minLength") == 1:
        return "must be a non-empty string" + (" (quote it in YAML)" if failed == "type" else "")
    if json_type == "string":
        return "must be a string (quote it in YAML)"
    if json_type == "object" and rule.get("properties"):
        return f"must be an object {_shape(rule)}"
    if json_type == "object" and rule.get("description"):
        # An object of free-form fields (a template): its description says what it holds.
        description = str(rule["description"]).strip().rstrip(".")
        return f"must be an object: {description[:1].lower()}{description[1:]}"
    if json_type == "array":
        items = rule.get("items") or {}
        text = "must be a non-empty list" if rule.get("minItems") == 1 else "must be a list"
        if items.get("type") == "object" and items.get("properties"):
            text += f" of {_shape(items)}"
        return text + (f" (at most {rule['maxItems']} items)" if "maxItems" in rule else "")
    if json_type:
        return f"must be {_an(json_type)}"
    return "does not match the schema"


def _path(error: jsonschema.ValidationError) -> str:
    return _join(error.absolute_path)


def _join(parts: Iterable[str | int]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "the object"


def _shown(value: Any) -> str:
    if isinstance(value, datetime.date):
        return f"{value.isoformat()} (YAML read it as a date)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: jsonschema.ValidationError) -> str:
    rule = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        prefix = _path(error)
        field = f"{prefix}.{missing}" if prefix != "the object" else missing
        wanted = (rule.get("properties") or {}).get(missing)
        return f"{field}: is required; it {_hint(wanted)}" if isinstance(wanted, dict) else f"{field}: is required"
    return f"{_path(error)}: {_hint(rule, str(error.validator))} (got {_shown(error.instance)})"


def identity_errors(namespace: str, name: str) -> list[str]:
    """``metadata.namespace`` and ``metadata.name`` as Kubernetes validates them (the CRD's schema
    cannot say it: ``metadata`` is the API server's), each as ``<field>: <the rule> (got ...)``."""
    errors = [] if is_namespace_name(namespace) else [f"metadata.namespace: {NAMESPACE_RULE} (got {_shown(namespace)})"]
    if not is_object_name(name):
        errors.append(f"metadata.name: {NAME_RULE} (got {_shown(name)})")
    return errors


def spec_errors(proxy: Proxy) -> list[str]:
    """Every violation of the Proxy CRD's schema, each as ``<field path>: <what it must be> (got ...)``."""
    errors = sorted(_validator(CRD_PATH).iter_errors(_as_object(proxy)), key=lambda e: list(map(str, e.absolute_path)))
    return list(dict.fromkeys(_message(error) for error in errors))


def validation_errors(proxy: Proxy) -> list[str]:
    """Every problem of the Proxy: its namespace and name, then its schema violations."""
    return identity_errors(proxy.namespace, proxy.name) + spec_errors(proxy)


def _what_validation_reads(validated: dict[str, Any]) -> Any:
    """The part of a validated object its result can depend on: all of it but its metadata, of
    which ``identity_errors`` reads the namespace and name and a CRD's schema may constrain only
    ``name`` and ``generateName`` (a structural schema allows no other rule there), so
    resourceVersion, managedFields and the rest are left out."""
    metadata = validated.get("metadata")
    if isinstance(metadata, dict):
        metadata = {key: metadata[key] for key in ("namespace", "name", "generateName") if key in metadata}
    return {**validated, "metadata": metadata}


class ValidationMemo:
    """``validation_errors`` per Proxy, computed again only when what it validates has changed.

    Validating every Proxy on every sweep was most of the controller's own time in a 10,000-Proxy
    sweep (docs/performance.md); a digest of what validation reads costs a fraction of a
    validation. Keyed by content, not by (uid, resourceVersion): the directory source's
    resourceVersion does not move when a Proxy's file is edited, and a status write moves the
    Kubernetes one without changing anything validated. ``retain`` drops the Proxies a sweep no
    longer saw."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[bytes, list[str]]] = {}

    def errors(self, proxy: Proxy) -> list[str]:
        read = _what_validation_reads(_as_object(proxy))
        digest = hashlib.blake2b(json.dumps(read, default=str).encode(), digest_size=16).digest()
        known = self._known.get(proxy.uid)
        if known is not None and known[0] == digest:
            return list(known[1])
        errors = validation_errors(proxy)
        if proxy.uid:
            self._known[proxy.uid] = (digest, errors)
        return list(errors)

    def retain(self, uids: Iterable[str]) -> None:
        kept = set(uids)
        self._known = {uid: known for uid, known in self._known.items() if uid in kept}


def without_nulls(value: Any, rule: Mapping[str, Any]) -> Any:
    """``value`` as the API server stores it: a null in a field the schema declares (none is
    ``nullable``) is dropped before validation and defaulting, so it reads as omitted. Fields
    the schema does not declare, and free-form objects, are left as they are."""
    properties = rule.get("properties")
    if isinstance(value, dict) and properties:
        return {key: without_nulls(item, properties.get(key, {})) for key, item in value.items()
                if not (item is None and key in properties and not properties[key].get("nullable"))}
    if isinstance(value, list) and isinstance(rule.get("items"), dict):
        return [without_nulls(item, rule["items"]) for item in value]
    return value


def unknown_fields(value: Any, rule: Mapping[str, Any], path: list[str | int]) -> list[str]:
    """Fields the schema does not declare, each object's at once, as ``<path>: unknown field(s)``.

    The API server drops them silently (pruning), and ``kubectl apply`` refuses them (strict
    field validation); no JSON-schema keyword the CRD may carry says so (structural schemas
    allow no ``additionalProperties: false`` beside ``properties``). The directory source has
    neither: a misspelt field would be ignored without a word."""
    found: list[str] = []
    properties = rule.get("properties")
    if isinstance(value, dict) and properties and not rule.get("x-kubernetes-preserve-unknown-fields"):
        unknown = sorted(str(key) for key in value if key not in properties)
        if unknown:
            found.append(f"{_join(path)}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(properties)}")
        for key, item in value.items():
            if key in properties:
                found += unknown_fields(item, properties[key], [*path, key])
    elif isinstance(value, list) and isinstance(rule.get("items"), dict):
        for index, item in enumerate(value):
            found += unknown_fields(item, rule["items"], [*path, index])
    return found


def pool_spec_errors(spec: Any) -> tuple[Any, list[str]]:
    """A ProxyPool's spec as the API server would store it (nulls dropped), and every way it
    breaks the ProxyPool CRD's schema or names a field the schema does not have, each as
    ``<field path>: <what it must be> (got ...)``, in the order the schema declares the fields."""
    rule = pool_schema()["properties"]["spec"]
    kept = without_nulls(spec, rule)
    errors = [_message(error) for error in _validator(POOL_CRD_PATH).iter_errors({"spec": kept})]
    return kept, list(dict.fromkeys(errors)) + unknown_fields(kept, rule, ["spec"])
