#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kvm_proxy_info
short_description: Look up egress proxy VMs on KVM hosts, by providerID or by tags
version_added: 0.1.0
description:
  - With O(provider_id), returns that one VM with its state and IP; a VM that does not exist fails with
    RV(error_class=not_found). A providerID naming a host that is not configured fails with
    RV(error_class=permanent), never C(not_found), so a typo in the hosts list cannot look like a vanished VM.
  - With O(tags), lists every VM carrying all of them across every configured host in one run (the
    controller's sweep). Domains without egress-proxies metadata are never listed.
  - If any host cannot be listed, the module fails (so nothing garbage-collects on a partial view) but
    still returns what it saw in RV(instances) and the failing hosts in RV(failed_locations).
  - IP discovery asks the guest agent, then the network's DHCP leases, then the host's ARP table,
    matching the VM's MAC and skipping loopback and link-local addresses.
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
  - libvirt-python
  - PyYAML
seealso:
  - module: crawl.egress_proxies.kvm_proxy
"""

EXAMPLES = r"""
- name: One VM by providerID
  crawl.egress_proxies.kvm_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
    provider_id: kvm://hosts/beelink/domains/crawlers-eu-1-3f9c2a
  register: found

- name: Every VM this controller owns, on every host
  crawl.egress_proxies.kvm_proxy_info:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
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
      description: C(kvm://hosts/<host>/domains/<domain>).
      type: str
    name:
      description: The domain name.
      type: str
    location:
      description: The KVM host's name.
      type: str
    state:
      description: One of C(pending), C(running), C(stopped), C(error).
      type: str
    ip:
      description: The guest's address, null until known.
      type: str
    endpoint:
      description: >-
        What a crawler dials, C(<ip>:<port>) (the port stored in the domain's metadata); null until the IP is
        known.
      type: str
    tags:
      description: The tags stored in the domain's metadata.
      type: dict
    created:
      description: Creation time, UTC, ISO 8601.
      type: str
failed_locations:
  description: Hosts that could not be listed, each with C(error_class) and C(msg).
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

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.module import (  # noqa: E402
    LIBRARIES,
    kvm_provider,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_info_module  # noqa: E402


def main() -> None:
    run_info_module("kvm", LIBRARIES, kvm_provider, "KVM host(s)")


if __name__ == "__main__":
    main()
