"""The controller's half of the module contract (docs/contract.md): the only place that knows
module names, argument names, the base64 user-data transport, result shapes and error-class
strings.

``reconcile`` and its parts ask a ``ProviderClient`` for batch verbs (``list``, ``get``,
``create``, ``delete``) and get typed values back (``Instance``, ``Result``, ``Listing``);
each verb is one runner call for the whole batch. ``ProviderSet`` is the provider config as
the controller needs it: which providers exist, of which type, and which are valid
(``check_config`` asks the collection's own validator, the ``provider_config_info`` module,
so there is one validator for the modules, the controller and the deploy playbook).
"""

from __future__ import annotations

import base64
import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egress_proxies.providers.errors import ErrorClass, ProviderError
from egress_proxies.providers.runner import Operation, OperationResult, Runner
from egress_proxies.resources.proxy import (
    DEFAULT_PORT,
    OWNER_TAG,
    PROXY_TAG,
    SPEC_HASH_TAG,
    UID_TAG,
    Proxy,
    instance_tags,
)


class ProviderType(enum.StrEnum):
    """A provider's ``type`` in the provider config."""

    KVM = "kvm"
    GCP = "gcp"
    KUBERNETES = "kubernetes"

    @property
    def module_prefix(self) -> str:
        """The contract's ``P`` in ``P_proxy`` / ``P_proxy_info``."""
        return _MODULE_PREFIX[self]


_MODULE_PREFIX = {ProviderType.KVM: "kvm", ProviderType.GCP: "gcp", ProviderType.KUBERNETES: "k8s"}
CONFIG_MODULE = "provider_config_info"
# A location's (a KVM host's) states other than active: both take no new instances; every instance
# on a draining one is replaced elsewhere, those on a cordoned one stay.
CORDONED = "cordoned"
DRAINING = "draining"


@dataclass(frozen=True)
class Instance:
    """One instance as a provider reports it (the contract's ``instance`` dict, typed)."""

    provider_id: str
    name: str = ""
    location: str = ""
    state: str = "pending"  # pending | running | stopped | error
    ip: str | None = None
    endpoint: str | None = None
    """``host:port`` a crawler dials, as the provider reports it (docs/contract.md); ``ip`` is the
    instance's own address, which it need not be (a Pod behind a NodePort or a load balancer)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    created: str | None = None
    exposure: str | None = None
    """How crawlers reach ``endpoint`` and whether a passing probe proves the path a crawler outside
    takes, where the provider can tell (docs/contract.md, ``status.exposure``)."""

    @classmethod
    def from_result(cls, data: Mapping[str, Any]) -> Instance:
        tags = data.get("tags") or {}
        return cls(provider_id=str(data.get("provider_id") or ""), name=str(data.get("name") or ""),
                   location=str(data.get("location") or ""), state=str(data.get("state") or "pending"),
                   ip=str(data["ip"]) if data.get("ip") else None,
                   tags={str(k): str(v) for k, v in tags.items()} if isinstance(tags, Mapping) else {},
                   created=str(data["created"]) if data.get("created") else None,
                   endpoint=str(data["endpoint"]) if data.get("endpoint") else None,
                   exposure=str(data["exposure"]) if data.get("exposure") else None)

    @property
    def running(self) -> bool:
        """Running with an address and an endpoint (docs/contract.md: a provider reports an
        instance ``running`` only once it has both): the provider's half of Ready."""
        return self.state == "running" and bool(self.ip) and bool(self.endpoint)

    @property
    def uid(self) -> str | None:
        return self.tags.get(UID_TAG)

    @property
    def owner(self) -> str | None:
        return self.tags.get(OWNER_TAG)

    @property
    def proxy_key(self) -> str | None:
        return self.tags.get(PROXY_TAG)

    @property
    def spec_hash(self) -> str | None:
        return self.tags.get(SPEC_HASH_TAG)


