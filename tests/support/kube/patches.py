# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) as the Kubernetes API emulator applies them."""

from __future__ import annotations

import copy
from typing import Any

from support.kube.errors import ApiError

_STRATEGIC_DIRECTIVES = ("$patch", "$retainKeys", "$setElementOrder", "$deleteFromPrimitiveList")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def reject_strategic_directives(patch: Any) -> None:
    """Fail loudly rather than store ``$patch`` keys that the real server would interpret."""
    if isinstance(patch, dict):
        for key, value in patch.items():
            if key in _STRATEGIC_DIRECTIVES or key.startswith("$setElementOrder/"):
                raise ApiError(400, f"strategic merge directive {key} is not supported by the emulator")
            reject_strategic_directives(value)
    elif isinstance(patch, list):
        for item in patch:
            reject_strategic_directives(item)


class PatchFailed(Exception):
    """A JSON patch operation that cannot apply; the server answers 422."""


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchFailed(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _list_index(container: list[Any], token: str, for_insert: bool) -> int:
    if for_insert and token == "-":
        return len(container)
    if not token.isdigit():
        raise PatchFailed(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_insert):
        raise PatchFailed(f"array index {index} out of bounds")
    return index


def _resolve(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, dict):
            if token not in doc:
                raise PatchFailed(f"path element {token!r} not found")
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_list_index(doc, token, for_insert=False)]
        else:
            raise PatchFailed(f"cannot descend into {token!r}")
    return doc


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return copy.deepcopy(value)
    parent = _resolve(doc, tokens[:-1])
    if isinstance(parent, dict):
        parent[tokens[-1]] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, tokens[-1], for_insert=True), copy.deepcopy(value))
    else:
        raise PatchFailed(f"cannot add to a {type(parent).__name__}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchFailed("cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    if isinstance(parent, dict):
        if tokens[-1] not in parent:
            raise PatchFailed(f"unable to remove nonexistent key {tokens[-1]!r}")
        return parent.pop(tokens[-1])
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, tokens[-1], for_insert=False))
    raise PatchFailed(f"cannot remove from a {type(parent).__name__}")


def json_patch(doc: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch to a copy of ``doc``; raises ``PatchFailed``."""
    doc = copy.deepcopy(doc)
    for op in operations:
        name, tokens = op.get("op"), _pointer(op.get("path", ""))
        if name == "add":
            doc = _add(doc, tokens, op["value"])
        elif name == "remove":
            _remove(doc, tokens)
        elif name == "replace":
            if tokens:
                _remove(doc, tokens)  # replace requires the target to exist
            doc = _add(doc, tokens, op["value"])
        elif name == "move":
            doc = _add(doc, tokens, _remove(doc, _pointer(op["from"])))
        elif name == "copy":
            doc = _add(doc, tokens, _resolve(doc, _pointer(op["from"])))
        elif name == "test":
            if _resolve(doc, tokens) != op.get("value"):
                raise PatchFailed(f"testing value {op.get('path')} failed")
        else:
            raise PatchFailed(f"unsupported operation {name!r}")
    return doc
