"""Files parsed once while they stay as they are.

A directory of 10,000 Proxies is 20,000 files, and a sweep lists it twice: reading and parsing
them all each time would be the sweep. :class:`ParsedFiles` keeps what each file parsed to with
the file's stamp, what ``os.stat`` said of it when it was read (inode, size, mtime, ctime), and
parses it again only when the stamp has changed. That is enough to notice every change:

- A write to the file, a ``chmod``, an ``os.utime`` all set its ctime to the kernel's clock,
  and nothing in user space can set ctime back (``touch -r``, ``cp -p``, ``rsync -t`` restore
  mtime only), so a change a tick or more after the read gives another ctime.
- A file put in its place by a rename (an editor's save, ``write_file``) is another inode.
- A file gone raises ``FileNotFoundError`` and loses its entry.

What a stamp cannot tell apart is two writes within one tick of the filesystem's clock that
leave the same size: the kernel's coarse clock ticks every 1-10 ms (recent kernels refine a
timestamp that was looked at, on some filesystems only), ext3 and HFS+ keep whole seconds,
FAT's mtime two. Git calls such a file "racily clean". So, as git does, an entry is kept only
when the file was already ``SETTLED_NS`` old (mtime and ctime) when it was read: any write
after that read is stamped later than the times kept. A file written within the window is read
again at each look until it is older. The window is measured on this host's clock: a filesystem
whose times run behind it by more than the window (a network filesystem's server, a clock
stepped back) could have a file trusted too early.

Not thread-safe: its owner serialises calls (``DirectoryStore.lock``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from time import time_ns
from typing import Generic, TypeVar

T = TypeVar("T")

# How old a file must be when it is read for its parse to be used again without reading it.
# Two seconds covers FAT's 2 s mtime, whole-second filesystems and the coarse clock's lag.
SETTLED_NS = 2_000_000_000

Stamp = tuple[int, int, int, int]


def stamp_of(found: os.stat_result) -> Stamp:
    return (found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


@dataclass(frozen=True)
class _Entry(Generic[T]):
    stamp: Stamp
    parsed: T


class ParsedFiles(Generic[T]):
    """What each file parsed to, by path, parsed again only when the file has changed.

    ``parse(path, text)`` makes the result from the file's text (its errors too: invalid YAML,
    the wrong kind of document); ``unreadable(path, error)`` makes it for a file that cannot be
    read or decoded. Results are shared between calls, so they must be treated as read-only:
    whoever hands them on copies what may be changed."""

    def __init__(self, parse: Callable[[Path, str], T],
                 unreadable: Callable[[Path, OSError | UnicodeDecodeError], T]) -> None:
        self._parse = parse
        self._unreadable = unreadable
        self._entries: dict[Path, _Entry[T]] = {}

    def get(self, path: Path) -> T:
        """What ``path`` parses to now. Raises ``FileNotFoundError`` when there is no such file."""
        entry = self._entries.get(path)
        if entry is not None:
            try:
                unchanged = entry.stamp == stamp_of(os.stat(path))
            except FileNotFoundError:
                del self._entries[path]
                raise
            if unchanged:
                return entry.parsed
        return self._read(path)

    def keep_only(self, paths: Collection[Path]) -> None:
        """Forget the files not in ``paths`` (those a listing no longer found)."""
        self._entries = {path: entry for path, entry in self._entries.items() if path in paths}

    def _read(self, path: Path) -> T:
        read_at = time_ns()
        try:
            with open(path) as handle:
                # The stamp of what is read, taken before reading: a write during the read
                # changes the file's stamp after this one, so it is read again next time.
                found = os.fstat(handle.fileno())
                text = handle.read()
        except FileNotFoundError:
            self._entries.pop(path, None)
            raise
        except OSError as error:
            # Not kept: an I/O error may pass without the file changing, and trying again
            # costs one open(2). A file made readable (chmod) is read at the next look.
            self._entries.pop(path, None)
            return self._unreadable(path, error)
        except UnicodeDecodeError as error:
            parsed = self._unreadable(path, error)  # its bytes decide it: kept like a parse
        else:
            parsed = self._parse(path, text)
        if max(found.st_mtime_ns, found.st_ctime_ns) <= read_at - SETTLED_NS:
            self._entries[path] = _Entry(stamp_of(found), parsed)
        else:
            self._entries.pop(path, None)  # written too recently to be told apart from a rewrite
        return parsed
