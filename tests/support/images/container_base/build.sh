#!/usr/bin/env bash
# Build the local stand-in for controller/Containerfile's base image (docker.io/library/
# debian:12.11-slim), for image builds where no registry is reachable, into OUTDIR:
#
#   bash tests/support/images/container_base/build.sh OUTDIR PACKAGE...   # as root; OUTDIR empty
#
# OUTDIR then holds:
#   rootfs.tar   a Debian 12 minbase root filesystem, slimmed as Debian's -slim images are
#                (debuerreotype's slimify and minimizing config): no docs, man pages or locales
#                from dpkg, no services started by package scripts, apt caches cleaned;
#   debs/        a flat, signed-by-nobody repository (Packages, Release) of PACKAGE... and
#                everything they need on that root filesystem, downloaded with apt (which checks
#                Debian's signatures) here, once;
#   packages     the root filesystem's packages (name<TAB>version).
# The root filesystem's only apt source is `deb [trusted=yes] file:/mnt/egress-proxies-debs ./`:
# an image build bind-mounts debs/ there (`buildah build --volume DIR/debs:/mnt/egress-proxies-debs`),
# so the Containerfile's unchanged `apt-get update && apt-get install` runs with no network.
# tests/support/images/container_image.py caches OUTDIR keyed by this file and the package list.
set -euo pipefail

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
REPO_MOUNT=/mnt/egress-proxies-debs

# Mounts are made in a private mount namespace, so none outlives the build, even killed.
if [[ -z ${EGP_CONTAINER_BASE_UNSHARED:-} ]]; then
    EGP_CONTAINER_BASE_UNSHARED=1 exec unshare --mount --propagation private bash "${BASH_SOURCE[0]}" "$@"
fi

die() {
    echo "build.sh: $*" >&2
    exit 1
}

log() {
    printf 'build.sh: [%4ds] %s\n' "$SECONDS" "$*"
}

(($# >= 2)) || die "usage: build.sh OUTDIR PACKAGE..."
OUT=$(realpath "$1")
shift
PACKAGES=("$@")
[[ -d $OUT && -z $(ls -A "$OUT") ]] || die "$OUT must be an existing empty directory"
[[ $EUID -eq 0 ]] || die "must run as root (debootstrap, chroot)"
for tool in debootstrap apt-ftparchive; do
    command -v "$tool" >/dev/null || die "$tool not found; run scripts/setup.sh"
done

ROOTFS=$OUT/rootfs
cleanup() {
    local status=$?
    umount --recursive "$ROOTFS/proc" 2>/dev/null || true
    rm -rf "$ROOTFS"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

in_rootfs() {
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C DEBIAN_FRONTEND=noninteractive "$@"
}

log "debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR"
mount -t proc proc "$ROOTFS/proc"

log "slimming as Debian's -slim images are"
# debuerreotype-minimizing-config: no service starts inside an image build.
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
printf 'force-unsafe-io\n' >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
printf 'Acquire::Languages "none";\n' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
# debuerreotype-slimify: dpkg leaves these out of every package installed later, and what is
# there already goes now (copyright files stay).
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
CFG
find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
rm -rf "$ROOTFS/usr/share/man"/* "$ROOTFS/usr/share/info"/* "$ROOTFS/usr/share/groff"/* \
    "$ROOTFS/usr/share/lintian/overrides"/*

log "downloading ${PACKAGES[*]} and what they need"
# The sources a debian:12 image has: the release, its updates and security updates.
cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
SOURCES
in_rootfs apt-get -q update >/dev/null
in_rootfs apt-get -q install --download-only --yes --no-install-recommends "${PACKAGES[@]}" >/dev/null
mkdir "$OUT/debs"
mv "$ROOTFS"/var/cache/apt/archives/*.deb "$OUT/debs/"
(cd "$OUT/debs" && apt-ftparchive packages . >Packages && apt-ftparchive release . >Release)

log "cleaning up"
printf 'deb [trusted=yes] file:%s ./\n' "$REPO_MOUNT" >"$ROOTFS/etc/apt/sources.list"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/partial/*
mkdir -p "$ROOTFS$REPO_MOUNT"
# The build machine's, copied by debootstrap; a container gets its own from the engine.
: >"$ROOTFS/etc/resolv.conf"
rm -f "$ROOTFS/etc/hostname"
: >"$ROOTFS/etc/machine-id"
# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
in_rootfs dpkg-query --show --showformat='${Package}\t${Version}\n' | sort >"$OUT/packages"
umount "$ROOTFS/proc"
# An image's /dev, /proc and /sys are the engine's: only their empty mount points are kept.
tar --create --file "$OUT/rootfs.tar" --numeric-owner --xattrs --directory "$ROOTFS" \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' --exclude='./tmp/*' .
log "done: $(du -sh "$OUT/rootfs.tar" | cut -f1) root filesystem, $(find "$OUT/debs" -name '*.deb' | wc -l) packages"
