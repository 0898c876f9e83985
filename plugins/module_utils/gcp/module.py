# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the two GCP modules share: their libraries and how they build the provider."""

from __future__ import annotations

from typing import List, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import HAS_YAML
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import HAS_GOOGLE, ComputeClient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import ProviderIdentity
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.instances import GcpProvider
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import ProxyModule

LIBRARIES: List[Tuple[str, bool]] = [("google-cloud-compute", HAS_GOOGLE), ("PyYAML", HAS_YAML)]


def gcp_provider(module: ProxyModule) -> GcpProvider:
    """The configured GCP provider; a wrong or missing provider is Permanent."""
    config = module.provider_config()
    provider = config.provider(module.params["provider"], "gcp")
    settings = provider.gcp
    if settings is None:  # provider() checked the type, so this is a bug
        raise Permanent("provider: %r has no gcp section" % module.params["provider"])
    identity = ProviderIdentity.of(provider, config.owner)
    return GcpProvider(settings, ComputeClient(settings), identity, module.warn)
