"""Argument keys and the layers that hold them: which value a dotted path receives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Found", "Layer", "Pattern", "found_items", "join_path", "parse_key"]

#: Stands for "any number of path segments, including none" inside a parsed key.
_GAP = None


def join_path(path: str, name: str) -> str:
    """``name`` under ``path``; the empty path is the target itself."""
    return f"{path}.{name}" if path else name


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed key: names, with ``None`` where ``...`` allows any segments."""

    key: str
    items: tuple[str | None, ...]

    @property
    def wildcard(self) -> bool:
        return _GAP in self.items

    @property
    def specificity(self) -> int:
        """Named segments: among wildcards of one layer, more names means a closer aim."""
        return sum(1 for item in self.items if item is not _GAP)

    def matches(self, path: str) -> bool:
        if not self.wildcard:
            return self.key == path
        return _match(self.items, tuple(path.split(".")))

    @property
    def last_name(self) -> str:
        return next(item for item in reversed(self.items) if item is not _GAP)


def _match(items: tuple[str | None, ...], parts: tuple[str, ...]) -> bool:
    # Keys are short (a handful of segments), so the plain recursion is cheap enough.
    if not items:
        return not parts
    head, rest = items[0], items[1:]
    if head is _GAP:
        return any(_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and parts[0] == head and _match(rest, parts[1:])


def parse_key(key: object) -> Pattern | str:
    """The pattern for ``key``, or why it is not one (reported by ``make()``, not here)."""
    if not isinstance(key, str):
        return f"argument names must be strings, got {type(key).__name__} {key!r}"
    if not key:
        return "empty argument name"
    if key.endswith("..."):
        return f"{key!r}: a wildcard cannot end a key ('...' must be followed by a name)"
    items: list[str | None] = []
    for i, piece in enumerate(key.split("...")):
        if i > 0:
            items.append(_GAP)
        if piece == "" and i == 0:
            continue
        for name in piece.split("."):
            if not name or not name.strip() or name != name.strip():
                return (
                    f"{key!r} is not a valid argument name: use dotted names like "
                    "'summarizer.temperature' or wildcards like '...temperature'"
                )
            items.append(name)
    return Pattern(key, tuple(items))


@dataclass(frozen=True, slots=True)
class Found:
    """A value some layer gave a path, and where it came from (for help and errors)."""

    value: Any
    layer: str
    index: int
    key: str | None  # the key as written; None when inherited from a mapping value


def found_items(values: Mapping[Any, Any], layer: str, index: int) -> dict[str, Found]:
    """The items of a whole mapping ``layer`` gave (or a default held), each as found there.

    They have no key of their own, so keys naming an item (``aliases.fast.model=m``)
    compete with them by layer order alone.
    """
    return {str(k): Found(v, layer, index, None) for k, v in values.items()}


@dataclass(slots=True)
class Layer:
    """One ``apply()``: its keys, split into exact ones and wildcards ranked by specificity."""

    name: str
    values: dict[str, Any]
    exact: dict[str, Any] = field(init=False)
    wildcards: list[Pattern] = field(init=False)
    invalid: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.exact = {}
        self.wildcards = []
        self.invalid = []
        for key, value in self.values.items():
            parsed = parse_key(key)
            if isinstance(parsed, str):
                self.invalid.append(parsed)
            elif parsed.wildcard:
                self.wildcards.append(parsed)
            else:
                self.exact[key] = value
        # Most named segments first; among equals the longer key, then the later one.
        order = {p.key: i for i, p in enumerate(self.wildcards)}
        self.wildcards.sort(key=lambda p: (-p.specificity, -len(p.key), -order[p.key]))

    @classmethod
    def of(cls, name: str, values: Mapping[Any, Any]) -> Layer:
        return cls(name, dict(values))

    def find(self, path: str) -> tuple[str, Any] | None:
        if path in self.exact:
            return path, self.exact[path]
        for pattern in self.wildcards:
            if pattern.matches(path):
                return pattern.key, self.values[pattern.key]
        return None
