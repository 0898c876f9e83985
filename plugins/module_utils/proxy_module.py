# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one wrapper every ``*_proxy`` and ``*_proxy_info`` module is built on.

It merges the shared options (documented once in ``doc_fragments/common.py``),
loads the provider config, turns module parameters into an ``InstanceRequest``, and
offers ``fail_from(error)``, which always reports ``msg`` and ``error_class``.
``run_proxy_module`` and ``run_info_module`` are the whole ``main()`` of the modules:
every provider answers the same contract, so the modules differ only in their docs.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Dict, List, NoReturn, Optional, Protocol, Sequence, Tuple, TypeVar

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import decode_user_data
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    Provider as ProviderSettings,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ProviderConfig,
    load_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    Permanent,
    ProxyError,
    Transient,
    error_class_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import (
    DEFAULT_PORT,
    Instance,
    InstanceRequest,
    ListResult,
    validate_name,
    validate_port,
    validate_tags,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import parse_provider_id
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access


class Provider(Protocol):
    """What every provider object offers the wrapper: a way to let go of its connections."""

    def close(self) -> None:
        ...


class InstanceProvider(Provider, Protocol):
    """The contract every provider's instance layer implements (docs/contract.md, "Modules")."""

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]:
        ...

    def delete(self, provider_id: str, check_mode: bool) -> bool:
        ...

    def get(self, provider_id: str) -> Instance:
        ...

    def list(self, tags: Dict[str, str]) -> ListResult:
        ...


class NameResolver(Protocol):
    """Providers that can delete by ``name`` (state=absent without a providerID) offer this."""

    def provider_ids_for(self, name: str, location: Optional[str]) -> List[str]:
        ...


P = TypeVar("P", bound=Provider)

COMMON_ARGUMENT_SPEC: Dict[str, Any] = {
    "provider_config": {"type": "path", "required": True},
    "provider": {"type": "str", "required": True},
}

# The single-instance options of the P_proxy modules (state present/absent); each item of
# ``operations`` takes the same ones, plus ``key``.
SINGLE_INSTANCE_OPTIONS: Dict[str, Any] = {
    "state": {"type": "str", "default": "present", "choices": ["present", "absent"]},
    "name": {"type": "str"},
    "location": {"type": "str"},
    "machine_type": {"type": "str"},
    "image": {"type": "str"},
    # user-data may carry credentials (squid auth, tokens): keep it out of logs and results.
    "user_data": {"type": "str", "default": "", "no_log": True},
    "user_data_encoding": {"type": "str", "default": "plain", "choices": ["plain", "base64"]},
    "port": {"type": "int", "default": DEFAULT_PORT},
    "tags": {"type": "dict", "default": {}},
    "provider_id": {"type": "str"},
    # Who may use the proxy (squid_access.py); the hashes are no secret, but stay out of results.
    "access": {"type": "dict", "options": {
        "users": {"type": "list", "elements": "dict", "default": [], "options": {
            "name": {"type": "str", "required": True},
            "password_hash": {"type": "str", "required": True, "no_log": True},
        }},
        "allowed_sources": {"type": "list", "elements": "str", "default": []},
        "allowed_destinations": {"type": "list", "elements": "str", "default": []},
        "open": {"type": "bool", "default": False},
    }},
}

# ``key`` is an opaque label (the Proxy's uid), not a secret: said explicitly, because the
# name alone makes ansible-test's validate-modules ask for no_log.
OPERATION_OPTIONS: Dict[str, Any] = dict(SINGLE_INSTANCE_OPTIONS, key={"type": "str", "no_log": False})

INSTANCE_ARGUMENT_SPEC: Dict[str, Any] = dict(
    SINGLE_INSTANCE_OPTIONS, operations={"type": "list", "elements": "dict", "options": OPERATION_OPTIONS})

# Options of the P_proxy_info modules.
INFO_ARGUMENT_SPEC: Dict[str, Any] = {
    "provider_id": {"type": "str"},
    "provider_ids": {"type": "list", "elements": "str"},
    "tags": {"type": "dict"},
}

