#!/usr/bin/env bash
# The README's first command: the controller on the embedded default (a directory of Proxies)
# making a real proxy VM on a KVM hypervisor in a network namespace on this machine, checked
# from the crawler's side (discovery, curl -x -> 204 with credentials, 407 without), then
# removed again. `--fast`: the seconds-long run on libvirt's test driver (boots nothing).
# Everything is in scripts/demo.py; this only finds the venv. Needs root and scripts/setup.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$ROOT/.venv
[[ -x $VENV/bin/egress-proxies ]] || {
    echo "demo.sh: $VENV is not set up; run: bash scripts/setup.sh" >&2
    exit 1
}
export PATH=$VENV/bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$VENV/collections
# exec: Ctrl-C reaches the Python process alone, which cleans up everything it started.
exec "$VENV/bin/python" "$ROOT/scripts/demo.py" "$@"
