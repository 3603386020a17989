"""Append-only JSON Lines files that survive being killed mid-write.

Checkpoints and recordings both append one record per line with a single
``write`` on an ``O_APPEND`` descriptor, so a process killed at any instant
leaves whole records and at most one torn line at the end, which the next
reader drops before anything is appended after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["json_line", "whole_lines"]


def json_line(record: dict[str, Any]) -> bytes:
    """One record as a compact JSON line, ready for a single ``os.write``."""
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    try:
        return (text + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate: UTF-8 has no form for it, JSON escapes do
        return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def whole_lines(path: Path) -> bytes:
    """The file's complete lines; a torn last line is cut off the file itself."""
    raw = path.read_bytes()
    end = raw.rfind(b"\n") + 1
    if end < len(raw):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    return raw[:end]
