"""Parameters: the learnable state of a pipeline.

A parameter is state, not data.  When a `forward()` uses one (in an f-string, as
an argument, as a system prompt) it is lifted into a `Value` whose ref is
``param:<dotted.path>``, so the graph records which outputs it shaped and the
optimizer knows where feedback belongs.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

from plait.effects import current_interpreter


class Owner(Protocol):
    """What a parameter asks of the module that owns it (`plait.module.Module`, which
    imports this file, so the parameter names only what it uses)."""

    _state_version: int

    @property
    def qualified_path(self) -> str: ...

    def _bump_state_version(self) -> None: ...


__all__ = ["Parameter", "ParameterValueError", "StructureLockedError", "value_kind"]

_ids = itertools.count(1)
#: Parameters unpickled with an owner that has not relinked them yet (its id then).
_pickled_owners: weakref.WeakKeyDictionary[Parameter, int] = weakref.WeakKeyDictionary()

#: Per input being run: the value of every parameter as it was when the input
#: started (id(param) -> value).  Reads of ``param.value`` inside that input see it,
#: so an optimizer step during a batch never mixes old and new text within one input.
_snapshot: ContextVar[dict[int, Any] | None] = ContextVar("plait_parameter_snapshot", default=None)


def snapshot_values(params: Any) -> dict[int, Any]:
    """The current value of each parameter, keyed for `use_snapshot`."""
    return {id(param): param._value for param in params}


use_snapshot = _snapshot.set
release_snapshot = _snapshot.reset

# -- structure lock (set by plait.learning.state.lock) ---------------------------------
#: While set (to a description of who locked), creating a Parameter raises: once the
#: parameter state is locked, the structure it describes must not grow behind its back.
_structure_lock: ContextVar[str | None] = ContextVar("plait_structure_lock", default=None)


class StructureLockedError(RuntimeError):
    """A Parameter was created while the parameter structure was locked."""


class ParameterValueError(ValueError):
    """A value offered to a parameter (a loaded state, a parameters file) that it cannot hold.

    The message names each such parameter and what it takes.

    Args:
        message: The whole message.
        problems: One ``"name (why)"`` per parameter refused.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


def value_kind(value: Any) -> str:
    """The JSON kind of ``value`` (text, number, boolean, list, object, null), or its type's
    name when it has none: what a loaded value is compared by (`Parameter.checked`)."""
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


#: Kinds of held value a loaded value must share (a parameter holding None, or an
#: object of a type of its own, takes any value it is given).
_CHECKED_KINDS = frozenset({"boolean", "number", "text", "list", "object"})


