"""Proxy credentials: one per Proxy namespace (a crawler team), made and kept by the controller.

A credential is a user name and a random password (192 bits). Only its bcrypt hash ever leaves
this module towards an instance (through the modules' ``access`` option, so the password is in no
runner artifact); the password itself is kept where only the controller reads it: a Secret in the
controller's own namespace (``sources.kube.KubeSecrets``) or, for the directory source, a 0600
file in a 0700 directory (``sources.file_secrets.FileSecrets``). It reaches crawlers only through
discovery, for a token scoped to that namespace. It is never logged, never in a status, an Event or a metric.

A credential belongs to one namespace, not to a name: it records the namespace's identity (its
uid on Kubernetes; on the directory source, where a namespace is only a name in one Proxy
directory, that directory). A namespace deleted and made again under the same name has another
identity, and the stored credential of the old one is never used or handed out: the new one gets
its own. A credential outlives the last Proxy of its namespace by a grace period only
(``grace_seconds``): the sweep marks it unused (``unusedSince`` in the record) and removes it once
that long has passed without a Proxy there, so a namespace re-created after that starts afresh
whatever its identity, and one that gets a Proxy back within it (a Proxy deleted and applied
again) keeps its credential.

Rotation: delete the Secret (or the file), or annotate the Secret ``crawl.example.com/rotate``;
the next sweep makes a new credential and keeps the previous one, so instances are replaced make
before break (the credential's generation is part of each instance's build hash) while the old
ones keep answering the old password until their successors serve.

Used by ``reconcile`` (the access each instance is built with, and ``refresh`` once per sweep)
and ``cli`` (discovery URLs, through ``by_generation``, which only ever reads).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

import bcrypt

from egress_proxies.providers.client import AccessRequest
from egress_proxies.resources import times
from egress_proxies.resources.proxy import Proxy, checked_namespace
from egress_proxies.serving.probe import ProbeCredentials

log = logging.getLogger(__name__)

PASSWORD_BYTES = 24  # 192 bits, well above the 128 the threat model asks for
# A user name is the namespace's first characters and 64 random bits: at most 64 characters,
# what the modules' access option takes.
USER_PREFIX_CHARS = 47
USER_SUFFIX_BYTES = 8
BCRYPT_ROUNDS = 10  # squid checks the hash once per new client connection (basic auth is cached)
# How long a credential outlives the last Proxy of its namespace (--credential-grace): a Proxy
# deleted and applied again keeps it; a namespace that stays empty longer loses it.
GRACE_SECONDS = 600.0
# How long discovery trusts what it read of a credential it did not make (a standby's view).
READ_SECONDS = 10.0
IDENTITY_FIELD = "namespaceIdentity"
UNUSED_FIELD = "unusedSince"
_PREVIOUS = "previous."


@dataclass(frozen=True)
class Credential:
    namespace: str
    user: str
    password: str = field(repr=False)
    password_hash: str = field(repr=False)
    generation: str = ""
    # The namespace it was made for (its uid on Kubernetes): a namespace of the same name with
    # another identity never gets it.
    identity: str = ""

    def proxy_url(self, endpoint: str) -> str:
        """``http://user:password@endpoint``: what a crawler configures."""
        return f"http://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{endpoint}"

    def as_data(self) -> dict[str, str]:
        return {"user": self.user, "password": self.password, "passwordHash": self.password_hash,
                "generation": self.generation, IDENTITY_FIELD: self.identity}

    @classmethod
    def from_data(cls, namespace: str, data: Mapping[str, str]) -> Credential | None:
        try:
            return cls(namespace, data["user"], data["password"], data["passwordHash"], data["generation"],
                       data.get(IDENTITY_FIELD, ""))
        except KeyError:
            return None

    @classmethod
    def previous_from_data(cls, namespace: str, data: Mapping[str, str]) -> Credential | None:
        """The previous credential a record keeps (``previous.*``) for instances built with it."""
        return cls.from_data(namespace, {k[len(_PREVIOUS):]: v for k, v in data.items() if k.startswith(_PREVIOUS)})


def new_credential(namespace: str, identity: str = "") -> Credential:
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()
    # The user name is as unguessable as a second password: squid (5.7, measured) caches one
    # authentication state per user name, so a wrong password interleaved with the right one for
    # the same user is sometimes let through; a stranger who cannot name the user gets nowhere.
    user = f"{namespace[:USER_PREFIX_CHARS]}-{secrets.token_hex(USER_SUFFIX_BYTES)}"
    return Credential(namespace=namespace, user=user, password=password,
                      password_hash=hashed, generation=secrets.token_hex(4), identity=identity)


