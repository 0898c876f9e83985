"""What the client keeps apart without asking the controller, each bounded in time and memory:

- ``Backoff``: a proxy that failed to answer (refused, timed out, 407) is set aside for a time that
  doubles with each failure in a row, and is forgotten on its first success;
- ``SiteCooldowns``: one (proxy, site) pair kept apart for as long as the site asked (429 or 503
  with ``Retry-After``), the proxy staying in use for every other site;
- ``QuarantineBudget``: how many quarantines one client may ask for, so a wrong ban rule (a
  status every answer has, the proxy's own refusals) cannot take a whole pool out of discovery.

Not thread-safe on their own: ``ProxyClient`` calls them under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

Instance = tuple[str, str, str]  # Proxy.instance


class Backoff:
    """Seconds to set a failing proxy aside: ``base`` after its first failure in a row, doubled at
    each further one, at most ``ceiling``."""

    def __init__(self, base: float, ceiling: float) -> None:
        if base <= 0 or ceiling < base:
            raise ValueError(f"failure_cooldown: {base!r} must be above 0 and at most max_failure_cooldown "
                             f"({ceiling!r})")
        self.base, self.ceiling = base, ceiling
        self._failures: dict[Instance, int] = {}

    def failed(self, instance: Instance) -> float:
        count = self._failures.get(instance, 0) + 1
        self._failures[instance] = count
        return min(self.ceiling, self.base * 2.0 ** min(count - 1, 30))

    def succeeded(self, instance: Instance) -> None:
        self._failures.pop(instance, None)

    def forget(self, present: set[Instance]) -> None:
        """Instances discovery no longer lists are gone for good."""
        self._failures = {key: count for key, count in self._failures.items() if key in present}


class SiteCooldowns:
    """(instance, site) -> until when (``time.monotonic``); at most ``MAX_PAIRS`` remembered."""

    MAX_PAIRS = 100_000

    def __init__(self) -> None:
        self._until: dict[tuple[Instance, str], float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def cool(self, instance: Instance, site: str, until: float, now: float) -> None:
        if len(self._until) >= self.MAX_PAIRS:
            self._until = {key: end for key, end in self._until.items() if end > now}
            if len(self._until) >= self.MAX_PAIRS:  # all of them current: the soonest to end go
                kept = sorted(self._until.items(), key=lambda item: item[1])[len(self._until) // 2:]
                self._until = dict(kept)
        self._until[(instance, site)] = max(until, self._until.get((instance, site), 0.0))

    def cooling(self, instance: Instance, site: str, now: float) -> bool:
        until = self._until.get((instance, site))
        if until is None:
            return False
        if until <= now:
            del self._until[(instance, site)]
            return False
        return True


@dataclass(frozen=True)
class BudgetVerdict:
    allowed: bool
    why: str = ""


class QuarantineBudget:
    """At most ``per_window`` quarantines in any ``window`` seconds, and never more than ``share``
    of the pool in that window (one is always allowed: a pool of one can have its one replaced).
    The pool is what discovery lists plus what this client reported in the window, since a
    quarantined proxy leaves discovery at once; the pool's floor, on the controller, is the other
    bound."""

    def __init__(self, per_window: int, window: float, share: float) -> None:
        if per_window < 1:
            raise ValueError(f"max_quarantines: {per_window!r} must be at least 1 (quarantine=False turns reports off)")
        if window <= 0:
            raise ValueError(f"quarantine_window: {window!r} must be above 0 seconds")
        if not 0 < share <= 1:
            raise ValueError(f"max_quarantine_share: {share!r} must be above 0 and at most 1")
        self.per_window, self.window, self.share = per_window, window, share
        self._sent: deque[tuple[float, Instance]] = deque()

    def take(self, instance: Instance, listed: set[Instance], now: float) -> BudgetVerdict:
        """One quarantine more, of ``instance``, with ``listed`` in discovery now."""
        while self._sent and self._sent[0][0] <= now - self.window:
            self._sent.popleft()
        if len(self._sent) >= self.per_window:
            return BudgetVerdict(False, f"{self.per_window} quarantines in the last {self.window:.0f} s "
                                        "(max_quarantines)")
        reported = {sent for _, sent in self._sent}
        pool = len(listed | reported | {instance})
        if len(self._sent) + 1 > max(1.0, self.share * pool):
            return BudgetVerdict(False, f"{len(self._sent)} of {pool} proxies already reported by this client in the "
                                        f"last {self.window:.0f} s (max_quarantine_share {self.share:g})")
        self._sent.append((now, instance))
        return BudgetVerdict(True)
