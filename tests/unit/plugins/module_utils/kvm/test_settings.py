"""The kvm section: its settings, their defaults, every bad field, and the host URIs refused."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.config import config_errors, parse_provider_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import (
    IDENTIFIER_RULE,
    KvmHost,
    libvirt_uri_problem,
)
from support.collection.config_documents import (
    DELETE,
    KVM,
    SHA_A,
    assert_bad_field,
    changed,
    config_error,
    paths,
    valid_document,
)

# Why host names and image keys are restricted: the message must say it, so an operator
# renaming a host knows what the name is used for.
HOST_CONSEQUENCE = "providerIDs"
IMAGE_CONSEQUENCE = "base-<key>.<format>"


def renamed_image_key(new_key: str) -> dict[str, Any]:
    document = valid_document()
    images = document["providers"][0]["kvm"]["images"]
    images[new_key] = images.pop("alpine_3.20")
    return document


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
    assert kvm.domain_cache_seconds == 600
    assert kvm.vendor_data is None
    assert kvm.ssh is None  # no SSH URI, so no SSH section needed
    assert kvm.machine_types["tiny"].machine is None


BAD_FIELDS = [
    pytest.param(changed(((*KVM, "hosts", 1, "domaintype"), "qemu")),
                 "providers[0].kvm.hosts[1].domaintype: unknown field", id="kvm-host-typo"),
    pytest.param(changed(((*KVM, "hosts", 0, "state"), "maintenance")),
                 "providers[0].kvm.hosts[0].state: 'maintenance' is not one of active, cordoned, draining",
                 id="bad-host-state"),
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
    pytest.param(changed(((*KVM, "domainCacheSeconds"), -1)),
                 "providers[0].kvm.domainCacheSeconds: must be an integer >= 0, got -1", id="domain-cache-negative"),
    pytest.param(changed(((*KVM, "domainCacheSeconds"), "10m")),
                 "providers[0].kvm.domainCacheSeconds: must be an integer >= 0, got '10m'",
                 id="domain-cache-not-a-number"),
]


@pytest.mark.parametrize(("document", "expected"), BAD_FIELDS)
def test_a_bad_field_is_reported_with_its_path(document: dict[str, Any], expected: str) -> None:
    assert_bad_field(document, expected)


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


def test_a_bad_host_does_not_hide_the_next_ones() -> None:
    document = changed(((*KVM, "hosts", 0), "beelink"), ((*KVM, "hosts", 1, "uri"), "qemu+tcp://nuc/system"))
    assert paths(config_errors(document)) == ["providers[0].kvm.hosts[0]", "providers[0].kvm.hosts[1].uri"]


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


def test_a_publish_range_below_1024_keeps_proxies_off_that_host_naming_the_field() -> None:
    # Issue 38 row 6: a range below 1024 publishes guests on the host's own services (sshd on 22).
    document = changed(((*KVM, "hosts", 0, "networkMode"), "nat"), ((*KVM, "hosts", 0, "publicAddress"), "10.1.2.3"),
                       ((*KVM, "hosts", 0, "publishPorts"), "20-30"))
    settings = parse_provider_config(document).providers[0].kvm
    assert settings is not None
    (error,) = settings.hosts[0].networking_errors
    assert error.startswith("providers[0].kvm.hosts[0].publishPorts: '20-30' is not a port range first-last within "
                            "1024-65535"), error
    assert settings.hosts[1].networking_errors == ()


def test_host_states_keep_new_proxies_off_and_are_reported_by_name() -> None:
    draining = changed(((*KVM, "hosts", 0, "state"), "draining"))
    settings = parse_provider_config(draining).providers[0].kvm
    assert settings is not None
    assert [host.takes_new_proxies for host in settings.hosts] == [False, True]
    assert settings.location_states == {settings.hosts[0].name: "draining"}
    assert config_errors(draining) == []  # a state is no error: the file stays valid
    cordoned = parse_provider_config(changed(((*KVM, "hosts", 1, "state"), "cordoned"))).providers[0].kvm
    assert cordoned is not None and cordoned.location_states == {cordoned.hosts[1].name: "cordoned"}
    default = parse_provider_config(valid_document()).providers[0].kvm
    assert default is not None and default.location_states == {}
    assert all(host.takes_new_proxies for host in default.hosts)


def test_draining_every_host_is_a_location_error_and_moves_nothing() -> None:
    # Nowhere to move to: each replacement would fail, and its Proxy with it, while the old serve.
    document = changed(((*KVM, "hosts", 0, "state"), "draining"), ((*KVM, "hosts", 1, "state"), "cordoned"))
    report = parse_provider_config(document)
    settings = report.providers[0].kvm
    assert settings is not None and report.providers[0].valid  # the provider stays usable
    assert settings.location_states == {settings.hosts[0].name: "cordoned", settings.hosts[1].name: "cordoned"}
    (error,) = report.providers[0].location_errors
    assert error.startswith("providers[0].kvm.hosts[0].state: draining needs another host that takes new proxies")
