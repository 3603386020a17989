"""One run at a time per checkpoint and per output file.

Two runs of the same command at once would both pay for every call and interleave
their outputs.  Each takes an exclusive ``flock`` on a file it owns for the run.
The kernel drops the lock when its holder exits, however it exits (kill -9
included), so a lock is never stale; the holder's pid is written into the lock
file only so that the refusal can name who holds it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["Busy", "hold"]


class Busy(RuntimeError):
    """Another process (named by pid when known) holds the lock."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"{path} is locked by {holder}")


def hold(path: Path, *, record_pid: bool = True) -> int:
    """Take the exclusive lock on ``path`` (created if missing; its contents are kept
    unless ``record_pid``); returns the descriptor that holds it, or raises `Busy`."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = "another process"
        if record_pid:
            try:
                pid = os.pread(fd, 32, 0).decode().strip()
            except (OSError, UnicodeDecodeError):
                pid = ""
            if pid.isdigit():
                holder = f"process {pid}"
        os.close(fd)
        raise Busy(path, holder) from None
    except BaseException:
        os.close(fd)
        raise
    if record_pid:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
