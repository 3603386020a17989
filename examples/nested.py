"""Nested composition: modules built from modules, flattened into one graph.

`DeepPipeline` reuses the modules of the other examples as its stages; the third
stage is itself nested two deep.  However deep the nesting, plait records only
the leaf LLM calls, in one dependency graph, and runs each call as soon as its
inputs exist.  The script prints that graph's calls, then the result.

    python examples/nested.py            # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/nested.py       # see _resources.py
"""

from __future__ import annotations

from _resources import resources_for
from fan_in import Synthesizer
from fan_out import DOCUMENT, MultiPerspective
from sequential import SummarizeAndAnalyze

import plait
from plait.tracing import trace


class DeepPipeline(plait.Module):
    """Summarize and analyze, look at the analysis from three sides, then synthesize."""

    def __init__(self) -> None:
        super().__init__()
        self.stage1 = SummarizeAndAnalyze()  # 2 calls, one after the other
        self.stage2 = MultiPerspective()  # 3 concurrent calls
        self.stage3 = Synthesizer()  # 3 concurrent calls, then 1

    def forward(self, text: str) -> str:
        analysis = self.stage1(text)
        perspectives = self.stage2(analysis)
        return self.stage3(perspectives["user"])


if __name__ == "__main__":
    pipeline = DeepPipeline()
    # Tracing records forward() without calling any model: only to show the graph.
    graph = trace(pipeline, (DOCUMENT,))
    calls = [node.path for node in graph.nodes if node.kind == "module"]
    print(f"{len(calls)} LLM calls in one graph: {', '.join(calls)}")

    pipeline.bind(resources=resources_for(pipeline))
    print(pipeline.run_sync(DOCUMENT))
