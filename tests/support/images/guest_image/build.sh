#!/usr/bin/env bash
# Build the Debian 12 guest images the end-to-end tests boot, into OUTDIR:
#
#   bash tests/support/images/guest_image/build.sh OUTDIR     # as root; OUTDIR exists and is empty
#
# OUTDIR then holds, per variant (agent, no-agent): <variant>.qcow2, <variant>.qcow2.sha256
# (sha256sum's format) and <variant>.packages (the installed packages, "name<TAB>version").
# tests/support/images/guest_image.py runs this and caches OUTDIR keyed by this file's sha256, so any
# edit here means a rebuild: keep everything the image depends on inside this one file.
#
# The image boots from its own disk as a cloud image does (the KVM provider has no kernel-boot
# option): an MBR disk, one ext4 partition, extlinux. grub is not used because grub-install
# probes devices through udev, which this machine does not run. Inside: systemd, udev,
# cloud-init (NoCloud), squid, and in the agent variant qemu-guest-agent. Nothing is fetched at
# boot: the image has no apt sources, so a cloud-config `packages:` entry or the vendor-data
# agent install fails at once instead of waiting on a mirror the isolated network cannot reach.
set -euo pipefail

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
# Virtual size; the provider's overlays are max(machine type's disk, this). The system takes
# about 820 MiB of it.
DISK_SIZE=2G
# The partition starts at 1 MiB, the usual alignment, which leaves room for mbr.bin.
PART_START_SECTOR=2048
# Beyond minbase (essential + apt). Notes on the less obvious ones:
# - python3-cffi-backend: cloud-init needs it (through python3-cryptography) but debootstrap's
#   simple resolver does not pull it in;
# - ifupdown: cloud-init renders its fallback network config (DHCP on the first NIC) as
#   /etc/network/interfaces.d/50-cloud-init when no netplan is installed; cloud-init itself
#   depends on isc-dhcp-client, the DHCP client ifupdown runs;
# - udev: starts qemu-guest-agent when the virtio port appears (the unit is static), names the
#   NIC, and resolves root=UUID= in the initramfs.
PACKAGES=(
    systemd-sysv udev linux-image-amd64 initramfs-tools e2fsprogs
    ifupdown isc-dhcp-client iproute2
    cloud-init python3-cffi-backend
    squid qemu-guest-agent
)
# The no-agent variant is the agent variant with this package purged.
AGENT_PACKAGE=qemu-guest-agent

# Mounts are made in a private mount namespace, so none outlives the build, even killed.
if [[ -z ${EGP_GUEST_IMAGE_UNSHARED:-} ]]; then
    EGP_GUEST_IMAGE_UNSHARED=1 exec unshare --mount --propagation private bash "${BASH_SOURCE[0]}" "$@"
fi

die() {
    echo "build.sh: $*" >&2
    exit 1
}

log() {
    printf 'build.sh: [%4ds] %s\n' "$SECONDS" "$*"
}

