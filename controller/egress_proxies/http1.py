"""The one HTTP/1.1 head parser: the probe's client (``serving.probe``), the probe target
(``serving.target``) and the controller's HTTP server (``http_server``) all read a request or
response line and its header fields here, and stop at the same size.

Only what the three need, and no more: the start line, the header fields by lower-case name,
and whether the connection carries another message. Bodies are each caller's own (the server
reads at most a small JSON body, the target reads none, the probe reads an echo or reads past an
error page). Our own rather than a library's because it is the probe's inner loop: h11, measured
for the same work, cost ~17x the CPU per request (docs/performance.md, "One HTTP/1.1 parser").

A head is read with ``read_head`` from an ``asyncio.StreamReader`` made with
``limit=MAX_HEAD_BYTES`` (``asyncio.start_server``), or the probe's ``serving.received``
protocol made with that limit, so nothing longer than that is ever buffered: a longer head raises
``asyncio.LimitOverrunError``. A malformed one raises
``MalformedHead``, whose message is fixed words only: a head may echo what was sent to it,
credentials included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The request or status line and the header fields, with the blank line that ends them.
MAX_HEAD_BYTES = 16 * 1024
_END = b"\r\n\r\n"


class HeadSource(Protocol):
    """What a head is read from: an ``asyncio.StreamReader``, or anything that reads like one."""

    async def readuntil(self, separator: bytes = ..., /) -> bytes: ...


class MalformedHead(ValueError):
    """Not an HTTP/1.x head; the message is fixed words only."""


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names; the first of repeated fields

    @property
    def keep_alive(self) -> bool:
        return _keep_alive(self.version, self.headers)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    version: str
    status: int
    headers: dict[str, str]  # lower-case names; the first of repeated fields

    @property
    def keep_alive(self) -> bool:
        return _keep_alive(self.version, self.headers)


async def read_head(reader: HeadSource) -> bytes:
    """The next head from ``reader``, without its final blank line. Raises what ``readuntil``
    raises: ``IncompleteReadError`` (the peer closed first), ``LimitOverrunError`` (longer than
    the reader's limit, ``MAX_HEAD_BYTES``)."""
    return (await reader.readuntil(_END))[:-4]


def parse_request(head: bytes) -> RequestHead:
    """``METHOD target HTTP/1.x`` and the header fields."""
    start, headers = _split(head)
    parts = start.split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].startswith("HTTP/1."):
        raise MalformedHead("not an HTTP/1.x request line")
    return RequestHead(parts[0], parts[1], parts[2], headers)


def parse_response(head: bytes) -> ResponseHead:
    """``HTTP/1.x status [reason]`` and the header fields."""
    start, headers = _split(head)
    parts = start.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise MalformedHead("not an HTTP/1.x status line")
    return ResponseHead(parts[0], int(parts[1]), headers)


def _split(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.setdefault(name.strip().lower(), value.strip())
    return lines[0], headers


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    """HTTP/1.1 keeps the connection unless told ``close``; HTTP/1.0 only when told ``keep-alive``."""
    connection = headers.get("connection", "").lower()
    return connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
