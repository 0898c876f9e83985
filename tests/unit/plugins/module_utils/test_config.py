"""The provider config: one table of bad fields, each reported with its exact field path.

Every case starts from one valid document holding all three provider types and breaks
exactly one field, so a case can only fail for the reason it names.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    IDENTIFIER_RULE,
    ConfigError,
    KubernetesSettings,
    KvmHost,
    KvmImage,
    KvmMachineType,
    load_provider_config,
    parse_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import PERMANENT, Permanent

SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4
KVM = ("providers", 0, "kvm")
GCP = ("providers", 1, "gcp")
K8S = ("providers", 2, "kubernetes")
# Why host names and image keys are restricted: the message must say it, so an operator
# renaming a host knows what the name is used for.
HOST_CONSEQUENCE = "providerIDs"
IMAGE_CONSEQUENCE = "base-<key>.<format>"


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


def renamed_image_key(new_key: str) -> dict[str, Any]:
    document = valid_document()
    images = document["providers"][0]["kvm"]["images"]
    images[new_key] = images.pop("alpine_3.20")
    return document


def config_error(document: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_provider_config(document)
    return caught.value


def test_the_valid_document_parses() -> None:
    config = parse_provider_config(valid_document())
    assert config.owner == "prod-cluster-1"
    assert [(p.name, p.type) for p in config.providers] == [
        ("home-kvm", "kvm"), ("gcp-eu", "gcp"), ("cluster", "kubernetes")]
    kvm = config.providers[0].kvm
    assert kvm is not None
    assert kvm.hosts[1] == KvmHost(name="nuc_2.lan", uri="qemu:///system", pool="vms", network="br0",
                                   domain_type="qemu")
    assert kvm.images["alpine_3.20"] == KvmImage(key="alpine_3.20", url="https://images.example/alpine.raw",
                                                 sha256=SHA_B, format="raw")
    assert kvm.images["alpine_3.20"].volume_name == "base-alpine_3.20.raw"
    assert kvm.machine_types["large"] == KvmMachineType(vcpus=4, memory_mib=4096, disk_gib=20, machine="q35")
    assert (kvm.default_machine_type, kvm.default_image) == ("small", "debian-12")
    assert kvm.ssh is not None
    assert kvm.ssh.key_file == "/etc/egress-proxies/kvm-ssh/id_ed25519"
    assert kvm.vendor_data == "#cloud-config\npackages: [htop]\n"
    assert kvm.install_guest_agent is False
    assert kvm.host("beelink") is kvm.hosts[0]
    assert kvm.host("missing") is None
    gcp = config.providers[1].gcp
    assert gcp is not None
    assert gcp.zones == ("europe-west1-b", "europe-west4-a")
    assert (gcp.default_machine_type, gcp.default_image, gcp.network) == (
        "small", "debian-12", "global/networks/default")
    kubernetes = config.providers[2].kubernetes
    assert kubernetes is not None
    assert (kubernetes.namespace, kubernetes.image) == ("egress", "ubuntu/squid:latest")


@pytest.mark.parametrize("endpoint", ["https://compute.example.com", "http://127.0.0.1:8085",
                                      "http://localhost:8085", "http://[::1]:8085"])
def test_gcp_api_endpoint_is_https_or_a_loopback_emulator(endpoint: str) -> None:
    gcp = parse_provider_config(changed(((*GCP, "apiEndpoint"), endpoint))).providers[1].gcp
    assert gcp is not None
    assert gcp.api_endpoint == endpoint


def test_kubernetes_settings_and_their_defaults() -> None:
    minimal = parse_provider_config(valid_document()).providers[2].kubernetes
    assert minimal is not None
    assert minimal == KubernetesSettings(namespace="egress", image="ubuntu/squid:latest", kubeconfig=None,
                                         squid_config=None, host_network=False, spread_nodes=True,
                                         cpu_request="100m", memory_request="128Mi", namespaces=())
    assert minimal.locations == ("egress",)
    document = changed(((*K8S, "namespaces"), ["crawl-a", "egress"]), ((*K8S, "kubeconfig"), "/etc/kube/config"),
                       ((*K8S, "squidConfig"), "# https_port is fine\nhttp_access allow all\n"),
                       ((*K8S, "hostNetwork"), True), ((*K8S, "spreadNodes"), False),
                       ((*K8S, "cpuRequest"), "0.5"), ((*K8S, "memoryRequest"), "1Gi"))
    full = parse_provider_config(document).providers[2].kubernetes
    assert full is not None
    assert full.locations == ("egress", "crawl-a")  # the default first, never twice
    assert (full.kubeconfig, full.host_network, full.spread_nodes, full.cpu_request, full.memory_request) == (
        "/etc/kube/config", True, False, "0.5", "1Gi")
    assert full.squid_config == "# https_port is fine\nhttp_access allow all\n"


def test_defaults_are_applied() -> None:
    document = {
        "owner": "o",
        "providers": [{"name": "lab", "type": "kvm", "kvm": {
            "hosts": [{"name": "h1", "uri": "qemu:///system"}],
            "images": {"debian-12": {"url": "file:///srv/debian.qcow2", "sha256": SHA_A}},
            "machineTypes": {"tiny": {"vcpus": 1, "memoryMiB": 256, "diskGiB": 1}},
        }}],
    }
    kvm = parse_provider_config(document).providers[0].kvm
    assert kvm is not None
    assert kvm.hosts == (KvmHost(name="h1", uri="qemu:///system", pool="default", network="default",
                                 domain_type="kvm"),)
    assert kvm.images["debian-12"].format == "qcow2"
    # A single machine type and a single image are the defaults without being named.
    assert (kvm.default_machine_type, kvm.default_image) == ("tiny", "debian-12")
    assert kvm.install_guest_agent is True
    assert kvm.vendor_data is None
    assert kvm.ssh is None  # no SSH URI, so no SSH section needed
    assert kvm.machine_types["tiny"].machine is None


BAD_FIELDS = [
    pytest.param(changed((("owner",), DELETE)), "owner: required field is missing", id="missing-owner"),
    pytest.param(changed((("owner",), "Prod Cluster")), "owner: 'Prod Cluster' must be", id="bad-owner"),
    pytest.param(changed((("owner",), "prod\n")), "owner: ", id="owner-with-trailing-newline"),
    pytest.param(changed((("extra",), 1)), "extra: unknown field", id="unknown-top-level-key"),
    pytest.param(changed((("providers",), [])), "providers: must be a non-empty list", id="empty-providers"),
    pytest.param(changed((("providers", 2, "name"), "home-kvm")),
                 "providers[2].name: duplicate provider name 'home-kvm'", id="duplicate-provider-name"),
    pytest.param(changed((("providers", 1, "type"), "aws")), "providers[1].type: 'aws' is not one of",
                 id="unknown-type"),
    pytest.param(changed(((*GCP[:2], "gcp"), DELETE)), "providers[1].gcp: required field is missing",
                 id="missing-section"),
    pytest.param(changed(((*KVM, "hosts", 1, "domaintype"), "qemu")),
                 "providers[0].kvm.hosts[1].domaintype: unknown field", id="kvm-host-typo"),
    pytest.param(changed(((*KVM, "hosts", 0, "domainType"), "xen")),
                 "providers[0].kvm.hosts[0].domainType: 'xen' is not one of kvm, qemu", id="bad-domain-type"),
    pytest.param(changed(((*KVM, "hosts", 1, "name"), "beelink")),
                 "providers[0].kvm.hosts[1].name: duplicate host name 'beelink'", id="duplicate-host-name"),
    pytest.param(changed(((*KVM, "hosts", 1, "name"), "bee link")), "providers[0].kvm.hosts[1].name: 'bee link'",
                 id="host-name-with-space"),
    pytest.param(changed(((*KVM, "hosts", 1, "name"), "a/b")), "providers[0].kvm.hosts[1].name: 'a/b'",
                 id="host-name-with-slash"),
    pytest.param(changed(((*KVM, "hosts", 1, "name"), "beelink\n")), "providers[0].kvm.hosts[1].name: ",
                 id="host-name-with-trailing-newline"),
    pytest.param(changed(((*KVM, "hosts", 0, "uri"), "beelink")), "providers[0].kvm.hosts[0].uri: 'beelink'",
                 id="uri-without-scheme"),
    pytest.param(changed(((*KVM, "ssh"), DELETE)),
                 "providers[0].kvm.hosts[0].uri: is an SSH URI, so providers[0].kvm.ssh is required",
                 id="ssh-uri-without-ssh-section"),
    pytest.param(changed(((*KVM, "ssh", "knownHostsFile"), DELETE)),
                 "providers[0].kvm.ssh.knownHostsFile: required field is missing", id="ssh-without-known-hosts"),
    pytest.param(renamed_image_key("alpine 3"), "providers[0].kvm.images.alpine 3: image key 'alpine 3'",
                 id="image-key-with-space"),
    pytest.param(renamed_image_key("a/b"), "providers[0].kvm.images.a/b: image key 'a/b'",
                 id="image-key-with-slash"),
    pytest.param(renamed_image_key("alpine\n"), "providers[0].kvm.images.alpine\n: image key",
                 id="image-key-with-trailing-newline"),
    pytest.param(changed(((*KVM, "images", "debian-12", "sha256"), SHA_A.upper())),
                 "providers[0].kvm.images.debian-12.sha256: ", id="uppercase-sha256"),
    pytest.param(changed(((*KVM, "images", "debian-12", "sha256"), "a" * 63)),
                 "providers[0].kvm.images.debian-12.sha256: ", id="short-sha256"),
    pytest.param(changed(((*KVM, "images", "debian-12", "sha256"), SHA_A + "\n")),
                 "providers[0].kvm.images.debian-12.sha256: ", id="sha256-with-trailing-newline"),
    pytest.param(changed(((*KVM, "images", "debian-12", "format"), "vmdk")),
                 "providers[0].kvm.images.debian-12.format: 'vmdk' is not one of qcow2, raw", id="bad-format"),
    pytest.param(changed(((*KVM, "machineTypes", "large", "vcpus"), 0)),
                 "providers[0].kvm.machineTypes.large.vcpus: must be an integer >= 1, got 0", id="vcpus-0"),
    pytest.param(changed(((*KVM, "machineTypes", "large", "vcpus"), True)),
                 "providers[0].kvm.machineTypes.large.vcpus: must be an integer >= 1, got True", id="vcpus-bool"),
    pytest.param(changed(((*KVM, "machineTypes", "large", "vcpus"), "2")),
                 "providers[0].kvm.machineTypes.large.vcpus: must be an integer >= 1, got '2'",
                 id="vcpus-string"),
    pytest.param(changed(((*KVM, "defaultMachineType"), "medium")),
                 "providers[0].kvm.defaultMachineType: 'medium' is not a key of machineTypes",
                 id="default-machine-type-not-a-key"),
    pytest.param(changed(((*KVM, "defaultImage"), DELETE)),
                 "providers[0].kvm.defaultImage: required when more than one images is configured",
                 id="default-image-missing-with-two-images"),
    pytest.param(changed(((*KVM, "vendorData"), {"packages": ["htop"]})),
                 "providers[0].kvm.vendorData: must be a string", id="vendor-data-not-a-string"),
    pytest.param(changed(((*KVM, "installGuestAgent"), "yes")),
                 "providers[0].kvm.installGuestAgent: must be true or false, got str 'yes'",
                 id="install-guest-agent-not-bool"),
    pytest.param(changed(((*GCP, "zones"), [])), "providers[1].gcp.zones: must be a non-empty list",
                 id="gcp-zones-empty"),
    pytest.param(changed(((*GCP, "zones", 1), "Europe West")), "providers[1].gcp.zones[1]: 'Europe West'",
                 id="gcp-bad-zone"),
    pytest.param(changed(((*GCP, "zones", 0), "europe-west1-b\n")), "providers[1].gcp.zones[0]: ",
                 id="gcp-zone-with-trailing-newline"),
    pytest.param(changed(((*GCP, "project"), "My_Project")), "providers[1].gcp.project: 'My_Project'",
                 id="gcp-project-invalid"),
    pytest.param(changed(((*GCP, "apiEndpoint"), "http://compute.example.com")),
                 "providers[1].gcp.apiEndpoint: 'http://compute.example.com' must be an https:// URL",
                 id="gcp-plain-http-endpoint-off-loopback"),
    pytest.param(changed(((*GCP, "apiEndpoint"), "127.0.0.1:8085")),
                 "providers[1].gcp.apiEndpoint: '127.0.0.1:8085' must be", id="gcp-endpoint-without-scheme"),
    pytest.param(changed(((*K8S, "namespace"), "Egress")), "providers[2].kubernetes.namespace: 'Egress'",
                 id="kubernetes-namespace-invalid"),
    pytest.param(changed(((*K8S, "namespaces"), ["crawl-a", "Crawl_B"])),
                 "providers[2].kubernetes.namespaces[1]: 'Crawl_B' is not a valid Kubernetes namespace name",
                 id="kubernetes-namespaces-entry-invalid"),
    pytest.param(changed(((*K8S, "namespaces"), [])), "providers[2].kubernetes.namespaces: must be a non-empty list",
                 id="kubernetes-namespaces-empty"),
    pytest.param(changed(((*K8S, "image"), "ubuntu/squid latest")),
                 "providers[2].kubernetes.image: 'ubuntu/squid latest' is not a container image reference",
                 id="kubernetes-image-with-space"),
    pytest.param(changed(((*K8S, "squidConfig"), "acl a src all\n  http_port 8080\n")),
                 "providers[2].kubernetes.squidConfig: must not contain http_port: the module adds",
                 id="kubernetes-squid-config-with-http-port"),
    pytest.param(changed(((*K8S, "squidConfig"), "#" * (64 * 1024 + 1))),
                 "providers[2].kubernetes.squidConfig: is longer than 65536 bytes", id="kubernetes-squid-config-huge"),
    pytest.param(changed(((*K8S, "cpuRequest"), "half")),
                 "providers[2].kubernetes.cpuRequest: 'half' is not a Kubernetes quantity",
                 id="kubernetes-cpu-request"),
    pytest.param(changed(((*K8S, "memoryRequest"), "128MB")),
                 "providers[2].kubernetes.memoryRequest: '128MB' is not a Kubernetes quantity",
                 id="kubernetes-memory-request"),
    pytest.param(changed(((*K8S, "hostNetwork"), "yes")),
                 "providers[2].kubernetes.hostNetwork: must be true or false", id="kubernetes-host-network-not-bool"),
    pytest.param(changed(((*K8S, "hostnetwork"), True)), "providers[2].kubernetes.hostnetwork: unknown field",
                 id="kubernetes-typo"),
]


@pytest.mark.parametrize(("document", "expected"), BAD_FIELDS)
def test_a_bad_field_is_reported_with_its_path(document: dict[str, Any], expected: str) -> None:
    error = config_error(document)
    assert isinstance(error, Permanent)
    assert error.error_class == PERMANENT
    assert str(error).startswith(expected), str(error)


@pytest.mark.parametrize(
    ("document", "consequence"),
    [
        pytest.param(changed(((*KVM, "hosts", 1, "name"), "bee link")), HOST_CONSEQUENCE, id="host-name"),
        pytest.param(renamed_image_key("a/b"), IMAGE_CONSEQUENCE, id="image-key"),
    ],
)
def test_identifier_errors_say_what_is_allowed_and_why(document: dict[str, Any], consequence: str) -> None:
    message = str(config_error(document))
    assert IDENTIFIER_RULE in message
    assert "letters, digits, '.', '-' and '_'" in message
    assert consequence in message


def test_the_first_error_in_document_order_wins() -> None:
    # Broken: a host name in the first provider, then a zone in the second.
    document = changed(((*KVM, "hosts", 0, "name"), "a/b"), ((*GCP, "zones", 0), "Europe West"))
    assert str(config_error(document)).startswith("providers[0].kvm.hosts[0].name: ")
    # Broken: the first host's domainType, then the second host's name.
    document = changed(((*KVM, "hosts", 0, "domainType"), "xen"), ((*KVM, "hosts", 1, "name"), "a b"))
    assert str(config_error(document)).startswith("providers[0].kvm.hosts[0].domainType: ")


def test_the_first_error_in_document_order_wins_within_one_mapping() -> None:
    # The gcp section as the design's example writes it: project first, then zones.
    document = changed(((*GCP, "project"), "My_Project"), ((*GCP, "zones", 0), "Europe West"))
    assert list(document["providers"][1]["gcp"])[:2] == ["project", "zones"]
    assert str(config_error(document)).startswith("providers[1].gcp.project: ")


@pytest.mark.parametrize("document", [None, [], "owner: x"], ids=["empty-file", "list", "string"])
def test_a_document_that_is_not_a_mapping_is_rejected(document: Any) -> None:
    assert str(config_error(document)).startswith("<document>: must be a mapping")


def test_parsing_does_not_change_the_document() -> None:
    document = valid_document()
    original = copy.deepcopy(document)
    parse_provider_config(document)
    assert document == original


def test_load_reads_and_validates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(valid_document(), sort_keys=False))
    assert load_provider_config(str(path)) == parse_provider_config(valid_document())


def test_load_reports_the_file_and_the_field_path(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(changed(((*K8S, "namespace"), "Egress")), sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        load_provider_config(str(path))
    assert str(caught.value).startswith(f"provider config {path}: providers[2].kubernetes.namespace: ")


def test_load_of_a_missing_file_names_provider_config(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        load_provider_config(str(path))
    assert caught.value.error_class == PERMANENT
    assert str(caught.value).startswith(f"provider_config: cannot read {path}")


def test_load_of_invalid_yaml_names_provider_config(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("owner: o\nproviders: [\n  {name: lab\n")
    with pytest.raises(ConfigError) as caught:
        load_provider_config(str(path))
    assert caught.value.error_class == PERMANENT
    assert str(caught.value).startswith(f"provider_config: {path} is not valid YAML")


def test_provider_lookup_returns_the_named_provider() -> None:
    config = parse_provider_config(valid_document())
    assert config.provider("gcp-eu").gcp is not None
    assert config.provider("cluster", "kubernetes").kubernetes is not None


def test_provider_lookup_of_an_unknown_name_is_permanent() -> None:
    config = parse_provider_config(valid_document())
    with pytest.raises(Permanent) as caught:
        config.provider("aws-us")
    message = str(caught.value)
    assert message.startswith("provider: 'aws-us' is not in the provider config")
    assert "home-kvm, gcp-eu, cluster" in message


def test_provider_lookup_of_the_wrong_type_is_permanent() -> None:
    config = parse_provider_config(valid_document())
    with pytest.raises(Permanent) as caught:
        config.provider("gcp-eu", "kvm")
    assert str(caught.value).startswith("provider: 'gcp-eu' is a gcp provider, not kvm")
