"""Typed replies: JSON schemas for `response_format` types, and validation of replies.

`response_format` may be a pydantic model, a dataclass, a TypedDict, or a typing
expression such as ``list[str]`` or ``dict[str, int]``.  Providers want an object
at the root of a schema (OpenAI's ``json_schema``, Anthropic's tool input), so a
type whose schema is not an object travels wrapped as ``{"value": ...}``; the
wrapping is undone when the reply is validated, and callers never see it.

A reply that does not validate is asked again once, with the validation errors
quoted back to the model, before the call fails.

Examples:
    ```python
    from pydantic import BaseModel

    import plait


    class Review(BaseModel):
        stars: int
        summary: str


    fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
    resources = plait.ResourceConfig({"fast": fast})
    read = plait.LLMInference("fast", system_prompt="Read the review.", response_format=Review)
    review = read.bind(resources=resources).run_sync("Five stars: the roof no longer leaks.")
    print(type(review).__name__, isinstance(review.stars, int))
    ```
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "WRAP_KEY",
    "canonical_schema_json",
    "is_wrapped",
    "json_schema_format",
    "parse_reply",
    "reask_instruction",
    "schema_for",
    "schema_name",
    "wire_schema",
]

WRAP_KEY = "value"
"""The property a non-object schema is wrapped in on the wire (``{"value": ...}``)."""


@functools.lru_cache(maxsize=256)
def _adapter(tp: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter  # imported on first use: keeps `import plait` fast

    return TypeAdapter(_compatible(tp))


def _compatible(tp: Any) -> Any:
    """A `typing.TypedDict` rebuilt as `typing_extensions.TypedDict`, which pydantic needs
    before Python 3.12; users should not have to know which of the two they imported."""
    import sys
    import typing

    if sys.version_info >= (3, 12) or not typing.is_typeddict(tp):
        return tp
    import typing_extensions

    if isinstance(tp, typing_extensions._TypedDictMeta):  # type: ignore[attr-defined]
        return tp
    hints = typing.get_type_hints(tp, include_extras=True)
    required = getattr(tp, "__required_keys__", frozenset(hints))
    fields = {
        name: hint if name in required else typing_extensions.NotRequired[hint]
        for name, hint in hints.items()
    }
    return typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[operator]


def schema_for(tp: Any) -> dict[str, Any]:
    """The JSON schema of a pydantic model, dataclass, TypedDict or typing expression.

    Args:
        tp: The type.

    Returns:
        Its JSON schema (as pydantic makes it).

    Raises:
        TypeError: When ``tp`` has no JSON schema (naming the types that do).

    Examples:
        >>> from plait.structured import schema_for
        >>> schema_for(list[str])
        {'items': {'type': 'string'}, 'type': 'array'}
    """
    try:
        return _adapter(tp).json_schema()
    except Exception as exc:
        raise TypeError(
            f"response_format={tp!r} cannot be turned into a JSON schema ({exc}); use a "
            "pydantic model, a dataclass, a TypedDict or a type such as list[str]"
        ) from exc


def is_wrapped(tp: Any) -> bool:
    """Whether ``tp``'s schema needs the ``{"value": ...}`` object around it on the wire.

    Args:
        tp: A ``response_format`` type.

    Returns:
        True when its schema is not an object.
    """
    return schema_for(tp).get("type") != "object"


@functools.lru_cache(maxsize=256)
def _wire_schema(tp: Any) -> str:
    schema = schema_for(tp)
    if schema.get("type") != "object":
        defs = schema.pop("$defs", None)
        schema = {"type": "object", "properties": {WRAP_KEY: schema}, "required": [WRAP_KEY]}
        if defs:
            schema["$defs"] = defs
    return json.dumps(schema)


def wire_schema(tp: Any) -> dict[str, Any]:
    """The schema to send: always an object at the root (a fresh copy each call).

    Args:
        tp: A ``response_format`` type.

    Returns:
        Its schema, wrapped in ``{"value": ...}`` when it is not an object.

    Examples:
        >>> from plait.structured import wire_schema
        >>> wire_schema(list[str])["properties"]
        {'value': {'items': {'type': 'string'}, 'type': 'array'}}
    """
    result: dict[str, Any] = json.loads(_wire_schema(tp))
    return result


def schema_name(tp: Any) -> str:
    """The name a schema is sent under: the type's name, as providers accept names.

    Args:
        tp: A ``response_format`` type.

    Returns:
        Its ``__name__`` with characters other than letters, digits, ``_`` and ``-``
        replaced, at most 64 of them (``"response"`` for a type with no name).
    """
    name = getattr(tp, "__name__", None) or "response"
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(name))[:64]


def json_schema_format(tp: Any) -> dict[str, Any]:
    """OpenAI's ``response_format`` for ``tp``, in the ``json_schema`` form.

    OpenAI-compatible servers and the embedded llama.cpp server both honour it.

    Args:
        tp: A ``response_format`` type.

    Returns:
        ``{"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}``.
    """
    return {
        "type": "json_schema",
        "json_schema": {"name": schema_name(tp), "schema": wire_schema(tp)},
    }


def parse_reply(tp: Any, text: str) -> Any:
    """Validate a reply (JSON text, wrapped as `wire_schema` asked) against ``tp``.

    A type of labels (a ``Literal`` of texts, a text `Enum`) is read leniently,
    JSON or not (`plait.labels.match_label`).

    Args:
        tp: The ``response_format`` type.
        text: The reply's text.

    Returns:
        The validated object (an instance of ``tp``, or data of its shape).

    Raises:
        ValueError: When the reply does not match, naming the validation problems
            (which the endpoint quotes back to the model when it asks again).

    Examples:
        >>> from plait.structured import parse_reply
        >>> parse_reply(list[int], '{"value": [1, 2]}')
        [1, 2]
    """
    from plait.labels import label_choices, match_label

    if label_choices(tp) is not None:
        return match_label(tp, text)
    try:
        if is_wrapped(tp):
            data = json.loads(text)
            if not isinstance(data, dict) or WRAP_KEY not in data:
                raise ValueError(f'expected a JSON object with a "{WRAP_KEY}" property')
            return _adapter(tp).validate_python(data[WRAP_KEY])
        return _adapter(tp).validate_json(text)
    except Exception as exc:
        raise ValueError(f"reply does not match response_format {_type_name(tp)}: {exc}") from exc


def reask_instruction(tp: Any) -> str:
    """What the request made again after an invalid reply tells the model to do.

    Args:
        tp: The ``response_format`` type.

    Returns:
        The instruction: the labels for a label type, else to answer with JSON
        that matches the schema.
    """
    from plait.labels import label_choices, labels_instruction

    choices = label_choices(tp)
    if choices is not None:
        return labels_instruction(choices)
    return "Answer again with only JSON that matches the schema."


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def canonical_schema_json(tp: Any) -> str:
    """``tp``'s schema as compact JSON with sorted keys: the same text for the same schema.

    Cache, recording and checkpoint keys use it, so that two equal types key alike.

    Args:
        tp: A ``response_format`` type.

    Returns:
        The JSON text.
    """
    return json.dumps(schema_for(tp), sort_keys=True, separators=(",", ":"))