(($# == 1)) || die "usage: build.sh OUTDIR"
OUT=$(realpath "$1")
[[ -d $OUT && -z $(ls -A "$OUT") ]] || die "$OUT must be an existing empty directory"
[[ $EUID -eq 0 ]] || die "must run as root (loop devices, mounts, chroot)"
for tool in debootstrap sfdisk partx losetup mkfs.ext4 extlinux qemu-img; do
    command -v "$tool" >/dev/null || die "$tool not found; run scripts/setup.sh"
done
MBR=/usr/lib/syslinux/mbr/mbr.bin
[[ -f $MBR ]] || die "$MBR not found (package syslinux-common); run scripts/setup.sh"

WORK=$OUT/work
RAW=$WORK/disk.raw
ROOTFS=$WORK/rootfs
LOOP=

cleanup() {
    local status=$?
    # Children of the chroot (none expected) would keep the mounts busy: lazy as a last resort.
    if mountpoint -q "$ROOTFS" 2>/dev/null; then
        umount --recursive "$ROOTFS" 2>/dev/null || umount --recursive --lazy "$ROOTFS" || true
    fi
    if [[ -n $LOOP ]]; then
        losetup --detach "$LOOP" || true
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
# Without these, a signal would end bash without running the EXIT trap.
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# Attach the disk as $LOOP, its partition as $PART. `losetup --partscan` often creates no
# partition node here; `partx --add` asks the kernel for it explicitly.
attach() {
    local part tries
    LOOP=$(losetup --find --show --partscan "$RAW")
    part=${LOOP}p1
    if [[ ! -b $part ]]; then
        partx --add "$LOOP"
    fi
    for ((tries = 0; tries < 50; tries++)); do
        [[ -b $part ]] && break
        sleep 0.1
    done
    [[ -b $part ]] || die "no partition device $part for $LOOP"
    PART=$part
}

detach() {
    losetup --detach "$LOOP"
    LOOP=
}

# The filesystems the chroot's commands need.
mount_api() {
    mount -t proc proc "$ROOTFS/proc"
    mount -t sysfs sysfs "$ROOTFS/sys"
    mount --bind /dev "$ROOTFS/dev"
}

unmount_rootfs() {
    # Returns the deleted files' blocks to the sparse file, so qemu-img writes no stale data.
    fstrim "$ROOTFS"
    umount --recursive "$ROOTFS"
}

mount_rootfs() {
    mount "$PART" "$ROOTFS"
    mount_api
}

in_rootfs() {
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"
}

# Write the image's variant files: its package list, then the qcow2 and its checksum.
export_variant() {
    local variant=$1
    # shellcheck disable=SC2016 # dpkg-query's format, not the shell's
    in_rootfs dpkg-query --show --showformat='${Package}\t${Version}\n' | sort >"$OUT/$variant.packages"
    unmount_rootfs
    detach
    log "converting $variant to qcow2"
    # zstd: a sixth of zlib's time (3.5 s against 21 s here) and a smaller file; QEMU reads it
    # since 5.1.
    qemu-img convert -c -o compression_type=zstd -O qcow2 "$RAW" "$OUT/$variant.qcow2.part"
    mv "$OUT/$variant.qcow2.part" "$OUT/$variant.qcow2"
    (cd "$OUT" && sha256sum "$variant.qcow2" >"$variant.qcow2.sha256")
}

configure_rootfs() {
    local uuid kernel initrd
    uuid=$(blkid --match-tag UUID --output value "$PART")
    printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$uuid" >"$ROOTFS/etc/fstab"

    # Every clone must make its own machine-id (systemd does at first boot when the file is
    # empty): DHCP client identities can derive from it, and clones sharing one were measured
    # to get one and the same address.
    : >"$ROOTFS/etc/machine-id"
    rm -f "$ROOTFS/var/lib/dbus/machine-id"
    # debootstrap copies the build machine's; the guest's comes from DHCP, its name from cloud-init.
    rm -f "$ROOTFS/etc/resolv.conf" "$ROOTFS/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"

    # No apt sources or package lists: see the header.
    rm -rf "$ROOTFS/etc/apt/sources.list" "$ROOTFS/etc/apt/sources.list.d"/*
    rm -rf "$ROOTFS/var/lib/apt/lists"/* "$ROOTFS/var/cache/apt"/*.bin
    in_rootfs apt-get clean

    cat >"$ROOTFS/etc/cloud/cloud.cfg.d/90_egress_proxies_test_image.cfg" <<'CFG'
# The test image's cloud-init settings (tests/support/images/guest_image/build.sh).
# The provider attaches a NoCloud seed (an ISO labelled cidata); nothing else is looked for.
datasource_list: [NoCloud, None]
# minbase generates no locale; cloud-init's schema wants the string "false" to skip it.
locale: "false"
# Keep the (absent) sources: cloud-init would otherwise write a sources.list naming a mirror.
apt:
  preserve_sources_list: true
CFG

    # No SSH server (nor ssh-keygen) in the image: cloud-init's ssh module would only fail to
    # make host keys, with a warning and a traceback per key type.
    grep -qx ' - ssh' "$ROOTFS/etc/cloud/cloud.cfg" || die "cloud.cfg lists no ' - ssh' module to drop"
    sed -i '/^ - ssh$/d' "$ROOTFS/etc/cloud/cloud.cfg"

    # After fstab exists, so the initramfs carries fsck for the root filesystem.
    in_rootfs update-initramfs -u -k all >/dev/null

    kernel=$(cd "$ROOTFS/boot" && echo vmlinuz-*)
    initrd=$(cd "$ROOTFS/boot" && echo initrd.img-*)
    [[ -f $ROOTFS/boot/$kernel && -f $ROOTFS/boot/$initrd ]] || die "expected one kernel in /boot, found: $kernel"
    mkdir -p "$ROOTFS/boot/extlinux"
    # Serial console last, so it is /dev/console: boot logs land on the VM's serial port.
    cat >"$ROOTFS/boot/extlinux/extlinux.conf" <<CFG
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
    LINUX /boot/$kernel
    INITRD /boot/$initrd
    APPEND root=UUID=$uuid ro console=tty0 console=ttyS0,115200n8
CFG
    extlinux --install "$ROOTFS/boot/extlinux"
}

mkdir -p "$ROOTFS"

log "partitioning a $DISK_SIZE disk"
truncate --size "$DISK_SIZE" "$RAW"
printf 'label: dos\nstart=%d, type=83, bootable\n' "$PART_START_SECTOR" | sfdisk --quiet "$RAW"
# mbr.bin boots the partition marked bootable; extlinux's boot sector is written into it.
dd if="$MBR" of="$RAW" bs=440 count=1 conv=notrunc status=none
attach
mkfs.ext4 -q -L root "$PART"
mount "$PART" "$ROOTFS"

log "debootstrap $SUITE from $MIRROR"
# Into the bare filesystem: debootstrap sets up the target's /proc, /sys and /dev itself.
debootstrap --variant=minbase --include="$(IFS=,; echo "${PACKAGES[*]}")" "$SUITE" "$ROOTFS" "$MIRROR"
mount_api

log "configuring"
configure_rootfs
export_variant agent

log "purging $AGENT_PACKAGE for no-agent"
attach
mount_rootfs
in_rootfs dpkg --purge "$AGENT_PACKAGE"
export_variant no-agent

log "done"
