# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paged lists: ``limit`` and the ``continue`` token (apiserver's ``storage/continue.go`` format)."""

from __future__ import annotations

import base64
import json

from support.kube.errors import ApiError

# staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go: the 410 for a continue token whose
# snapshot was compacted away carries a token for the rest of the list at the latest version.
_INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.")


def list_limit(raw: str | None) -> int:
    """``limit``: 0 (or none) lists everything in one answer."""
    if raw in (None, ""):
        return 0
    assert raw is not None
    if not raw.lstrip("-").isdigit():
        raise ApiError(400, f"invalid limit {raw!r}: must be an integer")
    return max(int(raw), 0)


def encode_continue(start: str, rv: int) -> str:
    """staging/src/k8s.io/apiserver/pkg/storage/continue.go ``EncodeContinue``: the key to start
    from (below the resource's prefix) and the resourceVersion of the list's snapshot, as JSON in
    unpadded URL-safe base64."""
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[str, int]:
    """continue.go ``DecodeContinue``, refusing what it refuses as the handler does: 400
    ``invalid continue token: continue key is not valid: ...``."""
    def invalid(why: str) -> ApiError:
        return ApiError(400, f"invalid continue token: continue key is not valid: {why}")

    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError:
        raise invalid("not base64-encoded JSON") from None
    if not isinstance(decoded, dict) or decoded.get("v") != "meta.k8s.io/v1":
        raise invalid("server does not recognize this encoded version")
    rv, start = decoded.get("rv"), decoded.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv == 0:
        raise invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise invalid("encoded start key empty (version meta.k8s.io/v1)")
    if start.startswith("/") or ".." in start.split("/"):
        raise invalid(start)
    return start, rv


def expired_continue(start: str) -> ApiError:
    """410 Expired, with ``metadata.continue`` set to a token for the rest of the list as it is
    now (``handleCompactedErrorForPaging``: resourceVersion -1)."""
    error = ApiError(410, _INCONSISTENT_CONTINUE, reason="Expired")
    error.list_continue = encode_continue(start, -1)
    return error
