"""What strict JSON can carry, checked before a reply is sent or an input is run.

Python's ``json`` reads and writes more than JSON: ``NaN`` and ``Infinity`` (and
``1e400``, which it reads as infinity), and strings holding a lone surrogate (half of a
UTF-16 pair, what a client leaves when it cuts a string inside an emoji), which
UTF-8 cannot encode.  A reply holding one is refused by strict parsers, or cannot be
encoded at all; an input holding one cannot be sent on.  `problem` finds such a value
and says where it is, so that a served pipeline refuses that input (a 422) or turns
that one row into its error, and `printable` makes text of them for an error reply.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

__all__ = ["MAX_DEPTH", "printable", "problem"]

#: How deep a value may nest: far below the interpreter's recursion limit, which the
#: JSON encoder runs into (deeper data would fail while the reply is being written).
MAX_DEPTH = 200
#: Integers with more bits than this may have more digits than Python turns into text
#: (`sys.get_int_max_str_digits`): those are checked by converting them.
_BIG_INT_BITS = 10_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def problem(value: Any, where: str = "") -> str | None:
    """What in ``value`` (JSON data: dicts, lists, text, numbers, booleans, None) strict
    JSON cannot carry, and where (``where`` then the path inside, e.g.
    ``output["scores"][2]``); None when everything can be carried.

    Walks the value without recursion, so data nested past `MAX_DEPTH` is reported
    rather than overflowing the stack.
    """
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > MAX_DEPTH:  # said of the whole value: its path would be a page long
            return f"{where or 'it'} nests deeper than {MAX_DEPTH} levels, more than is accepted"
        found = _problem_of(item)
        if found is not None:
            return f"{where}{_path(path)} {found}" if where or path else found
        if isinstance(item, dict):
            for key, inner in item.items():
                key_problem = _text_problem(key) if isinstance(key, str) else None
                if key_problem is not None:
                    return f"{where}{_path(path)} has a key that {key_problem}"
                stack.append((inner, (*path, key)))
        elif isinstance(item, list | tuple):
            stack.extend((inner, (*path, i)) for i, inner in enumerate(item))
    return None


def _problem_of(item: Any) -> str | None:
    if isinstance(item, float):
        if math.isfinite(item):
            return None
        return (
            f"is {_float_text(item)}, which strict JSON has no form for (it has no NaN or "
            "Infinity; a number as large as 1e400 reads as Infinity)"
        )
    if isinstance(item, str):
        return _text_problem(item)
    if isinstance(item, int) and item.bit_length() > _BIG_INT_BITS:
        try:
            str(item)
        except ValueError:
            return (
                f"is an integer of {item.bit_length()} bits, more digits than "
                f"{sys.get_int_max_str_digits()}, which is as many as are turned into text"
            )
    return None


def _text_problem(text: str) -> str | None:
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return (
        f"holds a lone surrogate ({ascii(found.group())[1:-1]} at character "
        f"{found.start()}), half of a UTF-16 pair, which UTF-8 cannot encode (a string "
        "cut inside a character such as an emoji leaves one)"
    )


def _float_text(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{part!r}]" if isinstance(part, int) else f'["{part}"]' for part in path)


#: How deep an error reply quotes a value (`printable`): enough to see what was sent.
_QUOTED_DEPTH = 16


def printable(value: Any) -> Any:
    """``value`` with what strict JSON cannot carry made text: a lone surrogate as its
    escape (``\\ud800``), NaN and the infinities as words, and what nests deeper than
    a few levels as ``"..."``.  For error replies, which must always be sent: they may
    quote what was refused."""
    return _printable(value, 0)


def _printable(value: Any, depth: int) -> Any:
    if depth > _QUOTED_DEPTH and isinstance(value, dict | list | tuple):
        return "..."
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _float_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if _problem_of(value) is None:
            return value
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, dict):
        return {_text(str(key)): _printable(inner, depth + 1) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(inner, depth + 1) for inner in value]
    return value


def _text(text: str) -> str:
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
