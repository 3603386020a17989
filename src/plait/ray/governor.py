"""A worker's side of the cluster-wide limits: spend a lease locally, renew it in blocks.

`LeasedGovernor` takes the place of the process-local `RateGovernor` inside a Ray
worker (`plait.resources.manager.use_governors`), so `Endpoint.complete` runs
unchanged: it takes a slot from the governor's limiter, waits in ``admit`` for a
request (and its tokens) to be allowed, and reports the reply (``settle``) or a
429 (``rate_limited``).  What differs is where capacity comes from: the limiter's
limit is the number of slots the broker granted this worker, and requests and
tokens come out of pools the broker fills.  A background task on the worker's
event loop talks to the broker: at once when a call is waiting for capacity the
worker does not hold and the broker may still give (no slots yet, or its last
answer raised them; requests and tokens always), otherwise every
`SYNC_INTERVAL_S` while anything is held or wanted, and not at all when the
worker is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from plait.ray.broker import SYNC_INTERVAL_S, AliasLimits, Report
from plait.resources.config import EndpointConfig
from plait.resources.limits import Priority, PriorityLimiter
from plait.resources.rate import RateGovernor

if TYPE_CHECKING:
    from plait.providers.ratelimits import ReportedLimits

__all__ = ["BROKER_TIMEOUT_S", "BrokerUnreachable", "LeasedGovernor", "LeasedLimiter"]

#: The longest one report to the broker may take before the broker counts as out of
#: reach (it answers within a quarter second when it is there).
BROKER_TIMEOUT_S = 20.0


class BrokerUnreachable(RuntimeError):
    """The cluster's limit broker cannot be reached (its Ray is gone, or it stopped
    answering): calls that need a lease fail with this instead of waiting forever."""


class LeasedLimiter(PriorityLimiter):
    """A limiter whose limit is the slots leased so far (zero at first)."""

    minimum = 0

    def __init__(self, governor: LeasedGovernor) -> None:
        super().__init__(0)
        self._governor = governor

    async def acquire(self, priority: float | Priority = 0.0) -> None:
        self._governor.start()
        if self.held >= self.limit or self.waiting:
            if self._governor.failure is not None:
                raise self._governor.unreachable()
            self._governor.want_slot()  # a call is about to wait for a slot
        await super().acquire(priority)

    def fail_waiters(self, error: BaseException) -> None:
        """Every call waiting for a slot fails with ``error`` (no slot can come)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for _, _, fut, _ in waiters:
            loop = fut.get_loop()
            try:
                here = asyncio.get_running_loop() is loop
            except RuntimeError:
                here = False
            if here:
                _fail(fut, error)
            else:
                loop.call_soon_threadsafe(_fail, fut, error)


def _fail(fut: asyncio.Future[None], error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)


