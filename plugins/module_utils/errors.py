# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The three error classes every provider operation fails with.

Each provider's client layer translates its SDK's exceptions into one of these
where the API is called; nothing above that layer looks at SDK exceptions.
Modules report ``error.error_class`` as ``error_class`` in their failure result,
and the controller maps that string back to its reaction (see docs/contract.md).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

NOT_FOUND = "not_found"
PERMANENT = "permanent"
TRANSIENT = "transient"

ERROR_CLASSES = (NOT_FOUND, PERMANENT, TRANSIENT)


class ProxyError(Exception):
    """Base of the hierarchy. Unclassified failures are transient.

    ``details`` are extra result fields a failure still reports (a listing that failed on
    one location returns what it saw on the others).
    """

    error_class = TRANSIENT

    def __init__(self, message: str, details: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.details: Dict[str, Any] = dict(details or {})


class NotFound(ProxyError):
    """The backend says the instance does not exist."""

    error_class = NOT_FOUND


class Permanent(ProxyError):
    """Retrying will not help: bad config or input, unknown host, forbidden, corrupt key."""

    error_class = PERMANENT


class Transient(ProxyError):
    """Anything that may heal by itself: timeouts, 5xx, a missing key file, a host down."""

    error_class = TRANSIENT


def error_class_of(error: BaseException) -> str:
    """The class to report for any exception; anything unknown is transient."""
    if isinstance(error, ProxyError):
        return error.error_class
    return TRANSIENT
