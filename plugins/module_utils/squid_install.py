# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the access policy (squid_access.py) gets onto an instance: shell, never the user's document.

- :func:`install_script`: a POSIX sh script for KVM vendor-data (as a ``#cloud-boothook``, see
  :func:`boothook`) and GCP's ``startup-script``. It writes everything under
  :data:`POLICY_DIR`, the instance's squid.conf among them (``gate.conf``, the policy's head,
  ``include /etc/squid/squid.conf``, its tail), and a systemd drop-in that starts squid with it
  (``-f``): Debian's squid.conf and every ``conf.d/*.conf`` of the user's sit between the two
  pieces of the policy, so nothing in them comes before its rules or after its settings.
- :func:`container_command`: the Kubernetes container's command, which writes the error pages and
  the Pod's own addresses (from the downward API) into an emptyDir before it execs squid.

Importable without Ansible.
"""

from __future__ import annotations

from typing import List, Sequence

from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DIR_LISTING_PAGE,
    DIR_LISTING_TEMPLATE,
    ERROR_PAGE,
    ERROR_TEMPLATES,
    Access,
    PolicyPaths,
    render_password_file,
    render_policy,
)

# Where KVM and GCP instances keep the policy; Debian's own squid.conf stays as the package has it.
POLICY_DIR = "/etc/squid/egress-proxies"
CONFIG_PATH = POLICY_DIR + "/squid.conf"
GATE_PATH = POLICY_DIR + "/gate.conf"
PASSWORD_FILE = POLICY_DIR + "/passwd"
OWN_ADDRESSES = POLICY_DIR + "/own-addresses"
ERROR_DIRECTORY = POLICY_DIR + "/errors"
REFRESH_PATH = POLICY_DIR + "/refresh"
DISTRIBUTION_CONFIG = "/etc/squid/squid.conf"
UNIT_DROPIN = "/etc/systemd/system/squid.service.d/egress-proxies.conf"
INSTANCE_PATHS = PolicyPaths(password_file=PASSWORD_FILE, own_addresses=OWN_ADDRESSES, error_directory=ERROR_DIRECTORY)
# The transient systemd unit that opens the boot gate once cloud-init's final stage has finished.
GATE_UNIT = "egress-proxies-open-gate"
GATE_CLOSED = ("# crawl.egress_proxies: closed until cloud-init has finished this boot (opened by %s)\n"
               "http_access deny all\n" % GATE_UNIT)
GATE_OPEN = "# crawl.egress_proxies: open\n"
# Debian's squid.service runs these two (squid 5.7 in Debian 12); the drop-in adds -f.
UNIT = """# crawl.egress_proxies: squid reads the operator's configuration, which includes %s
[Service]
ExecStartPre=
ExecStartPre=/usr/sbin/squid --foreground -z -f %s
ExecStart=
ExecStart=/usr/sbin/squid --foreground -sYC -f %s
""" % (DISTRIBUTION_CONFIG, CONFIG_PATH, CONFIG_PATH)
_HEREDOC_END = "EGRESS_PROXIES_EOF"


def heredoc(command: str, body: str) -> List[str]:
    """``command <<'END'`` with ``body``: nothing in it is expanded by the shell."""
    return ["%s <<'%s'" % (command, _HEREDOC_END), body.rstrip("\n"), _HEREDOC_END]


def error_pages_shell(directory: str) -> List[str]:
    """POSIX sh lines writing every error template into ``directory`` (squid's ``error_directory``)."""
    first = "%s/%s" % (directory, ERROR_TEMPLATES[0])
    return ["mkdir -p %s" % directory,
            *heredoc("cat > %s" % first, ERROR_PAGE),
            *heredoc("cat > %s/%s" % (directory, DIR_LISTING_TEMPLATE), DIR_LISTING_PAGE),
            "for name in %s; do" % " ".join(ERROR_TEMPLATES[1:]),
            "    cp -f %s \"%s/$name\"" % (first, directory),
            "done"]


def instance_config(access: Access, refused_host_addresses: Sequence[str] = ()) -> str:
    """The squid.conf of a KVM or GCP instance (``squid -f``); ``refused_host_addresses`` as in
    ``squid_access.render_policy``."""
    policy = render_policy(access, INSTANCE_PATHS, refused_host_addresses)
    return "include %s\n%s" % (GATE_PATH, policy.around("include %s\n" % DISTRIBUTION_CONFIG))


# Run at boot (own addresses only) and by the gate unit ("open"): the instance's addresses from
# its interfaces, which squid never connects to (acl egress_never).
REFRESH = """#!/bin/sh
# crawl.egress_proxies: this instance's own addresses, which squid never connects to; with "open",
# also the boot gate opened and squid reloaded.
command -v ip >/dev/null 2>&1 || echo "egress-proxies: no ip command: own addresses unknown" >&2
ip -o addr show 2>/dev/null | while read -r _ _ family address _; do
    case $family/${address%%/*} in
    inet/127.*|inet6/::1) ;;  # loopback: refused anyway
    inet/*|inet6/*) echo "${address%%/*}";;
    esac
done > %(own)s.tmp && mv -f %(own)s.tmp %(own)s
[ "${1:-}" = open ] || exit 0
printf '%%s' '%(gate_open)s' > %(gate)s
systemctl try-reload-or-restart squid
""" % {"own": OWN_ADDRESSES, "gate": GATE_PATH, "gate_open": GATE_OPEN}


def _prelude() -> List[str]:
    return [
        "#!/bin/sh",
        "# crawl.egress_proxies: install the operator's squid access policy (docs/architecture.md,",
        "# \"Security model\"). Generated per instance; runs on KVM as a vendor-data boothook and on",
        "# GCP as the startup-script.",
        "umask 022",
        "log() { printf 'egress-proxies access: %s\\n' \"$*\"; }",
        "mkdir -p %s /etc/systemd/system/squid.service.d || { log \"FAILED: cannot create %s\"; exit 1; }"
        % (POLICY_DIR, POLICY_DIR),
        "group=",
        "for candidate in proxy squid; do",
        "    if getent group \"$candidate\" >/dev/null 2>&1; then group=$candidate; break; fi",
        "done",
        "changed=",
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
        "    cmp -s \"$tmp\" \"$target\" || changed=\"$changed $target\"",
        "    chmod \"$mode\" \"$tmp\" && mv -f \"$tmp\" \"$target\" ||",
        "        { log \"FAILED: cannot install $target\"; exit 1; }",
        "    log \"wrote $target\"",
        "}",
    ]


def _gate(boot_gate: bool) -> List[str]:
    """The boot gate (KVM): squid refuses everything until a transient unit ordered after
    cloud-final.service opens it. Queued with ``--no-block``, so nothing in cloud-init waits on
    it; without systemd-run nothing would open it, so there is none."""
    opened = heredoc("write %s 0644" % GATE_PATH, GATE_OPEN)
    if not boot_gate:
        return opened
    queued = "squid closed until cloud-init has finished"
    return ["if command -v systemd-run >/dev/null 2>&1; then",
            *heredoc("    write %s 0644" % GATE_PATH, GATE_CLOSED),
            "    systemctl reset-failed %s.service >/dev/null 2>&1" % GATE_UNIT,
            "    systemd-run --no-block --unit=%s --property=Type=oneshot --property=After=cloud-final.service \\"
            % GATE_UNIT,
            "        /bin/sh %s open >/dev/null && log \"%s\" ||" % (REFRESH_PATH, queued),
            "        { printf '%%s' '%s' > %s; log \"FAILED: cannot queue %s; squid is not gated\"; }" % (
                GATE_OPEN, GATE_PATH, GATE_UNIT),
            "else",
            *["    " + line if index == 0 else line for index, line in enumerate(opened)],
            "fi"]


def _reload() -> List[str]:
    """squid restarted when its unit changed (a new ``-f``), else reloaded; one installed later
    starts with the files as they are now."""
    return [
        "if command -v systemctl >/dev/null 2>&1; then",
        "    case $changed in *%s*) systemctl daemon-reload && log \"systemd reloaded\";; esac" % UNIT_DROPIN,
        "fi",
        "if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet squid; then",
        "    case $changed in",
        "    *%s*) systemctl try-restart squid && log \"squid restarted\" || log \"FAILED: squid restart\";;" %
        UNIT_DROPIN,
        "    *) systemctl try-reload-or-restart squid && log \"squid reloaded\" || log \"FAILED: squid reload\";;",
        "    esac",
        "elif command -v squid >/dev/null 2>&1 && pidof squid >/dev/null 2>&1; then",
        "    squid -f %s -k reconfigure && log \"squid reconfigured\" || log \"FAILED: squid -k reconfigure\"" %
        CONFIG_PATH,
        "else",
        "    log \"squid is not running; it reads the policy when it starts\"",
        "fi",
    ]


def install_script(access: Access, boot_gate: bool = False, refused_host_addresses: Sequence[str] = ()) -> bytes:
    """A POSIX sh script that installs the policy on a KVM or GCP instance, then (re)loads squid.
    ``refused_host_addresses``: the addresses of the machine it runs on that the provider knows
    (``squid_access.render_policy``).

    ``boot_gate`` (the KVM boothook): squid also refuses every request (403) until cloud-init
    has finished this boot, user-data included: Ready means serving, and the probe must not pass
    before a user's ``runcmd`` or ``packages`` restart squid (measured in the real-guest test).

    It runs before squid is installed (a KVM boothook runs in cloud-init's init stage, before
    the final stage installs the user's ``packages``) or after (GCP's startup script races
    cloud-init; an image with squid in it): the files and the unit drop-in are written first,
    so a squid installed later starts with them, and a running one is restarted (a new unit)
    or reloaded. The password file is 0640 root:proxy (``squid`` on distributions that call
    the group that). Idempotent; every step logs one line.
    """
    parts = _prelude()
    if access.users:
        parts += heredoc("write %s 0640" % PASSWORD_FILE, render_password_file(access))
    parts += [*error_pages_shell(ERROR_DIRECTORY), "log \"wrote %s\"" % ERROR_DIRECTORY]
    parts += heredoc("write %s 0755" % REFRESH_PATH, REFRESH)
    parts += ["/bin/sh %s && log \"wrote %s\"" % (REFRESH_PATH, OWN_ADDRESSES)]
    parts += _gate(boot_gate)
    parts += heredoc("write %s 0644" % CONFIG_PATH, instance_config(access, refused_host_addresses))
    parts += heredoc("write %s 0644" % UNIT_DROPIN, UNIT)
    parts += _reload()
    return ("\n".join(parts) + "\n").encode("ascii")


def boothook(access: Access, refused_host_addresses: Sequence[str] = ()) -> bytes:
    """:func:`install_script` as a ``#cloud-boothook`` document, for KVM vendor-data.

    cloud-init runs vendor-data parts with the same handlers as user-data; a boothook runs
    in the init stage, before the final stage installs packages, so Debian's squid starts
    with the policy from its very first start. cloud-init strips the ``#cloud-boothook``
    line and executes the rest, which therefore starts with its own ``#!/bin/sh``.
    """
    return b"#cloud-boothook\n" + install_script(access, boot_gate=True, refused_host_addresses=refused_host_addresses)


def container_command(run_directory: str, address_variables: Sequence[str], squid: Sequence[str]) -> List[str]:
    """A Kubernetes container's command: write the error pages and the Pod's own addresses (the
    comma-separated values of ``address_variables``, set from the downward API) under
    ``run_directory`` (an emptyDir), then exec ``squid``."""
    own = "%s/own-addresses" % run_directory
    variables = ",".join("${%s:-}" % name for name in address_variables)
    script = ["set -e", "umask 022", *error_pages_shell("%s/errors" % run_directory),
              "echo \"%s\" | tr ',' '\\n' | grep . > %s || true" % (variables, own), 'exec "$@"']
    return ["/bin/sh", "-c", "\n".join(script) + "\n", "egress-proxy", *squid]
