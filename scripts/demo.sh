#!/usr/bin/env bash
# The embedded default: the controller on the KVM provider, with no cluster and no hypervisor.
#
# A libvirtd serving libvirt's test driver (in a private mount namespace, so the host's own
# libvirt state is never touched) stands in for a KVM host named "beelink"; the example Proxies
# in controller/examples/ are read from a directory, the controller sweeps them through
# ansible-runner and the real kvm_proxy modules until every one is Ready, and prints them.
# Needs root (mount namespace) and scripts/setup.sh first. Cleans up after itself.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
[[ -x $VENV/bin/egress-proxies ]] || {
    echo "demo.sh: $VENV is not set up; run: bash scripts/setup.sh" >&2
    exit 1
}
export PATH=$VENV/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$VENV/collections

demo=$(mktemp -d "${TMPDIR:-/tmp}/egress-proxies-demo.XXXXXX")
daemon_pid=
cleanup() {
    if [[ -n $daemon_pid ]]; then
        kill -- "-$daemon_pid" 2>/dev/null || kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$demo"
}
trap cleanup EXIT

mkdir -p "$demo/sock" "$demo/proxies" "$demo/work"
cat >"$demo/libvirtd.conf" <<EOF
unix_sock_dir = "$demo/sock"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
EOF
setsid unshare --mount --propagation private sh -c \
    "mount -t tmpfs tmpfs /run && exec libvirtd --config '$demo/libvirtd.conf' --pid-file '$demo/libvirtd.pid'" \
    >"$demo/libvirtd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
    [[ -S $demo/sock/libvirt-sock ]] && break
    sleep 0.1
done
[[ -S $demo/sock/libvirt-sock ]] || { echo "demo.sh: libvirtd did not start:" >&2; tail "$demo/libvirtd.log" >&2; exit 1; }
uri="test+unix:///default?socket=$demo/sock/libvirt-sock"

# A real (empty) qcow2 stands in for the cloud image; it is downloaded from a file:// URL and
# its sha256 is checked like any other.
qemu-img create -q -f qcow2 "$demo/debian-12.qcow2" 64M
sha=$(sha256sum "$demo/debian-12.qcow2" | cut -d' ' -f1)
cat >"$demo/providers.yaml" <<EOF
owner: demo
providers:
- name: home-kvm
  type: kvm
  # libvirt's test driver boots nothing and makes its addresses up: never probe them.
  probe: none
  kvm:
    hosts:
    - {name: beelink, uri: "$uri", pool: default-pool, network: default, domainType: qemu}
    images:
      debian-12: {url: "file://$demo/debian-12.qcow2", sha256: "$sha", format: qcow2}
    machineTypes:
      small: {vcpus: 1, memoryMiB: 1024, diskGiB: 10}
EOF
cp "$ROOT"/controller/examples/*.yaml "$demo/proxies/"

echo "== egress-proxies: $(ls "$demo/proxies" | wc -l) example Proxies on a KVM host served by libvirt's test driver"
egress-proxies --source directory --proxy-dir "$demo/proxies" --provider-config "$demo/providers.yaml" \
    --work-dir "$demo/work" --until-ready 120
echo
echo "== status written beside the first Proxy ($(ls "$demo/proxies" | grep status | head -1)):"
sed -n '/^status:/,$p' "$(ls "$demo"/proxies/*.status.yaml | head -1)"
