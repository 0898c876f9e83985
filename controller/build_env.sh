#!/usr/bin/env bash
# Build the controller's runtime: PREFIX/venv (requirements.txt pinned by constraints.txt, and the
# controller package; command PREFIX/venv/bin/egress-proxies) and PREFIX/collections
# (crawl.egress_proxies installed from the artifact `ansible-galaxy collection build` makes,
# without its dependencies: they serve the roles and playbooks, the controller runs only the
# collection's own modules). Three steps, so an image build caches the slow one and needs no
# network at all:
#
#   bash controller/build_env.sh wheelhouse SRC DIR           # on the host, with PyPI access
#   bash controller/build_env.sh deps SRC PREFIX WHEELHOUSE   # venv + pinned requirements, offline
#   bash controller/build_env.sh app SRC PREFIX WHEELHOUSE    # controller + collection, then trim
#
# `wheelhouse` downloads every pinned requirement (wheels; libvirt-python only as its source,
# PyPI has no wheel) plus the pinned build backend into DIR, with the image's Python (PYTHON,
# default python3, must be the image's 3.11: the wheels are chosen for the interpreter that
# downloads them). `deps` and `app` install from DIR only (--no-index), so they run the same in
# a network-less image build and anywhere else. `deps` reads nothing of SRC but requirements.txt
# and constraints.txt, which is why controller/Containerfile can run it before copying the
# sources; it compiles libvirt-python (gcc, pkg-config, libvirt-dev and python3-dev needed
# there), whose result needs only python3 and libvirt0.
#
# `app` ends by trimming what a runtime never uses (the image's 400 MB budget): pip, setuptools
# and wheel (nothing installs into the image later), ansible-core's bundled ansible-test, the
# kubernetes client's asyncio copy, test suites and type stubs shipped inside packages, and the
# extension modules' symbols. Bytecode stays but for the kubernetes client's: the root filesystem
# is read-only in the Deployment, so bytecode not compiled here would be compiled again by every
# ansible-playbook process the controller starts.
#
# tests/packaging/test_controller_image.py builds the image with exactly these steps.
set -euo pipefail

# The image's Python; the wheelhouse holds wheels for it only.
IMAGE_PYTHON=3.11
# The build backend pip installs (offline, from the wheelhouse) to build libvirt-python's source
# and the controller package, at constraints.txt's pin (the one pin: a second one here once
# disagreed with it and no wheelhouse could be resolved). The controller's pyproject.toml states
# license as an SPDX expression, which needs setuptools >= 77.
BUILD_BACKEND=(setuptools)

die() {
    echo "build_env.sh: $*" >&2
    exit 2
}

usage() {
    die "usage: $0 wheelhouse SRC DIR | deps SRC PREFIX WHEELHOUSE | app SRC PREFIX WHEELHOUSE"
}

PYTHON=${PYTHON:-python3}

python_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

# pip of PREFIX's venv, offline, from the wheelhouse only.
offline_pip() {
    "$PREFIX/venv/bin/python" -m pip --disable-pip-version-check --no-cache-dir install --quiet \
        --no-index --find-links "$WHEELHOUSE" "$@"
}

wheelhouse() {
    local version work
    version=$(python_version "$PYTHON")
    [[ $version == "$IMAGE_PYTHON" ]] ||
        die "$PYTHON is Python $version; the image runs $IMAGE_PYTHON, whose wheels the wheelhouse must hold (set PYTHON=python$IMAGE_PYTHON)"
    work=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: $work is local
    trap "rm -rf '$work'" EXIT
    # A throwaway venv: the host's own Python may have no pip, and nothing is installed anywhere.
    "$PYTHON" -m venv "$work/venv"
    mkdir -p "$DIR"
    "$work/venv/bin/python" -m pip --disable-pip-version-check download --quiet --dest "$DIR" \
        -r "$SRC/requirements.txt" -c "$SRC/constraints.txt" "${BUILD_BACKEND[@]}"
}

deps() {
    "$PYTHON" -m venv "$PREFIX/venv"
    offline_pip -r "$SRC/requirements.txt" -c "$SRC/constraints.txt"
}

app() {
    local work site
    [[ -x $PREFIX/venv/bin/python ]] || die "$PREFIX/venv does not exist: run the deps step first"
    work=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: $work is local
    trap "rm -rf '$work'" EXIT
    # From a copy: building in place would leave build/ and *.egg-info in SRC.
    cp -r "$SRC/controller" "$work/controller"
    rm -rf "$work/controller"/*.egg-info "$work/controller/build"
    offline_pip --no-deps "$work/controller"

    "$PREFIX/venv/bin/ansible-galaxy" collection build --output-path "$work/dist" "$SRC" >/dev/null
    "$PREFIX/venv/bin/ansible-galaxy" collection install --offline --no-deps -p "$PREFIX/collections" \
        "$work"/dist/crawl-egress_proxies-*.tar.gz >/dev/null

    # The trim (see the header). pip goes last: it uninstalls the others, then itself.
    "$PREFIX/venv/bin/python" -m pip --disable-pip-version-check uninstall --quiet --yes setuptools wheel pip \
        2>/dev/null || true
    site=$("$PREFIX/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$site"/pip "$site"/pip-* "$site"/setuptools "$site"/setuptools-* "$site"/_distutils_hack \
        "$site"/distutils-precedence.pth "$site"/pkg_resources "$site"/wheel "$site"/wheel-*
    # ansible-test: the sanity and unit test runner bundled with ansible-core, a developer tool.
    rm -rf "$site"/ansible_test "$PREFIX/venv/bin/ansible-test"
    # The kubernetes client's asyncio twin, kubernetes.aio (68 MB with its bytecode, half the
    # package): nothing imports it (no module of the synchronous client the controller uses, nor
    # kubernetes/__init__.py). Its aiohttp stays installed, as the package's metadata requires.
    rm -rf "$site"/kubernetes/aio
    # The kubernetes client's bytecode (24 MB): only the controller process imports the client,
    # once, and compiling what it loads from source added 0.5 s to its start (measured); every
    # other package keeps its bytecode, as the header says.
    find "$site"/kubernetes -depth -type d -name __pycache__ -exec rm -rf {} +
    # Test suites inside installed packages (jsonschema's, referencing's, ...), but not
    # ansible/plugins/test: Jinja2 test plugins, which playbooks use.
    find "$site" -depth -type d \( -name tests -o -name test -o -name e2e_test \) \
        -not -path "$site/ansible/*" -exec rm -rf {} +
    # Type stubs: for type checkers, never read at run time.
    find "$site" -name '*.pyi' -delete
    # Symbol tables and debug information of extension modules (libvirt-python is compiled with
    # Debian's -g; several wheels ship unstripped): 15 MB. strip comes with gcc (binutils) in
    # the image's build stage; elsewhere the step is skipped.
    if command -v strip >/dev/null; then
        find "$PREFIX/venv" -name '*.so' -type f -exec strip --strip-unneeded {} +
    fi
    [[ ! -e $site/pip ]] || die "pip is still in $site"
}

[[ $# -ge 1 ]] || usage
step=$1
shift
case $step in
wheelhouse)
    [[ $# == 2 ]] || usage
    SRC=$(cd "$1" && pwd)
    DIR=$2
    wheelhouse
    ;;
deps | app)
    [[ $# == 3 ]] || usage
    SRC=$(cd "$1" && pwd)
    PREFIX=$2
    WHEELHOUSE=$(cd "$3" && pwd)
    "$step"
    ;;
*) usage ;;
esac
