"""The running controller: periodic sweeps, a watch that triggers them early, leader election.

Called by ``cli``. A watch event never reconciles one object by itself (that is what
makes per-object controllers spawn a runner per resource): it only wakes the sweep
loop, after a short debounce so a burst of changes becomes one sweep.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from egress_proxies.health import SweepHealth
from egress_proxies.sources.store import Gone, ProxyStore, StoreError, WatchExpired
from egress_proxies.sweep.reconcile import Reconciler, SweepReport

log = logging.getLogger(__name__)


class ChangeFeed(Protocol):
    """Another kind's changes that should wake the sweep (``kube.KubePools``: a scale, a new pool)."""

    def list_version(self) -> str: ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[str]: ...


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
    # On stop: how long the Lease release may wait for an election round in flight, and how
    # long a sweep in flight may go on recording what it did, all told. Kept under 5 s so a
    # successor takes over at once (the runner is cancelled first, so a sweep in flight
    # starts nothing new and its writes are optimistic).
    stop_grace_seconds: float = 3.0


class Controller:
    def __init__(self, reconciler: Reconciler, store: ProxyStore, health: SweepHealth,
                 settings: LoopSettings | None = None, elector: Elector | None = None,
                 pool_feed: ChangeFeed | None = None) -> None:
        self.reconciler = reconciler
        self.pool_feed = pool_feed
        self.store = store
        self.health = health
        self.settings = settings or LoopSettings()
        self.elector = elector
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._leader = threading.Event()
        # Election rounds and the release on stop never overlap: a renewal after the release
        # would take the Lease back.
        self._elect_lock = threading.Lock()
        self.sweeps = 0
        # What crawlers are handed (the sweep publishes to it): the stored set until this
        # process's own sweep has run in its current term (a standby reads it every interval).
        self.discovery = reconciler.discovery
        # Whether this process leads is decided beside whether its sweeps are served: a term
        # lost between the two must not leave a standby serving its old sweep.
        self._term_lock = threading.Lock()

    def trigger(self) -> None:
        """Ask for a sweep soon (from a watch event, or a test)."""
        self._wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        if self.reconciler.monitor is not None:
            self.reconciler.monitor.stop()

    def refresh_stored_view(self) -> bool:
        """Read the Proxies (and the pools' floors) from the store for discovery; False when the
        store could not be read (the previous view stays)."""
        started = time.monotonic()
        try:
            proxies, _ = self.store.list_proxies()
        except StoreError as error:
            log.warning("discovery: could not read the stored Proxies (serving the last read): %s", error)
            return False
        pools = self.reconciler.pools
        self.discovery.load_stored(proxies, pools.read_floors() if pools is not None else {}, started)
        self.health.view_loaded()
        return True

    # -- threads -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until ``stop()``; releases the Lease on the way out so a successor takes over at once.

        Returns within ``stop_grace_seconds`` of ``stop()`` (plus one API call in flight at
        worst): the Lease is released first, then a sweep in flight gets what is left of the
        grace to record its results. Each thread that dies of an unexpected exception fails
        ``/healthz`` at once (``SweepHealth.thread_died``), so the kubelet restarts the Pod.
        """
        sweeper = threading.Thread(target=self._guarded("sweep", self._sweep_loop), name="sweep", daemon=True)
        threads = [sweeper]
        if self.settings.watch:
            threads.append(threading.Thread(target=self._guarded("watch", self._watch_loop), name="watch",
                                            daemon=True))
        if self.settings.watch and self.pool_feed is not None:
            threads.append(threading.Thread(target=self._guarded("pool-watch", self._pool_watch_loop),
                                            name="pool-watch", daemon=True))
        elector_thread = None
        if self.elector is not None:
            elector_thread = threading.Thread(target=self._guarded("leader", self._elect_loop), name="leader",
                                              daemon=True)
            threads.append(elector_thread)
        else:
            self._leader.set()
            self.health.set_leader(True)
        monitor = self.reconciler.monitor
        if monitor is not None:
            # Probes run beside the sweeps, never inside them; a changed outcome writes its verdict
            # on the monitor's own thread.
            threads.append(threading.Thread(target=self._guarded("probe", lambda: monitor.run(self.stopping)),
                                            name="probe", daemon=True))
        for thread in threads:
            thread.start()
        self.stopping.wait()
        deadline = time.monotonic() + self.settings.stop_grace_seconds
        if elector_thread is not None:
            elector_thread.join(timeout=max(0.0, deadline - time.monotonic()))
            self._release(deadline)
        # The watch thread is not waited for: it only wakes the sweep loop, and it may sit in
        # a watch request for minutes, which would hold the Lease that long.
        sweeper.join(timeout=max(0.0, deadline - time.monotonic()))
        if sweeper.is_alive():
            log.warning("stopping with a sweep in flight after %.0f s of grace (its runs are cancelled; "
                        "what it did not record, the next leader's sweep finds)", self.settings.stop_grace_seconds)

    def _release(self, deadline: float) -> None:
        assert self.elector is not None  # called only with an elector
        self._leader.clear()
        # An election round in flight (an API call hanging up to its timeout) holds the lock;
        # waiting for it longer would miss the 5 s a successor should wait at most.
        if not self._elect_lock.acquire(timeout=max(0.5, deadline - time.monotonic())):
            log.warning("leader election call still in flight: the Lease is not released and expires by itself")
            return
        try:
            self.elector.release()
        except Exception:
            # Shutting down either way: the Lease then expires by itself.
            log.exception("could not release the Lease")
        finally:
            self._elect_lock.release()

    def _guarded(self, name: str, loop: Callable[[], None]) -> Callable[[], None]:
        """``loop`` run so that its death, by an exception nobody expected, is seen at once:
        logged with its traceback and reported to health, which fails ``/healthz`` (a restart
        is the only cure for a loop that no longer runs)."""
        def run() -> None:
            try:
                loop()
            except BaseException as error:  # whatever it was, the thread is gone
                # Logged here with its traceback (not re-raised: threading's hook would only
                # print it to stderr a second time, outside the log).
                log.exception("the %s thread died", name)
                self.health.thread_died(name, f"{type(error).__name__}: {error}")
                return
            if not self.stopping.is_set():
                log.error("the %s thread ended although the controller is not stopping", name)
                self.health.thread_died(name, "ended unexpectedly")
        return run

    def _elect_loop(self) -> None:
        assert self.elector is not None  # started only with an elector
        while not self.stopping.is_set():
            with self._elect_lock:
                if self.stopping.is_set():
                    return  # the release follows; a renewal now would undo it
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
                with self._term_lock:
                    self.discovery.serve_sweeps(False)
                self.trigger()  # read the stored view at once: this process serves it from now on
            self.health.set_leader(leading)
            self.stopping.wait(self.settings.renew_seconds)

    def _sweep_loop(self) -> None:
        while not self.stopping.is_set():
            # Ask the elector, not only our flag: a loop that stalled past the lease must not
            # sweep once more on leadership it no longer holds.
            if self._leader.is_set() and (self.elector is None or self.elector.is_leader):
                if not self.discovery.serving_sweeps:
                    # A new term: serve the stored set until this term's first sweep is done (it
                    # may take minutes when it creates instances).
                    self.refresh_stored_view()
                before = self.discovery.published
                self.sweep_once()
                with self._term_lock:
                    # Only a sweep that got as far as publishing replaces the stored set (one
                    # whose listing failed leaves the sweep's set as it was: maybe empty).
                    if self.discovery.published != before:
                        self.discovery.serve_sweeps(self._leader.is_set())
            else:
                self.refresh_stored_view()
            self._wake.wait(self.settings.interval_seconds)
            if self.stopping.is_set():
                return
            if self._wake.is_set():
                # Debounce: a burst of watch events becomes one sweep.
                self.stopping.wait(self.settings.debounce_seconds)
            self._wake.clear()

    def sweep_once(self) -> SweepReport:
        self.health.sweep_started()
        started = time.monotonic()
        report = self.reconciler.sweep()
        self.health.sweep_finished(report.ok, "" if report.clean else report.summary())
        self.sweeps += 1
        log.log(logging.INFO if report.clean else logging.WARNING,
                "sweep %d (%.1f s): %s; %d runner call(s), %d created, %d deleted, %d released, %d garbage-collected",
                self.sweeps, time.monotonic() - started, report.summary(), report.runner_calls, report.created,
                report.deleted, report.released, len(report.gc))
        return report

    def _pool_watch_loop(self) -> None:
        """Like ``_watch_loop``, for ProxyPools: a pool scaled or created is acted on at once."""
        assert self.pool_feed is not None  # started only with a feed
        resource_version = ""
        while not self.stopping.is_set():
            try:
                if not resource_version:
                    resource_version = self.pool_feed.list_version()
                for version in self.pool_feed.watch(resource_version, self.settings.watch_timeout_seconds):
                    resource_version = version
                    self.trigger()
                    if self.stopping.is_set():
                        return
            except WatchExpired:
                resource_version = ""
            except Gone:
                # No ProxyPool CRD (yet): nothing to watch; look again now and then, quietly.
                resource_version = ""
                self.stopping.wait(self.settings.watch_timeout_seconds)
            except StoreError as error:
                log.warning("pool watch failed: %s; retrying", error)
                resource_version = ""
                self.stopping.wait(5)

    def _watch_loop(self) -> None:
        resource_version = ""
        while not self.stopping.is_set():
            try:
                if not resource_version:
                    _, resource_version = self.store.list_proxies()
                for event in self.store.watch_proxies(resource_version, self.settings.watch_timeout_seconds):
                    resource_version = event.proxy.resource_version or resource_version
                    if event.type == "DELETED" or event.proxy.deleting:
                        self.discovery.withdraw(event.proxy.uid, time.monotonic())
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
