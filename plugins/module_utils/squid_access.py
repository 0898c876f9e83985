# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may use a proxy, and where it may go: the ``access`` module option, rendered as squid
configuration (docs/architecture.md, "Security model").

The policy is two pieces of squid.conf around the distribution's and the user's configuration,
``head + <theirs> + tail`` (:meth:`Policy.around`), because squid decides by order:

- the **head** comes first, and squid takes the first ``http_access`` line that matches: the
  cache manager, then client sources (403), then credentials (407), then ports and destinations
  (403), then ``allow``, then ``deny all``, so no ``http_access`` line of anyone else's ever decides a
  request. A request refused for its source or credentials is refused before any destination
  ACL, so it costs no DNS lookup. Every ACL a rule refuses with lists what is *refused*
  (squid_networks.py), so a user's ``acl`` line of the same name, which squid appends, can only
  refuse more. First-match lists (``cachemgr_passwd``, ``follow_x_forwarded_for``,
  ``request_header_access``, ``reply_header_access``) are in the head for the same reason.
- the **tail** comes last, and squid keeps the last value of a single-valued directive: the
  authenticator (a later ``auth_param basic program`` would replace it), the error pages and
  every setting that keeps the proxy from naming itself or logging a credential.

On KVM and GCP the two pieces are the instance's squid.conf, which includes Debian's
``/etc/squid/squid.conf`` between them (squid_install.py writes it and points squid.service at
it); on Kubernetes the Pod's squid.conf has them around the provider's ``squidConfig``
(k8s/pods.py). Importable without Ansible: the standard library and the collection's modules only.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import textwrap
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils import squid_networks as nets
from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent

# What an instance's policy is built from besides the Access itself: a new version changes what
# every instance gets, so the controller makes it part of each instance's build hash
# (``provider_config_info`` returns it) and replaces instances built with an older one.
POLICY_VERSION = "4"
BASIC_NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"
# The realm a client sees in a 407; neutral, so it names neither the software nor the fleet.
REALM = "proxy"
VISIBLE_HOSTNAME = "proxy"
# The ports Debian's stock squid.conf allows, as the ports it refuses (squid_networks: a list of
# what is refused only grows by a later acl line); CONNECT only to 443 (no SMTP through a tunnel).
REFUSED_PORTS = ("0-20", "22-69", "71-79", "81-209", "211-279", "281-442", "444-487", "489-590", "592-776",
                 "778-1024")
CONNECT_REFUSED_PORTS = ("0-442", "444-65535")
# Without %>A: squid 5.7's defaults of these two name %>A (the client's host name), which turns on
# a reverse DNS lookup of every client at connection time, strangers included.
HELPER_EXTRAS = '"%>a %un %>rm myip=%la myport=%lp"'
# Cache-Control with max-age or no-cache is the client's own: squid adds max-age (its
# refresh_pattern maximum, 259200 s on Debian) only to a request without either.
_CLIENT_CACHE_CONTROL = r"-i (^|[,[:space:]])(max-age|no-cache)([=,[:space:]]|$)"

# A user name travels in a Basic credential ("name:password") and in the password file
# ("name:hash"): no colon, no whitespace; this set is also safe in a shell here-document.
_USER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The two crypt(3) formats basic_ncsa_auth checks on Debian 12 (libxcrypt); both are
# ASCII from crypt's own alphabet, so no hash can break a line or a here-document.
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_SHA512_CRYPT_RE = re.compile(r"^\$6\$(rounds=[0-9]{1,9}\$)?[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{86}$")
# An unconditional allow in a user's squid configuration: an open proxy.
_ALLOW_ALL_RE = re.compile(r"^[ \t]*http_access[ \t]+allow[ \t]+all[ \t]*(#.*)?$", re.MULTILINE)
_FIELDS = ("users", "allowed_sources", "allowed_destinations", "open")


@dataclass(frozen=True)
class AccessUser:
    name: str
    password_hash: str


@dataclass(frozen=True)
class Access:
    """A validated ``access`` option (see :func:`parse_access`)."""

    users: Tuple[AccessUser, ...] = ()
    allowed_sources: Tuple[str, ...] = ()
    open: bool = False
    # Internal networks the proxy may reach on purpose; never metadata, loopback or its own.
    allowed_destinations: Tuple[str, ...] = ()


