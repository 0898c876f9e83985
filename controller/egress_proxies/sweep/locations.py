"""What each provider's locations hold, and the state of those taken out of placement (a KVM host
cordoned or draining): the gauges an operator waits on for "the host is drained"
(docs/operations.md, "Draining a KVM host"), and the sweep's log lines about a draining host.

Only a complete listing counts: a host that did not answer is not empty, so a provider whose
listing failed keeps its last values until it is listed again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from egress_proxies import metrics
from egress_proxies.providers.client import CORDONED, DRAINING, Listing

log = logging.getLogger(__name__)

# A draining location none of this controller's instances is left on: it can be taken down.
DRAINED = "drained"
STATES = (CORDONED, DRAINING, DRAINED)


def shown_state(state: str | None, instances: int) -> str | None:
    """The state a location's gauge shows: its configured one, ``drained`` for a draining one
    that is empty; None for an active one (it has no state series)."""
    if state == DRAINING and instances == 0:
        return DRAINED
    return state if state in STATES else None


class LocationReport:
    """Publishes ``egress_proxies_location_instances`` and ``egress_proxies_location_state`` each
    sweep, and removes the series of a location (or provider) that no longer has any."""

    def __init__(self) -> None:
        # provider -> location -> the state its series show (None: active, instances only)
        self._shown: dict[str, dict[str, str | None]] = {}

    def publish(self, states: Mapping[str, Mapping[str, str]], listings: Mapping[str, Listing]) -> None:
        """``states``: each provider's locations out of placement; ``listings``: this sweep's."""
        for provider in set(self._shown) - set(listings):
            self._forget(provider, set(self._shown[provider]))
            del self._shown[provider]
        for provider, listing in listings.items():
            if listing.complete:
                self._publish(provider, states.get(provider, {}), listing)

    def _publish(self, provider: str, states: Mapping[str, str], listing: Listing) -> None:
        counts = Counter(instance.location for instance in listing.instances if instance.location)
        before = self._shown.setdefault(provider, {})
        self._forget(provider, set(before) - set(counts) - set(states))
        for location in sorted(set(counts) | set(states)):
            metrics.LOCATION_INSTANCES.labels(provider=provider, location=location).set(counts[location])
            state = shown_state(states.get(location), counts[location])
            if state is None and before.get(location) is not None:
                self._forget_states(provider, location)
            for each in STATES if state is not None else ():
                shown = metrics.LOCATION_STATE.labels(provider=provider, location=location, state=each)
                shown.set(1.0 if each == state else 0.0)
            self._say(provider, location, before.get(location), state, counts[location])
            before[location] = state

    @staticmethod
    def _say(provider: str, location: str, was: str | None, state: str | None, left: int) -> None:
        """Each sweep what is left on a draining host; once, that a host is drained."""
        if state == DRAINING:
            log.info("provider %s: host %s is draining: %d instance(s) left on it", provider, location, left)
        elif state == DRAINED and was != DRAINED:
            log.info("provider %s: host %s is drained: no instance of this controller is left on it; it can be "
                     "taken down for maintenance", provider, location)

    def _forget(self, provider: str, locations: set[str]) -> None:
        shown = self._shown.get(provider, {})
        for location in locations:
            metrics.LOCATION_INSTANCES.remove(provider, location)
            if shown.pop(location, None) is not None:
                self._forget_states(provider, location)

    @staticmethod
    def _forget_states(provider: str, location: str) -> None:
        for each in STATES:
            metrics.LOCATION_STATE.remove(provider, location, each)
