#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gcp_proxy
short_description: Create or delete an egress proxy instance on Google Compute Engine
version_added: 0.1.0
description:
  - Creates a proxy instance in one of the provider's zones, idempotent by O(name), or deletes one by
    O(provider_id).
  - "An instance is: the machine type and boot image that the config's C(machineTypes) and C(images) map
    O(machine_type) and O(image) to (a bare machine type name resolved in the instance's zone), one NIC on
    the configured network (and C(subnetwork), which custom-mode and Shared VPC networks need) with a
    one-to-one NAT when C(externalIP) is true, the user-data in the metadata item C(user-data) byte for
    byte (base64 text plus C(user-data-encoding=base64) with O(user_data_encoding=base64)), the full tags
    as JSON in the metadata item C(egress-proxies-tags), and the labels C(egress_proxies=v1), C(egress_proxies_owner),
    C(egress_proxies_uid) and C(egress_proxies_spec_hash) for server-side filtering."
  - "Every instance gets the metadata item C(startup-script), which Google's guest agent runs on every boot: the
    access policy (with O(access)), then, after cloud-init where there is one, squid installed if the image has
    none. Debian's GCE images run no C(user-data) (no cloud-init), so a stock image serves without one."
  - "With the provider's C(firewall: managed) (default), one VPC firewall rule per provider admits the proxy ports
    from the instances' allowed sources to the instances (a network tag each); it is made before the first
    instance, kept in step, and removed with the last. With C(firewall: external) the instances only carry the
    config's C(networkTags)."
  - The owner tag C(crawl.example.com/owner) must be a valid GCE label value; it is what the sweep filters on.
  - Without O(location), one listing of this collection's instances finds an existing instance of
    that name in any configured zone, else the instance goes to the zone with the fewest instances of the
    same owner (config order breaks ties). A zone that cannot be listed fails the run
    (RV(error_class=transient)) rather than risk a duplicate.
  - A machine type configured as C(zones/<zone>/machineTypes/<type>) only fits that zone; with another
    O(location) the run fails RV(error_class=permanent) before any API call, without one the instance goes
    to that zone.
  - A zone out of capacity (C(ZONE_RESOURCE_POOL_EXHAUSTED)) or without the machine type moves the insert to the
    next zone in placement order within the same run, a regional quota used up to the next zone of another
    region, and a warning says why. With O(location), or when every zone is out, the run fails
    RV(error_class=transient) (a quota's message names it); RV(error_class=permanent) naming C(machineTypes)
    when no zone has the machine type.
  - An image, network or subnetwork that Compute Engine does not find fails RV(error_class=permanent), the message
    starting with the option or config field to fix.
  - An instance of that name that does not carry the C(egress_proxies=v1) label is never touched
    (RV(error_class=permanent)), neither adopted nor deleted.
  - Creating and deleting wait for the zone operation with C(zoneOperations.wait) (the server holds each call
    up to 2 minutes; the client waits 150 seconds for each), starting no new wait call after 240 seconds;
    past that the run fails RV(error_class=transient) and a retry picks the instance up by name. A delete
    retried while the instance is still being deleted (C(resourceNotReady)) fails RV(error_class=transient)
    until it is gone.
  - Deleting an instance that does not exist (a zone that does not exist too) is success with
    RV(ignore:changed=false).
  - "Credentials: the config's C(credentialsFile) (a missing file is RV(error_class=transient), a file that
    is not a credentials file RV(error_class=permanent)), else Application Default Credentials (Workload
    Identity, the metadata server, C(GOOGLE_APPLICATION_CREDENTIALS)); none at all is
    RV(error_class=permanent). An C(apiEndpoint) of C(http://) on a loopback address without
    C(credentialsFile) uses anonymous credentials (a local emulator). Credentials whose OAuth scopes do not
    include Compute Engine (a VM's or GKE node's default access scopes) fail RV(error_class=permanent), saying
    which scope to grant."
author:
  - egress-proxies developers (@egress-proxies)
extends_documentation_fragment:
  - crawl.egress_proxies.common
  - crawl.egress_proxies.common.instance
attributes:
  check_mode:
    support: full
    description: Reports what would be created or deleted without writing anything (reads still happen).
  diff_mode:
    support: none
    description: No diff is produced.
requirements:
  - google-cloud-compute
  - PyYAML
seealso:
  - module: crawl.egress_proxies.gcp_proxy_info
"""

EXAMPLES = r"""
- name: Create a proxy instance (the provider picks the zone)
  crawl.egress_proxies.gcp_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: gcp-eu
    name: crawlers-eu-1-3f9c2a
    user_data: |
      #cloud-config
      packages: [squid]
    tags:
      crawl.example.com/owner: prod-cluster-1
      crawl.example.com/proxy: crawlers/eu-1
  register: proxy

- name: Binary (gzip) user-data goes base64-encoded
  crawl.egress_proxies.gcp_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: gcp-eu
    name: crawlers-eu-2-77aa01
    location: europe-west1-b
    user_data: "{{ lookup('file', 'user-data.gz.b64') }}"
    user_data_encoding: base64

- name: Delete it again
  crawl.egress_proxies.gcp_proxy:
    provider_config: /etc/egress-proxies/providers.yaml
    provider: gcp-eu
    state: absent
    provider_id: "{{ proxy.instance.provider_id }}"
"""

RETURN = r"""
instance:
  description: The instance (with O(state=absent), the one that was deleted, as far as known).
  returned: without O(operations)
  type: dict
  contains:
    provider_id:
      description: C(gce://<project>/zones/<zone>/instances/<name>).
      type: str
      sample: gce://my-project/zones/europe-west1-b/instances/crawlers-eu-1-3f9c2a
    name:
      description: The instance name.
      type: str
    location:
      description: The zone.
      type: str
    state:
      description: >-
        One of C(pending) (PROVISIONING, STAGING, PENDING, REPAIRING), C(running) (RUNNING), C(stopped)
        (STOPPING, PENDING_STOP, SUSPENDING, DEPROVISIONING, STOPPED, SUSPENDED, TERMINATED) or C(error) (any
        other status).
      type: str
    ip:
      description: >-
        With C(externalIP) true, the external NAT IP, null until assigned (a running instance without one is
        reported with null and a warning, never with its internal IP); with C(externalIP) false, the
        internal IP.
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

from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.module import (  # noqa: E402
    LIBRARIES,
    gcp_provider,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.proxy_module import run_proxy_module  # noqa: E402


def main() -> None:
    run_proxy_module("gcp", "gce", LIBRARIES, gcp_provider)


if __name__ == "__main__":
    main()
