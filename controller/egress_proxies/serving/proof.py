"""The probe's nonce and the probe target's proof of it: how an answer shows it came from the
operator's own probe target and not from whatever sits at the proxy's address.

Every check of a probe carries a fresh random nonce (``NONCE_PARAMETER`` in the query string of
the URL it asks for); the probe target (``serving.target``, ``egress-proxies probe-target``)
answers with ``proof(key, nonce)`` in the ``PROOF_HEADER`` response header, and the egress echo
with ``proof(key, nonce, address)`` beside the address it saw. ``key`` is the secret both sides
read from the provider's ``probe.keyFile``: an HMAC-SHA256, so an endpoint that answers by itself
(a 204 of its own, a tunnel that echoes, an invented echo address) cannot produce it, and a
proof seen once is worth nothing for the next nonce. Both sides use this module.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from urllib.parse import parse_qs

NONCE_PARAMETER = "egress-probe-nonce"
PROOF_HEADER = "X-Egress-Probe-Proof"
# A key shorter than this is a mistake (an empty file, a placeholder), not a secret.
MINIMUM_KEY_BYTES = 16
_NONCE_BYTES = 16


def new_nonce() -> str:
    return secrets.token_hex(_NONCE_BYTES)


def proof(key: bytes, nonce: str, address: str | None = None) -> str:
    """What only a holder of ``key`` can answer to ``nonce`` (and, for the echo, ``address``)."""
    message = nonce if address is None else f"{nonce} {address}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def proves(key: bytes, nonce: str, answer: str | None, address: str | None = None) -> bool:
    return answer is not None and hmac.compare_digest(answer.strip(), proof(key, nonce, address))


def with_nonce(url: str, nonce: str) -> str:
    """``url`` asking for ``nonce`` (a query parameter beside any the URL has)."""
    return f"{url}{'&' if '?' in url else '?'}{NONCE_PARAMETER}={nonce}"


def nonce_of(query: str) -> str | None:
    """The nonce a request's query string carries, if it carries one of a sane size."""
    values = parse_qs(query).get(NONCE_PARAMETER) or []
    nonce = values[0] if values else ""
    return nonce if 0 < len(nonce) <= 128 else None


def read_key(path: str) -> bytes:
    """The key in ``path`` (surrounding whitespace stripped); OSError or ValueError naming the
    file and the fix, never its content."""
    key = Path(path).read_bytes().strip()
    if len(key) < MINIMUM_KEY_BYTES:
        raise ValueError(f"probe key file {path} holds {len(key)} bytes; it needs at least {MINIMUM_KEY_BYTES} "
                         "(make one with: head -c 32 /dev/urandom | base64 > FILE)")
    return key
