"""The rate limits a provider states on its replies, read into one shape.

OpenAI (and servers that copy it) send ``x-ratelimit-{limit,remaining,reset}-
{requests,tokens}`` with Go-style durations (``1s``, ``6m0s``, ``20ms``) for the
resets; Anthropic sends ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}`` with RFC 3339 times; both may send
``retry-after`` (seconds or an HTTP date) and ``retry-after-ms``.  Each spelling
has its parser here, and both give a `ReportedLimits`, which the endpoint's rate
governor adopts (`plait.resources.rate`).

The parsers run on every reply, so they look up a handful of headers and parse
numbers, nothing more.  A header that does not give a finite, sane number (``inf``,
``nan``, ``1e999``, a count beyond `MAX_COUNT`, a reset further than `MAX_SECONDS`)
is ignored, with one warning per header name and process, never an exception: a
reply is worth more than its headers, and a limit nobody could pace by is no limit.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

from plait._secrets import scrub

__all__ = [
    "MAX_COUNT",
    "MAX_SECONDS",
    "Headers",
    "LimitHeaders",
    "ReportedLimits",
    "anthropic_limits",
    "openai_limits",
    "parse_duration",
    "parse_retry_after",
    "retry_after_of",
]

_log = logging.getLogger("plait")
_warned: set[str] = set()

#: The largest count read from a header.  No provider states a quadrillion requests or
#: tokens a minute; a larger number (a proxy's "unlimited", an overflow) is no limit
#: anyone could pace by, and past about 1e308 it is not even a float.
MAX_COUNT = 10**15
#: The furthest reset or Retry-After read from a header, in seconds: a year.  A budget
#: that resets later is no budget a run can wait for.
MAX_SECONDS = 366 * 86400.0


class Headers(Protocol):
    """What both HTTP clients' header types offer (aiohttp's and httpx's, case-insensitive)."""

    def get(self, key: str, /) -> str | None: ...


@dataclass(frozen=True, slots=True)
class LimitHeaders:
    """The headers a `ReportedLimits` read its resets from, to name them in messages."""

    requests_reset: str
    tokens_reset: str


_OPENAI_HEADERS = LimitHeaders("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")


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
    #: The headers the resets and the Retry-After came from.
    names: LimitHeaders = _OPENAI_HEADERS
    retry_after_header: str = "retry-after"

    def wait(self) -> tuple[float, str] | None:
        """How long a refused request should wait, and the header that says so: the
        server's Retry-After, else the reset of the budget it says is spent (requests
        or tokens, the later), else None."""
        if self.retry_after_s is not None:
            return self.retry_after_s, self.retry_after_header
        waits = []
        if self.requests_remaining == 0 and self.requests_reset_s is not None:
            waits.append((self.requests_reset_s, self.names.requests_reset))
        if self.tokens_remaining == 0 and self.tokens_reset_s is not None:
            waits.append((self.tokens_reset_s, self.names.tokens_reset))
        return max(waits) if waits else None


def _warn(name: str, value: str) -> None:
    if name in _warned:
        return
    _warned.add(name)
    shown = value if len(value) <= 40 else value[:37] + "..."
    _log.warning(
        "plait: ignoring the provider's %s header %r, which does not parse to a finite, "
        "sane number; the rate limit it states is not learned (said once per header)",
        name,
        shown,
    )


