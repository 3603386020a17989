"""Sequences: step-by-step scans with an explicit state, and long documents (seed 001).

`Recurrence` is seed 001's ``RecurrenceBase`` for LLM pipelines; `Refine` and
`MapReduce` read a document longer than one call; `chunk_text` cuts it up.
"""

from plait.sequences.chunking import WordPieces, chunk_text
from plait.sequences.modules import MapReduce, Refine
from plait.sequences.recurrence import Recurrence

__all__ = ["MapReduce", "Recurrence", "Refine", "WordPieces", "chunk_text"]
