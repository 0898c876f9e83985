# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Kubernetes API emulator refuses, worded as a real kube-apiserver words it.

Each rule cites where the real server implements it, so a test that passes against the
emulator fails against neither:

- field errors and their ``Status`` causes: k8s.io/apimachinery/pkg/util/validation/field
  (``Error.ErrorBody``) and k8s.io/apimachinery/pkg/api/errors (``NewInvalid``);
- object metadata (label keys and values, annotation keys and size):
  k8s.io/apimachinery/pkg/api/validation/objectmeta.go and pkg/util/validation/validation.go;
- Pods (containers, names, images, ports): kubernetes/pkg/apis/core/validation/validation.go;
- Lease times: metav1.MicroTime's JSON form (k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go);
- custom resources: the CRD's structural ``openAPIV3Schema``, pruned, defaulted and validated as
  k8s.io/apiextensions-apiserver does (pkg/apiserver/schema/pruning, .../schema/defaulting,
  pkg/apiserver/validation ``kubeOpenAPIResultToFieldErrors``), with ``jsonschema`` doing the
  validating; and the schema's ``x-kubernetes-validations`` rules, evaluated in CEL (with
  ``cel-python``) as k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go does
  (the CRD docs' "Validation rules":
  https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Obj = dict[str, Any]

# The wording of each field.ErrorType (field/errors.go ``ErrorType.String``).
_TYPE_TEXT = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueTypeInvalid": "Invalid value",
}
# ErrorBody prints these without the bad value.
_NO_VALUE = frozenset({"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong"})


class GoValue(str):
    """A value printed verbatim, for Go values Python has no spelling of (``0x0``)."""


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: what a Status cause carries."""

    type: str
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        """``field.Error.ErrorBody``: the type, the bad value as Go prints it, the detail."""
        text = _TYPE_TEXT[self.type]
        if self.type not in _NO_VALUE:
            text += f": {_go_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> Obj:
        return {"reason": self.type, "message": self.body(), "field": self.field}


def _go_value(value: Any) -> str:
    if isinstance(value, GoValue):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # Go's %q for what we meet here
    return json.dumps(value, sort_keys=True)


def aggregate(errors: list[FieldError]) -> str:
    """``utilerrors.NewAggregate(...).Error()``: one error alone, several in brackets."""
    texts = [str(e) for e in errors]
    return texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"


# --- names, labels, annotations (k8s.io/apimachinery/pkg/util/validation) ---------------------

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"

DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
# objectmeta.go: TotalAnnotationSizeLimitB.
ANNOTATIONS_LIMIT = 256 * 1024


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``IsDNS1123Subdomain``: the messages, empty when valid."""
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not re.fullmatch(_DNS1123_SUBDOMAIN, value):
        errors.append(DNS1123_SUBDOMAIN_MSG)
    return errors


def dns1123_label_errors(value: str) -> list[str]:
    """``IsDNS1123Label``."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(_DNS1123_LABEL, value):
        errors.append(DNS1123_LABEL_MSG)
    return errors


def qualified_name_errors(value: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS-subdomain prefix and ``/``, then a name part."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        prefix_errors = dns1123_subdomain_errors(prefix)
        if prefix_errors:
            return [f"prefix part {msg}" for msg in prefix_errors]
    else:
        return ["a qualified name " + _QUALIFIED_NAME_MSG.removeprefix("name part ")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    errors = []
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if name and not re.fullmatch(_QUALIFIED_NAME, name):
        errors.append(_QUALIFIED_NAME_MSG)
    return errors


def label_value_errors(value: str) -> list[str]:
    """``IsValidLabelValue``: at most 63 characters, name-shaped or empty."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(_LABEL_VALUE, value):
        errors.append(LABEL_VALUE_MSG)
    return errors


