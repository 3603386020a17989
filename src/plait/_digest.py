"""Stable hashes of plain data.

Checkpoints hash every input and every request to tell whether a recorded answer
still belongs to it, so the hash is on the hot path of a checkpointed run.  Plain
data (text, numbers, lists, dicts with text keys) is hashed as orjson's sorted
JSON, which costs little more than the hash itself; anything orjson refuses
(other types, non-text keys, lone surrogates, huge integers) is fed to the hash
by a walker that tags each piece with its type and prefixes it with its length,
so distinct values stay distinct (``["ab", "c"]`` and ``["a", "bc"]`` never
collide by construction).  The walker's bytes start with a NUL, which JSON never
does, so the two forms cannot collide with each other either.

Keys written before `digest` existed (the response cache's, the checkpoint
manifest's producer and code hashes, the fake server's request keys) were the
hash of the standard library's JSON text, or of raw bytes; `json_digest` and
`hex_digest` compute exactly those, so that stored caches and checkpoints keep
matching.  Every hash plait keeps goes through this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["digest", "hex_digest", "json_digest"]


def digest(obj: Any, fallback: Callable[[Any], str] = repr, size: int = 16) -> str:
    """Hex digest (``2 * size`` characters) of ``obj``; what is not plain data is
    hashed by ``fallback(obj)`` (with its type's name)."""
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pieces: list[bytes] = [b"\x00"]
        _feed(pieces.append, obj, fallback)
        data = b"".join(pieces)
    return hex_digest(data, size)


def hex_digest(data: str | bytes, size: int = 16, *, algorithm: str = "sha256") -> str:
    """Hex digest (``2 * size`` characters) of ``data``; text is hashed as its UTF-8
    bytes, a lone surrogate as its code point (so any ``str`` can be hashed).

    ``algorithm`` exists for the one name fixed before plait settled on SHA-256 (a
    blueprint file's module name, SHA-1): changing it would rename that module.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    hasher = hashlib.sha256(raw) if algorithm == "sha256" else hashlib.new(algorithm, raw)
    return hasher.hexdigest()[: 2 * size]


def json_digest(
    obj: Any,
    default: Callable[[Any], Any] | None = repr,
    *,
    compact: bool = False,
    ensure_ascii: bool = True,
    size: int = 16,
) -> str:
    """Hex digest of the standard library's JSON text of ``obj``, keys sorted.

    ``default``, ``ensure_ascii`` and ``compact`` (no spaces after ``,`` and ``:``)
    are `json.dumps`'s; each caller passes the ones its stored keys were made with,
    since any change to the text would change every key.  Slower than `digest`, so
    new keys should use that instead.
    """
    text = json.dumps(
        obj,
        sort_keys=True,
        default=default,
        ensure_ascii=ensure_ascii,
        separators=(",", ":") if compact else None,
    )
    return hex_digest(text, size)


def _feed(put: Callable[[bytes], None], obj: Any, fallback: Callable[[Any], str]) -> None:
    kind = type(obj)
    if kind is str:
        data = obj.encode("utf-8", "surrogatepass")
        put(b"s%d:" % len(data))
        put(data)
    elif kind is dict:
        put(b"d%d{" % len(obj))
        try:
            items = sorted(obj.items())
        except TypeError:  # keys of mixed types: order by their text instead
            items = sorted(obj.items(), key=lambda kv: repr(kv[0]))
        for key, value in items:
            if type(key) is str and type(value) is str:  # a chat message: the hot path
                k, v = key.encode("utf-8", "surrogatepass"), value.encode("utf-8", "surrogatepass")
                put(b"s%d:%bs%d:" % (len(k), k, len(v)))
                put(v)
            else:
                _feed(put, key, fallback)
                _feed(put, value, fallback)
    elif kind is list or kind is tuple:
        put(b"%b%d[" % (b"l" if kind is list else b"t", len(obj)))
        for item in obj:
            _feed(put, item, fallback)
    elif obj is None:
        put(b"N")
    elif kind is bool:
        put(b"T" if obj else b"F")
    elif kind is int:
        put(b"i%d;" % obj)
    elif kind is float:
        put(b"f%b;" % repr(obj).encode())
    elif kind is bytes:
        put(b"b%d:" % len(obj))
        put(obj)
    elif isinstance(obj, str):  # a str subclass hashes as the text it is
        _feed(put, str(obj), fallback)
    else:
        put(b"o")
        _feed(put, f"{type(obj).__qualname__}:{fallback(obj)}", fallback)
