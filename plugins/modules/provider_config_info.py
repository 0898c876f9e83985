#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: provider_config_info
short_description: Validate an egress-proxies provider config file and report every error
version_added: 0.1.0
description:
  - Reads the provider config file (the one every C(*_proxy) and C(*_proxy_info) module takes as
    O(provider_config)) and validates all of it, with the same validator those modules use.
  - Reports every error, not only the first, each starting with its field path (such as
    C(providers[1].kubernetes.namespace)) and saying what is wrong and how to fix it.
  - Each provider section is validated on its own. A provider whose section is valid is usable by the
    modules even when another provider's section is not; RV(providers) says which are.
  - Errors at the root of the file (C(owner), C(providers) not a non-empty list, an entry without a usable
    or with a duplicate C(name), an unknown top-level field) make every provider unusable.
  - An invalid config is a successful run with RV(valid=false), so a caller can print all errors. The
    module fails (with RV(error_class=permanent)) only when the file cannot be read or is not YAML.
  - Never changes anything. The controller runs it at start-up, when the file changes and for
    C(egress-proxies check-config); the deploy playbook runs it before deploying.
  - With O(check_backends), it also asks each valid provider's backend what only the backend can tell
    (for GCP, whether the credentials may use Compute Engine, with their OAuth scopes, and whether the firewall
    admits the proxy port) and reports it in RV(providers[].backend_errors).
author:
  - egress-proxies developers (@egress-proxies)
options:
  provider_config:
    description:
      - Path to the provider config file (YAML).
      - Paths inside the file (C(kvm.ssh.keyFile), C(kvm.ssh.knownHostsFile), C(gcp.credentialsFile),
        C(kubernetes.kubeconfig)) must be absolute; a relative one is reported as an error, because the
        modules do not run in the directory the file was written in.
    type: path
    required: true
  check_backends:
    description:
      - Also check each valid provider against its backend (one read-only API call or two per provider).
      - "GCP: one listing of the provider's instances (credentials, their OAuth access scopes, IAM); the firewall
        rules of the network (C(firewall: managed): that they can be read; C(firewall: external): that one admits
        tcp:3128 from the provider's allowedSources); with C(externalIP: false), the Cloud Routers (a Cloud NAT in
        every configured region, or the instances would have no way out)."
      - Other provider types have nothing to check yet.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: No diff is produced.
requirements:
  - PyYAML
seealso:
  - module: crawl.egress_proxies.kvm_proxy
  - module: crawl.egress_proxies.gcp_proxy
  - module: crawl.egress_proxies.k8s_proxy
"""

EXAMPLES = r"""
- name: Check the provider config
  crawl.egress_proxies.provider_config_info:
    provider_config: /etc/egress-proxies/providers.yaml
  register: checked

- name: Stop with every error when it is invalid
  ansible.builtin.fail:
    msg: "{{ checked.errors }}"
  when: not checked.valid

- name: The providers that can be used
  ansible.builtin.debug:
    msg: "{{ checked.providers | selectattr('valid') | map(attribute='name') | list }}"
"""

RETURN = r"""
valid:
  description: Whether the whole file is valid (no error at all).
  returned: success
  type: bool
  sample: false
owner:
  description: The C(owner) the file declares; null when it is missing or invalid.
  returned: success
  type: str
  sample: prod-cluster-1
providers:
  description:
    - Every provider entry with a usable name, in file order.
    - An entry whose name is missing, invalid or a duplicate is not listed; its error is in RV(errors).
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The provider's name.
      type: str
    type:
      description: Its type as written (C(kvm), C(gcp), C(kubernetes); anything else is one of its errors).
      type: str
    valid:
      description: Whether the modules can use this provider (its section and the file's root are valid).
      type: bool
    errors:
      description: The errors that make it unusable (the file's root errors, then its section's), with field paths.
      type: list
      elements: str
    location_errors:
      description:
        - Errors that keep single locations from new proxies (a KVM host's C(networkMode), C(publicAddress),
          C(publishPorts) or C(sourceAddresses)), with field paths. The provider stays usable for its other
          locations (RV(providers[].valid) is not affected), but the file is not valid and RV(errors) lists them.
      type: list
      elements: str
    location_states:
      description:
        - The locations that take no new proxies on purpose, by name, with their state (a KVM host's
          C(state), C(cordoned) or C(draining)); active ones are left out. The controller replaces every
          instance on a C(draining) location, make before break, elsewhere.
      type: dict
    allowed_sources:
      description: Networks crawlers may use this provider's proxies from unless a Proxy says otherwise.
      type: list
      elements: str
    allowed_destinations:
      description:
        - Internal networks this provider's proxies may reach unless a Proxy says otherwise (its
          C(allowedDestinations); empty when absent). Metadata, loopback and an instance's own addresses are
          never reachable.
      type: list
      elements: str
    probe:
      description:
        - How the controller checks that this provider's proxies serve (the C(probe) field, defaults filled in).
        - "C(enabled) is false for C(probe: none); C(httpUrl) and C(keyFile) are null when the provider names no
          probe target (no C(probe) field)."
      type: dict
    reachability:
      description:
        - "What this valid provider's proxies will be reachable at and from (crawlers, the controller's probe), from
          the config alone, one sentence each; empty for an invalid provider or a type that says nothing yet."
      type: list
      elements: str
    backend_errors:
      description:
        - "With O(check_backends), what the backend showed wrong with a valid provider, each starting with its field
          path (C(providers[1].gcp: ... insufficient authentication scopes; grant ...)); empty when all is well, or
          without O(check_backends)."
      type: list
      elements: str
  sample:
    - {name: home-kvm, type: kvm, valid: true, errors: []}
    - name: cluster
      type: kubernetes
      valid: false
      errors: ["providers[1].kubernetes.namespace: 'Egress' is not a valid Kubernetes namespace name (...)"]
