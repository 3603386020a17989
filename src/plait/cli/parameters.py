"""``--parameters FILE``: load the values ``plait train`` learned into a built pipeline.

The file is read and checked by `plait.learning.state.load_parameters`, the one
reader of parameters files (``plait train`` writes them with `save_parameters`),
so what a command loads is what `Module.load_state_dict` would accept.
"""

from __future__ import annotations

from typing import IO

from plait.module import Module

__all__ = ["ParametersError", "load_parameters"]


class ParametersError(Exception):
    """The parameters file cannot be read, is not a JSON object, names unknown
    parameters or gives one a value it cannot hold."""


def load_parameters(module: Module, path: str, command: str, err: IO[str]) -> None:
    """Load ``path`` (a JSON object: ``state_dict()`` name -> value) into ``module``.

    Strict about what the file says: unreadable, not JSON, not an object, a name
    the pipeline has no parameter for, or a value the parameter cannot hold (``null``
    or ``5`` for a prompt would be sent as the text "None" or "5") is an error naming
    the file.  Names the file does not mention keep their defaults; one stderr line
    lists them.
    """
    from plait.learning.state import ParameterFileError
    from plait.learning.state import load_parameters as load

    try:
        missing = load(module, path)
    except ParameterFileError as exc:
        raise ParametersError(f"--parameters {exc}") from None
    if missing:
        print(
            f"plait {command}: --parameters {path} does not set {', '.join(missing)}; "
            "they keep their defaults",
            file=err,
            flush=True,
        )
