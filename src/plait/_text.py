"""How a value becomes text for a model to read.

Two rules, each kept once, because the text they make is sent to models and so
is part of every cache and checkpoint key: changing either would make every
stored reply miss.

- `as_text` is how a value reads spliced into a prompt (``f"...{out}..."``, a
  message's content, a mock's reply): text as it is, a pydantic model and a dict
  or list as JSON, anything else by ``str()``.  `prompt_text` is the same with
  the refusal of values that have no text (None, bytes, a bare object), for
  what a call sends as its whole prompt.
- `data_text` is how a value reads as data to compare or grade (a loss's output
  and target, a parameter's value whose length bounds a rewrite): text as it is,
  everything else as JSON wherever pydantic can make JSON of it (tuples, sets,
  dataclasses, numbers and booleans as JSON spells them), else ``str()``.
"""

from __future__ import annotations

import json
from dataclasses import is_dataclass
from typing import Any

__all__ = ["as_text", "data_text", "prompt_text"]


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


def data_text(obj: Any) -> str:
    """``obj`` as data reads: text as it is, anything else as its JSON, else ``str()``."""
    if isinstance(obj, str):
        return obj
    if hasattr(obj, "model_dump_json"):  # a pydantic model, without importing pydantic
        return str(obj.model_dump_json())
    try:
        from pydantic_core import to_jsonable_python

        return json.dumps(to_jsonable_python(obj), ensure_ascii=False)
    except Exception:
        return str(obj)
