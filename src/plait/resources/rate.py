"""Request and token rate limits, and backing off when an endpoint says 429.

Limits are paced, not windowed: a limit of N per minute admits N/60 per second
with a burst of one second's worth, which is how providers enforce them too
(a 6,000 RPM key is throttled at ~100 per second).  Tokens are estimated before
a call (prompt characters / 4 plus ``max_tokens``) and corrected with the reply's
reported usage, so a run converges on the true rate without ever over-sending.

On a 429 the endpoint pauses every sender until ``Retry-After`` has passed and
halves its concurrency; each success gives a little back (additive increase,
one slot per window of successes) until the configured limit is reached again.

Limits learned from replies (`learn`): a reply that states its endpoint's limits
(`plait.providers.ratelimits.ReportedLimits`) sets the limit in force to the
smaller of the configured and the reported one, so an alias configured with none
is paced at the provider's own rate from its first replies on.  Its remaining
budget and reset time bound the window until that reset: no more requests (or
estimated tokens) go before it than the reply said remain, less those already on
their way.  A reset far away holds requests no longer than a 429's Retry-After may
(the endpoint's ``max_retry_after_s``); then they go, and the provider decides.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from plait.resources.limits import PriorityLimiter

if TYPE_CHECKING:
    from plait.providers.ratelimits import ReportedLimits

__all__ = ["RateGovernor", "ReportedWindow", "TokenBucket", "smaller"]

#: The least time a burst of 429s may halve concurrency again.
_DECREASE_INTERVAL_S = 1.0


class TokenBucket:
    """``per_minute`` units a minute, paced per second; a draw may leave it in debt.

    Letting one draw exceed the burst (and go into debt) means a request larger
    than a second's worth of tokens still goes, and later ones wait it off.
    """

    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self.burst = max(1.0, self.rate)
        self.level = self.burst
        self.stamp = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_time(self, amount: float) -> float:
        """Seconds until ``amount`` (capped at the burst) is available; 0 takes it now."""
        with self._lock:
            now = time.monotonic()
            self._refill(now)
            need = min(amount, self.burst)
            if self.level >= need:
                self.level -= amount
                return 0.0
            return (need - self.level) / self.rate

    def adjust(self, amount: float) -> None:
        """Give back (positive) or charge (negative) units after the fact."""
        with self._lock:
            self._refill(time.monotonic())
            self.level = min(self.burst, self.level + amount)

    def set_rate(self, per_minute: float) -> None:
        """Pace at ``per_minute`` from now on, keeping what the bucket holds (up to the
        new burst): a learned limit must not hand out a fresh burst."""
        with self._lock:
            self._refill(time.monotonic())
            self.rate = per_minute / 60.0
            self.burst = max(1.0, self.rate)
            self.level = min(self.level, self.burst)

    @property
    def per_minute(self) -> float:
        return self.rate * 60.0


def smaller(configured: int | None, reported: int | None) -> int | None:
    """The limit in force: the smaller of the two that are known."""
    if configured is None:
        return reported
    if reported is None:
        return configured
    return min(configured, reported)


class ReportedWindow:
    """What a reply said is left of one budget (requests or tokens) until its reset:
    sends are counted against it until then, and wait for the reset once it is spent.

    The wait is bounded as a 429's Retry-After is (``max_retry_after_s``): a window
    ends at its reset or that long after the reply, whichever comes first, and the
    request then goes; if the budget really is spent, the provider's 429 says so and
    is retried, then failed, by the same rule.  ``header`` and ``reset_s`` are what the
    reply stated, for the message that says why calls wait.
    """

    __slots__ = ("header", "left", "reset_s", "until")

    def __init__(self) -> None:
        self.left = 0.0
        self.until = 0.0
        self.header = ""
        self.reset_s = 0.0

    def state(
        self,
        remaining: int,
        reset_s: float,
        at: float,
        in_flight: float,
        header: str,
        max_wait_s: float = math.inf,
    ) -> None:
        """A reply read at ``at`` said in ``header`` that ``remaining`` are left for
        ``reset_s`` seconds (counted here for ``max_wait_s`` at most); ``in_flight``
        were sent meanwhile and may not be counted in it yet."""
        self.left = remaining - in_flight
        self.until = at + min(reset_s, max_wait_s)
        self.reset_s = reset_s
        self.header = header


class RateGovernor:
    """Everything that paces one endpoint: RPM, TPM, Retry-After pauses and AIMD."""

    #: Whether `open_at` may stand in for `admit`: not in a subclass that overrides
    #: ``admit``, whose admission may need more than no limit and no pause (a lease).
    paces_locally: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "admit" in cls.__dict__:
            cls.paces_locally = False

    def __init__(
        self,
        limiter: PriorityLimiter,
        max_concurrent: int,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
    ) -> None:
        self.limiter = limiter
        self.max_concurrent = max_concurrent
        self.requests = TokenBucket(requests_per_minute) if requests_per_minute else None
        self.tokens = TokenBucket(tokens_per_minute) if tokens_per_minute else None
        #: The limits configured, and the latest ones replies stated (`learn`).
        self.configured: tuple[int | None, int | None] = (requests_per_minute, tokens_per_minute)
        self.reported: ReportedLimits | None = None
        self.reported_per_minute: tuple[int | None, int | None] = (None, None)
        self.request_window: ReportedWindow | None = None
        self.token_window: ReportedWindow | None = None
        self.paused_until = 0.0
        #: When the latest long wait a server asked for ends (`announce`).
        self._announced_until = -math.inf
        self._last_decrease = 0.0
        self._successes = 0
        self._lock = threading.Lock()

    def configure(
        self, max_concurrent: int, requests_per_minute: int | None, tokens_per_minute: int | None
    ) -> None:
        """Follow a changed configuration of the same endpoint."""
        if max_concurrent != self.max_concurrent:
            self.max_concurrent = max_concurrent
            self.limiter.set_limit(max_concurrent)
        self.configured = (requests_per_minute, tokens_per_minute)
        self._pace(*self.effective())

    def effective(self) -> tuple[int | None, int | None]:
        """The requests and tokens per minute in force: configured or reported, the smaller."""
        (rpm, tpm), (seen_rpm, seen_tpm) = self.configured, self.reported_per_minute
        return smaller(rpm, seen_rpm), smaller(tpm, seen_tpm)

    def _pace(self, requests_per_minute: int | None, tokens_per_minute: int | None) -> None:
        """Pace at these limits (None: none), keeping what the buckets hold."""
        if (self.requests.per_minute if self.requests else None) != requests_per_minute:
            if requests_per_minute and self.requests is not None:
                self.requests.set_rate(requests_per_minute)
            else:
                self.requests = TokenBucket(requests_per_minute) if requests_per_minute else None
        if (self.tokens.per_minute if self.tokens else None) != tokens_per_minute:
            if tokens_per_minute and self.tokens is not None:
                self.tokens.set_rate(tokens_per_minute)
            else:
                self.tokens = TokenBucket(tokens_per_minute) if tokens_per_minute else None

    def learn(
        self,
        limits: ReportedLimits,
        in_flight: int,
        tokens_in_flight: float = 0,
        max_wait_s: float = math.inf,
    ) -> None:
        """Adopt what a reply stated: its per-minute limits (the smaller of configured
        and reported is paced), and its remaining budgets until their resets (waited
        for ``max_wait_s`` at most, see `ReportedWindow`), of which ``in_flight`` other
        requests sent meanwhile (``tokens_in_flight`` tokens, as estimated) may already
        have taken a part."""
        with self._lock:
            per_minute = (
                limits.requests_limit or self.reported_per_minute[0],
                limits.tokens_limit or self.reported_per_minute[1],
            )
            if per_minute != self.reported_per_minute:
                self.reported_per_minute = per_minute
                self._pace(*self.effective())
            self.reported = limits
            if limits.requests_remaining is not None and limits.requests_reset_s is not None:
                if self.request_window is None:
                    self.request_window = ReportedWindow()
                self.request_window.state(
                    limits.requests_remaining,
                    limits.requests_reset_s,
                    limits.at,
                    in_flight,
                    limits.names.requests_reset,
                    max_wait_s,
                )
            if limits.tokens_remaining is not None and limits.tokens_reset_s is not None:
                if self.token_window is None:
                    self.token_window = ReportedWindow()
                self.token_window.state(
                    limits.tokens_remaining,
                    limits.tokens_reset_s,
                    limits.at,
                    tokens_in_flight,
                    limits.names.tokens_reset,
                    max_wait_s,
                )

    def open_at(self, now: float) -> bool:
        """Whether a request may go at ``now`` with nothing to wait for or account: no
        RPM or TPM limit and no Retry-After pause (`admit` would return at once having
        drawn nothing), so the caller can skip `admit` and the estimate it takes."""
        return (
            self.paces_locally
            and self.requests is None
            and self.tokens is None
            and self.request_window is None
            and self.token_window is None
            and self.paused_until <= now
        )

    async def admit(self, estimated_tokens: int) -> None:
        """Wait until a request of ``estimated_tokens`` may be sent, then account for it."""
        while True:
            wait = self.wait_time(estimated_tokens)
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    def wait_time(self, estimated_tokens: int) -> float:
        """Take what a request of ``estimated_tokens`` needs and return 0 if it may go now;
        else take nothing and return how long to wait before asking again.  A plain call:
        the endpoint calls it first and awaits `admit` only when it has to wait, so a
        paced call that need not wait costs no coroutine."""
        delay = self.paused_until - time.monotonic()
        if delay > 0:
            return delay
        requests, tokens = self.requests, self.tokens
        if requests is not None:
            wait = requests.wait_time(1)
            if wait > 0:
                return wait
        if tokens is not None:
            wait = tokens.wait_time(estimated_tokens)
            if wait > 0:
                if requests is not None:
                    requests.adjust(1)  # not sent after all
                return wait
        if self.request_window is not None or self.token_window is not None:
            wait = self._window_wait(estimated_tokens)
            if wait > 0:
                if requests is not None:
                    requests.adjust(1)
                if tokens is not None:
                    tokens.adjust(estimated_tokens)
                return wait
        return 0.0

    def _window_wait(self, estimated_tokens: int) -> float:
        """Take one request and its tokens from the reported windows, or how long to
        wait for their reset (taking nothing)."""
        now = time.monotonic()
        with self._lock:
            spent = self._spent_window(now, estimated_tokens)
            if spent is not None:
                return spent.until - now
            requests, tokens = self.request_window, self.token_window
            if requests is not None and now < requests.until:
                requests.left -= 1
            if tokens is not None and now < tokens.until:
                tokens.left -= estimated_tokens
            return 0.0

    def _spent_window(self, now: float, estimated_tokens: int) -> ReportedWindow | None:
        """The reported window a request of ``estimated_tokens`` must wait for, if any."""
        requests, tokens = self.request_window, self.token_window
        if requests is not None and now < requests.until and requests.left < 1:
            return requests
        if tokens is not None and now < tokens.until and tokens.left < estimated_tokens:
            return tokens
        return None

    def held_by(self, estimated_tokens: int) -> tuple[float, float, str] | None:
        """Why a request of ``estimated_tokens`` waits, when a reply's headers hold it:
        the seconds it waits, the reset the reply stated and that reset's header."""
        now = time.monotonic()
        with self._lock:
            spent = self._spent_window(now, estimated_tokens)
            if spent is None:
                return None
            return spent.until - now, spent.reset_s, spent.header

    def announce(self, until: float, grace: float) -> bool:
        """Whether a long wait a server asked for, ending at ``until``, is news: true
        unless another one ran within ``grace`` seconds before now, so a stall is said
        once however many calls wait in it (or wait in it again, round after round)."""
        with self._lock:
            news = time.monotonic() > self._announced_until + grace
            self._announced_until = max(self._announced_until, until)
            return news

    def settle(self, estimated_tokens: int, actual_tokens: int | None) -> None:
        """Correct the token estimate with the reply's usage, and recover concurrency."""
        if self.tokens is not None and actual_tokens is not None:
            self.tokens.adjust(estimated_tokens - actual_tokens)
        if self.limiter.limit >= self.max_concurrent:
            return  # nothing to recover (as the check below; a cut after it comes after us)
        with self._lock:
            current = self.limiter.limit
            if current >= self.max_concurrent:
                return
            self._successes += 1
            if self._successes >= current:
                self._successes = 0
                self.limiter.set_limit(current + 1)

    def peek(self, estimated_tokens: int) -> float:
        """How long a request of ``estimated_tokens`` would wait now, taking nothing:
        `wait_time` without its side (where to send a call, among several endpoints).

        Args:
            estimated_tokens: The request's estimated tokens.

        Returns:
            Seconds to wait, 0 when it could go now.
        """
        wait = self.wait_time(estimated_tokens)
        if wait <= 0:
            self.put_back(estimated_tokens)
        return wait

    def put_back(self, estimated_tokens: int) -> None:
        """Undo a `wait_time` that returned 0 (took a request and its tokens) for a
        request that will not be sent after all."""
        if self.requests is not None:
            self.requests.adjust(1)
        if self.tokens is not None:
            self.tokens.adjust(estimated_tokens)
        now = time.monotonic()
        with self._lock:
            requests, tokens = self.request_window, self.token_window
            if requests is not None and now < requests.until:
                requests.left += 1
            if tokens is not None and now < tokens.until:
                tokens.left += estimated_tokens

    def refund(self, estimated_tokens: int) -> None:
        """A request that never reached the endpoint gives its tokens back."""
        if self.tokens is not None:
            self.tokens.adjust(estimated_tokens)

    def rate_limited(self, retry_after: float | None) -> None:
        """A 429: pause all senders for ``Retry-After`` and halve concurrency (at most 1/s)."""
        now = time.monotonic()
        with self._lock:
            if retry_after:
                self.paused_until = max(self.paused_until, now + retry_after)
            if now - self._last_decrease >= _DECREASE_INTERVAL_S:
                self._last_decrease = now
                self._successes = 0
                self.limiter.set_limit(max(1, self.limiter.limit // 2))
