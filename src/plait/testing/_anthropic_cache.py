"""Prompt-cache accounting of the fake Anthropic server (see :mod:`plait.testing.fake_anthropic`).

The real API caches the prompt's prefix up to each block marked ``cache_control``, in the
order tools, system, messages. This module keeps the same books with the fake's token
estimate: a request's prompt is a sequence of blocks, each prefix of it has a key (the model
and the exact content of every block up to it, ``cache_control`` fields left out) and a token
count, and the cache maps keys to expiry times.

For one request:

* a *read* is the longest prefix, among the breakpoints and the
  :data:`LOOKBACK_BLOCKS` block boundaries before each of them, whose key is in the cache;
  using an entry refreshes its lifetime;
* every breakpoint after it whose prefix reaches ``min_tokens`` is *written*, each with its
  own ``ttl``; the tokens between consecutive written breakpoints count as creation tokens
  of that breakpoint's ``ttl`` (a prefix below ``min_tokens`` is silently not cached);
* ``input_tokens`` is what remains: the whole prompt less what was read and written.

Time is the server's monotonic clock plus ``clock_offset_s``, which tests advance instead of
waiting for an entry to expire.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from plait._digest import digest
from plait.testing.fake_openai import estimate_tokens

__all__ = [
    "CACHE_TTLS",
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "CacheControlError",
    "CacheUse",
    "Prompt",
    "PromptCache",
]

CACHE_TTLS: Final[dict[str, float]] = {"5m": 300.0, "1h": 3600.0}
"""The ``ttl`` values ``cache_control`` takes, in seconds; ``"5m"`` when none is given."""

MAX_BREAKPOINTS: Final = 4
"""How many blocks of one request may carry ``cache_control``."""

LOOKBACK_BLOCKS: Final = 20
"""How many block boundaries before a breakpoint are also checked for a cache hit."""


class CacheControlError(ValueError):
    """A ``cache_control`` the real API refuses with 400; the message says why."""


def json_chars(value: Any) -> int:
    """Characters of ``value`` as compact JSON: what a non-text block counts for."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def without_cache_control(block: dict[str, Any]) -> dict[str, Any]:
    """The block as it counts for the cache key and for tokens: its ``cache_control`` aside."""
    return {key: value for key, value in block.items() if key != "cache_control"}


@dataclass(frozen=True)
class _Breakpoint:
    index: int
    ttl: str


@dataclass
class Prompt:
    """A request's prompt as the cache sees it, built block by block in the API's order."""

    model: str
    _last: str = field(init=False, repr=False)
    """The key of the prefix so far: each block's key hashes the previous key with the block."""
    keys: list[str] = field(default_factory=list)
    """The key of the prefix ending with each block."""
    chars: list[int] = field(default_factory=list)
    """Characters of the prompt up to and including each block."""
    breakpoints: list[_Breakpoint] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._last = digest(["model", self.model])

    @property
    def total_chars(self) -> int:
        return self.chars[-1] if self.chars else 0

    def mark(self, label: str, value: Any) -> None:
        """Fold something that is not a block (``tool_choice``) into every later prefix key."""
        self._last = digest([self._last, label, value])

    def add(self, section: str, block: dict[str, Any], chars: int, where: str) -> None:
        """Append one block (``cache_control`` included, checked here) of ``chars`` characters."""
        self._last = digest([self._last, section, without_cache_control(block)])
        self.keys.append(self._last)
        self.chars.append(self.total_chars + chars)
        control = block.get("cache_control")
        if control is None:
            return
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            raise CacheControlError(f"{where}.cache_control.type: Input should be 'ephemeral'")
        ttl = control.get("ttl", "5m")
        if ttl not in CACHE_TTLS:
            raise CacheControlError(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
        if block.get("type") == "text" and not block.get("text"):
            raise CacheControlError(f"{where}: cache_control cannot be set for empty text blocks")
        if self.breakpoints and self.breakpoints[-1].ttl == "5m" and ttl == "1h":
            raise CacheControlError(
                f"{where}.cache_control.ttl: a ttl='1h' cache_control block must not come after "
                "a ttl='5m' one"
            )
        self.breakpoints.append(_Breakpoint(len(self.keys) - 1, ttl))

    def check(self) -> None:
        """Refuse the prompt as a whole (too many breakpoints)."""
        if len(self.breakpoints) > MAX_BREAKPOINTS:
            raise CacheControlError(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(self.breakpoints)}."
            )


@dataclass(frozen=True)
class CacheUse:
    """What one request did with the cache, in tokens, and the input tokens that remain."""

    input_tokens: int
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0

    @property
    def write(self) -> int:
        return self.write_5m + self.write_1h

    def usage(self) -> dict[str, Any]:
        """The cache fields of a Message's ``usage``."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.write,
            "cache_read_input_tokens": self.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.write_5m,
                "ephemeral_1h_input_tokens": self.write_1h,
            },
        }

    def record(self) -> dict[str, int]:
        """How ``/_stats`` shows it."""
        return {"read": self.read, "write": self.write}


class PromptCache:
    """Prefix keys with their expiry times, on a clock tests can move forward."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, float]] = {}
        """key -> (expires at, ttl in seconds)."""

    def clear(self) -> None:
        self._entries.clear()

    def live(self, now: float) -> int:
        """How many entries have not expired at ``now``."""
        return sum(1 for expires, _ in self._entries.values() if expires > now)

    def _hit(self, key: str, now: float) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry[0] <= now:
            del self._entries[key]
            return False
        self._entries[key] = (now + entry[1], entry[1])  # every use refreshes the lifetime
        return True

    def account(self, prompt: Prompt, *, now: float, min_tokens: int) -> CacheUse:
        """Read and write the cache for one request that the server answers."""
        total = estimate_tokens(prompt.total_chars)
        if not prompt.breakpoints:
            return CacheUse(input_tokens=total)

        def tokens(index: int) -> int:
            return estimate_tokens(prompt.chars[index])

        candidates: set[int] = set()
        for point in prompt.breakpoints:
            candidates.update(range(max(point.index - LOOKBACK_BLOCKS, 0), point.index + 1))
        read_at = -1
        for index in sorted(candidates, reverse=True):
            if self._hit(prompt.keys[index], now):
                read_at = index
                break
        read = tokens(read_at) if read_at >= 0 else 0

        written = {"5m": 0, "1h": 0}
        covered = read
        for point in prompt.breakpoints:
            if point.index <= read_at or tokens(point.index) < min_tokens:
                continue
            ttl_s = CACHE_TTLS[point.ttl]
            self._entries[prompt.keys[point.index]] = (now + ttl_s, ttl_s)
            written[point.ttl] += tokens(point.index) - covered
            covered = tokens(point.index)
        return CacheUse(
            input_tokens=total - covered,
            read=read,
            write_5m=written["5m"],
            write_1h=written["1h"],
        )
