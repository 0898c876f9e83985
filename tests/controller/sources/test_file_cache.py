"""sources/file_cache.py: a file's parse is used again only while its stamp (inode, size, mtime,
ctime) is the one it had when read, and only if it was older than the racy window then.

Real files on the test machine's filesystem; the clock is moved forward (``settled``, in
conftest.py) where a test needs parses trusted at once, as they are for files older than the
window."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from egress_proxies.sources.file_cache import ParsedFiles


class Counting:
    """A ParsedFiles whose parses are counted, by path."""

    def __init__(self) -> None:
        self.parsed: list[str] = []
        self.files = ParsedFiles(self.parse, self.unreadable)

    def parse(self, path: Path, text: str) -> str:
        self.parsed.append(path.name)
        return text

    def unreadable(self, path: Path, error: OSError | UnicodeDecodeError) -> str:
        self.parsed.append(path.name)
        return f"unreadable: {type(error).__name__}"


def rewrite_in_place(path: Path, text: str) -> None:
    """Same inode, same size (``text`` as long as what it replaces), the mtime put back: what
    ``cp -p`` or ``rsync -t`` over an open file leave, or two saves within one clock tick."""
    before = path.stat()
    with path.open("r+") as handle:
        handle.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.usefixtures("settled")
def test_an_unchanged_file_is_parsed_once(tmp_path: Path) -> None:
    cache = Counting()
    (tmp_path / "a.yaml").write_text("one")
    assert [cache.files.get(tmp_path / "a.yaml") for _ in range(3)] == ["one"] * 3
    assert cache.parsed == ["a.yaml"]


@pytest.fixture
def read_once(tmp_path: Path) -> tuple[Counting, Path]:
    """A cache that has read ``a.yaml`` (``3128``) once."""
    cache = Counting()
    path = tmp_path / "a.yaml"
    path.write_text("3128")
    assert cache.files.get(path) == "3128"
    return cache, path


def test_a_file_written_within_the_racy_window_is_read_at_every_look(read_once: tuple[Counting, Path]) -> None:
    cache, path = read_once
    # Only the ctime can tell, and within one tick of a coarse filesystem clock it cannot: the
    # file is too recent to be trusted, so it is read again.
    rewrite_in_place(path, "3129")
    assert cache.files.get(path) == "3129"
    assert cache.files.get(path) == "3129"
    assert cache.parsed == ["a.yaml"] * 3


@pytest.mark.usefixtures("settled")
def test_a_rewrite_that_puts_the_mtime_back_is_seen_by_its_ctime(read_once: tuple[Counting, Path]) -> None:
    cache, path = read_once
    time.sleep(0.05)  # past a tick of the kernel's coarse clock (at most 10 ms)
    rewrite_in_place(path, "3129")
    assert cache.files.get(path) == "3129"


@pytest.mark.usefixtures("settled")
def test_a_file_renamed_over_is_seen_and_a_deleted_one_forgotten(tmp_path: Path,
                                                                  read_once: tuple[Counting, Path]) -> None:
    cache, path = read_once
    before = path.stat()
    (tmp_path / "new").write_text("3129")
    os.utime(tmp_path / "new", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(tmp_path / "new", path)  # same size and mtime; another inode
    assert cache.files.get(path) == "3129"
    path.unlink()
    with pytest.raises(FileNotFoundError):
        cache.files.get(path)
    (tmp_path / "b.yaml").write_text("b")
    cache.files.get(tmp_path / "b.yaml")
    cache.files.keep_only(set())  # a listing that found neither
    assert cache.files._entries == {}


@pytest.mark.usefixtures("settled")
def test_what_a_files_bytes_decide_is_kept_a_failed_read_is_not(tmp_path: Path) -> None:
    cache = Counting()
    (tmp_path / "latin1.yaml").write_bytes(b"caf\xe9")
    (tmp_path / "dir.yaml").mkdir()  # open(2) fails: EISDIR, as an I/O error would
    for _ in range(2):
        assert cache.files.get(tmp_path / "latin1.yaml") == "unreadable: UnicodeDecodeError"
        assert cache.files.get(tmp_path / "dir.yaml") == "unreadable: IsADirectoryError"
    assert sorted(cache.parsed) == ["dir.yaml", "dir.yaml", "latin1.yaml"]
    (tmp_path / "latin1.yaml").write_text("café")  # fixed: another size, another ctime
    (tmp_path / "dir.yaml").rmdir()
    (tmp_path / "dir.yaml").write_text("a file now")
    assert cache.files.get(tmp_path / "latin1.yaml") == "café"
    assert cache.files.get(tmp_path / "dir.yaml") == "a file now"
