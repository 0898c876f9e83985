#!/usr/bin/env bash
# Build the collection artifact (crawl-egress_proxies-<version>.tar.gz) from the files git tracks,
# and from nothing else a checkout has lying around (tool caches, scratch files, a developer's
# notes): `ansible-galaxy collection build` packs every file of its directory that galaxy.yml's
# build_ignore does not name, so it runs on an export of the tracked files instead. Tracked means
# in git's index: a new file is in the artifact once it is `git add`-ed; its content is the
# working tree's, so uncommitted edits are built as they are.
#
#   bash scripts/build_collection.sh [OUTPUT_DIR [ANSIBLE-GALAXY-OPTIONS...]]   # default: the current directory
#   bash scripts/build_collection.sh . --force                              # replace an existing artifact
#
# ansible-galaxy is the one on PATH, or ANSIBLE_GALAXY (scripts/sanity.sh and the tests name
# their virtualenv's).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTPUT=$(realpath "${1:-.}")
GALAXY=${ANSIBLE_GALAXY:-ansible-galaxy}

die() {
    echo "build_collection.sh: $*" >&2
    exit 2
}

git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
    die "$ROOT is not a git checkout; the artifact is built from the files git tracks"
[[ -d $OUTPUT ]] || die "output directory $OUTPUT does not exist"

export_dir=$(mktemp -d "${TMPDIR:-/tmp}/egress-proxies-export.XXXXXX")
trap 'rm -rf "$export_dir"' EXIT
# Tracked files still in the working tree (one deleted but not yet `git rm`-ed is left out), in
# their working-tree state; tar keeps modes and symlinks.
git -C "$ROOT" ls-files -z --cached |
    while IFS= read -r -d '' path; do
        if [[ -e $ROOT/$path || -L $ROOT/$path ]]; then
            printf '%s\0' "$path"
        fi
    done |
    tar -C "$ROOT" --null --no-recursion --files-from=- -cf - |
    tar -C "$export_dir" -xf -
"$GALAXY" collection build --output-path "$OUTPUT" "${@:2}" "$export_dir"
