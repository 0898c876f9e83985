"""Is each proxy serving? Background probing of every running instance, through itself, each
provider on its own.

The sweep hands ``ServingMonitor.watch`` the instances it found running (``Watched``: the
provider, the ``ProbeTarget`` built here by ``probe_target`` from the provider's probe settings
and the Proxy's overrides, and ``write_verdict``, which writes that Proxy's status from the
latest outcome) with each provider's settings, and reads outcomes (``outcome``, ``record``); it
never waits for a probe. The monitor's thread runs one event loop with a round per provider
every interval, so one provider's hung instances never delay another's verdicts:

- **Each provider has its own share**: ``probe.concurrency`` probes at once and a round that
  starts probes for at most ``probe.roundSeconds`` (the ones not started keep their last
  outcome); within it, instances whose last probe failed get a quarter of the share (a lane of
  their own), so hung ones do not hold up the healthy ones either. A new instance is probed at
  once, not an interval later.
- **A verdict is written when its own probe ends**: an outcome that changes queues that Proxy's
  ``write_verdict`` for the verdict thread (status and discovery), not for the next sweep; the
  outcomes that change within ``VERDICT_BATCH_SECONDS`` of each other are written together.
- **The probe target is asked directly** (``Prober.check_destination``) at the start of each
  round and again after a probe failed of an instance not already failing: while it does not
  answer, the outcome is ``Unknown`` (``ProbeTargetUnreachable``) and no probe is sent through a
  proxy. (An instance already failing fails either way: the next round's check tells an outage.)
- **Every proxy failing at once** (no probe of a provider passes in a round while at least two
  instances that had served fail) is a provider-wide failure, not theirs
  (``provider_failing_since``): the failure outcomes of instances that had served are held until
  the round ends, so the last serving set stays in discovery (for a bounded time, ``verdict``)
  and nothing is replaced for not serving while it lasts (``live``).
- **The failure clock is the probe's own record** (``record``): when an instance last served and
  since when it has failed without a single success in between; and its last ``probe.flapWindow``
  verdicts (``recent``, bounded), which tell a chronic flapper (``sweep.flapping``). The failures
  of a provider-wide failure are not its instances' own, and are not kept there.
- **Full probes** (egress echo and privacy) run for an instance's first probe, after any failure,
  and every ``full_every``-th probe; the others carry their privacy and egress address forward.

``probe_now`` runs one round of every provider in the caller's thread and writes the changed
verdicts there too (``--once``, ``--until-ready``, tests). Started by ``loop.Controller``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import Counter, Histogram

from egress_proxies import metrics
from egress_proxies.providers.client import Instance, ProbeSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.probe import (
    ProbeCredentials,
    ProbeDestination,
    ProbeOutcome,
    Prober,
    ProbeReason,
    ProbeTarget,
    run_workers,
    unknown_outcome,
)

log = logging.getLogger(__name__)

# Every how many probes of a serving instance the egress echo and the privacy check run again.
FULL_EVERY = 6
# The lane of instances whose last probe failed gets this share of a provider's concurrency.
SUSPECT_SHARE = 4  # one quarter
# How long the verdict thread lets changed outcomes gather before writing them.
VERDICT_BATCH_SECONDS = 0.05


def probe_target(settings: ProbeSettings, proxy: Proxy, instance: Instance, key: bytes,
                 credentials: ProbeCredentials | None = None) -> ProbeTarget:
    """What to check for this instance: the provider's checks, overridden by ``spec.probe``,
    against the probe target holding ``key``; with credentials, also that requests without valid
    ones are refused (the proxy is private), and the HTTP check as the instance's own identity."""
    override = proxy.spec.get("probe") or {}
    destination = ProbeDestination(
        http_url=str(override.get("httpUrl") or settings.http_url), proof_key=key,
        expected_status=int(override.get("expectStatus") or settings.expect_status),
        connect=override.get("connect", settings.connect) or None,
        egress_echo_url=override.get("egressEchoUrl") or settings.egress_echo_url,
        check_timeout=settings.timeout_seconds,
        # The provider's control listener is its own target's, which answers 204: a Proxy naming
        # another target (or another status) has that target asked directly at its own URLs.
        control_url=None if override.get("httpUrl") or override.get("expectStatus") else settings.control_url)
    identity = (ProbeCredentials(instance_identity(instance.name), credentials.password)
                if credentials is not None and instance.name else None)
    # The endpoint the provider reports (a node's or a load balancer's for an exposed Pod, the
    # hypervisor's published port): where crawlers connect, so where the probe does.
    host, _, port = str(instance.endpoint).rpartition(":")
    return ProbeTarget(key=target_key(instance), host=host.strip("[]"), port=int(port),
                       destination=destination, credentials=credentials, identity=identity,
                       expect_private=credentials is not None)


