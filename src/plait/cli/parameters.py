"""``--parameters FILE``: load the values ``plait train`` learned into a built pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from plait.module import Module

__all__ = ["ParametersError", "load_parameters"]


class ParametersError(Exception):
    """The parameters file cannot be read, is not a JSON object, or names unknown parameters."""


def load_parameters(module: Module, path: str, command: str, err: IO[str]) -> None:
    """Load ``path`` (a JSON object: ``state_dict()`` name -> value) into ``module``.

    Strict about what the file says: unreadable, not JSON, not an object, a name
    the pipeline has no parameter for, or a value of another kind than the
    parameter holds (``null`` or ``5`` for a prompt would be sent as the text
    "None" or "5") is an error naming the file.  Names the file does not mention
    keep their defaults; one stderr line lists them.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ParametersError(f"cannot read --parameters {path}: {exc.strerror or exc}") from None
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise ParametersError(
            f"--parameters {path} is not JSON ({exc}); give the parameters.json plait train wrote"
        ) from None
    if not isinstance(values, dict):
        raise ParametersError(
            f"--parameters {path} holds a JSON {type(values).__name__}, not an object of "
            "parameter name -> value (the parameters.json plait train wrote)"
        )
    known = module.state_dict()
    unknown = [name for name in values if name not in known]
    if unknown:
        raise ParametersError(
            f"--parameters {path} names parameter(s) the pipeline does not have: "
            f"{', '.join(unknown)} (its parameters: {', '.join(known) or 'none'})"
        )
    wrong = [
        f"{name} (expected {_kind(known[name])}, given {_kind(value)})"
        for name, value in values.items()
        if _kind(known[name]) in _CHECKED and _kind(value) != _kind(known[name])
    ]
    if wrong:
        raise ParametersError(
            f"--parameters {path} gives parameter(s) a value of the wrong type: "
            f"{'; '.join(wrong)}; give each the kind of value it holds (the "
            "parameters.json plait train wrote does)"
        )
    module.load_state_dict(values)
    missing = [name for name in known if name not in values]
    if missing:
        print(
            f"plait {command}: --parameters {path} does not set {', '.join(missing)}; "
            "they keep their defaults",
            file=err,
            flush=True,
        )


#: Kinds of current value a loaded value is checked against (a parameter holding
#: None, or an object of its own, takes what the file gives).
_CHECKED = frozenset({"boolean", "number", "text", "list", "object"})


def _kind(value: Any) -> str:
    """The JSON kind of a value, which a loaded value must share with the current one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
