"""Splitting a long text into chunks a model can read, with overlap.

Long inputs are this field's everyday sequences: a document too long for one call
is read chunk by chunk (`Refine`) or all chunks at once and then combined
(`MapReduce`).  A chunk should end where the text pauses, so a cut falls at a
paragraph break if one is near the end of the window, else at a sentence end,
else at a space, and only mid-word when a window has none of these.

Sizes are in characters, or in tokens of a tokenizer you give (``encode`` /
``decode``, e.g. a ``tiktoken`` encoding or a model's own); without one,
``unit="tokens"`` counts word pieces (a run of letters or digits, or one other
character, with the spaces after it), which is close to what BPE tokenizers
count on English prose.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

__all__ = ["Tokenizer", "WordPieces", "chunk_text"]

#: Where a cut may fall, best first: a paragraph break, a sentence end, any space.
_BREAKS = (re.compile(r"\n\s*\n"), re.compile(r"[.!?][\"')\]]*\s"), re.compile(r"\s"))
_PIECE = re.compile(r"\w+\s*|[^\w\s]\s*|\s+")


class Tokenizer(Protocol):
    def encode(self, text: str) -> Sequence[Any]: ...

    def decode(self, tokens: Sequence[Any]) -> str: ...


class WordPieces:
    """The default token counter: word pieces, so that ``decode(encode(t)) == t``."""

    def encode(self, text: str) -> list[str]:
        return _PIECE.findall(text)

    def decode(self, tokens: Sequence[Any]) -> str:
        return "".join(tokens)


def chunk_text(
    text: str,
    size: int,
    overlap: int = 0,
    *,
    unit: Literal["chars", "tokens"] = "chars",
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """``text`` cut into chunks of at most ``size`` characters (or tokens), in order.

    Consecutive chunks share at most ``overlap`` units, so a sentence cut at one
    chunk's end is whole at the next one's start, and each chunk starts at least
    ``size - overlap`` units after the previous one, at a word.  Cuts prefer a
    paragraph break, then a sentence end, then a space.  An empty or blank text
    gives no chunks.  Every character of ``text`` is in some chunk.
    """
    if not isinstance(text, str):
        raise TypeError(f"chunk_text() takes text (str), got {type(text).__name__}")
    for name, value, low in (("size", size, 1), ("overlap", overlap, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if overlap >= size:
        raise ValueError(
            f"overlap ({overlap}) must be smaller than size ({size}): each chunk must "
            "move the window forward"
        )
    if unit not in ("chars", "tokens"):
        raise ValueError(f"unit must be 'chars' or 'tokens', got {unit!r}")
    if not text.strip():
        return []
    if unit == "chars":
        if tokenizer is not None:
            raise ValueError("a tokenizer goes with unit='tokens'")
        return _chunks(list(text), size, overlap, "".join)
    coder = tokenizer if tokenizer is not None else WordPieces()
    return _chunks(list(coder.encode(text)), size, overlap, coder.decode)


def _chunks(
    units: list[Any], size: int, overlap: int, join: Callable[[Sequence[Any]], str]
) -> list[str]:
    pieces = [join([unit]) for unit in units]
    chunks = [join(units[start:end]) for start, end in _spans(pieces, size, overlap)]
    return [chunk for chunk in chunks if chunk.strip()]


def _spans(pieces: list[str], size: int, overlap: int) -> list[tuple[int, int]]:
    """The chunks as ``(start, end)`` unit indices.

    A chunk ending at ``end`` is followed by one starting at the first word start at
    or after ``start + size - overlap``, so each chunk advances by at least
    ``size - overlap`` units and the count stays near ``len / (size - overlap)``:
    moving only past the overlap made a 1,645-character text 199 chunks one
    character apart.  The cut is the best break between that next start and the
    window's end; only when that zone holds no break at all (an overlap shorter
    than a word, e.g. no overlap) does the chunk end at a break in the window's
    last half instead, and the next one start right there, rather than mid-word.
    """
    spans: list[tuple[int, int]] = []
    step = size - overlap
    start = reached = 0
    while start < len(pieces):
        end = min(start + size, len(pieces))
        if end >= len(pieces):
            spans.append((start, end))
            break
        # A cut at or before the previous chunk's end would repeat text already read.
        cut = _cut(pieces, start, end, max(start + step - 1, reached))
        if cut is None:
            cut = _cut(pieces, start, end, max(start + max(1, size // 2), reached))
        if cut is None:
            cut = end
        spans.append((start, cut))
        reached = cut
        start = cut if cut <= start + step else _word_start(pieces, start + step, cut)
    return spans


def _word_start(pieces: list[str], begin: int, end: int) -> int:
    """The first index in ``[begin, end]`` where a word starts (a unit with a letter
    in it, after a space or starting with one: tokenizers put the space before or
    after the word); ``end`` when that is the only one, ``begin`` when there is none."""
    for index in range(begin, end):
        piece, before = pieces[index], pieces[index - 1] if index > 0 else " "
        if piece.strip() and (piece[0].isspace() or (before and before[-1].isspace())):
            return index
    if end >= len(pieces) or (end > 0 and pieces[end - 1][-1:].isspace()):
        return end
    return begin


def _cut(pieces: list[str], start: int, end: int, floor: int) -> int | None:
    """The best end for the window ``pieces[start:end]``: just after the last break of the
    best kind that ends on a unit boundary after ``floor``; None when there is none."""
    boundaries: dict[int, int] = {}  # character offset in the window -> unit index
    offset = 0
    for index in range(start, end):
        offset += len(pieces[index])
        if index + 1 > floor:
            boundaries[offset] = index + 1
    window = "".join(pieces[start:end])
    for kind in _BREAKS:
        ends = [m.end() for m in kind.finditer(window) if m.end() in boundaries]
        if ends:
            return boundaries[max(ends)]
    return None
