"""What a loss says about one output: a score to track and text to learn from.

A loss's result carries a `Feedback` so the trainer can average scores while
`backward()` sends the text upstream.  The text should name what went wrong
("the answer omits the date"), because every parameter that shaped the output
receives it and an optimizer rewrites prompts from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plait.values import Value

__all__ = ["Feedback", "feedback_text"]


@dataclass(slots=True)
class Feedback:
    """What a loss says about one output: a score to track and a text to learn from.

    The trainer averages the scores; the backward pass sends the text to every
    parameter that shaped the output, and an optimizer rewrites prompts from it,
    so the text should name what went wrong ("the answer omits the date").

    Args:
        score: In [0, 1], higher is better.
        text: What to improve (or what was right).
        details: Anything else the loss keeps for reports (a judge's raw score,
            the strings that were missing); not sent upstream.

    Raises:
        ValueError: ``score`` lies outside [0, 1].

    Examples:
        >>> from plait.learning import Feedback
        >>> print(Feedback(0.5, "the answer omits the date"))
        score 0.50: the answer omits the date
    """

    score: float
    text: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.score) <= 1.0:
            raise ValueError(f"a Feedback score must lie in [0, 1], got {self.score!r}")
        self.score = float(self.score)

    def __str__(self) -> str:
        return f"score {self.score:.2f}: {self.text}"


def feedback_text(payload: Any) -> str:
    """The text a loss's output sends upstream: a `Feedback`'s ``text``, else the
    value as text; a `Value` is read through (a loss's output in train mode is one).

    The backward pass starts from it and a loss's own ``backward`` passes it to the
    output it graded, so both say the same thing about the same output.
    """
    while isinstance(payload, Value):
        payload = payload.payload
    if isinstance(payload, Feedback):
        return payload.text
    return payload if isinstance(payload, str) else str(payload)
