"""Files that are replaced whole: a reader sees the old content or the new, never half of it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, content: str | bytes, durable: bool = True) -> None:
    """Write `content` (text as UTF-8) to a temp file beside `path`, fsync, rename over it,
    fsync the directory. `durable=False` skips both fsyncs: a reader still sees the old file or
    the new one, whole, but a crash of the machine may bring back the old one (for what the
    next write renews)."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            if durable:
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