# Items of one batch run side by side: most of an item's time is waiting on the backend
# (libvirt RPCs, HTTP), so threads overlap it; more than this buys little and would open
# more HTTP connections per run than the Kubernetes client's pool keeps (measured in
# docs/performance.md).
BATCH_PARALLELISM = 8


class ProxyModule:
    """An AnsibleModule with the shared options and the contract's failure shape."""

    def __init__(self, argument_spec: Dict[str, Any], provider_type: str,
                 required_libs: Sequence[Tuple[str, bool]] = (), **kwargs: Any) -> None:
        spec = dict(COMMON_ARGUMENT_SPEC)
        spec.update(argument_spec)
        self.module = AnsibleModule(argument_spec=spec, **kwargs)
        self.provider_type = provider_type
        for library, available in required_libs:
            if not available:
                self.module.fail_json(msg=missing_required_lib(library), error_class="permanent")

    @property
    def params(self) -> Dict[str, Any]:
        params: Dict[str, Any] = self.module.params
        return params

    @property
    def check_mode(self) -> bool:
        return bool(self.module.check_mode)

    def provider(self) -> ProviderSettings:
        """This module's provider section; a missing or wrong provider is Permanent."""
        return self.provider_config().provider(self.params["provider"], self.provider_type)

    def provider_config(self) -> ProviderConfig:
        """The whole provider config (its ``owner`` too); a file that cannot be read is Permanent."""
        return load_provider_config(self.params["provider_config"])

    def instance_request(self, params: Optional[Dict[str, Any]] = None) -> InstanceRequest:
        """The validated request of the single-instance options, or of one ``operations`` item."""
        params = self.params if params is None else params
        return InstanceRequest(
            name=validate_name(params["name"]),
            user_data=decode_user_data(params["user_data"] or "", params["user_data_encoding"]),
            tags=validate_tags(params["tags"]),
            location=params["location"],
            machine_type=params["machine_type"],
            image=params["image"],
            port=validate_port(params["port"]),
            user_data_encoding=params["user_data_encoding"],
            access=parse_access(params.get("access")),
        )

    def warn(self, message: str) -> None:
        self.module.warn(message)

    def exit(self, **result: Any) -> NoReturn:
        self.module.exit_json(**result)
        raise AssertionError("exit_json returned")  # pragma: no cover - it always exits

    def fail_from(self, error: ProxyError, **extra: Any) -> NoReturn:
        """Report ``error`` with its class (and its details); never an SDK traceback in place of a class."""
        self.module.fail_json(msg=str(error), error_class=error_class_of(error), **dict(extra, **error.details))
        raise AssertionError("fail_json returned")  # pragma: no cover - it always exits

    def run(self, open_provider: Callable[["ProxyModule"], P], act: Callable[[P], Dict[str, Any]]) -> NoReturn:
        """Open the provider, act, report: the whole body of every module's ``main()``.

        Any ``ProxyError`` becomes a failure with its ``error_class``; the provider's
        connections are closed whatever happens. A provider with a ``result_fields()`` adds
        those to the result either way (kvm_proxy: ``image_transfers``).
        """
        provider: Optional[P] = None
        try:
            provider = open_provider(self)
            result = act(provider)
        except ProxyError as error:
            self.fail_from(error, **_result_fields(provider))
        finally:
            if provider is not None:
                provider.close()
        self.exit(**dict(result, **_result_fields(provider)))


def _result_fields(provider: Optional[Provider]) -> Dict[str, Any]:
    fields = getattr(provider, "result_fields", None)
    return dict(fields()) if fields is not None else {}


Item = TypeVar("Item")


def item_failure(index: int, error: ProxyError, provider_id: Optional[str] = None,
                 key: Optional[str] = None) -> Dict[str, Any]:
    """One item's failure in a batch: its own class and message, naming the item."""
    return {"ok": False, "changed": False, "instance": None, "provider_id": provider_id, "key": key,
            "error_class": error_class_of(error), "msg": "operations[%d]: %s" % (index, error)}


