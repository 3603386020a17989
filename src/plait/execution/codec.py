"""JSON for what pipelines produce: text, structures, tuples, pydantic models, dataclasses.

Checkpoints store outputs with this, so a resumed run hands back the same types
it would have computed.  A checkpoint holds data, never code: there is no pickle,
and a stored model or dataclass is rebuilt through its own validation only when
its class is already loaded in this process (a log never makes plait import a
module).  A class that cannot be found that way (one defined inside a function,
say) comes back as its plain JSON data.  Anything with no JSON form at all is a
`TypeError` naming it, for the caller to report.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from plait._digest import digest

__all__ = ["decode", "encode", "fingerprint"]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _loaded(path: str) -> Any:
    """The class at ``module:Qual.Name`` if its module is already imported, else None."""
    module_name, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if obj is None or part == "<locals>":
            return None
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


def encode(obj: Any, fallback: Any = None) -> Any:
    """``obj`` as JSON data; what has no JSON form raises `TypeError`, or becomes
    ``fallback(obj)`` when one is given (fingerprints use ``repr``)."""
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    if type(obj) is str:
        return obj
    if type(obj) is list:
        return [encode(item, fallback) for item in obj]
    if type(obj) is dict:
        if all(type(k) is str and not k.startswith("$") for k in obj):
            return {k: encode(v, fallback) for k, v in obj.items()}
        return {"$dict": [[encode(k, fallback), encode(v, fallback)] for k, v in obj.items()]}
    if type(obj) is tuple:
        return {"$tuple": [encode(item, fallback) for item in obj]}
    if isinstance(obj, str):
        return str(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return {"$model": _qualified(type(obj)), "data": dump(mode="json")}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"$dataclass": _qualified(type(obj)), "data": encode(fields, fallback)}
    if fallback is not None:
        return {"$repr": fallback(obj)}
    raise TypeError(
        f"a {type(obj).__name__} has no JSON form, so it cannot be kept in a checkpoint; "
        "return text, numbers, lists, dicts, tuples, pydantic models or dataclasses"
    )


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
        cls = _loaded(str(data["$model"]))
        validate = getattr(cls, "model_validate", None)
        return validate(data["data"]) if callable(validate) else data["data"]
    if "$dataclass" in data:
        cls = _loaded(str(data["$dataclass"]))
        fields = decode(data["data"])
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return cls(**fields)
        return fields
    if "$pickle" in data:
        raise ValueError(
            "this checkpoint holds a pickled value (written by an older plait); plait no "
            "longer unpickles checkpoints, which could run code: start over with a new "
            "checkpoint directory"
        )
    return {k: decode(v) for k, v in data.items()}


def fingerprint(obj: Any) -> str:
    """A stable hash of a value, for telling whether an input is the one recorded."""
    return digest(encode(obj, repr), size=12)
