#!/usr/bin/env bash
# Prepare this machine to develop and test the collection: Debian packages (as root),
# the .venv with the pinned Python requirements, and the collection made importable by
# Ansible from the source tree. Safe to re-run: each step is skipped when already done.
#
#   bash scripts/setup.sh                    # venv on Debian's /usr/bin/python3 (3.11)
#   PYTHON=python3.12 bash scripts/setup.sh  # or on another interpreter
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
PYTHON=${PYTHON:-/usr/bin/python3}

# libvirt-dev, pkg-config, gcc and python3-dev build libvirt-python when pip finds no wheel;
# qemu, libvirt, openssh, dnsmasq and iptables (libvirt's bridge networks) make the test
# hypervisors, util-linux the namespaces they run in; debootstrap, fdisk (sfdisk), extlinux and
# syslinux-common (mbr.bin) build the guest image (tests/support/images/guest_image/build.sh); the
# kvm_hypervisor role's community.libvirt modules and apt module run on the host's own python3,
# which needs python3-libvirt, python3-lxml and python3-apt; curl is the crawler in the
# end-to-end test; shellcheck and git are used by ansible-test sanity. squid is the real proxy the
# probe and privacy tests run in their own network namespaces (tests/support/netns/squid.py), never as
# the machine's service; openssl hashes the test proxies' passwords (`openssl passwd`). prometheus
# ships promtool, which checks and unit-tests controller/manifests/monitoring's alerting rules; its
# server must not run (held back like squid below).
APT_PACKAGES=(
    libvirt-daemon-system libvirt-clients libvirt-dev pkg-config gcc python3-dev python3-venv
    qemu-system-x86 qemu-utils openssh-server openssh-client dnsmasq-base iproute2 iptables util-linux
    debootstrap fdisk extlinux syslinux-common
    # apt-ftparchive: the local package repository of the kvm_hypervisor_vm molecule scenario.
    apt-utils
    python3-libvirt python3-lxml python3-apt curl
    git shellcheck
    squid openssl
    prometheus
    # buildah (vfs storage, chroot isolation: no daemon, no fuse-overlayfs) builds
    # controller/Containerfile in the image test, crun runs the result.
    buildah crun
)

die() {
    echo "setup.sh: $*" >&2
    exit 1
}

# Run a noisy command with its output kept in a log that is shown only when it fails.
quietly() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "failed: $*"
    fi
    rm -f "$log"
}

