"""One proxy as discovery hands it out, with its credentials, and how a discovery answer is read."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit


class DiscoveryFormatError(ValueError):
    """A discovery answer that is not the controller's JSON shape."""


@dataclass(frozen=True)
class Proxy:
    """A proxy from discovery. ``url`` carries the credentials (``http://user:password@host:port``);
    ``address`` is the same without them, for clients that send ``Proxy-Authorization`` themselves.

    The password is never part of ``repr`` or ``str``, so logging a Proxy logs no secret."""

    namespace: str
    name: str
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    provider_id: str | None = None
    egress_ip: str | None = None

    @property
    def key(self) -> str:
        """``namespace/name``: the Proxy resource, which keeps its name across replacements."""
        return f"{self.namespace}/{self.name}"

    @property
    def instance(self) -> tuple[str, str, str]:
        """The instance behind the Proxy now: a replacement (a new providerID) is a new instance."""
        return self.namespace, self.name, self.provider_id or f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The proxy URL with credentials (percent-encoded), as ``requests`` and ``curl -x`` take it."""
        if self.username is None:
            return self.address
        userinfo = f"{quote(self.username, safe='')}:{quote(self.password or '', safe='')}"
        return self.address.replace("http://", f"http://{userinfo}@", 1)

    @property
    def proxy_authorization(self) -> str | None:
        """The ``Proxy-Authorization`` header value (Basic), or None for a proxy without credentials."""
        if self.username is None:
            return None
        pair = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")

    def __str__(self) -> str:
        return f"{self.key} ({self.host}:{self.port})"


def parse_entry(entry: Mapping[str, Any]) -> Proxy | None:
    """One entry of ``{"proxies": [...]}``; None for an entry without an address yet.

    A scoped token's entries carry ``url`` with the namespace's credentials; the operator's token
    gets ``endpoint`` only (no credentials)."""
    namespace, name = entry.get("namespace"), entry.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise DiscoveryFormatError(f"a discovery entry without namespace and name: keys {sorted(entry)}")
    raw = entry.get("url") or (f"http://{entry['endpoint']}" if entry.get("endpoint") else None)
    if not isinstance(raw, str):
        return None
    parts = urlsplit(raw)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise DiscoveryFormatError(f"{namespace}/{name}: not an http://host:port proxy address")
    provider_id, egress_ip = entry.get("providerID"), entry.get("egressIP")
    return Proxy(namespace=namespace, name=name, host=parts.hostname, port=port,
                 username=unquote(parts.username) if parts.username is not None else None,
                 password=unquote(parts.password) if parts.password is not None else None,
                 provider_id=provider_id if isinstance(provider_id, str) else None,
                 egress_ip=egress_ip if isinstance(egress_ip, str) else None)


def parse_listing(body: bytes) -> tuple[Proxy, ...]:
    """The proxies of a discovery answer (``/v1/.../proxies``), in the controller's order."""
    try:
        document = json.loads(body)
    except ValueError as error:
        raise DiscoveryFormatError(f"discovery answered something that is not JSON ({error})") from None
    entries = document.get("proxies") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise DiscoveryFormatError('discovery answered JSON without a "proxies" list of objects')
    return tuple(proxy for proxy in map(parse_entry, entries) if proxy is not None)
