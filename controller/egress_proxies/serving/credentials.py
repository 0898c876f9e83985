"""Proxy credentials: one per Proxy namespace (a crawler team), made and kept by the controller.

A credential is a user name and a random password (192 bits). Only its bcrypt hash ever leaves
this module towards an instance (through the modules' ``access`` option, so the password is in no
runner artifact); the password itself is kept where only the controller reads it: a Secret in the
controller's own namespace (``kube.KubeSecrets``) or, for the directory source, a 0600 file in a
0700 directory (``FileSecrets``). It reaches crawlers only through discovery, for a token scoped
to that namespace. It is never logged, never in a status, an Event or a metric.

Rotation: delete the Secret (or the file), or annotate the Secret ``crawl.example.com/rotate``;
the next sweep makes a new credential and keeps the previous one, so instances are replaced make
before break (the credential's generation is part of each instance's build hash) while the old
ones keep answering the old password until their successors serve.

Used by ``reconcile`` (the access each instance is built with) and ``http`` (discovery URLs).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import bcrypt
import yaml

from egress_proxies.providers.client import AccessRequest
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.probe import ProbeCredentials

log = logging.getLogger(__name__)

PASSWORD_BYTES = 24  # 192 bits, well above the 128 the threat model asks for
BCRYPT_ROUNDS = 10  # squid checks the hash once per new client connection (basic auth is cached)


@dataclass(frozen=True)
class Credential:
    namespace: str
    user: str
    password: str = field(repr=False)
    password_hash: str = field(repr=False)
    generation: str = ""

    def proxy_url(self, endpoint: str) -> str:
        """``http://user:password@endpoint``: what a crawler configures."""
        return f"http://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{endpoint}"

    def as_data(self) -> dict[str, str]:
        return {"user": self.user, "password": self.password, "passwordHash": self.password_hash,
                "generation": self.generation}

    @classmethod
    def from_data(cls, namespace: str, data: Mapping[str, str]) -> Credential | None:
        try:
            return cls(namespace, data["user"], data["password"], data["passwordHash"], data["generation"])
        except KeyError:
            return None


def new_credential(namespace: str) -> Credential:
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()
    return Credential(namespace=namespace, user=f"crawl-{namespace}"[:63], password=password,
                      password_hash=hashed, generation=secrets.token_hex(4))


class SecretBackend(Protocol):
    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        """The stored fields and whether a rotation was asked for; None when there is none."""

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        """Store (create or replace) the namespace's fields, clearing any rotation request."""


class Credentials:
    """The credential of each Proxy namespace, made on first use; thread-safe (providers are
    reconciled side by side). ``refresh`` is called once per sweep: a rotation or a deleted
    Secret is noticed then, not on every lookup."""

    def __init__(self, backend: SecretBackend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._current: dict[str, Credential] = {}
        self._previous: dict[str, Credential] = {}
        # The last credential seen per namespace: a deleted Secret loses its fields, but the
        # instances built with them still answer only them until they are replaced.
        self._known: dict[str, Credential] = {}

    def refresh(self) -> None:
        with self._lock:
            self._current.clear()

    def current(self, namespace: str) -> Credential:
        with self._lock:
            found = self._current.get(namespace)
            if found is None:
                found = self._current[namespace] = self._load_or_make(namespace)
                self._known[namespace] = found
            return found

    def by_generation(self, namespace: str, generation: str | None) -> Credential | None:
        """The credential an instance of that generation was built with (current or previous)."""
        current = self.current(namespace)
        if generation in (None, "", current.generation):
            return current
        with self._lock:
            previous = self._previous.get(namespace)
        return previous if previous is not None and previous.generation == generation else None

    def _load_or_make(self, namespace: str) -> Credential:
        stored = self.backend.load(namespace)
        if stored is not None:
            data, rotate = stored
            credential = Credential.from_data(namespace, data)
            previous = Credential.from_data(namespace, {k[len("previous."):]: v for k, v in data.items()
                                                        if k.startswith("previous.")})
            if previous is not None:
                self._previous[namespace] = previous
            if credential is not None and not rotate:
                return credential
            if credential is not None:  # rotation asked: the old one answers until replaced
                self._previous[namespace] = credential
            log.info("credentials of namespace %s: %s", namespace,
                     "rotated (asked for)" if rotate else "stored fields incomplete; made anew")
        else:
            log.info("credentials of namespace %s: none stored; made new ones", namespace)
            if namespace in self._known:  # deleted to rotate: the old one answers until replaced
                self._previous[namespace] = self._known[namespace]
        credential = new_credential(namespace)
        data = credential.as_data()
        previous = self._previous.get(namespace)
        if previous is not None:
            data.update({f"previous.{k}": v for k, v in previous.as_data().items()})
        self.backend.save(namespace, data)
        return credential


class FileSecrets:
    """The directory source's store: ``<directory>/<namespace>.yaml``, each 0600, in a 0700
    directory. Deleting a file rotates that namespace's credential."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        try:
            data = yaml.safe_load((self.directory / f"{namespace}.yaml").read_text())
        except FileNotFoundError:
            return None
        except (OSError, yaml.YAMLError) as error:
            log.warning("credentials file of namespace %s unreadable (%s): making new ones", namespace,
                        type(error).__name__)  # never the content: it holds the password
            return None
        if not isinstance(data, dict):
            return None
        return {str(k): str(v) for k, v in data.items()}, False

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self.directory / f"{namespace}.yaml"
        temporary = path.with_name(f".{path.name}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(yaml.safe_dump(dict(data), sort_keys=True))
        os.replace(temporary, path)


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
