"""The provider config: the file's root, what every provider entry has, and fault isolation.

Each provider type's section has its own tests (kvm/, gcp/, k8s/test_settings.py); the
document every case breaks is tests/support/collection/config_documents.py's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import (
    config_errors,
    load_provider_config,
    parse_provider_config,
    validate_provider_config,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.config_reader import ConfigError
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import PERMANENT, Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost, KvmImage, KvmMachineType
from support.collection.config_documents import (
    DELETE,
    GCP,
    K8S,
    KVM,
    SHA_B,
    assert_bad_field,
    changed,
    config_error,
    paths,
    valid_document,
)


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
]


@pytest.mark.parametrize(("document", "expected"), BAD_FIELDS)
def test_a_bad_field_is_reported_with_its_path(document: dict[str, Any], expected: str) -> None:
    assert_bad_field(document, expected)


def test_every_error_is_reported_in_document_order() -> None:
    # Broken: a host name in the first provider, then a zone in the second.
    document = changed(((*KVM, "hosts", 0, "name"), "a/b"), ((*GCP, "zones", 0), "Europe West"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0].name", "providers[1].gcp.zones[0]"]
    # Broken: the first host's domainType, then the second host's name.
    document = changed(((*KVM, "hosts", 0, "domainType"), "xen"), ((*KVM, "hosts", 1, "name"), "a b"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0].domainType",
                                              "providers[0].kvm.hosts[1].name"]


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


# -- probe: how the controller checks that a provider's proxies serve ------------------------------


def with_probe(probe: Any) -> dict[str, Any]:
    document = valid_document()
    document["providers"][0]["probe"] = probe
    return document


KEY = "/etc/egress-proxies/probe/key"


def test_probe_absent_none_and_overrides() -> None:
    # No probe section: probed, but no probe target is named (the controller says so).
    default = parse_provider_config(valid_document()).provider("home-kvm").probe
    assert default.enabled and default.http_url is None and default.key_file is None
    assert parse_provider_config(with_probe("none")).provider("home-kvm").probe.enabled is False
    probe = parse_provider_config(with_probe({
        "httpUrl": "http://10.0.0.1/generate_204", "keyFile": KEY, "expectStatus": 200,
        "connect": "[2001:db8::1]:443", "egressEchoUrl": "http://10.0.0.1/echo", "timeoutSeconds": 3,
        "unhealthyAfterSeconds": 60, "concurrency": 50, "roundSeconds": 20, "flapWindow": 12, "flapPercent": 40,
    })).provider("home-kvm").probe
    assert (probe.http_url, probe.key_file, probe.expect_status, probe.connect, probe.egress_echo_url,
            probe.timeout_seconds, probe.unhealthy_after_seconds, probe.concurrency, probe.round_seconds,
            probe.flap_window, probe.flap_percent) == (
        "http://10.0.0.1/generate_204", KEY, 200, "[2001:db8::1]:443", "http://10.0.0.1/echo", 3, 60, 50, 20, 12, 40)
    target = {"httpUrl": "http://probe.example.net/generate_204", "keyFile": KEY}
    defaults = parse_provider_config(with_probe(target)).provider("home-kvm").probe
    # The CONNECT check goes to the probe target's own tunnel port unless told otherwise.
    assert (defaults.connect, defaults.timeout_seconds, defaults.concurrency, defaults.round_seconds,
            defaults.flap_window, defaults.flap_percent) == ("probe.example.net:443", 5, 200, 30, 30, 25)
    assert parse_provider_config(with_probe({**target, "connect": "none"})).provider("home-kvm").probe.connect is None
    # No control listener named: the controller asks httpUrl (and the rest) directly, as before.
    assert defaults.control_url is None and defaults.as_dict()["controlUrl"] is None
    control = parse_provider_config(with_probe({**target, "controlUrl": "http://10.0.0.5:8081/generate_204"}))
    assert control.provider("home-kvm").probe.control_url == "http://10.0.0.5:8081/generate_204"
    # Where the controller's probes come from is named once, at the root (probeSources), not per probe.
    assert "sources" not in defaults.as_dict()


TARGET = {"httpUrl": "http://x/generate_204", "keyFile": KEY}


@pytest.mark.parametrize(("probe", "expected"), [
    ("off", "providers[0].probe: must be a mapping"),
    ({**TARGET, "httpUrl": "https://x/204"}, "providers[0].probe.httpUrl: 'https://x/204' must be an http:// URL"),
    ({"keyFile": KEY}, "providers[0].probe.httpUrl: required field is missing"),
    ({"httpUrl": "http://x/"}, "providers[0].probe.keyFile: required field is missing"),
    ({**TARGET, "keyFile": "key"}, "providers[0].probe.keyFile: 'key' must be an absolute path"),
    ({**TARGET, "connect": "example.com"}, "providers[0].probe.connect: 'example.com' must be host:port"),
    ({**TARGET, "expectStatus": 42}, "providers[0].probe.expectStatus: must be an integer >= 100"),
    ({**TARGET, "unhealthyAfterSeconds": 5}, "providers[0].probe.unhealthyAfterSeconds: must be an integer >= 30"),
    ({**TARGET, "timeoutSeconds": 120}, "providers[0].probe.timeoutSeconds: must be at most 60"),
    ({**TARGET, "timeoutSeconds": 0}, "providers[0].probe.timeoutSeconds: must be an integer >= 1"),
    ({**TARGET, "concurrency": 0}, "providers[0].probe.concurrency: must be an integer >= 1"),
    ({**TARGET, "concurrency": 20000}, "providers[0].probe.concurrency: must be at most 10000"),
    ({**TARGET, "roundSeconds": 4}, "providers[0].probe.roundSeconds: must be an integer >= 5"),
    ({**TARGET, "timeoutSeconds": 20, "roundSeconds": 10},
     "providers[0].probe.roundSeconds: must be at least timeoutSeconds (20), got 10"),
    ({**TARGET, "flapWindow": 3}, "providers[0].probe.flapWindow: must be an integer >= 6"),
    ({**TARGET, "flapPercent": 95}, "providers[0].probe.flapPercent: must be at most 90"),
    ({**TARGET, "httpurl": "http://x/"}, "providers[0].probe.httpurl: unknown field"),
    ({**TARGET, "controlUrl": "https://10.0.0.5:8081/"},
     ("providers[0].probe.controlUrl: 'https://10.0.0.5:8081/' must be an http:// URL of the probe target's "
      "--control-listen address")),
    ({**TARGET, "controlUrl": "http://10.0.0.5:8081/", "expectStatus": 200},
     "providers[0].probe.controlUrl: the control listener answers 204, so expectStatus must be 204 (got 200)"),
    ({**TARGET, "controlUrl": "http://10.0.0.5:8081/echo"},
     "providers[0].probe.controlUrl: 'http://10.0.0.5:8081/echo' must be an http:// URL"),
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


def test_a_kvm_host_published_on_a_public_address_needs_named_sources() -> None:
    """Issue 39 item 1: public exposure is explicit. A private publicAddress (a LAN's) keeps the
    default sources; a public one needs allowedSources written, and with them it parses."""
    lan = changed(((*KVM, "hosts", 0, "publicAddress"), "10.1.2.3"),
                  ((*KVM, "hosts", 0, "publishPorts"), "40000-40009"))
    assert parse_provider_config(lan).provider("home-kvm").valid
    public = changed(((*KVM, "hosts", 0, "publicAddress"), "203.0.113.10"),
                     ((*KVM, "hosts", 0, "publishPorts"), "40000-40009"))
    (error,) = parse_provider_config(public).errors
    assert error.startswith("providers[0].allowedSources: required: providers[0].kvm.hosts[0].publicAddress "
                            "(203.0.113.10) publishes proxies on a public address"), error
    public["providers"][0]["allowedSources"] = ["198.51.100.0/24"]
    assert parse_provider_config(public).provider("home-kvm").allowed_sources == ("198.51.100.0/24",)


def test_allowed_destinations_default_to_none_and_are_checked() -> None:
    assert parse_provider_config(valid_document()).provider("home-kvm").allowed_destinations == ()
    document = valid_document()
    document["providers"][0]["allowedDestinations"] = ["192.168.122.1/32", "FD00:1::/64"]
    assert parse_provider_config(document).provider("home-kvm").allowed_destinations == (
        "192.168.122.1/32", "fd00:1::/64")
    for bad, expected in (([], "providers[0].allowedDestinations: must be a non-empty list"),
                          (["192.168.122.1/24"], ("providers[0].allowedDestinations[0]: '192.168.122.1/24' is not "
                                                  "a network in CIDR form")),
                          ([10], "providers[0].allowedDestinations[0]: must be a CIDR string")):
        document["providers"][0]["allowedDestinations"] = bad
        (error,) = validate_provider_config(document).errors
        assert error.startswith(expected), error


def test_public_exposure_needs_written_sources_and_probe_sources_are_named_once() -> None:
    # Issue 39 row 1: a GCP provider's proxies are dialled at external addresses (externalIP:
    # true, the default); the private default sources never get there, so they must be written.
    document = valid_document()
    del document["providers"][1]["allowedSources"]
    (error,) = validate_provider_config(document).errors
    assert error.startswith("providers[1].allowedSources: required: gcp.externalIP is true (the default)"), error
    document["providers"][1]["gcp"]["externalIP"] = False  # inside the VPC: the private default stands
    assert validate_provider_config(document).errors == ()
    assert "10.0.0.0/8" in parse_provider_config(document).provider("gcp-eu").allowed_sources
    # probeSources: at the root, once, handed to every provider entry; checked like any CIDR list.
    document["probeSources"] = ["192.0.2.10/32"]
    config = parse_provider_config(document)
    assert {provider.probe_sources for provider in config.providers} == {("192.0.2.10/32",)}
    document["probeSources"] = ["192.0.2.10/24"]
    (error,) = validate_provider_config(document).root_errors
    assert error.startswith("probeSources[0]: '192.0.2.10/24' is not a network in CIDR form"), error
