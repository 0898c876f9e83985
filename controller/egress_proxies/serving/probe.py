"""Probing a proxy *through itself*: does traffic sent to this endpoint actually go out?

"The instance runs and has an IP" is not what a crawler needs; this module answers the question
a crawler would ask, from the controller, for many proxies at once:

1. **HTTP check** -- ``GET <http_url>`` in absolute form through the proxy (what a crawler's plain
   HTTP request is), expecting ``expected_status`` (a ``generate_204``-style URL answers 204).
   It proves the proxy accepts our request (with our credentials) and fetched the URL from its
   own side. ``Cache-Control: no-cache`` keeps a caching proxy from answering out of its cache
   (a 204 is cacheable by default), which would prove nothing about the way out.
2. **Egress echo** (when ``egress_echo_url`` is set) -- ``GET`` of a URL whose body is the
   caller's address, as the origin sees it: that is the proxy's egress address
   (``ProbeOutcome.egress_ip``), which may differ from the address we connect to (NAT, a
   ``tcp_outgoing_address``). Any self-hosted service works: plain-text body, or a JSON object
   with ``ip`` (ipify style) or ``origin`` (httpbin style).
3. **CONNECT check** (when ``connect_target`` is set) -- ``CONNECT host:port`` through the proxy,
   expecting ``200``. Squid sends that 200 only after its own TCP connection to ``host:port`` is
   up (a refused port gets 503, tested), so it proves the proxy allows tunnels from us to that
   port and can reach it. Nothing is sent through the tunnel: no TLS handshake, so it says
   nothing about certificates or the origin's TLS stack -- only that HTTPS traffic has a way out.
4. **Privacy** (when ``expect_private``) -- the proxy must refuse a request that carries no
   credentials with 407 (or 403). With credentials configured, the HTTP check and the CONNECT
   check are each sent once more without them; without credentials configured, the checks
   above were already credential-less, so a proxy that served them is not private. Privacy is
   reported in ``ProbeOutcome.private`` and does not change ``serving``: an open proxy does
   serve, it is just not fit to be handed out (the caller decides that).

Checks 1-3 run in that order (the CONNECT check last: a tunnel that opens ends the connection
they share) and the first failure ends the probe of that proxy; the privacy check runs beside
them on a connection of its own and counts only when the proxy serves. ``reason`` says *how* the
proxy failed when the proxy itself failed (``ConnectionRefused``, ``Timeout``,
``ProxyAuthenticationRequired`` -- a 407 is never healthy --, ``UnexpectedStatus`` for the HTTP
check's status), and *which* check failed when the proxy answered the HTTP check but not a later
one (``ConnectFailed``, ``EgressEchoFailed``); ``message`` carries the details
("UnexpectedStatus 403: ..."). Reasons are CamelCase without spaces, valid Kubernetes condition
reasons as they stand.

Only the proxy endpoint is ever connected to; the URLs and the CONNECT target are fetched by the
proxy, from its side. ``Prober(allowed_networks=...)`` refuses (``NotAllowed``, nothing sent) an
endpoint outside the given networks. Where a provider's instances are not reachable from the
controller, or libvirt's test driver stands in with made-up addresses, the provider is not
probed at all (``probe: none`` in the provider config, wired by the reconciler): the prober
only ever sees targets that the caller decided are real and reachable.

Credentials go into ``Proxy-Authorization`` only; they are never in a repr, a message or a log.

Protocol: raw HTTP/1.1 over ``asyncio.open_connection``, persistent connections: the checks
with credentials share one connection, the privacy checks another that never carried any
(``_Connection``). Five short exchanges per proxy do not need an HTTP client library; the
figures are in docs/performance.md (bench/probe_bench.py).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from egress_proxies.resources import times

log = logging.getLogger(__name__)

# What the proxy (or origin) may send before the end of the headers, and an echo body at most.
_MAX_HEADER_BYTES = 16 * 1024
_MAX_BODY_BYTES = 4 * 1024
# A refusal's error page (squid's 407 page is ~3.5 KiB) is read past to keep the connection.
_MAX_DISCARD_BYTES = 64 * 1024
_USER_AGENT = "egress-proxies-probe/1"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProbeConfigError(ValueError):
    """A probe target or prober setting that cannot work; the message names the field and the fix."""


class ProbeReason(enum.StrEnum):
    """Why a proxy is (not) serving; the ``Serving`` condition's reason."""

    SERVING = "Serving"
    # The proxy endpoint itself:
    CONNECTION_REFUSED = "ConnectionRefused"  # nothing listens at host:port
    TIMEOUT = "Timeout"  # no (complete) answer within the check timeout or the round's deadline
    UNREACHABLE = "Unreachable"  # any other connection error (no route, host unreachable, reset)
    BAD_RESPONSE = "BadResponse"  # the answer is not HTTP, or the connection closed mid-answer
    PROXY_AUTHENTICATION_REQUIRED = "ProxyAuthenticationRequired"  # 407 on any check
    UNEXPECTED_STATUS = "UnexpectedStatus"  # the HTTP check's status is not the expected one
    # A later check, once the HTTP check passed:
    CONNECT_FAILED = "ConnectFailed"
    EGRESS_ECHO_FAILED = "EgressEchoFailed"
    # Never contacted: the endpoint is outside Prober(allowed_networks=...).
    NOT_ALLOWED = "NotAllowed"


