# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Generated file, do not edit: the long lines are the script's own.
# ruff: noqa: E501
"""The guest agent bootstrap script, byte for byte, for the modules.

Source of truth: roles/guest_agent/files/install-qemu-guest-agent.sh (the
guest_agent role runs it on existing hosts; KVM instances get it as
vendor-data). Modules run on the target through AnsiballZ, which carries
module_utils but no role files, hence this copy. After editing the script,
regenerate with ``python tools/sync_guest_agent_script.py``;
``--check`` and tests/unit/test_guest_agent_script.py fail on drift.
"""

from __future__ import annotations

GUEST_AGENT_SCRIPT = (
    b"#!/bin/sh\n"
    b"# Install and start the QEMU guest agent so the hypervisor can read this\n"
    b"# machine's IP addresses through the org.qemu.guest_agent.0 channel.\n"
    b"#\n"
    b"# This file is the single source of truth for the bootstrap. It runs in two\n"
    b"# ways:\n"
    b'#   - as cloud-init vendor-data (a "#!" part), written to the vendor scripts\n'
    b"#     directory and run by cc_scripts_vendor on the final stage, after package\n"
    b"#     installation and before the user's own scripts, so the user's document\n"
    b"#     reaches the instance unedited whatever its format;\n"
    b"#   - by the crawl.egress_proxies.guest_agent role on an existing host.\n"
    b"# plugins/module_utils/guest_agent_script.py embeds a byte-for-byte copy for\n"
    b"# the modules; regenerate it with tools/sync_guest_agent_script.py after any\n"
    b"# edit here.\n"
    b"#\n"
    b"# Contract: POSIX sh; idempotent; every step logs one line to stdout prefixed\n"
    b'# "egress-proxies guest-agent:" (it lands in /var/log/cloud-init-output.log);\n'
    b"# exit 0 when the agent is installed (already, or now) and started; exit 1\n"
    b"# with a logged reason otherwise. A failure here is contained: cloud-init logs\n"
    b"# the failed vendor script and carries on with the remaining modules, and this\n"
    b"# script changes nothing beyond the package and its service.\n"
    b"\n"
    b"PACKAGE=qemu-guest-agent\n"
    b"SERVICE=qemu-guest-agent\n"
    b'# Marker the role matches to report "changed: false"; keep it stable.\n'
    b'ALREADY_INSTALLED="already installed"\n'
    b"\n"
    b"log() {\n"
    b"    printf 'egress-proxies guest-agent: %s\\n' \"$*\"\n"
    b"}\n"
    b"\n"
    b"fail() {\n"
    b'    log "FAILED: $*"\n'
    b"    exit 1\n"
    b"}\n"
    b"\n"
    b"have() {\n"
    b'    command -v "$1" >/dev/null 2>&1\n'
    b"}\n"
    b"\n"
    b"# `command -v` alone misses /usr/sbin when PATH lacks it (a login shell of an\n"
    b"# unprivileged user, some become methods), so the usual binary paths count too.\n"
    b"agent_present() {\n"
    b"    have qemu-ga && return 0\n"
    b"    for candidate in /usr/sbin/qemu-ga /usr/bin/qemu-ga /usr/local/sbin/qemu-ga /usr/local/bin/qemu-ga; do\n"
    b'        [ -x "$candidate" ] && return 0\n'
    b"    done\n"
    b"    return 1\n"
    b"}\n"
    b"\n"
    b"install_package() {\n"
    b"    if have apt-get; then\n"
    b"        # A first boot can race unattended-upgrades for the dpkg lock: wait for\n"
    b"        # it instead of failing (apt >= 1.9.11; older apt ignores the option).\n"
    b'        log "apt-get update"\n'
    b"        if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update; then\n"
    b"            # Stale or partial indexes may still resolve the package; the\n"
    b"            # install below decides.\n"
    b'            log "apt-get update failed; trying the install with the current package lists"\n'
    b"        fi\n"
    b'        log "apt-get install $PACKAGE"\n'
    b"        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 \\\n"
    b'            install -y --no-install-recommends "$PACKAGE"\n'
    b"    elif have dnf; then\n"
    b'        log "dnf install $PACKAGE"\n'
    b'        dnf install -y "$PACKAGE"\n'
    b"    elif have yum; then\n"
    b'        log "yum install $PACKAGE"\n'
    b'        yum install -y "$PACKAGE"\n'
    b"    elif have zypper; then\n"
    b'        log "zypper install $PACKAGE"\n'
    b'        zypper --non-interactive install "$PACKAGE"\n'
    b"    elif have apk; then\n"
    b'        log "apk add $PACKAGE"\n'
    b'        apk add --update-cache "$PACKAGE"\n'
    b"    else\n"
    b'        fail "no supported package manager (apt-get, dnf, yum, zypper, apk) found; install $PACKAGE by hand"\n'
    b"    fi\n"
    b"}\n"
    b"\n"
    b"start_service() {\n"
    b"    if have systemctl; then\n"
    b'        log "systemctl enable --now $SERVICE"\n'
    b'        systemctl enable --now "$SERVICE" && return 0\n'
    b"        # Debian ships a static unit that udev starts when the virtio port\n"
    b"        # appears; enabling it can fail on older systemd, starting it works.\n"
    b'        log "systemctl enable --now failed; trying systemctl start $SERVICE"\n'
    b'        systemctl start "$SERVICE"\n'
    b"    elif have rc-update; then\n"
    b'        log "rc-update add $SERVICE default"\n'
    b'        rc-update add "$SERVICE" default || return 1\n'
    b"        if have rc-service; then\n"
    b'            log "rc-service $SERVICE start"\n'
    b'            rc-service "$SERVICE" start\n'
    b"        else\n"
    b'            log "service $SERVICE start"\n'
    b'            service "$SERVICE" start\n'
    b"        fi\n"
    b"    elif have service; then\n"
    b'        log "service $SERVICE start"\n'
    b'        service "$SERVICE" start\n'
    b"    else\n"
    b'        log "no service manager (systemctl, rc-update, service) found"\n'
    b"        return 1\n"
    b"    fi\n"
    b"}\n"
    b"\n"
    b"if agent_present; then\n"
    b'    log "$PACKAGE $ALREADY_INSTALLED; nothing to do"\n'
    b"    exit 0\n"
    b"fi\n"
    b"\n"
    b'log "installing $PACKAGE"\n'
    b'install_package || fail "could not install $PACKAGE (are the package mirrors reachable?)"\n'
    b'log "installed $PACKAGE"\n'
    b"\n"
    b'start_service || fail "installed $PACKAGE but could not start $SERVICE (it needs the VM\'s org.qemu.guest_agent.0 channel)"\n'
    b'log "$SERVICE started"\n'
    b"exit 0\n"
)
