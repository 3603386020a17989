"""Pipelines `tests/test_serve.py` serves with ``plait serve``."""

from __future__ import annotations

import json
from typing import Any

import plait


class Answer(plait.Module):
    """Answers a question in the style asked for, in one LLM call."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = plait.LLMInference("fast", system_prompt="Be brief.")

    def forward(self, question: str, style: str = "plain") -> str:
        return self.reply(f"{style}: {question}")


class Parse(plait.Module):
    """Reads a score from a reply's last word, as pipeline code that parses replies does:
    ``nan`` and ``inf`` make a float JSON cannot carry, ``cut`` a reply whose JSON held
    half an emoji (a lone surrogate)."""

    def forward(self, text: str) -> dict[str, Any]:
        word = text.rsplit(" ", 1)[-1]
        if word == "cut":
            return {"text": text + json.loads('"\\ud83d"'), "score": 0.0}
        return {"text": text, "score": float(word) if word in ("nan", "inf") else 1.0}


class Rated(plait.Module):
    """An answer and its score (a float): one LLM call, then code that parses it."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = plait.LLMInference("fast", system_prompt="Be brief.")
        self.parse = Parse()

    def forward(self, question: str) -> dict[str, Any]:
        return self.parse(self.reply(question))


class Several(plait.Module):
    """One LLM call per question of an input: an input that makes many calls."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = plait.LLMInference("fast", system_prompt="Be brief.")

    def forward(self, questions: list[str]) -> list[str]:
        return [self.reply(question) for question in questions]


class Private(plait.Module):
    """A forward parameter named with a leading underscore, which no request can set."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = plait.LLMInference("fast")

    def forward(self, question: str, _trace: str = "") -> str:
        return self.reply(question)