class UnknownNamespace(LookupError):
    """No identity is known for the namespace in this sweep (it does not exist, or is not listed
    yet): no credential is made or handed out for it."""


class SecretBackend(Protocol):
    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        """The stored fields and whether a rotation was asked for; None when there is none."""

    def load_all(self) -> dict[str, tuple[dict[str, str], bool]]:
        """``load`` of every stored namespace, by namespace."""

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        """Store (create or replace) the namespace's fields, clearing any rotation request."""

    def delete(self, namespace: str) -> None:
        """Remove the namespace's record (one already gone is success)."""


class Credentials:
    """The credential of each Proxy namespace, made on first use; thread-safe (providers are
    reconciled side by side, discovery reads from its own threads). ``refresh`` is called once
    per sweep with the identities of the namespaces that have Proxies: a rotation, a deleted
    record or a re-created namespace is noticed then, and unused credentials are retired.
    ``scope``: the one namespace this controller watches (``--namespace``), whose records alone
    it may retire; None: every namespace."""

    def __init__(self, backend: SecretBackend, grace_seconds: float = GRACE_SECONDS, scope: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.grace_seconds = grace_seconds
        self.scope = scope
        self.clock = clock
        self._lock = threading.Lock()
        self._identities: dict[str, str] = {}
        self._current: dict[str, Credential] = {}
        self._previous: dict[str, Credential] = {}
        # What discovery read from the store for namespaces this process has not made current (a
        # standby serves discovery without sweeping): when, and the current and previous
        # credential. Read again after READ_SECONDS, so a standby follows rotations; cleared by
        # ``refresh``.
        self._read: dict[str, tuple[float, tuple[Credential | None, Credential | None]]] = {}
        # The last credential seen per namespace: a deleted Secret loses its fields, but the
        # instances built with them still answer only them until they are replaced.
        self._known: dict[str, Credential] = {}

    def refresh(self, identities: Mapping[str, str]) -> None:
        """The start of a sweep. ``identities``: the identity of each namespace that has a Proxy
        now (a namespace that has none, or does not exist, is absent)."""
        with self._lock:
            self._current.clear()
            self._read.clear()
            self._identities = dict(identities)
        self._retire_unused(identities)

    def knows(self, namespace: str) -> bool:
        """Whether ``current`` can answer for ``namespace`` in this sweep."""
        with self._lock:
            return namespace in self._identities

    def current(self, namespace: str) -> Credential:
        """The namespace's credential, made (and stored) when it has none of its own yet."""
        with self._lock:
            found = self._current.get(namespace)
            if found is None:
                identity = self._identities.get(namespace)
                if identity is None:
                    raise UnknownNamespace(f"namespace {namespace!r} is not among this sweep's namespaces")
                found = self._current[namespace] = self._load_or_make(checked_namespace(namespace), identity)
                self._known[namespace] = found
            return found

    def by_generation(self, namespace: str, generation: str | None) -> Credential | None:
        """The credential an instance of that generation was built with (current or previous);
        None for no generation or an unknown one. Only reads: never makes or writes a credential."""
        if not generation:
            return None
        current, previous = self._stored(namespace)
        return next((c for c in (current, previous) if c is not None and c.generation == generation), None)

    def _stored(self, namespace: str) -> tuple[Credential | None, Credential | None]:
        now = self.clock()
        with self._lock:
            if namespace in self._current:
                return self._current[namespace], self._previous.get(namespace)
            read = self._read.get(namespace)
            if read is not None and now - read[0] < READ_SECONDS:
                return read[1]
        try:
            stored = self.backend.load(checked_namespace(namespace))
        except ValueError:
            stored = None
        data = stored[0] if stored is not None else {}
        found = Credential.from_data(namespace, data), Credential.previous_from_data(namespace, data)
        with self._lock:
            self._read[namespace] = (now, found)
        return found

    def _load_or_make(self, namespace: str, identity: str) -> Credential:
        # The previous credential comes from the record (or, for a record deleted to rotate, from
        # memory), and only when it was made for this very namespace.
        self._previous.pop(namespace, None)
        stored = self.backend.load(namespace)
        if stored is None:
            log.info("credentials of namespace %s: none stored; made new ones", namespace)
            known = self._known.get(namespace)
            if known is not None and known.identity == identity:  # deleted to rotate: the old one answers
                self._previous[namespace] = known  # until its instances are replaced
            return self._make(namespace, identity)
        data, rotate = stored
        credential = Credential.from_data(namespace, data)
        if credential is not None and credential.identity != identity:
            # Another namespace of that name (deleted and made again): nothing of its record is
            # kept, and its instances, if any are left, are not this namespace's.
            log.info("credentials of namespace %s: stored for another namespace of that name (%s, now %s); made "
                     "new ones", namespace, credential.identity or "identity unrecorded", identity)
            return self._make(namespace, identity)
        previous = Credential.previous_from_data(namespace, data)
        if previous is not None and previous.identity == identity:
            self._previous[namespace] = previous
        if credential is not None and not rotate:
            return credential
        if credential is not None:  # rotation asked: the old one answers until replaced
            self._previous[namespace] = credential
        log.info("credentials of namespace %s: %s", namespace,
                 "rotated (asked for)" if rotate else "stored fields incomplete; made anew")
        return self._make(namespace, identity)

    def _make(self, namespace: str, identity: str) -> Credential:
        credential = new_credential(namespace, identity)
        data = credential.as_data()
        previous = self._previous.get(namespace)
        if previous is not None:
            data.update({f"{_PREVIOUS}{k}": v for k, v in previous.as_data().items()})
        self.backend.save(namespace, data)
        return credential

    def _retire_unused(self, in_use: Mapping[str, str]) -> None:
        """The records of namespaces without a Proxy: marked unused when the last one has gone,
        removed ``grace_seconds`` later; one with a rotation asked for is removed at once (the
        next Proxy there gets a new credential). A namespace with Proxies again is unmarked."""
        now = self.clock()
        for namespace, (data, rotate) in self.backend.load_all().items():
            if self.scope is not None and namespace != self.scope:
                continue
            since = times.epoch_seconds(data.get(UNUSED_FIELD))
            if namespace in in_use:
                if UNUSED_FIELD in data and not rotate:  # a rotation's save clears it anyway
                    self.backend.save(namespace, {k: v for k, v in data.items() if k != UNUSED_FIELD})
                continue
            if rotate or (since is not None and now - since >= self.grace_seconds):
                self.backend.delete(namespace)
                with self._lock:
                    for cache in (self._current, self._previous, self._known, self._read):
                        cache.pop(namespace, None)
                log.info("credentials of namespace %s removed: %s", namespace,
                         "a rotation was asked for while no Proxy uses them" if rotate else
                         f"no Proxy there for {self.grace_seconds:g} s")
            elif since is None:
                self.backend.save(namespace, {**data, UNUSED_FIELD: times.stamp(now)})
                log.info("credentials of namespace %s: no Proxy there any more; removed in %g s unless one comes "
                         "back", namespace, self.grace_seconds)


class AccessPolicy:
    """Who may use each Proxy's instance: its namespace's credential (or none, for
    ``spec.auth: none``) and its source networks (``spec.allowedSources``, else its provider's);
    and the internal networks it may reach (``spec.allowedDestinations``, else its provider's)."""

    def __init__(self, credentials: Credentials, provider_sources: Mapping[str, tuple[str, ...]],
                 provider_destinations: Mapping[str, tuple[str, ...]] | None = None, policy_version: str = "") -> None:
        self.credentials = credentials
        self.provider_sources = provider_sources
        self.provider_destinations = provider_destinations or {}
        self.policy_version = policy_version

    def request(self, proxy: Proxy) -> AccessRequest:
        sources = tuple(str(s) for s in proxy.spec.get("allowedSources") or ()) or tuple(
            self.provider_sources.get(proxy.provider, ()))
        destinations = tuple(str(d) for d in proxy.spec.get("allowedDestinations") or ()) or tuple(
            self.provider_destinations.get(proxy.provider, ()))
        if proxy.spec.get("auth") == "none":
            return AccessRequest(users=(), allowed_sources=sources, open=True, allowed_destinations=destinations,
                                 policy_version=self.policy_version)
        credential = self.credentials.current(proxy.namespace)
        return AccessRequest(users=((credential.user, credential.password_hash),), allowed_sources=sources,
                             generation=credential.generation, allowed_destinations=destinations,
                             policy_version=self.policy_version)

    def probe_credentials(self, proxy: Proxy, generation: str | None) -> ProbeCredentials | None:
        """What the probe authenticates with: the credential the instance was built with."""
        if proxy.spec.get("auth") == "none":
            return None
        credential = self.credentials.by_generation(proxy.namespace, generation)
        return None if credential is None else ProbeCredentials(credential.user, credential.password)