def admitting_probes(access: Optional[Access], probe_sources: Sequence[str]) -> Optional[Access]:
    """``access`` with the config's ``probeSources`` among its allowed sources, so the proxy lets the
    controller's probe in the way a crawler's request comes (squid's source check, and what a
    provider opens from the same list: a firewall rule, a load balancer's ranges). A policy
    without sources (any source) stays as it is: adding some would shut the crawlers out."""
    if access is None or not access.allowed_sources or not probe_sources:
        return access
    added = tuple(source for source in dict.fromkeys(probe_sources) if source not in access.allowed_sources)
    return dataclasses.replace(access, allowed_sources=access.allowed_sources + added)


def parse_access(value: Optional[Mapping[str, Any]], field: str = "access") -> Optional[Access]:
    """The ``access`` option validated; None when absent (no policy).

    Every failure is ``Permanent`` and names the field path (``access.users[1].password_hash``).
    A password is never accepted, nor repeated in a message: only its hash.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise Permanent("%s: must be a dict with %s" % (field, ", ".join(_FIELDS)))
    unknown = sorted(str(key) for key in value if key not in _FIELDS)
    if unknown:
        raise Permanent("%s.%s: unknown field; allowed are %s" % (field, unknown[0], ", ".join(_FIELDS)))
    is_open = value.get("open") or False
    if not isinstance(is_open, bool):
        raise Permanent("%s.open: must be true or false" % field)
    users = _parse_users(value.get("users") or [], "%s.users" % field)
    sources = parse_networks(value.get("allowed_sources") or [], "%s.allowed_sources" % field)
    destinations = parse_networks(value.get("allowed_destinations") or [], "%s.allowed_destinations" % field)
    if is_open and users:
        raise Permanent("%s.users: must be empty when %s.open is true (an open proxy asks for no credentials); "
                        "remove the users or set open to false" % (field, field))
    if not is_open and not users:
        raise Permanent("%s.users: at least one user is required unless %s.open is true" % (field, field))
    if not users and not sources:
        raise Permanent("%s.allowed_sources: required when %s.users is empty (open: true); list the client "
                        "networks, or 0.0.0.0/0 and ::/0 to serve anyone" % (field, field))
    return Access(users=users, allowed_sources=sources, open=is_open, allowed_destinations=destinations)


def _parse_users(value: Any, field: str) -> Tuple[AccessUser, ...]:
    if not isinstance(value, list):
        raise Permanent("%s: must be a list of {name, password_hash}" % field)
    users: List[AccessUser] = []
    seen = set()
    for index, item in enumerate(value):
        at = "%s[%d]" % (field, index)
        if not isinstance(item, Mapping):
            raise Permanent("%s: must be a dict with name and password_hash" % at)
        name, password_hash = item.get("name"), item.get("password_hash")
        if not isinstance(name, str) or not _USER_NAME_RE.fullmatch(name):
            raise Permanent("%s.name: %r is not a user name: use 1-64 letters, digits, '.', '_' or '-', starting "
                            "with a letter or digit" % (at, name))
        if name in seen:
            raise Permanent("%s.name: %r is listed twice" % (at, name))
        seen.add(name)
        if not isinstance(password_hash, str) or not (
                _BCRYPT_RE.fullmatch(password_hash) or _SHA512_CRYPT_RE.fullmatch(password_hash)):
            # The value is not echoed: it might be a password pasted in by mistake.
            raise Permanent("%s.password_hash: is not a bcrypt ($2b$) or SHA-512-crypt ($6$) hash; pass the hash "
                            "of the password, never the password" % at)
        users.append(AccessUser(name, password_hash))
    return tuple(users)


def parse_networks(value: Any, field: str) -> Tuple[str, ...]:
    """A list of CIDRs (host bits clear), each normalised; the first bad one fails naming its index."""
    if not isinstance(value, list):
        raise Permanent("%s: must be a list of CIDRs" % field)
    parsed: List[str] = []
    for index, item in enumerate(value):
        try:
            network = ipaddress.ip_network(item if isinstance(item, str) else "", strict=True)
        except ValueError as error:
            raise Permanent("%s[%d]: %r is not a CIDR such as 10.0.0.0/8 or fd00::/8 (%s)" % (
                field, index, item, error)) from None
        parsed.append(str(network))
    return tuple(parsed)


@dataclass(frozen=True)
class PolicyPaths:
    """Where the instance keeps the files the policy names (they differ per provider)."""

    password_file: str
    own_addresses: str
    error_directory: str


@dataclass(frozen=True)
class Policy:
    head: str
    tail: str

    def around(self, middle: str) -> str:
        """``middle`` (the distribution's or the user's configuration) between head and tail."""
        if middle and not middle.endswith("\n"):
            middle += "\n"
        return self.head + middle + self.tail


def render_policy(access: Access, paths: PolicyPaths, refused_host_addresses: Sequence[str] = ()) -> Policy:
    """The policy of ``access``; ``refused_host_addresses`` are the addresses of the machine the
    proxy runs on as its provider knows them (a KVM hypervisor's public, source and bridge
    addresses; a node's; a GCP instance's external one): refused whatever is opened, like the
    instance's own addresses, because they reach that machine's services (issue 38)."""
    return Policy(_head(access, paths, _host_networks(refused_host_addresses)), _tail(access, paths))


def _host_networks(addresses: Sequence[str]) -> List[nets.Network]:
    for index, address in enumerate(addresses):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise Permanent("refused_host_addresses[%d]: %r is not an IP address; the provider passes the host's "
                            "addresses (publicAddress, sourceAddresses, ...) only" % (index, address)) from None
    return nets.host_networks(addresses)


def _auth_lines(access: Access, password_file: str) -> List[str]:
    if not access.users:
        return []
    return ["auth_param basic program %s %s" % (BASIC_NCSA_AUTH, password_file),
            "auth_param basic children 5 startup=1 idle=1",
            "auth_param basic realm %s" % REALM,
            # A cached credential is checked again this often; a rotated password file is read
            # again on reconfigure anyway.
            "auth_param basic credentialsttl 1 hour"]


def _opened(access: Access) -> List[nets.Network]:
    return [ipaddress.ip_network(d) for d in access.allowed_destinations]


def _acls(access: Access, paths: PolicyPaths, hosts: Sequence[nets.Network]) -> List[str]:
    """Every ACL the head's rules use; each refusing one lists what it refuses."""
    allowed = [ipaddress.ip_network(s) for s in access.allowed_sources]
    opened = _opened(access)
    lines = [*nets.acl_lines("egress_refused_ports", "port", REFUSED_PORTS),
             *nets.acl_lines("egress_connect_refused_ports", "port", CONNECT_REFUSED_PORTS),
             "acl egress_connect method CONNECT"]
    if allowed:
        lines += _comment("Clients outside %s." % ", ".join(access.allowed_sources))
        lines += nets.acl_lines("egress_foreign", "src", nets.complement(allowed))
    if access.users:
        lines += ["acl egress_users proxy_auth REQUIRED"]
    lines += _comment("Never, whatever is opened: %s; cloud metadata: %s; and these IPv4 networks as NAT64 "
                      "addresses." % (_described(nets.LOOPBACK), _described(nets.METADATA)))
    lines += nets.acl_lines("egress_never", "dst", nets.never())
    lines += ["# This instance's own addresses, written where it runs.",
              'acl egress_never dst "%s"' % paths.own_addresses]
    if hosts:
        # An ACL of its own: squid ignores an entry that overlaps one already in the same ACL.
        lines += ["# The machine this proxy runs on (its provider knows these addresses), and their NAT64 forms."]
        lines += nets.acl_lines("egress_host", "dst", hosts)
    closed = nets.closed(opened)
    if closed:
        lines += _comment("Internal networks%s: %s; and these as NAT64 addresses." % (
            " but those opened by allowed_destinations (%s)" % ", ".join(access.allowed_destinations) if opened
            else "", _described(nets.INTERNAL)))
        lines += nets.acl_lines("egress_internal", "dst", closed)
    return [*lines, *_own_error_acl(access), "acl egress_squid_server rep_header Server ^squid(/|$)",
            "acl egress_client_cache_control req_header Cache-Control %s" % _CLIENT_CACHE_CONTROL]


