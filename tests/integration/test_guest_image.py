"""The guest image cache and the images themselves, without booting them.

The end-to-end test (test_kvm_end_to_end.py) boots both variants; here the build (or the cached
result) is checked for what that test relies on: two qcow2 images whose checksums match, and
package lists that say qemu-guest-agent is in ``agent`` and only there. The cache's rules
(the key follows the script, one build for concurrent callers, nothing half-built kept, old
keys pruned) are checked with a stand-in build script in a temporary cache root.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.images.cache import PRUNE_AFTER
from support.images.guest_image import BUILD_SCRIPT, VARIANTS, cache_key, cached_build, guest_image, installed_packages

# The image builds run in scripts/test.sh's side stream, before the tests that boot the image.
pytestmark = pytest.mark.vm

# Writes one marker file and counts its runs in $RUNS; $FAIL makes it fail half-way.
FAKE_SCRIPT = """\
set -eu
echo run >>"$RUNS"
sleep "${PAUSE:-0}"
echo partial >"$1/partial"
[ -z "${FAIL:-}" ] || exit 3
echo done >"$1/done"
"""


@pytest.fixture
def fake_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A stand-in build script and the file counting its runs."""
    script = tmp_path / "build.sh"
    script.write_text(FAKE_SCRIPT)
    runs = tmp_path / "runs"
    monkeypatch.setenv("RUNS", str(runs))
    return script, runs


def run_count(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


# --- the images ---------------------------------------------------------------------------------


@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", VARIANTS)
def test_image_is_a_standalone_qcow2_with_its_checksum(variant: str) -> None:
    image = guest_image(variant)

    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(image.path)],
                                     check=True, capture_output=True, text=True).stdout)
    assert info["format"] == "qcow2"
    assert "backing-filename" not in info
    assert info["virtual-size"] == 2 * 1024**3
    digest = hashlib.sha256()
    with open(image.path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    assert image.sha256 == digest.hexdigest()
    assert image.url == image.path.as_uri()
    assert image.path.parent.name == cache_key(BUILD_SCRIPT.read_bytes())


@pytest.mark.timeout(900)
def test_only_the_agent_variant_has_the_guest_agent() -> None:
    agent, no_agent = (installed_packages(variant) for variant in VARIANTS)

    for packages in (agent, no_agent):
        assert {"cloud-init", "squid", "linux-image-amd64", "udev", "ifupdown", "isc-dhcp-client"} <= packages.keys()
    assert "qemu-guest-agent" in agent
    assert "qemu-guest-agent" not in no_agent
    # One debootstrap run: the variants differ in the agent alone, version for version.
    assert {name: version for name, version in agent.items() if name != "qemu-guest-agent"} == no_agent


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown guest image variant 'agentless'"):
        guest_image("agentless")


# --- the cache ----------------------------------------------------------------------------------


def test_key_follows_the_script_content() -> None:
    script = BUILD_SCRIPT.read_bytes()

    assert cache_key(script + b"\n") != cache_key(script)
    assert cache_key(script.replace(b"squid", b"squid3", 1)) != cache_key(script)


def test_built_once_then_reused_and_rebuilt_when_the_script_changes(
        tmp_path: Path, fake_build: tuple[Path, Path]) -> None:
    script, runs = fake_build
    cache = tmp_path / "cache"

    first = cached_build(cache, script)
    assert cached_build(cache, script) == first
    assert run_count(runs) == 1
    assert first.name == cache_key(script.read_bytes())
    assert (first / "done").is_file()
    assert (first / "build.log").is_file()

    script.write_text(FAKE_SCRIPT + "# changed\n")
    second = cached_build(cache, script)
    assert second != first
    assert run_count(runs) == 2
    # The older key was in use a moment ago: not pruned.
    assert first.is_dir()


def test_concurrent_callers_share_one_build(tmp_path: Path, fake_build: tuple[Path, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    script, runs = fake_build
    monkeypatch.setenv("PAUSE", "1")
    cache = tmp_path / "cache"

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: cached_build(cache, script), range(3)))

    assert len(set(results)) == 1
    assert run_count(runs) == 1


def test_a_failed_build_leaves_nothing_cached(tmp_path: Path, fake_build: tuple[Path, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    script, runs = fake_build
    cache = tmp_path / "cache"
    monkeypatch.setenv("FAIL", "1")

    with pytest.raises(RuntimeError, match=r"(?s)guest image build failed with status 3"):
        cached_build(cache, script)
    # The log stays for a person to read, until the next build clears it.
    log = f".building-{cache_key(script.read_bytes())}.log"
    assert sorted(entry.name for entry in cache.iterdir()) == [log, ".lock"]

    monkeypatch.delenv("FAIL")
    built = cached_build(cache, script)
    assert run_count(runs) == 2
    assert sorted(entry.name for entry in built.iterdir()) == ["build.log", "done", "partial"]
    assert sorted(entry.name for entry in cache.iterdir()) == [".lock", built.name]


def test_a_killed_build_is_cleared_by_the_next_one(tmp_path: Path, fake_build: tuple[Path, Path]) -> None:
    """A build that died without cleaning up (SIGKILL) left its staging directory behind."""
    script, _ = fake_build
    cache = tmp_path / "cache"
    stale = cache / ".building-0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "disk.raw").write_bytes(b"half")

    built = cached_build(cache, script)

    assert sorted(entry.name for entry in cache.iterdir()) == [".lock", built.name]


def test_keys_unused_for_a_day_are_pruned_after_a_build(tmp_path: Path, fake_build: tuple[Path, Path]) -> None:
    script, _ = fake_build
    cache = tmp_path / "cache"
    old, recent = cache / "00000000000000aa", cache / "00000000000000bb"
    for key_dir in (old, recent):
        key_dir.mkdir(parents=True)
    long_ago = time.time() - PRUNE_AFTER - 60
    os.utime(old, (long_ago, long_ago))

    built = cached_build(cache, script)

    assert sorted(entry.name for entry in cache.iterdir()) == sorted([".lock", built.name, recent.name])
