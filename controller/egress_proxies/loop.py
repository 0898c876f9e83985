"""The running controller: periodic sweeps, a watch that triggers them early, leader election.

Called by ``cli``. A watch event never reconciles one object by itself (that is what
makes per-object controllers spawn a runner per resource): it only wakes the sweep
loop, after a short debounce so a burst of changes becomes one sweep.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from egress_proxies.health import SweepHealth
from egress_proxies.reconcile import Reconciler, SweepReport
from egress_proxies.store import ProxyStore, StoreError, WatchExpired

log = logging.getLogger(__name__)


class Elector(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class LoopSettings:
    interval_seconds: float = 60.0
    debounce_seconds: float = 1.0
    watch: bool = True
    watch_timeout_seconds: int = 300
    renew_seconds: float = 5.0


class Controller:
    def __init__(self, reconciler: Reconciler, store: ProxyStore, health: SweepHealth,
                 settings: LoopSettings | None = None, elector: Elector | None = None) -> None:
        self.reconciler = reconciler
        self.store = store
        self.health = health
        self.settings = settings or LoopSettings()
        self.elector = elector
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._leader = threading.Event()
        self.sweeps = 0

    def trigger(self) -> None:
        """Ask for a sweep soon (from a watch event, or a test)."""
        self._wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    # -- threads -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until ``stop()``; releases the Lease on the way out so a successor takes over at once."""
        threads = [threading.Thread(target=self._sweep_loop, name="sweep", daemon=True)]
        if self.settings.watch:
            threads.append(threading.Thread(target=self._watch_loop, name="watch", daemon=True))
        if self.elector is not None:
            threads.append(threading.Thread(target=self._elect_loop, name="leader", daemon=True))
        else:
            self._leader.set()
            self.health.set_leader(True)
        for thread in threads:
            thread.start()
        self.stopping.wait()
        for thread in threads:
            thread.join(timeout=30)
        if self.elector is not None and self._leader.is_set():
            self.elector.release()

    def _elect_loop(self) -> None:
        assert self.elector is not None  # started only with an elector
        while not self.stopping.is_set():
            try:
                leading = self.elector.try_acquire_or_renew()
            except StoreError as error:
                log.warning("leader election: %s", error)
                leading = False
            if leading and not self._leader.is_set():
                log.info("became the leader")
                self._leader.set()
                self.trigger()
            elif not leading and self._leader.is_set():
                log.warning("lost the leadership; sweeps stop until it is regained")
                self._leader.clear()
            self.health.set_leader(leading)
            self.stopping.wait(self.settings.renew_seconds)

    def _sweep_loop(self) -> None:
        while not self.stopping.is_set():
            # Ask the elector, not only our flag: a loop that stalled past the lease must not
            # sweep once more on leadership it no longer holds.
            if self._leader.is_set() and (self.elector is None or self.elector.is_leader):
                self.sweep_once()
            self._wake.wait(self.settings.interval_seconds)
            if self.stopping.is_set():
                return
            if self._wake.is_set():
                # Debounce: a burst of watch events becomes one sweep.
                self.stopping.wait(self.settings.debounce_seconds)
            self._wake.clear()

    def sweep_once(self) -> SweepReport:
        self.health.sweep_started()
        report = self.reconciler.sweep()
        self.health.sweep_finished(report.ok)
        self.sweeps += 1
        log.info("sweep %d: %s, %d runner call(s), %d created, %d deleted, %d released, %d garbage-collected",
                 self.sweeps, "ok" if report.ok else "FAILED", report.runner_calls, report.created, report.deleted,
                 report.released, len(report.gc))
        return report

    def _watch_loop(self) -> None:
        resource_version = ""
        while not self.stopping.is_set():
            try:
                if not resource_version:
                    _, resource_version = self.store.list_proxies()
                for event in self.store.watch_proxies(resource_version, self.settings.watch_timeout_seconds):
                    resource_version = event.proxy.resource_version or resource_version
                    self.trigger()
                    if self.stopping.is_set():
                        return
            except WatchExpired:
                log.info("watch expired (410): relisting")
                resource_version = ""
            except StoreError as error:
                log.warning("watch failed: %s; retrying", error)
                resource_version = ""
                self.stopping.wait(5)
