# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The errors the Kubernetes API emulator answers with, as ``Status`` objects worded as the real server words them."""

from __future__ import annotations

from http import HTTPStatus

from support.kube.resources import Obj, ResourceType
from support.kube.validation import FieldError, aggregate

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error the server answers with a ``Status`` object."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: Obj | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or _REASONS.get(code, HTTPStatus(code).phrase.replace(" ", ""))
        self.message = message
        self.details = details
        # A 410 for an expired continue token carries the token for the rest of the list.
        self.list_continue: str | None = None

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {} if self.list_continue is None else {"continue": self.list_continue},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def object_details(rtype: ResourceType, name: str) -> Obj:
    return {"name": name, "group": rtype.group, "kind": rtype.plural}


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rtype.key} "{name}" not found', details=object_details(rtype, name))


def conflict(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {rtype.key} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details=object_details(rtype, name),
    )


def invalid(rtype: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    """``apierrors.NewInvalid``: 422, the qualified kind (``Proxy.crawl.example.com``, ``Pod``),
    every field error in the message and one cause per error."""
    qualified = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
    return ApiError(
        422, f'{qualified} "{name}" is invalid: {aggregate(errors)}',
        details={"name": name, "group": rtype.group, "kind": rtype.kind,
                 "causes": [e.cause() for e in errors]},
    )


def namespace_not_found(namespace: str) -> ApiError:
    # NamespaceLifecycle admission returns the NotFound of its own namespace lookup.
    return ApiError(404, f'namespaces "{namespace}" not found',
                    details={"name": namespace, "group": "", "kind": "namespaces"})
