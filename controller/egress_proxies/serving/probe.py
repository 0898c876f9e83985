"""Probing a proxy *through itself*: does traffic sent to this endpoint reach the probe target?

"The instance runs and has an IP" is not what a crawler needs; this module answers the question
a crawler would ask, from the controller, for many proxies at once. Every check goes to the
operator's own probe target (``ProbeDestination``: its URLs and the key of ``proof``) and
carries a fresh nonce; an answer counts only with the target's proof of that nonce, so an
endpoint that answers by itself (a 204 of its own, a CONNECT 200 that goes nowhere, an echo
with an invented address) never passes:

1. **HTTP check** -- ``GET <http_url>?<nonce>`` in absolute form through the proxy (what a
   crawler's plain HTTP request is), expecting ``expected_status`` and the proof in
   ``PROOF_HEADER``. It authenticates with the instance's own identity when the target has one
   (``ProbeTarget.identity``: a user only that instance's squid knows), so an answer from another
   instance at this address (an address found by ARP that belongs to another guest) is a 407,
   not "serving". ``Cache-Control: no-cache`` keeps a caching proxy out of the way.
2. **Egress echo** (full probes, when ``egress_echo_url`` is set) -- ``GET <echo>?<nonce>``,
   whose JSON body is ``{"ip": <the caller's address>, "proof": echo_proof(key, nonce, ip)}``: the
   proxy's egress address (``ProbeOutcome.egress_ip``), which may differ from the address we
   connect to (NAT, ``tcp_outgoing_address``), and cannot be invented.
3. **CONNECT check** (when ``connect`` is set) -- ``CONNECT host:port`` through the proxy,
   expecting ``200``, then a plain ``GET <path>?<nonce>`` sent *through the tunnel* to the probe
   target's tunnel port (it speaks plain HTTP there; squid tunnels to 443 only), expecting the
   proof back: the tunnel reached the target, not just a proxy willing to say 200.
4. **Privacy** (full probes, when ``expect_private``) -- on a connection that has never carried
   valid credentials: the HTTP check without credentials, the HTTP check with a made-up user and
   password, then the CONNECT check without credentials; each must be refused (407, or 403). A
   proxy that lets any of them through (a drop-in accepting any password, an ``http_access
   allow`` before the policy) is not private. Reported in ``ProbeOutcome.private``; it does not
   change ``serving``: an open proxy does serve, it is just not fit to be handed out.

Checks 1-3 run in that order on one kept-alive connection (a tunnel ends it) and the first
failure ends the probe. The privacy check runs first on that same connection, before any
request with credentials, when the proxy served at its last probe (``probe_one(answered=True)``,
which the monitor knows): one connection per probe instead of two. Otherwise (a new instance, one
failing) it runs beside checks 1-3 on a connection of its own, so a proxy that answers nothing
costs one check timeout, not two (one that served and hangs now costs two, once: it is failing
after that). A *full* probe runs all four; the others
(``probe_one(full=False)``) only 1 and 3, which is what a round mostly needs (egress address and
privacy change rarely; ``monitor`` decides which probe is full).

Requests whose order is fixed and whose credentials are the same go out together (HTTP/1.1
pipelining): the privacy check's three, and the egress echo with the CONNECT behind it; each
answer is read and judged in turn, exactly as if the requests had been sent one by one, and a
connection the proxy ends early gets the rest again on a new one (``_Connection``). The HTTP
check (the instance's identity) is always answered before anything with the namespace's
credentials is sent, so another instance at this address never sees them.

``reason`` says *how* the proxy failed (``ConnectionRefused``, ``Timeout``,
``ProxyAuthenticationRequired`` -- a 407 is never healthy --, ``UnexpectedStatus``,
``TargetNotReached`` for an answer without a valid proof), and *which* check failed when the
HTTP check passed but a later one did not (``ConnectFailed``, ``EgressEchoFailed``). A message
never carries bytes of the answer beyond its status code (an endpoint may echo what we sent,
credentials included): the reason and fixed words say the rest.

``check_destination`` asks the probe target directly, not through any proxy (its HTTP URL, its
tunnel port, its echo; or only its control listener, ``control_url``): the monitor tells a
target that does not answer from proxies that fail
with it (``ProbeTargetUnreachable``: nothing is known of the proxy then).

Only the proxy endpoint and the probe target are ever connected to. ``Prober(allowed_networks=
...)`` refuses (``NotAllowed``, nothing sent) an endpoint outside the given networks; providers
whose instances the controller cannot reach say ``probe: none`` and are never probed.
Credentials go into ``Proxy-Authorization`` only; they are never in a repr, a message or a log.

Protocol: raw HTTP/1.1 over ``loop.create_connection`` with a protocol of our own
(``serving.received``: cheaper than asyncio's streams), persistent and pipelined connections
(``_Connection``),
heads read and parsed by ``egress_proxies.http1`` (as the probe target and the controller's HTTP
server do); the figures are in docs/performance.md (bench/probe_bench.py).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import functools
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar
from urllib.parse import urlsplit

from egress_proxies.http1 import MAX_HEAD_BYTES, MalformedHead, ResponseHead, parse_response, read_head
from egress_proxies.resources import times
from egress_proxies.serving.proof import PROOF_HEADER, new_nonce, proves_answer, proves_echo, with_nonce
from egress_proxies.serving.received import ReceivedBytes

log = logging.getLogger(__name__)

# An echo body at most.
_MAX_BODY_BYTES = 4 * 1024
# A refusal's error page (squid's 407 page is ~3.5 KiB) is read past to keep the connection.
_MAX_DISCARD_BYTES = 64 * 1024
_USER_AGENT = "egress-proxies-probe/2"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
T = TypeVar("T")


class ProbeConfigError(ValueError):
    """A probe target or prober setting that cannot work; the message names the field and the fix."""


class ProbeReason(enum.StrEnum):
    """Why a proxy is (not) serving; the ``Serving`` condition's reason."""

    SERVING = "Serving"
    # The proxy endpoint itself:
    CONNECTION_REFUSED = "ConnectionRefused"  # nothing listens at host:port
    TIMEOUT = "Timeout"  # no (complete) answer within the check timeout
    UNREACHABLE = "Unreachable"  # any other connection error (no route, host unreachable, reset)
    BAD_RESPONSE = "BadResponse"  # the answer is not HTTP, or the connection closed mid-answer
    PROXY_AUTHENTICATION_REQUIRED = "ProxyAuthenticationRequired"  # 407 on any check
    UNEXPECTED_STATUS = "UnexpectedStatus"  # the HTTP check's status is not the expected one
    TARGET_NOT_REACHED = "TargetNotReached"  # the HTTP check's answer has no valid proof of its nonce
    # A later check, once the HTTP check passed:
    CONNECT_FAILED = "ConnectFailed"
    EGRESS_ECHO_FAILED = "EgressEchoFailed"
    # Never contacted: the endpoint is outside Prober(allowed_networks=...).
    NOT_ALLOWED = "NotAllowed"
    # Nothing is known of the proxy (the Serving condition is Unknown): the probe target does not
    # answer the controller directly, or the provider names none.
    PROBE_TARGET_UNREACHABLE = "ProbeTargetUnreachable"
    PROBE_NOT_CONFIGURED = "ProbeNotConfigured"

    @property
    def unknown(self) -> bool:
        """The probe says nothing about the proxy (neither success nor failure)."""
        return self in (ProbeReason.PROBE_TARGET_UNREACHABLE, ProbeReason.PROBE_NOT_CONFIGURED)


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

    @classmethod
    def made_up(cls) -> ProbeCredentials:
        """A user and password no proxy of ours knows: a private proxy refuses them."""
        return cls(f"probe-{secrets.token_hex(6)}", secrets.token_urlsafe(18))