def validate_metadata(meta: Mapping[str, Any]) -> list[FieldError]:
    """Labels and annotations of any object (``ValidateObjectMetaAccessor``).

    As in objectmeta.go, label errors name the field ``metadata.labels`` (not the key) and carry
    the offending key or value."""
    errors: list[FieldError] = []
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return [FieldError("FieldValueInvalid", "metadata.labels", labels, "must be a map")]
    for key, value in labels.items():
        errors += [FieldError("FieldValueInvalid", "metadata.labels", key, msg)
                   for msg in qualified_name_errors(key)]
        if not isinstance(value, str):
            errors.append(FieldError("FieldValueTypeInvalid", "metadata.labels", value,
                                     "must be a string"))
            continue
        errors += [FieldError("FieldValueInvalid", "metadata.labels", value, msg)
                   for msg in label_value_errors(value)]
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        return [*errors, FieldError("FieldValueInvalid", "metadata.annotations", annotations,
                                    "must be a map")]
    size = 0
    for key, value in annotations.items():
        # ValidateAnnotations lower-cases the key before IsQualifiedName.
        errors += [FieldError("FieldValueInvalid", "metadata.annotations", key, msg)
                   for msg in qualified_name_errors(key.lower())]
        size += len(key) + len(str(value))
    if size > ANNOTATIONS_LIMIT:
        errors.append(FieldError("FieldValueTooLong", "metadata.annotations", None,
                                 f"must have at most {ANNOTATIONS_LIMIT} bytes"))
    return errors


# --- Pods (pkg/apis/core/validation/validation.go) --------------------------------------------

_PORT_NAME_CHARS = re.compile(r"[-a-z0-9]+")
_PROTOCOLS = ("SCTP", "TCP", "UDP")