@dataclass(frozen=True)
class Result:
    """One item's outcome: an instance (create, get) or just success (delete), or an error."""

    instance: Instance | None = None
    error: ProviderError | None = None
    changed: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, error_class: ErrorClass, message: str) -> Result:
        return cls(error=ProviderError(error_class, message))

    @classmethod
    def from_batch(cls, outcome: OperationResult, count: int) -> list[Result]:
        """One Result per item of a batch-form run, in order. A run that failed as a whole (no
        item was tried: an unreadable config, a provider that cannot be opened, a killed run)
        fails every item with its class; a run that answered the wrong number of results is a
        fault of ours, transient so the items are tried again."""
        if not outcome.ok:
            return [cls.failed(ErrorClass.of(outcome.error_class), outcome.message)] * count
        items = outcome.result.get("results")
        if not isinstance(items, list) or len(items) != count:
            got = len(items) if isinstance(items, list) else "no"
            return [cls.failed(ErrorClass.TRANSIENT, f"the module returned {got} results for {count} items")] * count
        return [cls.from_item(item) for item in items]

    @classmethod
    def from_item(cls, item: Any) -> Result:
        """One entry of a batch-form run's ``results``: its instance, or its own error class."""
        if not isinstance(item, Mapping):
            return cls.failed(ErrorClass.TRANSIENT, "the module returned a result that is not a mapping")
        if not item.get("ok"):
            return cls.failed(ErrorClass.of(item.get("error_class")),
                              str(item.get("msg") or "failed without a message"))
        instance = item.get("instance")
        return cls(instance=Instance.from_result(instance) if isinstance(instance, Mapping) else None,
                   changed=bool(item.get("changed")))


@dataclass
class Listing:
    """A provider's instances from one info call. ``complete`` is False when any location failed
    (``instances`` then holds what the reachable locations returned)."""

    instances: list[Instance] = field(default_factory=list)
    error: ProviderError | None = None
    _by_uid: dict[str, list[Instance]] | None = field(default=None, repr=False)

    @property
    def complete(self) -> bool:
        return self.error is None

    def of(self, uid: str) -> list[Instance]:
        """The instances of one Proxy (indexed once: a sweep asks this for every Proxy)."""
        if self._by_uid is None:
            self._by_uid = {}
            for instance in self.instances:
                self._by_uid.setdefault(instance.uid or "", []).append(instance)
        return self._by_uid.get(uid, [])


@dataclass(frozen=True)
class AccessRequest:
    """Who may use an instance and where it may go (the modules' ``access`` option): users by
    bcrypt hash (never a password), the source networks, or ``open`` (``spec.auth: none``), and
    the internal networks opened on purpose."""

    users: tuple[tuple[str, str], ...] = field(repr=False)  # (name, bcrypt hash)
    allowed_sources: tuple[str, ...]
    open: bool = False
    generation: str = ""  # the credential's generation: part of the build hash, never a secret
    allowed_destinations: tuple[str, ...] = ()
    policy_version: str = ""  # the collection's access policy (provider_config_info)

    @property
    def fingerprint(self) -> str:
        """What, changed, must replace the instance: a rotation, other sources or destinations,
        auth turned off, or a new version of the policy the modules deliver."""
        return (f"{'open' if self.open else self.generation}|{','.join(self.allowed_sources)}"
                f"|{','.join(self.allowed_destinations)}|policy {self.policy_version}")

    def arguments(self) -> dict[str, Any]:
        return {"users": [] if self.open else [{"name": n, "password_hash": h} for n, h in self.users],
                "allowed_sources": list(self.allowed_sources),
                "allowed_destinations": list(self.allowed_destinations), "open": self.open}


