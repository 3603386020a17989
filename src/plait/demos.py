"""Demonstrations: worked examples an `LLMInference` shows the model before its input.

A small model follows what it sees done far better than what it is told: a few
earlier user/assistant turns that answer the way the task wants teach the format
(and often the task) where no instruction does.  So demonstrations are a
learnable value like a prompt: a `Parameter` whose value is a list of
``{"input": ..., "output": ...}`` pairs, which `BootstrapFewShot` fills from
traces that scored well and which ``state_dict()``, snapshots and checkpoints
carry like any other value.

On the wire each pair becomes a user turn (the input) and an assistant turn (the
output), after the system prompt and before the real input, so a cache or a
checkpoint key (a hash of the messages) changes whenever the demonstrations do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEMOS_DESCRIPTION", "DemoError", "demo_messages", "demo_text", "normalize_demos"]

DEMOS_DESCRIPTION = (
    "Demonstrations: worked input/output pairs shown to the model as earlier "
    "user/assistant turns, before the real input, to teach the task and the answer's "
    "exact form by example."
)


class DemoError(ValueError):
    """A demonstrations value that is not a list of input/output pairs."""


def normalize_demos(value: Any, where: str = "demos") -> list[dict[str, Any]]:
    """``value`` as a list of ``{"input": ..., "output": ...}`` dicts, or `DemoError`.

    Accepted: a list (or tuple) whose items are ``(input, output)`` pairs or
    mappings with exactly the keys ``input`` and ``output``.  Both sides must be
    JSON data (text, numbers, lists, dicts), since demonstrations are saved in
    ``state_dict()``, parameter files and checkpoints.
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise DemoError(
            f"{where} must be a list of input/output pairs, e.g. "
            f'[{{"input": "2+2?", "output": "4"}}] or [("2+2?", "4")], got '
            f"{type(value).__name__}"
        )
    demos: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        if isinstance(item, Mapping):
            keys = set(item)
            if keys != {"input", "output"}:
                raise DemoError(
                    f"{where}[{index}] must have exactly the keys 'input' and 'output', "
                    f"got {sorted(map(str, keys))}"
                )
            pair = (item["input"], item["output"])
        elif isinstance(item, tuple | list) and len(item) == 2:
            pair = (item[0], item[1])
        else:
            raise DemoError(
                f"{where}[{index}] must be an (input, output) pair or "
                f'{{"input": ..., "output": ...}}, got {_short(item)}'
            )
        for side, part in zip(("input", "output"), pair, strict=True):
            if part is None or (isinstance(part, str) and not part.strip()):
                raise DemoError(f"{where}[{index}] has an empty {side}: a demonstration needs both")
            if isinstance(part, str):
                continue  # text always has a JSON form (this runs at every call)
            try:
                json.dumps(part)
            except (TypeError, ValueError):
                raise DemoError(
                    f"{where}[{index}]'s {side} is a {type(part).__name__}, which has no JSON "
                    "form: demonstrations are saved with the parameters, so use text or JSON data"
                ) from None
        demos.append({"input": pair[0], "output": pair[1]})
    return demos


def demo_text(part: Any) -> str:
    """One side of a demonstration as the model reads it: text as is, data as JSON."""
    if isinstance(part, str):
        return part
    return json.dumps(part, ensure_ascii=False)


def demo_messages(demos: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The user/assistant turns that show ``demos`` (already normalized), in order."""
    turns: list[dict[str, Any]] = []
    for demo in demos:
        turns.append({"role": "user", "content": demo_text(demo["input"])})
        turns.append({"role": "assistant", "content": demo_text(demo["output"])})
    return turns


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
