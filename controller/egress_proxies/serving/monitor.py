"""Is each proxy serving? Background probing of every running instance, through itself.

The sweep hands ``ServingMonitor.watch`` the endpoints it found running (one ``ProbeTarget`` per
instance, built here from the provider's probe settings and the Proxy's own overrides) and reads
the latest outcome with ``outcome``; it never waits for a probe. The monitor's thread probes the
whole set every interval (``probe.Prober``: concurrent, bounded, with a deadline) and wakes the
loop when an outcome changes, so a proxy that starts or stops serving is reflected at once.
Started by ``loop.Controller``; ``probe_now`` runs one round in the caller's thread (``--once``,
tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from egress_proxies import metrics
from egress_proxies.providers.client import Instance, ProbeSettings
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.probe import ProbeCredentials, ProbeOutcome, Prober, ProbeTarget

log = logging.getLogger(__name__)


def probe_target(settings: ProbeSettings, proxy: Proxy, instance: Instance,
                 credentials: ProbeCredentials | None = None) -> ProbeTarget:
    """What to check for this instance: the provider's checks, overridden by ``spec.probe``; with
    credentials, also that a request without them is refused (the proxy is private)."""
    override = proxy.spec.get("probe") or {}
    host, _, port = instance.endpoint_for(proxy.port).rpartition(":")
    return ProbeTarget(
        credentials=credentials, expect_private=credentials is not None,
        key=target_key(instance, proxy.port), host=host.strip("[]"), port=int(port),
        http_url=str(override.get("httpUrl") or settings.http_url),
        expected_status=int(override.get("expectStatus") or settings.expect_status),
        connect_target=override.get("connect", settings.connect) or None,
        egress_echo_url=override.get("egressEchoUrl") or settings.egress_echo_url)


def target_key(instance: Instance, port: int) -> str:
    """An outcome belongs to one instance at one endpoint: a replacement is never judged by its
    predecessor's probe."""
    return f"{instance.provider_id}@{instance.endpoint_for(port)}"


class ServingMonitor:
    def __init__(self, prober: Prober, interval_seconds: float = 10.0,
                 on_change: Callable[[], None] | None = None) -> None:
        self.prober = prober
        self.interval_seconds = interval_seconds
        self.on_change = on_change
        self._lock = threading.Lock()
        self._targets: dict[str, tuple[str, ProbeTarget]] = {}  # key -> (provider name, target)
        self._outcomes: dict[str, ProbeOutcome] = {}
        self._round = threading.Lock()
        self._wake = threading.Event()

    def watch(self, targets: Mapping[str, tuple[str, ProbeTarget]]) -> None:
        """The endpoints to probe from now on (every running instance of a probed provider)."""
        with self._lock:
            new = set(targets) - set(self._targets)
            self._targets = dict(targets)
            self._outcomes = {k: v for k, v in self._outcomes.items() if k in targets}
        if new:
            self._wake.set()  # a new instance is probed at once, not an interval later

    def outcome(self, key: str) -> ProbeOutcome | None:
        with self._lock:
            return self._outcomes.get(key)

    def probe_now(self) -> bool:
        """One round over every watched endpoint; True when any serving state changed."""
        with self._round:
            with self._lock:
                targets = dict(self._targets)
            if not targets:
                return False
            results = self.prober.probe_all(target for _, target in targets.values())
            changed = False
            with self._lock:
                for key, outcome in results.items():
                    if key not in self._targets:
                        continue  # no longer watched (deleted meanwhile)
                    previous = self._outcomes.get(key)
                    changed |= previous is None or previous.serving != outcome.serving or (
                        previous.reason != outcome.reason)
                    self._outcomes[key] = outcome
            for key, outcome in results.items():
                provider = targets[key][0]
                metrics.PROBES.labels(provider=provider, reason=outcome.reason.value).inc()
                if outcome.latency_seconds is not None:
                    metrics.PROBE_SECONDS.labels(provider=provider).observe(outcome.latency_seconds)
            return changed

    def run(self, stopping: threading.Event) -> None:
        """Probe every interval (and at once when new endpoints appear) until ``stopping``."""
        while not stopping.is_set():
            self._wake.clear()
            try:
                if self.probe_now() and self.on_change is not None:
                    self.on_change()
            except Exception:
                log.exception("probe round failed")
            self._wake.wait(self.interval_seconds)
            if stopping.is_set():
                return

    def stop(self) -> None:
        self._wake.set()
