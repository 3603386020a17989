"""Fan-in: one LLM call that waits for several others and combines them.

`Synthesizer` uses `MultiPerspective` (from fan_out.py) as a child module.  The
f-string below is built from outputs that do not exist yet while plait traces
``forward``; plait records that the synthesis depends on all three, runs the
three concurrently, and sends the synthesis once they have all answered.

    python examples/fan_in.py            # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/fan_in.py       # see _resources.py
"""

from __future__ import annotations

from _resources import resources_for
from fan_out import DOCUMENT, MultiPerspective

import plait


class Synthesizer(plait.Module):
    """Analyze from three perspectives, then synthesize them into one report."""

    def __init__(self) -> None:
        super().__init__()
        self.analyzer = MultiPerspective()
        self.synthesizer = plait.LLMInference(
            "smart",
            system_prompt="Synthesize these perspectives into one short report.",
            max_tokens=160,  # a report of three analyses is longer than each
        )

    def forward(self, text: str) -> str:
        perspectives = self.analyzer(text)
        combined = "\n\n".join(
            f"## {name.title()} perspective\n{analysis}" for name, analysis in perspectives.items()
        )
        return self.synthesizer(combined)


if __name__ == "__main__":
    pipeline = Synthesizer()
    pipeline.bind(resources=resources_for(pipeline))
    print(pipeline.run_sync(DOCUMENT))