@dataclass(frozen=True)
class ProbeDestination:
    """The probe target the checks reach through a proxy: ``http_url`` (an ``http://`` URL; it
    answers ``expected_status`` with the proof), ``connect`` (``host:port`` of its tunnel port
    for the CONNECT check; None: no CONNECT check), ``egress_echo_url`` (None: no egress
    address), ``proof_key`` (the shared key), and ``check_timeout``, seconds for one check.
    ``control_url``: the target's control listener, where ``Prober.check_destination`` asks
    instead (None: it asks the URLs above)."""

    http_url: str
    proof_key: bytes = field(repr=False)
    expected_status: int = 204
    connect: str | None = None
    egress_echo_url: str | None = None
    check_timeout: float = 5.0
    control_url: str | None = None

    def __post_init__(self) -> None:
        _http_url_parts(self.http_url, "http_url")
        if not self.proof_key:
            raise ProbeConfigError("proof_key must be the probe target's key (probe.keyFile), not empty")
        if not 100 <= self.expected_status <= 599:
            raise ProbeConfigError(f"expected_status must be an HTTP status (100-599), got {self.expected_status}")
        if self.connect is not None:
            _connect_target_parts(self.connect, "connect_target")
        if self.egress_echo_url is not None:
            _http_url_parts(self.egress_echo_url, "egress_echo_url")
        if self.control_url is not None:
            _http_url_parts(self.control_url, "control_url")
        if not self.check_timeout > 0:
            raise ProbeConfigError(f"check_timeout must be positive, got {self.check_timeout}")

    @functools.cached_property
    def tunnel_path(self) -> str:
        """What the CONNECT check asks for through the tunnel: the HTTP URL's path and query."""
        parts = urlsplit(self.http_url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    @functools.cached_property
    def tunnel_host(self) -> str:
        """The Host of a request through the tunnel: the CONNECT target's host."""
        return _connect_target_parts(self.connect, "connect")[0] if self.connect else ""

    def host_of(self, url: str) -> str:
        """The Host header of a request for ``url`` (one of this destination's URLs), worked out once."""
        return self._hosts[url]

    @functools.cached_property
    def _hosts(self) -> dict[str, str]:
        return {url: _http_url_parts(url, "url")[0] for url in (self.http_url, self.egress_echo_url) if url}


@dataclass(frozen=True)
class ProbeTarget:
    """One proxy endpoint and the destination to check through it.

    ``key`` identifies the target in the result. ``host`` is the address the controller
    connects to (an IP address; a name only without an allowlist), ``port`` the proxy port.
    ``credentials``: the namespace's (None: the proxy is open); ``identity``: the instance's own
    user (None: none, the HTTP check uses ``credentials``). ``expect_private``: also verify that
    requests without valid credentials are refused.
    """

    key: str
    host: str
    port: int
    destination: ProbeDestination
    credentials: ProbeCredentials | None = field(default=None, repr=False)
    identity: ProbeCredentials | None = field(default=None, repr=False)
    expect_private: bool = False

    def __post_init__(self) -> None:
        where = f"probe target {self.key!r}"
        if not self.key:
            raise ProbeConfigError("probe target key must be non-empty (the instance's providerID and address)")
        if not self.host or any(ch in self.host for ch in " /\r\n"):
            raise ProbeConfigError(f"{where}: host must be the proxy's address, got {self.host!r}")
        if not 0 < self.port < 65536:
            raise ProbeConfigError(f"{where}: port must be 1-65535, got {self.port}")

    @property
    def endpoint(self) -> str:
        return _join_host_port(self.host, self.port)


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe of one proxy found.

    ``serving``: every configured check passed. ``reason``/``message``: see ``ProbeReason``;
    the message never holds credentials nor bytes of the answer. ``latency_seconds``: the HTTP
    check, from opening the connection to the proxy to the end of the response headers, less the
    privacy check's requests when they went first on that connection (None when it got no
    answer). ``egress_ip``: from the egress echo, None without one. ``private`` (only with
    ``expect_private``): True when requests without valid credentials were refused
    (407/403), False when the proxy served one, None when not checked (``expect_private`` off, a
    probe that was not full, the proxy not serving) or inconclusive; ``privacy_message`` says
    which. ``probed_at``: when the probe of this proxy started (UTC). ``full``: the egress echo
    and the privacy check ran (see the module docstring).
    """

    serving: bool
    reason: ProbeReason
    message: str
    latency_seconds: float | None
    egress_ip: str | None
    private: bool | None
    privacy_message: str
    probed_at: datetime
    full: bool = True


def unknown_outcome(reason: ProbeReason, message: str, probed_at: datetime) -> ProbeOutcome:
    """An outcome that says nothing of the proxy (``reason`` is one of the unknown ones)."""
    return ProbeOutcome(serving=False, reason=reason, message=message, latency_seconds=None, egress_ip=None,
                        private=None, privacy_message="not checked: the probe target is the problem",
                        probed_at=probed_at, full=False)


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
    # From sending the request to the end of the answer's head, and opening the connection it
    # went on (whichever request opened it).
    seconds: float


async def run_workers(items: Iterable[T], workers: int, deadline_at: float, work: Callable[[T], Awaitable[None]],
                      clock: Callable[[], float] = time.monotonic) -> int:
    """``work`` on each item, ``workers`` at a time, in order; an item not started by
    ``deadline_at`` (on ``clock``) is not started at all. A started one runs to its end (each
    check has its own timeout). Returns how many were started."""
    queue = iter(items)
    started = 0

    async def worker() -> None:
        nonlocal started
        for item in queue:
            if clock() >= deadline_at:
                return
            started += 1
            await work(item)

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))
    return started


class Prober:
    """Probes proxies (``probe_one``, or ``probe_all`` for a batch) and asks probe targets
    directly (``check_destination``); see the module docstring for the checks.

    ``allowed_networks``: when given, only endpoints whose ``host`` is an address inside one of
    these networks are contacted; others are reported ``NotAllowed`` without any traffic.
    """

    def __init__(self, *, allowed_networks: Sequence[str | Network] | None = None,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = times.now) -> None:
        self.allowed_networks: tuple[Network, ...] | None = None
        if allowed_networks is not None:
            try:
                self.allowed_networks = tuple(ipaddress.ip_network(net) for net in allowed_networks)
            except ValueError as err:
                raise ProbeConfigError(f"probe allowed_networks: {err} (write networks as CIDR, e.g. "
                                       "10.0.0.0/8)") from err
        self.clock = clock
        self.now = now

    # -- entry points ------------------------------------------------------------------------

    def probe_all(self, targets: Iterable[ProbeTarget], *, concurrency: int = 200,
                  deadline: float = 30.0) -> dict[str, ProbeOutcome]:
        """Full probes of every target, ``concurrency`` at a time; blocks the calling (non-async)
        thread on an event loop of its own. Targets not started within ``deadline`` seconds get no
        outcome. Never raises for a target's failure."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.probe_all_async(targets, concurrency=concurrency, deadline=deadline))
        # Blocking inside a running loop would stall every other task on it.
        raise RuntimeError("Prober.probe_all() was called from a running event loop; await probe_all_async()")

    async def probe_all_async(self, targets: Iterable[ProbeTarget], *, concurrency: int = 200,
                              deadline: float = 30.0) -> dict[str, ProbeOutcome]:
        """Probe every target on the running loop; the same contract as ``probe_all``."""
        if concurrency < 1 or deadline <= 0:
            raise ProbeConfigError(f"probe concurrency must be at least 1 and the deadline positive, got "
                                   f"{concurrency} and {deadline}")
        unique: dict[str, ProbeTarget] = {}
        for target in targets:
            if target.key in unique:
                raise ProbeConfigError(f"probe target key {target.key!r} appears twice; keys must be unique")
            unique[target.key] = target
        results: dict[str, ProbeOutcome] = {}

        async def one(target: ProbeTarget) -> None:
            results[target.key] = await self.probe_one(target)

        await run_workers(unique.values(), concurrency, self.clock() + deadline, one, self.clock)
        return results

    async def probe_one(self, target: ProbeTarget, *, full: bool = True, answered: bool = False) -> ProbeOutcome:
        """Probe one target on the running loop; ``full`` adds the egress echo and the privacy
        check. ``answered``: the proxy served at its last probe, so the privacy check goes first on
        the probe's one connection; otherwise beside the other checks, on a connection of its own
        (the module docstring says why)."""
        probed_at = self.now()
        refusal = self._refusal(target)
        if refusal:
            return _failed(ProbeReason.NOT_ALLOWED, refusal, probed_at, None, full)
        privacy_first = full and target.expect_private and answered
        privacy_check = (asyncio.ensure_future(self._privacy(target, None))
                         if full and target.expect_private and not answered else None)
        connection = _Connection(self, target.host, target.port, target.destination.check_timeout)
        latency: list[float] = []
        privacy: tuple[bool | None, str] = (None, "not checked")
        try:
            if privacy_first:
                privacy = await self._privacy(target, connection)
            egress_ip = await self._serving_checks(target, full, latency, connection)
        except _CheckFailed as failure:
            if privacy_check is not None:
                privacy_check.cancel()
                await asyncio.wait([privacy_check])  # its connection closes before we return
            return _failed(failure.reason, failure.message, probed_at, latency[0] if latency else None, full)
        except BaseException:
            # Cancelled (the controller stopping): the privacy check goes with it.
            if privacy_check is not None:
                privacy_check.cancel()
            raise
        finally:
            connection.close()
        private, privacy_message = await privacy_check if privacy_check is not None else privacy
        destination = target.destination
        message = (f"serving: GET {destination.http_url} through {target.endpoint} answered "
                   f"{destination.expected_status} from the probe target")
        if destination.connect is not None:
            message += f", CONNECT {destination.connect} reached it"
        if egress_ip is not None:
            message += f", egress address {egress_ip}"
        return ProbeOutcome(serving=True, reason=ProbeReason.SERVING, message=message,
                            latency_seconds=latency[0] if latency else None, egress_ip=egress_ip, private=private,
                            privacy_message=privacy_message, probed_at=probed_at, full=full)

    async def check_destination(self, destination: ProbeDestination) -> str | None:
        """Ask the probe target directly (no proxy): None when its HTTP URL, its tunnel port and
        its echo answer with valid proofs, else why not (never bytes of the answer). With a
        ``control_url``, its control listener's proof alone: the listener strangers cannot fill
        (``serving.target``), in the process that serves the rest."""
        checks: list[tuple[str, str, int]] = [(destination.control_url or destination.http_url, "", 0)]
        if destination.connect is not None and destination.control_url is None:
            host, port = _connect_target_parts(destination.connect, "connect")
            checks.append((destination.http_url, host, port))
        if destination.egress_echo_url is not None and destination.control_url is None:
            checks.append((destination.egress_echo_url, "", 0))
        for url, host, port in checks:
            try:
                await self._direct(destination, url, host, port)
            except _CheckFailed as failure:
                return failure.message
        return None

    # -- the checks ----------------------------------------------------------------------------

    async def _serving_checks(self, target: ProbeTarget, full: bool, latency: list[float],
                              connection: _Connection) -> str | None:
        """Checks 1-3 on ``connection``; returns the egress address (None without echo)."""
        destination = target.destination
        auth = target.credentials.header_value() if target.credentials else None
        identity = target.identity.header_value() if target.identity else auth
        egress_ip: str | None = None
        nonce = new_nonce()
        what = "GET " + destination.http_url
        response = await connection.request(
            _get_request(with_nonce(destination.http_url, nonce), destination.host_of(destination.http_url),
                         identity), what)
        latency.append(response.seconds)
        self._expect(target, response, what, identity, destination.expected_status, ProbeReason.UNEXPECTED_STATUS)
        _expect_proof(destination, nonce, response, ProbeReason.TARGET_NOT_REACHED, f"{what} through {target.endpoint}")
        # The echo and the CONNECT carry the same credentials, so the CONNECT goes out right
        # behind the echo (pipelined): no round trip of its own, nothing the proxy has not seen.
        connect = _connect_request(destination.connect, auth) if destination.connect is not None else None
        if full and destination.egress_echo_url is not None:
            egress_ip = await self._echo(connection, target, auth, then=(connect,) if connect else ())
        if connect is not None:
            await self._tunnel(connection, target, auth, connect)
        return egress_ip

    async def _echo(self, connection: _Connection, target: ProbeTarget, auth: str | None,
                    then: Sequence[bytes]) -> str:
        """The egress echo; ``then``: the request that follows it (the connection's ``then``)."""
        destination = target.destination
        assert destination.egress_echo_url is not None  # called only with an echo URL
        nonce = new_nonce()
        what = "GET " + destination.egress_echo_url
        response = await self._later_check(
            connection, _get_request(with_nonce(destination.egress_echo_url, nonce),
                                     destination.host_of(destination.egress_echo_url), auth), what,
            ProbeReason.EGRESS_ECHO_FAILED, keep_body=True, then=then)
        self._expect(target, response, what, auth, 200, ProbeReason.EGRESS_ECHO_FAILED)
        return _echoed_address(destination, nonce, response.body, f"{what} through {target.endpoint}")

    async def _tunnel(self, connection: _Connection, target: ProbeTarget, auth: str | None, connect: bytes) -> None:
        """CONNECT (the request ``connect``), then the probe target's proof from the other end of the tunnel."""
        destination = target.destination
        assert destination.connect is not None  # called only with a CONNECT target
        what = "CONNECT " + destination.connect
        response = await self._later_check(connection, connect, what, ProbeReason.CONNECT_FAILED, tunnel=True)
        self._expect(target, response, what, auth, 200, ProbeReason.CONNECT_FAILED)
        nonce = new_nonce()
        inner = _origin_request(destination.tunnel_host, with_nonce(destination.tunnel_path, nonce), close=True)
        through = f"{what} through {target.endpoint}, then GET through the tunnel"
        response = await self._later_check(connection, inner, through, ProbeReason.CONNECT_FAILED, retry=False)
        if response.status != destination.expected_status:
            raise _CheckFailed(ProbeReason.CONNECT_FAILED, f"ConnectFailed: {through} answered {response.status}, "
                                                           f"expected {destination.expected_status}")
        _expect_proof(destination, nonce, response, ProbeReason.CONNECT_FAILED, through)

    async def _direct(self, destination: ProbeDestination, url: str, host: str, port: int) -> None:
        """One request straight to the probe target: ``url`` at its own host, or (``host``) its
        path at the tunnel port ``host:port``; raises _CheckFailed with the target as the problem."""
        parts = urlsplit(url)
        connection = _Connection(self, host or str(parts.hostname), port or parts.port or 80,
                                 destination.check_timeout, direct=True)
        nonce = new_nonce()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        echo = not host and url == destination.egress_echo_url
        what = f"GET {path if host else url} (the probe target, asked directly{' at its tunnel port' if host else ''})"
        try:
            response = await connection.request(_origin_request(host or parts.netloc, with_nonce(path, nonce)),
                                                what, keep_body=echo)
        except _CheckFailed as failure:
            raise _CheckFailed(ProbeReason.PROBE_TARGET_UNREACHABLE,
                               f"ProbeTargetUnreachable: {failure.message}") from None
        finally:
            connection.close()
        expected = 200 if echo else destination.expected_status
        if response.status != expected:
            raise _CheckFailed(ProbeReason.PROBE_TARGET_UNREACHABLE,
                               f"ProbeTargetUnreachable: {what} at {connection.endpoint} answered {response.status}, "
                               f"expected {expected}")
        try:
            if echo:
                _echoed_address(destination, nonce, response.body, what)
            else:
                _expect_proof(destination, nonce, response, ProbeReason.TARGET_NOT_REACHED, what)
        except _CheckFailed as failure:
            raise _CheckFailed(ProbeReason.PROBE_TARGET_UNREACHABLE,
                               f"ProbeTargetUnreachable: {failure.message} (is probe.keyFile the key the probe "
                               "target was started with?)") from None

    def _refusal(self, target: ProbeTarget) -> str | None:
        if self.allowed_networks is None:
            return None
        inside = _inside(target.host, self.allowed_networks)
        if inside is None:
            return (f"NotAllowed: {target.host!r} is not an IP address and probing is limited to "
                    f"{_networks(self.allowed_networks)}; nothing was sent")
        if inside:
            return None
        return (f"NotAllowed: {target.endpoint} is outside the probe's allowed networks "
                f"{_networks(self.allowed_networks)}; nothing was sent")

    def _expect(self, target: ProbeTarget, response: _Response, what: str, auth: str | None, expected: int,
                reason: ProbeReason) -> None:
        if response.status == expected:
            return
        through = f"{what} through {target.endpoint}"
        if response.status == 407:
            sent = ("with the configured credentials: they are wrong or not (yet) known to the proxy, or another "
                    "instance answers at this address" if auth
                    else "without credentials, and the proxy requires them: configure the probe's credentials")
            raise _CheckFailed(ProbeReason.PROXY_AUTHENTICATION_REQUIRED,
                               f"ProxyAuthenticationRequired: {through} answered 407 {sent}")
        raise _CheckFailed(reason, f"{reason} {response.status}: {through} answered {response.status}, "
                                   f"expected {expected}")

    async def _later_check(self, connection: _Connection, request: bytes, what: str, reason: ProbeReason,
                           *, keep_body: bool = False, tunnel: bool = False, retry: bool = True,
                           then: Sequence[bytes] = ()) -> _Response:
        """A check after the HTTP check passed: its transport failure is that check's failure."""
        try:
            return await connection.request(request, what, keep_body=keep_body, tunnel=tunnel, retry=retry,
                                            then=then)
        except _CheckFailed as failure:
            raise _CheckFailed(reason, f"{reason}: {failure.message}") from None

    async def _privacy(self, target: ProbeTarget, shared: _Connection | None) -> tuple[bool | None, str]:
        """Check 4, on ``shared`` (the probe's connection, before any request with credentials; left
        open only when every request was refused) or, when None, on a connection of its own."""
        if target.credentials is None:
            return False, "NOT private: the proxy served the checks without credentials"
        destination = target.destination
        made_up = ProbeCredentials.made_up().header_value()
        host = destination.host_of(destination.http_url)
        checks = [(f"GET {destination.http_url} without credentials", _get_request(destination.http_url, host, None),
                   False),
                  (f"GET {destination.http_url} with a made-up user and password",
                   _get_request(destination.http_url, host, made_up), False)]
        if destination.connect is not None:
            # Last: a CONNECT let through makes the connection a tunnel, and nothing may follow it.
            checks.append((f"CONNECT {destination.connect} without credentials",
                           _connect_request(destination.connect, None), True))
        requests = [request for _, request, _ in checks]
        refused: list[str] = []
        # A connection that never carried valid credentials: a proxy that authenticates connections
        # rather than requests must not count an earlier login for these. The requests go out
        # together (pipelined) and each answer is judged in turn, as if sent one by one.
        connection = shared or _Connection(self, target.host, target.port, destination.check_timeout)
        all_refused = False
        try:
            for index, (what, request, tunnel) in enumerate(checks):
                try:
                    response = await connection.request(request, what, tunnel=tunnel, then=requests[index + 1:])
                except _CheckFailed as failure:
                    return None, f"inconclusive: {failure.message}"
                if response.status not in (403, 407):
                    # Anything but a refusal means the proxy let the request through its access
                    # rules (a 502 or 503 is the proxy trying the origin on our behalf).
                    return False, (f"NOT private: {what} through {target.endpoint} answered {response.status}, "
                                   "not 407 or 403")
                refused.append(f"{what} {response.status}")
            all_refused = True
        finally:
            # Shared, it carries the serving checks next: not a tunnel, nor answers still to come.
            if shared is None or not all_refused:
                connection.close()
        return True, "requests without valid credentials refused (" + ", ".join(refused) + ")"


