"""squid_access.py without Ansible and without squid: validation (every message names its field
path), the rendered rules' order, the password file, the install script and boothook, and how
the access policy joins KVM vendor-data and the Kubernetes Pod.

The rules' *effect* is measured through real squid in tests/integration/test_squid_access.py;
this file pins what can be told from the text alone (squid acts on the first matching
``http_access`` line, so order is behaviour).
"""

from __future__ import annotations

import email
import subprocess
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import build_vendor_data
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.guest_agent_script import GUEST_AGENT_SCRIPT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    DEFAULT_SQUID_CONFIG,
    PASSWD_ANNOTATION,
    SQUID_CONF_ANNOTATION,
    build_pod,
    squid_conf,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DROPIN_PATH,
    GATE_PATH,
    PASSWORD_FILE,
    Access,
    AccessUser,
    boothook,
    install_script,
    parse_access,
    refuse_open_user_config,
    render_password_file,
    render_rules,
)

BCRYPT = "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"
SHA512 = "$6$saltsalt$" + "A" * 86
SHA512_ROUNDS = "$6$rounds=5000$saltsalt$" + "b" * 86
USERS = [{"name": "crawlers", "password_hash": BCRYPT}]


def http_access(rules: str) -> list[str]:
    return [line.split(None, 1)[1] for line in rules.splitlines() if line.startswith("http_access ")]


class TestParse:
    def test_absent_is_none(self) -> None:
        assert parse_access(None) is None

    def test_users_and_sources(self) -> None:
        access = parse_access({"users": [*USERS, {"name": "legacy.v1", "password_hash": SHA512_ROUNDS}],
                               "allowed_sources": ["10.0.0.0/8", "FD00::/8"], "open": False})
        assert access == Access(users=(AccessUser("crawlers", BCRYPT), AccessUser("legacy.v1", SHA512_ROUNDS)),
                                allowed_sources=("10.0.0.0/8", "fd00::/8"), open=False)

    def test_users_without_sources_take_any_source(self) -> None:
        access = parse_access({"users": USERS})
        assert access is not None and access.allowed_sources == ()
        assert "acl egress_sources src all" in render_rules(access)

    def test_everyone_only_when_written(self) -> None:
        access = parse_access({"open": True, "allowed_sources": ["0.0.0.0/0", "::/0"]})
        assert access is not None and access.allowed_sources == ("0.0.0.0/0", "::/0")

    @pytest.mark.parametrize(("value", "message"), [
        ("users", "access: must be a dict"),
        ({"users": USERS, "password": "x"}, "access.password: unknown field"),
        ({"users": USERS, "open": "yes"}, "access.open: must be true or false"),
        ({}, "access.users: at least one user is required unless access.open is true"),
        ({"open": True}, "access.allowed_sources: required when access.users is empty"),
        ({"open": True, "users": USERS, "allowed_sources": ["10.0.0.0/8"]},
         "access.users: must be empty when access.open is true"),
        ({"users": {"name": "a"}}, "access.users: must be a list"),
        ({"users": ["crawlers"]}, "access.users[0]: must be a dict"),
        ({"users": [{"name": "a:b", "password_hash": BCRYPT}]}, "access.users[0].name: 'a:b' is not a user name"),
        ({"users": [{"name": "", "password_hash": BCRYPT}]}, "access.users[0].name: '' is not a user name"),
        ({"users": [*USERS, *USERS]}, "access.users[1].name: 'crawlers' is listed twice"),
        ({"users": [{"name": "a", "password_hash": "correct horse battery staple"}]},
         "access.users[0].password_hash: is not a bcrypt ($2b$) or SHA-512-crypt ($6$) hash"),
        ({"users": [{"name": "a", "password_hash": "$1$saltsalt$abcdefghijklmnopqrstuv"}]},
         "access.users[0].password_hash: is not a bcrypt"),
        ({"users": [{"name": "a", "password_hash": BCRYPT + "\nhttp_access allow all"}]},
         "access.users[0].password_hash: is not a bcrypt"),
        ({"users": USERS, "allowed_sources": "10.0.0.0/8"}, "access.allowed_sources: must be a list"),
        ({"users": USERS, "allowed_sources": ["10.0.0.0/8", "10.0.0.1/8"]},
         "access.allowed_sources[1]: '10.0.0.1/8' is not a CIDR"),
        ({"users": USERS, "allowed_sources": ["all"]}, "access.allowed_sources[0]: 'all' is not a CIDR"),
    ])
    def test_bad_input_names_the_field(self, value: Any, message: str) -> None:
        with pytest.raises(Permanent) as caught:
            parse_access(value)
        assert str(caught.value).startswith(message), str(caught.value)

    def test_a_password_in_place_of_a_hash_is_never_repeated(self) -> None:
        with pytest.raises(Permanent) as caught:
            parse_access({"users": [{"name": "a", "password_hash": "s3cret-Passw0rd"}]})
        assert "s3cret-Passw0rd" not in str(caught.value)

    def test_the_field_prefix_is_the_callers(self) -> None:
        with pytest.raises(Permanent, match=r"^spec\.access\.users: at least one"):
            parse_access({}, "spec.access")


