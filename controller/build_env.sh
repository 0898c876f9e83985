#!/usr/bin/env bash
# Build the controller's runtime under PREFIX from the source tree SRC:
#   PREFIX/venv         a virtualenv with requirements.txt (pinned, with constraints.txt) and the
#                       controller package (command: PREFIX/venv/bin/egress-proxies)
#   PREFIX/collections  crawl.egress_proxies, installed from the artifact `ansible-galaxy
#                       collection build` makes, without its dependencies (they serve the roles
#                       and playbooks; the controller runs only the collection's own modules)
#
#   bash controller/build_env.sh SRC PREFIX      # PYTHON=python3.12 to use another interpreter
#
# controller/Containerfile runs exactly this in its build stage, and
# tests/packaging/test_controller_image.py runs it into a temporary PREFIX, so the image's
# Python environment is the one the tests check. Compiling libvirt-python needs gcc,
# pkg-config and libvirt-dev here; the result needs only python3 and libvirt0.
set -euo pipefail

[[ $# == 2 ]] || {
    echo "usage: $0 SRC PREFIX" >&2
    exit 2
}
SRC=$(cd "$1" && pwd)
PREFIX=$2
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m venv "$PREFIX/venv"
pip=("$PREFIX/venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet -r "$SRC/requirements.txt" -c "$SRC/constraints.txt"
# From a copy: building in place would leave build/ and *.egg-info in SRC.
cp -r "$SRC/controller" "$work/controller"
rm -rf "$work/controller"/*.egg-info "$work/controller/build"
"${pip[@]}" install --quiet --no-deps "$work/controller"

"$PREFIX/venv/bin/ansible-galaxy" collection build --output-path "$work/dist" "$SRC" >/dev/null
"$PREFIX/venv/bin/ansible-galaxy" collection install --offline --no-deps -p "$PREFIX/collections" \
    "$work"/dist/crawl-egress_proxies-*.tar.gz >/dev/null
