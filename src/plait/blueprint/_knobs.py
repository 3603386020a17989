"""Knobs: settings of submodules a module builds itself, reachable by dotted path.

A pipeline usually builds its `LLMInference` calls inside ``__init__``, so their
alias, temperature, max_tokens and system prompt are not constructor arguments of
anything a blueprint builds.  They are still configuration a user wants to set
from a command line (``praise.temperature=0.3``, ``...max_tokens=512``), so after
the target is built its module tree is walked and each such setting is offered
under the module's dotted path, read from the same layers with the same
precedence as constructor arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plait.blueprint._keys import join_path
from plait.blueprint._types import CastError

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["BUILT", "KNOB_NAMES", "Knob", "knobs_of"]

#: The layer name shown for a knob nobody set: the value the module's ``__init__`` chose.
BUILT = "built by __init__"


def _alias(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CastError(f"an alias is a non-empty string, got {value!r}")
    return value.strip()


def _optional_number(value: Any, kind: type, ok: Callable[[Any], bool], expected: str) -> Any:
    """``value`` (or its text, as a command line gives it) as ``kind``, or None."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "null", ""):
            return None
        try:
            value = kind(text)
        except ValueError:
            raise CastError(f"expected {expected} or none, got {value!r}") from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
        raise CastError(f"expected {expected} or none, got {value!r}")
    return kind(value)


def _temperature(value: Any) -> float | None:
    result: float | None = _optional_number(value, float, lambda t: t >= 0, "a number >= 0")
    return result


def _max_tokens(value: Any) -> int | None:
    def whole(n: Any) -> bool:
        return isinstance(n, int) and n >= 1

    result: int | None = _optional_number(value, int, whole, "a positive whole number")
    return result


def _samples(value: Any) -> int:
    """How many samples a call that samples draws (``vote.n=9``).  At least 2: the
    pipeline was written for a list of samples, and n=1 would hand it one value."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise CastError(
            f"expected a whole number >= 2 (the call returns a list of samples), got {value!r}"
        )
    return value


def _parameter_value(value: Any) -> Any:
    """What a `Parameter` given whole holds (another call's learnable prompt, say); a
    knob stored in a Parameter is set from its value, anything else is as it is."""
    from plait.parameter import Parameter

    return value.value if isinstance(value, Parameter) else value


def _system_prompt(value: Any) -> str:
    value = _parameter_value(value)
    if not isinstance(value, str):
        raise CastError(f"a system prompt is text, got {type(value).__name__}")
    return value


def _demos(value: Any) -> Any:
    """Demonstrations from a list or a pool, or from JSON text as a command line gives
    it (``summarize.demos='[{"input": "...", "output": "..."}]'``, ``...demos=[]``,
    ``...demos='{"pool": [], "k": 4}'``)."""
    import json

    from plait.demos import DemoError, normalize_demo_value

    value = _parameter_value(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise CastError(
                f'demos are JSON text, a list of {{"input": ..., "output": ...}}: {exc}'
            ) from None
    try:
        return normalize_demo_value(value)
    except DemoError as exc:
        raise CastError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Knob:
    """One setting of one module: where it lives, its type, and how to read and set it."""

    path: str
    module: Module
    name: str
    type: str
    convert: Callable[[Any], Any]

    def current(self) -> Any:
        value = getattr(self.module, self.name)
        if self.name in _PARAMETER_KNOBS:
            return "" if value is None else value.value
        return value

    def set(self, value: Any) -> None:
        """Install a converted value; a learnable system prompt or demonstrations keep
        their Parameter (only its value changes)."""
        if self.name not in _PARAMETER_KNOBS:
            setattr(self.module, self.name, value)
            return
        from plait.parameter import Parameter

        param = getattr(self.module, self.name, None)
        if isinstance(param, Parameter):
            param.value = value
        elif value:  # a system prompt where the call had none (demos knobs need a Parameter)
            self.module.system_prompt = Parameter(value, requires_grad=False)


_LLM_KNOBS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("alias", "str", _alias),
    ("temperature", "float | None", _temperature),
    ("max_tokens", "int | None", _max_tokens),
    ("system_prompt", "str", _system_prompt),
    ("demos", "list[demo]", _demos),
    ("n", "int", _samples),
)

#: Knobs whose value lives in a `Parameter` of the module.
_PARAMETER_KNOBS = frozenset({"system_prompt", "demos"})

KNOB_NAMES = frozenset(name for name, _, _ in _LLM_KNOBS)


def knobs_of(root: Module) -> list[Knob]:
    """Every knob in ``root``'s tree, in module order, each module once."""
    from plait.inference import LLMInference

    found: list[Knob] = []
    for path, module in root.named_modules():
        if isinstance(module, LLMInference):
            for name, type_name, convert in _LLM_KNOBS:
                if name == "demos" and module.demos is None:
                    continue  # a call without demonstrations has no such setting
                if name == "n" and module.n == 1:
                    continue  # one sample is one value, not a list: not a setting to flip
                found.append(Knob(join_path(path, name), module, name, type_name, convert))
    return found