class TestRules:
    def test_order_destinations_then_sources_then_credentials_then_deny_all(self) -> None:
        access = parse_access({"users": USERS, "allowed_sources": ["10.0.0.0/8"]})
        assert access is not None
        rules = render_rules(access, "/run/passwd")
        assert http_access(rules) == [
            "deny !egress_safe_ports", "deny egress_connect !egress_ssl_ports", "deny manager", "deny to_localhost",
            "deny egress_loopback", "deny egress_link_local", "deny !egress_sources", "allow egress_users",
            "deny all"]
        assert "auth_param basic program /usr/lib/squid/basic_ncsa_auth /run/passwd\n" in rules
        assert "acl egress_users proxy_auth REQUIRED\n" in rules
        assert "acl egress_sources src 10.0.0.0/8\n" in rules
        assert "acl egress_link_local dst 169.254.0.0/16 fe80::/10 fd00:ec2::254/128\n" in rules
        for line in ("via off", "forwarded_for delete", "request_header_access X-Forwarded-For deny all"):
            assert line + "\n" in rules
        assert render_rules(access).count(PASSWORD_FILE) == 1

    def test_open_policy_allows_its_sources_without_credentials(self) -> None:
        access = parse_access({"open": True, "allowed_sources": ["192.168.0.0/16"]})
        assert access is not None
        rules = render_rules(access)
        assert "auth_param" not in rules and "proxy_auth" not in rules
        assert http_access(rules)[-3:] == ["deny !egress_sources", "allow egress_sources", "deny all"]

    def test_password_file(self) -> None:
        access = parse_access({"users": [*USERS, {"name": "b", "password_hash": SHA512}]})
        assert access is not None
        assert render_password_file(access) == f"crawlers:{BCRYPT}\nb:{SHA512}\n"


class TestUserConfig:
    @pytest.mark.parametrize("text", ["http_access allow all\n", "acl a src all\n  http_access   allow all # yes\n"])
    def test_allow_all_is_refused_naming_the_field(self, text: str) -> None:
        with pytest.raises(Permanent, match=r"^squidConfig: contains 'http_access allow all'"):
            refuse_open_user_config(text, "squidConfig")

    @pytest.mark.parametrize("text", [None, "", DEFAULT_SQUID_CONFIG, "# http_access allow all\n",
                                      "http_access allow all_staff\n", "http_access allow localnet all\n"])
    def test_anything_else_passes(self, text: str | None) -> None:
        refuse_open_user_config(text, "squidConfig")


class TestScript:
    def access(self) -> Access:
        access = parse_access({"users": USERS, "allowed_sources": ["10.0.0.0/8"]})
        assert access is not None
        return access

    def test_posix_sh_and_carries_both_files_verbatim(self) -> None:
        script = install_script(self.access())
        assert script.startswith(b"#!/bin/sh\n")
        subprocess.run(["sh", "-n"], input=script, check=True)
        text = script.decode()
        assert f"<<'EGRESS_PROXIES_EOF'\n{render_password_file(self.access())}EGRESS_PROXIES_EOF\n" in text
        assert f"<<'EGRESS_PROXIES_EOF'\n{render_rules(self.access())}EGRESS_PROXIES_EOF\n" in text
        assert f"write {PASSWORD_FILE} 0640 " in text and f"write {DROPIN_PATH} 0644 " in text

    def test_boothook_is_the_gated_script_behind_the_boothook_line(self) -> None:
        assert boothook(self.access()) == b"#cloud-boothook\n" + install_script(self.access(), boot_gate=True)

    def test_the_boot_gate_denies_everything_ahead_of_the_rules_until_cloud_final(self) -> None:
        text = install_script(self.access(), boot_gate=True).decode()
        # squid reads conf.d/*.conf in name order: the gate's deny all comes before our rules.
        assert sorted([GATE_PATH, DROPIN_PATH]) == [GATE_PATH, DROPIN_PATH]
        assert text.index(f"write {GATE_PATH} 0644") < text.index(f"write {DROPIN_PATH} 0644")
        gate = text.split(f"write {GATE_PATH} 0644 <<'EGRESS_PROXIES_EOF'\n", 1)[1].split("EGRESS_PROXIES_EOF", 1)[0]
        assert [line for line in gate.splitlines() if not line.startswith("#")] == ["http_access deny all"]
        # Opened by a unit queued without waiting, ordered after cloud-init's last stage.
        assert "systemd-run --no-block" in text and "--property=After=cloud-final.service" in text
        assert f"rm -f {GATE_PATH} && systemctl try-reload-or-restart squid" in text
        # No gate without the means to open it; none at all for GCP's startup script.
        assert "else\n    rm -f " + GATE_PATH in text
        assert GATE_PATH not in install_script(self.access()).decode()

    def test_open_policy_writes_no_password_file(self) -> None:
        access = parse_access({"open": True, "allowed_sources": ["10.0.0.0/8"]})
        assert access is not None
        assert PASSWORD_FILE not in install_script(access).decode()


