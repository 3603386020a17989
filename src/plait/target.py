"""TARGET plus ``key=value`` arguments, made into a Module: the one door to blueprints
for the CLI and Ray Data (``plait.ray.Pipeline("file.py:Name")``).

Every command builds its module through `Target`, so how targets are located and
configured lives here and nowhere else; `plait.blueprint` does the locating,
layering and type conversion.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plait.blueprint import Blueprint, BlueprintError, parse_cli_args
from plait.module import Module

__all__ = ["Target", "TargetError", "code_files", "source_file"]

#: Frames under this directory are plait's own; an error is located in the user's code.
_PLAIT_DIR = str(Path(__file__).resolve().parents[1])


class TargetError(Exception):
    """TARGET or its arguments cannot give a module; the message says what to change."""


def _ensure_cwd_importable() -> None:
    """``package.module:Name`` means a module importable from here, as ``python -m`` has it.

    The ``plait`` script's own directory is on ``sys.path`` instead of the current
    one, so without this a project's own package would not be found.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


class Target:
    """``file.py:Name`` or ``package.module:Name`` with the command line's arguments.

    The name may be a Module class, a function returning a Module, or a Module
    instance (which takes no arguments: it is already built).
    """

    def __init__(self, spec: str, assignments: Sequence[str] = ()) -> None:
        self.spec = spec
        self.assignments = list(assignments)
        _ensure_cwd_importable()
        try:
            self.blueprint: Blueprint[Any] = Blueprint(spec)
            if self.assignments:
                self.blueprint.apply(parse_cli_args(self.assignments), layer="command line")
        except BlueprintError as exc:
            raise TargetError(_with_origin(str(exc), exc)) from None
        except Exception as exc:  # the target's own module failed while being imported
            raise TargetError(f"importing {spec} failed: {_explain(exc)}") from None
        self.instance = self.blueprint.target if isinstance(self.blueprint.target, Module) else None
        if self.instance is not None and self.assignments:
            raise TargetError(
                f"{spec} is a module instance, so key=value arguments cannot configure it: "
                "point TARGET at its class, or at a function that builds it"
            )

    def make(self) -> Module:
        """The configured module; every problem is a `TargetError` naming what to fix."""
        if self.instance is not None:
            return self.instance
        try:
            made = self.blueprint.make()
        except BlueprintError as exc:
            raise TargetError(
                f"{_with_origin(str(exc), exc)}\n(`plait run {self.spec} --help` lists its "
                "arguments)"
            ) from None
        except Exception as exc:
            raise TargetError(f"building {self.spec} failed: {_explain(exc)}") from None
        if not isinstance(made, Module):
            raise TargetError(
                f"{self.spec} gave a {type(made).__name__}, not a plait Module: TARGET must be a "
                "Module class or a function that returns a Module"
            )
        return made

    def help(self) -> str:
        """Every argument the target takes, with its type, value and the layer that set it."""
        if self.instance is not None:
            return f"{self.spec} is a {type(self.instance).__name__} instance: no arguments\n"
        return self.blueprint.help()


def source_file(spec: str) -> str | None:
    """The file TARGET's code is in, which a command must never write over: the path
    of ``file.py:Name``, or the file ``package.module:Name`` would be imported from
    (found without running it; None when it cannot be found, which import reports)."""
    where, sep, _ = spec.rpartition(":")
    if not sep or not where:
        return None
    if where.endswith(".py") or "/" in where or "\\" in where:
        return where
    import importlib.util

    _ensure_cwd_importable()
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        return None
    return found.origin if found is not None and found.has_location else None


def code_files(spec: str) -> list[str]:
    """TARGET's own file and the user files it imports, transitively (as the checkpoint's
    code identity finds them): the pipeline's code, which no command may write over."""
    own = source_file(spec)
    if own is None:
        return []
    from plait.execution.checkpoint import imported_user_files

    where = spec.rpartition(":")[0]
    dotted = not (where.endswith(".py") or "/" in where or "\\" in where)
    package = None
    if dotted:
        package = where if Path(own).name == "__init__.py" else where.rpartition(".")[0]
    return [own, *(str(path) for path in imported_user_files(own, package or None))]


def _location(exc: BaseException) -> str | None:
    """Where in the user's code ``exc`` was raised (plait's and importlib's frames skipped)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if "importlib" not in frame.filename and not frame.filename.startswith(_PLAIT_DIR)
    ]
    if not frames:
        return None
    return f"{frames[-1].filename}, line {frames[-1].lineno}, in {frames[-1].name}"


def _explain(exc: BaseException) -> str:
    where = _location(exc)
    return f"{type(exc).__name__}: {exc}" + (f" ({where})" if where else "")


def _with_origin(message: str, exc: BaseException) -> str:
    """A blueprint's message, plus where in the user's code the error it reports arose.

    Blueprints report an import or constructor failure by its message; the original
    exception, further down the chain, still knows the file and line to fix.
    """
    origin, seen = exc, {id(exc)}
    while (deeper := origin.__cause__ or origin.__context__) is not None and id(deeper) not in seen:
        seen.add(id(deeper))
        origin = deeper
    where = _location(origin) if origin is not exc else None
    return f"{message}\n(raised at {where})" if where else message
