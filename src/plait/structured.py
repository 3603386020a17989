"""Typed replies: JSON schemas for `response_format` types, and validation of replies."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = ["canonical_schema_json", "parse_reply", "schema_for", "schema_name"]


@functools.lru_cache(maxsize=256)
def _adapter(tp: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter  # imported on first use: keeps `import plait` fast

    return TypeAdapter(tp)


def schema_for(tp: Any) -> dict[str, Any]:
    """The JSON schema of a pydantic model, dataclass, TypedDict or typing expression."""
    try:
        return _adapter(tp).json_schema()
    except Exception as exc:
        raise TypeError(
            f"response_format={tp!r} cannot be turned into a JSON schema ({exc}); use a "
            "pydantic model, a dataclass, a TypedDict or a type such as list[str]"
        ) from exc


def schema_name(tp: Any) -> str:
    name = getattr(tp, "__name__", None) or "response"
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in str(name))[:64]


def parse_reply(tp: Any, text: str) -> Any:
    """Validate a reply against ``tp``; raises ValueError with the validation problems."""
    try:
        return _adapter(tp).validate_json(text)
    except Exception as exc:
        raise ValueError(f"reply does not match response_format {tp!r}: {exc}") from exc


def canonical_schema_json(tp: Any) -> str:
    return json.dumps(schema_for(tp), sort_keys=True, separators=(",", ":"))