access_policy_version:
  description:
    - The version of the squid access policy the C(*_proxy) modules deliver with their C(access) option.
    - It changes when what they deliver changes; the controller makes it part of every instance's build hash,
      so instances built with an older policy are replaced (make before break).
    - "With the root's C(probeSources), which every policy admits besides the crawlers' sources, it carries a
      digest of them (C(<version>+probe.<12 hex>)); naming, changing or removing them replaces the instances too."
  returned: success
  type: str
  sample: "2"
errors:
  description: Every error in the file, in file order, each starting with its field path.
  returned: success
  type: list
  elements: str
error_class:
  description: On failure (the file cannot be read or is not YAML), always C(permanent).
  returned: failed
  type: str
"""

import hashlib  # noqa: E402
from typing import List  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (  # noqa: E402
    HAS_YAML,
    ConfigReport,
    Provider,
    read_provider_config_document,
    validate_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import ConfigError  # noqa: E402
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.checks import (  # noqa: E402
    check_backend as check_gcp_backend,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.checks import (  # noqa: E402
    reachability as gcp_reachability,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.firewall import (  # noqa: E402
    ProviderIdentity,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import POLICY_VERSION  # noqa: E402


def backend_errors(provider: Provider, index: int, owner: str) -> List[str]:
    """What the provider's backend shows wrong, each prefixed with the provider's field path."""
    if provider.gcp is None:
        return []
    identity = ProviderIdentity.of(provider, owner)
    return ["providers[%d].%s" % (index, problem) for problem in check_gcp_backend(provider.gcp, identity)]


def reachability(provider: Provider, owner: str) -> List[str]:
    """What the provider's proxies will be reachable at and from, from its config alone (one line
    each; empty for a provider type that says nothing yet)."""
    if provider.gcp is None:
        return []
    return gcp_reachability(provider.gcp, ProviderIdentity.of(provider, owner))


def policy_version(report: ConfigReport) -> str:
    """POLICY_VERSION, and a digest of the root's ``probeSources`` when there are some: instances
    admit them in their policy and firewall, so a change must replace them as a new policy does."""
    probe_sources = next((provider.probe_sources for provider in report.providers if provider.probe_sources), ())
    if not probe_sources:
        return POLICY_VERSION
    return "%s+probe.%s" % (POLICY_VERSION, hashlib.sha256(",".join(probe_sources).encode()).hexdigest()[:12])


def main() -> None:
    module = AnsibleModule(argument_spec={"provider_config": {"type": "path", "required": True},
                                          "check_backends": {"type": "bool", "default": False}},
                           supports_check_mode=True)
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"), error_class="permanent")
    try:
        document = read_provider_config_document(module.params["provider_config"])
    except ConfigError as error:
        module.fail_json(msg=str(error), error_class=error.error_class)
    report = validate_provider_config(document)
    root_errors = list(report.root_errors)
    check = module.params["check_backends"] and not root_errors and report.owner
    providers = [
        {"name": provider.name, "type": provider.type, "valid": not root_errors and provider.valid,
         "errors": root_errors + list(provider.errors), "probe": provider.probe.as_dict(),
         "location_errors": list(provider.location_errors),
         "location_states": provider.kvm.location_states if provider.kvm is not None else {},
         "allowed_sources": list(provider.allowed_sources),
         "allowed_destinations": list(provider.allowed_destinations),
         "reachability": reachability(provider, str(report.owner)) if provider.valid else [],
         "backend_errors": backend_errors(provider, index, str(report.owner)) if check and provider.valid else []}
        for index, provider in enumerate(report.providers)
    ]
    module.exit_json(changed=False, valid=report.valid, owner=report.owner, providers=providers,
                     errors=list(report.errors), access_policy_version=policy_version(report))


if __name__ == "__main__":
    main()
