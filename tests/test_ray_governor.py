"""LeasedGovernor (plait.ray.governor) against a broker stand-in: no Ray needed."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from plait.ray.broker import DELAY_MARGIN_S, LimitBroker
from plait.ray.governor import LeasedGovernor
from plait.resources.config import EndpointConfig


class _Method:
    def __init__(self, broker: LimitBroker) -> None:
        self.broker = broker
        self.calls = 0
        #: Each reply's new tokens, with the time the broker granted them (the reply
        #: comes back from the broker's last grant with no wait in between).
        self.tokens: list[tuple[float, float]] = []
        #: Likewise each reply's new requests.
        self.requests: list[tuple[float, float]] = []

    def remote(self, *args: Any) -> Any:
        self.calls += 1
        return self._sync(*args)

    async def _sync(self, *args: Any) -> dict[str, Any]:
        reply = await self.broker.sync(*args)
        if reply["tokens"] and math.isfinite(reply["tokens"]):
            self.tokens.append((time.monotonic(), reply["tokens"]))
        if reply["requests"] and math.isfinite(reply["requests"]):
            self.requests.append((time.monotonic(), reply["requests"]))
        return reply


class _Actor:
    """What the governor calls: ``broker.sync.remote(...)`` awaited, here in-process."""

    def __init__(self) -> None:
        self.sync = _Method(LimitBroker())


def test_a_saturated_worker_syncs_on_the_interval_not_per_waiting_call() -> None:
    config = EndpointConfig(model="m", base_url="http://x", api_key="k", max_concurrent=4)
    actor = _Actor()
    governor = LeasedGovernor(config, actor, "w")

    async def call() -> None:
        await governor.limiter.acquire()
        try:
            await asyncio.sleep(0.002)
        finally:
            governor.limiter.release()
        governor.settle(0, None)

    async def chain() -> None:
        for _ in range(10):
            await call()

    async def main() -> None:
        # 4 slots, 40 chains of 10 calls: new calls keep arriving while others wait
        # for a slot, for the whole run (~0.2 s).
        await asyncio.gather(*(chain() for _ in range(40)))

    asyncio.run(main())
    assert governor.limiter.limit == 4
    # Ramp-up takes a couple of syncs, then one per SYNC_INTERVAL_S (0.1 s), not one
    # per call that had to wait (which was hundreds).
    assert actor.sync.calls <= 8, actor.sync.calls


def _busiest_window(grants: list[tuple[float, float]], window: float) -> float:
    """The most tokens granted in any ``window`` seconds."""
    return max(sum(a for t, a in grants if start <= t <= start + window) for start, _ in grants)


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_waiting_together_never_get_more_tokens_than_the_limit_allows(
    workers: int,
) -> None:
    # 60,000 tokens/min: 1,000 a second, a burst of 500 at the broker; every call
    # estimates (and uses) 250.  Each worker has 4 calls waiting for tokens at once:
    # granting their 1,000 tokens in one draw (into debt) let two workers at 600
    # tokens/min send twice the limit in 10 s.  The times are the broker's grants, so
    # a slow machine can only spread them out.
    config = EndpointConfig(
        model="m",
        base_url="http://x",
        api_key="k",
        max_concurrent=16,
        tokens_per_minute=60_000,
    )
    actor = _Actor()
    governors = [LeasedGovernor(config, actor, f"w{i}") for i in range(workers)]
    estimate = 250

    async def call(governor: LeasedGovernor) -> None:
        await governor.limiter.acquire()
        try:
            await governor.admit(estimate)
        finally:
            governor.limiter.release()
        governor.settle(estimate, estimate)

    async def chain(governor: LeasedGovernor) -> None:
        for _ in range(12 // workers):
            await call(governor)

    async def main() -> None:
        await asyncio.gather(*(chain(g) for g in governors for _ in range(4)))

    asyncio.run(main())
    grants = actor.sync.tokens
    assert sum(a for _, a in grants) == 4 * 12 * estimate
    rate, window = 1000.0, 0.1
    bound = rate * (1 - DELAY_MARGIN_S) + rate * window + estimate  # burst, one call's debt
    assert _busiest_window(grants, window) <= bound, grants[:8]


def test_a_limit_one_worker_learned_paces_every_worker_through_the_broker() -> None:
    """An alias with no limit configured: workers spend without asking, until one of
    them reads the endpoint's limit on a reply.  It tells the broker, which from then
    on paces every worker, the one that never saw a header included, by one budget."""
    from plait.providers.ratelimits import ReportedLimits

    config = EndpointConfig(model="m", base_url="http://x", api_key="k", max_concurrent=8)
    actor = _Actor()
    learner, other = (LeasedGovernor(config, actor, name) for name in ("learner", "other"))
    assert math.isinf(learner.request_pool) and math.isinf(other.request_pool)
    learner.learn(ReportedLimits(requests_limit=600, at=time.monotonic()), 0)
    assert learner.effective() == (600, None) and learner.request_pool == 0.0

    async def call(governor: LeasedGovernor) -> None:
        await governor.limiter.acquire()
        try:
            await governor.admit(0)
        finally:
            governor.limiter.release()
        governor.settle(0, None)

    async def chain(governor: LeasedGovernor) -> None:
        for _ in range(5):
            await call(governor)

    async def main() -> dict[str, Any]:
        await asyncio.gather(*(chain(g) for g in (learner, other) for _ in range(3)))
        return await actor.sync.broker.status()

    status = asyncio.run(main())
    assert status[learner.key]["requests_per_minute"] == 600
    # The other worker was told to ask: every one of the 30 calls was granted by the
    # broker's one bucket (10 a second, a burst of 5), none spent unasked.
    assert math.isfinite(other.request_pool)
    grants = actor.sync.requests
    assert sum(n for _, n in grants) == 30
    rate, window = 10.0, 0.1
    assert _busiest_window(grants, window) <= rate * (1 - DELAY_MARGIN_S) + rate * window + 1
