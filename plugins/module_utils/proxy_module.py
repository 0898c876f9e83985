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

from typing import Any, Callable, Dict, NoReturn, Optional, Protocol, Sequence, Tuple, TypeVar

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import decode_user_data
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    Provider as ProviderSettings,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    load_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    ProxyError,
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


class Provider(Protocol):
    """What every provider object offers the wrapper: a way to let go of its connections."""

    def close(self) -> None: ...


class InstanceProvider(Provider, Protocol):
    """The contract every provider's instance layer implements (design.md, "Modules")."""

    def create(self, request: InstanceRequest, check_mode: bool) -> Tuple[bool, Instance]: ...

    def delete(self, provider_id: str, check_mode: bool) -> bool: ...

    def get(self, provider_id: str) -> Instance: ...

    def list(self, tags: Dict[str, str]) -> ListResult: ...


P = TypeVar("P", bound=Provider)

COMMON_ARGUMENT_SPEC: Dict[str, Any] = {
    "provider_config": {"type": "path", "required": True},
    "provider": {"type": "str", "required": True},
}

# Options of the P_proxy modules (state present/absent).
INSTANCE_ARGUMENT_SPEC: Dict[str, Any] = {
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
}

# Options of the P_proxy_info modules.
INFO_ARGUMENT_SPEC: Dict[str, Any] = {
    "provider_id": {"type": "str"},
    "tags": {"type": "dict"},
}


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
        config = load_provider_config(self.params["provider_config"])
        return config.provider(self.params["provider"], self.provider_type)

    def instance_request(self) -> InstanceRequest:
        params = self.params
        return InstanceRequest(
            name=validate_name(params["name"]),
            user_data=decode_user_data(params["user_data"] or "", params["user_data_encoding"]),
            tags=validate_tags(params["tags"]),
            location=params["location"],
            machine_type=params["machine_type"],
            image=params["image"],
            port=validate_port(params["port"]),
            user_data_encoding=params["user_data_encoding"],
        )

    def warn(self, message: str) -> None:
        self.module.warn(message)

    def exit(self, **result: Any) -> NoReturn:
        self.module.exit_json(**result)
        raise AssertionError("exit_json returned")  # pragma: no cover - it always exits

    def fail_from(self, error: ProxyError) -> NoReturn:
        """Report ``error`` with its class (and its details); never an SDK traceback in place of a class."""
        self.module.fail_json(msg=str(error), error_class=error_class_of(error), **error.details)
        raise AssertionError("fail_json returned")  # pragma: no cover - it always exits

    def run(self, open_provider: Callable[["ProxyModule"], P], act: Callable[[P], Dict[str, Any]]) -> NoReturn:
        """Open the provider, act, report: the whole body of every module's ``main()``.

        Any ``ProxyError`` becomes a failure with its ``error_class``; the provider's
        connections are closed whatever happens.
        """
        provider: Optional[P] = None
        try:
            provider = open_provider(self)
            result = act(provider)
        except ProxyError as error:
            self.fail_from(error)
        finally:
            if provider is not None:
                provider.close()
        self.exit(**result)


def run_proxy_module(provider_type: str, scheme: str, libraries: Sequence[Tuple[str, bool]],
                     open_provider: Callable[[ProxyModule], InstanceProvider],
                     extra_spec: Optional[Dict[str, Any]] = None) -> NoReturn:
    """The ``P_proxy`` module: create by ``name`` (state present) or delete by ``provider_id``."""
    module = ProxyModule(
        dict(INSTANCE_ARGUMENT_SPEC, **(extra_spec or {})), provider_type, required_libs=libraries,
        supports_check_mode=True,
        required_if=[("state", "present", ["name"]), ("state", "absent", ["provider_id"])],
    )

    def act(provider: InstanceProvider) -> Dict[str, Any]:
        if module.params["state"] == "present":
            changed, instance = provider.create(module.instance_request(), module.check_mode)
            return {"changed": changed, "instance": instance.to_dict(), "provider_id": instance.provider_id}
        provider_id = module.params["provider_id"]
        parsed = parse_provider_id(provider_id, scheme)
        changed = provider.delete(provider_id, module.check_mode)
        gone = Instance(provider_id=provider_id, name=parsed.name, location=parsed.location, state="stopped")
        return {"changed": changed, "instance": gone.to_dict(), "provider_id": provider_id}

    module.run(open_provider, act)


def run_info_module(provider_type: str, libraries: Sequence[Tuple[str, bool]],
                    open_provider: Callable[[ProxyModule], InstanceProvider], locations: str) -> NoReturn:
    """The ``P_proxy_info`` module: one instance by ``provider_id``, or all carrying ``tags``.

    ``locations`` names the provider's locations in messages (``KVM host(s)``)."""
    module = ProxyModule(
        INFO_ARGUMENT_SPEC, provider_type, required_libs=libraries, supports_check_mode=True,
        mutually_exclusive=[("provider_id", "tags")], required_one_of=[("provider_id", "tags")],
    )

    def act(provider: InstanceProvider) -> Dict[str, Any]:
        if module.params["provider_id"]:
            return {"changed": False, "instances": [provider.get(module.params["provider_id"]).to_dict()]}
        return provider.list(validate_tags(module.params["tags"])).to_result(locations)

    module.run(open_provider, act)
