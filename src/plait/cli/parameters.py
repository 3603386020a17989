"""``--parameters FILE``: load the values ``plait train`` learned into a built pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from plait.module import Module

__all__ = ["ParametersError", "load_parameters"]


class ParametersError(Exception):
    """The parameters file cannot be read, is not a JSON object, or names unknown parameters."""


def load_parameters(module: Module, path: str, command: str, err: IO[str]) -> None:
    """Load ``path`` (a JSON object: ``state_dict()`` name -> value) into ``module``.

    Strict about what the file says: unreadable, not JSON, not an object, or a
    name the pipeline has no parameter for is an error naming the file.  Names
    the file does not mention keep their defaults; one stderr line lists them.
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
    module.load_state_dict(values)
    missing = [name for name in known if name not in values]
    if missing:
        print(
            f"plait {command}: --parameters {path} does not set {', '.join(missing)}; "
            "they keep their defaults",
            file=err,
            flush=True,
        )
