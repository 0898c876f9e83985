#!/bin/sh
# Install and start the QEMU guest agent so the hypervisor can read this
# machine's IP addresses through the org.qemu.guest_agent.0 channel.
#
# This file is the single source of truth for the bootstrap. It runs in two
# ways:
#   - as cloud-init vendor-data (a "#!" part), written to the vendor scripts
#     directory and run by cc_scripts_vendor on the final stage, after package
#     installation and before the user's own scripts, so the user's document
#     reaches the instance unedited whatever its format;
#   - by the crawl.egress_proxies.guest_agent role on an existing host.
# plugins/module_utils/guest_agent_script.py embeds a byte-for-byte copy for
# the modules; regenerate it with tools/sync_guest_agent_script.py after any
# edit here.
#
# Contract: POSIX sh; idempotent; every step logs one line to stdout prefixed
# "egress-proxies guest-agent:" (it lands in /var/log/cloud-init-output.log);
# exit 0 when the agent is installed (already, or now) and started; exit 1
# with a logged reason otherwise. A failure here is contained: cloud-init logs
# the failed vendor script and carries on with the remaining modules, and this
# script changes nothing beyond the package and its service.

PACKAGE=qemu-guest-agent
SERVICE=qemu-guest-agent
# Marker the role matches to report "changed: false"; keep it stable.
ALREADY_INSTALLED="already installed"

log() {
    printf 'egress-proxies guest-agent: %s\n' "$*"
}

fail() {
    log "FAILED: $*"
    exit 1
}

have() {
    command -v "$1" >/dev/null 2>&1
}

# `command -v` alone misses /usr/sbin when PATH lacks it (a login shell of an
# unprivileged user, some become methods), so the usual binary paths count too.
agent_present() {
    have qemu-ga && return 0
    for candidate in /usr/sbin/qemu-ga /usr/bin/qemu-ga /usr/local/sbin/qemu-ga /usr/local/bin/qemu-ga; do
        [ -x "$candidate" ] && return 0
    done
    return 1
}

install_package() {
    if have apt-get; then
        # A first boot can race unattended-upgrades for the dpkg lock: wait for
        # it instead of failing (apt >= 1.9.11; older apt ignores the option).
        log "apt-get update"
        if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update; then
            # Stale or partial indexes may still resolve the package; the
            # install below decides.
            log "apt-get update failed; trying the install with the current package lists"
        fi
        log "apt-get install $PACKAGE"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 \
            install -y --no-install-recommends "$PACKAGE"
    elif have dnf; then
        log "dnf install $PACKAGE"
        dnf install -y "$PACKAGE"
    elif have yum; then
        log "yum install $PACKAGE"
        yum install -y "$PACKAGE"
    elif have zypper; then
        log "zypper install $PACKAGE"
        zypper --non-interactive install "$PACKAGE"
    elif have apk; then
        log "apk add $PACKAGE"
        apk add --update-cache "$PACKAGE"
    else
        fail "no supported package manager (apt-get, dnf, yum, zypper, apk) found; install $PACKAGE by hand"
    fi
}

start_service() {
    if have systemctl; then
        log "systemctl enable --now $SERVICE"
        systemctl enable --now "$SERVICE" && return 0
        # Debian ships a static unit that udev starts when the virtio port
        # appears; enabling it can fail on older systemd, starting it works.
        log "systemctl enable --now failed; trying systemctl start $SERVICE"
        systemctl start "$SERVICE"
    elif have rc-update; then
        log "rc-update add $SERVICE default"
        rc-update add "$SERVICE" default || return 1
        if have rc-service; then
            log "rc-service $SERVICE start"
            rc-service "$SERVICE" start
        else
            log "service $SERVICE start"
            service "$SERVICE" start
        fi
    elif have service; then
        log "service $SERVICE start"
        service "$SERVICE" start
    else
        log "no service manager (systemctl, rc-update, service) found"
        return 1
    fi
}

if agent_present; then
    log "$PACKAGE $ALREADY_INSTALLED; nothing to do"
    exit 0
fi

log "installing $PACKAGE"
install_package || fail "could not install $PACKAGE (are the package mirrors reachable?)"
log "installed $PACKAGE"

start_service || fail "installed $PACKAGE but could not start $SERVICE (it needs the VM's org.qemu.guest_agent.0 channel)"
log "$SERVICE started"
exit 0
