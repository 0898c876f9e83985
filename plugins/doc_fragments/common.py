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
      - The TCP port crawlers connect to (recorded with the instance).
    type: int
    default: 3128
  tags:
    description:
      - Tags to put on the instance (string keys and values). The controller sets
        C(crawl.example.com/owner), C(crawl.example.com/proxy), C(crawl.example.com/uid) and
        C(crawl.example.com/spec-hash).
    type: dict
    default: {}
  provider_id:
    description:
      - The instance to delete with O(state=absent).
    type: str
"""

    # Options of the *_proxy_info modules.
    INFO = r"""
options:
  provider_id:
    description:
      - Return this one instance. A missing instance fails with RV(error_class=not_found).
      - Mutually exclusive with O(tags).
    type: str
  tags:
    description:
      - Return every instance carrying all of these tags, across every configured location.
      - An empty result is success.
    type: dict
"""
