"""Parameterized modules: prompts as learnable state, like weights in torch.nn.

A `plait.Parameter` registers itself on the module that owns it, appears in
``named_parameters()`` and ``state_dict()``, and is read when the call runs, so
changing it (by hand here, by an optimizer in training) changes the next run
without rebuilding the pipeline.  Its ``description`` says what the value
controls: an optimizer needs that to rewrite it coherently, so it is required
for a learnable parameter.  (Training itself gets its own example later.)

    python examples/parameterized.py     # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/parameterized.py   # see _resources.py
"""

from __future__ import annotations

from _resources import resources_for

import plait

REQUEST = "How do I keep basil alive on a windowsill?"


class Assistant(plait.Module):
    """An assistant whose instructions are a learnable parameter."""

    def __init__(self, instructions: str) -> None:
        super().__init__()
        self.instructions = plait.Parameter(
            instructions,
            description="The assistant's core behaviour and tone; stable but improvable.",
        )
        self.llm = plait.LLMInference("assistant", max_tokens=48)

    def forward(self, request: str) -> str:
        return self.llm(f"{self.instructions}\n\nUser: {request}")


if __name__ == "__main__":
    pipeline = Assistant("Answer in one short sentence.")
    pipeline.bind(resources=resources_for(pipeline))
    for name, param in pipeline.named_parameters():
        print(f"parameter {name}: {param.value!r} ({param.description})")
    print("before:", pipeline.run_sync(REQUEST))

    # What an optimizer step (or loading a trained checkpoint) does: new values, same modules.
    pipeline.load_state_dict({"instructions": "Answer with a numbered list of three tips."})
    print("state:", pipeline.state_dict())
    print("after:", pipeline.run_sync(REQUEST))