class _Stale(Exception):
    """A kept-alive connection turned out closed before any byte of the answer."""


class _Connection:
    """Requests to one endpoint over one HTTP/1.1 persistent connection, reopened when it ends.

    Reuse is what keeps a round cheap: connecting and closing dominate a check's CPU on the
    controller's side (kernel work, measured with bench/probe_bench.py), so the checks of one
    proxy share a connection unless the proxy ends it (``Connection: close``, a body delimited by
    the end of the connection). Like any HTTP client, a request that meets a reused connection
    already closed by the peer is sent again once, on a new one. After a CONNECT answered 2xx the
    connection is the tunnel: the next request goes through it, and nothing after that.

    A caller that knows its next requests names them (``then``): they are written right behind
    the request (HTTP/1.1 pipelining) and their answers read by the ``request`` calls that follow,
    in order, each judged as if it had been sent alone; a send and a wait of the event loop saved
    per request (docs/performance.md, "A full probe on one connection"). When the peer ends the
    connection before answering them, they are written again on a new one by the calls that
    follow. A CONNECT is only ever the last of them (what follows a tunnel's 200 goes through it).
    """

    def __init__(self, prober: Prober, host: str, port: int, timeout: float, direct: bool = False) -> None:
        self._prober = prober
        self._host = host
        self._port = port
        self._timeout = timeout
        self._via = "at" if direct else "through"  # the endpoint is the server itself, or a proxy
        self._received: ReceivedBytes | None = None
        # Written on this connection ahead of time, not answered yet, in order.
        self._ahead: list[bytes] = []
        self._connect_seconds = 0.0  # how long opening this connection took

    @property
    def endpoint(self) -> str:
        return _join_host_port(self._host, self._port)

    async def request(self, request: bytes, what: str, *, keep_body: bool = False, tunnel: bool = False,
                      retry: bool = True, then: Sequence[bytes] = ()) -> _Response:
        """Send ``request`` (unless it went out already behind an earlier one), read its answer;
        ``keep_body`` returns the body, ``tunnel`` marks a CONNECT, ``retry`` False never resends
        (a request through a tunnel), ``then``: the requests the next calls make, in order (see
        the class docstring)."""
        try:
            return await self._request(request, what, keep_body, tunnel, then)
        except _Stale:
            if not retry:
                raise _CheckFailed(ProbeReason.BAD_RESPONSE,
                                   f"BadResponse: {what} {self._via} {self.endpoint}: the connection closed before "
                                   "any answer") from None
            return await self._request(request, what, keep_body, tunnel, then)

    def close(self, abort: bool = False) -> None:
        transport = self._received.transport if self._received is not None else None
        if transport is not None:
            if abort:
                # A peer that never answers may never read either: do not wait on a FIN.
                transport.abort()
            else:
                transport.close()
        self._received = None
        self._ahead = []  # lost with the connection: written again by the calls that make them

    async def _exchange(self, request: bytes, keep_body: bool, tunnel: bool,
                        then: Sequence[bytes]) -> tuple[_Response, bool]:
        written = bool(self._ahead) and self._ahead[0] == request
        if self._ahead and not written:
            self.close(abort=True)  # answers to requests the caller gave up on would come first
        reused = self._received is not None
        started = self._prober.clock()
        # The check's whole budget: connecting (when it does), sending, the answer's head and body.
        deadline = asyncio.get_running_loop().time() + self._timeout
        if self._received is None:
            await self._open(deadline)
            self._connect_seconds = self._prober.clock() - started
            started += self._connect_seconds
        reader = self._received
        assert reader is not None and reader.transport is not None  # connected
        reader.answer_by(deadline)
        if written:
            del self._ahead[0]
        else:
            assert not (tunnel and then), "nothing is written behind a CONNECT: it would go through the tunnel"
            reader.transport.write(b"".join((request, *then)) if then else request)
            self._ahead = list(then)
        try:
            head = await read_head(reader)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
            if reused and not getattr(err, "partial", b""):
                raise _Stale from None
            raise
        seconds = self._prober.clock() - started + self._connect_seconds
        answer = parse_response(head)
        body, reusable = await _read_body(reader, answer, keep_body=keep_body, tunnel=tunnel)
        tunnelled = tunnel and 200 <= answer.status < 300
        return _Response(answer.status, answer.headers, body, seconds), reusable or tunnelled

    async def _open(self, deadline: float) -> None:
        received = ReceivedBytes(MAX_HEAD_BYTES)
        self._received = received
        # A timer for connecting only: the reads after it have the connection's own (answer_by).
        async with asyncio.timeout_at(deadline):
            await asyncio.get_running_loop().create_connection(lambda: received, self._host, self._port)

    async def _request(self, request: bytes, what: str, keep_body: bool, tunnel: bool,
                       then: Sequence[bytes]) -> _Response:
        through = f"{what} {self._via} {self.endpoint}"
        completed = False
        try:
            response, keep_open = await self._exchange(request, keep_body, tunnel, then)
            completed = True
            if not keep_open:
                self.close()
            return response
        except TimeoutError:
            raise _CheckFailed(ProbeReason.TIMEOUT,
                               f"Timeout: {through}: no complete answer within {self._timeout:g}s") from None
        except ConnectionRefusedError:
            raise _CheckFailed(ProbeReason.CONNECTION_REFUSED,
                               f"ConnectionRefused: nothing accepts connections at {self.endpoint}") from None
        except asyncio.LimitOverrunError:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE, f"BadResponse: {through}: response headers exceed "
                                                         f"{MAX_HEAD_BYTES} bytes") from None
        except asyncio.IncompleteReadError as err:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE,
                               f"BadResponse: {through}: the connection closed after {len(err.partial)} bytes, "
                               "before a complete answer") from None
        except (MalformedHead, _MalformedResponse) as err:
            raise _CheckFailed(ProbeReason.BAD_RESPONSE, f"BadResponse: {through}: {err}") from None
        except OSError as err:
            raise _CheckFailed(ProbeReason.UNREACHABLE,
                               f"Unreachable: {through}: {err.strerror or type(err).__name__}") from None
        finally:
            if not completed:
                self.close(abort=True)


