"""Lossless JSON for what pipelines produce: text, structures, tuples, pydantic models.

Checkpoints store outputs with this, so a resumed run hands back the same types
it would have computed.  Anything JSON cannot express falls back to a tagged
pickle, which keeps arbitrary outputs resumable.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import pickle
from typing import Any

__all__ = ["decode", "encode", "fingerprint"]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def encode(obj: Any) -> Any:
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if type(obj) is str:
        return obj
    if type(obj) is list:
        return [encode(item) for item in obj]
    if type(obj) is dict:
        if all(type(k) is str and not k.startswith("$") for k in obj):
            return {k: encode(v) for k, v in obj.items()}
        return {"$dict": [[encode(k), encode(v)] for k, v in obj.items()]}
    if type(obj) is tuple:
        return {"$tuple": [encode(item) for item in obj]}
    dump = getattr(obj, "model_dump", None)
    if callable(dump) and _importable(type(obj)):
        return {"$model": _qualified(type(obj)), "data": dump(mode="json")}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _importable(type(obj)):
        return {"$dataclass": _qualified(type(obj)), "data": encode(_fields(obj))}
    return {"$pickle": base64.b64encode(pickle.dumps(obj)).decode()}


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _importable(cls: type) -> bool:
    try:
        return _import(_qualified(cls)) is cls
    except Exception:
        return False


def decode(data: Any) -> Any:
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if "$tuple" in data:
        return tuple(decode(item) for item in data["$tuple"])
    if "$dict" in data:
        return {decode(k): decode(v) for k, v in data["$dict"]}
    if "$model" in data:
        return _import(data["$model"]).model_validate(data["data"])
    if "$dataclass" in data:
        cls = _import(data["$dataclass"])
        return cls(**decode(data["data"]))
    if "$pickle" in data:
        return pickle.loads(base64.b64decode(data["$pickle"]))
    return {k: decode(v) for k, v in data.items()}


def fingerprint(obj: Any) -> str:
    """A stable hash of a value, for telling whether an input is the one recorded."""
    blob = json.dumps(encode(obj), sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]
