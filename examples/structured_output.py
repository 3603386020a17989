"""Structured output: ask for a pydantic model, get a validated instance back.

``response_format`` sends the model's JSON schema with the request (the local
model is constrained to it by a grammar); the reply is validated, re-asked once
with the validation error if it does not match, and returned as the typed
object.  Bounded fields (``max_length``, ``Literal``) keep a small model's reply
short enough to finish within ``max_tokens``.

    python examples/structured_output.py   # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/structured_output.py   # see _resources.py
"""

from __future__ import annotations

from typing import Literal

from _resources import resources_for
from pydantic import BaseModel, Field

import plait

REVIEWS = [
    "The blender is powerful and easy to clean. Five stars.",
    "The blender leaked on day one and support never answered.",
]


class ReviewSummary(BaseModel):
    product: str = Field(max_length=30, description="The product reviewed, in a few words.")
    sentiment: Literal["positive", "negative", "mixed"]


class Summarize(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt="Summarize the product review.",
            temperature=0,
            max_tokens=64,
            response_format=ReviewSummary,
        )

    def forward(self, review: str) -> ReviewSummary:
        return self.llm(review)


if __name__ == "__main__":
    pipeline = Summarize()
    pipeline.bind(resources=resources_for(pipeline))
    for summary in pipeline.run_sync(REVIEWS):
        assert isinstance(summary, ReviewSummary)  # a typed object, not a string
        print(repr(summary))
