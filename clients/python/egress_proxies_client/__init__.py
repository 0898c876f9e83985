"""The crawler's side of egress-proxies: proxies from the controller's discovery endpoint, handed
out by a policy, banned ones reported to its quarantine endpoint.

    import os
    from egress_proxies_client import ProxyClient

    token = os.environ["EGRESS_PROXIES_TOKEN"]
    client = ProxyClient("http://egress-proxies.egress-proxies.svc:8080", token=token, pool="crawlers/eu")
    proxy = client.pick()            # proxy.url: http://user:password@ip:port
    client.report_banned(proxy, "403 from example.com")

The Scrapy downloader middleware is ``egress_proxies_client.scrapy_middleware.EgressProxiesMiddleware``.
"""

from egress_proxies_client.client import (
    DiscoveryError,
    EgressProxiesError,
    NoProxyAvailable,
    PoolNotFound,
    ProxyClient,
    QuarantineOutcome,
    Refresh,
)
from egress_proxies_client.policies import POLICIES
from egress_proxies_client.proxy import Proxy
from egress_proxies_client.version import __version__

__all__ = ["POLICIES", "DiscoveryError", "EgressProxiesError", "NoProxyAvailable", "PoolNotFound", "Proxy",
           "ProxyClient", "QuarantineOutcome", "Refresh", "__version__"]