def instance_identity(instance_name: str) -> str:
    """The user only the instance of this name accepts (built into it beside the namespace's
    user, with the same password): the probe's HTTP check logs in as it, so another instance
    answering at this instance's address is refused (407) rather than taken for this one."""
    return "probe-" + hashlib.sha256(instance_name.encode()).hexdigest()[:20]


def target_key(instance: Instance) -> str:
    """An outcome belongs to one instance at one endpoint: a replacement is never judged by its
    predecessor's probe."""
    return f"{instance.provider_id}@{instance.endpoint}"


@dataclass(frozen=True)
class Watched:
    """One instance to probe. ``write_verdict``: writes its Proxy's status from the latest
    outcome (None: nothing to write, the sweep reads the outcome). ``served``: its status says it
    has served, so its failure counts toward a provider-wide one."""

    provider: str
    target: ProbeTarget
    write_verdict: Callable[[], None] | None = None
    served: bool = False


@dataclass(frozen=True)
class ProbeRecord:
    """What the probe knows of one instance: its latest outcome, when it last served (None: not
    since this process started), and since when it has failed without a success in between
    (None while it serves, or when nothing is known). ``recent``: whether each of its last probes
    passed (oldest first; at most its provider's ``flapWindow``; verdicts that say nothing of the
    proxy, and failures while its whole provider fails, left out)."""

    outcome: ProbeOutcome | None = None
    last_success: datetime | None = None
    failing_since: datetime | None = None
    probes: int = 0
    recent: tuple[bool, ...] = ()


@dataclass
class _Round:
    """One round of one provider: whether a probe passed yet, and the failures held until one does."""

    provider: str
    passed: bool = False
    held: list[tuple[str, ProbeOutcome]] = field(default_factory=list)
    # How many of the held failures are of instances last known serving: failing "at once".
    turned: int = 0


class _Destinations:
    """The probe targets' own answer, asked directly; a check is shared by every caller that
    accepts one started no earlier than ``after`` (a round's start, a failed probe's start)."""

    def __init__(self, prober: Prober) -> None:
        self.prober = prober
        self._done: dict[ProbeDestination, tuple[float, str | None]] = {}
        self._running: dict[ProbeDestination, tuple[float, asyncio.Future[str | None]]] = {}

    async def problem(self, destination: ProbeDestination, after: float) -> str | None:
        done = self._done.get(destination)
        if done is not None and done[0] >= after:
            return done[1]
        running = self._running.get(destination)
        if running is None or running[0] < after:
            started = self.prober.clock()
            running = (started, asyncio.ensure_future(self.prober.check_destination(destination)))
            self._running[destination] = running
        problem = await asyncio.shield(running[1])
        if self._running.get(destination) is running:
            del self._running[destination]
            self._done[destination] = (running[0], problem)
            if problem is not None:
                log.warning("probe target does not answer the controller directly: %s", problem)
        return problem