def port_name_errors(name: str) -> list[str]:
    """``IsValidPortName``: an IANA_SVC_NAME."""
    errors = []
    if len(name) > 15:
        errors.append("must be no more than 15 characters")
    if not _PORT_NAME_CHARS.fullmatch(name):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in name:
        errors.append("must not contain consecutive hyphens")
    if not re.search(r"[a-z]", name):
        errors.append("must contain at least one letter (a-z)")
    if name.startswith("-") or name.endswith("-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def _port_number_errors(value: Any) -> list[str]:
    """``IsValidPortNum``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return ["must be between 1 and 65535, inclusive"]
    return []


# validation.go, validEnvDownwardAPIFieldPathExpressions: the Pod fields an env var may take from
# the downward API (status.hostIPs from 1.29, the PodHostIPs gate, on by default; labels and
# annotations as metadata.labels['<key>'] and metadata.annotations['<key>']).
_ENV_FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
                    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_ENV_SUBSCRIPTED_FIELD = re.compile(r"metadata\.(labels|annotations)\['[^']+'\]")


def _env_errors(env: Any, path: str) -> Iterator[FieldError]:
    """validateEnvVarValueFrom's check of a fieldRef: only the supported field paths."""
    for i, var in enumerate(env if isinstance(env, list) else []):
        field_ref = ((var.get("valueFrom") or {}).get("fieldRef") if isinstance(var, dict) else None) or {}
        field_path = field_ref.get("fieldPath")
        if field_path is not None and field_path not in _ENV_FIELD_PATHS and not (
                isinstance(field_path, str) and _ENV_SUBSCRIPTED_FIELD.fullmatch(field_path)):
            yield FieldError("FieldValueNotSupported", f"{path}[{i}].valueFrom.fieldRef.fieldPath", field_path,
                             "supported values: " + ", ".join(f'"{p}"' for p in _ENV_FIELD_PATHS))


def _container_errors(container: Any, path: str, names: set[str],
                      port_names: set[str]) -> Iterator[FieldError]:
    if not isinstance(container, dict):
        yield FieldError("FieldValueInvalid", path, container, "must be an object")
        return
    name = container.get("name")
    if not name:
        yield FieldError("FieldValueRequired", f"{path}.name")
    elif name in names:
        yield FieldError("FieldValueDuplicate", f"{path}.name", name)
    else:
        names.add(name)
        for msg in dns1123_label_errors(name):
            yield FieldError("FieldValueInvalid", f"{path}.name", name, msg)
    # validateContainerCommon: an image is required for containers (unlike ephemeral ones).
    if not container.get("image") or not str(container["image"]).strip():
        yield FieldError("FieldValueRequired", f"{path}.image")
    yield from _env_errors(container.get("env") or [], f"{path}.env")
    for j, port in enumerate(container.get("ports") or []):
        port_path = f"{path}.ports[{j}]"
        if not isinstance(port, dict):
            yield FieldError("FieldValueInvalid", port_path, port, "must be an object")
            continue
        if port.get("name"):
            port_name = port["name"]
            for msg in port_name_errors(port_name):
                yield FieldError("FieldValueInvalid", f"{port_path}.name", port_name, msg)
            if port_name in port_names:
                yield FieldError("FieldValueDuplicate", f"{port_path}.name", port_name)
            port_names.add(port_name)
        # validateContainerPorts: 0 (unset) is "required", anything else outside 1-65535 invalid.
        if not port.get("containerPort"):
            yield FieldError("FieldValueRequired", f"{port_path}.containerPort")
        else:
            for msg in _port_number_errors(port["containerPort"]):
                yield FieldError("FieldValueInvalid", f"{port_path}.containerPort",
                                 port["containerPort"], msg)
        if port.get("hostPort"):
            for msg in _port_number_errors(port["hostPort"]):
                yield FieldError("FieldValueInvalid", f"{port_path}.hostPort", port["hostPort"], msg)
        protocol = port.get("protocol", "TCP")
        if protocol not in _PROTOCOLS:
            yield FieldError("FieldValueNotSupported", f"{port_path}.protocol", protocol,
                             "supported values: " + ", ".join(f'"{p}"' for p in _PROTOCOLS))


def validate_pod(pod: Obj) -> list[FieldError]:
    """``ValidatePodCreate``'s checks the provider's Pods can trip over: containers are required,
    each with a DNS-1123 label name (unique), an image, and ports with valid numbers, names
    and protocols; named ports are unique across the Pod's containers."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("FieldValueRequired", "spec.containers")]
    containers = spec.get("containers")
    if not containers:
        return [FieldError("FieldValueRequired", "spec.containers")]
    if not isinstance(containers, list):
        return [FieldError("FieldValueInvalid", "spec.containers", containers, "must be a list")]
    names: set[str] = set()
    port_names: set[str] = set()
    errors: list[FieldError] = []
    for i, container in enumerate(containers):
        errors += _container_errors(container, f"spec.containers[{i}]", names, port_names)
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
        errors.append(FieldError("FieldValueInvalid", "spec.terminationGracePeriodSeconds", grace,
                                 "must be greater than or equal to 0"))
    return errors


# --- metav1.MicroTime -------------------------------------------------------------------------

# micro_time.go: RFC3339Micro = "2006-01-02T15:04:05.000000Z07:00"; Go's ".000000" in a layout
# means exactly six digits, so "...:05Z" and "...:05.123Z" are both refused.
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"
_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})")


def is_micro_time(value: Any) -> bool:
    return value is None or (isinstance(value, str) and _MICRO_TIME.fullmatch(value) is not None)


def micro_time_error(value: Any) -> str:
    """What Go's decoder says about a value ``is_micro_time`` refuses (time.Parse's wording for
    the usual mistakes: no fraction, too few or too many digits)."""
    if not isinstance(value, str):
        return f"json: cannot unmarshal {_json_type(value).replace('integer', 'number')} into Go value of type string"
    head = f"parsing time {json.dumps(value)} as \"{RFC3339_MICRO}\""
    match = re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", value)
    if match is None:
        return f"{head}: cannot parse {json.dumps(value)} as \"2006\""
    rest = value[match.end():]
    fraction = re.match(r"\.\d{6}", rest)
    if fraction is None:
        return f"{head}: cannot parse {json.dumps(rest)} as \".000000\""
    return f"{head}: cannot parse {json.dumps(rest[fraction.end():])} as \"Z07:00\""


# --- custom resources: structural schema ------------------------------------------------------

# The root fields a custom resource keeps whatever its schema says (pruning.go: apiVersion,
# kind and metadata are never pruned at the root; metadata is ObjectMeta, not schema-checked).
_ROOT_KEPT = ("apiVersion", "kind", "metadata")
_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object",
               list: "array", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _as_json_schema(schema: Any) -> Any:
    """The OpenAPI v3 schema as JSON Schema: ``nullable: true`` admits null (OpenAPI spells it
    apart from ``type``); everything else (x-kubernetes-*, default, description) is ignored by
    the validator anyway."""
    if isinstance(schema, list):
        return [_as_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _as_json_schema(value) for key, value in schema.items()}
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        out["type"] = [schema["type"], "null"]
    return out


_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("date-time")
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or _DATE_TIME.fullmatch(value) is not None


class StructuralSchema:
    """One CRD version's ``openAPIV3Schema``: prune, default, validate."""

    def __init__(self, schema: Obj) -> None:
        self.schema = copy.deepcopy(schema)
        self._validator = jsonschema.Draft4Validator(_as_json_schema(self.schema),
                                                     format_checker=_FORMATS)

    def prune_and_default(self, obj: Obj) -> Obj:
        """Drop fields the schema does not name (unless it preserves unknown fields), drop
        nulls where the field is not nullable, and fill in ``default:``s, as the API server does
        to every request body before validating it (CRD docs: "Pruning", "Defaulting and
        Nullable")."""
        out = copy.deepcopy(obj)
        properties = self.schema.get("properties") or {}
        for key in list(out):
            if key in _ROOT_KEPT:
                continue
            if key not in properties and not self.schema.get("x-kubernetes-preserve-unknown-fields"):
                del out[key]
        self._walk_properties(self.schema, out, skip=_ROOT_KEPT)
        return out

    def _walk(self, schema: Mapping[str, Any], value: Any) -> Any:
        if isinstance(value, dict):
            properties = schema.get("properties")
            if properties is not None:
                if not schema.get("x-kubernetes-preserve-unknown-fields"):
                    for key in [k for k in value if k not in properties]:
                        del value[key]
                self._walk_properties(schema, value, skip=())
            elif isinstance(schema.get("additionalProperties"), dict):
                for key in list(value):
                    value[key] = self._walk(schema["additionalProperties"], value[key])
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            return [self._walk(schema["items"], item) for item in value]
        return value

    def _walk_properties(self, schema: Mapping[str, Any], value: Obj, skip: tuple[str, ...]) -> None:
        for key, sub in (schema.get("properties") or {}).items():
            if key in skip:
                continue
            if key in value and value[key] is None and not sub.get("nullable"):
                del value[key]  # "null values ... will be pruned before defaulting happens"
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = self._walk(sub, value[key])

    def validate(self, obj: Obj, old: Obj | None = None) -> list[FieldError]:
        """Field errors as ``kubeOpenAPIResultToFieldErrors`` makes them from kube-openapi's.

        On an update (``old`` given), validation ratchets as on Kubernetes 1.30+ (KEP-4008,
        CRDValidationRatcheting, on by default since 1.30, GA in 1.33): an error on a value
        the update left unchanged is not reported, so an object stored before the schema
        tightened can still have its status, finalizers or other fields written."""
        document = {k: v for k, v in obj.items() if k not in _ROOT_KEPT}
        errors: list[FieldError] = []
        seen: set[str] = set()
        for error in sorted(self._validator.iter_errors(document), key=lambda e: list(map(str, e.path))):
            if old is not None and _unchanged(old, list(error.absolute_path), error.instance):
                continue
            for field_error in _field_errors(error):
                if str(field_error) not in seen:
                    seen.add(str(field_error))
                    errors.append(field_error)
        if not errors:  # the API server runs the CEL rules only on an object the schema admits
            before = None if old is None else {k: v for k, v in old.items() if k not in _ROOT_KEPT}
            errors += _rule_errors(self.schema, document, before, [])
        return errors


