"""run() and ExecutionSettings: where run options come from, and which one wins.

Run options (``resources``, ``max_concurrent``, ``checkpoint_dir``,
``streaming``, ...) can be given in four places.  The highest one wins:

1. the call itself: ``await plait.run(module, x, checkpoint_dir=...)``, or
   ``await module(x, checkpoint_dir=...)``;
2. ``module.bind(...)``;
3. the innermost ``with ExecutionSettings(...)`` block, which inherits whatever
   it does not set from the blocks around it;
4. the defaults.

To make the winner visible, every run here writes its checkpoint (the log that
makes a batch resumable) into whichever ``checkpoint_dir`` won, and the script
prints where that was.  Resources come from the outer settings block in every
case, since nothing closer sets them.

    python examples/run_and_settings.py   # on the embedded local model
    PLAIT_EXAMPLES_BASE_URL=... python examples/run_and_settings.py   # see _resources.py
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from _resources import resources_for

import plait

QUESTION = "Name one planet."


class Answer(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", temperature=0, max_tokens=12)

    def forward(self, question: str) -> str:
        return self.llm(question)


async def report(label: str, root: Path, run: Awaitable[Any]) -> None:
    """Await one run and print which checkpoint directory it wrote to."""
    before = {p.name for p in root.iterdir()}
    output = await run
    written = sorted({p.name for p in root.iterdir()} - before)
    print(f"{label:<44} -> {', '.join(written)}/  ({output!r})")


async def main() -> None:
    plain = Answer()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = plait.ExecutionSettings(
            resources=resources_for(plain), max_concurrent=4, checkpoint_dir=root / "settings"
        )
        async with settings:
            await report("ExecutionSettings only", root, plain(QUESTION))
            async with plait.ExecutionSettings(checkpoint_dir=root / "inner"):
                await report("inner ExecutionSettings beats outer", root, plain(QUESTION))
            await report(
                "run(..., checkpoint_dir=) beats settings",
                root,
                plait.run(plain, QUESTION, checkpoint_dir=root / "run"),
            )
            bound = Answer().bind(checkpoint_dir=root / "bound")
            await report("bind(checkpoint_dir=) beats settings", root, bound(QUESTION))
            await report(
                "call-time checkpoint_dir= beats bind()",
                root,
                bound(QUESTION, checkpoint_dir=root / "call"),
            )


if __name__ == "__main__":
    asyncio.run(main())
