"""Values: the data that flows between the nodes of a pipeline.

A `Value` is a payload together with its kind, a `ref` naming where it came from
(a node of the graph, or ``param:<dotted.path>`` for a lifted `Parameter`) and free
`meta`.  Parameters are state, values are data: a parameter enters the data flow
only through `valueify`.
"""

from __future__ import annotations

import dataclasses
import enum
import traceback as traceback_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plait.effects import runtime

if TYPE_CHECKING:
    from plait.parameter import Parameter

__all__ = [
    "ExecutionError",
    "Value",
    "ValueKind",
    "error_value",
    "kind_of",
    "unwrap",
    "valueify",
]


class ValueKind(enum.Enum):
    """What a payload is, so consumers need not guess from its Python type.

    Attributes:
        TEXT: Text (a ``str``).
        STRUCTURED: A dict, list, dataclass or pydantic model.
        RESPONSE: A reply of the functional API (an `LLMResponse`).
        ERROR: A failure: the payload is the exception.
        OTHER: Anything else.
    """

    TEXT = "text"
    STRUCTURED = "structured"
    RESPONSE = "response"
    ERROR = "error"
    OTHER = "other"


@dataclass(slots=True)
class Value:
    """A payload with provenance: what flows between a pipeline's calls.

    A failure inside a pipeline is a `Value` of kind ERROR rather than an exception
    lost on the way: its payload is the exception and its ``meta`` holds
    ``error_type``, ``message``, ``traceback`` and ``module_path``.  A batch
    returns one in the failed input's place; a module in training mode returns
    its output as a `Value` to call `backward` on.

    Attributes:
        kind: How to read ``payload``.
        payload: The data itself (text, a structure, an exception...).
        ref: Its producer: a node of the graph, ``param:<dotted.path>`` for a
            parameter, None for a literal.
        meta: Provenance: the module path, parameter versions and, in training
            mode, the record that `backward` walks.

    Examples:
        >>> from plait import Value, ValueKind
        >>> Value(ValueKind.TEXT, "hello")
        Value(TEXT, 'hello')
        >>> Value(ValueKind.ERROR, ValueError("no")).is_error
        True
    """

    kind: ValueKind
    payload: Any
    ref: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        """Whether this value is a failure (kind ERROR)."""
        return self.kind is ValueKind.ERROR

    async def backward(self, feedback: Any = None) -> None:
        """Send feedback on this output to every learnable `Parameter` that shaped it.

        The value must be an output of a module in ``train()`` mode (it carries the
        record of the calls that made it).  An optimizer's ``step()`` then turns
        the feedback the parameters collected into new values.

        Args:
            feedback: The feedback; None sends the value's own payload (a loss's
                feedback).

        Raises:
            RuntimeError: When the value has no record of how it was computed (it
                is not an output of a module in ``train()`` mode), or is an ERROR.
        """
        await runtime().backward(self, feedback)

    def __repr__(self) -> str:
        shown = self.payload
        if isinstance(shown, str) and len(shown) > 60:
            shown = shown[:57] + "..."
        ref = f", ref={self.ref!r}" if self.ref is not None else ""
        return f"Value({self.kind.name}, {shown!r}{ref})"


def kind_of(payload: Any) -> ValueKind:
    """The natural kind of a raw payload."""
    if isinstance(payload, str):
        return ValueKind.TEXT
    if isinstance(payload, BaseException):
        return ValueKind.ERROR
    if (
        isinstance(payload, Mapping | list | tuple)
        or hasattr(payload, "model_dump")  # a pydantic model
        or (dataclasses.is_dataclass(payload) and not isinstance(payload, type))
    ):
        return ValueKind.STRUCTURED
    return ValueKind.OTHER


def unwrap(obj: Any) -> Any:
    """Replace every `Value` inside a nested structure by its payload.

    Args:
        obj: A value, or dicts, lists and tuples holding values.

    Returns:
        The same structure with payloads in place of values.

    Examples:
        >>> from plait import Value, ValueKind, unwrap
        >>> unwrap({"answer": Value(ValueKind.TEXT, "42"), "n": [1, 2]})
        {'answer': '42', 'n': [1, 2]}
    """
    if isinstance(obj, Value):
        return unwrap(obj.payload)
    if isinstance(obj, dict):
        return {k: unwrap(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unwrap(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(unwrap(v) for v in obj)
    return obj


def valueify(param: Parameter) -> Value:
    """Lift a parameter into the data flow with a stable ``param:`` ref.

    Args:
        param: The parameter.

    Returns:
        A TEXT (or STRUCTURED) value of the parameter's current value, whose ref is
        ``param:<qualified name>`` and whose ``meta`` records its id and version.
    """
    name = param.qualified_name
    payload = param.current()
    kind = ValueKind.TEXT if isinstance(payload, str) else ValueKind.STRUCTURED
    return Value(
        kind=kind,
        payload=payload,
        ref=f"param:{name}",
        meta={
            "param_name": name,
            "param_id": param.param_id,
            "module_state_version": param.module_state_version,
            "requires_grad": param.requires_grad,
        },
    )


def error_value(
    exc: BaseException,
    *,
    module_path: str | None = None,
    ref: str | None = None,
    cause: Value | None = None,
) -> Value:
    """An ERROR value that keeps everything needed to understand the failure.

    When ``cause`` is given the error is a short-circuit: this node never ran
    because an input it needed had failed; the original failure stays reachable.
    """
    if cause is not None:
        meta = dict(cause.meta)
        meta["short_circuited"] = True
        meta["skipped_module_path"] = module_path
        return Value(ValueKind.ERROR, cause.payload, ref=ref, meta=meta)
    from plait._secrets import scrub

    tb = "".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__))
    return Value(
        ValueKind.ERROR,
        exc,
        ref=ref,
        meta={
            "error_type": type(exc).__name__,
            "message": scrub(str(exc)),  # a credential never reaches an error row or log
            "traceback": scrub(tb),
            "module_path": module_path,
        },
    )


class ExecutionError(RuntimeError):
    """Raised by a single call whose pipeline failed; ``.value`` is the Value(ERROR).

    The message names the module path, the exception type and its message, so the
    cause is visible without digging; the original exception is ``__cause__``.

    Args:
        value: The ERROR value the pipeline produced.
    """

    def __init__(self, value: Value) -> None:
        self.value = value
        meta = value.meta
        where = meta.get("module_path") or "<pipeline>"
        super().__init__(
            f"{where} failed: {meta.get('error_type', 'Error')}: {meta.get('message')}"
        )
        if isinstance(value.payload, BaseException):
            self.__cause__ = value.payload
