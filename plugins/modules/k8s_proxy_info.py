#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_proxy_info
short_description: Look up egress proxy Pods on Kubernetes, by providerID or by tags
version_added: 0.1.0
description:
  - With O(provider_id), returns that one Pod with its state and IP. A Pod that does not exist, or whose
    namespace is gone, fails with RV(error_class=not_found); a Pod of that name without the
    C(app.kubernetes.io/managed-by=egress-proxies) label fails with RV(error_class=permanent), never C(not_found).
  - With O(tags), lists every Pod of ours carrying all of them, one label-selected list per namespace the
    provider configures (C(namespace) and C(namespaces)); the labels narrow the list, the tags annotation
    decides. Pods without the managed-by label are never listed.
  - If any namespace cannot be listed, the module fails (so nothing garbage-collects on a partial view) but
    still returns what it saw in RV(instances) and the failing namespaces in RV(failed_locations).
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
  - kubernetes (the Python client)
  - PyYAML
seealso:
  - module: crawl.egress_proxies.k8s_proxy
"""

EXAMPLES = r"""
- name: One Pod by providerID
  crawl.egress_proxies.k8s_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: cluster
    provider_id: k8s://namespaces/egress/pods/crawlers-eu-1-3f9c2a
  register: found

- name: Every Pod this controller owns, in every configured namespace
  crawl.egress_proxies.k8s_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: cluster
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
      description: C(k8s://namespaces/<namespace>/pods/<name>).
      type: str
    name:
      description: The Pod name.
      type: str
    location:
      description: The namespace.
      type: str
    state:
      description: One of C(pending), C(running), C(stopped), C(error) (see M(crawl.egress_proxies.k8s_proxy)).
      type: str
    ip:
      description: The Pod's own IP (the node's with C(exposure) hostNetwork); null until assigned.
      type: str
    endpoint:
      description: What a crawler dials, by the provider's C(exposure), as M(crawl.egress_proxies.k8s_proxy) returns it.
      type: str
    exposure:
      description:
        - How the endpoint is reached and whether the outside path is verified, as M(crawl.egress_proxies.k8s_proxy)
          returns it.
      type: str
      returned: with C(exposure) NodePort or LoadBalancer
    tags:
      description: The tags from the Pod's C(crawl.example.com/tags) annotation.
      type: dict
    created:
      description: The Pod's creationTimestamp, UTC, ISO 8601.
      type: str
failed_locations:
  description: Namespaces that could not be listed, each with C(error_class) and C(msg).
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

from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.module import (  # noqa: E402
    LIBRARIES,
    k8s_provider,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_info_module  # noqa: E402


def main() -> None:
    run_info_module("kubernetes", LIBRARIES, k8s_provider, "namespace(s)")


if __name__ == "__main__":
    main()
