"""squid_access.py without Ansible and without squid: validation (every message names its field
path) and what the policy says, line by line: squid acts on the first matching ``http_access``
line and keeps the last value of a single-valued directive, so order is behaviour.

The policy's *effect* is measured through real squid in tests/integration/test_squid_access.py;
the networks' arithmetic is tests/unit/plugins/module_utils/test_squid_networks.py's, how the
policy gets onto instances test_squid_install.py's and k8s/test_pods.py's.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import DEFAULT_SQUID_CONFIG
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    POLICY_VERSION,
    Access,
    AccessUser,
    PolicyPaths,
    parse_access,
    refuse_open_user_config,
    render_password_file,
    render_policy,
)

BCRYPT = "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"
SHA512 = "$6$saltsalt$" + "A" * 86
SHA512_ROUNDS = "$6$rounds=5000$saltsalt$" + "b" * 86
USERS = [{"name": "crawlers", "password_hash": BCRYPT}]
PATHS = PolicyPaths(password_file="/p/passwd", own_addresses="/p/own", error_directory="/p/errors")


def access_of(**value: Any) -> Access:
    access = parse_access(value)
    assert access is not None
    return access


def head(access: Access) -> str:
    return render_policy(access, PATHS).head


def tail(access: Access) -> str:
    return render_policy(access, PATHS).tail


def directives(text: str, name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(name + " ")]


class TestParse:
    def test_absent_is_none(self) -> None:
        assert parse_access(None) is None

    def test_users_and_sources(self) -> None:
        access = parse_access({"users": [*USERS, {"name": "legacy.v1", "password_hash": SHA512_ROUNDS}],
                               "allowed_sources": ["10.0.0.0/8", "FD00::/8"], "open": False})
        assert access == Access(users=(AccessUser("crawlers", BCRYPT), AccessUser("legacy.v1", SHA512_ROUNDS)),
                                allowed_sources=("10.0.0.0/8", "fd00::/8"), open=False)

    def test_destinations_opened_on_purpose(self) -> None:
        access = parse_access({"users": USERS, "allowed_destinations": ["192.168.122.1/32", "FD00:1::/64"]})
        assert access is not None and access.allowed_destinations == ("192.168.122.1/32", "fd00:1::/64")

    def test_users_without_sources_take_any_source(self) -> None:
        access = parse_access({"users": USERS})
        assert access is not None and access.allowed_sources == ()
        assert "egress_foreign" not in head(access)

    def test_everyone_only_when_written(self) -> None:
        access = parse_access({"open": True, "allowed_sources": ["0.0.0.0/0", "::/0"]})
        assert access is not None and access.allowed_sources == ("0.0.0.0/0", "::/0")

    @pytest.mark.parametrize(("value", "message"), [
        ("users", "access: must be a dict with users, allowed_sources, allowed_destinations, open"),
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
        ({"users": USERS, "allowed_destinations": "10.0.0.0/8"}, "access.allowed_destinations: must be a list"),
        ({"users": USERS, "allowed_destinations": ["192.168.122.0/33"]},
         "access.allowed_destinations[0]: '192.168.122.0/33' is not a CIDR"),
        ({"users": USERS, "allowed_destinations": ["10.0.0.0/8", "10.0.0.1/8"]},
         "access.allowed_destinations[1]: '10.0.0.1/8' is not a CIDR"),
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


class TestPolicy:
    def test_rules_refuse_ports_then_sources_then_credentials_then_destinations(self) -> None:
        rules = directives(head(access_of(users=USERS, allowed_sources=["10.0.0.0/8"])), "http_access")
        assert rules == [
            "deny egress_refused_ports", "deny egress_connect egress_connect_refused_ports", "deny manager",
            "deny egress_foreign", "deny !egress_users", "deny egress_never", "deny egress_internal",
            "allow egress_users", "deny all"]

    def test_an_open_policy_asks_for_no_credentials(self) -> None:
        policy = render_policy(access_of(open=True, allowed_sources=["192.168.0.0/16"]), PATHS)
        assert "auth_param" not in policy.head + policy.tail and "proxy_auth" not in policy.head
        assert directives(policy.head, "http_access")[-4:] == [
            "deny egress_foreign", "deny egress_never", "deny egress_internal", "allow all"]

    def test_every_acl_a_rule_refuses_with_lists_what_it_refuses(self) -> None:
        """squid appends a later acl line of the same name: a list of what is refused only grows.
        The one negated ACL is proxy_auth REQUIRED, which a later line cannot widen either."""
        text = head(access_of(users=USERS, allowed_sources=["10.0.0.0/8"], allowed_destinations=["10.1.0.0/16"]))
        for rule in directives(text, "http_access") + directives(text, "adapted_http_access"):
            action, *acls = rule.split()
            assert action == "deny" or acls in (["egress_users"], ["all"]), rule
            assert [acl for acl in acls if acl.startswith("!")] in ([], ["!egress_users"]), rule
        assert "acl egress_users proxy_auth REQUIRED" in text

    def test_the_destinations_are_refused_after_an_adaptation_too(self) -> None:
        assert directives(head(access_of(users=USERS)), "adapted_http_access") == [
            "deny egress_never", "deny egress_internal"]

    def test_everything_opened_leaves_no_internal_acl(self) -> None:
        text = head(access_of(users=USERS, allowed_destinations=["0.0.0.0/0", "::/0"]))
        assert "egress_internal" not in text and "http_access deny egress_never" in text

    def test_the_own_addresses_come_from_the_instance(self) -> None:
        assert 'acl egress_never dst "/p/own"\n' in head(access_of(users=USERS))

    def test_the_host_addresses_are_refused_whatever_is_opened(self) -> None:
        """Issue 38 row 1: the machine the proxy runs on (its provider knows its addresses) is
        refused like the instance's own addresses, in an ACL of its own, NAT64 forms included."""
        access = access_of(users=USERS, allowed_destinations=["0.0.0.0/0", "::/0"])
        text = render_policy(access, PATHS, ("203.0.113.10", "203.0.113.21", "2001:db8::1", "203.0.113.10")).head
        assert [acl for acl in directives(text, "acl") if acl.startswith("egress_host ")] == [
            ("egress_host dst 203.0.113.10/32 203.0.113.21/32 64:ff9b::cb00:710a/128 64:ff9b::cb00:7115/128 "
             "2001:db8::1/128")]
        assert directives(text, "http_access")[-4:] == [
            "deny egress_never", "deny egress_host", "allow egress_users", "deny all"]
        assert directives(text, "adapted_http_access") == ["deny egress_never", "deny egress_host"]

    def test_without_host_addresses_there_is_no_host_acl(self) -> None:
        assert "egress_host" not in head(access_of(users=USERS))

    def test_a_host_address_that_is_no_address_is_refused_naming_the_parameter(self) -> None:
        with pytest.raises(Permanent, match=r"refused_host_addresses\[1\]: 'beelink' is not an IP address"):
            render_policy(access_of(users=USERS), PATHS, ("203.0.113.10", "beelink"))

    def test_first_match_lists_are_in_the_head_and_single_values_in_the_tail(self) -> None:
        access = access_of(users=USERS)
        first = head(access)
        for line in ("auth_schemes basic all", "cachemgr_passwd disable all", "follow_x_forwarded_for deny all",
                     "request_header_access X-Forwarded-For deny all",
                     "request_header_access Cache-Control deny !egress_client_cache_control",
                     "reply_header_access Server deny egress_squid_server", "reply_header_access X-Cache deny all"):
            assert line + "\n" in first
        last = tail(access)
        for line in ("httpd_suppress_version_string on", "error_directory /p/errors", "via off",
                     "visible_hostname proxy", "ftp_user anonymous@", "ftp_sanitycheck on",
                     'url_rewrite_extras "%>a %un %>rm myip=%la myport=%lp"', "debug_options ALL,1 29,0 55,0"):
            assert line + "\n" in last
        assert "%>A" not in first + last  # a reverse DNS lookup of every client

    def test_the_authenticator_is_set_before_its_acl_and_again_last(self) -> None:
        auth = ["basic program /usr/lib/squid/basic_ncsa_auth /p/passwd", "basic children 5 startup=1 idle=1",
                "basic realm proxy", "basic credentialsttl 1 hour"]
        access = access_of(users=USERS)
        assert directives(head(access), "auth_param") == auth == directives(tail(access), "auth_param")
        text = head(access)
        assert text.index("auth_param basic program") < text.index("proxy_auth REQUIRED")

    def test_around_puts_the_middle_between_head_and_tail(self) -> None:
        policy = render_policy(access_of(users=USERS), PATHS)
        assert policy.around("include /etc/squid/squid.conf") == (
            policy.head + "include /etc/squid/squid.conf\n" + policy.tail)

    def test_the_version_and_the_reason_are_in_the_first_line(self) -> None:
        assert head(access_of(users=USERS)).startswith(
            f"# crawl.egress_proxies access policy, version {POLICY_VERSION} ")

    def test_lines_stay_readable(self) -> None:
        text = head(access_of(users=USERS, allowed_sources=["10.0.0.0/8", "fd00::/8"]))
        assert max(len(line) for line in text.splitlines() if line.startswith("#")) <= 100
        assert max(len(re.split(r"\s+", line)) for line in text.splitlines() if line.startswith("acl ")) <= 11

    def test_password_file(self) -> None:
        access = access_of(users=[*USERS, {"name": "b", "password_hash": SHA512}])
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
