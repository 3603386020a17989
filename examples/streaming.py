"""Streaming: handle each input's result as soon as it is ready.

Inside ``ExecutionSettings(streaming=True)``, calling a module on a batch returns
an async iterator of `plait.BatchResult`s in completion order (fastest first;
``preserve_order=True`` gives input order).  Each result carries the input's
``index``, the ``input`` itself, and either its ``output`` or the ``error`` that
stopped it: one failed input never costs the others their results.  What a
server or a progress bar wants.  ``pipeline.stream(batch)`` is the same without
the settings block.

    python examples/streaming.py         # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/streaming.py    # see _resources.py
"""

from __future__ import annotations

import asyncio

from _resources import resources_for

import plait

QUESTIONS = [
    "What is the capital of France?",
    "What colour is the sky on a clear day?",
    "How many legs does a spider have?",
    "What do bees make?",
    "What is frozen water called?",
]


class Answer(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt="Answer in a few words.", temperature=0, max_tokens=16
        )

    def forward(self, question: str) -> str:
        return self.llm(question)


async def main() -> None:
    pipeline = Answer()
    async with plait.ExecutionSettings(resources=resources_for(pipeline), streaming=True):
        async for result in pipeline(QUESTIONS):
            if result.ok:
                print(f"[{result.index}] {result.input} -> {result.output}")
            else:
                print(f"[{result.index}] {result.input} failed: {result.error}")


if __name__ == "__main__":
    asyncio.run(main())
