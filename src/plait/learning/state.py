"""Parameter state kept apart from structure.

A `Module` tree is structure: which parameters exist and where.  What training
changes is state: the parameters' values.  plait keeps the two apart with an
immutable container, `ParameterState`: a frozen snapshot of every value by
dotted name (plus each parameter's ``requires_grad`` flag), which can be split
into trainable and frozen halves, merged back, saved as JSON, and applied to any
module of the same structure.  Because a snapshot never changes, "the state
before this epoch" or "the best state so far" is just a value to keep, not a
copy to remember to take.

`lock()` fixes the structure: while it is locked, creating a `Parameter`
raises, so a forward pass or training loop that accidentally builds new
parameters (say an `LLMInference` constructed inside ``forward``) fails loudly
instead of training state that no snapshot or optimizer knows about.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from plait._files import write_atomic
from plait.module import Module
from plait.parameter import StructureLockedError, _structure_lock

__all__ = [
    "ParameterFileError",
    "ParameterState",
    "StructureLockedError",
    "is_locked",
    "json_state",
    "load_parameters",
    "lock",
    "merge",
    "read_parameters",
    "save_parameters",
    "snapshot",
]

_FORMAT: Final = "plait.parameter_state"
_FORMAT_VERSION: Final = 1


class ParameterState(Mapping[str, Any]):
    """A frozen snapshot of parameter values, so "the best state so far" is a value to keep.

    An immutable mapping of qualified parameter name to value, with each
    parameter's trainable flag.  Values are deep-copied in and out, so neither the
    module the snapshot came from nor a caller holding a value it returned can
    change it.  Every operation that "changes" a state returns a new one.  Take
    one with `snapshot`.

    Args:
        values: Qualified parameter name -> value.
        requires_grad: Name -> trainable flag (default: every parameter trainable).

    Raises:
        TypeError: A name is not a non-empty string.
        KeyError: ``requires_grad`` names a parameter ``values`` does not hold.

    Examples:
        ```python
        import plait
        from plait.learning import snapshot


        class Greeter(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference(
                    "fast", plait.Parameter("Greet the user.", description="the greeting's tone")
                )

            def forward(self, name: str) -> str:
                return self.llm(name)


        greeter = Greeter()
        before = snapshot(greeter)
        greeter.llm.system_prompt.value = "Greet the user warmly."
        before.apply_to(greeter)  # roll back
        print(greeter.llm.system_prompt.value)
        print(before.to_json(indent=None))
        ```
    """

    __slots__ = ("_requires_grad", "_values")

    _values: dict[str, Any]
    _requires_grad: dict[str, bool]

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        requires_grad: Mapping[str, bool] | None = None,
    ) -> None:
        values = dict(values or {})
        for name in values:
            if not isinstance(name, str) or not name:
                raise TypeError(f"parameter names must be non-empty strings, got {name!r}")
        flags = {name: True for name in values}
        if requires_grad is not None:
            extra = [name for name in requires_grad if name not in values]
            if extra:
                raise KeyError(
                    f"requires_grad names parameter(s) with no value: {', '.join(map(repr, extra))}"
                )
            flags.update({name: bool(flag) for name, flag in requires_grad.items()})
        object.__setattr__(self, "_values", copy.deepcopy(values))
        object.__setattr__(self, "_requires_grad", flags)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ParameterState is immutable; use updated(), split() or merge()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ParameterState is immutable; use updated(), split() or merge()")

    # -- Mapping ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        try:
            value = self._values[name]
        except KeyError:
            known = ", ".join(self._values) or "none"
            raise KeyError(f"no parameter {name!r} in this state (it has: {known})") from None
        return copy.deepcopy(value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParameterState):
            return NotImplemented
        return self._values == other._values and self._requires_grad == other._requires_grad

    __hash__ = None  # type: ignore[assignment]  # values may be unhashable (dicts, lists)

    def __repr__(self) -> str:
        trainable = sum(self._requires_grad.values())
        return (
            f"ParameterState({len(self)} parameters, {trainable} trainable: "
            f"{', '.join(self._values)})"
        )

    @property
    def requires_grad(self) -> Mapping[str, bool]:
        """Each parameter's trainable flag at snapshot time (a copy)."""
        return dict(self._requires_grad)

    # -- functional updates ----------------------------------------------------------
    def split(
        self, predicate: Callable[[str], bool] | None = None
    ) -> tuple[ParameterState, ParameterState]:
        """Split the state in two, so training's half can be checked apart from the rest.

        Training touches only the trainable half; keeping the frozen half aside makes
        it obvious (and checkable) that it came back unchanged.

        Args:
            predicate: Which names go in the first half (default: the trainable ones).

        Returns:
            ``(matching, rest)``; by default ``(trainable, frozen)``.
        """
        test = predicate if predicate is not None else self._requires_grad.__getitem__
        inside = [name for name in self._values if test(name)]
        chosen = set(inside)
        outside = [name for name in self._values if name not in chosen]
        return self._subset(inside), self._subset(outside)

    def merge(self, other: ParameterState) -> ParameterState:
        """Both states in one, such as the two halves `split` made.

        Args:
            other: A state holding none of this one's names.

        Returns:
            A new state with every value of both.

        Raises:
            TypeError: ``other`` is not a `ParameterState`.
            ValueError: A name is in both (never a silent override).
        """
        if not isinstance(other, ParameterState):
            raise TypeError(f"can only merge a ParameterState, got {type(other).__name__}")
        clash = [name for name in other._values if name in self._values]
        if clash:
            raise ValueError(
                f"cannot merge parameter states: both hold {', '.join(map(repr, clash))}; "
                "split() a state into disjoint parts, or drop the duplicates first"
            )
        return ParameterState(
            {**self._values, **other._values},
            {**self._requires_grad, **other._requires_grad},
        )

    def updated(self, values: Mapping[str, Any]) -> ParameterState:
        """A copy with some values replaced, the structure unchanged.

        Args:
            values: Name -> new value, for names this state holds.

        Returns:
            A new state.

        Raises:
            KeyError: A name this state does not hold (structure is fixed).
        """
        unknown = [name for name in values if name not in self._values]
        if unknown:
            raise KeyError(
                f"unknown parameter(s) {', '.join(map(repr, unknown))}; this state holds: "
                f"{', '.join(self._values) or 'none'}"
            )
        return ParameterState({**self._values, **values}, self._requires_grad)

    def _subset(self, names: list[str]) -> ParameterState:
        return ParameterState(
            {name: self._values[name] for name in names},
            {name: self._requires_grad[name] for name in names},
        )

    # -- modules ---------------------------------------------------------------------
    def apply_to(self, module: Module) -> None:
        """Load these values into ``module``, to restore or transplant a state.

        A partial state leaves the module's other parameters alone.  Every name
        and value is checked before anything is written, as
        `Module.load_state_dict` checks them, so a state that does not fit leaves
        the module untouched.  Only values that differ are written: a parameter's
        module state version records real changes, not reloads of what it already
        holds.  Trainable flags are recorded for `split`, not applied: freezing is
        the caller's choice.

        Args:
            module: A module with parameters of these names.

        Raises:
            KeyError: A name the module has no parameter for.
            ParameterValueError: A value its parameter cannot hold.
        """
        params = dict(module.named_parameters())
        unknown = [name for name in self._values if name not in params]
        if unknown:
            raise KeyError(
                f"unknown parameter(s) {', '.join(map(repr, unknown))} for "
                f"{type(module).__name__} (its parameters: {', '.join(params) or 'none'})"
            )
        module.load_state_dict(
            {
                name: copy.deepcopy(value)
                for name, value in self._values.items()
                if params[name].value != value
            }
        )

    # -- persistence -----------------------------------------------------------------
    def to_json(self, *, indent: int | None = 2) -> str:
        """The state as JSON text, to keep it in a file or send it elsewhere.

        Args:
            indent: JSON indentation (None: one line).

        Returns:
            A JSON document `from_json` reads back.

        Raises:
            TypeError: A value JSON cannot hold; the message names its parameter.
        """
        entries: dict[str, Any] = {}
        for name, value in self._values.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"parameter {name!r} holds a {type(value).__name__}, which JSON cannot "
                    f"store ({exc}); keep parameter values to str, numbers, lists and dicts"
                ) from None
            entries[name] = {"value": value, "requires_grad": self._requires_grad[name]}
        document = {"format": _FORMAT, "version": _FORMAT_VERSION, "parameters": entries}
        return json.dumps(document, indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ParameterState:
        """Read what `to_json` wrote.

        Args:
            text: The JSON document.

        Returns:
            The state it holds.

        Raises:
            ValueError: The text is not JSON, not a plait parameter state, or of
                an unsupported version; the message says what is wrong.
        """
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"parameter state is not valid JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise ValueError(f"not a plait parameter state (expected format {_FORMAT!r})")
        if document.get("version") != _FORMAT_VERSION:
            raise ValueError(
                f"parameter state version {document.get('version')!r} is not supported "
                f"(this plait reads version {_FORMAT_VERSION})"
            )
        entries = document.get("parameters")
        if not isinstance(entries, dict):
            raise ValueError("parameter state has no 'parameters' object")
        values: dict[str, Any] = {}
        flags: dict[str, bool] = {}
        for name, entry in entries.items():
            if not isinstance(entry, dict) or "value" not in entry:
                raise ValueError(f"parameter state entry {name!r} has no 'value'")
            values[name] = entry["value"]
            flags[name] = bool(entry.get("requires_grad", True))
        return cls(values, flags)

    def save(self, path: str | Path) -> Path:
        """Write the JSON form to a file, atomically: a crash never leaves half a file.

        Args:
            path: Where to write.

        Returns:
            The path written.

        Raises:
            TypeError: A value JSON cannot hold.
        """
        return write_atomic(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ParameterState:
        """Read a state written by `save`.

        Args:
            path: The file.

        Returns:
            The state it holds.

        Raises:
            OSError: The file cannot be read.
            ValueError: It holds no plait parameter state.
        """
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def snapshot(module: Module) -> ParameterState:
    """Freeze every parameter value of ``module``, so it can be kept or rolled back to.

    Args:
        module: The pipeline.

    Returns:
        Each parameter's current value and trainable flag, by dotted name.

    Examples:
        ```python
        import plait
        from plait.learning import snapshot

        llm = plait.LLMInference("fast", plait.Parameter("Be brief.", description="reply style"))
        state = snapshot(llm)
        print(dict(state))
        ```
    """
    named = list(module.named_parameters())
    return ParameterState(
        {name: param.value for name, param in named},
        {name: param.requires_grad for name, param in named},
    )


def merge(first: ParameterState, second: ParameterState) -> ParameterState:
    """Two disjoint states combined into one (``first.merge(second)``).

    Args:
        first: One state.
        second: A state holding none of ``first``'s names.

    Returns:
        A new state with every value of both.

    Raises:
        TypeError: ``second`` is not a `ParameterState`.
        ValueError: A name is in both.
    """
    return first.merge(second)


@contextmanager
def lock(reason: str = "plait.learning.state.lock()") -> Iterator[None]:
    """Fix the parameter structure for a ``with`` block, so stray new parameters fail loudly.

    Creating a `Parameter` inside the block raises `StructureLockedError`: a
    forward pass or training loop that builds new parameters by accident (an
    `LLMInference` constructed inside ``forward``) fails instead of training state
    no snapshot or optimizer knows about.  The lock lives in a context variable,
    so it covers this task and the tasks it starts (a pipeline run inside the
    block included) and nothing else; nested locks are fine.

    Args:
        reason: Who locked, quoted in the error.

    Yields:
        Nothing; the structure is locked until the block ends.

    Examples:
        >>> import plait
        >>> from plait.learning import StructureLockedError, lock
        >>> with lock("the training loop"):
        ...     try:
        ...         plait.Parameter("new prompt", requires_grad=False)
        ...     except StructureLockedError:
        ...         print("refused")
        refused
    """
    token = _structure_lock.set(reason)
    try:
        yield
    finally:
        _structure_lock.reset(token)


def is_locked() -> bool:
    """Whether the parameter structure is locked in the current context."""
    return _structure_lock.get() is not None


# -- parameters files ------------------------------------------------------------------------
class ParameterFileError(ValueError):
    """A parameters file that cannot be read, or whose values do not fit the module; the
    message names the file and what to change."""


def json_state(module: Module) -> str:
    """``module.state_dict()`` as the JSON text `save_parameters` writes; a value JSON
    cannot hold is a TypeError naming its parameter (so a training run can refuse such
    a pipeline before it pays for anything, rather than fail to save at its end)."""
    values = module.state_dict()
    for name, value in values.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"parameter {name!r} holds a {type(value).__name__}, which JSON cannot store "
                f"({exc}); keep parameter values to text, numbers, lists and dicts"
            ) from None
    return json.dumps(values, indent=2, ensure_ascii=False) + "\n"


def save_parameters(module: Module, path: str | Path) -> Path:
    """Write a pipeline's parameter values to a file, to use them in another run.

    The file is the ``parameters.json`` that ``plait train`` writes: one JSON
    object, name -> value, which ``--parameters``, `load_parameters` and
    ``module.load_state_dict(json.load(f))`` read back.  Written atomically.

    Args:
        module: The pipeline.
        path: Where to write.

    Returns:
        The path written.

    Raises:
        TypeError: A value JSON cannot hold; the message names its parameter, and
            nothing is written.

    Examples:
        ```python
        import plait
        from plait.learning import load_parameters, save_parameters

        prompt = plait.Parameter("Answer in one word.", description="how to answer")
        trained = plait.LLMInference("fast", prompt)
        save_parameters(trained, "parameters.json")

        fresh = plait.LLMInference("fast", plait.Parameter("Answer.", description="how to answer"))
        load_parameters(fresh, "parameters.json")
        print(fresh.system_prompt.value)
        ```
    """
    return write_atomic(path, json_state(module))


def read_parameters(path: str | Path) -> dict[str, Any]:
    """The values a parameters file holds, by name: what `save_parameters` (and so
    ``plait train``) writes, or a `ParameterState` saved with ``save``.
    Anything else is a `ParameterFileError` naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ParameterFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ParameterFileError(
            f"{path} is not JSON ({exc}); give the parameters.json plait train wrote"
        ) from None
    if not isinstance(document, dict):
        raise ParameterFileError(
            f"{path} holds a JSON {type(document).__name__}, not an object of parameter "
            "name -> value (the parameters.json plait train wrote)"
        )
    if document.get("format") == _FORMAT and isinstance(document.get("parameters"), dict):
        try:
            return dict(ParameterState.from_json(text))
        except ValueError as exc:
            raise ParameterFileError(f"{path}: {exc}") from None
    return document


def load_parameters(module: Module, path: str | Path) -> list[str]:
    """Load a parameters file into a pipeline, such as the one ``plait train`` wrote.

    Every value is checked, as `Module.load_state_dict` checks, before any is
    written.  The file is what `save_parameters` writes, or a `ParameterState`
    saved with ``save``.

    Args:
        module: The pipeline.
        path: The parameters file.

    Returns:
        The names of the module's parameters the file does not set, which keep
            their values.

    Raises:
        ParameterFileError: the file cannot be read, or names a parameter the module
            does not have, or gives one a value it cannot hold; the message names the
            file, and the module is left as it was.
    """
    from plait.parameter import ParameterValueError

    values = read_parameters(path)
    known = [name for name, _ in module.named_parameters()]
    unknown = [name for name in values if name not in known]
    if unknown:
        raise ParameterFileError(
            f"{path} names parameter(s) the pipeline does not have: {', '.join(unknown)} "
            f"(its parameters: {', '.join(known) or 'none'})"
        )
    try:
        module.load_state_dict(values)
    except ParameterValueError as exc:
        raise ParameterFileError(
            f"{path} gives parameter(s) a value they cannot hold: {'; '.join(exc.problems)}; give "
            "each the kind of value it holds (the parameters.json plait train wrote does)"
        ) from None
    return [name for name in known if name not in values]