class _MalformedResponse(ValueError):
    """An answer that is not HTTP; its message is fixed words only (the answer may echo secrets)."""


def _failed(reason: ProbeReason, message: str, probed_at: datetime, latency: float | None,
            full: bool) -> ProbeOutcome:
    return ProbeOutcome(serving=False, reason=reason, message=message, latency_seconds=latency, egress_ip=None,
                        private=None, privacy_message="not checked: the proxy is not serving", probed_at=probed_at,
                        full=full)


def _expect_proof(destination: ProbeDestination, nonce: str, response: _Response, reason: ProbeReason,
                  through: str) -> None:
    if not proves_answer(destination.proof_key, nonce, response.headers.get(PROOF_HEADER.lower())):
        raise _CheckFailed(reason, f"{reason}: {through}: the answer carries no valid proof of the probe's nonce, "
                                   "so it did not come from the probe target")


@functools.lru_cache(maxsize=65536)
def _inside(host: str, networks: tuple[Network, ...]) -> bool | None:
    """Whether the address ``host`` is inside one of ``networks`` (None: not an address); kept, as
    every round asks it again for every endpoint."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return any(address in network for network in networks)


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
        raise ProbeConfigError(f"{where} must be host:port (port 1-65535), e.g. 'probe.example.net:443', "
                               f"got {value!r}")
    if any(ch in value for ch in " /\r\n\0"):
        raise ProbeConfigError(f"{where} must be host:port without spaces or '/', got {value!r}")
    return host.strip("[]"), int(port_text)


def _request_lines(first: str, host: str, auth: str | None, *extra: str) -> bytes:
    lines = [first, f"Host: {host}", f"User-Agent: {_USER_AGENT}", *extra]
    if auth:
        lines.append(f"Proxy-Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _get_request(url: str, host: str, auth: str | None) -> bytes:
    """A GET of ``url`` (whose Host is ``host``) in absolute form, for a proxy."""
    # A cached answer would prove nothing about the way out (see the module docstring).
    return _request_lines(f"GET {url} HTTP/1.1", host, auth, "Accept: */*", "Cache-Control: no-cache",
                          "Pragma: no-cache")


def _origin_request(host: str, path: str, close: bool = False) -> bytes:
    """A GET in origin form, for the probe target itself (directly, or through a tunnel)."""
    return _request_lines(f"GET {path} HTTP/1.1", host, None, "Accept: */*",
                          *(["Connection: close"] if close else []))


def _connect_request(target: str, auth: str | None) -> bytes:
    return _request_lines(f"CONNECT {target} HTTP/1.1", target, auth)


async def _read_chunked(reader: ReceivedBytes, limit: int, keep_body: bool) -> bytes | None:
    """A chunked body (None: longer than ``limit`` and not wanted, the connection is not reusable)."""
    body = b""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _MalformedResponse("a chunk size line is not a hexadecimal number") from None
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are ever sent to us; the final CRLF
            return body
        if len(body) + size > limit:
            if keep_body:
                raise _MalformedResponse(f"the body exceeds {_MAX_BODY_BYTES} bytes")
            return None
        body += await reader.readexactly(size)
        await reader.readexactly(2)  # the chunk's CRLF


async def _read_body(reader: ReceivedBytes, answer: ResponseHead, *, keep_body: bool,
                     tunnel: bool) -> tuple[bytes, bool]:
    """(body, whether the connection can carry another request) for one response.

    ``keep_body``: the caller wants the body (at most _MAX_BODY_BYTES, else BadResponse);
    otherwise up to _MAX_DISCARD_BYTES are read past, and a longer or EOF-delimited body ends
    the connection instead of being read.
    """
    status, headers, reusable = answer.status, answer.headers, answer.keep_alive
    if tunnel and 200 <= status < 300:
        return b"", False  # the connection is the tunnel now
    if status < 200 or status in (204, 304):
        return b"", reusable and status >= 200
    limit = _MAX_BODY_BYTES if keep_body else _MAX_DISCARD_BYTES
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunked = await _read_chunked(reader, limit, keep_body)
        return (chunked if keep_body and chunked is not None else b""), reusable and chunked is not None
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise _MalformedResponse("the Content-Length is not a number") from None
        if length > limit:
            if keep_body:
                raise _MalformedResponse(f"a body of {length} bytes exceeds {_MAX_BODY_BYTES}")
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
    raise _MalformedResponse(f"the body exceeds {_MAX_BODY_BYTES} bytes")


def _echoed_address(destination: ProbeDestination, nonce: str, body: bytes, through: str) -> str:
    """The address an egress-echo body names, once its proof checks out (``{"ip", "proof"}``)."""
    try:
        document = json.loads(body.decode("utf-8"))
        echoed, answer = document["ip"], document["proof"]
        address = str(ipaddress.ip_address(echoed))
    except (ValueError, KeyError, TypeError):
        raise _CheckFailed(ProbeReason.EGRESS_ECHO_FAILED, f"EgressEchoFailed: {through}: the body is not the probe "
                                                           "target's echo (a JSON object with ip and proof)") from None
    # The proof covers the address as the target wrote it; reported in its canonical form.
    if not isinstance(answer, str) or not proves_echo(destination.proof_key, nonce, echoed, answer):
        raise _CheckFailed(ProbeReason.EGRESS_ECHO_FAILED, f"EgressEchoFailed: {through}: the echoed address carries "
                                                           "no valid proof, so it did not come from the probe target")
    return address