class ServingMonitor:
    def __init__(self, prober: Prober, interval_seconds: float = 10.0, full_every: int = FULL_EVERY) -> None:
        self.prober = prober
        self.interval_seconds = interval_seconds
        self.full_every = full_every
        self._lock = threading.Lock()
        self._watched: dict[str, Watched] = {}
        self._settings: dict[str, ProbeSettings] = {}
        self._records: dict[str, ProbeRecord] = {}
        self._provider_failing: dict[str, datetime] = {}
        self._pending: dict[str, None] = {}  # keys whose verdict is to be written, in order
        self._unprobed: set[str] = set()
        self._verdicts = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()

    # -- what the sweep calls ------------------------------------------------------------------

    def watch(self, watched: Mapping[str, Watched], settings: Mapping[str, ProbeSettings]) -> None:
        """The instances to probe from now on (every running instance of a probed provider)."""
        with self._lock:
            new = set(watched) - set(self._watched)
            self._watched = dict(watched)
            self._settings = dict(settings)
            self._records = {k: v for k, v in self._records.items() if k in watched}
            self._unprobed = {k for k in watched if k not in self._records}
            providers = {w.provider for w in watched.values()}
            self._provider_failing = {p: s for p, s in self._provider_failing.items() if p in providers}
        if new:
            self._poke()  # a new instance is probed at once, not an interval later

    def outcome(self, key: str) -> ProbeOutcome | None:
        with self._lock:
            record = self._records.get(key)
            return record.outcome if record is not None else None

    def record(self, key: str) -> ProbeRecord | None:
        with self._lock:
            return self._records.get(key)

    def provider_failing_since(self, provider: str) -> datetime | None:
        """Since when no probe of ``provider`` passes while instances that had served fail."""
        with self._lock:
            return self._provider_failing.get(provider)

    # -- running -------------------------------------------------------------------------------

    def probe_now(self) -> bool:
        """One round of every provider in the caller's thread, then the verdicts that changed,
        written here; True when any outcome changed."""
        with self._lock:
            providers = sorted({w.provider for w in self._watched.values()})
        if not providers:
            return False
        destinations = _Destinations(self.prober)

        async def every_round() -> None:
            await asyncio.gather(*(self._round(provider, destinations) for provider in providers))

        asyncio.run(every_round())
        return self._write_pending() > 0

    def run(self, stopping: threading.Event) -> None:
        """Probe until ``stopping``: the rounds on an event loop in this thread, the verdicts on a
        thread of their own."""
        writer = threading.Thread(target=self._verdict_loop, args=(stopping,), name="verdicts", daemon=True)
        writer.start()
        try:
            asyncio.run(self._serve(stopping))
        finally:
            self._stopping.set()
            with self._verdicts:
                self._verdicts.notify_all()
            writer.join(timeout=5)

    def stop(self) -> None:
        self._stopping.set()
        self._poke()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass  # the loop has ended

    async def _serve(self, stopping: threading.Event) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        destinations = _Destinations(self.prober)
        rounds: dict[str, asyncio.Task[None]] = {}
        try:
            while not (stopping.is_set() or self._stopping.is_set()):
                with self._lock:
                    providers = {w.provider for w in self._watched.values()}
                for provider in providers:
                    if provider not in rounds or rounds[provider].done():
                        rounds[provider] = asyncio.create_task(self._provider_loop(provider, destinations, stopping))
                try:
                    async with asyncio.timeout(1.0):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()
        finally:
            for task in rounds.values():
                task.cancel()
            await asyncio.gather(*rounds.values(), return_exceptions=True)

    async def _provider_loop(self, provider: str, destinations: _Destinations, stopping: threading.Event) -> None:
        """Rounds of one provider every interval, new instances in between; ends when the
        provider has nothing left to probe (``_serve`` starts it again when it has)."""
        clock = self.prober.clock
        while not (stopping.is_set() or self._stopping.is_set()):
            started = clock()
            try:
                if not await self._round(provider, destinations):
                    return
            except Exception:
                log.exception("probe round of provider %s failed", provider)
            while clock() < started + self.interval_seconds and not stopping.is_set():
                if self._has_unprobed(provider):
                    await self._round(provider, destinations, only_new=True)
                await asyncio.sleep(min(0.2, max(0.0, started + self.interval_seconds - clock())))

    def _has_unprobed(self, provider: str) -> bool:
        with self._lock:
            return any(self._watched[key].provider == provider for key in self._unprobed if key in self._watched)

    # -- one round -----------------------------------------------------------------------------

    async def _round(self, provider: str, destinations: _Destinations, only_new: bool = False) -> bool:
        """One round over ``provider``'s instances (``only_new``: those never probed); False when
        it has none."""
        clock = self.prober.clock
        started = clock()
        with self._lock:
            watched = [(k, w) for k, w in self._watched.items() if w.provider == provider
                       and not (only_new and k in self._records)]
            settings = self._settings.get(provider)
            records = {k: self._records.get(k) for k, _ in watched}
        if not watched or settings is None:
            return bool(watched)
        problems = {}
        for destination in {w.target.destination for _, w in watched}:
            problems[destination] = await destinations.problem(destination, after=started)
        state = _Round(provider)
        healthy: list[tuple[str, Watched]] = []
        suspects: list[tuple[str, Watched]] = []
        for key, item in watched:
            problem = problems[item.target.destination]
            if problem is not None:
                self._record(key, item, unknown_outcome(ProbeReason.PROBE_TARGET_UNREACHABLE, problem,
                                                        self.prober.now()), state)
                continue
            record = records[key]
            failing = record is not None and record.failing_since is not None
            (suspects if failing else healthy).append((key, item))
        share = settings.concurrency // SUSPECT_SHARE if suspects and healthy else 0
        deadline = started + settings.round_seconds

        async def probe(entry: tuple[str, Watched]) -> None:
            await self._probe(entry[0], entry[1], records[entry[0]], destinations, state)

        if share:
            await asyncio.gather(run_workers(healthy, settings.concurrency - share, deadline, probe, clock),
                                 run_workers(suspects, share, deadline, probe, clock))
        else:
            await run_workers(healthy + suspects, settings.concurrency, deadline, probe, clock)
        self._end_round(state)
        return True

    async def _probe(self, key: str, item: Watched, record: ProbeRecord | None, destinations: _Destinations,
                     state: _Round) -> None:
        previous = record.outcome if record is not None else None
        full = (previous is None or not previous.serving or record is None
                or record.probes % max(1, self.full_every) == 0)
        started = self.prober.clock()
        # Served and not failed since: it answers, so its privacy check can share the probe's connection.
        answered = record is not None and record.last_success is not None and record.failing_since is None
        outcome = await self.prober.probe_one(item.target, full=full, answered=answered)
        already_failing = record is not None and record.failing_since is not None
        if not outcome.serving and outcome.reason is not ProbeReason.NOT_ALLOWED and not already_failing:
            # Was it the proxy, or the probe target? Ask the target itself. (An instance already
            # failing stays so either way; the next round's own check tells an outage then.)
            problem = await destinations.problem(item.target.destination, after=started)
            if problem is not None:
                outcome = unknown_outcome(ProbeReason.PROBE_TARGET_UNREACHABLE, problem, outcome.probed_at)
        if outcome.serving and not outcome.full and previous is not None and previous.serving:
            outcome = dataclasses.replace(outcome, private=previous.private, egress_ip=previous.egress_ip,
                                          privacy_message=previous.privacy_message)
        self._record(key, item, outcome, state)

    def _record(self, key: str, item: Watched, outcome: ProbeOutcome, state: _Round) -> None:
        _count(item.provider, outcome)
        with self._lock:
            current = self._watched.get(key)
            if current is None or current.target != item.target:
                return  # no longer watched (deleted, replaced meanwhile), or now probed otherwise
            record = self._records.get(key) or ProbeRecord()
            if outcome.serving:
                state.passed = True
                self._pass(state)
            elif not outcome.reason.unknown and not state.passed and (item.served or record.last_success):
                # It had served: hold its failure until a probe of its provider passes this round
                # (the failure is then its own) or the round ends with none passing.
                state.held.append((key, outcome))
                state.turned += 1 if record.last_success is not None and record.failing_since is None else 0
                return
            self._store(key, record, outcome)

    def _pass(self, state: _Round) -> None:
        """A probe of the provider passed: the failures held so far are their instances' own."""
        for key, outcome in state.held:
            self._store(key, self._records.get(key) or ProbeRecord(), outcome)
        state.held.clear()
        if self._provider_failing.pop(state.provider, None) is not None:
            log.info("provider %s: probes pass again", state.provider)
            # The instances held in discovery are judged on their own again.
            for key, watched in self._watched.items():
                if watched.provider == state.provider:
                    self._queue(key)

    def _end_round(self, state: _Round) -> None:
        with self._lock:
            if not state.held:
                return
            if state.turned >= 2 and state.provider not in self._provider_failing:
                since = min(outcome.probed_at for _, outcome in state.held)
                self._provider_failing[state.provider] = since
                log.warning("provider %s: every probe fails at once (%d instances that served just before): a "
                            "provider-wide failure, not theirs; they stay in discovery and none is replaced for "
                            "a bounded time", state.provider, state.turned)
            for key, outcome in state.held:
                self._store(key, self._records.get(key) or ProbeRecord(), outcome)
                self._queue(key)  # the hold's end is judged again each round
            state.held.clear()

    def _store(self, key: str, record: ProbeRecord, outcome: ProbeOutcome) -> None:
        """Keep ``outcome`` (the lock held) and queue the verdict when it changes what is written."""
        previous = record.outcome
        last_success: datetime | None = record.last_success
        failing_since: datetime | None = record.failing_since
        if outcome.serving:
            last_success, failing_since = outcome.probed_at, None
        elif not outcome.reason.unknown:
            failing_since = failing_since or outcome.probed_at
        self._records[key] = ProbeRecord(outcome, last_success, failing_since, record.probes + 1,
                                         self._recent(key, record.recent, outcome))
        self._unprobed.discard(key)
        if previous is None or (previous.serving, previous.reason, previous.private, previous.egress_ip) != (
                outcome.serving, outcome.reason, outcome.private, outcome.egress_ip):
            self._queue(key)

    def _recent(self, key: str, recent: tuple[bool, ...], outcome: ProbeOutcome) -> tuple[bool, ...]:
        """``recent`` with ``outcome`` added (the lock held), at most the provider's flapWindow long."""
        watched = self._watched.get(key)
        settings = self._settings.get(watched.provider) if watched is not None else None
        if settings is None or outcome.reason.unknown or (
                not outcome.serving and watched is not None and watched.provider in self._provider_failing):
            return recent  # says nothing of this proxy: no probe could tell, or its provider failed
        return (*recent, outcome.serving)[-max(1, settings.flap_window):]

    def _queue(self, key: str) -> None:
        """Queue ``key``'s verdict (the lock held); the verdict thread is woken when the queue was
        empty: waking it per verdict would hand it the GIL thousands of times a round."""
        if not self._pending:
            self._verdicts.notify_all()
        self._pending[key] = None

    # -- verdicts ------------------------------------------------------------------------------

    def _write_pending(self) -> int:
        """Write the queued verdicts; how many outcomes had changed."""
        with self._lock:
            keys, self._pending = list(self._pending), {}
            writes = [w.write_verdict for k in keys if (w := self._watched.get(k)) is not None
                      and w.write_verdict is not None]
        _write_all(writes)
        return len(keys)

    def _verdict_loop(self, stopping: threading.Event) -> None:
        while not (stopping.is_set() or self._stopping.is_set()):
            with self._verdicts:
                if not self._pending:
                    self._verdicts.wait(timeout=1.0)
            # The verdicts of probes ending together are written together.
            stopping.wait(VERDICT_BATCH_SECONDS)
            self._write_pending()


def _write_all(writes: Sequence[Callable[[], None]]) -> None:
    started = time.monotonic()
    for write in writes:
        try:
            write()
        except Exception:
            log.exception("writing a probe verdict failed (the next sweep writes it)")
    if writes:
        log.debug("wrote %d probe verdict(s) in %.2f s", len(writes), time.monotonic() - started)


@functools.cache
def _counter(provider: str, reason: ProbeReason) -> Counter:
    return metrics.PROBES.labels(provider=provider, reason=reason.value)


@functools.cache
def _latency(provider: str) -> Histogram:
    return metrics.PROBE_SECONDS.labels(provider=provider)


def _count(provider: str, outcome: ProbeOutcome) -> None:
    """One probe in the metrics (the labelled series looked up once each: a round has thousands)."""
    _counter(provider, outcome.reason).inc()
    if outcome.latency_seconds is not None:
        _latency(provider).observe(outcome.latency_seconds)