@dataclass(frozen=True)
class ProbeCredentials:
    """Basic proxy credentials. The password is left out of the repr."""

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        # Basic auth joins user and password with ':' and the server splits at the first one.
        if not self.user or ":" in self.user:
            raise ProbeConfigError("credentials.user must be non-empty and contain no ':' (Basic auth splits there)")
        for name, value in (("user", self.user), ("password", self.password)):
            if any(ch in value for ch in "\r\n\0"):
                raise ProbeConfigError(f"credentials.{name} must not contain CR, LF or NUL")

    def header_value(self) -> str:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        return f"Basic {token}"


@dataclass(frozen=True)
class ProbeTarget:
    """One proxy endpoint and what to check through it.

    ``key`` identifies the target in the result (the Proxy's uid). ``host`` is the address the
    controller connects to (an IP address; a name only without an allowlist), ``port`` the
    proxy port. ``http_url`` is an ``http://`` URL (the HTTPS path is the CONNECT check),
    ``connect_target`` a ``host:port`` for the CONNECT check (None: no CONNECT check),
    ``egress_echo_url`` an ``http://`` URL whose body is the caller's address (None: no egress
    address). ``expect_private``: also verify that a request without credentials is refused.
    """

    key: str
    host: str
    port: int
    http_url: str
    expected_status: int = 204
    connect_target: str | None = None
    egress_echo_url: str | None = None
    credentials: ProbeCredentials | None = field(default=None, repr=False)
    expect_private: bool = False

    def __post_init__(self) -> None:
        where = f"probe target {self.key!r}"
        if not self.key:
            raise ProbeConfigError("probe target key must be non-empty (the Proxy's uid)")
        if not self.host or any(ch in self.host for ch in " /\r\n"):
            raise ProbeConfigError(f"{where}: host must be the proxy's address, got {self.host!r}")
        if not 0 < self.port < 65536:
            raise ProbeConfigError(f"{where}: port must be 1-65535, got {self.port}")
        _http_url_parts(self.http_url, f"{where}: http_url")
        if not 100 <= self.expected_status <= 599:
            raise ProbeConfigError(f"{where}: expected_status must be an HTTP status (100-599), "
                                   f"got {self.expected_status}")
        if self.connect_target is not None:
            _connect_target_parts(self.connect_target, f"{where}: connect_target")
        if self.egress_echo_url is not None:
            _http_url_parts(self.egress_echo_url, f"{where}: egress_echo_url")

    @property
    def endpoint(self) -> str:
        return _join_host_port(self.host, self.port)


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe of one proxy found.

    ``serving``: every configured check passed. ``reason``/``message``: see ``ProbeReason``;
    the message never holds credentials. ``latency_seconds``: the HTTP check, from opening the
    connection to the proxy to the end of the response headers (None when it got no answer).
    ``egress_ip``: from the egress echo, None without one. ``private`` (only with
    ``expect_private``): True when requests without credentials were refused (407/403; also
    when the probe itself had none and got 407), False when the proxy served one, None when not
    checked (``expect_private`` off, or the proxy is not serving) or inconclusive;
    ``privacy_message`` says which. ``probed_at``: when the probe of this proxy started (UTC).
    """

    serving: bool
    reason: ProbeReason
    message: str
    latency_seconds: float | None
    egress_ip: str | None
    private: bool | None
    privacy_message: str
    probed_at: datetime


class _CheckFailed(Exception):
    def __init__(self, reason: ProbeReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float


class Prober:
    """Probes many proxies concurrently; see the module docstring for the checks.

    ``concurrency``: proxies probed at once (each holds one connection at a time, two with
    ``expect_private`` and credentials: the privacy check runs beside the others).
    ``check_timeout``: seconds for one check, connecting included. ``deadline``: seconds for a
    whole ``probe_all``; proxies not finished by then are reported ``Timeout``.
    ``allowed_networks``: when given, only endpoints whose ``host`` is an address inside one of
    these networks are contacted; others are reported ``NotAllowed`` without any traffic.
    """

    def __init__(
        self,
        *,
        concurrency: int = 200,
        check_timeout: float = 5.0,
        deadline: float = 30.0,
        allowed_networks: Sequence[str | Network] | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = times.now,
    ) -> None:
        if concurrency < 1:
            raise ProbeConfigError(f"probe concurrency must be at least 1, got {concurrency}")
        if check_timeout <= 0 or deadline <= 0:
            raise ProbeConfigError(f"probe check_timeout and deadline must be positive, got {check_timeout} "
                                   f"and {deadline}")
        self.concurrency = concurrency
        self.check_timeout = check_timeout
        self.deadline = deadline
        self.allowed_networks: tuple[Network, ...] | None = None
        if allowed_networks is not None:
            try:
                self.allowed_networks = tuple(ipaddress.ip_network(net) for net in allowed_networks)
            except ValueError as err:
                raise ProbeConfigError(f"probe allowed_networks: {err} (write networks as CIDR, e.g. "
                                       "10.0.0.0/8)") from err
        self._clock = clock
        self._now = now

    # -- entry points ------------------------------------------------------------------------

    def probe_all(self, targets: Iterable[ProbeTarget]) -> dict[str, ProbeOutcome]:
        """Probe every target; blocks the calling (non-async) thread on an event loop of its own.

        Never raises for a target's failure: every key gets an outcome.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.probe_all_async(targets))
        # Blocking inside a running loop would stall every other task on it.
        raise RuntimeError("Prober.probe_all() was called from a running event loop; await probe_all_async()")

    async def probe_all_async(self, targets: Iterable[ProbeTarget]) -> dict[str, ProbeOutcome]:
        """Probe every target on the running loop; the same contract as ``probe_all``."""
        unique: dict[str, ProbeTarget] = {}
        for target in targets:
            if target.key in unique:
                raise ProbeConfigError(f"probe target key {target.key!r} appears twice; keys must be unique")
            unique[target.key] = target
        if not unique:
            return {}
        semaphore = asyncio.Semaphore(self.concurrency)
        started_at = self._now()

        async def bounded(target: ProbeTarget) -> ProbeOutcome:
            async with semaphore:
                return await self.probe_one(target)

        tasks = {key: asyncio.ensure_future(bounded(target)) for key, target in unique.items()}
        done, pending = await asyncio.wait(tasks.values(), timeout=self.deadline)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        results: dict[str, ProbeOutcome] = {}
        for key, task in tasks.items():
            if task in done and not task.cancelled():
                results[key] = task.result()
            else:
                results[key] = _outcome(
                    ProbeReason.TIMEOUT,
                    f"Timeout: the probe round's deadline of {self.deadline:g}s passed before this proxy's probe "
                    f"finished ({len(unique)} proxies, {self.concurrency} at a time)",
                    started_at)
        failed = sum(1 for outcome in results.values() if not outcome.serving)
        log.debug("probed %d proxies: %d serving, %d not", len(results), len(results) - failed, failed)
        return results

    async def probe_one(self, target: ProbeTarget) -> ProbeOutcome:
        """Probe one target on the running loop (no deadline beyond the per-check timeouts)."""
        probed_at = self._now()
        refusal = self._refusal(target)
        if refusal:
            return _outcome(ProbeReason.NOT_ALLOWED, refusal, probed_at)
        auth = target.credentials.header_value() if target.credentials else None
        latency: float | None = None
        egress_ip: str | None = None
        # The privacy check has a connection of its own, so it runs beside the others: a probe
        # takes three round trips, not five. Its answer counts only if the proxy serves.
        privacy_check = asyncio.ensure_future(self._privacy(target)) if target.expect_private else None
        # The checks share one kept-alive connection; the CONNECT check goes last because a
        # tunnel that opens ends the connection's life as an HTTP one.
        connection = _Connection(self, target)
        try:
            what = "GET " + target.http_url
            response = await connection.request(_get_request(target.http_url, auth), what)
            latency = response.seconds
            self._expect(target, response, what, auth, target.expected_status, ProbeReason.UNEXPECTED_STATUS)
            if target.egress_echo_url is not None:
                what = "GET " + target.egress_echo_url
                response = await self._later_check(connection, _get_request(target.egress_echo_url, auth), what,
                                                   ProbeReason.EGRESS_ECHO_FAILED, keep_body=True)
                self._expect(target, response, what, auth, 200, ProbeReason.EGRESS_ECHO_FAILED)
                egress_ip = _echoed_address(response.body, f"{what} through {target.endpoint}")
            if target.connect_target is not None:
                what = "CONNECT " + target.connect_target
                response = await self._later_check(connection, _connect_request(target.connect_target, auth), what,
                                                   ProbeReason.CONNECT_FAILED, tunnel=True)
                self._expect(target, response, what, auth, 200, ProbeReason.CONNECT_FAILED)
        except _CheckFailed as failure:
            if privacy_check is not None:
                privacy_check.cancel()
                await asyncio.wait([privacy_check])  # its connection closes before we return
            private: bool | None = None
            privacy = "not checked: the proxy is not serving"
            if (target.expect_private and target.credentials is None
                    and failure.reason is ProbeReason.PROXY_AUTHENTICATION_REQUIRED):
                private, privacy = True, "a request without credentials got 407"
            return ProbeOutcome(serving=False, reason=failure.reason, message=failure.message,
                                latency_seconds=latency, egress_ip=None, private=private,
                                privacy_message=privacy, probed_at=probed_at)
        except BaseException:
            # Cancelled by the round's deadline: the privacy check goes with it.
            if privacy_check is not None:
                privacy_check.cancel()
            raise
        finally:
            connection.close()
        private, privacy = await privacy_check if privacy_check is not None else (None, "not checked")
        message = f"serving: GET {target.http_url} through {target.endpoint} answered {target.expected_status}"
        if target.connect_target is not None:
            message += f", CONNECT {target.connect_target} answered 200"
        if egress_ip is not None:
            message += f", egress address {egress_ip}"
        return ProbeOutcome(serving=True, reason=ProbeReason.SERVING, message=message, latency_seconds=latency,
                            egress_ip=egress_ip, private=private, privacy_message=privacy, probed_at=probed_at)

    # -- the checks ----------------------------------------------------------------------------

    def _refusal(self, target: ProbeTarget) -> str | None:
        if self.allowed_networks is None:
            return None
        try:
            address = ipaddress.ip_address(target.host)
        except ValueError:
            return (f"NotAllowed: {target.host!r} is not an IP address and probing is limited to "
                    f"{_networks(self.allowed_networks)}; nothing was sent")
        if any(address in network for network in self.allowed_networks):
            return None
        return (f"NotAllowed: {target.endpoint} is outside the probe's allowed networks "
                f"{_networks(self.allowed_networks)}; nothing was sent")

    def _expect(self, target: ProbeTarget, response: _Response, what: str, auth: str | None, expected: int,
                reason: ProbeReason) -> None:
        if response.status == expected:
            return
        through = f"{what} through {target.endpoint}"
        if response.status == 407:
            sent = ("with the configured credentials: they are wrong or not (yet) known to the proxy" if auth
                    else "without credentials, and the proxy requires them: configure the probe's credentials")
            raise _CheckFailed(ProbeReason.PROXY_AUTHENTICATION_REQUIRED,
                               f"ProxyAuthenticationRequired: {through} answered 407 {sent}")
        raise _CheckFailed(reason, f"{reason} {response.status}: {through} answered {response.status}, "
                                   f"expected {expected}")

    async def _later_check(self, connection: _Connection, request: bytes, what: str, reason: ProbeReason,
                           *, keep_body: bool = False, tunnel: bool = False) -> _Response:
        """A check after the HTTP check passed: its transport failure is that check's failure."""
        try:
            return await connection.request(request, what, keep_body=keep_body, tunnel=tunnel)
        except _CheckFailed as failure:
            raise _CheckFailed(reason, f"{reason}: {failure.message}") from None

    async def _privacy(self, target: ProbeTarget) -> tuple[bool | None, str]:
        if target.credentials is None:
            return False, "NOT private: the proxy served the checks without credentials"
        checks = [("GET " + target.http_url, _get_request(target.http_url, None), False)]
        if target.connect_target is not None:
            checks.append(("CONNECT " + target.connect_target, _connect_request(target.connect_target, None), True))
        refused: list[str] = []
        # A connection of its own that never carried credentials: a proxy that authenticates
        # connections rather than requests must not count an earlier login for these.
        connection = _Connection(self, target)
        try:
            for what, request, tunnel in checks:
                try:
                    response = await connection.request(request, what, tunnel=tunnel)
                except _CheckFailed as failure:
                    return None, f"inconclusive: {what} without credentials: {failure.message}"
                if response.status not in (403, 407):
                    # Anything but a refusal means the proxy let the request through its access
                    # rules (a 502 or 503 is the proxy trying the origin on our behalf).
                    return False, (f"NOT private: {what} without credentials through {target.endpoint} answered "
                                   f"{response.status}, not 407 or 403")
                refused.append(f"{what} {response.status}")
        finally:
            connection.close()
        return True, "requests without credentials refused (" + ", ".join(refused) + ")"


