"""The crawler's side of egress-proxies: proxies from the controller's discovery endpoint, handed
out by a policy, banned ones reported to its quarantine endpoint.

    from egress_proxies_client import ProxyClient

    client = ProxyClient("http://egress-proxies.egress-proxies.svc:8080", token=TOKEN, pool="crawlers/eu")
    proxy = client.pick()            # proxy.url: http://user:password@ip:port
    client.report_banned(proxy, "403 from example.com")

The Scrapy downloader middleware is ``egress_proxies_client.scrapy_middleware.EgressProxiesMiddleware``.
"""

from egress_proxies_client.client import (
    DiscoveryError,
    EgressProxiesError,
    NoProxyAvailable,
    ProxyClient,
    QuarantineOutcome,
    Refresh,
)
from egress_proxies_client.policies import POLICIES
from egress_proxies_client.proxy import Proxy

__all__ = ["POLICIES", "DiscoveryError", "EgressProxiesError", "NoProxyAvailable", "Proxy", "ProxyClient",
           "QuarantineOutcome", "Refresh"]
