"""Whole-file writes that a crash cannot tear.

A manifest, a training checkpoint, a saved parameter state or a history is read
back by the next run, which trusts it: a process killed halfway through
rewriting one must leave either the old file or the new one, never half of
each.  The data goes to a temporary file beside the target (same directory, so
same filesystem, so the rename is atomic), is flushed to disk, and only then
renamed over the target.  Append-only logs (the checkpoint log, recordings) are
a different tool: they fsync each record and drop a torn last line on reading.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Replace the file at ``path`` with ``data`` (text is written as UTF-8) so that
    a kill at any instant leaves the old file or the new one; returns the path.

    The parent directory is created when missing.  The temporary file is named
    after the target and hidden (``.name.XXXX.tmp``), so a leftover from a power
    cut is recognisable; on any error it is removed and the error raised.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
