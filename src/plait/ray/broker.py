"""The cluster's one budget per endpoint: concurrency, requests/min, tokens/min, 429 pauses.

Every worker process of a run drives the same endpoints, and a provider counts
their requests together.  So each endpoint's limits live once, in a `LimitBroker`
(a Ray actor, one per cluster and namespace), and workers *lease* capacity from it
in blocks: a number of concurrency slots they may hold, a number of requests and
tokens they may spend.  A worker spends a lease locally, call by call, and talks to
the broker only when its lease runs short, when it has capacity to give back, or
every `SYNC_INTERVAL_S` while it is busy, so the broker sees a few messages per
worker per second, not one per call.

The rules that make the limits hold cluster-wide:

- Slots: the broker grants a slot only while the slots held by all workers are
  below the endpoint's (possibly AIMD-reduced) limit; a worker uses at most what it
  was granted and the broker counts a slot held until the worker says it let go.
  When several workers want more than there is, each is asked to shrink to its
  fair share (proportional to what it wants), so no worker starves.
- Requests and tokens: paced buckets, as in one process (`plait.resources.rate`):
  N per minute admit N/60 a second with a burst of one second's worth.  They are
  granted for the calls waiting at the worker when it asks, not in advance: a
  request granted now is sent now, so over any window the requests sent
  cluster-wide stay within ``burst + rate * window`` (a worker holding a block of
  grants could spend it late and stack it on fresh ones).  A grant still takes some
  time to reach the endpoint (the reply, the worker's loop, the network; longer on a
  busy machine), so the buckets' burst is half a second's worth smaller than in one
  process: grants that arrive up to `DELAY_MARGIN_S` late cannot stack into a window
  over the limit.  Tokens are granted call by call (each call's whole estimate once
  the bucket holds ``min(estimate, burst)``), so however many calls wait on however
  many workers, one call's estimate at most is in debt.  What a worker does not
  spend it gives back; a token estimate that fell short is charged afterwards as
  debt.
- 429: the worker that saw it reports it; every later reply tells every worker to
  pause for what the server asked (capped by ``max_retry_after_s``), and the slot
  limit is halved (at most once a second), then recovers by one slot per window of
  reported successes.
- Learned limits: a worker whose replies stated the endpoint's limits (its rate-limit
  headers, `plait.resources.rate.RateGovernor.learn`) reports them, and the buckets
  pace the smaller of configured and reported, for every worker: one that had no
  limit configured, and so spent without asking, is told to ask from then on.
- A worker that stops talking (killed) has its slots reclaimed after `LEASE_TTL_S`,
  or at once when the driver, which sees the process die, says so (`forget`).

This class is plain Python (tested without Ray); `plait.ray.cluster` wraps it in an
actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

from plait.resources.rate import smaller

__all__ = [
    "DELAY_MARGIN_S",
    "LEASE_TTL_S",
    "SYNC_INTERVAL_S",
    "AliasLimits",
    "LimitBroker",
    "Report",
]

#: How often a busy worker reports to the broker (it also does when its lease runs out).
SYNC_INTERVAL_S = 0.1
#: A worker silent this long is taken for dead and its slots are given to others.
LEASE_TTL_S = 10.0
#: How late a granted request may reach its endpoint and still keep every window
#: within the limit: the burst is this much smaller than a second's worth.
DELAY_MARGIN_S = 0.5
#: The longest the broker holds a request that it cannot grant yet (a long poll).
_WAIT_S = 0.25
_DECREASE_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class AliasLimits:
    """An endpoint's configured limits (from its `EndpointConfig`)."""

    max_concurrent: int
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_retry_after_s: float = 20.0