def _described(table: Tuple[Tuple[str, str], ...]) -> str:
    return "; ".join("%s %s" % row for row in table)


def _comment(text: str) -> List[str]:
    return ["# " + line for line in textwrap.wrap(text, 96)]


def _http_access(access: Access, internal_closed: bool, host_refused: bool) -> List[str]:
    rules = ["http_access deny manager"]
    if access.allowed_sources:
        rules += ["http_access deny egress_foreign"]  # 403, before any credential is asked for
    if access.users:
        rules += ["http_access deny !egress_users"]  # 407: no, wrong or made-up credentials
    # Ports after credentials: a credential holder's refusal carries OWN_ERROR_HEADER, which needs
    # the credentials checked (a stranger gets the 407 first, whatever the port).
    rules += ["http_access deny egress_refused_ports",
              "http_access deny egress_connect egress_connect_refused_ports"]
    # Destinations last: their ACLs resolve the host name, so only a client that passed the
    # rules above ever costs a DNS lookup.
    refused = ["egress_never"] + (["egress_host"] if host_refused else []) + (
        ["egress_internal"] if internal_closed else [])
    rules += ["http_access deny %s" % acl for acl in refused]
    # Whoever passed every rule above; nothing after this line is ever reached.
    rules += ["http_access allow egress_users", "http_access deny all"] if access.users else ["http_access allow all"]
    # The same destinations after a url_rewrite_program or an adaptation changed the request.
    return rules + ["adapted_http_access deny %s" % acl for acl in refused]


