"""Lease leader election, so only one controller replica sweeps and writes at a time.

The loop calls ``try_acquire_or_renew()`` every ``renew_seconds``, sweeps only while
``is_leader`` holds, and calls ``release()`` on shutdown so a successor starts at once
instead of waiting out the lease. The Lease (coordination.k8s.io/v1) is read and written
through ``LeaseApi`` (``kube.KubeLeases``), so this module never imports the client.

Every write sends the object as read, with its resourceVersion (or is a create, which the
server refuses when the Lease exists): when two contenders race, the server accepts one
write and answers the other 409, and the loser is not leader. A Lease is free when it has
no holder or its ``renewTime + leaseDurationSeconds`` has passed, by this replica's clock
(like client-go, this assumes the replicas' clocks roughly agree; the lease is 3 renewals
long, so a late renewal or a little skew does not flip leadership).
"""

from __future__ import annotations

import copy
import datetime
import logging
from collections.abc import Callable
from typing import Any, Protocol

from egress_proxies.resources import times
from egress_proxies.sources.store import Conflict, StoreError

log = logging.getLogger(__name__)

# metav1.MicroTime on the wire: RFC 3339 in UTC with exactly six fractional digits.
MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
# What a release leaves behind (client-go's value): already expired by the time anyone reads it.
_RELEASED_LEASE_SECONDS = 1

Obj = dict[str, Any]


class LeaseApi(Protocol):
    """Leases as plain API objects; writes raise ``store.Conflict`` on a 409, other failures
    ``store.StoreError``."""

    def get(self, namespace: str, name: str) -> Obj | None:
        """The Lease, or None when it does not exist."""

    def create(self, namespace: str, body: Obj) -> Obj:
        """Create it; Conflict when it already exists."""

    def replace(self, namespace: str, name: str, body: Obj) -> Obj:
        """Replace it; Conflict when ``body``'s resourceVersion is stale."""


def format_micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime(MICRO_TIME)


def parse_micro_time(text: str) -> datetime.datetime:
    """A Lease timestamp; raises ValueError when it is not RFC 3339."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {text!r}")
    return moment


class LeaseElector:
    def __init__(self, lease_api: LeaseApi, namespace: str, name: str, identity: str, lease_seconds: int = 15,
                 renew_seconds: float = 5, clock: Callable[[], datetime.datetime] = times.now) -> None:
        if not 0 < renew_seconds < lease_seconds:
            raise ValueError(f"renew_seconds ({renew_seconds}) must be positive and shorter than "
                             f"lease_seconds ({lease_seconds}), or the lease lapses between renewals")
        self.lease_api = lease_api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.clock = clock
        # When the lease we last wrote runs out; None when we do not hold it.
        self._valid_until: datetime.datetime | None = None

    @property
    def is_leader(self) -> bool:
        """True while the lease we last wrote has not run out, by our clock.

        Measured from the time taken before the write, so it ends no later than any other
        replica (reading our renewTime) may take over.
        """
        return self._valid_until is not None and self.clock() < self._valid_until

    def try_acquire_or_renew(self) -> bool:
        """One round: create the Lease, renew ours, or take over an expired or released one.

        A 409 means another replica wrote the Lease since we read it: it won, we are not
        leader. Any other API failure keeps what we had until our lease runs out (a renewal
        may succeed next round, and nobody else can take over before then).
        """
        now = self.clock()
        try:
            lease = self.lease_api.get(self.namespace, self.name)
            if lease is None:
                self.lease_api.create(self.namespace, self._claim(None, now))
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity") or ""
                if holder != self.identity and holder and not self._expired(spec, now):
                    self._step_down(f"held by {holder}")
                    return False
                self.lease_api.replace(self.namespace, self.name, self._claim(lease, now))
                if holder != self.identity:
                    log.info("lease %s/%s: taking over from %s", self.namespace, self.name, holder or "nobody")
        except Conflict:
            self._step_down("another replica wrote the lease first")
            return False
        except StoreError as error:
            log.warning("lease %s/%s: could not renew: %s", self.namespace, self.name, error)
            return self.is_leader
        if self._valid_until is None:
            log.info("lease %s/%s: %s is now the leader", self.namespace, self.name, self.identity)
        self._valid_until = now + datetime.timedelta(seconds=self.lease_seconds)
        return True

    def release(self) -> None:
        """Give the lease up (on shutdown) so a successor takes over at once; best effort."""
        self._valid_until = None
        now = self.clock()
        try:
            lease = self.lease_api.get(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = copy.deepcopy(lease)
            spec = body.setdefault("spec", {})
            spec.pop("holderIdentity", None)
            spec.update(leaseDurationSeconds=_RELEASED_LEASE_SECONDS, acquireTime=format_micro_time(now),
                        renewTime=format_micro_time(now))
            self.lease_api.replace(self.namespace, self.name, body)
            log.info("lease %s/%s: released by %s", self.namespace, self.name, self.identity)
        except StoreError as error:
            # A Conflict too: someone else wrote it, so it is no longer ours to release.
            # Otherwise the lease simply expires after lease_seconds.
            log.warning("lease %s/%s: could not release: %s", self.namespace, self.name, error)

    def _expired(self, spec: Obj, now: datetime.datetime) -> bool:
        renewed = spec.get("renewTime")
        if not renewed:
            return True
        try:
            renew_time = parse_micro_time(str(renewed))
        except ValueError:
            # No holder could ever renew past an unreadable time: treat it as run out rather
            # than deadlock the election.
            log.warning("lease %s/%s: unreadable renewTime %r, treating it as expired", self.namespace,
                        self.name, renewed)
            return True
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return now >= renew_time + datetime.timedelta(seconds=duration)

    def _claim(self, lease: Obj | None, now: datetime.datetime) -> Obj:
        """The Lease naming us the holder, renewed at ``now``: the object as read (with its
        resourceVersion) with only the spec fields of the election changed."""
        if lease is None:
            body: Obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": self.name, "namespace": self.namespace}, "spec": {}}
        else:
            body = copy.deepcopy(lease)
        spec = body.setdefault("spec", {})
        stamp = format_micro_time(now)
        if spec.get("holderIdentity") != self.identity:
            transitions = int(spec.get("leaseTransitions") or 0)
            spec.update(holderIdentity=self.identity, acquireTime=stamp,
                        leaseTransitions=transitions + 1 if lease is not None else 0)
        spec.update(leaseDurationSeconds=self.lease_seconds, renewTime=stamp)
        return body

    def _step_down(self, why: str) -> None:
        if self._valid_until is not None:
            log.warning("lease %s/%s: %s is no longer the leader: %s", self.namespace, self.name, self.identity, why)
        self._valid_until = None