class TestVendorData:
    """How the boothook joins KVM vendor-data; the user's document is not involved at all."""

    def access(self) -> bytes:
        access = parse_access({"users": USERS})
        assert access is not None
        return boothook(access)

    def parts(self, vendor_data: bytes | None) -> list[tuple[str, str | None, Any]]:
        assert vendor_data is not None and vendor_data.startswith(b"MIME-Version: 1.0\n")
        return [(part.get_content_type(), part.get_filename(), part.get_payload(decode=True))
                for part in email.message_from_bytes(vendor_data).walk() if not part.is_multipart()]

    def test_without_access_nothing_changes(self) -> None:
        assert build_vendor_data(None, True, None) == GUEST_AGENT_SCRIPT
        assert build_vendor_data(None, False, None) is None

    def test_access_alone_is_the_boothook(self) -> None:
        assert build_vendor_data(None, False, self.access()) == self.access()

    def test_agent_and_access(self) -> None:
        assert self.parts(build_vendor_data("", True, self.access())) == [
            ("text/x-shellscript", "install-qemu-guest-agent.sh", GUEST_AGENT_SCRIPT),
            ("text/cloud-boothook", "egress-proxies-access.sh", self.access())]

    def test_operator_agent_and_access(self) -> None:
        operator = "#cloud-config\nruncmd: [[touch, /run/x]]\n"
        assert self.parts(build_vendor_data(operator, True, self.access())) == [
            ("text/cloud-config", None, operator.encode()),
            ("text/x-shellscript", "install-qemu-guest-agent.sh", GUEST_AGENT_SCRIPT),
            ("text/cloud-boothook", "egress-proxies-access.sh", self.access())]


class TestPod:
    SETTINGS = KubernetesSettings(namespace="egress", image="squid")

    def request(self, **access: Any) -> InstanceRequest:
        return InstanceRequest(name="eu-1", user_data=b"", tags={"crawl.example.com/owner": "o"}, port=3130,
                               access=parse_access(access) if access else None)

    def test_without_access_the_pod_is_as_before(self) -> None:
        pod = build_pod(self.SETTINGS, self.request(), "egress")
        assert PASSWD_ANNOTATION not in pod["metadata"]["annotations"]
        assert pod["metadata"]["annotations"][SQUID_CONF_ANNOTATION] == "http_port 3130\n" + DEFAULT_SQUID_CONFIG
        assert len(pod["spec"]["volumes"][0]["downwardAPI"]["items"]) == 1

    def test_rules_come_first_and_the_hashes_are_projected(self) -> None:
        pod = build_pod(self.SETTINGS, self.request(users=USERS), "egress")
        access = parse_access({"users": USERS})
        assert access is not None
        annotations = pod["metadata"]["annotations"]
        assert annotations[SQUID_CONF_ANNOTATION] == (
            "http_port 3130\n" + render_rules(access, "/etc/egress-proxy/passwd") + DEFAULT_SQUID_CONFIG)
        assert annotations[PASSWD_ANNOTATION] == f"crawlers:{BCRYPT}\n"
        assert pod["spec"]["volumes"][0]["downwardAPI"]["items"][1] == {
            "path": "passwd", "mode": 0o444,
            "fieldRef": {"fieldPath": f"metadata.annotations['{PASSWD_ANNOTATION}']"}}

    def test_open_policy_projects_no_password_file(self) -> None:
        pod = build_pod(self.SETTINGS, self.request(open=True, allowed_sources=["10.0.0.0/8"]), "egress")
        assert PASSWD_ANNOTATION not in pod["metadata"]["annotations"]

    def test_a_squid_config_allowing_all_is_refused_only_with_access(self) -> None:
        settings = KubernetesSettings(namespace="egress", image="squid", squid_config="http_access allow all\n")
        assert squid_conf(settings, 3128).endswith("http_access allow all\n")  # no access: as before
        with pytest.raises(Permanent, match=r"^squidConfig \(the Kubernetes provider's config\): contains"):
            build_pod(settings, self.request(users=USERS), "egress")