@dataclass(slots=True)
class Report:
    """What a worker tells the broker about one endpoint, and asks of it."""

    #: Slots the worker keeps (at most what it was granted; the rest go back).
    slots_kept: int = 0
    #: Slots it could use now (calls running + calls waiting for a slot).
    slots_wanted: int = 0
    #: Requests / tokens it is waiting to spend, beyond what it holds.
    requests_wanted: float = 0.0
    tokens_wanted: float = 0.0
    #: ``tokens_wanted`` call by call, in the order the calls wait (empty: one call).
    #: The broker grants them one at a time, so only one call's estimate at a time can
    #: take the bucket into debt, as in one process.
    tokens_each: tuple[float, ...] = ()
    #: Unspent requests / tokens it gives back.
    requests_returned: float = 0.0
    tokens_returned: float = 0.0
    #: Tokens spent beyond the estimates it was granted for (charged as debt).
    tokens_overspent: float = 0.0
    #: Calls that succeeded since the last report (AIMD recovery).
    successes: int = 0
    #: A 429 seen since the last report, with the server's Retry-After (0 if none given).
    rate_limited: float | None = None
    #: The requests and tokens per minute the endpoint's replies stated (None: none yet).
    learned_requests_per_minute: int | None = None
    learned_tokens_per_minute: int | None = None


