"""Small pipelines for the `plait` command's tests, loaded by the command as TARGETs.

`Gated` holds inputs at a gate so a test can interrupt a run at a known point:
with ``PLAIT_TEST_GATE=N`` in the environment, the N-th input to reach the gate
(and every later one) waits there forever, after announcing ``GATE`` on stderr.
The run can then only end by being interrupted, however fast or slow the machine
is; without the variable the gate lets everything through, so the very same
command resumes the run.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import plait
from tests.pipelines import Echo


class Tagged(plait.Module):
    """One call whose system prompt is a constructor argument (so key=value reaches it)."""

    def __init__(self, tag: str = "T", alias: str = "fast") -> None:
        super().__init__()
        self.llm = Echo(tag, alias=alias)

    def forward(self, text: str) -> Any:
        return self.llm(text)


class Pair(plait.Module):
    """A forward with two parameters: objects with these keys are spread into them."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = Echo("P")

    def forward(self, question: str, context: str = "none") -> Any:
        return self.llm(f"{question} / {context}")


def make_tagged(tag: str = "F") -> Tagged:
    """A function target: TARGET may name a factory instead of a class."""
    return Tagged(tag)


class Gate(plait.Module):
    passed = 0

    async def forward(self, text: str) -> str:
        Gate.passed += 1
        limit = int(os.environ.get("PLAIT_TEST_GATE", "0"))
        if limit and Gate.passed >= limit:
            if Gate.passed == limit:
                print("GATE", file=sys.stderr, flush=True)
            await asyncio.Event().wait()  # until the run is cancelled
        return text


class Gated(plait.Module):
    """A call, the gate, then another call: interrupted inputs have work on both sides."""

    def __init__(self) -> None:
        super().__init__()
        self.before = Echo("B")
        self.gate = Gate()
        self.after = Echo("A")

    def forward(self, text: str) -> Any:
        return self.after(self.gate(self.before(text)))
