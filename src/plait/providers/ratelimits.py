"""The rate limits a provider states on its replies, read into one shape.

OpenAI (and servers that copy it) send ``x-ratelimit-{limit,remaining,reset}-
{requests,tokens}`` with Go-style durations (``1s``, ``6m0s``, ``20ms``) for the
resets; Anthropic sends ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}`` with RFC 3339 times; both may send
``retry-after`` (seconds or an HTTP date) and ``retry-after-ms``.  Each spelling
has its parser here, and both give a `ReportedLimits`, which the endpoint's rate
governor adopts (`plait.resources.rate`).

The parsers run on every reply, so they look up a handful of headers and parse
numbers, nothing more; a header that does not parse is ignored, with one warning
per header name and process, never an exception: a reply is worth more than its
headers.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

__all__ = [
    "Headers",
    "ReportedLimits",
    "anthropic_limits",
    "openai_limits",
    "parse_duration",
    "retry_after_of",
]

_log = logging.getLogger("plait")
_warned: set[str] = set()


class Headers(Protocol):
    """What both HTTP clients' header types offer (aiohttp's and httpx's, case-insensitive)."""

    def get(self, key: str, /) -> str | None: ...


@dataclass(slots=True)
class ReportedLimits:
    """One reply's statement of its endpoint's limits.

    ``requests_limit`` and ``tokens_limit`` are per minute, as both providers state
    them; ``*_remaining`` is what is left of the budget now and ``*_reset_s`` the
    seconds until it is whole again, counted from ``at`` (`time.monotonic` when the
    reply was read).  A field the reply did not carry is None.
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_s: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float | None = None
    retry_after_s: float | None = None
    at: float = 0.0

    def wait_s(self) -> float | None:
        """How long a refused request should wait: the server's Retry-After, else the
        reset of the budget it says is spent (requests or tokens), else None."""
        if self.retry_after_s is not None:
            return self.retry_after_s
        waits = []
        if self.requests_remaining == 0 and self.requests_reset_s is not None:
            waits.append(self.requests_reset_s)
        if self.tokens_remaining == 0 and self.tokens_reset_s is not None:
            waits.append(self.tokens_reset_s)
        return max(waits) if waits else None


def _warn(name: str, value: str) -> None:
    if name in _warned:
        return
    _warned.add(name)
    shown = value if len(value) <= 40 else value[:37] + "..."
    _log.warning(
        "plait: ignoring the provider's %s header %r, which does not parse; the rate "
        "limits it states are not learned (said once per header)",
        name,
        shown,
    )


def _count(headers: Headers, name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        try:
            number = int(float(value))
        except ValueError:
            _warn(name, value)
            return None
    if number < 0:
        _warn(name, value)
        return None
    return number


_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")


#: Durations already parsed: a provider repeats the same few (``6m0s``, ``1s``) reply
#: after reply, and a dict lookup is cheaper than parsing again.  Cleared when full.
_durations: dict[str, float | None] = {}
_DURATIONS_KEPT = 4096


def parse_duration(text: str) -> float | None:
    """A Go-style duration (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) in seconds; a bare
    number counts as seconds; None when it is none of these."""
    try:
        return _durations[text]
    except KeyError:
        pass
    seconds = _parse_duration(text.strip())
    if len(_durations) >= _DURATIONS_KEPT:
        _durations.clear()
    _durations[text] = seconds
    return seconds


def _parse_duration(text: str) -> float | None:
    try:  # the usual shapes, without the regular expression
        if text.endswith("ms") and text[-3:-2].isdigit():
            return float(text[:-2]) / 1000.0
        if text.endswith("s") and text[-2:-1].isdigit() and text.count("m") + text.count("h") == 0:
            return float(text[:-1])
        return float(text)
    except ValueError:
        pass
    total, end = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        end = match.end()
    return total if end == len(text) and end else None


def _duration(headers: Headers, name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds is None or seconds < 0:
        _warn(name, value)
        return None
    return seconds


def _until(headers: Headers, name: str, now: float) -> float | None:
    """An RFC 3339 time, as seconds from ``now`` (epoch seconds); 0 once past."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        _warn(name, value)
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - now)


def retry_after_of(headers: Headers) -> float | None:
    """``retry-after-ms``, else ``retry-after`` (seconds, or an HTTP date), in seconds."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            _warn("retry-after-ms", value)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        _warn("retry-after", value)
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - time.time())


def openai_limits(headers: Headers) -> ReportedLimits | None:
    """OpenAI's spelling; None when the reply states no limit at all."""
    requests_limit = _count(headers, "x-ratelimit-limit-requests")
    tokens_limit = _count(headers, "x-ratelimit-limit-tokens")
    retry = retry_after_of(headers)
    if requests_limit is None and tokens_limit is None and retry is None:
        return None
    return ReportedLimits(
        requests_limit=requests_limit,
        requests_remaining=_count(headers, "x-ratelimit-remaining-requests"),
        requests_reset_s=_duration(headers, "x-ratelimit-reset-requests"),
        tokens_limit=tokens_limit,
        tokens_remaining=_count(headers, "x-ratelimit-remaining-tokens"),
        tokens_reset_s=_duration(headers, "x-ratelimit-reset-tokens"),
        retry_after_s=retry,
        at=time.monotonic(),
    )


#: Anthropic's token budgets: ``tokens`` is the strictest in force; the input and
#: output budgets are read when it is absent.
_ANTHROPIC_TOKENS = ("tokens", "input-tokens", "output-tokens")


def anthropic_limits(headers: Headers) -> ReportedLimits | None:
    """Anthropic's spelling; None when the reply states no limit at all.

    plait paces prompt and completion tokens together, so of the token budgets
    stated the one with the smallest limit is taken (the strictest ``tokens`` one
    when Anthropic sends it).
    """
    requests_limit = _count(headers, "anthropic-ratelimit-requests-limit")
    retry = retry_after_of(headers)
    now = time.time()
    tokens: tuple[int, int | None, float | None] | None = None
    for budget in _ANTHROPIC_TOKENS:
        limit = _count(headers, f"anthropic-ratelimit-{budget}-limit")
        if limit is None or (tokens is not None and limit >= tokens[0]):
            continue
        remaining = _count(headers, f"anthropic-ratelimit-{budget}-remaining")
        reset = _until(headers, f"anthropic-ratelimit-{budget}-reset", now)
        tokens = (limit, remaining, reset)
        if budget == "tokens":
            break
    if requests_limit is None and tokens is None and retry is None:
        return None
    return ReportedLimits(
        requests_limit=requests_limit,
        requests_remaining=_count(headers, "anthropic-ratelimit-requests-remaining"),
        requests_reset_s=_until(headers, "anthropic-ratelimit-requests-reset", now),
        tokens_limit=None if tokens is None else tokens[0],
        tokens_remaining=None if tokens is None else tokens[1],
        tokens_reset_s=None if tokens is None else tokens[2],
        retry_after_s=retry,
        at=time.monotonic(),
    )
