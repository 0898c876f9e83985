"""The provider-config document the config tests break, one field at a time.

Every case starts from one valid document holding all three provider types and breaks
exactly one field, so a case can only fail for the reason it names. A broken provider
section fails only that provider; root errors fail the whole file; every error is reported.
"""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    config_errors,
    parse_provider_config,
    validate_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import ConfigError
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import PERMANENT, Permanent

SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4
KVM = ("providers", 0, "kvm")
GCP = ("providers", 1, "gcp")
K8S = ("providers", 2, "kubernetes")


def valid_document() -> dict[str, Any]:
    """All three provider types; two hosts, images and machine types, so defaults must be named."""
    return {
        "owner": "prod-cluster-1",
        "providers": [
            {
                "name": "home-kvm",
                "type": "kvm",
                "kvm": {
                    "ssh": {
                        "keyFile": "/etc/egress-proxies/kvm-ssh/id_ed25519",
                        "knownHostsFile": "/etc/egress-proxies/kvm-ssh/known_hosts",
                    },
                    "hosts": [
                        {"name": "beelink", "uri": "qemu+libssh://root@beelink/system", "pool": "default",
                         "network": "default", "domainType": "kvm"},
                        {"name": "nuc_2.lan", "uri": "qemu:///system", "pool": "vms", "network": "br0",
                         "domainType": "qemu"},
                    ],
                    "images": {
                        "debian-12": {"url": "https://images.example/debian-12.qcow2", "sha256": SHA_A,
                                      "format": "qcow2"},
                        "alpine_3.20": {"url": "https://images.example/alpine.raw", "sha256": SHA_B,
                                        "format": "raw"},
                    },
                    "machineTypes": {
                        "small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 10},
                        "large": {"vcpus": 4, "memoryMiB": 4096, "diskGiB": 20, "machine": "q35"},
                    },
                    "defaultMachineType": "small",
                    "defaultImage": "debian-12",
                    "vendorData": "#cloud-config\npackages: [htop]\n",
                    "installGuestAgent": False,
                },
            },
            {
                "name": "gcp-eu",
                "type": "gcp",
                # Its proxies are dialled at external addresses: the crawlers' public sources are named.
                "allowedSources": ["198.51.100.0/24"],
                "gcp": {
                    "project": "my-project",
                    "zones": ["europe-west1-b", "europe-west4-a"],
                    "machineTypes": {"small": "e2-small"},
                    "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
                },
            },
            {
                "name": "cluster",
                "type": "kubernetes",
                "kubernetes": {"namespace": "egress", "image": "ubuntu/squid:latest"},
            },
        ],
    }


DELETE = object()


def changed(*edits: tuple[tuple[Any, ...], Any]) -> dict[str, Any]:
    """The valid document with each (path, value) edit applied; DELETE removes the key."""
    document = valid_document()
    for path, value in edits:
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        if value is DELETE:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return document


def config_error(document: Any) -> ConfigError:
    """The error a module run gets for a document with exactly one bad field: the file's own
    for a root error, else the broken provider's (and every other provider still works)."""
    errors = config_errors(document)
    assert len(errors) == 1, errors
    if validate_provider_config(document).root_errors:
        with pytest.raises(ConfigError) as root:
            parse_provider_config(document)
        assert root.value.errors == errors
        return root.value
    config = parse_provider_config(document)
    (broken,) = [provider for provider in config.providers if not provider.valid]
    assert list(broken.errors) == errors
    for other in config.providers:
        if other is not broken:
            assert config.provider(other.name, other.type) is other
    with pytest.raises(ConfigError) as caught:
        config.provider(broken.name)
    assert caught.value.errors == errors
    assert errors[0] in str(caught.value)
    return caught.value


def assert_bad_field(document: Any, expected: str) -> None:
    """A document with exactly one bad field: its one error is Permanent and starts with ``expected``."""
    error = config_error(document)
    assert isinstance(error, Permanent)
    assert error.error_class == PERMANENT
    assert error.errors[0].startswith(expected), error.errors


def paths(errors: list[str]) -> list[str]:
    """The field path of each error."""
    return [error.split(": ", 1)[0] for error in errors]
