"""Splitting a long text into chunks a model can read, with overlap.

Long inputs are this field's everyday sequences: a document too long for one call
is read chunk by chunk (`Refine`) or all chunks at once and then combined
(`MapReduce`).  A chunk should end where the text pauses, so a cut falls at a
paragraph break if one is near the end of the window, else at a sentence end,
else at a space, and only mid-word when a window has none of these; and the next
chunk should begin with a little of the one before (the overlap, whole words), so
a thought cut at one chunk's end is whole at the next one's start.

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
    """The default token counter of `chunk_text`: word pieces, close to what BPE tokenizers count.

    A piece is a run of letters or digits, or one other character, with the
    spaces after it, so that ``decode(encode(t)) == t``.

    Examples:
        >>> from plait.sequences import WordPieces
        >>> WordPieces().encode("Hello, world!")
        ['Hello', ', ', 'world', '!']
    """

    def encode(self, text: str) -> list[str]:
        """Cut text into word pieces.

        Args:
            text: The text.

        Returns:
            Its pieces, in order; joined, they are the text.
        """
        return _PIECE.findall(text)

    def decode(self, tokens: Sequence[Any]) -> str:
        """Join pieces back into text.

        Args:
            tokens: Pieces from `encode`.

        Returns:
            The text.
        """
        return "".join(tokens)


def chunk_text(
    text: str,
    size: int,
    overlap: int = 0,
    *,
    unit: Literal["chars", "tokens"] = "chars",
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """Cut a text too long for one call into chunks a model can read, where the text pauses.

    Chunks hold at most ``size`` characters (or tokens), in order.  A chunk ends
    where the text pauses, if it can within reach (the last ``(size - overlap) //
    2`` units of its window): at the last paragraph break there, else the last
    sentence end, else the last space; only a window with none of these is cut
    mid-word, at its end.  With an ``overlap``, the next chunk starts at the first
    word within the last ``overlap`` units of the one before, so consecutive
    chunks share at least one word and at most ``overlap`` units (a text without
    spaces, or with words longer than the overlap, shares ``overlap`` units
    instead).  Each chunk starts at least ``(size - overlap) // 2`` units after
    the one before, so a text makes ``len / (size - overlap)`` to twice that many
    chunks.  Together the chunks cover the whole text, in order; an empty or
    blank text gives none.

    Args:
        text: The text to cut.
        size: The most characters (or tokens) in a chunk, at least 1.
        overlap: The most units consecutive chunks share, from 0 to ``size - 1``.
        unit: ``"chars"``, or ``"tokens"`` of ``tokenizer`` (default `WordPieces`).
        tokenizer: What counts tokens (``encode``/``decode``), with ``unit="tokens"``.

    Returns:
        The chunks, each a substring of ``text`` (for tokens, decoded).

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: ``size`` or ``overlap`` is not a whole number in range (an
            ``overlap`` of ``size`` or more would not move forward), ``unit`` is
            neither, or a tokenizer is given with ``unit="chars"``.

    Examples:
        >>> from plait.sequences import chunk_text
        >>> text = "The parcel left on Monday. It was late.\\n\\nIt arrived on Friday."
        >>> chunk_text(text, size=45)
        ['The parcel left on Monday. It was late.\\n\\n', 'It arrived on Friday.']
        >>> for chunk in chunk_text(text, size=30, overlap=10):
        ...     print(repr(chunk))
        'The parcel left on Monday. '
        'Monday. It was late.\\n\\n'
        'late.\\n\\nIt arrived on Friday.'
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

    A chunk ends at the best break in reach (`_cut`): in the last ``(size - overlap)
    // 2`` units of its window (its last half without overlap), and, with an overlap,
    only where a word starts within ``overlap`` units before the cut, so the next
    chunk can start there and share at least that word.  The next chunk starts at
    the first word start at or after ``cut - overlap``: the overlap is at most
    ``overlap`` units, and each chunk advances at least ``(size - overlap) // 2``
    (moving only a unit or a word on made a 1,645-character text 199 chunks).  A
    window whose reach holds no such break (a text without spaces, very long words)
    is cut at its best break regardless, else at its end, and the next chunk starts
    ``overlap`` units back, at a word if one starts there.
    """
    words = _word_starts(pieces)
    spans: list[tuple[int, int]] = []
    reach = max(1, (size - overlap) // 2)
    start = 0
    while start < len(pieces):
        end = min(start + size, len(pieces))
        if end >= len(pieces):
            spans.append((start, end))
            break
        floor = end - reach
        cut = _cut(pieces, start, end, floor, words if overlap else None, overlap)
        if cut is None and overlap:  # no word to share anywhere in reach: share units
            cut = _cut(pieces, start, end, floor, None, overlap)
        if cut is None:
            cut = end
        spans.append((start, cut))
        start = _next_start(words, start, cut, overlap)
    return spans


def _word_starts(pieces: list[str]) -> list[int]:
    """``counts[i]``: how many words start before unit ``i`` (``len(pieces) + 1`` counts).
    A word starts at a unit with a letter in it, after a space or starting with one
    (tokenizers put the space before or after the word)."""
    counts = [0]
    before = " "
    for piece in pieces:
        starts = bool(piece.strip()) and (piece[0].isspace() or before[-1:].isspace())
        counts.append(counts[-1] + starts)
        before = piece
    return counts


def _shared(words: list[int], start: int, cut: int, overlap: int) -> int:
    """How many words start in the last ``overlap`` units before ``cut`` (after
    ``start``): the words the chunk ending at ``cut`` can share with the next."""
    return words[cut] - words[min(cut, max(cut - overlap, start + 1))]


def _next_start(words: list[int], start: int, cut: int, overlap: int) -> int:
    """Where the chunk after ``[start, cut)`` starts: the first word start in its last
    ``overlap`` units (the most the two may share), else ``overlap`` units back."""
    if not overlap:
        return cut
    begin = max(cut - overlap, start + 1)
    for index in range(begin, cut):
        if words[index + 1] > words[index]:
            return index
    return begin


def _cut(
    pieces: list[str],
    start: int,
    end: int,
    floor: int,
    words: list[int] | None,
    overlap: int,
) -> int | None:
    """The best end for the window ``pieces[start:end]``: just after the last break of the
    best kind that ends on a unit boundary after ``floor`` (and, given the ``words``
    counts, where a word starts in the ``overlap`` units before it); None when there is
    none."""
    boundaries: dict[int, int] = {}  # character offset in the window -> unit index
    offset = 0
    for index in range(start, end):
        offset += len(pieces[index])
        cut = index + 1
        if cut > floor and (words is None or _shared(words, start, cut, overlap)):
            boundaries[offset] = cut
    window = "".join(pieces[start:end])
    for kind in _BREAKS:
        ends = [m.end() for m in kind.finditer(window) if m.end() in boundaries]
        if ends:
            return boundaries[max(ends)]
    return None
