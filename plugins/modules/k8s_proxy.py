#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: k8s_proxy
short_description: Create or delete an egress proxy Pod (squid) on Kubernetes
version_added: 0.1.0
description:
  - Creates a squid Pod named O(name) in the namespace O(location) (default the provider's C(namespace)),
    idempotent by name, or deletes one by O(provider_id).
  - "A Pod is: one C(squid) container from the provider's C(image) running
    C(squid -N -f /etc/egress-proxy/squid.conf), the port O(port) with a tcpSocket readiness probe on it, the
    provider's C(cpuRequest)/C(memoryRequest) as requests, run as an unprivileged user (the Pod passes the
    C(restricted) Pod Security Standard; O(port) must be 1024 or more), and a topology spread constraint over
    C(kubernetes.io/hostname) (C(spreadNodes))."
  - "The provider's C(exposure) says how crawlers reach it: the Pod IP (C(none)), a C(hostPort) or C(hostNetwork),
    or a Service of the Pod's name (C(NodePort), C(LoadBalancer)), made and deleted with the Pod; the instance's
    RV(instance.endpoint) is what a crawler dials."
  - The squid.conf is C(http_port <port>) followed by the provider's C(squidConfig) (or a built-in default that
    only serves private-address clients); it is stored in the Pod annotation C(crawl.example.com/squid-conf)
    and projected into the container by a downwardAPI volume, so the Pod is the only object created.
  - All tags are kept as JSON in the annotation C(crawl.example.com/tags); the tags that are valid labels as they
    stand (the owner tag always is) are labels too, beside C(app.kubernetes.io/managed-by=egress-proxies).
  - An existing Pod of that name is success with RV(ignore:changed=false) when it carries the managed-by label
    and the same C(crawl.example.com/owner) label; any other Pod of that name fails with
    RV(error_class=permanent) naming O(name) and is never touched.
  - A Pod has no cloud-init, and the image and requests come from the provider config, so a non-empty
    O(user_data), or any O(machine_type) or O(image), fails with RV(error_class=permanent) naming the option.
  - Deleting reads the Pod first and deletes it only if it carries the managed-by label (with a uid
    precondition); a Pod or namespace that is already gone is success.
author:
  - egress-proxies developers (@egress-proxies)
extends_documentation_fragment:
  - crawl.egress_proxies.common
  - crawl.egress_proxies.common.instance
attributes:
  check_mode:
    support: full
    description: Reads the Pod and reports what would be created or deleted without writing anything.
  diff_mode:
    support: none
    description: No diff is produced.
requirements:
  - kubernetes (the Python client)
  - PyYAML
seealso:
  - module: crawl.egress_proxies.k8s_proxy_info
"""

EXAMPLES = r"""
- name: Create a proxy Pod in the provider's default namespace
  crawl.egress_proxies.k8s_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: cluster
    name: crawlers-eu-1-3f9c2a
    port: 3128
    tags:
      crawl.example.com/owner: prod-cluster-1
      crawl.example.com/proxy: crawlers/eu-1
  register: proxy

- name: Delete it again
  crawl.egress_proxies.k8s_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: cluster
    state: absent
    provider_id: "{{ proxy.instance.provider_id }}"

- name: Create two proxies and delete a third in one module run (one result each)
  crawl.egress_proxies.k8s_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: cluster
    operations:
      - name: crawlers-eu-3-5b1d02
        tags:
          crawl.example.com/owner: prod-cluster-1
      - name: crawlers-eu-4-c0ffee
        tags:
          crawl.example.com/owner: prod-cluster-1
      - state: absent
        name: crawlers-eu-1-3f9c2a
  register: batch

- name: Fail here if any item failed (the run itself succeeds when every item was tried)
  ansible.builtin.assert:
    that: batch.results | rejectattr('ok') | list | length == 0
"""

RETURN = r"""
instance:
  description: The instance (with O(state=absent), the one that was deleted, as far as known).
  returned: without O(operations)
  type: dict
  contains:
    provider_id:
      description: C(k8s://namespaces/<namespace>/pods/<name>).
      type: str
      sample: k8s://namespaces/egress/pods/crawlers-eu-1-3f9c2a
    name:
      description: The Pod name.
      type: str
    location:
      description: The namespace.
      type: str
    state:
      description: >-
        One of C(pending) (Pending, or Running but not Ready), C(running) (Running and Ready), C(stopped)
        (Succeeded or terminating), C(error) (Failed, Unknown, or a container stuck in CrashLoopBackOff or an
        image pull error).
      type: str
    ip:
      description: The Pod's own IP (the node's with C(exposure) hostNetwork); null until assigned.
      type: str
    endpoint:
      description:
        - "What a crawler dials, by the provider's C(exposure): C(<podIP>:<port>) (none), C(<node IP>:<port>)
          (hostPort, hostNetwork), C(<node address>:<node port>) (NodePort: the node's ExternalIP where it has one,
          else its InternalIP), C(<load balancer address>:<port>) (LoadBalancer); null until known (the instance is
          C(pending) until then)."
      type: str
    exposure:
      description:
        - "With C(exposure) NodePort or LoadBalancer: which address the endpoint is (the node's ExternalIP or
          InternalIP, a load balancer), the sources it admits, and whether a passing probe proves the path a crawler
          outside the cluster takes (C(outside path verified)) or not, with how to verify it."
      type: str
      returned: with C(exposure) NodePort or LoadBalancer
    tags:
      description: The tags from the Pod's C(crawl.example.com/tags) annotation.
      type: dict
    created:
      description: The Pod's creationTimestamp, UTC, ISO 8601.
      type: str
provider_id:
  description: Same as RV(instance.provider_id), for convenience.
  returned: without O(operations)
  type: str
results:
  description:
    - With O(operations), one entry per item, in the items' order.
  returned: with O(operations)
  type: list
  elements: dict
  contains:
    ok:
      description: Whether this item succeeded.
      type: bool
    changed:
      description: Whether this item changed (or, in check mode, would change) anything.
      type: bool
    instance:
      description: As RV(instance), for this item; null when the item failed.
      type: dict
    provider_id:
      description: As RV(provider_id), for this item (on failure, the item's O(operations[].provider_id), if any).
      type: str
    key:
      description: The item's O(operations[].key), unchanged.
      type: str
    error_class:
      description: When the item failed, C(not_found), C(permanent) or C(transient); null otherwise.
      type: str
    msg:
      description: When the item failed, why, starting with C(operations[<index>]:); empty otherwise.
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
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_proxy_module  # noqa: E402


def main() -> None:
    run_proxy_module("kubernetes", "k8s", LIBRARIES, k8s_provider)


if __name__ == "__main__":
    main()
