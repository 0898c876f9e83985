# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options shared by every module, documented once (matches proxy_module.py's argument specs)."""

from __future__ import annotations


class ModuleDocFragment:
    # Options of every *_proxy and *_proxy_info module.
    DOCUMENTATION = r"""
options:
  provider_config:
    description:
      - Path to the provider config file (YAML) that the controller also reads.
      - Each provider section is validated on its own; errors in O(provider)'s section (or at the file's
        root) fail the module with RV(error_class=permanent), listing every error with its field path.
        Errors in other providers' sections do not matter to this module.
    type: path
    required: true
  provider:
    description:
      - Name of the provider in O(provider_config) to act on. It must have this module's provider type.
    type: str
    required: true
notes:
  - Every failure carries C(error_class) beside C(msg), one of C(not_found), C(permanent) or C(transient);
    see the collection's C(docs/architecture.md) for what the controller does with each.
"""

    # Options of the *_proxy modules (create and delete one instance).
    INSTANCE = r"""
options:
  state:
    description:
      - V(present) creates the instance named O(name) unless it exists (idempotent by name).
      - V(absent) deletes the instance named by O(provider_id); one that is already gone is success with
        RV(ignore:changed=false).
    type: str
    choices: [present, absent]
    default: present
  name:
    description:
      - Instance name, 1-63 lowercase letters, digits and C(-), starting with a letter.
      - Required with O(state=present). The controller derives it from the Proxy's namespace, name and uid.
    type: str
  location:
    description:
      - Where to create the instance (KVM host, GCP zone or Kubernetes namespace).
      - Omitted, the provider places it.
    type: str
  machine_type:
    description:
      - A key of the provider's C(machineTypes); omitted, the provider's C(defaultMachineType).
    type: str
  image:
    description:
      - A key of the provider's C(images); omitted, the provider's C(defaultImage).
    type: str
  user_data:
    description:
      - cloud-init user-data, delivered to the instance byte for byte (cloud-config, Jinja templates, MIME,
        shell scripts, or binary such as gzip with O(user_data_encoding=base64)).
      - At most 65536 bytes after decoding.
      - Never logged or returned.
    type: str
    default: ''
  user_data_encoding:
    description:
      - V(plain) takes O(user_data) as UTF-8 text; V(base64) decodes it and delivers the raw bytes.
    type: str
    choices: [plain, base64]
    default: plain
  port:
    description:
      - The TCP port crawlers connect to (recorded with the instance), 1024-65535. Below 1024 are the
        instance's own services (its sshd on 22), which a firewall rule or a published port would open
        instead of squid.
    type: int
    default: 3128
  tags:
    description:
      - Tags to put on the instance (string keys and values). The controller sets
        C(crawl.example.com/owner), C(crawl.example.com/proxy), C(crawl.example.com/uid) and
        C(crawl.example.com/spec-hash).
    type: dict
    default: {}
  access:
    description:
      - Who may use the proxy. The operator's squid access policy, delivered without touching O(user_data)
        (KVM vendor-data boothook, the GCP C(startup-script) metadata item, the Pod's generated squid.conf).
      - Its rules come before any user configuration and end in C(http_access deny all); they also deny
        private, shared, unique-local, link-local and loopback destinations, every cloud's metadata address and
        the instance's own addresses (by address after DNS resolution), C(CONNECT) to any port but 443 and the
        cache manager. Its settings come after any user configuration (the authenticator, error pages and
        headers that name neither the software nor the host, no credential in a log).
      - Omitted, the instance gets no policy from the module (the behaviour before this option).
      - See the collection's C(docs/architecture.md), "Security model", for precedence against a user's own
        squid configuration.
    type: dict
    suboptions:
      users:
        description:
          - Who may authenticate (squid Basic auth, C(basic_ncsa_auth)). Required unless O(access.open=true).
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: User name, 1-64 letters, digits, C(.), C(_) or C(-).
            type: str
            required: true
          password_hash:
            description:
              - The bcrypt (C($2b$)) or SHA-512-crypt (C($6$)) hash of the password, never the password.
              - Never logged or returned.
            type: str
            required: true
      allowed_sources:
        description:
          - Client networks (CIDRs) that may use the proxy; others get 403 before any credential is asked for.
          - Required when O(access.users) is empty. Empty with users, any source that authenticates.
            V(0.0.0.0/0) and V(::/0) serve anyone and are only ever used when written here.
          - On GCP with C(firewall=managed) at least one IPv4 network is required, since each instance's firewall
            rule admits exactly these sources to its port and nothing is implied.
        type: list
        elements: str
        default: []
      allowed_destinations:
        description:
          - Internal networks (CIDRs) the proxy may reach on purpose, such as a host on the hypervisor's network.
          - Private, shared, unique-local and link-local networks are refused unless listed here; metadata,
            loopback and the instance's own addresses stay refused even inside a listed network.
        type: list
        elements: str
        default: []
      open:
        description:
          - V(true) asks for no credentials (the Proxy's C(spec.auth=none)); O(access.allowed_sources) still
            applies and is then required. O(access.users) must be empty.
        type: bool
        default: false
  provider_id:
    description:
      - The instance to delete with O(state=absent).
      - Without it, O(state=absent) deletes by O(name) in O(location) (as C(kubernetes.core.k8s) does); a KVM
        provider without O(location) looks on every configured host (each must answer), a GCP provider in every
        configured zone, a Kubernetes provider uses its default namespace. Already gone is success with
        RV(ignore:changed=false).
    type: str
  operations:
    description:
      - A batch of creates and deletes done in this one module run, instead of the single-instance options
        above (mutually exclusive with every one of them).
      - The provider is opened once for the whole batch (one libvirt connection per KVM host, one Kubernetes or
        Compute API client) and the items run side by side, at most 8 at a time; items naming the same
        instance run one after the other.
      - Each item gets its own entry in RV(results), in order, with its own RV(results[].error_class); one
        item failing never fails the others, and the module run fails only when nothing could be tried at all
        (an unreadable provider config, a missing provider, a kubeconfig that cannot be loaded).
      - Each item is idempotent as the single-instance form is, and check mode applies to every item.
    type: list
    elements: dict
    suboptions:
      state:
        description: As O(state).
        type: str
        choices: [present, absent]
        default: present
      name:
        description: As O(name); required with O(operations[].state=present).
        type: str
      location:
        description: As O(location).
        type: str
      machine_type:
        description: As O(machine_type).
        type: str
      image:
        description: As O(image).
        type: str
      user_data:
        description: As O(user_data); never logged or returned.
        type: str
        default: ''
      user_data_encoding:
        description: As O(user_data_encoding).
        type: str
        choices: [plain, base64]
        default: plain
      port:
        description: As O(port).
        type: int
        default: 3128
      tags:
        description: As O(tags).
        type: dict
        default: {}
      provider_id:
        description: As O(provider_id).
        type: str
      access:
        description: As O(access).
        type: dict
        suboptions:
          users:
            description: As O(access.users).
            type: list
            elements: dict
            default: []
            suboptions:
              name:
                description: As O(access.users[].name).
                type: str
                required: true
              password_hash:
                description: As O(access.users[].password_hash); never logged or returned.
                type: str
                required: true
          allowed_sources:
            description: As O(access.allowed_sources).
            type: list
            elements: str
            default: []
          allowed_destinations:
            description: As O(access.allowed_destinations).
            type: list
            elements: str
            default: []
          open:
            description: As O(access.open).
            type: bool
            default: false
      key:
        description:
          - An opaque label returned unchanged in the item's result (the controller passes the Proxy's uid).
        type: str
"""

    # Options of the *_proxy_info modules.
    INFO = r"""
options:
  provider_id:
    description:
      - Return this one instance. A missing instance fails with RV(error_class=not_found).
      - Mutually exclusive with O(provider_ids) and O(tags).
    type: str
  provider_ids:
    description:
      - Look up each of these instances in this one run (side by side, at most 8 at a time), one entry each in
        RV(results), in order. A missing one is an entry with RV(results[].error_class=not_found); the module
        run itself fails only when the provider cannot be opened at all.
      - Mutually exclusive with O(provider_id) and O(tags).
    type: list
    elements: str
  tags:
    description:
      - Return every instance carrying all of these tags, across every configured location.
      - An empty result is success.
      - Mutually exclusive with O(provider_id) and O(provider_ids).
    type: dict
"""
