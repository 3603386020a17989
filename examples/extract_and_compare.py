"""Extract and compare: the quick-start pipeline, over product reviews.

For each review two extractions run concurrently (what the reviewer praises,
what they complain about); a third call waits for both and weighs them into a
one-sentence verdict.  The output is a dict of the three.  ``forward`` takes
one string, so a dataset is one JSON string per line, as in
``examples/data/reviews.jsonl`` (ten short reviews).

Run it over that dataset with the plait command (no key and no server needed:
with no resources configured, plait uses its embedded local model):

    plait run examples/extract_and_compare.py:ExtractAndCompare \\
        --input examples/data/reviews.jsonl --output runs/demo/outputs.jsonl \\
        --profile runs/demo/trace.json

or as a script, which prints one JSON line per review:

    python examples/extract_and_compare.py
    PLAIT_EXAMPLES_BASE_URL=... python examples/extract_and_compare.py   # see _resources.py

``max_tokens`` is 64 so the demo finishes quickly on the small local model (at 32,
two answers in three were cut mid-sentence; at 64, one in three, for about 6 s more
over the ten reviews; at 96 still one in four, for 12 s more: that model often does
not stop by itself, whatever the limit); raise it for a real endpoint.
"""

from __future__ import annotations

import plait


class ExtractAndCompare(plait.Module):
    """Extract a review's praise and complaints in parallel, then weigh them."""

    def __init__(self, max_tokens: int = 64) -> None:
        super().__init__()
        reader = "You read product reviews. Answer in one short phrase."
        self.praise = plait.LLMInference(
            "fast", system_prompt=reader, temperature=0, max_tokens=max_tokens
        )
        self.complaints = plait.LLMInference(
            "fast", system_prompt=reader, temperature=0, max_tokens=max_tokens
        )
        self.compare = plait.LLMInference(
            "smart",
            system_prompt="You are a concise shopping advisor. Answer in one sentence.",
            temperature=0,
            max_tokens=max_tokens,
        )

    def forward(self, review: str) -> dict[str, str]:
        # praise and complaints do not depend on each other: plait runs them concurrently;
        # compare uses both, so it waits for both.
        praise = self.praise(f"Review: {review}\n\nWhat does the reviewer like?")
        complaints = self.complaints(f"Review: {review}\n\nWhat does the reviewer dislike?")
        verdict = self.compare(
            f"Likes: {praise}\nDislikes: {complaints}\n\nIs the product worth buying?"
        )
        return {"praise": praise, "complaints": complaints, "verdict": verdict}


def main() -> None:
    import json
    from pathlib import Path

    # Imported here, not at the top: loading the pipeline class (as `plait run` does)
    # should not depend on the examples' helper; the command configures resources itself.
    from _resources import resources_for

    data = Path(__file__).parent / "data" / "reviews.jsonl"
    reviews = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    pipeline = ExtractAndCompare()
    pipeline.bind(resources=resources_for(pipeline))
    for output in pipeline.run_sync(reviews):
        print(json.dumps(output))


if __name__ == "__main__":
    main()
