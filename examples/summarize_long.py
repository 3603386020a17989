"""Sequences: a document longer than one call, summarized both ways.

`RefineSummary` reads the chunks in order and carries a running summary from each
to the next (`plait.Refine`, a `plait.Recurrence`: one call per chunk, each seeing
the summary so far).  `MapReduceSummary` summarizes every chunk at once and then
combines the summaries in a tree of calls, at most three per combine
(`plait.MapReduce`).  Both chunk the bundled document with `plait.chunk_text`.
The same runs from a shell, with a trace that shows each scan's shape (a chain of
calls for Refine, a wide row then a narrowing tree for MapReduce):

    plait run examples/summarize_long.py:RefineSummary \\
        --input examples/data/long_documents.jsonl --output runs/refine.jsonl \\
        --profile runs/refine-trace.json
    plait run examples/summarize_long.py:MapReduceSummary \\
        --input examples/data/long_documents.jsonl --output runs/mapreduce.jsonl \\
        --profile runs/mapreduce-trace.json

    python examples/summarize_long.py    # both, on the embedded local model
"""

from __future__ import annotations

from pathlib import Path

from _resources import resources_for

import plait

DOCUMENT = (Path(__file__).resolve().parent / "data" / "long_document.txt").read_text("utf-8")
CHUNK, OVERLAP = 500, 80


class RefineSummary(plait.Refine):
    """A running summary over the chunks, in order."""

    def __init__(self) -> None:
        super().__init__("fast", chunk_size=CHUNK, overlap=OVERLAP, max_tokens=96)


class MapReduceSummary(plait.MapReduce):
    """Every chunk summarized at once, then combined three at a time."""

    def __init__(self) -> None:
        super().__init__("fast", fan_in=3, chunk_size=CHUNK, overlap=OVERLAP, max_tokens=96)


if __name__ == "__main__":
    chunks = plait.chunk_text(DOCUMENT, CHUNK, OVERLAP)
    print(f"{len(DOCUMENT)} characters in {len(chunks)} chunks")
    for name, pipeline in (("refine", RefineSummary()), ("map-reduce", MapReduceSummary())):
        pipeline.bind(resources=resources_for(pipeline))
        summary = pipeline.run_sync(DOCUMENT)
        print(f"{name}: {' '.join(summary.split())}")
