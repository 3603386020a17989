"""Writing one benchmark's section of ``benchmarks/RESULTS.md``, the same way for each."""

from __future__ import annotations

import datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(section: str, command: str, text: str, notes: str = "") -> None:
    """Put ``section`` (its ``## ...`` heading) in RESULTS.md: the day, the command and
    ``text``, then ``notes``; a section already there is replaced whole.

    Args:
        section: The section's heading line.
        command: The command that measured it, as a reader would type it.
        text: The measurement (a table and its caption).
        notes: What the numbers say, kept below them.
    """
    day = datetime.date.today().isoformat()
    block = f"{section}\n\nMeasured {day} with `{command}`:\n\n{text}\n"
    if notes:
        block += f"\n{notes.strip()}\n"
    current = RESULTS.read_text(encoding="utf-8")
    if section in current:
        before, _, rest = current.partition(section)
        after = rest.split("\n## ", 1)
        current = before + block + ("\n## " + after[1] if len(after) > 1 else "")
    else:
        current = current.rstrip("\n") + "\n\n" + block
    RESULTS.write_text(current, encoding="utf-8")