@dataclass(frozen=True)
class CreateRequest:
    """Everything a create needs, built from a Proxy in one place (``for_proxy``)."""

    key: str  # the Proxy's uid: what the runner files the call's artifacts under
    name: str
    user_data_base64: str
    port: int
    tags: Mapping[str, str]
    location: str | None = None
    machine_type: str | None = None
    image: str | None = None
    access: AccessRequest | None = None

    @classmethod
    def for_proxy(cls, proxy: Proxy, owner: str, name: str, hash_of_spec: str,
                  access: AccessRequest | None = None) -> CreateRequest:
        spec = proxy.spec
        raw = spec.get("cloudInit") or ""
        # base64 on the wire whatever the Proxy says: binary-safe, and never a template.
        encoded = raw if spec.get("cloudInitEncoding") == "base64" else base64.b64encode(raw.encode()).decode()
        return cls(key=proxy.uid, name=name, user_data_base64=encoded, port=int(spec.get("port") or DEFAULT_PORT),
                   tags=instance_tags(owner, proxy, hash_of_spec), location=spec.get("location") or None,
                   machine_type=spec.get("machineType") or None, image=spec.get("image") or None, access=access)

    def arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"state": "present", "name": self.name, "user_data": self.user_data_base64,
                                "user_data_encoding": "base64", "port": self.port, "tags": dict(self.tags)}
        for arg, value in (("location", self.location), ("machine_type", self.machine_type),
                           ("image", self.image)):
            if value:
                args[arg] = value
        if self.access is not None:
            args["access"] = self.access.arguments()
        return args


@dataclass(frozen=True)
class Target:
    """An existing instance to get or delete, and the key (a Proxy uid) it is done for."""

    key: str
    provider_id: str


class ProviderClient:
    """Batch verbs on one configured provider; each verb is one runner call."""

    def __init__(self, runner: Runner, config_path: str, name: str, provider_type: ProviderType) -> None:
        self.runner = runner
        self.config_path = config_path
        self.name = name
        self.type = provider_type
        self._module = f"{provider_type.module_prefix}_proxy"

    def _common(self) -> dict[str, Any]:
        return {"provider_config": self.config_path, "provider": self.name}

    def list_instances(self, owner: str) -> Listing:
        outcome = self.runner.run(self.name, "list", [
            Operation(f"{self._module}_info", {**self._common(), "tags": {OWNER_TAG: owner}})])[0]
        listed = outcome.result.get("instances")
        instances = [Instance.from_result(i) for i in listed or [] if isinstance(i, Mapping)]
        if outcome.ok and not isinstance(listed, list):
            # A listing that says nothing is not an empty one: taken for "no instances", it would
            # have every Proxy's instance created again.
            return Listing(error=ProviderError(ErrorClass.TRANSIENT,
                                               "the list call succeeded but returned no 'instances' list"))
        if outcome.ok:
            return Listing(instances=instances)
        return Listing(instances=instances,
                       error=ProviderError(ErrorClass.of(outcome.error_class), outcome.message))

    def get(self, targets: Sequence[Target], verb: str = "get") -> list[Result]:
        return self._run(verb, f"{self._module}_info", "provider_ids", [t.provider_id for t in targets],
                         [t.key for t in targets])

    def create(self, requests: Sequence[CreateRequest], verb: str = "create") -> list[Result]:
        # kvm_proxy reports base image transfers (minutes long) to a file the runner follows.
        progress = "progress_path" if self.type is ProviderType.KVM else ""
        return self._run(verb, self._module, "operations", [{**r.arguments(), "key": r.key} for r in requests],
                         [r.key for r in requests], progress)

    def delete(self, targets: Sequence[Target], verb: str = "delete") -> list[Result]:
        return self._run(verb, self._module, "operations",
                         [{"state": "absent", "provider_id": t.provider_id, "key": t.key} for t in targets],
                         [t.key for t in targets])

    def _run(self, verb: str, module: str, option: str, items: Sequence[Any], keys: Sequence[str],
             progress_option: str = "") -> list[Result]:
        """The whole batch as ONE module run (the modules' batch form, ``operations`` or
        ``provider_ids``): one process, one config parse, one connection per host for all items.
        The artifacts are indexed under every item's key, so purging one Proxy's still finds them."""
        if not items:
            return []
        operation = Operation(module, {**self._common(), option: list(items)}, key=keys[0], keys=tuple(keys),
                              progress_option=progress_option)
        (outcome,) = self.runner.run(self.name, verb, [operation])
        return Result.from_batch(outcome, len(items))