class _Stale(Exception):
    """A kept-alive connection turned out closed before any byte of the answer."""


class _Connection:
    """Requests to one proxy over one HTTP/1.1 persistent connection, reopened when it ends.

    Reuse is what keeps a round cheap: connecting and closing dominate a check's CPU on the
    controller's side (kernel work, measured with bench/probe_bench.py), so the checks of one
    proxy share a connection unless the proxy ends it (``Connection: close``, a body delimited by
    the end of the connection, a tunnel). Like any HTTP client, a request that meets a reused
    connection already closed by the proxy is sent again once, on a new one.
    """

    def __init__(self, prober: Prober, target: ProbeTarget) -> None:
        self._prober = prober
        self._target = target
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, request: bytes, what: str, *, keep_body: bool = False,
                      tunnel: bool = False) -> _Response:
        """Send ``request``, read its answer; ``keep_body`` returns the body, ``tunnel`` marks a CONNECT."""
        try:
            return await self._request(request, what, keep_body, tunnel)
        except _Stale:
            return await self._request(request, what, keep_body, tunnel)

    def close(self, abort: bool = False) -> None:
        if self._writer is not None:
            if abort:
                # A peer that never answers may never read either: do not wait on a FIN.
                self._writer.transport.abort()
            else:
                self._writer.close()
        self._reader = self._writer = None

    async def _request(self, request: bytes, what: str, keep_body: bool, tunnel: bool) -> _Response:
        target, timeout = self._target, self._prober.check_timeout
        through = f"{what} through {target.endpoint}"
        reused = self._writer is not None
        completed = False
        try:
            async with asyncio.timeout(timeout):
                started = self._prober._clock()
                if self._reader is None or self._writer is None:
                    self._reader, self._writer = await asyncio.open_connection(target.host, target.port,
                                                                               limit=_MAX_HEADER_BYTES)
                reader = self._reader
                self._writer.write(request)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
                    if reused and not getattr(err, "partial", b""):
                        raise _Stale from None
                    raise
                seconds = self._prober._clock() - started
                version, status, headers = _parse_head(head[:-4])
                body, reusable = await _read_body(reader, version, status, headers, keep_body=keep_body,
                                                  tunnel=tunnel)
            completed = True
            if not reusable:
                self.close()
            return _Response(status, headers, body, seconds)
        except TimeoutError:
            raise _CheckFailed(ProbeReason.TIMEOUT,
                               f"Timeout: {through}: no complete answer within {timeout:g}s") from None
        except ConnectionRefusedError:
            raise _CheckFailed(ProbeReason.CONNECTION_REFUSED,
                               f"ConnectionRefused: nothing accepts connections at {target.endpoint}") from None
        except asyncio.LimitOverrunError:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE,
                               f"BadResponse: {through}: response headers exceed "
                               f"{_MAX_HEADER_BYTES} bytes") from None
        except asyncio.IncompleteReadError as err:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE,
                               f"BadResponse: {through}: the connection closed after {len(err.partial)} bytes, "
                               "before a complete answer") from None
        except _MalformedResponse as err:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE, f"BadResponse: {through}: {err}") from None
        except OSError as err:
            raise _CheckFailed(ProbeReason.UNREACHABLE,
                               f"Unreachable: {through}: {err.strerror or err}") from None
        finally:
            if not completed:
                self.close(abort=True)


