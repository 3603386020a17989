"""Pipelines `tests/test_serve.py` serves with ``plait serve``."""

from __future__ import annotations

import plait


class Answer(plait.Module):
    """Answers a question in the style asked for, in one LLM call."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = plait.LLMInference("fast", system_prompt="Be brief.")

    def forward(self, question: str, style: str = "plain") -> str:
        return self.reply(f"{style}: {question}")
