"""A cluster's network namespace joined to an "internet" of its own: a crawler in the crawlers'
public range, a stranger outside it, and a node's ExternalIP, for the Kubernetes exposure tests
(the minimal config through the real command, the Service network's data plane).

The two namespaces are linked by a veth of their own; the internet routes to the cluster's network
and to the node's ExternalIP through it, the cluster to the crawlers' /24. Nothing else is routed:
traffic stays inside the namespaces the test made.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from support.netns.namespace import NetworkNamespace

# The internet: the crawlers' network, one crawler in it and a stranger outside it.
CRAWLERS, CRAWLER, STRANGER = "203.0.113.16/28", "203.0.113.20", "203.0.113.99"
LINK_HERE, LINK_THERE = "100.127.254.1", "100.127.254.2"  # the cluster's and the internet's ends of their link
# The node's ExternalIP, an address of the cluster's namespace.
NODE_EXTERNAL = "198.51.100.11"


@contextmanager
def cluster_and_internet() -> Iterator[tuple[NetworkNamespace, NetworkNamespace]]:
    """The cluster's namespace (with the node's ExternalIP) and the internet's (with CRAWLER and STRANGER)."""
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces, iptables); run the tests as root, as CI does", pytrace=False)
    with NetworkNamespace() as cluster, NetworkNamespace() as internet:
        cluster.link(internet, LINK_HERE, LINK_THERE)
        cluster.route("203.0.113.0/24", LINK_THERE)
        internet.route(cluster.network, LINK_HERE)
        internet.route(f"{NODE_EXTERNAL}/32", LINK_HERE)
        for address in (CRAWLER, STRANGER):
            internet.add_address(address)
        cluster.add_address(NODE_EXTERNAL)
        yield cluster, internet