class LeasedGovernor(RateGovernor):
    """`RateGovernor`'s interface, fed by leases from the cluster's `LimitBroker`."""

    def __init__(self, config: EndpointConfig, broker: Any, worker: str) -> None:
        self.broker = broker
        self.worker = worker
        self.key = "|".join(config.endpoint_key())
        self.provider, self.model = config.provider, config.model
        self.limits = AliasLimits(
            config.max_concurrent,
            config.requests_per_minute,
            config.tokens_per_minute,
            config.max_retry_after_s,
        )
        self.leased = LeasedLimiter(self)
        super().__init__(self.leased, config.max_concurrent, None, None)
        self.configured = (config.requests_per_minute, config.tokens_per_minute)
        self.request_pool = 0.0 if config.requests_per_minute else math.inf
        self.token_pool = 0.0 if config.tokens_per_minute else math.inf
        self._request_waiters = 0
        self._tokens_waiting = 0.0
        #: The estimates of the calls waiting for tokens, in the order they came.
        self._token_calls: list[float] = []
        self._overspent = 0.0
        #: Unused parts of spent estimates, for the broker: kept here, a refund would let
        #: this worker spend tokens the broker granted earlier on top of fresh grants.
        self._tokens_returning = 0.0
        self._successes_since = 0
        self._pending_429: float | None = None
        self._wake: asyncio.Event | None = None
        self._granted: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Whether the broker's last answer raised this worker's slots (or it holds none):
        #: only then can asking again at once get more.
        self._slots_growing = True
        self._loop: asyncio.AbstractEventLoop | None = None
        #: How many times this worker talked to the broker (benchmarks report it).
        self.syncs = 0
        self.sync_seconds = 0.0
        self.failure: BaseException | None = None

    # -- the background lease task -----------------------------------------------------
    def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        self._granted = asyncio.Event()
        self._task = loop.create_task(self._run(), name=f"plait-lease-{self.key}")

    def wake(self) -> None:
        if self._wake is None or self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._wake.set()
        else:
            self._loop.call_soon_threadsafe(self._wake.set)

    def want_slot(self) -> None:
        """A call waits for a slot: ask the broker at once if that can bring one.

        A worker that holds none, or whose last answer raised its slots, asks now.
        One the broker has given all it can (its share, or the whole limit) waits for
        the next periodic sync instead: a saturated worker has calls waiting all the
        time, and asking on each of them kept one round trip to the broker in flight
        per worker without a pause (tens a second each, not the few the broker is
        sized for).
        """
        if self._slots_growing or not self.limiter.limit:
            self.wake()

    def _busy(self) -> bool:
        limiter = self.limiter
        return bool(
            limiter.held or limiter.waiting or limiter.limit or self._request_waiters
        ) or bool(self._tokens_waiting or self._tokens_returning or self._pending_429 is not None)

    async def _run(self) -> None:
        assert self._wake is not None and self._granted is not None
        while True:
            if not self._wake.is_set():
                timeout = SYNC_INTERVAL_S if self._busy() else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            try:
                await self._sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker is gone: calls waiting here fail
                self.failure = exc
                self._granted.set()
                self.leased.fail_waiters(self.unreachable())
                await asyncio.sleep(SYNC_INTERVAL_S)
            else:
                self.failure = None

    async def _sync(self) -> None:
        assert self._granted is not None
        limiter = self.limiter
        in_use, waiting = limiter.held, limiter.waiting
        idle = not in_use and not waiting and not self._request_waiters
        report = Report(
            slots_kept=max(in_use, min(limiter.limit, in_use + waiting)),
            slots_wanted=in_use + waiting,
            # Beyond what the pools hold: a grant the waiting calls have not taken yet
            # (they wake after this report went out) must not be asked for twice.
            requests_wanted=_beyond(self._request_waiters, self.request_pool),
            tokens_wanted=_beyond(self._tokens_waiting, self.token_pool),
            tokens_each=_each_beyond(self._token_calls, self.token_pool),
            successes=self._successes_since,
            tokens_overspent=self._overspent,
            rate_limited=self._pending_429,
            learned_requests_per_minute=self.reported_per_minute[0],
            learned_tokens_per_minute=self.reported_per_minute[1],
        )
        report.tokens_returned, self._tokens_returning = self._tokens_returning, 0.0
        if idle:  # nothing to spend it on: give back what is unspent
            if math.isfinite(self.request_pool):
                report.requests_returned, self.request_pool = self.request_pool, 0.0
            if math.isfinite(self.token_pool):
                # A pool below zero is a call's estimate beyond what was granted for it:
                # the broker charges it, as it does an estimate that fell short.
                report.tokens_returned += max(0.0, self.token_pool)
                report.tokens_overspent += max(0.0, -self.token_pool)
                self.token_pool = 0.0
        self._successes_since = 0
        self._overspent = 0.0
        self._pending_429 = None
        if _ray_stopped(self.broker):
            # Calling the actor would start a new Ray in this process, quietly (and
            # the user's own ray.init() then fails), to reach a broker that is gone.
            raise RuntimeError("Ray was shut down in this process")
        started = time.perf_counter()
        try:
            reply = await asyncio.wait_for(
                self.broker.sync.remote(self.worker, self.key, self.limits, report),
                BROKER_TIMEOUT_S,
            )
        except TimeoutError:
            raise TimeoutError(f"no answer in {BROKER_TIMEOUT_S:g} s") from None
        self.sync_seconds += time.perf_counter() - started
        self.syncs += 1
        self._slots_growing = int(reply["slots"]) > limiter.limit
        limiter.set_limit(int(reply["slots"]))
        self._follow_pacing(*reply.get("paced", (False, False)))
        if math.isfinite(self.request_pool):
            self.request_pool += reply["requests"]
        if math.isfinite(self.token_pool):
            self.token_pool += reply["tokens"]
        if reply["pause_s"] > 0:
            self.paused_until = max(self.paused_until, time.monotonic() + reply["pause_s"])
        self._granted.set()

    def unreachable(self) -> BrokerUnreachable:
        return BrokerUnreachable(
            f"the cluster's limit broker cannot be reached ({self.failure}), so calls to "
            f"the {self.provider} model {self.model!r} cannot be admitted: the Ray it "
            "runs in is gone or stopped answering. Rerun once Ray is up again (a run on "
            "workers, or a Ray Data job, starts it)"
        )

    async def _next_grant(self) -> None:
        """Wait for the lease task's next answer (it is woken now)."""
        self.start()
        assert self._granted is not None
        if self.failure is not None:
            raise self.unreachable()
        self._granted.clear()
        self.wake()
        await self._granted.wait()

    def _follow_pacing(self, requests: bool, tokens: bool) -> None:
        """The broker paces requests (tokens) of this endpoint, with a limit configured
        or learned by any worker: spend only what it grants from now on."""
        if requests and not math.isfinite(self.request_pool):
            self.request_pool = 0.0
        if tokens and not math.isfinite(self.token_pool):
            self.token_pool = 0.0

    # -- RateGovernor's interface --------------------------------------------------------
    def configure(
        self, max_concurrent: int, requests_per_minute: int | None, tokens_per_minute: int | None
    ) -> None:
        self.max_concurrent = max_concurrent
        self.configured = (requests_per_minute, tokens_per_minute)
        self.limits = AliasLimits(
            max_concurrent, requests_per_minute, tokens_per_minute, self.limits.max_retry_after_s
        )

    def learn(
        self,
        limits: ReportedLimits,
        in_flight: int,
        tokens_in_flight: float = 0,
        max_wait_s: float = math.inf,
    ) -> None:
        """A reply stated the endpoint's limits: the broker learns them with the next
        report (at once when they are new), and paces every worker by the smaller of
        configured and reported.  The remaining budget and reset time a reply states
        are not followed here (so neither is ``max_wait_s``, their bound): the broker's
        buckets pace the cluster, and a 429's wait pauses every worker through it."""
        per_minute = (
            limits.requests_limit or self.reported_per_minute[0],
            limits.tokens_limit or self.reported_per_minute[1],
        )
        self.reported = limits
        if per_minute == self.reported_per_minute:
            return
        self.reported_per_minute = per_minute
        rpm, tpm = self.effective()
        self._follow_pacing(rpm is not None, tpm is not None)
        self.wake()

    async def admit(self, estimated_tokens: int) -> None:
        while True:
            delay = self.paused_until - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            if self.request_pool < 1:
                self._request_waiters += 1
                try:
                    await self._next_grant()
                finally:
                    self._request_waiters -= 1
                continue
            # The broker grants a call's whole estimate (a large one into debt), so a call
            # waits for all of it: sending on a part would spend tokens nobody granted.
            if self.token_pool < estimated_tokens:
                self._tokens_waiting += estimated_tokens
                self._token_calls.append(estimated_tokens)
                try:
                    await self._next_grant()
                finally:
                    self._tokens_waiting -= estimated_tokens
                    self._token_calls.remove(estimated_tokens)
                continue
            self.request_pool -= 1
            self.token_pool -= estimated_tokens
            return

    def settle(self, estimated_tokens: int, actual_tokens: int | None) -> None:
        self._successes_since += 1
        if not math.isfinite(self.token_pool) or actual_tokens is None:
            return
        if actual_tokens > estimated_tokens:
            self._overspent += actual_tokens - estimated_tokens
        else:
            self._give_back(estimated_tokens - actual_tokens)

    def refund(self, estimated_tokens: int) -> None:
        if math.isfinite(self.token_pool):
            self._give_back(estimated_tokens)

    def _give_back(self, tokens: float) -> None:
        """Return tokens a call was granted and did not use.

        They settle this worker's own debt first (a pool below zero), and the rest go
        back to the broker with the next report, never into the pool: the pool holds
        only grants made for the calls waiting now, so a worker cannot bank refunds
        and spend them later on top of the grants other workers get meanwhile (two
        workers at 600 tokens/min sent ~200 tokens in 10 s that way, ~110 allowed).
        """
        if self.token_pool < 0:
            paid = min(tokens, -self.token_pool)
            self.token_pool += paid
            tokens -= paid
        self._tokens_returning += tokens

    def rate_limited(self, retry_after: float | None) -> None:
        now = time.monotonic()
        if retry_after:
            self.paused_until = max(self.paused_until, now + retry_after)
        self._pending_429 = max(self._pending_429 or 0.0, retry_after or 0.0)
        self.wake()


def _ray_stopped(broker: Any) -> bool:
    """Whether ``broker`` is a Ray actor of a Ray no longer running in this process."""
    ray = sys.modules.get("ray")
    actor = sys.modules.get("ray.actor")
    if ray is None or actor is None or not isinstance(broker, actor.ActorHandle):
        return False
    return not ray.is_initialized()


def _each_beyond(calls: list[float], held: float) -> tuple[float, ...]:
    """What each waiting call wants beyond a pool's ``held``, the pool covering the
    first calls first (an unlimited pool: none)."""
    if not math.isfinite(held):
        return ()
    left, wanted = max(0.0, held), []
    for estimate in calls:
        covered = min(left, estimate)
        left -= covered
        if estimate > covered:
            wanted.append(estimate - covered)
    return tuple(wanted)


def _beyond(wanted: float, held: float) -> float:
    """What the waiting calls want beyond a pool's ``held`` (an unlimited pool: none)."""
    if not math.isfinite(held):
        return 0.0
    return max(0.0, wanted - max(0.0, held))
