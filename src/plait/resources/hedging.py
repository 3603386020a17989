"""Hedged requests: a second copy of a request still unanswered after a while.

A few requests in a batch take far longer than the rest (a slow replica, a stalled
connection), and the batch waits for its slowest call.  An alias with
``hedge_after`` sends a second copy of a request that has had no reply after that
long (seconds, or a quantile of the alias's observed latency such as ``"p95"``); the
first reply wins and the other copy is cancelled.  ``max_hedge_fraction`` bounds the
copies as a share of the alias's requests.  A copy takes the next free concurrency
slot ahead of every waiting call (of a fellow deployment, for an alias with several),
and goes only when nothing else would hold it: no wait under the rate limits, every
admission gate (a budget) agreeing; otherwise the call waits for its first copy.

Both copies are the same request, seed included, so an endpoint that honours seeds
gives the same answer whichever wins.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from plait.providers.base import LLMResponse
from plait.resources.config import parse_hedge_after

if TYPE_CHECKING:
    from plait.resources.usage import AliasUsage

__all__ = [
    "UNKNOWN_DELAY_POLL_S",
    "Hedging",
    "NotNow",
    "close_wait",
    "drop",
    "first_reply",
    "parse_hedge_after",
]

#: Replies seen before a quantile ``hedge_after`` hedges at all.
MIN_SAMPLES = 20
#: How often a request sent before the latency quantile could be read looks again.
UNKNOWN_DELAY_POLL_S = 0.5
#: Replies between two readings of the latency quantile (sorting the sample is not free).
_REREAD = 64


class Hedging:
    """One alias's hedging: when to send a second copy, and how many have gone.

    Args:
        after: ``hedge_after`` (seconds, or a quantile such as ``"p95"``).
        max_fraction: The most copies, as a share of the alias's calls.
    """

    def __init__(self, after: float | str, max_fraction: float) -> None:
        self.seconds, self.quantile = parse_hedge_after(after)
        self.max_fraction = max_fraction
        #: Calls that could have been hedged, and copies sent.
        self.calls = 0
        self.copies = 0
        self._delay: float | None = self.seconds
        self._read_at = 0

    def delay(self, usage: AliasUsage) -> float | None:
        """How long a request waits for its reply before a copy may go (None: no
        hedging yet, the latency quantile having too few replies to read)."""
        if self.quantile is None:
            return self.seconds
        seen = usage.succeeded
        if seen < MIN_SAMPLES:
            return None
        if self._delay is None or seen - self._read_at >= _REREAD:
            self._delay = usage.latency_percentile(self.quantile)
            self._read_at = seen
        return self._delay

    def may_copy(self) -> bool:
        """Whether one more copy stays within ``max_hedge_fraction`` of the calls."""
        return self.copies + 1 <= self.max_fraction * self.calls


class NotNow(Exception):
    """A gate would have a copy wait: no copy is sent."""


def close_wait(waiting: Any) -> None:
    """Close what a gate returned to wait on, unawaited (a copy does not wait)."""
    close = getattr(waiting, "close", None)
    if callable(close):
        close()


async def first_reply(
    first: asyncio.Future[LLMResponse], second: asyncio.Future[LLMResponse]
) -> LLMResponse:
    """The first of two copies to reply; a copy that fails waits for the other."""
    pending = {first, second}
    failure: BaseException | None = None
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            error = task.exception()
            if error is None:
                return task.result()
            if failure is None or task is first:
                failure = error
    assert failure is not None
    raise failure


def drop(task: asyncio.Future[Any]) -> None:
    """Cancel a copy still running; never leave a finished one's error unread."""
    if task.done():
        if not task.cancelled():
            task.exception()
        return
    task.cancel()
    task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