def _head(access: Access, paths: PolicyPaths, hosts: Sequence[nets.Network]) -> str:
    lines = ["# crawl.egress_proxies access policy, version %s (docs/architecture.md, \"Security model\")." %
             POLICY_VERSION,
             "# Generated per instance. Squid takes the first http_access line that matches, and these end",
             "# in an allow and \"deny all\": no http_access line after them decides a request. Every ACL a",
             "# rule refuses with lists what it refuses: an acl line of that name later (squid appends)",
             "# refuses more."]
    lines += _auth_lines(access, paths.password_file)  # proxy_auth ACLs need the scheme first
    lines += _acls(access, paths, hosts)
    lines += _http_access(access, bool(nets.closed(_opened(access))), bool(hosts))
    if access.users:
        lines += ["auth_schemes basic all"]  # no scheme a later auth_param adds is ever offered
    lines += ["cachemgr_passwd disable all",  # the cache manager, from anywhere, localhost too
              "follow_x_forwarded_for deny all",  # the client is the TCP peer, never a header
              "request_header_access X-Forwarded-For deny all",
              "request_header_access Via deny all",
              "request_header_access Cache-Control deny !egress_client_cache_control",
              "reply_header_access Server deny egress_squid_server",
              "reply_header_access X-Squid-Error deny all",
              "reply_header_access X-Cache deny all",
              "reply_header_access X-Cache-Lookup deny all"]
    lines += _own_error_header(access)
    return "\n".join(lines) + "\n"


# Issue 41: a crawler must tell the proxy's own refusals (a destination the policy refuses, a site
# squid cannot reach) from the site's answers, or it reports its proxy as banned by the site. Squid
# names its error in this header, to credential holders only (strangers learn nothing of the
# fleet). squid_error matches only the errors squid made itself, never a site's answer; a site's
# header of the same name is removed (reply_header_add adds after reply_header_access removed).
OWN_ERROR_HEADER = "X-Egress-Proxies-Error"


def _own_error_acl(access: Access) -> List[str]:
    if not access.users:
        return []
    errors = [name for name in ERROR_TEMPLATES if name not in _PAGES_ONLY]
    return nets.acl_lines("egress_own_error", "squid_error", errors)


def _own_error_header(access: Access) -> List[str]:
    lines = ["reply_header_access %s deny all" % OWN_ERROR_HEADER]
    if access.users:
        # A source outside allowed_sources never gets it, whatever credentials it holds (squid's
        # credential cache can match egress_users after the 403 for its source).
        sources = " !egress_foreign" if access.allowed_sources else ""
        lines += ['reply_header_add %s "%%err_code" egress_users egress_own_error%s' % (OWN_ERROR_HEADER, sources)]
    return lines


