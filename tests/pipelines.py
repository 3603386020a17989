"""The composition patterns of seed 000, shared by the tests."""

from __future__ import annotations

import os
from typing import Any

import plait


class Echo(plait.LLMInference):
    """An LLM call whose system prompt names it, so replies show the path they took."""

    def __init__(self, tag: str, alias: str = "fast") -> None:
        super().__init__(alias=alias, system_prompt=tag)


class SummarizeAndAnalyze(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.summarizer = Echo("sum")
        self.analyzer = Echo("ana", alias="smart")

    def forward(self, text: str) -> Any:
        return self.analyzer(self.summarizer(text))


class MultiPerspective(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.technical = Echo("tech")
        self.business = Echo("biz")
        self.user = Echo("user")

    def forward(self, text: str) -> dict[str, Any]:
        return {
            "technical": self.technical(text),
            "business": self.business(text),
            "user": self.user(text),
        }


class Synthesizer(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.analyzer = MultiPerspective()
        self.synthesizer = Echo("syn", alias="smart")

    def forward(self, text: str) -> Any:
        perspectives = self.analyzer(text)
        combined = "\n".join(f"{name}: {analysis}" for name, analysis in perspectives.items())
        return self.synthesizer(combined)


class DeepPipeline(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stage1 = SummarizeAndAnalyze()
        self.stage2 = MultiPerspective()
        self.stage3 = Synthesizer()

    def forward(self, text: str) -> Any:
        result1 = self.stage1(text)
        result2 = self.stage2(result1)
        return self.stage3(str(result2["user"]))


class FanOutFanIn(plait.Module):
    """Two parallel calls, then one that combines them (the extract-and-compare shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")

    def forward(self, text: str) -> Any:
        return self.combine(f"{self.left(text)} | {self.right(text)}")


class Assistant(plait.Module):
    def __init__(self, instructions: str = "Be helpful.") -> None:
        super().__init__()
        self.instructions = plait.Parameter(instructions, description="Assistant behaviour.")
        self.llm = plait.LLMInference(alias="fast")

    def forward(self, request: str) -> Any:
        return self.llm(f"{self.instructions}\n\nUser: {request}")


def echo(tag: str, text: str) -> str:
    """What the fake server replies to ``text`` under system prompt ``tag``."""
    return f"[{tag}] {text}"


class Shapes(plait.Module):
    """An output with every structure: dict, list, tuple, nesting, constants, derived text."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Echo("a")

    def forward(self, x: str) -> Any:
        a = self.a(x)
        return {
            "list": [a, 1],
            "tuple": (a, "k"),
            "nested": {"deep": [(a.upper(),)]},
            "const": 3.5,
            "piece": a[0:3],
        }


class TwoSteps(plait.Module):
    """Two calls in a row; an input starting with "hold" parks its *second* call at a
    gate, so its first call has completed (and been logged) when the test acts."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Echo("A")
        self.second = Echo("B")

    def forward(self, doc: str) -> Any:
        gate = " [[gate:hold]]" if doc.startswith("hold") else ""
        return self.second(f"{self.first(doc)}{gate}")


def two_steps(doc: str) -> str:
    return echo("B", echo("A", doc))


class Tagged(plait.Module):
    """Says which pipeline and which process ran its input."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    async def forward(self, text: str) -> str:
        return f"{self.tag}:{text}:{os.getpid()}"
