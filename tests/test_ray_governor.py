"""LeasedGovernor (plait.ray.governor) against a broker stand-in: no Ray needed."""

from __future__ import annotations

import asyncio
from typing import Any

from plait.ray.broker import LimitBroker
from plait.ray.governor import LeasedGovernor
from plait.resources.config import EndpointConfig


class _Method:
    def __init__(self, broker: LimitBroker) -> None:
        self.broker = broker
        self.calls = 0

    def remote(self, *args: Any) -> Any:
        self.calls += 1
        return self.broker.sync(*args)


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
