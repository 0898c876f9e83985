#!/usr/bin/env bash
# Run `ansible-test sanity` on the collection as it ships: the artifact scripts/build_collection.sh
# makes, unpacked.
#
# ansible-test insists on a tree at .../ansible_collections/<namespace>/<name>, and writes its
# results under tests/output inside it, so it runs on a throwaway tree. Each sanity test gets its
# own venv, installed from PyPI by ansible-test and cached in ~/.ansible/test/venv between runs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Which ansible-core line: .venv (2.19, Python 3.11) unless VENV names another, e.g.
# VENV=$ROOT/.venv-current (2.21, Python 3.13); each line has its tests/sanity/ignore-<version>.txt.
VENV=${VENV:-$ROOT/.venv}
[[ -x $VENV/bin/ansible-test ]] || {
    echo "sanity.sh: $VENV/bin/ansible-test missing; run scripts/setup.sh first" >&2
    exit 1
}
export PATH=$VENV/bin:$PATH
PY_VERSION=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# ansible-test makes each venv without pip, then runs a get-pip.py bootstrap script that it
# downloads from ci-files.testing.ansible.com, a host this network cannot reach. It looks in
# its cache first, so put there a script that does the same job from PyPI's pip wheel.
# A real get-pip.py already in the cache is left alone; ours is recognised by its marker.
install_pip_bootstrap() {
    local pip_version cache script wheel marker="# egress-proxies: get-pip stand-in"
    pip_version=$("$VENV/bin/python" -c '
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$PY_VERSION"'"))["pip"])')
    cache=$HOME/.ansible/test/cache
    script=$cache/get_pip_${pip_version//./_}.py
    wheel=$cache/pip-$pip_version-py3-none-any.whl
    mkdir -p "$cache"
    if [[ ! -f $wheel ]]; then
        "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: --dest "$cache" "pip==$pip_version" 2>&1 |
            { grep -v "^WARNING: Location '" || true; }
        [[ -f $wheel ]] || { echo "sanity.sh: could not fetch pip $pip_version from PyPI" >&2; exit 1; }
    fi
    if [[ -f $script ]] && ! grep -qF "$marker" "$script"; then
        return
    fi
    cat >"$script" <<PYTHON
$marker
# Run as get-pip.py is: its arguments are pip-install arguments plus --no-setuptools and
# --no-wheel, which only get-pip.py knows. pip runs from its own wheel, as get-pip.py does.
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "pip-$pip_version-py3-none-any.whl"))
from pip._internal.cli.main import main  # noqa: E402

ARGS = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", "--no-index", "--find-links", HERE] + ARGS))
PYTHON
}

work=$(mktemp -d "${TMPDIR:-/tmp}/egress-proxies-sanity.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/ansible_collections/crawl/egress_proxies
mkdir -p "$tree/tests"
# What galaxy.yml's build_ignore keeps out of the artifact (the pytest suite, the controller
# package, helper scripts) is not collection content, and is held to ruff and mypy instead.
ANSIBLE_GALAXY=$VENV/bin/ansible-galaxy bash "$ROOT/scripts/build_collection.sh" "$work" >/dev/null
tar -C "$tree" -xzf "$work"/crawl-egress_proxies-*.tar.gz
# The ignore files (tests/sanity/ignore-<ansible-core version>.txt) are not part of the artifact.
cp -r "$ROOT/tests/sanity" "$tree/tests/"
# With a git repository, ansible-test tests exactly the files git would track; not its own
# output (tests/output, where it also puts its venvs).
echo /tests/output/ >"$tree/.gitignore"
git -C "$tree" init --quiet
git -C "$tree" add --all

install_pip_bootstrap

# pip's progress and this machine's pip.conf warnings are noise; ansible-test's own lines stay.
noise='^(WARNING: Location |Looking in (indexes|links)|Collecting |Processing |  Downloading |  Using cached |Installing collected |Successfully installed |Requirement already satisfied| +━)'
cd "$tree"
set +e
ansible-test sanity --python "$PY_VERSION" --venv --requirements --color no --truncate 0 2>&1 |
    grep -Ev "$noise"
status=${PIPESTATUS[0]}
set -e
exit "$status"
