"""What a training run spends its calls on: the phase each call is made in.

A run's calls serve different ends: running the minibatch, proposing new values
(an instruction rewriter, a reflection), evaluating candidates on examples, and
scoring the held-out test set once training ends.  Optimizers and the `Trainer`
mark each stretch of work with `phase`, so what was spent can be told apart per
step and per optimizer; `current_phase` is what a call made now belongs to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["PHASES", "current_phase", "phase"]

#: The phases a training run's calls are counted under.
PHASES = ("training", "proposing", "evaluating", "testing")

_CURRENT: ContextVar[str | None] = ContextVar("plait_training_phase", default=None)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the calls made inside the block (and the tasks it starts) under ``name``.

    Phases nest: the innermost one is the phase of a call.

    Args:
        name: One of `PHASES`.

    Yields:
        Nothing; the block runs in the phase.

    Raises:
        ValueError: ``name`` is not one of `PHASES`.
    """
    if name not in PHASES:
        raise ValueError(f"unknown training phase {name!r}: use one of {', '.join(PHASES)}")
    token = _CURRENT.set(name)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_phase() -> str | None:
    """The phase a call made now is counted under (None outside every `phase` block).

    Returns:
        The innermost enclosing phase's name, or None.
    """
    return _CURRENT.get()
