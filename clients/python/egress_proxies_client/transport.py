"""HTTP to the controller: one request per connection (the controller closes each one), stdlib only."""

from __future__ import annotations

import email.utils
import http.client
import ipaddress
import json
import logging
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from egress_proxies_client.version import __version__

USER_AGENT = f"egress-proxies-client/{__version__}"
log = logging.getLogger("egress_proxies_client")
# The controller refuses reasons longer than this (docs/contract.md, "Quarantine").
MAX_REASON = 512


class ControllerUnreachable(Exception):
    """No answer: the connection failed, timed out or broke (the message says which)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    etag: str | None = None
    retry_after: float | None = None

    def text(self) -> str:
        """The body as one line, for an error message (the controller's refusals are short text)."""
        return " ".join(self.body.decode("utf-8", "replace").split())[:300]


@dataclass(frozen=True)
class Scope:
    """What a client lists: every namespace of its token, one namespace, or one ProxyPool."""

    namespace: str | None = None
    pool: str | None = None

    @property
    def path(self) -> str:
        if self.pool is not None and self.namespace is not None:
            return f"/v1/pools/{quote(self.namespace, safe='')}/{quote(self.pool, safe='')}/proxies"
        if self.namespace is not None:
            return f"/v1/namespaces/{quote(self.namespace, safe='')}/proxies"
        return "/v1/proxies"

    def __str__(self) -> str:
        if self.pool is not None:
            return f"pool {self.namespace}/{self.pool}"
        return f"namespace {self.namespace}" if self.namespace is not None else "every namespace of the token"


class Controller:
    """The controller's base URL and a crawler token; ``get`` and ``post`` answer or raise
    ``ControllerUnreachable``. The token only ever travels in the Authorization header."""

    def __init__(self, url: str, token: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: {url!r} is not the controller's http:// or https:// address "
                             "(e.g. http://egress-proxies.egress-proxies.svc:8080)")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("url: the controller's address takes no credentials, query or fragment; "
                             "the token goes in token=")
        check_token(token)
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            # Anyone on the path reads a token sent in clear; a crawler in the controller's own
            # cluster may accept that, so it is a warning, not a refusal.
            log.warning("egress proxies: the discovery token travels unencrypted to %s (http://, not loopback); "
                        "use the controller's https:// address where the network between is not trusted",
                        parts.hostname)
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._authorization = f"Bearer {token}"
        self.timeout = timeout

    def get(self, path: str, etag: str | None = None) -> Answer:
        headers = {"If-None-Match": etag} if etag else {}
        return self._request("GET", path, None, headers)

    def post_quarantine(self, namespace: str, name: str, reason: str) -> Answer:
        body = json.dumps({"reason": reason}).encode()
        path = f"/v1/proxies/{quote(namespace, safe='')}/{quote(name, safe='')}/quarantine"
        return self._request("POST", path, body, {"Content-Type": "application/json"})

    def _request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
        connection: http.client.HTTPConnection
        if self._https:
            connection = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            connection.request(method, self._prefix + path, body=body, headers={
                "Authorization": self._authorization, "User-Agent": USER_AGENT, "Accept": "application/json",
                **headers})
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise ControllerUnreachable(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                                        ) from None
        finally:
            connection.close()
        return Answer(response.status, data, response.headers.get("ETag"),
                      retry_after_seconds(response.headers.get("Retry-After")))


def check_token(token: str) -> None:
    """Refuse a token that cannot travel in a header as it is, naming the argument, never the value
    (an error message ends up in logs and tracebacks)."""
    if not token:
        raise ValueError("token: empty; give the discovery token the operator issued for your team")
    if any(character.isspace() or not character.isprintable() for character in token):
        raise ValueError("token: contains whitespace or a control character (the value is not shown); a token "
                         "file read with its newline? Strip it, e.g. Path(file).read_text().strip()")


def is_loopback(host: str) -> bool:
    """The host is this machine: ``localhost`` or a loopback address (traffic to it never leaves)."""
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delay-seconds or an HTTP-date (RFC 9110, 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))


def reason_text(reason: str) -> str:
    """A quarantine reason the controller accepts: one line, 1-512 characters."""
    text = " ".join(reason.split()) or "banned"
    return text[:MAX_REASON]
