#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kvm_proxy
short_description: Create or delete an egress proxy VM on a KVM host over libvirt
version_added: 0.1.0
description:
  - Creates a proxy VM on one of the provider's KVM hosts, idempotent by O(name), or deletes one by
    O(provider_id).
  - "A VM is: a qcow2 overlay on a base image cached once per host as volume C(base-<key>.<format>)
    (downloaded and sha256-verified), a NoCloud seed ISO (label C(cidata)) with the user-data byte for byte,
    a C(meta-data) with a unique C(instance-id) and the C(guest_agent) role's vendor-data script, a
    C(org.qemu.guest_agent.0) channel, and its tags in the domain's C(<metadata>)."
  - Without O(location), the VM goes to the host with the fewest instances of the same owner; every host
    is first listed (once per run) for an existing VM of that name, so a host that does not answer fails the
    run (RV(error_class=transient)) rather than risk a duplicate.
  - Before anything is made the name is claimed, as volume C(<name>.claim) in the pool of the name's home
    host (one of the configured hosts, picked by hashing the name), so two runs creating one name at once
    make one VM; the other fails RV(error_class=transient) and finds it when retried. A delete releases
    the claim.
  - Deleting destroys and undefines the domain and removes its overlay and seed volumes. A providerID
    naming a host that is not configured is a logged no-op success (nothing this controller can clean);
    a missing pool is success too.
author:
  - egress-proxies developers (@egress-proxies)
extends_documentation_fragment:
  - crawl.egress_proxies.common
  - crawl.egress_proxies.common.instance
options:
  image_cache_dir:
    description:
      - Directory for downloaded base images and the download locks, on the machine running the module.
      - Defaults to E(EGRESS_PROXIES_CACHE_DIR), else C(~/.cache/egress-proxies/images).
    type: path
  progress_path:
    description:
      - A file on the machine running the module to which every base image transfer event is appended
        while it happens, one JSON object per line (C(kind), C(direction), C(image), C(host), C(url),
        C(bytes), C(total), C(seconds)); see docs/contract.md, "Image transfer progress".
      - C(kind) is C(start), C(progress) (every 64 MiB or 10 s), C(done), C(failed) or C(waiting) (for
        another run transferring the same image); C(url) has no userinfo and no query.
      - The controller passes a fresh file per run and logs each event while the module runs. A file
        that cannot be written is a warning, never a failure.
    type: path
attributes:
  check_mode:
    support: full
    description: Reports what would be created or deleted without writing anything.
  diff_mode:
    support: none
    description: No diff is produced.
requirements:
  - libvirt-python
  - pycdlib
  - PyYAML
seealso:
  - module: crawl.egress_proxies.kvm_proxy_info
"""

EXAMPLES = r"""
- name: Create a proxy VM (the provider picks the host)
  crawl.egress_proxies.kvm_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
    name: crawlers-eu-1-3f9c2a
    user_data: |
      #cloud-config
      packages: [squid]
    tags:
      crawl.example.com/owner: prod-cluster-1
  register: proxy

- name: Binary (gzip) user-data goes base64-encoded
  crawl.egress_proxies.kvm_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
    name: crawlers-eu-2-77aa01
    location: beelink
    user_data: "{{ lookup('file', 'user-data.gz.b64') }}"
    user_data_encoding: base64

- name: Delete it again
  crawl.egress_proxies.kvm_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
    state: absent
    provider_id: "{{ proxy.instance.provider_id }}"

- name: Create two proxies and delete a third in one module run (one result each)
  crawl.egress_proxies.kvm_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: home-kvm
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
      description: C(kvm://hosts/<host>/domains/<domain>).
      type: str
      sample: kvm://hosts/beelink/domains/crawlers-eu-1-3f9c2a
    name:
      description: The domain name.
      type: str
    location:
      description: The KVM host's name from the provider config.
      type: str
    state:
      description: One of C(pending), C(running), C(stopped), C(error).
      type: str
    ip:
      description: The guest's address (guest agent, then DHCP leases, then ARP); null until known.
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
image_transfers:
  description:
    - The base image transfers this run finished, in the order they finished (a cached image or an
      existing base volume transfers nothing, so usually this is empty).
    - On libvirt's test driver, which cannot upload, only downloads are listed.
  returned: when the provider config could be used
  type: list
  elements: dict
  contains:
    image:
      description: The image's key in the provider config.
      type: str
      sample: debian-12
    host:
      description: The KVM host uploaded to; null for a download.
      type: str
    direction:
      description: C(download) (to O(image_cache_dir), sha256-verified) or C(upload) (to the host's pool).
      type: str
    bytes:
      description: How many bytes were transferred.
      type: int
    seconds:
      description: How long the transfer took.
      type: float
error_class:
  description: On failure, C(not_found), C(permanent) or C(transient).
  returned: failed
  type: str
"""

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.module import (  # noqa: E402
    LIBRARIES,
    kvm_proxy_provider,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_proxy_module  # noqa: E402


def main() -> None:
    run_proxy_module("kvm", "kvm", LIBRARIES, kvm_proxy_provider,
                     extra_spec={"image_cache_dir": {"type": "path"}, "progress_path": {"type": "path"}})


if __name__ == "__main__":
    main()
