"""What a value reads as when it becomes part of a prompt: one rule for every call.

A module's prompt, a functional call's message, a system prompt and a value spliced
into an f-string while tracing all read a payload the same way, so the text a
handler sees, the text that is cached and the text that is sent never differ.
"""

from __future__ import annotations

import json
from dataclasses import is_dataclass
from typing import Any

__all__ = ["as_text", "prompt_text"]


def as_text(payload: Any) -> str:
    """How a value reads when it is spliced into a prompt."""
    if isinstance(payload, str):
        return payload
    dump = getattr(payload, "model_dump_json", None)
    if callable(dump):
        return str(dump())
    if isinstance(payload, dict | list):
        try:
            return json.dumps(payload, ensure_ascii=False)
        except TypeError:
            return str(payload)
    return str(payload)


def prompt_text(payload: Any, where: str) -> str:
    """``payload`` as the text of a message ``where`` sends, or a TypeError when it has
    none: a None (a null cell, a missing field) or an object whose only text is its
    repr would otherwise reach the model as "None" or "<function ...>" and be paid
    for as if it were a prompt."""
    if isinstance(payload, str):
        return payload
    textless = (
        payload is None
        or isinstance(payload, bytes | bytearray)
        or (
            not isinstance(payload, dict | list | tuple | int | float)
            and not callable(getattr(payload, "model_dump_json", None))
            and not is_dataclass(payload)
            and getattr(type(payload), "__str__", None) is object.__str__
        )
    )
    if textless:
        shown = repr(payload)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(
            f"{where} got {type(payload).__name__} {shown} where text is required, so "
            "nothing was sent: a prompt is a str or JSON data (dict, list, number, a "
            "pydantic model); a None usually comes from a null or missing field of the input"
        )
    return as_text(payload)