@dataclass(slots=True)
class _Bucket:
    rate: float  # per second
    burst: float
    level: float
    stamp: float

    @classmethod
    def per_minute(cls, amount: int, now: float) -> _Bucket:
        """A second's worth of burst, less `DELAY_MARGIN_S` of it: a grant reaches the
        endpoint some time after the broker made it (the reply, the worker's loop, the
        network), and grants made meanwhile must not stack into a window over the limit."""
        rate = amount / 60.0
        burst = max(1.0, rate - rate * DELAY_MARGIN_S)
        return cls(rate, burst, burst, now)

    def refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def take_whole(self, amount: float, now: float) -> float:
        """Grant up to ``amount`` whole units (requests): what is there, never into debt."""
        self.refill(now)
        granted = float(math.floor(max(0.0, min(amount, self.level))))
        self.level -= granted
        return granted

    def draw(self, calls: list[float], now: float) -> float:
        """Grant the tokens of the ``calls`` (each one's estimate) in order, removing the
        ones granted: a call's whole estimate once ``min(estimate, burst)`` is there, as
        in one process, so a call larger than the burst goes into debt and the calls
        after it wait it off.  One draw for all of a worker's waiting calls let eight
        calls into debt at once, and two workers doing it in turn sent twice the limit
        in a window."""
        self.refill(now)
        granted = 0.0
        while calls and self.level >= min(calls[0], self.burst):
            amount = calls.pop(0)
            self.level -= amount
            granted += amount
        return granted

    def give(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level = min(self.burst, self.level + amount)

    def charge(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount  # may go negative: later grants wait it off


@dataclass
class _Alias:
    limits: AliasLimits
    limit: int  # the slot limit in force (AIMD may hold it below max_concurrent)
    requests: _Bucket | None
    tokens: _Bucket | None
    held: dict[str, int] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)
    paused_until: float = 0.0
    last_decrease: float = 0.0
    successes: int = 0
    rate_limited: int = 0
    #: Tokens granted, given back and charged as debt, in all (tests and benchmarks
    #: check the accounting with them).
    tokens_granted: float = 0.0
    tokens_returned: float = 0.0
    tokens_charged: float = 0.0

    def free(self) -> int:
        return self.limit - sum(self.held.values())


class LimitBroker:
    """Leases each endpoint's capacity to workers; see the module docstring."""

    def __init__(self) -> None:
        self._aliases: dict[str, _Alias] = {}
        #: Per endpoint, the requests and tokens per minute its replies stated last.
        self._learned: dict[str, tuple[int | None, int | None]] = {}
        self._seen: dict[str, float] = {}
        self._changed: asyncio.Condition | None = None
        self._budgets: dict[str, dict[str, Any]] = {}
        #: Per endpoint, when its circuit breaker (opened by some worker) closes again.
        self._breakers: dict[str, float] = {}
        self.syncs = 0

    # -- the one call a worker makes --------------------------------------------------
    async def sync(
        self, worker: str, key: str, limits: AliasLimits, report: Report
    ) -> dict[str, Any]:
        """Take ``report`` from ``worker`` for endpoint ``key``; answer with its lease.

        Returns ``slots`` (the most the worker may hold now), ``requests`` and
        ``tokens`` (newly granted; ``math.inf`` when the endpoint has no such limit),
        and ``pause_s`` (how long every sender must wait, for a 429).  When the worker
        wants what nobody can give yet, the answer waits up to a quarter second for
        it (slots freed by others, buckets refilling).
        """
        self.syncs += 1
        now = time.monotonic()
        self._seen[worker] = now
        self._reclaim(now)
        if report.learned_requests_per_minute or report.learned_tokens_per_minute:
            before = self._learned.get(key, (None, None))
            self._learned[key] = (
                report.learned_requests_per_minute or before[0],
                report.learned_tokens_per_minute or before[1],
            )
        state = self._alias(key, limits, now)
        self._absorb(state, worker, report, now)
        deadline = now + _WAIT_S
        requests = tokens = 0.0
        calls = list(report.tokens_each) or (
            [report.tokens_wanted] if report.tokens_wanted > 0 else []
        )
        while True:
            grant = self._grant(
                state,
                worker,
                max(0.0, report.requests_wanted - requests),
                calls,
                time.monotonic(),
            )
            requests += grant["requests"]
            tokens += grant["tokens"]
            grant["requests"], grant["tokens"] = requests, tokens
            short = (
                grant["slots"] < min(report.slots_wanted, 1)
                or (report.requests_wanted > 0 and requests <= 0)
                or (report.tokens_wanted > 0 and tokens <= 0)
            )
            remaining = deadline - time.monotonic()
            if not short or remaining <= 0 or grant["pause_s"] > 0:
                return grant
            await self._wait(min(remaining, self._refill_wait(state, report, calls)))

    async def budget_reserve(
        self, spec: Any, worker: str, call: bool, tokens: float, cost: float
    ) -> dict[str, Any]:
        """Admit one request of ``worker`` under a cluster-wide `budget`, as a `Budget`
        admits it in one process: a new ``call`` counts against ``max_calls``, and the
        request reserves its estimated ``tokens`` and ``cost`` until `budget_settle`.
        Answers ``reserved`` once done; ``reached`` (the limit, what was spent, the
        maximum) once spent up; neither when the reservations in flight still hold
        what is left after a short wait for them to settle (the worker asks again)."""
        from plait.handlers.budgeting import spend_verdict

        ledger = self._budget_ledger(spec)
        deadline = time.monotonic() + _WAIT_S
        while True:
            if call and spec.max_calls is not None and ledger["calls"] >= spec.max_calls:
                return {
                    "reserved": False,
                    "reached": ("max_calls", ledger["calls"], spec.max_calls),
                }
            verdict = spend_verdict(
                ("max_tokens", ledger["tokens"], ledger["held_tokens"], spec.max_tokens),
                ("max_cost", ledger["cost"], ledger["held_cost"], spec.max_cost),
            )
            if verdict is None:
                ledger["calls"] += int(call)
                self._hold(ledger, worker, tokens, cost, 1)
                return {"reserved": True, "reached": None}
            if not isinstance(verdict, str):
                return {"reserved": False, "reached": verdict}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {"reserved": False, "reached": None}
            await self._wait(remaining)

    async def budget_settle(
        self,
        spec: Any,
        worker: str,
        held: tuple[float, float],
        spent: tuple[float, float],
        unsent_call: bool,
    ) -> None:
        """A reserved request is done: the ``spent`` tokens and cost of its reply replace
        the ``held`` estimate (0 and 0 for one that failed); ``unsent_call`` gives back
        the call of one that was never sent."""
        ledger = self._budget_ledger(spec)
        self._hold(ledger, worker, -held[0], -held[1], -1)
        ledger["tokens"] += spent[0]
        ledger["cost"] += spent[1]
        ledger["calls"] -= int(unsent_call)
        self._notify()

    def _budget_ledger(self, spec: Any) -> dict[str, Any]:
        ledger = self._budgets.get(spec.budget_id)
        if ledger is None:
            ledger = self._budgets[spec.budget_id] = {
                "calls": spec.calls,
                "tokens": float(spec.tokens),
                "cost": float(spec.cost),
                "held_tokens": 0.0,
                "held_cost": 0.0,
                "held_by": {},
            }
        return ledger

    @staticmethod
    def _hold(ledger: dict[str, Any], worker: str, tokens: float, cost: float, n: int) -> None:
        """Add ``n`` reservations to what ``worker`` holds (per worker: a worker that is
        gone gives its back); a worker holding none holds exactly 0 (no float residue
        for requests to wait on)."""
        holds = ledger["held_by"]
        held = holds.setdefault(worker, [0.0, 0.0, 0])
        held[0], held[1], held[2] = held[0] + tokens, held[1] + cost, held[2] + n
        if held[2] <= 0:
            del holds[worker]
        ledger["held_tokens"] = sum(h[0] for h in holds.values())
        ledger["held_cost"] = sum(h[1] for h in holds.values())

    # -- circuit breakers (`plait.ray.breakers`) ---------------------------------------
    async def breaker_opened(self, key: str, cooldown_s: float) -> None:
        """A worker opened ``key``'s breaker: every worker skips it for ``cooldown_s``."""
        self._breakers[key] = time.monotonic() + cooldown_s

    async def breaker_closed(self, key: str) -> None:
        """A worker's probe found ``key`` answering: its breaker closes for every worker."""
        self._breakers.pop(key, None)

    async def breakers(self) -> dict[str, float]:
        """The endpoints whose breakers are open now, with the seconds they stay open."""
        now = time.monotonic()
        for key in [k for k, until in self._breakers.items() if until <= now]:
            del self._breakers[key]
        return {key: until - now for key, until in self._breakers.items()}

    async def forget(self, worker: str) -> None:
        """``worker`` is gone: its slots go back at once."""
        self._drop(worker)

    def _drop(self, worker: str) -> None:
        self._seen.pop(worker, None)
        for state in self._aliases.values():
            state.held.pop(worker, None)
            state.wanted.pop(worker, None)
        for ledger in self._budgets.values():  # its budget reservations, too
            held = ledger["held_by"].get(worker)
            if held is not None:
                self._hold(ledger, worker, 0.0, 0.0, -held[2])
        self._notify()

    async def status(self) -> dict[str, Any]:
        """What the broker holds, per endpoint (for tests, benchmarks and debugging)."""
        return {
            key: {
                "limit": s.limit,
                "held": dict(s.held),
                "wanted": dict(s.wanted),
                "paused_for_s": max(0.0, s.paused_until - time.monotonic()),
                "rate_limited": s.rate_limited,
                "requests_per_minute": s.limits.requests_per_minute,
                "tokens_per_minute": s.limits.tokens_per_minute,
                "tokens": {
                    "granted": s.tokens_granted,
                    "returned": s.tokens_returned,
                    "charged": s.tokens_charged,
                },
            }
            for key, s in self._aliases.items()
        } | {"syncs": self.syncs}

    # -- internals ---------------------------------------------------------------------
    def _alias(self, key: str, configured: AliasLimits, now: float) -> _Alias:
        learned_rpm, learned_tpm = self._learned.get(key, (None, None))
        limits = AliasLimits(
            configured.max_concurrent,
            smaller(configured.requests_per_minute, learned_rpm),
            smaller(configured.tokens_per_minute, learned_tpm),
            configured.max_retry_after_s,
        )
        state = self._aliases.get(key)
        if state is None or state.limits != limits:
            held = state.held if state is not None else {}
            state = _Alias(
                limits,
                limits.max_concurrent,
                _Bucket.per_minute(limits.requests_per_minute, now)
                if limits.requests_per_minute
                else None,
                _Bucket.per_minute(limits.tokens_per_minute, now)
                if limits.tokens_per_minute
                else None,
                held=dict(held),
            )
            self._aliases[key] = state
        return state

    def _absorb(self, state: _Alias, worker: str, report: Report, now: float) -> None:
        previous = state.held.get(worker, 0)
        state.held[worker] = max(0, min(report.slots_kept, previous))
        state.wanted[worker] = max(0, report.slots_wanted)
        if state.requests is not None and report.requests_returned > 0:
            state.requests.give(report.requests_returned, now)
        if state.tokens is not None:
            if report.tokens_returned > 0:
                state.tokens.give(report.tokens_returned, now)
                state.tokens_returned += report.tokens_returned
            if report.tokens_overspent > 0:
                state.tokens.charge(report.tokens_overspent, now)
                state.tokens_charged += report.tokens_overspent
        if report.rate_limited is not None:
            state.rate_limited += 1
            wait = min(report.rate_limited, state.limits.max_retry_after_s)
            state.paused_until = max(state.paused_until, now + wait)
            if now - state.last_decrease >= _DECREASE_INTERVAL_S:
                state.last_decrease = now
                state.successes = 0
                state.limit = max(1, state.limit // 2)
        elif report.successes and state.limit < state.limits.max_concurrent:
            state.successes += report.successes
            while state.successes >= state.limit and state.limit < state.limits.max_concurrent:
                state.successes -= state.limit
                state.limit += 1
        if state.held[worker] < previous:
            self._notify()

    def _grant(
        self, state: _Alias, worker: str, want_requests: float, want_tokens: list[float], now: float
    ) -> dict[str, Any]:
        held = state.held[worker]
        wanted = state.wanted[worker]
        share = self._fair_share(state, worker)
        if wanted > held:
            extra = max(0, min(wanted, share) - held, 0)
            extra = min(extra, max(0, state.free()))
            held += extra
            state.held[worker] = held
        contended = (
            sum(state.wanted.values()) > state.limit or sum(state.held.values()) > state.limit
        )
        target = min(held, share) if contended else held
        requests = 0.0 if state.requests is not None else math.inf
        if state.requests is not None and want_requests > 0:
            requests = state.requests.take_whole(want_requests, now)
        tokens = 0.0 if state.tokens is not None else math.inf
        if state.tokens is not None and want_tokens:
            tokens = state.tokens.draw(want_tokens, now)
            state.tokens_granted += tokens
        return {
            "slots": target,
            "requests": requests,
            "tokens": tokens,
            "pause_s": max(0.0, state.paused_until - now),
            "limit": state.limit,
            # Whether requests and tokens are paced here (a limit configured or learned):
            # a worker that had none spends only what it is granted from then on.
            "paced": (state.requests is not None, state.tokens is not None),
        }

    def _fair_share(self, state: _Alias, worker: str) -> int:
        """This worker's part of the limit when everyone wants more than there is:
        proportional to what each wants, rounded down, and the slots rounding leaves
        over go to the largest remainders (ties by name), so the shares add up to the
        whole limit and no slot idles while someone waits for one."""
        total = sum(state.wanted.values())
        mine = state.wanted.get(worker, 0)
        if total <= state.limit:
            return mine
        exact = {w: state.limit * want / total for w, want in state.wanted.items() if want}
        shares = {w: math.floor(x) for w, x in exact.items()}
        left = state.limit - sum(shares.values())
        for w in sorted(exact, key=lambda w: (shares[w] - exact[w], w))[:left]:
            shares[w] += 1
        return shares.get(worker, 0)

    def _refill_wait(self, state: _Alias, report: Report, calls: list[float]) -> float:
        waits = [0.02]
        if report.requests_wanted > 0 and state.requests is not None:
            waits.append(max(0.0, (1 - state.requests.level) / state.requests.rate))
        if calls and state.tokens is not None:
            need = min(calls[0], state.tokens.burst) - state.tokens.level
            waits.append(max(0.0, need / state.tokens.rate))
        return max(0.005, min(max(waits), _WAIT_S))

    def _reclaim(self, now: float) -> None:
        for worker, seen in list(self._seen.items()):
            if now - seen > LEASE_TTL_S:
                self._drop(worker)

    async def _wait(self, timeout: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def _notify(self) -> None:
        changed = self._changed
        if changed is None:
            return

        async def wake() -> None:
            async with changed:
                changed.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(wake())
