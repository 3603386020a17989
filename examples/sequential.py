"""Sequential composition: one LLM call feeds the next.

``forward`` is plain synchronous code.  plait records the two calls, sees that
the analysis needs the summary, and runs them one after the other.

    python examples/sequential.py        # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/sequential.py   # see _resources.py
"""

from __future__ import annotations

from _resources import resources_for

import plait

DOCUMENT = (
    "The city council approved a plan to turn the old rail yard into a park with a "
    "community garden, a playground and a bike path, to open in two years."
)


class SummarizeAndAnalyze(plait.Module):
    """Summarize a text, then analyze the summary."""

    def __init__(self) -> None:
        super().__init__()
        self.summarizer = plait.LLMInference(
            "fast", system_prompt="Summarize the text in one sentence.", max_tokens=48
        )
        self.analyzer = plait.LLMInference(
            "smart", system_prompt="Name the main theme of this summary.", max_tokens=48
        )

    def forward(self, text: str) -> str:
        summary = self.summarizer(text)
        return self.analyzer(summary)


if __name__ == "__main__":
    pipeline = SummarizeAndAnalyze()
    pipeline.bind(resources=resources_for(pipeline))
    print(pipeline.run_sync(DOCUMENT))
