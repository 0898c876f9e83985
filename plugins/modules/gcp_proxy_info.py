#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_proxy_info
short_description: Look up egress proxy instances on Google Compute Engine, by providerID or by tags
version_added: 0.1.0
description:
  - With O(provider_id), returns that one instance with its state and IP; an instance that does not exist
    fails with RV(error_class=not_found), and so does one in a zone that does not exist (any more). A
    providerID of another project than the configured one fails with RV(error_class=permanent).
  - With O(tags), lists every instance of this collection (label C(egress_proxies=v1)) carrying all of
    them, across every configured zone, in one C(aggregatedList) call filtered on the owner label; the
    other tags are matched on the tags decoded from the metadata item C(egress-proxies-tags). Zones that
    are not configured are ignored.
  - Without C(returnPartialSuccess) (which google-cloud-compute 1.57 cannot send) one unreachable zone fails
    the whole aggregated call; then each configured zone is listed on its own, so only the zones that
    really fail are failed. A configured zone missing from the aggregated answer is listed on its own too
    (one that does not exist fails RV(error_class=permanent)).
  - If any configured zone cannot be listed, the module fails (so nothing garbage-collects on a partial
    view) but still returns what it saw in RV(instances) and the failing zones in RV(failed_locations).
  - IP is the external NAT IP when C(externalIP) is true (null, with a warning, for a running instance
    without one), else the internal IP.
author:
  - egress-proxies developers (@egress-proxies)
extends_documentation_fragment:
  - crawl.egress_proxies.common
  - crawl.egress_proxies.common.info
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: No diff is produced.
requirements:
  - google-cloud-compute
  - PyYAML
seealso:
  - module: crawl.egress_proxies.gcp_proxy
"""

EXAMPLES = r"""
- name: One instance by providerID
  crawl.egress_proxies.gcp_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: gcp-eu
    provider_id: gce://my-project/zones/europe-west1-b/instances/crawlers-eu-1-3f9c2a
  register: found

- name: Every instance this controller owns, in every configured zone
  crawl.egress_proxies.gcp_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: gcp-eu
    tags:
      crawl.example.com/owner: prod-cluster-1
  register: fleet
"""

RETURN = r"""
instances:
  description: The matching instances (one with O(provider_id)).
  returned: without O(provider_ids)
  type: list
  elements: dict
  contains:
    provider_id:
      description: C(gce://<project>/zones/<zone>/instances/<name>).
      type: str
    name:
      description: The instance name.
      type: str
    location:
      description: The zone.
      type: str
    state:
      description: One of C(pending), C(running), C(stopped), C(error) (see M(crawl.egress_proxies.gcp_proxy)).
      type: str
    ip:
      description: The external NAT IP (C(externalIP) true) or the internal IP; null until assigned.
      type: str
    endpoint:
      description: >-
        What a crawler dials, C(<ip>:<port>) (the port from the metadata item C(egress-proxies-port)); null until
        the IP is known.
      type: str
    tags:
      description: The tags, decoded from the metadata item C(egress-proxies-tags).
      type: dict
    created:
      description: Creation time, UTC, ISO 8601.
      type: str
failed_locations:
  description: Zones that could not be listed, each with C(error_class) and C(msg).
  returned: with O(tags)
  type: dict
results:
  description:
    - With O(provider_ids), one entry per providerID, in the same order.
  returned: with O(provider_ids)
  type: list
  elements: dict
  contains:
    ok:
      description: Whether this instance was found and read.
      type: bool
    instance:
      description: The instance, as an item of RV(instances); null when the lookup failed.
      type: dict
    provider_id:
      description: The providerID looked up.
      type: str
    error_class:
      description: When the lookup failed, C(not_found), C(permanent) or C(transient); null otherwise.
      type: str
    msg:
      description: When the lookup failed, why, starting with C(provider_ids[<index>]:); empty otherwise.
      type: str
error_class:
  description: On failure, C(not_found), C(permanent) or C(transient).
  returned: failed
  type: str
"""

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.module import (  # noqa: E402
    LIBRARIES,
    gcp_provider,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_info_module  # noqa: E402


def main() -> None:
    run_info_module("gcp", LIBRARIES, gcp_provider, "GCP zone(s)")


if __name__ == "__main__":
    main()