def run_items(items: Sequence[Item], act_one: Callable[[int, Item], Dict[str, Any]],
              fail_one: Callable[[int, Item, ProxyError], Dict[str, Any]],
              group_of: Optional[Callable[[Item], str]] = None) -> List[Dict[str, Any]]:
    """``act_one`` on every item, BATCH_PARALLELISM at a time; one result per item, in order.

    Items of the same ``group_of`` (the instance they name) run one after the other, in the
    order given: side by side, a create and a delete of one name would interleave their
    steps (KVM's create removes a half-made overlay of its name, which could be the other
    item's). An item's failure is its result (``fail_one``), never the run's: the others go
    on. Anything that is not a ProxyError is a bug of ours in that item; it is reported as
    transient with its type, like any unclassified failure, instead of losing the batch.
    """
    def guarded(index: int) -> Dict[str, Any]:
        item = items[index]
        try:
            return act_one(index, item)
        except ProxyError as error:
            return fail_one(index, item, error)
        except Exception as error:  # noqa: BLE001 - see the docstring
            return fail_one(index, item, Transient("unexpected %s: %s" % (type(error).__name__, error)))

    groups: Dict[str, List[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(group_of(item) if group_of else str(index), []).append(index)
    results: List[Optional[Dict[str, Any]]] = [None] * len(items)

    def run_group(indexes: List[int]) -> None:
        for index in indexes:
            results[index] = guarded(index)

    if len(groups) <= 1:
        for indexes in groups.values():
            run_group(indexes)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(BATCH_PARALLELISM, len(groups))) as pool:
            list(pool.map(run_group, groups.values()))
    return [result for result in results if result is not None]


def _delete(provider: InstanceProvider, scheme: str, params: Dict[str, Any], check_mode: bool) -> Dict[str, Any]:
    """state=absent by ``provider_id``, or by ``name`` (and ``location``) as kubernetes.core does.

    By name, every location the name could be in is cleaned (the provider says which: a KVM
    provider without ``location`` names every host, so every host must answer); the
    reported instance is the one that was found, if any.
    """
    provider_id = params.get("provider_id")
    if provider_id:
        parsed = parse_provider_id(provider_id, scheme)
        changed = provider.delete(provider_id, check_mode)
        gone = Instance(provider_id=provider_id, name=parsed.name, location=parsed.location, state="stopped")
        return {"changed": changed, "instance": gone.to_dict(), "provider_id": provider_id}
    name = validate_name(params.get("name"))
    resolve = getattr(provider, "provider_ids_for", None)
    if resolve is None:
        raise Permanent("provider_id: this provider deletes by provider_id only; set provider_id")
    candidates: List[str] = resolve(name, params.get("location"))
    removed = [candidate for candidate in candidates if provider.delete(candidate, check_mode)]
    found = removed[0] if removed else (candidates[0] if len(candidates) == 1 else None)
    if found is None:
        instance: Dict[str, Any] = dict(Instance(provider_id="", name=name, location=params.get("location") or "",
                                                 state="stopped").to_dict(), provider_id=None,
                                        location=params.get("location"))
    else:
        parsed = parse_provider_id(found, scheme)
        instance = Instance(provider_id=found, name=parsed.name, location=parsed.location, state="stopped").to_dict()
    return {"changed": bool(removed), "instance": instance, "provider_id": found}


def _instance_name(item: Dict[str, Any], scheme: str) -> str:
    """The name an item acts on (its own, or its providerID's), for serializing same-name items."""
    if item.get("name"):
        return str(item["name"])
    try:
        return parse_provider_id(item.get("provider_id") or "", scheme).name
    except ProxyError:
        return ""  # the item fails on its own providerID anyway


def _act_on_instance(module: ProxyModule, provider: InstanceProvider, scheme: str,
                     params: Dict[str, Any]) -> Dict[str, Any]:
    """One create or delete, from the single-instance options or one ``operations`` item."""
    if params.get("state") == "absent":
        if not params.get("provider_id") and not params.get("name"):
            raise Permanent("provider_id: state=absent needs provider_id (or name, with location where the "
                            "provider needs one)")
        return _delete(provider, scheme, params, module.check_mode)
    if not params.get("name"):
        raise Permanent("name: state=present needs the instance's name")
    changed, instance = provider.create(module.instance_request(params), module.check_mode)
    return {"changed": changed, "instance": instance.to_dict(), "provider_id": instance.provider_id}


def run_proxy_module(provider_type: str, scheme: str, libraries: Sequence[Tuple[str, bool]],
                     open_provider: Callable[[ProxyModule], InstanceProvider],
                     extra_spec: Optional[Dict[str, Any]] = None) -> NoReturn:
    """The ``P_proxy`` module: create by ``name`` (state present), delete by ``provider_id`` or
    ``name`` (state absent), or a batch of both in ``operations``.

    A batch opens the provider once (one connection per KVM host, one API client) and runs
    its items side by side; each item gets its own result with its own ``error_class``, and
    the run fails only when the provider cannot be opened at all (then no item was tried).
    """
    module = ProxyModule(
        dict(INSTANCE_ARGUMENT_SPEC, **(extra_spec or {})), provider_type, required_libs=libraries,
        supports_check_mode=True,
        mutually_exclusive=[("operations", option) for option in SINGLE_INSTANCE_OPTIONS],
    )

    def act(provider: InstanceProvider) -> Dict[str, Any]:
        operations = module.params.get("operations")
        if operations is None:
            return _act_on_instance(module, provider, scheme, module.params)

        def act_one(_index: int, item: Dict[str, Any]) -> Dict[str, Any]:
            outcome = _act_on_instance(module, provider, scheme, item)
            return dict(outcome, ok=True, key=item.get("key"), error_class=None, msg="")

        def fail_one(index: int, item: Dict[str, Any], error: ProxyError) -> Dict[str, Any]:
            return item_failure(index, error, item.get("provider_id"), item.get("key"))

        results = run_items(operations, act_one, fail_one, lambda item: _instance_name(item, scheme))
        return {"changed": any(result["changed"] for result in results), "results": results}

    module.run(open_provider, act)


def run_info_module(provider_type: str, libraries: Sequence[Tuple[str, bool]],
                    open_provider: Callable[[ProxyModule], InstanceProvider], locations: str) -> NoReturn:
    """The ``P_proxy_info`` module: one instance by ``provider_id``, several by ``provider_ids``
    (one result each, side by side, like ``P_proxy``'s ``operations``), or all carrying ``tags``.

    ``locations`` names the provider's locations in messages (``KVM host(s)``)."""
    module = ProxyModule(
        INFO_ARGUMENT_SPEC, provider_type, required_libs=libraries, supports_check_mode=True,
        mutually_exclusive=[("provider_id", "provider_ids", "tags")],
        required_one_of=[("provider_id", "provider_ids", "tags")],
    )

    def act(provider: InstanceProvider) -> Dict[str, Any]:
        if module.params["provider_id"]:
            return {"changed": False, "instances": [provider.get(module.params["provider_id"]).to_dict()]}
        if module.params["provider_ids"] is not None:
            def get_one(_index: int, provider_id: str) -> Dict[str, Any]:
                instance = provider.get(provider_id)
                return {"ok": True, "changed": False, "instance": instance.to_dict(),
                        "provider_id": instance.provider_id, "error_class": None, "msg": ""}

            def fail_one(index: int, provider_id: str, error: ProxyError) -> Dict[str, Any]:
                failure = item_failure(index, error, provider_id)
                failure.pop("key")
                failure["msg"] = "provider_ids[%d]: %s" % (index, error)
                return failure

            return {"changed": False, "results": run_items(module.params["provider_ids"], get_one, fail_one)}
        return provider.list(validate_tags(module.params["tags"])).to_result(locations)

    module.run(open_provider, act)
