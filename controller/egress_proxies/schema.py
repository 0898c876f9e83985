"""Proxy validation against the CRD's own openAPIV3Schema (``crd.yaml``, a link to
``controller/manifests/crd.yaml``): one source of truth for the API server's admission and for
the controller, which must validate too, because the directory source has no admission and a
Kubernetes object stored before its schema tightened never passed the current one.

Called by ``reconcile`` for every Proxy of a sweep; an invalid one fails alone.
"""

from __future__ import annotations

import datetime
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from egress_proxies.model import API_VERSION, KIND, Proxy

CRD_PATH = Path(__file__).with_name("crd.yaml")


@functools.cache
def proxy_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = proxy_schema()
    # The status is the controller's own to write; only what users write is checked.
    checked = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "status"}}
    return jsonschema.Draft7Validator(checked)


def _as_object(proxy: Proxy) -> Any:
    if proxy.raw is not None:
        return {key: value for key, value in proxy.raw.items() if key != "status"}
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": proxy.name, "namespace": proxy.namespace}, "spec": proxy.spec}


def _hint(rule: dict[str, Any]) -> str:
    """What the field must be, from its schema: the fix, in the schema's own words."""
    json_type = rule.get("type")
    if "enum" in rule:
        return "must be one of " + ", ".join(str(v) for v in rule["enum"])
    if json_type == "integer" and "minimum" in rule and "maximum" in rule:
        return f"must be an integer {rule['minimum']}-{rule['maximum']}"
    if json_type == "string" and "maxLength" in rule:
        return f"must be a string of at most {rule['maxLength']} characters"
    if json_type == "string":
        return "must be a string (quote it in YAML)"
    if json_type:
        return f"must be {'an' if json_type[0] in 'aeiou' else 'a'} {json_type}"
    return "does not match the schema"


def _path(error: jsonschema.ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "the object"


def _shown(value: Any) -> str:
    if isinstance(value, datetime.date):
        return f"{value.isoformat()} (YAML read it as a date)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_errors(proxy: Proxy) -> list[str]:
    """Every schema violation of the Proxy, each as ``<field path>: <what it must be> (got ...)``."""
    errors = []
    for error in sorted(_validator().iter_errors(_as_object(proxy)), key=lambda e: list(map(str, e.absolute_path))):
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            prefix = _path(error)
            field = f"{prefix}.{missing}" if prefix != "the object" else missing
            errors.append(f"{field}: is required")
        else:
            errors.append(f"{_path(error)}: {_hint(error.schema if isinstance(error.schema, dict) else {})} "
                          f"(got {_shown(error.instance)})")
    return errors