@dataclass(frozen=True)
class ProbeSettings:
    """A provider's ``probe`` as ``provider_config_info`` returns it: validated by the collection,
    every default filled in there (docs/contract.md, "provider_config_info"), so this only types
    the wire form and adds no default of its own. ``http_url`` and ``key_file`` are None when the
    provider names no probe target (no ``probe`` section)."""

    enabled: bool
    http_url: str | None
    key_file: str | None
    expect_status: int
    connect: str | None
    egress_echo_url: str | None
    control_url: str | None
    timeout_seconds: float
    unhealthy_after_seconds: float
    startup_seconds: float
    concurrency: int
    round_seconds: float
    # A chronic flapper (sweep/flapping.py): flap_percent % of its last flap_window probes failed.
    flap_window: int
    flap_percent: int

    @classmethod
    def from_result(cls, data: Mapping[str, Any]) -> ProbeSettings:
        """Raises KeyError (a missing field) or ValueError/TypeError (a wrong type): a module that
        does not speak this contract."""
        return cls(enabled=bool(data["enabled"]), http_url=data["httpUrl"] or None, key_file=data["keyFile"] or None,
                   expect_status=int(data["expectStatus"]), connect=data["connect"] or None,
                   egress_echo_url=data["egressEchoUrl"] or None, control_url=data["controlUrl"] or None,
                   timeout_seconds=float(data["timeoutSeconds"]),
                   unhealthy_after_seconds=float(data["unhealthyAfterSeconds"]),
                   startup_seconds=float(data["startupSeconds"]), concurrency=int(data["concurrency"]),
                   round_seconds=float(data["roundSeconds"]), flap_window=int(data["flapWindow"]),
                   flap_percent=int(data["flapPercent"]))


