"""Outputs that are code, not data: a function, a generator, a class, a pipeline
returned instead of called.

Turned into text they pass for an output (``"<function len>"`` written as a row, or
scored by a loss that happens to find the target in the repr), so every place that
turns an output into text or JSON asks `code_in` first and makes such an output
that input's error instead.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from plait.module import Module

__all__ = ["NOT_DATA", "code_in", "why_not_data"]

#: Objects that are code, not data.
NOT_DATA = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
    functools.partial,
    type,
    Module,  # a pipeline returned instead of called: its repr is not its output
)


def why_not_data(obj: Any) -> str:
    """Why ``obj`` (one of `NOT_DATA`) cannot stand for an output, and what to return."""
    if isinstance(obj, types.CoroutineType):
        obj.close()  # never awaited, and never will be: no warning about it
    if isinstance(obj, Module):
        return (
            f"it holds a plait Module ({type(obj).__qualname__}), which is code, not data: "
            "return what calling it returns"
        )
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    shown = str(name) if name else type(obj).__name__
    return f"it holds a {type(obj).__name__} ({shown}), which is code, not data"


def code_in(obj: Any, depth: int = 0) -> str | None:
    """Why ``obj`` is not data when it is, or holds (in a dict, list, tuple or set),
    code; None for data.  Only containers are looked into: an object's own fields
    are its business (a dataclass or pydantic model is serialised field by field)."""
    if isinstance(obj, NOT_DATA):
        return why_not_data(obj)
    if depth > 100:
        return None
    if isinstance(obj, dict):
        items: Any = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        items = obj
    else:
        return None
    for item in items:
        found = code_in(item, depth + 1)
        if found is not None:
            return found
    return None
