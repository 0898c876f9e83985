# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the two KVM modules share: their libraries and how they build the provider."""

from __future__ import annotations

from typing import List, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import HAS_PYCDLIB
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import HAS_YAML
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.client import HAS_LIBVIRT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.images import (
    TransferReport,
    default_cache_dir,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.instances import KvmProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import ProxyModule

LIBRARIES: List[Tuple[str, bool]] = [("libvirt-python", HAS_LIBVIRT), ("pycdlib", HAS_PYCDLIB),
                                     ("PyYAML", HAS_YAML)]


def kvm_provider(module: ProxyModule) -> KvmProvider:
    """The configured KVM provider; a wrong or missing provider is Permanent."""
    provider = module.provider()
    settings = provider.kvm
    if settings is None:  # provider() checked the type, so this is a bug
        raise Permanent("provider: %r has no kvm section" % module.params["provider"])
    cache_dir = module.params.get("image_cache_dir") or default_cache_dir()
    return KvmProvider(settings, cache_dir, module.module.log, module.warn, probe_sources=provider.probe_sources)


def kvm_proxy_provider(module: ProxyModule) -> KvmProvider:
    """``kvm_provider`` for ``kvm_proxy``: base image transfers are also appended to
    ``progress_path`` as they happen (the controller follows that file to log them while the
    run lasts; module.log reaches only the syslog of the machine running the module) and
    summed up in the result's ``image_transfers``."""
    provider = kvm_provider(module)
    provider.transfers = TransferReport(module.module.log, module.params.get("progress_path"), module.warn)
    return provider
