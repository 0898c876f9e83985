# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may use a proxy: the ``access`` module option, rendered as squid configuration.

The operator's part of every proxy's squid configuration (docs/architecture.md, "Security
model"): Basic auth against a file of password *hashes*, a source allowlist, destinations a
proxy must never reach (loopback, link-local with the cloud metadata address), the manager
interface closed, no client address leaking to the origin, and ``http_access deny all``
last. What this module renders:

- :func:`render_rules`: the squid.conf lines. On KVM and GCP they become the drop-in
  ``/etc/squid/conf.d/00-egress-proxies.conf``; Debian's stock squid.conf includes
  ``conf.d/*.conf`` after its own port and manager denies and *before* its own
  ``http_access allow localhost`` / ``deny all`` (verified on Debian 12's squid 5.7), and
  squid takes the first ``http_access`` line that matches, so ours decide every request
  that the stock denies let through; anything after the include (later conf.d files such
  as a user's ``zz-*.conf``, the stock ``allow localhost``) is never reached. On
  Kubernetes the module puts them right after ``http_port``, before the provider's
  ``squidConfig``.
- :func:`render_password_file`: ``name:hash`` lines for ``basic_ncsa_auth``, which checks
  a hash with crypt(3): on Debian 12 that is libxcrypt, which takes bcrypt (``$2b$``) and
  SHA-512-crypt (``$6$``) alike (tests/integration/test_squid_access.py runs it).
- :func:`install_script`: a POSIX sh script writing both files, for KVM vendor-data (as a
  ``#cloud-boothook``, see :func:`boothook`) and GCP's ``startup-script``.

Importable without Ansible: the standard library and the collection's errors module only.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import Permanent

BASIC_NCSA_AUTH = "/usr/lib/squid/basic_ncsa_auth"
# Where KVM and GCP instances get the two files. "00-" sorts before any file a user drops
# into conf.d (and before Debian's own debian.conf), so our http_access lines come first.
DROPIN_PATH = "/etc/squid/conf.d/00-egress-proxies.conf"
# The boot gate (KVM): "00-egress-proxies-" sorts before "00-egress-proxies." ('-' < '.'), so
# while this file exists its ``deny all`` decides every request, ahead of our own rules.
GATE_PATH = "/etc/squid/conf.d/00-egress-proxies-booting.conf"
# The transient systemd unit that opens the gate once cloud-init's final stage has finished.
GATE_UNIT = "egress-proxies-open-gate"
PASSWORD_FILE = "/etc/squid/egress-proxies.passwd"
REALM = "egress-proxy"

# A user name travels in a Basic credential ("name:password") and in the password file
# ("name:hash"): no colon, no whitespace; this set is also safe in a shell here-document.
_USER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The two crypt(3) formats basic_ncsa_auth checks on Debian 12 (libxcrypt); both are
# ASCII from crypt's own alphabet, so no hash can break a line or a here-document.
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_SHA512_CRYPT_RE = re.compile(r"^\$6\$(rounds=[0-9]{1,9}\$)?[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{86}$")
# An unconditional allow in a user's squid configuration: an open proxy.
_ALLOW_ALL_RE = re.compile(r"^[ \t]*http_access[ \t]+allow[ \t]+all[ \t]*(#.*)?$", re.MULTILINE)


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


def parse_access(value: Optional[Mapping[str, Any]], field: str = "access") -> Optional[Access]:
    """The ``access`` option validated; None when absent (today's behaviour: no policy).

    Every failure is ``Permanent`` and names the field path (``access.users[1].password_hash``).
    A password is never accepted, nor repeated in a message: only its hash.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise Permanent("%s: must be a dict with users, allowed_sources and open" % field)
    unknown = sorted(str(key) for key in value if key not in ("users", "allowed_sources", "open"))
    if unknown:
        raise Permanent("%s.%s: unknown field; allowed are users, allowed_sources, open" % (field, unknown[0]))
    is_open = value.get("open") or False
    if not isinstance(is_open, bool):
        raise Permanent("%s.open: must be true or false" % field)
    users = _parse_users(value.get("users") or [], "%s.users" % field)
    sources = _parse_sources(value.get("allowed_sources") or [], "%s.allowed_sources" % field)
    if is_open and users:
        raise Permanent("%s.users: must be empty when %s.open is true (an open proxy asks for no credentials); "
                        "remove the users or set open to false" % (field, field))
    if not is_open and not users:
        raise Permanent("%s.users: at least one user is required unless %s.open is true" % (field, field))
    if not users and not sources:
        raise Permanent("%s.allowed_sources: required when %s.users is empty (open: true); list the client "
                        "networks, or 0.0.0.0/0 and ::/0 to serve anyone" % (field, field))
    return Access(users=users, allowed_sources=sources, open=is_open)


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


def _parse_sources(value: Any, field: str) -> Tuple[str, ...]:
    if not isinstance(value, list):
        raise Permanent("%s: must be a list of CIDRs" % field)
    sources: List[str] = []
    for index, item in enumerate(value):
        try:
            network = ipaddress.ip_network(item if isinstance(item, str) else "", strict=True)
        except ValueError as error:
            raise Permanent("%s[%d]: %r is not a CIDR such as 10.0.0.0/8 or fd00::/8 (%s)" % (
                field, index, item, error)) from None
        sources.append(str(network))
    return tuple(sources)


def render_rules(access: Access, password_file: str = PASSWORD_FILE) -> str:
    """The squid.conf lines of ``access``; the last ``http_access`` line is ``deny all``.

    Order matters (squid acts on the first ``http_access`` line that matches):
    ports and destinations first, so a request to the metadata address is refused without
    asking for credentials; then sources, so a stranger gets 403 and never a 407 inviting
    a password guess; then credentials (a request without them or with wrong ones gets 407).
    """
    lines = ["# crawl.egress_proxies: the operator's access policy (docs/architecture.md, \"Security model\").",
             "# Generated; replaced when the instance is created. http_access lines after these are never reached."]
    if access.users:
        lines += [
            "auth_param basic program %s %s" % (BASIC_NCSA_AUTH, password_file),
            "auth_param basic children 5 startup=1 idle=1",
            "auth_param basic realm %s" % REALM,
            # squid re-checks a cached credential this often; a rotated password file is
            # read again on reconfigure anyway.
            "auth_param basic credentialsttl 1 hour",
            "acl egress_users proxy_auth REQUIRED",
        ]
    lines += [
        "acl egress_sources src %s" % " ".join(access.allowed_sources) if access.allowed_sources
        else "acl egress_sources src all",
        # The same ports as Debian's stock squid.conf: no CONNECT to SMTP or anything but 443.
        "acl egress_safe_ports port 80 21 443 70 210 1025-65535 280 488 591 777",
        "acl egress_ssl_ports port 443",
        "acl egress_connect method CONNECT",
        # squid's built-in to_localhost is 127.0.0.0/8 0.0.0.0/32 ::1/128 ::/128; stated again
        # so the rule does not depend on a squid version's built-ins.
        "acl egress_loopback dst 127.0.0.0/8 0.0.0.0/32 ::1/128 ::/128",
        # Link-local, which holds the cloud metadata address 169.254.169.254 (GCP, AWS, Azure),
        # plus AWS's IPv6 metadata address. A hostname is resolved before a dst ACL is
        # checked, so metadata.google.internal is refused as well.
        "acl egress_link_local dst 169.254.0.0/16 fe80::/10 fd00:ec2::254/128",
        "http_access deny !egress_safe_ports",
        "http_access deny egress_connect !egress_ssl_ports",
        "http_access deny manager",
        "http_access deny to_localhost",
        "http_access deny egress_loopback",
        "http_access deny egress_link_local",
        "http_access deny !egress_sources",
        "http_access allow egress_users" if access.users else "http_access allow egress_sources",
        "http_access deny all",
        # The origin learns nothing about the client or the proxy software.
        "via off",
        "forwarded_for delete",
        "request_header_access X-Forwarded-For deny all",
        "request_header_access Via deny all",
    ]
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


_HEREDOC_END = "EGRESS_PROXIES_EOF"


def install_script(access: Access, boot_gate: bool = False) -> bytes:
    """A POSIX sh script that writes the drop-in and the password file, then reloads squid.

    ``boot_gate`` (the KVM boothook): squid also refuses every request (403) until cloud-init
    has finished this boot, user-data included. Ready means serving, and the controller's
    probe must not pass before a user's ``runcmd`` or ``packages`` restart squid (measured in
    the real-guest test: a guest Ready after its first 204 then refused connections for
    seconds while its cloud-final restarted squid). The gate is a drop-in of its own
    (:data:`GATE_PATH`) that a transient systemd unit ordered after ``cloud-final.service``
    removes, then reloads squid: queued with ``--no-block``, so nothing in cloud-init waits on
    it, and a boothook runs on every boot, so every boot gates until it has finished. Without
    systemd-run there is no gate (nothing would open it).

    It runs before squid is installed (a KVM boothook, in cloud-init's init stage, before
    the final stage installs the user's ``packages``) or after (GCP's startup script races
    cloud-init; an image with squid in it): the files are written first, so a squid
    installed later starts with them, and a squid already running is reloaded after they
    are in place. The password file is 0640 root:proxy (Debian's squid user; ``squid`` on
    distributions that call it that). Idempotent; every step logs one line.
    """
    password_file = render_password_file(access)
    rules = render_rules(access)
    parts = [
        "#!/bin/sh",
        "# crawl.egress_proxies: install the operator's squid access policy (docs/architecture.md,",
        "# \"Security model\"). Generated per instance; runs on KVM as a vendor-data boothook and on",
        "# GCP as the startup-script.",
        "umask 022",
        "log() { printf 'egress-proxies access: %s\\n' \"$*\"; }",
        "mkdir -p /etc/squid/conf.d || { log \"FAILED: cannot create /etc/squid/conf.d\"; exit 1; }",
        "group=",
        "for candidate in proxy squid; do",
        "    if getent group \"$candidate\" >/dev/null 2>&1; then group=$candidate; break; fi",
        "done",
        # Written next to the target and renamed over it: squid never reads half a file.
        "write() {",
        "    target=$1 mode=$2 tmp=$1.egress-proxies.$$",
        "    (umask 077 && cat > \"$tmp\") || { log \"FAILED: cannot write $target\"; exit 1; }",
        "    if [ \"$mode\" = 0640 ]; then",
        "        if [ -n \"$group\" ]; then chgrp \"$group\" \"$tmp\"",
        "        else log \"no proxy or squid group yet: squid cannot read $target (every login fails)\"\\",
        "            \" until this runs again\"",
        "        fi",
        "    fi",
        "    chmod \"$mode\" \"$tmp\" && mv -f \"$tmp\" \"$target\" ||",
        "        { log \"FAILED: cannot install $target\"; exit 1; }",
        "    log \"wrote $target\"",
        "}",
    ]
    if access.users:
        parts += ["write %s 0640 <<'%s'" % (PASSWORD_FILE, _HEREDOC_END), password_file.rstrip("\n"), _HEREDOC_END]
    if boot_gate:
        opener = "rm -f %s && systemctl try-reload-or-restart squid" % GATE_PATH
        parts += [
            "if command -v systemd-run >/dev/null 2>&1; then",
            "    write %s 0644 <<'%s'" % (GATE_PATH, _HEREDOC_END),
            "# crawl.egress_proxies: closed until cloud-init has finished this boot (removed by %s)" % GATE_UNIT,
            "http_access deny all",
            _HEREDOC_END,
            "    systemctl reset-failed %s.service >/dev/null 2>&1" % GATE_UNIT,
            "    systemd-run --no-block --unit=%s --property=Type=oneshot --property=After=cloud-final.service \\"
            % GATE_UNIT,
            "        /bin/sh -c '%s' >/dev/null && log \"squid closed until cloud-init has finished\" ||" % opener,
            "        { rm -f %s; log \"FAILED: cannot queue %s; squid is not gated\"; }" % (GATE_PATH, GATE_UNIT),
            "else",
            "    rm -f %s" % GATE_PATH,
            "fi",
        ]
    parts += [
        "write %s 0644 <<'%s'" % (DROPIN_PATH, _HEREDOC_END), rules.rstrip("\n"), _HEREDOC_END,
        # try-reload-or-restart acts only on a running unit: a squid installed later starts
        # with the files as they are now.
        "if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet squid; then",
        "    systemctl try-reload-or-restart squid && log \"squid reloaded\" || log \"FAILED: squid reload\"",
        "elif command -v squid >/dev/null 2>&1 && pidof squid >/dev/null 2>&1; then",
        "    squid -k reconfigure && log \"squid reconfigured\" || log \"FAILED: squid -k reconfigure\"",
        "else",
        "    log \"squid is not running; it reads the policy when it starts\"",
        "fi",
    ]
    return ("\n".join(parts) + "\n").encode("ascii")


def boothook(access: Access) -> bytes:
    """:func:`install_script` as a ``#cloud-boothook`` document, for KVM vendor-data.

    cloud-init runs vendor-data parts with the same handlers as user-data; a boothook runs
    in the init stage, before the final stage installs packages, so Debian's squid starts
    with the policy from its very first start. cloud-init strips the ``#cloud-boothook``
    line and executes the rest, which therefore starts with its own ``#!/bin/sh``.
    """
    return b"#cloud-boothook\n" + install_script(access, boot_gate=True)
