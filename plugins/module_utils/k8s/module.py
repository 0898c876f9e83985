# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the two Kubernetes modules share: their libraries and how they build the provider."""

from __future__ import annotations

from typing import List, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import HAS_YAML
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.client import HAS_KUBERNETES, KubeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.instances import K8sProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import ProxyModule

LIBRARIES: List[Tuple[str, bool]] = [("kubernetes", HAS_KUBERNETES), ("PyYAML", HAS_YAML)]


def k8s_provider(module: ProxyModule) -> K8sProvider:
    """The configured Kubernetes provider, connected; a wrong or missing provider is Permanent."""
    provider = module.provider()
    settings = provider.kubernetes
    if settings is None:  # provider() checked the type, so this is a bug
        raise Permanent("provider: %r has no kubernetes section" % module.params["provider"])
    return K8sProvider(settings, KubeClient(settings), provider.probe.sources)
