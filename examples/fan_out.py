"""Fan-out: several LLM calls on the same input, run concurrently.

The three analyses do not depend on each other, so plait sends them at once
(as far as the endpoint's ``max_concurrent`` allows).  The output keeps the
structure ``forward`` returned: here a dict of three strings.

    python examples/fan_out.py           # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/fan_out.py      # see _resources.py
"""

from __future__ import annotations

from _resources import resources_for

import plait

DOCUMENT = "Our notes app now syncs offline edits and costs $4 a month; lost-note tickets halved."


class MultiPerspective(plait.Module):
    """Analyze one text from three perspectives at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.technical = plait.LLMInference(
            "fast", system_prompt="Analyze from a technical perspective.", max_tokens=48
        )
        self.business = plait.LLMInference(
            "fast", system_prompt="Analyze from a business perspective.", max_tokens=48
        )
        self.user = plait.LLMInference(
            "fast", system_prompt="Analyze from a user's perspective.", max_tokens=48
        )

    def forward(self, text: str) -> dict[str, str]:
        return {
            "technical": self.technical(text),
            "business": self.business(text),
            "user": self.user(text),
        }


if __name__ == "__main__":
    pipeline = MultiPerspective()
    pipeline.bind(resources=resources_for(pipeline))
    for perspective, analysis in pipeline.run_sync(DOCUMENT).items():
        print(f"{perspective}: {analysis}")
