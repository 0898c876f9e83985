"""The probe's nonce and the probe target's proof of it: how an answer shows it came from the
operator's own probe target and not from whatever sits at the proxy's address.

Every check of a probe carries a fresh random nonce (``NONCE_PARAMETER`` in the query string of
the URL it asks for); the probe target (``serving.target``, ``egress-proxies probe-target``)
answers the 204 check (and the same through the CONNECT tunnel) with ``answer_proof(key, nonce)``
in the ``PROOF_HEADER`` response header, and the egress echo with ``echo_proof(key, nonce,
address)`` beside the address it saw. ``key`` is the secret both sides read from the provider's
``probe.keyFile``: an HMAC-SHA256, so an endpoint that answers by itself (a 204 of its own, a
tunnel that echoes, an invented echo address) cannot produce it, and a proof seen once is worth
nothing for the next nonce. Both sides use this module.

Two rules keep one proof from passing for another (issue 38 row 2: a 204 proof asked for the
nonce ``N%20203.0.113.77`` was the echo proof of ``N`` and 203.0.113.77):

- **Domain separation**: each kind of proof signs its own label (``_ANSWER``, ``_ECHO``) and its
  fields joined by a newline, so no message of one kind is ever a message of another;
- **One nonce format**: ``NONCE_LENGTH`` lower-case hex digits, what ``new_nonce`` makes. The
  target signs nothing else (``nonce_of`` refuses any other value, and the target answers 400),
  and ``proves_*`` never accepts a proof of anything else, so nobody can have the target sign a
  message of their choosing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from pathlib import Path
from urllib.parse import parse_qs

NONCE_PARAMETER = "egress-probe-nonce"
PROOF_HEADER = "X-Egress-Probe-Proof"
# A key shorter than this is a mistake (an empty file, a placeholder), not a secret.
MINIMUM_KEY_BYTES = 16
_NONCE_BYTES = 16
NONCE_LENGTH = 2 * _NONCE_BYTES
NONCE_FORMAT = f"{NONCE_LENGTH} lower-case hex digits"
_NONCE = re.compile(f"[0-9a-f]{{{NONCE_LENGTH}}}")
# What each kind of proof signs first: versioned, so a future change of a message's fields is a
# new label and never an old message read anew.
_ANSWER = b"egress-probe-proof/v2 answer"
_ECHO = b"egress-probe-proof/v2 echo"


class BadNonce(ValueError):
    """A request's nonce is not of the one format (the target answers 400 and signs nothing)."""


def new_nonce() -> str:
    return secrets.token_hex(_NONCE_BYTES)


def is_nonce(text: str) -> bool:
    return _NONCE.fullmatch(text) is not None


def answer_proof(key: bytes, nonce: str) -> str:
    """The 204 check's proof (the plain-HTTP check, and the one through the CONNECT tunnel)."""
    return _sign(key, _ANSWER, nonce)


def echo_proof(key: bytes, nonce: str, address: str) -> str:
    """The egress echo's proof that the target saw ``address`` for ``nonce``."""
    return _sign(key, _ECHO, nonce, address)


def proves_answer(key: bytes, nonce: str, answer: str | None) -> bool:
    return is_nonce(nonce) and answer is not None and hmac.compare_digest(answer.strip(), answer_proof(key, nonce))


def proves_echo(key: bytes, nonce: str, address: str, answer: str | None) -> bool:
    return (is_nonce(nonce) and answer is not None
            and hmac.compare_digest(answer.strip(), echo_proof(key, nonce, address)))


def _sign(key: bytes, label: bytes, nonce: str, *fields: str) -> str:
    if not is_nonce(nonce):
        raise BadNonce(f"a nonce is {NONCE_FORMAT}")
    # Fields never hold a newline: the nonce is hex, an address is what getpeername wrote.
    message = b"\n".join([label, nonce.encode(), *(field.encode() for field in fields)])
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def with_nonce(url: str, nonce: str) -> str:
    """``url`` asking for ``nonce`` (a query parameter beside any the URL has)."""
    return f"{url}{'&' if '?' in url else '?'}{NONCE_PARAMETER}={nonce}"


def nonce_of(query: str) -> str | None:
    """The nonce a request's query string carries; None when it carries none; ``BadNonce`` when
    it carries anything but one value of the one format."""
    values = parse_qs(query, keep_blank_values=True).get(NONCE_PARAMETER)
    if values is None:
        return None
    if len(values) != 1 or not is_nonce(values[0]):
        raise BadNonce(f"{NONCE_PARAMETER} must be one value of {NONCE_FORMAT}")
    return values[0]


def read_key(path: str) -> bytes:
    """The key in ``path`` (surrounding whitespace stripped); OSError or ValueError naming the
    file and the fix, never its content."""
    key = Path(path).read_bytes().strip()
    if len(key) < MINIMUM_KEY_BYTES:
        raise ValueError(f"probe key file {path} holds {len(key)} bytes; it needs at least {MINIMUM_KEY_BYTES} "
                         "(make one with: head -c 32 /dev/urandom | base64 > FILE)")
    return key
