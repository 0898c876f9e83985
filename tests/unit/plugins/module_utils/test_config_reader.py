"""The config reader's rules, as every section meets them: paths inside the file are absolute."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import parse_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import ABSOLUTE_PATH_RULE
from support.collection.config_documents import GCP, K8S, KVM, changed, config_error

# --- Paths inside the file must be absolute ---------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        pytest.param(((*KVM, "ssh", "keyFile"), "kvm-ssh/id_ed25519"), "providers[0].kvm.ssh.keyFile", id="ssh-key"),
        pytest.param(((*KVM, "ssh", "knownHostsFile"), "./known_hosts"), "providers[0].kvm.ssh.knownHostsFile",
                     id="known-hosts"),
        pytest.param(((*GCP, "credentialsFile"), "sa.json"), "providers[1].gcp.credentialsFile", id="gcp-credentials"),
        pytest.param(((*K8S, "kubeconfig"), "~/.kube/config"), "providers[2].kubernetes.kubeconfig", id="kubeconfig"),
    ],
)
def test_a_relative_path_inside_the_file_is_refused(edit: tuple[tuple[Any, ...], Any], path: str) -> None:
    error = config_error(changed(edit))
    assert error.errors[0] == f"{path}: {edit[1]!r} {ABSOLUTE_PATH_RULE}"


def test_absolute_paths_are_kept() -> None:
    config = parse_provider_config(changed(((*GCP, "credentialsFile"), "/etc/egress-proxies/gcp/sa.json")))
    gcp = config.provider("gcp-eu", "gcp").gcp
    assert gcp is not None
    assert gcp.credentials_file == "/etc/egress-proxies/gcp/sa.json"