def _count(headers: Headers, name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    number = _whole(value)
    if number is None:
        _warn(name, value)
    return number


def _whole(text: str) -> int | None:
    """A count from ``0`` to `MAX_COUNT` (``"42"``, or ``"42.0"`` as some servers write
    it), else None."""
    try:
        number = int(text)
    except ValueError:  # not an integer, or one of more digits than Python reads
        try:
            real = float(text)
        except ValueError:
            return None
        if not math.isfinite(real):
            return None
        number = int(real)
    return number if 0 <= number <= MAX_COUNT else None


def _sane(seconds: float | None) -> bool:
    """Whether ``seconds`` is a wait plait can keep: finite, from 0 to `MAX_SECONDS`."""
    return seconds is not None and 0.0 <= seconds <= MAX_SECONDS


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
    if not _sane(seconds):
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
    seconds = max(0.0, moment.timestamp() - now)
    if not _sane(seconds):
        _warn(name, value)
        return None
    return seconds


def retry_after_of(headers: Headers) -> float | None:
    """``retry-after-ms``, else ``retry-after`` (seconds, or an HTTP date), in seconds."""
    found = _retry_after(headers)
    return None if found is None else found[0]


def _retry_after(headers: Headers) -> tuple[float, str] | None:
    """`retry_after_of`, with the name of the header it read."""
    value = headers.get("retry-after-ms")
    if value is not None:
        seconds = _seconds(value, 1000.0)
        if seconds is not None:
            return seconds, "retry-after-ms"
        _warn("retry-after-ms", value)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = parse_retry_after(value)
    if seconds is None:
        _warn("retry-after", value)
        return None
    return seconds, "retry-after"


def parse_retry_after(value: str) -> float | None:
    """A ``Retry-After`` value (seconds, or an HTTP date) in seconds from now, at least
    0; None when it is neither, or no finite, sane wait (`MAX_SECONDS`)."""
    seconds = _seconds(value, 1.0)
    if seconds is not None:
        return seconds
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = max(0.0, moment.timestamp() - time.time())
    return seconds if _sane(seconds) else None


def _seconds(value: str, per_second: float) -> float | None:
    """``value`` as a number of ``1 / per_second`` seconds, in seconds (a negative one
    as 0: the time has come); None when it is no finite, sane number."""
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    seconds = max(0.0, number / per_second)
    return seconds if seconds <= MAX_SECONDS else None


def openai_limits(headers: Headers) -> ReportedLimits | None:
    """OpenAI's spelling; None when the reply states no limit at all (or its headers
    could not be read: see `_read`)."""
    try:
        # Asked of every reply, and many servers state nothing: a lookup each, no parse.
        get = headers.get
        for name in _OPENAI_STATED:
            if get(name) is not None:
                break
        else:
            return None
    except Exception:  # a header type that misbehaves: `_read` says so once
        pass
    return _read(_openai_limits, headers)


def anthropic_limits(headers: Headers) -> ReportedLimits | None:
    """Anthropic's spelling; None when the reply states no limit at all (or its headers
    could not be read: see `_read`).

    plait paces prompt and completion tokens together, so of the token budgets
    stated the one with the smallest limit is taken (the strictest ``tokens`` one
    when Anthropic sends it).
    """
    return _read(_anthropic_limits, headers)


def _read(
    parse: Callable[[Headers], ReportedLimits | None], headers: Headers
) -> ReportedLimits | None:
    """``parse(headers)``, or None when it fails in a way the parsers do not foresee (a
    header type that misbehaves, say), with one warning: a paid reply is never lost
    to its rate-limit headers."""
    try:
        return parse(headers)
    except Exception as exc:  # the reply matters more than what its headers say
        if "rate-limit headers" not in _warned:
            _warned.add("rate-limit headers")
            _log.warning(
                "plait: ignoring a reply's rate-limit headers, which could not be read "
                "(%s: %s); the limits they state are not learned (said once)",
                type(exc).__name__,
                scrub(str(exc)),
            )
        return None


#: The headers without which `_openai_limits` finds no limit stated (it returns None):
#: the two limits it reads first and `_retry_after`'s two spellings.  A header that
#: states a limit on its own belongs here too.
_OPENAI_STATED = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "retry-after-ms",
    "retry-after",
)


def _openai_limits(headers: Headers) -> ReportedLimits | None:
    requests_limit = _count(headers, "x-ratelimit-limit-requests")
    tokens_limit = _count(headers, "x-ratelimit-limit-tokens")
    retry = _retry_after(headers)
    if requests_limit is None and tokens_limit is None and retry is None:
        return None
    return ReportedLimits(
        requests_limit=requests_limit,
        requests_remaining=_count(headers, "x-ratelimit-remaining-requests"),
        requests_reset_s=_duration(headers, "x-ratelimit-reset-requests"),
        tokens_limit=tokens_limit,
        tokens_remaining=_count(headers, "x-ratelimit-remaining-tokens"),
        tokens_reset_s=_duration(headers, "x-ratelimit-reset-tokens"),
        retry_after_s=None if retry is None else retry[0],
        at=time.monotonic(),
        retry_after_header="retry-after" if retry is None else retry[1],
    )


#: Anthropic's token budgets: ``tokens`` is the strictest in force; the input and
#: output budgets are read when it is absent.
_ANTHROPIC_TOKENS = ("tokens", "input-tokens", "output-tokens")
_ANTHROPIC_HEADERS = {
    budget: LimitHeaders(
        "anthropic-ratelimit-requests-reset", f"anthropic-ratelimit-{budget}-reset"
    )
    for budget in _ANTHROPIC_TOKENS
}


def _anthropic_limits(headers: Headers) -> ReportedLimits | None:
    requests_limit = _count(headers, "anthropic-ratelimit-requests-limit")
    retry = _retry_after(headers)
    now = time.time()
    tokens: tuple[int, int | None, float | None, str] | None = None
    for budget in _ANTHROPIC_TOKENS:
        limit = _count(headers, f"anthropic-ratelimit-{budget}-limit")
        if limit is None or (tokens is not None and limit >= tokens[0]):
            continue
        remaining = _count(headers, f"anthropic-ratelimit-{budget}-remaining")
        reset = _until(headers, f"anthropic-ratelimit-{budget}-reset", now)
        tokens = (limit, remaining, reset, budget)
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
        retry_after_s=None if retry is None else retry[0],
        at=time.monotonic(),
        names=_ANTHROPIC_HEADERS["tokens" if tokens is None else tokens[3]],
        retry_after_header="retry-after" if retry is None else retry[1],
    )