def _tail(access: Access, paths: PolicyPaths) -> str:
    lines = ["# crawl.egress_proxies: the operator's settings, last, so nothing before them changes them."]
    lines += _auth_lines(access, paths.password_file)
    lines += ["visible_hostname %s" % VISIBLE_HOSTNAME,
              "httpd_suppress_version_string on",
              "error_directory %s" % paths.error_directory,
              "via off",
              "forwarded_for delete",
              "ftp_user anonymous@",
              "ftp_sanitycheck on",  # an FTP data connection goes to the server asked for only
              "url_rewrite_extras %s" % HELPER_EXTRAS,
              "store_id_extras %s" % HELPER_EXTRAS,
              "log_mime_hdrs off",
              "strip_query_terms on",
              # Sections 29 (authentication) and 55 (HTTP headers) log a client's Proxy-Authorization
              # or whole header block at level 1 (an unsupported scheme, bad characters, a NUL byte).
              "debug_options ALL,1 29,0 55,0"]
    return "\n".join(lines) + "\n"


def render_password_file(access: Access) -> str:
    """``name:hash`` lines, as ``basic_ncsa_auth`` reads them (empty for an open proxy)."""
    return "".join("%s:%s\n" % (user.name, user.password_hash) for user in access.users)


def refuse_open_user_config(text: Optional[str], field: str) -> None:
    """Refuse a user's squid configuration that allows everyone (``http_access allow all``).

    Behind our rules such a line is never reached, so it changes nothing but reads as if
    the proxy were open: refused rather than kept, so the config says what the proxy does.
    """
    if text and _ALLOW_ALL_RE.search(text):
        raise Permanent("%s: contains 'http_access allow all', which would make the proxy an open relay; remove it "
                        "and say who may use the proxy with the Proxy's allowedSources (and auth)" % field)


# The page of every error squid answers itself (403, 407, 502, 503, ...): nothing in it names
# the software, its version or the host, and it is the same whatever went wrong (the status
# line says which). The access log keeps the reason.
ERROR_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Request not completed</title></head>
<body><p>The request was not completed.</p></body></html>
"""
# Every template squid 5.7 loads (Debian's /usr/share/squid/errors/templates; a test compares);
# ERR_DIR_LISTING is an FTP directory listing, not an error, and keeps its content.
ERROR_TEMPLATES = (
    "ERR_ACCESS_DENIED", "ERR_ACL_TIME_QUOTA_EXCEEDED", "ERR_AGENT_CONFIGURE", "ERR_AGENT_WPAD",
    "ERR_CACHE_ACCESS_DENIED", "ERR_CACHE_MGR_ACCESS_DENIED", "ERR_CANNOT_FORWARD", "ERR_CONFLICT_HOST",
    "ERR_CONNECT_FAIL", "ERR_DNS_FAIL", "ERR_ESI", "ERR_FORWARDING_DENIED", "ERR_FTP_DISABLED",
    "ERR_FTP_FAILURE", "ERR_FTP_FORBIDDEN", "ERR_FTP_NOT_FOUND", "ERR_FTP_PUT_CREATED", "ERR_FTP_PUT_ERROR",
    "ERR_FTP_PUT_MODIFIED", "ERR_FTP_UNAVAILABLE", "ERR_GATEWAY_FAILURE", "ERR_ICAP_FAILURE", "ERR_INVALID_REQ",
    "ERR_INVALID_RESP", "ERR_INVALID_URL", "ERR_LIFETIME_EXP", "ERR_NO_RELAY", "ERR_ONLY_IF_CACHED_MISS",
    "ERR_PRECONDITION_FAILED", "ERR_PROTOCOL_UNKNOWN", "ERR_READ_ERROR", "ERR_READ_TIMEOUT",
    "ERR_SECURE_CONNECT_FAIL", "ERR_SHUTTING_DOWN", "ERR_SOCKET_FAILURE", "ERR_TOO_BIG", "ERR_UNSUP_HTTPVERSION",
    "ERR_UNSUP_REQ", "ERR_URN_RESOLVE", "ERR_WRITE_ERROR", "ERR_ZERO_SIZE_OBJECT",
)
DIR_LISTING_TEMPLATE = "ERR_DIR_LISTING"
# Templates that are pages only (for deny_info), not an error squid records: squid_error refuses them.
_PAGES_ONLY = ("ERR_ACL_TIME_QUOTA_EXCEEDED", "ERR_AGENT_CONFIGURE", "ERR_AGENT_WPAD")
DIR_LISTING_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Directory: %U</title></head>
<body><h2>Directory: <a href="%U">%U</a>/</h2>
<pre>%z</pre>
<table>
<tr><th></th><th><a href="../">Parent Directory</a> (<a href="/">Root Directory</a>)</th></tr>
%g
</table>
</body></html>
"""
