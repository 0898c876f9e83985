"""Writing a file so that a reader, or a crash, never sees half of it: the one way the sources
write a file (the directory source's records and pool files, the credentials of ``FileSecrets``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_file(path: Path, text: str, mode: int) -> None:
    """Replace ``path`` atomically, the new file with ``mode``. mkstemp creates the temporary file
    0600 (whatever the umask), so its content is never readable by anyone else, not even for a
    moment; fsync before the rename, so a power cut leaves the old file or the new one, never an
    empty one. Named ``.<file>.<random>.tmp``: what a kill mid-write leaves is recognisable (the
    directory source removes its own when the next controller takes the directory)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