install_apt_packages() {
    local package missing=()
    for package in "${APT_PACKAGES[@]}"; do
        if [[ $(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null) != installed ]]; then
            missing+=("$package")
        fi
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    [[ $EUID -eq 0 ]] || die "missing Debian packages (${missing[*]}); run as root to install them"
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    quietly apt-get update
    # Debian's squid starts as a service on install; the tests run their own instances in
    # namespaces, and a machine-wide squid on :3128 would be an open proxy nobody asked for.
    # invoke-rc.d and deb-systemd-invoke ask /usr/sbin/policy-rc.d first (argument: the init
    # script or unit); 101 means "forbidden", 0 "allowed", as without a policy. Only squid is
    # held back, so every other package behaves as before; an existing policy (a container's)
    # is left as it is.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [[ ! -e $policy ]]; then
        # shellcheck disable=SC2016 # "$1" is the policy script's own argument, written literally
        printf '%s\n' '#!/bin/sh' '# scripts/setup.sh: squid must not start as a service during this install' \
            'case "$1" in squid | squid.service | prometheus | prometheus.service) exit 101 ;; esac' 'exit 0' >"$policy"
        chmod 0755 "$policy"
        own_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    quietly apt-get install -y --no-install-recommends "${missing[@]}"
    if ((own_policy)); then
        rm -f "$policy"
        trap - EXIT
    fi
    # Not started is not enough under systemd: the package also enables it for the next boot.
    if [[ " ${missing[*]} " == *" squid "* && -d /run/systemd/system ]]; then
        systemctl disable --quiet squid.service || true
    fi
    if [[ " ${missing[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
        systemctl disable --quiet prometheus.service || true
    fi
}

python_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

make_venv() {
    local wanted
    command -v "$PYTHON" >/dev/null || die "PYTHON=$PYTHON not found"
    wanted=$(python_version "$PYTHON")
    if [[ -x $VENV/bin/python ]] && [[ $(python_version "$VENV/bin/python" 2>/dev/null) == "$wanted" ]]; then
        return
    fi
    # A venv of another Python (or a broken one) is replaced, not patched.
    echo "setup.sh: creating .venv with $PYTHON (Python $wanted)"
    rm -rf "$VENV"
    quietly "$PYTHON" -m venv "$VENV"
}

install_requirements() {
    # The stamp holds the hash of what pip installs from: pip runs again only when it changes.
    local stamp=$VENV/.requirements.sha256 digest
    digest=$(cat "$ROOT/requirements.txt" "$ROOT/requirements-test.txt" "$ROOT/constraints.txt" "$ROOT/controller/pyproject.toml" \
        "$ROOT/clients/python/pyproject.toml" | sha256sum | cut -d' ' -f1)
    if [[ -f $stamp && $(<"$stamp") == "$digest" ]]; then
        return
    fi
    echo "setup.sh: installing requirements-test.txt, the controller and the crawler client into .venv"
    quietly "$VENV/bin/python" -m pip install --disable-pip-version-check -r "$ROOT/requirements-test.txt" \
        -c "$ROOT/constraints.txt"
    # Editable, so the `egress-proxies` command runs this tree; its dependencies are the pins above.
    quietly "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps -e "$ROOT/controller"
    # The crawler's client (egress-proxies-client) the same way; its Scrapy is pinned above.
    quietly "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps -e "$ROOT/clients/python"
    echo "$digest" >"$stamp"
}

# The current ansible-core line (requirements-current.txt: 2.21, which needs Python >= 3.12) in
# its own venv, .venv-current, on Python 3.13: scripts/test.sh runs ansible-test sanity and the
# module tests there too. The runtime pins are requirements.txt's, but for ansible-core; the whole
# tree is pinned by constraints-current.txt. PYTHON_CURRENT picks the interpreter (default: the
# python3.13 on PATH, else pyenv's, which CI machines and these development machines have).
make_current_venv() {
    local venv=$ROOT/.venv-current python=${PYTHON_CURRENT:-} stamp digest
    if [[ -z $python ]]; then
        python=$(command -v python3.13 || true)
        local candidate
        for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
            [[ -x $candidate ]] && python=$candidate  # several 3.13.x: the last in name order
        done
    fi
    [[ -n $python && -x $(command -v "$python") ]] ||
        die "no Python 3.13 for .venv-current (ansible-core 2.21 needs >= 3.12); set PYTHON_CURRENT"
    if [[ ! -x $venv/bin/python || $(python_version "$venv/bin/python" 2>/dev/null) != "$(python_version "$python")" ]]; then
        echo "setup.sh: creating .venv-current with $python (Python $(python_version "$python"))"
        rm -rf "$venv"
        quietly "$python" -m venv "$venv"
    fi
    stamp=$venv/.requirements.sha256
    digest=$(cat "$ROOT/requirements.txt" "$ROOT/requirements-current.txt" "$ROOT/constraints-current.txt" \
        "$ROOT/controller/pyproject.toml" | sha256sum | cut -d' ' -f1)
    if [[ -f $stamp && $(<"$stamp") == "$digest" ]]; then
        return
    fi
    echo "setup.sh: installing requirements-current.txt and the controller into .venv-current"
    grep -v '^ansible-core==' "$ROOT/requirements.txt" >"$venv/runtime-requirements.txt"
    quietly "$venv/bin/python" -m pip install --disable-pip-version-check -r "$venv/runtime-requirements.txt" \
        -r "$ROOT/requirements-current.txt" -c "$ROOT/constraints-current.txt"
    quietly "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps -e "$ROOT/controller"
    mkdir -p "$venv/collections/ansible_collections/crawl"
    ln -sfn "$ROOT" "$venv/collections/ansible_collections/crawl/egress_proxies"
    echo "$digest" >"$stamp"
}

# The oldest Scrapy line the crawler client supports (requirements-scrapy-2.13.txt) in a small venv
# of its own, .venv-scrapy-2.13, on .venv's Python: Scrapy, its pinned tree
# (constraints-scrapy-2.13.txt) and the client, editable, nothing else. scripts/test.sh's
# clients-scrapy-2.13 step runs the middleware and scenario crawls' `scrapy runspider` there; pytest
# and the tests' support stay .venv's. Its pins are .venv's but Scrapy's and Twisted's, so pip's
# cache serves it; it has no pip of its own (.venv's installs into it with --python, pip >= 22.3):
# 17 s instead of 30 s on a warm machine (load 3.5, 2 cores shared).
make_scrapy_oldest_venv() {
    local venv=$ROOT/.venv-scrapy-2.13 stamp digest
    if [[ ! -x $venv/bin/python || $(python_version "$venv/bin/python" 2>/dev/null) != "$(python_version "$PYTHON")" ]]; then
        echo "setup.sh: creating .venv-scrapy-2.13 with $PYTHON"
        rm -rf "$venv"
        quietly "$PYTHON" -m venv --without-pip "$venv"
    fi
    stamp=$venv/.requirements.sha256
    digest=$(cat "$ROOT/requirements-scrapy-2.13.txt" "$ROOT/constraints-scrapy-2.13.txt" "$ROOT/clients/python/pyproject.toml" |
        sha256sum | cut -d' ' -f1)
    if [[ -f $stamp && $(<"$stamp") == "$digest" ]]; then
        return
    fi
    echo "setup.sh: installing requirements-scrapy-2.13.txt and the crawler client into .venv-scrapy-2.13"
    quietly "$VENV/bin/python" -m pip --python "$venv/bin/python" install --disable-pip-version-check \
        -r "$ROOT/requirements-scrapy-2.13.txt" -c "$ROOT/constraints-scrapy-2.13.txt"
    quietly "$VENV/bin/python" -m pip --python "$venv/bin/python" install --disable-pip-version-check --no-deps \
        --no-build-isolation -e "$ROOT/clients/python"
    echo "$digest" >"$stamp"
}

link_collection() {
    # Ansible (and mypy, pytest) find crawl.egress_proxies through this link, so the source
    # tree is what runs: export ANSIBLE_COLLECTIONS_PATH=$ROOT/.venv/collections.
    local parent=$VENV/collections/ansible_collections/crawl
    mkdir -p "$parent"
    ln -sfn "$ROOT" "$parent/egress_proxies"
}

install_apt_packages
make_venv
install_requirements
link_collection
make_current_venv
make_scrapy_oldest_venv
"$ROOT/.venv-scrapy-2.13/bin/python" -c '
import scrapy, egress_proxies_client.scrapy_middleware
assert scrapy.__version__.startswith("2.13."), scrapy.__version__' || die "the .venv-scrapy-2.13 cannot import Scrapy 2.13 and the client"
"$ROOT/.venv-current/bin/python" -c 'import ansible, ansible_runner, libvirt, yaml, kubernetes, egress_proxies' ||
    die "the .venv-current cannot import its requirements"
"$VENV/bin/python" -c 'import ansible, ansible_runner, libvirt, pycdlib, yaml, kubernetes, prometheus_client, egress_proxies, egress_proxies_client.scrapy_middleware' ||
    die "the .venv cannot import its requirements"
# How long this run took (bash's SECONDS: since the script started), for scripts/test.sh's report
# to hold against setup's budget.
echo "$SECONDS" >"$VENV/.setup-seconds"
echo "setup.sh: ready (.venv: Python $(python_version "$VENV/bin/python"), ${SECONDS} s)"
