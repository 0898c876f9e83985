"""The provider config: one table of bad fields, each reported with its exact field path.

Every case starts from one valid document holding all three provider types and breaks
exactly one field, so a case can only fail for the reason it names. A broken provider
section fails only that provider; root errors fail the whole file; every error is reported.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    ABSOLUTE_PATH_RULE,
    IDENTIFIER_RULE,
    ConfigError,
    KubernetesSettings,
    KvmHost,
    KvmImage,
    KvmMachineType,
    config_errors,
    libvirt_uri_problem,
    load_provider_config,
    parse_provider_config,
    validate_provider_config,
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
    assert error.errors[0].startswith(expected), error.errors


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


def paths(errors: list[str]) -> list[str]:
    """The field path of each error."""
    return [error.split(": ", 1)[0] for error in errors]


def test_every_error_is_reported_in_document_order() -> None:
    # Broken: a host name in the first provider, then a zone in the second.
    document = changed(((*KVM, "hosts", 0, "name"), "a/b"), ((*GCP, "zones", 0), "Europe West"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0].name", "providers[1].gcp.zones[0]"]
    # Broken: the first host's domainType, then the second host's name.
    document = changed(((*KVM, "hosts", 0, "domainType"), "xen"), ((*KVM, "hosts", 1, "name"), "a b"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0].domainType",
                                              "providers[0].kvm.hosts[1].name"]


def test_every_error_within_one_mapping_is_reported_in_document_order() -> None:
    # The gcp section as docs/gcp-provider.md's example writes it: project first, then zones.
    document = changed(((*GCP, "project"), "My_Project"), ((*GCP, "zones", 0), "Europe West"))
    assert list(document["providers"][1]["gcp"])[:2] == ["project", "zones"]
    assert paths(config_errors(document)) == ["providers[1].gcp.project", "providers[1].gcp.zones[0]"]


@pytest.mark.parametrize("document", [None, [], "owner: x"], ids=["empty-file", "list", "string"])
def test_a_document_that_is_not_a_mapping_is_rejected(document: Any) -> None:
    assert str(config_error(document)).startswith("<document>: must be a mapping")
    assert validate_provider_config(document).root_errors == tuple(config_errors(document))


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
    config = load_provider_config(str(path))
    assert config.provider("home-kvm", "kvm").kvm is not None  # the other providers still load
    with pytest.raises(ConfigError) as caught:
        config.provider("cluster", "kubernetes")
    assert str(caught.value).startswith(f"provider config {path}: provider 'cluster' cannot be used until its "
                                        "section is fixed: providers[2].kubernetes.namespace: ")


def test_load_of_a_file_with_a_root_error_names_the_file_and_every_error(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    document = changed((("owner",), "Prod"), ((*K8S, "namespace"), "Egress"))
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        load_provider_config(str(path))
    assert str(caught.value).startswith(f"provider config {path}: 2 errors: (1) owner: 'Prod' must be")
    assert paths(caught.value.errors) == ["owner", "providers[2].kubernetes.namespace"]


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


# --- Fault isolation: a broken section fails only its own provider ---------------------------


def test_two_broken_sections_fail_only_their_own_providers_with_every_error() -> None:
    document = changed(((*KVM, "hosts", 0, "domainType"), "xen"), ((*KVM, "images", "debian-12", "format"), "vmdk"),
                       ((*GCP, "zones", 1), "Europe West"))
    config = parse_provider_config(document)
    assert [(p.name, p.valid) for p in config.providers] == [("home-kvm", False), ("gcp-eu", False),
                                                             ("cluster", True)]
    assert config.provider("cluster", "kubernetes").kubernetes is not None
    assert paths(config.errors) == ["providers[0].kvm.hosts[0].domainType",
                                    "providers[0].kvm.images.debian-12.format", "providers[1].gcp.zones[1]"]
    with pytest.raises(ConfigError) as caught:
        config.provider("home-kvm", "kvm")
    assert paths(caught.value.errors) == ["providers[0].kvm.hosts[0].domainType",
                                          "providers[0].kvm.images.debian-12.format"]
    assert ("2 errors: (1) providers[0].kvm.hosts[0].domainType: 'xen' is not one of kvm, qemu; (2) "
            "providers[0].kvm.images.debian-12.format: ") in str(caught.value)
    assert caught.value.error_class == PERMANENT
    with pytest.raises(ConfigError, match=r"providers\[1\]\.gcp\.zones\[1\]"):
        config.provider("gcp-eu")


def test_every_unknown_key_and_every_bad_field_of_one_section_is_reported() -> None:
    document = changed(((*K8S, "hostnetwork"), True), ((*K8S, "cpu"), "1"), ((*K8S, "memoryRequest"), "lots"),
                       ((*K8S, "namespace"), DELETE))
    assert paths(config_errors(document)) == [
        "providers[2].kubernetes.hostnetwork", "providers[2].kubernetes.cpu", "providers[2].kubernetes.namespace",
        "providers[2].kubernetes.memoryRequest"]


def test_a_bad_host_does_not_hide_the_next_ones() -> None:
    document = changed(((*KVM, "hosts", 0), "beelink"), ((*KVM, "hosts", 1, "uri"), "qemu+tcp://nuc/system"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0]", "providers[0].kvm.hosts[1].uri"]


def test_root_errors_fail_the_whole_file_and_still_list_every_error() -> None:
    document = changed(((*KVM, "hosts", 0, "domainType"), "xen"), (("providers", 2, "name"), "gcp-eu"),
                       (("extra",), 1))
    with pytest.raises(ConfigError) as caught:
        parse_provider_config(document)
    assert paths(caught.value.errors) == ["extra", "providers[0].kvm.hosts[0].domainType", "providers[2].name"]
    report = validate_provider_config(document)
    assert paths(list(report.root_errors)) == ["extra", "providers[2].name"]
    assert [p.name for p in report.providers] == ["home-kvm", "gcp-eu"]  # the duplicate is not a provider
    assert config_errors(document) == caught.value.errors


@pytest.mark.parametrize(("raw", "path"), [(["a"], "providers[0]"), ({"type": "kvm"}, "providers[0].name")],
                         ids=["entry-not-a-mapping", "entry-without-a-name"])
def test_an_entry_that_cannot_be_named_is_a_root_error(raw: Any, path: str) -> None:
    document = valid_document()
    document["providers"][0] = raw
    with pytest.raises(ConfigError) as caught:
        parse_provider_config(document)
    assert paths(caught.value.errors) == [path]


def test_config_errors_of_a_parsed_config_are_its_section_errors() -> None:
    config = parse_provider_config(changed(((*GCP, "project"), "X")))
    assert paths(config_errors(config)) == ["providers[1].gcp.project"]
    assert not config.valid
    assert config_errors(parse_provider_config(valid_document())) == []


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


# --- GCP subnetwork ---------------------------------------------------------------------------


@pytest.mark.parametrize("subnetwork", [
    "regions/europe-west1/subnetworks/egress",
    "projects/my-project/regions/europe-west1/subnetworks/egress",
    "https://www.googleapis.com/compute/v1/projects/my-project/regions/europe-west1/subnetworks/egress",
])
def test_gcp_subnetwork_forms(subnetwork: str) -> None:
    document = changed(((*GCP, "subnetwork"), subnetwork), ((*GCP, "zones"), ["europe-west1-b", "europe-west1-c"]))
    gcp = parse_provider_config(document).provider("gcp-eu", "gcp").gcp
    assert gcp is not None
    assert gcp.subnetwork == subnetwork


def test_gcp_subnetwork_defaults_to_none() -> None:
    gcp = parse_provider_config(valid_document()).provider("gcp-eu").gcp
    assert gcp is not None
    assert gcp.subnetwork is None


@pytest.mark.parametrize(("subnetwork", "expected"), [
    ("egress", "'egress' is not a subnetwork such as regions/europe-west1/subnetworks/egress"),
    ("regions/europe-west1/subnetworks/Egress_1", "is not a subnetwork"),
    ("global/networks/default", "is not a subnetwork"),
    ("regions/europe-west1/subnetworks/egress", "is in region europe-west1, but zones europe-west4-a are not"),
])
def test_gcp_bad_subnetwork(subnetwork: str, expected: str) -> None:
    error = config_error(changed(((*GCP, "subnetwork"), subnetwork)))
    assert error.errors[0].startswith("providers[1].gcp.subnetwork: ")
    assert expected in error.errors[0]


# --- KVM host URIs: host keys can never be switched off ---------------------------------------

ACCEPTED_URIS = [
    "qemu+libssh://root@beelink/system",
    "qemu+libssh2://root@beelink:2222/system?socket=/run/libvirt/libvirt-sock&mode=legacy",
    "qemu+ssh://egress-proxies@192.0.2.7/system?proxy=native",
    "qemu+ssh://root@[2001:db8::7]/system",
    "qemu+SSH://root@beelink/system",  # the transport is compared case-insensitively, as libvirt does
    "QEMU+LibSSH2://root@beelink/system",
    "qemu:///system",
    "qemu:///session",
    "qemu+unix:///system?socket=/run/libvirt/libvirt-sock",
    "test+unix:///default?socket=/tmp/pytest-of-root/daemon/sock/libvirt-sock",  # the suite's test driver
    "test:///default",
]


@pytest.mark.parametrize("uri", ACCEPTED_URIS)
def test_accepted_host_uris(uri: str) -> None:
    assert libvirt_uri_problem(uri) is None
    kvm = parse_provider_config(changed(((*KVM, "hosts", 0, "uri"), uri))).provider("home-kvm").kvm
    assert kvm is not None
    assert kvm.hosts[0].uri == uri


REFUSED_URIS = [
    # Verification switched off, in any spelling libvirt would read.
    ("qemu+ssh://root@beelink/system?no_verify=1", "'no_verify', which is refused: it switches host-key"),
    ("qemu+SSH://root@beelink/system?no_verify=1", "'no_verify', which is refused"),
    ("qemu+libssh2://root@beelink/system?NO_VERIFY=1", "'no_verify', which is refused"),
    ("qemu+libssh://root@beelink/system?no%5Fverify=1", "'no_verify', which is refused"),
    ("qemu+ssh://root@beelink/system?socket=/run/x;no_verify=1", "'no_verify', which is refused"),
    ("qemu+libssh://root@beelink/system?known_hosts_verify=ignore", "'known_hosts_verify', which is refused"),
    ("qemu+libssh2://root@beelink/system?known_hosts_verify=auto", "'known_hosts_verify', which is refused"),
    # Commands of the URI's choosing, here or on the host.
    ("qemu+ssh://root@beelink/system?command=/tmp/evil", "'command', which is refused: it runs a command"),
    ("qemu+ssh://root@beelink/system?netcat=/tmp/evil", "'netcat', which is refused"),
    ("qemu+ssh://root@-oProxyCommand=touch%20x/system", "which is not a host name or an IP address"),
    ("qemu+ssh://root@beelink/system?socket=/run/x%20-c%20id", "sets socket=/run/x -c id; it must be an absolute"),
    ("qemu+ssh://root@beelink/system?socket=run/x", "sets socket=run/x; it must be an absolute path"),
    # Key material the module pins itself.
    ("qemu+libssh://root@beelink/system?keyfile=/root/.ssh/id_rsa", "'keyfile', which is refused: it is set by"),
    ("qemu+libssh://root@beelink/system?known_hosts=/dev/null", "'known_hosts', which is refused"),
    ("qemu+libssh://root@beelink/system?sshauth=agent,password", "'sshauth', which is refused"),
    ("qemu+ssh://root:secret@beelink/system", "carries a password"),
    # Transports without host verification in this model.
    ("qemu+tcp://beelink/system", ("uses the tcp transport, which is refused: it sends libvirt's protocol "
                                   "unencrypted")),
    ("qemu+TLS://beelink/system?no_verify=1", ("uses the tls transport, which is refused: it verifies the host "
                                               "against an x509 CA")),
    ("qemu://beelink/system", "without a transport, which libvirt connects to over TLS"),
    ("qemu+ext:///system?command=/tmp/evil", "uses the ext transport, which is refused: it runs a command"),
    ("qemu+socks://beelink/system", "uses the transport 'socks', which is not one of ssh, libssh, libssh2, unix"),
    ("qemu+unix://beelink/system", "the unix transport reaches this machine only"),
    # Anything not on the allowlist.
    ("qemu+ssh://root@beelink/system?name=qemu:///session", "'name', which is refused"),
    ("qemu+ssh://root@beelink/system?no_tty=1", ("'no_tty', which is not allowed here (allowed: socket, mode, "
                                                 "proxy)")),
    ("qemu+unix:///system?proxy=native", "'proxy', which is not allowed here (allowed: socket, mode)"),
    ("qemu+ssh://root@beelink/system?mode=fast", "sets mode=fast; it must be one of auto, direct, legacy"),
    ("qemu+ssh://root@beelink/system#x", "has a '#' fragment"),
    ("xen+ssh://root@beelink/system", "names the libvirt driver 'xen'"),
    ("beelink", "is not a libvirt URI"),
]


@pytest.mark.parametrize(("uri", "expected"), REFUSED_URIS)
def test_refused_host_uris_name_the_field_and_the_reason(uri: str, expected: str) -> None:
    error = config_error(changed(((*KVM, "hosts", 0, "uri"), uri)))
    message = error.errors[0]
    assert message.startswith(f"providers[0].kvm.hosts[0].uri: {uri!r} "), message
    assert expected in message


def test_an_upper_case_ssh_transport_still_needs_the_ssh_section() -> None:
    document = changed(((*KVM, "hosts", 0, "uri"), "qemu+SSH://root@beelink/system"), ((*KVM, "ssh"), DELETE))
    assert config_error(document).errors[0] == (
        "providers[0].kvm.hosts[0].uri: is an SSH URI, so providers[0].kvm.ssh is required (keyFile and "
        "knownHostsFile)")


@pytest.mark.parametrize("uri", ["qemu+ssh://root@beelink/system?mo\nde=auto", "qemu+ssh://root@bee\tlink/system",
                                 " qemu+ssh://root@beelink/system"])
def test_a_uri_with_whitespace_is_refused(uri: str) -> None:
    # Python's URL parser silently drops tabs and newlines, libvirt's does not.
    assert libvirt_uri_problem(uri) == "contains whitespace or control characters; remove them"


# -- probe: how the controller checks that a provider's proxies serve ------------------------------


def with_probe(probe: Any) -> dict[str, Any]:
    document = valid_document()
    document["providers"][0]["probe"] = probe
    return document


def test_probe_defaults_none_and_overrides() -> None:
    default = parse_provider_config(valid_document()).provider("home-kvm").probe
    assert default.enabled and default.expect_status == 204 and default.http_url.startswith("http://")
    assert parse_provider_config(with_probe("none")).provider("home-kvm").probe.enabled is False
    probe = parse_provider_config(with_probe({
        "httpUrl": "http://10.0.0.1/generate_204", "expectStatus": 200, "connect": "[2001:db8::1]:443",
        "egressEchoUrl": "http://10.0.0.1/ip", "timeoutSeconds": 3, "unhealthyAfterSeconds": 60,
    })).provider("home-kvm").probe
    assert (probe.http_url, probe.expect_status, probe.connect, probe.egress_echo_url, probe.timeout_seconds,
            probe.unhealthy_after_seconds) == ("http://10.0.0.1/generate_204", 200, "[2001:db8::1]:443",
                                               "http://10.0.0.1/ip", 3, 60)
    assert parse_provider_config(with_probe({"connect": "none"})).provider("home-kvm").probe.connect is None


@pytest.mark.parametrize(("probe", "expected"), [
    ("off", "providers[0].probe: must be a mapping"),
    ({"httpUrl": "https://x/204"}, "providers[0].probe.httpUrl: 'https://x/204' must be an http:// URL"),
    ({"connect": "example.com"}, "providers[0].probe.connect: 'example.com' must be host:port"),
    ({"expectStatus": 42}, "providers[0].probe.expectStatus: must be an integer >= 100"),
    ({"unhealthyAfterSeconds": 5}, "providers[0].probe.unhealthyAfterSeconds: must be an integer >= 30"),
    ({"timeoutSeconds": 120}, "providers[0].probe.timeoutSeconds: must be at most 60"),
    ({"httpurl": "http://x/"}, "providers[0].probe.httpurl: unknown field"),
])
def test_a_bad_probe_fails_only_its_provider(probe: Any, expected: str) -> None:
    config = parse_provider_config(with_probe(probe))
    (error,) = config.errors
    assert error.startswith(expected), error


def test_allowed_sources_default_to_private_networks_and_are_checked() -> None:
    assert "10.0.0.0/8" in parse_provider_config(valid_document()).provider("home-kvm").allowed_sources
    document = valid_document()
    document["providers"][0]["allowedSources"] = ["0.0.0.0/0", "2001:db8::/32"]
    assert parse_provider_config(document).provider("home-kvm").allowed_sources == ("0.0.0.0/0", "2001:db8::/32")
    document["providers"][0]["allowedSources"] = ["10.0.0.1/8", 12]
    errors = parse_provider_config(document).errors
    assert errors[0].startswith("providers[0].allowedSources[0]: '10.0.0.1/8' is not a network in CIDR form")
    assert errors[1].startswith("providers[0].allowedSources[1]: must be a CIDR string")