class _MalformedResponse(ValueError):
    pass


def _outcome(reason: ProbeReason, message: str, probed_at: datetime) -> ProbeOutcome:
    return ProbeOutcome(serving=False, reason=reason, message=message, latency_seconds=None, egress_ip=None,
                        private=None, privacy_message="not checked: the proxy was not probed", probed_at=probed_at)


def _networks(networks: Sequence[Network]) -> str:
    return ", ".join(str(network) for network in networks)


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _http_url_parts(url: str, where: str) -> tuple[str, str]:
    """(netloc, url) of an ``http://host[:port]/path`` URL, or ProbeConfigError naming ``where``."""
    if any(ch in url for ch in " \r\n\0"):
        raise ProbeConfigError(f"{where} must be a URL without spaces or control characters, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ProbeConfigError(f"{where} must be an http:// URL with a host (HTTPS is what connect_target "
                               f"checks), got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ProbeConfigError(f"{where} must not carry user information; proxy credentials go in "
                               "credentials")
    try:
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as err:
        raise ProbeConfigError(f"{where}: {err}, got {url!r}") from err
    return parts.netloc, url


def _connect_target_parts(value: str, where: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ProbeConfigError(f"{where} must be host:port (port 1-65535), e.g. 'www.example.org:443', "
                               f"got {value!r}")
    if any(ch in value for ch in " /\r\n\0"):
        raise ProbeConfigError(f"{where} must be host:port without spaces or '/', got {value!r}")
    return host, int(port_text)


def _get_request(url: str, auth: str | None) -> bytes:
    netloc, _ = _http_url_parts(url, "url")
    lines = [
        f"GET {url} HTTP/1.1",
        f"Host: {netloc}",
        f"User-Agent: {_USER_AGENT}",
        "Accept: */*",
        # A cached answer would prove nothing about the way out (see the module docstring).
        "Cache-Control: no-cache",
        "Pragma: no-cache",
    ]
    if auth:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _connect_request(target: str, auth: str | None) -> bytes:
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}", f"User-Agent: {_USER_AGENT}"]
    if auth:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = lines[0].split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit() or len(fields[1]) != 3:
        raise _MalformedResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return fields[0], int(fields[1]), headers


