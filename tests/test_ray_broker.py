"""The limit broker on its own (plain Python, no Ray): what it grants never exceeds the
limit, contended workers converge to shares that use the whole limit, dead workers'
slots come back, and request grants follow the paced bucket."""

from __future__ import annotations

import asyncio
import random
import time

from plait.ray.broker import DELAY_MARGIN_S, AliasLimits, LimitBroker, Report


async def _round(broker: LimitBroker, limits: AliasLimits, held: dict[str, int], want: int) -> None:
    for worker in list(held):
        reply = await broker.sync(
            worker, "k", limits, Report(slots_kept=held[worker], slots_wanted=want)
        )
        held[worker] = int(reply["slots"])


def test_contended_workers_converge_to_shares_that_use_the_whole_limit() -> None:
    async def scenario() -> None:
        broker, limits = LimitBroker(), AliasLimits(max_concurrent=7)
        held = {"a": 0, "b": 0, "c": 0}
        for _ in range(6):
            await _round(broker, limits, held, want=10)
            status = (await broker.status())["k"]
            assert sum(status["held"].values()) <= 7  # never more than the limit
        assert sum(held.values()) == 7 and max(held.values()) - min(held.values()) <= 1

    asyncio.run(scenario())


def test_random_demand_never_grants_past_the_limit() -> None:
    async def scenario() -> None:
        rng = random.Random(7)
        broker, limits = LimitBroker(), AliasLimits(max_concurrent=5)
        held = {w: 0 for w in "abcd"}
        for _ in range(200):
            worker = rng.choice("abcd")
            want = rng.randint(0, 6)
            kept = min(held[worker], rng.randint(0, held[worker]))  # it may let some go
            reply = await broker.sync(
                worker, "k", limits, Report(slots_kept=kept, slots_wanted=want)
            )
            held[worker] = int(reply["slots"])
            status = (await broker.status())["k"]
            assert sum(status["held"].values()) <= 5
            assert held[worker] <= status["held"][worker]  # it uses only what it holds

    asyncio.run(scenario())


def test_a_forgotten_worker_s_slots_go_to_the_others() -> None:
    async def scenario() -> None:
        broker, limits = LimitBroker(), AliasLimits(max_concurrent=4)
        first = await broker.sync("dead", "k", limits, Report(slots_wanted=4))
        assert first["slots"] == 4
        await broker.forget("dead")
        second = await broker.sync("alive", "k", limits, Report(slots_wanted=4))
        assert second["slots"] == 4

    asyncio.run(scenario())


def test_requests_are_granted_for_waiting_calls_within_the_bucket() -> None:
    async def scenario() -> None:
        broker = LimitBroker()
        limits = AliasLimits(max_concurrent=100, requests_per_minute=600)  # 10/s
        burst = 10 - 10 * DELAY_MARGIN_S  # a second's worth, less the delay margin
        started = time.monotonic()
        first = await broker.sync("w", "k", limits, Report(requests_wanted=4))
        assert first["requests"] == 4  # what is asked for, not a block in advance
        granted = first["requests"]
        for _ in range(3):
            reply = await broker.sync("w", "k", limits, Report(requests_wanted=4))
            granted += reply["requests"]
        assert granted <= burst + 10 * (time.monotonic() - started) + 1

    asyncio.run(scenario())


def test_a_429_pauses_everyone_and_halves_the_limit() -> None:
    async def scenario() -> None:
        broker, limits = LimitBroker(), AliasLimits(max_concurrent=8, max_retry_after_s=5)
        await broker.sync("a", "k", limits, Report(slots_wanted=8, rate_limited=30.0))
        reply = await broker.sync("b", "k", limits, Report(slots_wanted=1))
        assert 4.5 < reply["pause_s"] <= 5.0  # capped by max_retry_after_s
        assert reply["limit"] == 4

    asyncio.run(scenario())


def test_a_breaker_opened_by_one_worker_is_open_for_all_until_closed() -> None:
    async def scenario() -> None:
        broker = LimitBroker()
        assert await broker.breakers() == {}
        await broker.breaker_opened("openai|http://a/v1|m", 30.0)
        open_for = await broker.breakers()
        assert (
            list(open_for) == ["openai|http://a/v1|m"]
            and 0 < open_for["openai|http://a/v1|m"] <= 30
        )
        await broker.breaker_closed("openai|http://a/v1|m")
        assert await broker.breakers() == {}
        await broker.breaker_opened("openai|http://b/v1|m", 0.0)  # a cooldown already over
        assert await broker.breakers() == {}

    asyncio.run(scenario())