class Parameter:
    """A learnable value, typically a prompt, improved from feedback.

    Assign one as an attribute of a `Module` (or pass it as an `LLMInference`'s
    ``system_prompt``) and it registers under its attribute path: `Module.state_dict`
    saves it, optimizers rewrite it from the feedback `Value.backward` sends it.
    Read inside a traced ``forward`` (an f-string, an argument) it stays in the
    graph, so plait knows which outputs it shaped.  Parameters are equal when
    their fields are, and hashed by identity (they can key dicts and sets).

    Args:
        value: The initial value: usually text, or JSON data (demonstrations).
        description: What the value controls, for the optimizer that rewrites it.
            Required when ``requires_grad=True``: an optimizer asked to rewrite a
            prompt without knowing its role produces incoherent updates.
        requires_grad: Whether optimizers may change it (False: a fixed value).
        check: Which values the parameter may hold when a saved state is loaded
            into it (`Module.load_state_dict`, ``--parameters`` files): a function
            taking a value and returning it as the parameter holds it, or raising
            ValueError saying why it cannot (a module-level function, so that the
            parameter still pickles).  Without one, a loaded value must be of the
            JSON kind of the value held (text for text, a list for a list...).

    Raises:
        ValueError: When ``requires_grad=True`` and there is no description.
        TypeError: When ``value`` is itself a `Parameter` (reuse that object to share it).
        StructureLockedError: When the parameter structure is locked
            (`plait.learning.lock`): create parameters before locking.

    Examples:
        ```python
        import plait


        class Summarize(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.instructions = plait.Parameter(
                    "Summarize in one line.", description="How to summarize a review"
                )
                self.summary = plait.LLMInference("fast", system_prompt=self.instructions)

            def forward(self, text: str) -> str:
                return self.summary(text)


        pipeline = Summarize()
        print(pipeline.state_dict())  # {'instructions': 'Summarize in one line.'}
        pipeline.load_state_dict({"instructions": "Summarize in five words."})
        print(pipeline.instructions.value)
        ```
    """

    __slots__ = (
        "__weakref__",
        "_feedback_buffer",
        "_name",
        "_owner",
        "_value",
        "check",
        "description",
        "param_id",
        "requires_grad",
    )

    def __init__(
        self,
        value: Any,
        description: str | None = None,
        requires_grad: bool = True,
        *,
        check: Callable[[Any], Any] | None = None,
    ) -> None:
        locked_by = _structure_lock.get()
        if locked_by is not None:
            raise StructureLockedError(
                f"cannot create Parameter({_short(value)}): the parameter structure is locked "
                f"({locked_by}); create parameters (and modules that own them, such as "
                "LLMInference with a system prompt) before locking, e.g. in Module.__init__"
            )
        if isinstance(value, Parameter):
            raise TypeError(
                "Parameter(value) got another Parameter; pass its .value, or reuse the "
                "same Parameter object to share it between modules"
            )
        if requires_grad and not (isinstance(description, str) and description.strip()):
            raise ValueError(
                f"Parameter({_short(value)}) needs a description because requires_grad=True: "
                "say what the value controls so an optimizer can rewrite it coherently, e.g. "
                "Parameter('Be concise.', description='Tone of the summary'); "
                "or pass requires_grad=False for a fixed value"
            )
        self._value = value
        self.description = description
        self.requires_grad = requires_grad
        self.check = check
        self._name: str | None = None
        self._owner: weakref.ReferenceType[Owner] | None = None
        self._feedback_buffer: list[str] = []
        self.param_id = f"p{next(_ids)}"

    # -- pickling --------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The slots, with the weak link to the owning module replaced by a mark (see
        `Module.__getstate__`: the owner relinks it when it is unpickled)."""
        state = {name: getattr(self, name) for name in self.__slots__ if name != "__weakref__"}
        owner = self.owner
        state["_owner"] = None
        state["pickled_owner"] = id(owner) if owner is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        owner = state.pop("pickled_owner", None)
        object.__setattr__(self, "check", None)  # absent from a state pickled before it existed
        for name, value in state.items():
            object.__setattr__(self, name, value)
        if owner is not None:
            _pickled_owners[self] = owner

    def _pickled_owner(self) -> int | None:
        return _pickled_owners.get(self)

    # -- value and versioning -------------------------------------------------
    @property
    def value(self) -> Any:
        """The value; inside a running input, as it was when that input started.

        Setting it changes the value (and the owning module's state version).

        While a ``forward()`` is being traced this is a placeholder that keeps the
        parameter in the graph: text use (f-strings, ``+``, ``join``), its ``str``
        methods and indexing are recorded and applied to the value each input runs
        with; questions about it (``len``, ``==``, truth tests) raise `TracingError`.
        """
        tracer = current_interpreter()
        if tracer.lift_parameters:
            return tracer.lift_parameter(self)
        return self.current()

    @value.setter
    def value(self, new_value: Any) -> None:
        self._value = new_value
        owner = self.owner
        if owner is not None:
            owner._bump_state_version()

    def checked(self, value: Any) -> Any:
        """``value`` as this parameter would hold it once loaded (a saved state, a file).

        Its ``check`` decides when it has one, else the JSON kind of the value it
        holds now must match.

        Args:
            value: The value offered.

        Returns:
            The value as the parameter would hold it.

        Raises:
            ParameterValueError: When the parameter cannot hold it (saying what it takes).
        """
        if self.check is not None:
            try:
                return self.check(value)
            except ValueError as exc:
                raise ParameterValueError(str(exc)) from None
        held, given = value_kind(self._value), value_kind(value)
        if held in _CHECKED_KINDS and given != held:
            raise ParameterValueError(f"expected {held}, given {given}")
        return value

    def current(self) -> Any:
        """The value this input runs with (the live value outside a run), never a placeholder.

        Returns:
            The value.
        """
        snapshot = _snapshot.get()
        if snapshot is not None:
            found = snapshot.get(id(self), _UNSET)
            if found is not _UNSET:
                return found
        return self._value

    @property
    def owner(self) -> Owner | None:
        """The module that first registered this parameter (it owns the version)."""
        return self._owner() if self._owner is not None else None

    @property
    def module_state_version(self) -> int:
        """Version of the owning module's state; bumps whenever one of its parameters changes."""
        owner = self.owner
        return owner._state_version if owner is not None else 0

    @property
    def qualified_name(self) -> str:
        """Dotted path from the root module that owns it (``param:<this>`` is the ref).

        The same whichever module is run: it follows the chain of modules each was
        first assigned to, so it equals the owning root's ``state_dict()`` key.
        """
        owner = self.owner
        if owner is None or self._name is None:
            return self._name or self.param_id
        prefix = owner.qualified_path
        return f"{prefix}.{self._name}" if prefix else self._name

    # -- feedback ----------------------------------------------------------------
    def accumulate_feedback(self, feedback: str) -> None:
        """Collect feedback from a backward pass; frozen parameters ignore it.

        Args:
            feedback: Text saying how the value should change.
        """
        if self.requires_grad:
            self._feedback_buffer.append(feedback)

    def get_accumulated_feedback(self) -> list[str]:
        """The feedback collected since the last update (what an optimizer reads).

        Returns:
            A copy of the feedback texts, oldest first.
        """
        return list(self._feedback_buffer)

    def apply_update(self, new_value: Any) -> None:
        """Install an optimizer's new value and clear the feedback it was computed from.

        Args:
            new_value: The new value.
        """
        self.value = new_value
        self._feedback_buffer.clear()

    def zero_feedback(self) -> None:
        """Clear accumulated feedback (the analogue of ``zero_grad``)."""
        self._feedback_buffer.clear()

    # -- equality, as a dataclass's ---------------------------------------------------
    def _fields(self) -> tuple[Any, ...]:
        return (
            self._value,
            self.description,
            self.requires_grad,
            self._name,
            self._feedback_buffer,
        )

    def __eq__(self, other: object) -> bool:
        """Equal when every field is: value, description, requires_grad, name, feedback."""
        if not isinstance(other, Parameter):
            return NotImplemented
        return self is other or self._fields() == other._fields()

    #: Hashed by identity, as torch's parameters are, so they can key dicts and sets;
    #: plait's own bookkeeping always keys them by identity.
    __hash__ = object.__hash__

    # -- use inside forward() ----------------------------------------------------
    def __str__(self) -> str:
        tracer = current_interpreter()
        if tracer.lift_parameters:
            return tracer.lift_parameter(self)
        return str(self.current())

    def __format__(self, spec: str) -> str:
        tracer = current_interpreter()
        if tracer.lift_parameters:
            if spec:
                raise ValueError(
                    f"format spec {spec!r} on Parameter {self.qualified_name!r} cannot be "
                    "applied while tracing; format the text without a spec"
                )
            return tracer.lift_parameter(self)
        return format(str(self.current()), spec)

    def __repr__(self) -> str:
        return (
            f"Parameter(value={self._value!r}, description={self.description!r}, "
            f"requires_grad={self.requires_grad!r})"
        )


_UNSET = object()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