class ConfigUnreadable(Exception):
    """The provider config cannot be used at all: unreadable, not YAML, or invalid at its root.
    ``errors`` holds every error apart, each with its field path, for a person to read one a line."""

    def __init__(self, message: str, errors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.errors = tuple(errors) or (message,)


@dataclass(frozen=True)
class ProviderSet:
    """The provider config as the controller needs it: every provider's name and type, which of
    them are valid, and every error the collection's validator found (field paths included)."""

    path: str
    owner: str
    types: Mapping[str, ProviderType]
    invalid: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> its errors
    errors: tuple[str, ...] = ()  # every error, root and per provider
    digest: str = ""
    probes: Mapping[str, ProbeSettings] = field(default_factory=dict)  # name -> its probe settings
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> default allowed sources
    # name -> what its backend showed wrong (only asked for by ``check_config(check_backends=True)``)
    backend_errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    destinations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> opened destinations
    policy_version: str = ""  # the access policy the collection's modules deliver
    # name -> what its proxies will be reachable at and from (one sentence each), for --check-config
    reachability: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # name -> errors that keep single locations (a KVM host) from new proxies; the provider stays usable
    location_errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # name -> {location: "cordoned" | "draining"}: locations that take no new proxies on purpose
    location_states: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def states(self, name: str) -> Mapping[str, str]:
        """The locations of provider ``name`` taken out of placement, and their state."""
        return self.location_states.get(name, {})

    def clients(self, runner: Runner) -> dict[str, ProviderClient]:
        """A client for every valid provider."""
        return {name: ProviderClient(runner, self.path, name, provider_type)
                for name, provider_type in self.types.items() if name not in self.invalid}

    @property
    def valid(self) -> bool:
        return not self.errors


def _validated(runner: Runner, absolute: str, check_backends: bool) -> dict[str, Any]:
    """``provider_config_info``'s result for the file; ConfigUnreadable when it has none."""
    # "_config" can never be a provider's name (names start with a letter or digit): the runner's
    # metrics count this call apart from every provider's.
    arguments = {"provider_config": absolute, **({"check_backends": True} if check_backends else {})}
    outcome = runner.run("_config", "check", [Operation(CONFIG_MODULE, arguments)])[0]
    if not outcome.ok and not outcome.result:
        # The validator never ran (no module result at all: a collection not found, a killed
        # run): nothing is known about the file, so the message must not blame it.
        raise ConfigUnreadable(f"provider config {absolute}: not checked: the collection's {CONFIG_MODULE} "
                               f"did not run ({outcome.message}); is crawl.egress_proxies installed in "
                               "ANSIBLE_COLLECTIONS_PATH?")
    if not outcome.ok:
        raise ConfigUnreadable(f"provider config {absolute}: {outcome.message}")
    return dict(outcome.result)


def check_config(runner: Runner, path: str, previous: ProviderSet | None = None,
                 check_backends: bool = False) -> ProviderSet:
    """Validate the provider config with the collection's ``provider_config_info`` module.

    Raises ConfigUnreadable when no provider can be used (unreadable, not YAML, root errors such
    as a missing owner); otherwise the valid providers work while the invalid ones are named
    with their errors. ``previous`` is returned as it is when the file's content is unchanged.
    ``check_backends`` (``--check-config``) also asks each provider's backend (credentials,
    scopes, firewall) and fills ``backend_errors``.
    """
    absolute = str(Path(path).absolute())
    try:
        digest = hashlib.sha256(Path(absolute).read_bytes()).hexdigest()
    except OSError as error:
        raise ConfigUnreadable(f"provider config {absolute}: cannot read it: {error.strerror}") from error
    if previous is not None and previous.digest == digest and previous.path == absolute:
        return previous
    data = _validated(runner, absolute, check_backends)
    errors = tuple(str(e) for e in data.get("errors") or [])
    types: dict[str, ProviderType] = {}
    invalid: dict[str, tuple[str, ...]] = {}
    probes: dict[str, ProbeSettings] = {}
    sources: dict[str, tuple[str, ...]] = {}
    backend_errors: dict[str, tuple[str, ...]] = {}
    destinations: dict[str, tuple[str, ...]] = {}
    reachability: dict[str, tuple[str, ...]] = {}
    location_errors: dict[str, tuple[str, ...]] = {}
    location_states: dict[str, dict[str, str]] = {}
    for provider in data.get("providers") or []:
        name = str(provider.get("name"))
        location_states[name] = {str(k): str(v) for k, v in (provider.get("location_states") or {}).items()}
        if provider.get("location_errors"):
            location_errors[name] = tuple(str(e) for e in provider["location_errors"])
        sources[name] = tuple(str(s) for s in provider.get("allowed_sources") or ())
        reachability[name] = tuple(str(line) for line in provider.get("reachability") or ())
        if provider.get("backend_errors"):
            backend_errors[name] = tuple(str(e) for e in provider["backend_errors"])
        destinations[name] = tuple(str(d) for d in provider.get("allowed_destinations") or ())
        try:
            types[name] = ProviderType(str(provider.get("type")))
        except ValueError:
            invalid[name] = (f"unknown provider type {provider.get('type')!r}",)
            continue
        if not provider.get("valid", False):
            invalid[name] = tuple(str(e) for e in provider.get("errors") or []) or ("invalid",)
            continue
        try:
            probes[name] = ProbeSettings.from_result(provider.get("probe") or {})
        except (KeyError, TypeError, ValueError) as error:
            why = (f"{CONFIG_MODULE} returned no usable probe settings ({error!r}): the collection and the "
                   "controller do not speak the same contract; install matching versions")
            invalid[name] = (why,)
    owner = data.get("owner")
    if not owner:  # a root error (the owner tags every instance): no provider is usable
        every = errors or ("owner: missing",)
        raise ConfigUnreadable(f"provider config {absolute}: " + "; ".join(every), every)
    return ProviderSet(path=absolute, owner=str(owner), types=types, invalid=invalid, errors=errors, digest=digest,
                       probes=probes, sources=sources, backend_errors=backend_errors, destinations=destinations,
                       policy_version=str(data.get("access_policy_version") or ""), reachability=reachability,
                       location_errors=location_errors, location_states=location_states)