_PROGRAMS: dict[str, Any] = {}


def _rule_errors(schema: Mapping[str, Any], value: Any, old: Obj | None, path: list[Any]) -> list[FieldError]:
    """Every ``x-kubernetes-validations`` rule of the schema, at each node the value has, with
    ``self`` bound to the node (cel/validation.go ``validateExpressions``). A failed rule is a
    ``field.Invalid`` at the node's path joined with the rule's ``fieldPath``, whose value is the
    node's schema type and whose detail is the rule's ``message`` (``fieldErrorForReason``,
    ``ruleMessageOrDefault``: "failed rule: <rule>" without one). Ratcheting (KEP-4008, on by
    default since 1.30): on an update, a rule on a node the update left unchanged is not run."""
    errors: list[FieldError] = []
    if old is None or not _unchanged(old, path, value):
        for rule in schema.get("x-kubernetes-validations") or []:
            program = _PROGRAMS.get(rule["rule"])
            if program is None:
                environment = celpy.Environment()
                program = _PROGRAMS[rule["rule"]] = environment.program(environment.compile(rule["rule"]))
            try:
                passed = bool(program.evaluate({"self": json_to_cel(value)}))
            except CELEvalError:
                passed = False  # a rule that cannot be evaluated on the object refuses it, as on the server
            if not passed:
                where = _path([*path, *(p for p in str(rule.get("fieldPath") or "").split(".") if p)])
                errors.append(FieldError(str(rule.get("reason") or "FieldValueInvalid"), where,
                                         str(schema.get("type") or "object"),
                                         str(rule.get("message") or f"failed rule: {rule['rule']}")))
    properties = schema.get("properties") or {}
    if isinstance(value, dict):
        for key, sub in properties.items():
            if key in value:
                errors += _rule_errors(sub, value[key], old, [*path, key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += _rule_errors(schema["items"], item, old, [*path, index])
    return errors


_MISSING = object()


def _unchanged(old: Any, path: list[Any], value: Any) -> bool:
    for part in path:
        if isinstance(old, dict) and isinstance(part, str):
            old = old.get(part, _MISSING)
        elif isinstance(old, list) and isinstance(part, int) and part < len(old):
            old = old[part]
        else:
            return False
    return old is not _MISSING and bool(old == value) and type(old) is type(value)


def _path(parts: Any) -> str:
    """A field.Path string: ``spec.conditions[0].type``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _field_errors(error: jsonschema.ValidationError) -> Iterator[FieldError]:
    path = _path(error.absolute_path)
    # Typed loosely on purpose: jsonschema types these as possibly "unset", never so for an
    # error that iter_errors produced.
    keyword: str = str(error.validator)
    expected: Any = error.validator_value
    value: Any = error.instance
    where = f"{path} in body"
    if keyword == "required":
        # One "Required value" per missing property, named by its own path.
        for missing in expected:
            if isinstance(value, dict) and missing not in value:
                yield FieldError("FieldValueRequired", _path([*error.absolute_path, missing]))
        return
    if keyword == "enum":
        # Go quotes string values (strconv.Quote) and JSON-encodes the others: json.dumps does both.
        yield FieldError("FieldValueNotSupported", path, value,
                         "supported values: " + ", ".join(json.dumps(v) for v in expected))
        return
    if keyword == "maxLength":
        yield FieldError("FieldValueTooLong", path, value, f"may not be longer than {expected}")
        return
    if keyword == "type":
        wanted = expected if isinstance(expected, str) else expected[0]
        yield FieldError("FieldValueTypeInvalid", path, value,
                         f'{where} must be of type {wanted}: "{_json_type(value)}"')
        return
    details = {
        "minimum": f"{where} should be greater than or equal to {expected}",
        "maximum": f"{where} should be less than or equal to {expected}",
        "minLength": f"{where} should be at least {expected} chars long",
        "pattern": f"{where} should match '{expected}'",
        "format": f'{where} must be of type {expected}: {json.dumps(value)}',
        "minItems": f"{where} should have at least {expected} items",
        "maxItems": f"{where} should have at most {expected} items",
    }
    yield FieldError("FieldValueInvalid", path, value, details.get(keyword, f"{where}: {error.message}"))


def crd_errors(crd: Obj) -> list[FieldError]:
    """The parts of apiextensions' ``ValidateCustomResourceDefinition`` the emulator needs to
    serve a kind: group, names, scope, versions (one storage version, each with a schema, which
    apiextensions.k8s.io/v1 requires) and a name that is ``<plural>.<group>``."""
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("FieldValueRequired", "spec")]
    errors: list[FieldError] = []
    group, names = spec.get("group"), spec.get("names") or {}
    for path, value in (("spec.group", group), ("spec.names.plural", names.get("plural")),
                        ("spec.names.kind", names.get("kind"))):
        if not value:
            errors.append(FieldError("FieldValueRequired", path))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errors.append(FieldError("FieldValueNotSupported", "spec.scope", spec.get("scope"),
                                 'supported values: "Cluster", "Namespaced"'))
    name = crd["metadata"].get("name")
    if group and names.get("plural") and name != f"{names['plural']}.{group}":
        errors.append(FieldError("FieldValueInvalid", "metadata.name", name,
                                 'must be spec.names.plural+"."+spec.group'))
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        return [*errors, FieldError("FieldValueInvalid", "spec.versions", versions,
                                    "must have exactly one version marked as storage version")]
    if sum(1 for v in versions if isinstance(v, dict) and v.get("storage")) != 1:
        errors.append(FieldError("FieldValueInvalid", "spec.versions", versions,
                                 "must have exactly one version marked as storage version"))
    for i, version in enumerate(versions):
        if not isinstance(version, dict) or not version.get("name"):
            errors.append(FieldError("FieldValueRequired", f"spec.versions[{i}].name"))
        elif not (version.get("schema") or {}).get("openAPIV3Schema"):
            errors.append(FieldError("FieldValueRequired", f"spec.versions[{i}].schema.openAPIV3Schema",
                                     detail="schemas are required"))
    return errors