async def _read_body(reader: asyncio.StreamReader, version: str, status: int, headers: dict[str, str], *,
                     keep_body: bool, tunnel: bool) -> tuple[bytes, bool]:
    """(body, whether the connection can carry another request) for one response.

    ``keep_body``: the caller wants the body (at most _MAX_BODY_BYTES, else BadResponse);
    otherwise up to _MAX_DISCARD_BYTES are read past, and a longer or EOF-delimited body ends
    the connection instead of being read.
    """
    connection = headers.get("connection", "").lower()
    reusable = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
    if tunnel and 200 <= status < 300:
        return b"", False  # the connection is the tunnel now
    if status < 200 or status in (204, 304):
        return b"", reusable and status >= 200
    limit = _MAX_BODY_BYTES if keep_body else _MAX_DISCARD_BYTES
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _MalformedResponse(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are ever sent to us; the final CRLF
                return (body if keep_body else b""), reusable
            if len(body) + size > limit:
                if keep_body:
                    raise _MalformedResponse(f"body exceeds {_MAX_BODY_BYTES} bytes")
                return b"", False
            body += await reader.readexactly(size)
            await reader.readexactly(2)  # the chunk's CRLF
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise _MalformedResponse(f"bad Content-Length {headers['content-length'][:40]!r}") from None
        if length > limit:
            if keep_body:
                raise _MalformedResponse(f"body of {length} bytes exceeds {_MAX_BODY_BYTES}")
            return b"", False
        body = await reader.readexactly(length)
        return (body if keep_body else b""), reusable
    # Neither: the end of the connection delimits the body.
    if not keep_body:
        return b"", False
    body = b""
    while len(body) <= _MAX_BODY_BYTES:
        more = await reader.read(_MAX_BODY_BYTES + 1 - len(body))
        if not more:
            return body, False
        body += more
    raise _MalformedResponse(f"body exceeds {_MAX_BODY_BYTES} bytes")


def _echoed_address(body: bytes, through: str) -> str:
    """The address an egress-echo body names: plain text, or JSON with ``ip`` / ``origin``."""
    text = body.decode("utf-8", errors="replace").strip()
    candidate = text
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        candidate = ""
        if isinstance(document, dict):
            value = document.get("ip", document.get("origin"))
            candidate = value.strip() if isinstance(value, str) else ""
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        raise _CheckFailed(ProbeReason.EGRESS_ECHO_FAILED,
                           f"EgressEchoFailed: {through}: the body is not an address "
                           f"(plain text, or JSON with 'ip' or 'origin'): {text[:60]!r}") from None
