"""Sequences: step-by-step scans with an explicit state, and documents longer than one call.

`Recurrence` scans a step over a sequence (chunks, turns, records) while carrying
a state, unrolled into the traced graph so the steps run as early as they can and
learn through backward; `Refine` (a running answer, chunk by chunk) and
`MapReduce` (every chunk at once, then a tree of combines) read a long document;
`chunk_text` cuts it where the text pauses.
"""

from plait.sequences.chunking import WordPieces, chunk_text
from plait.sequences.modules import MapReduce, Refine
from plait.sequences.recurrence import Recurrence

__all__ = ["MapReduce", "Recurrence", "Refine", "WordPieces", "chunk_text"]
