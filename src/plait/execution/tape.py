"""Tapes: what a training-mode call keeps so that `backward()` can walk it later."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from plait.tracing.graph import Graph
from plait.values import Value

__all__ = ["Tape"]

_ids = itertools.count(1)


@dataclass(eq=False)
class Tape:
    """The graph of one input and every node's result, kept alive by the output Value."""

    graph: Graph
    results: dict[int, Value]
    root: Any
    input_index: int
    #: The engine that ran the input: LLM calls a module's ``backward`` makes run on
    #: it, under the same limits, resources and handlers.
    engine: Any = None
    id: str = field(default_factory=lambda: f"tape-{next(_ids)}")
