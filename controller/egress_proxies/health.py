"""Liveness and readiness of the sweep loop, for ``/healthz`` and ``/readyz``.

``loop.Controller`` reports into a ``SweepHealth`` (sweep started / finished, leadership on every
election round); ``http`` asks it. Liveness answers "is the loop stuck?" -- a failing probe
restarts the Pod, so it must only fail when a restart helps: a sweep loop that has stopped
making progress, never a provider that keeps failing (a restart does not fix a dead hypervisor,
and sweeps that *finish* with errors are progress). Readiness answers "is what this process
serves current?": the last good sweep is recent. A standby (not the Lease holder) does not sweep
on purpose; it is alive as long as its election loop keeps reporting, and ready once it has read
the stored Proxies it serves discovery from (``view_loaded``), so a rollout is not held up by the
replica that waits for the Lease. A new leader serves that stored view until its first sweep and
stays ready on it for the readiness window. A loop thread that died (``thread_died``) fails both
probes at once: nothing will ever make progress again without a restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A loop that neither started nor finished a sweep for this long is wedged, whatever the interval.
MIN_STALL_SECONDS = 120.0
# One sweep may run long (a batch of creates waits for instances to boot), but not forever: every
# runner call has its own timeout, so a sweep beyond this bound is stuck outside the runner.
MIN_MAX_SWEEP_SECONDS = 1800.0


class SweepHealth:
    """Thread-safe record of the sweep loop's progress; the loop writes, the HTTP threads read.

    ``interval_seconds`` is the sweep interval. ``max_sweep_seconds`` bounds one running sweep
    (default: the larger of 10 intervals and 30 minutes). ``leader`` is the starting role:
    True when there is no leader election (the directory source, a single replica).
    """

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic,
                 max_sweep_seconds: float | None = None, leader: bool = True) -> None:
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be positive, not {interval_seconds}")
        self.interval_seconds = interval_seconds
        self.stall_seconds = max(3 * interval_seconds, MIN_STALL_SECONDS)
        self.max_sweep_seconds = (max_sweep_seconds if max_sweep_seconds is not None
                                  else max(10 * interval_seconds, MIN_MAX_SWEEP_SECONDS))
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        # Progress references start at construction: a process that just started gets one full
        # stall window for its first sweep before it counts as wedged.
        self._leader = leader
        self._became_leader_at = now
        self._last_leader_report = now
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._last_ok_at: float | None = None
        self._last_ok = False
        self._running = False
        self._view_loaded_at: float | None = None
        self._dead: str | None = None
        self._problems = ""

    # -- written by the loop -------------------------------------------------------------------

    def sweep_started(self) -> None:
        with self._lock:
            self._started_at = self._clock()
            self._running = True

    def sweep_finished(self, ok: bool, problems: str = "") -> None:
        """``problems``: what the sweep found wrong without failing (an invalid provider config
        section, failing providers or Proxies); readiness reports it and stays ready, since
        taking discovery away would degrade every proxy for the fault of some."""
        with self._lock:
            self._finished_at = self._clock()
            self._running = False
            self._last_ok = ok
            self._problems = problems
            if ok:
                self._last_ok_at = self._finished_at

    def set_leader(self, leader: bool) -> None:
        """Called on every election round, not only on changes: for a standby it is the heartbeat."""
        with self._lock:
            now = self._clock()
            if leader and not self._leader:
                # A new leader gets a full stall window (and a fresh readiness clock) for its first sweep.
                self._became_leader_at = now
            self._leader = leader
            self._last_leader_report = now

    @property
    def leader(self) -> bool:
        """Whether this replica leads now (the leader_election_master_status gauge reads it)."""
        with self._lock:
            return self._leader

    def view_loaded(self) -> None:
        """The stored Proxies were read: discovery has something real to serve without a sweep."""
        with self._lock:
            self._view_loaded_at = self._clock()

    def thread_died(self, name: str, reason: str) -> None:
        """A loop thread is gone for good: liveness fails from now on (the first death is kept)."""
        with self._lock:
            if self._dead is None:
                self._dead = f"the {name} thread died: {reason}"

    # -- read by the probes --------------------------------------------------------------------

    def alive(self) -> tuple[bool, str]:
        """(False, why) when the sweep loop (or, for a standby, the election loop) is stuck."""
        with self._lock:
            return self._alive(self._clock())

    def ready(self) -> tuple[bool, str]:
        """(True, why) when the last good sweep is recent, or this process is a live standby."""
        with self._lock:
            now = self._clock()
            alive, reason = self._alive(now)
            if not alive:
                return False, reason
            loaded = self._view_loaded_at is not None
            if not self._leader:
                if not loaded:
                    return False, "standby: the stored Proxies were not read yet (discovery would be empty)"
                return True, "standby: waiting for the leader Lease"
            window = 3 * self.interval_seconds
            if self._last_ok_at is None or self._last_ok_at < self._became_leader_at:
                if loaded and now - self._became_leader_at <= window:
                    return True, "new leader: serving the stored Proxies until its first successful sweep"
                return False, "no successful sweep yet"
            age = now - self._last_ok_at
            if age > window:
                return False, f"last successful sweep finished {age:.0f}s ago (limit {window:.0f}s)"
            if not self._last_ok:
                # Still ready: one failed sweep must not take the discovery endpoint out of the
                # Service while the previous good answer is younger than three intervals.
                return True, f"last sweep failed; last successful one {age:.0f}s ago"
            if self._problems:
                return True, f"last sweep ok {age:.0f}s ago, {self._problems}"
            return True, f"last sweep ok {age:.0f}s ago"

    def _alive(self, now: float) -> tuple[bool, str]:
        if self._dead is not None:
            return False, self._dead
        if self._running and self._started_at is not None:
            running = now - self._started_at
            if running > self.max_sweep_seconds:
                return False, f"sweep running for {running:.0f}s (limit {self.max_sweep_seconds:.0f}s): wedged"
            return True, f"sweep running for {running:.0f}s"
        if not self._leader:
            quiet = now - self._last_leader_report
            if quiet > self.stall_seconds:
                return False, f"leader election silent for {quiet:.0f}s (limit {self.stall_seconds:.0f}s)"
            return True, "standby"
        progress = max(t for t in (self._started_at, self._finished_at, self._became_leader_at) if t is not None)
        quiet = now - progress
        if quiet > self.stall_seconds:
            return False, f"no sweep started or finished for {quiet:.0f}s (limit {self.stall_seconds:.0f}s)"
        return True, "sweep loop progressing"
