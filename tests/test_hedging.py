"""Hedged requests: a second copy of a request still unanswered after ``hedge_after``.

The fake server's ``[[stall_once:SECONDS]]`` answers the first request with that body
that much later and a copy of it at once, as a slow replica would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import plait
from plait.providers.base import LLMResponse, ProviderError
from plait.resources.hedging import first_reply
from plait.testing import FakeOpenAIServer


def hedged(server: FakeOpenAIServer, **settings: Any) -> plait.ResourceConfig:
    fast = {"model": "m", "base_url": server.base_url, "api_key": "sk-test", **settings}
    return plait.ResourceConfig({"fast": fast})


@pytest.fixture(autouse=True)
def fresh_usage() -> None:
    plait.reset_usage()


def test_a_stalled_request_is_answered_by_its_copy(server: FakeOpenAIServer) -> None:
    resources = hedged(server, hedge_after=0.2, max_hedge_fraction=1.0, timeout=60)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources, seed=3)
    assert llm.run_sync("x [[stall_once:60]]") == "[S.] x"
    usage = plait.usage()["fast"]
    assert usage["hedged"] == 1 and usage["requests"] == 2 and usage["retries"] == 0
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    assert len(bodies) == 2 and bodies[0] == bodies[1]  # the same request, seed and all
    assert bodies[0]["seed"] is not None


def test_max_hedge_fraction_bounds_the_copies(server: FakeOpenAIServer) -> None:
    resources = hedged(server, hedge_after=0.05, max_hedge_fraction=0.0)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    assert llm.run_sync("x [[stall_once:0.5]]") == "[S.] x"
    assert plait.usage()["fast"]["hedged"] == 0 and server.stats()["requests_total"] == 1


def test_a_quantile_hedges_once_the_latency_is_known(server: FakeOpenAIServer) -> None:
    resources = hedged(server, hedge_after="p99", max_hedge_fraction=1.0, timeout=60)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    llm.run_sync([f"warm {i}" for i in range(30)])  # 20 replies in, the p99 is read
    before = plait.usage()["fast"]["hedged"]
    assert llm.run_sync("slow [[stall_once:60]]") == "[S.] slow"
    usage = plait.usage()["fast"]
    assert usage["hedged"] == before + 1 and usage["retries"] == 0


def test_many_calls_at_once_with_a_few_stalled_each_come_back_once(
    server: FakeOpenAIServer,
) -> None:
    resources = hedged(server, hedge_after=0.3, max_hedge_fraction=0.5, max_concurrent=64)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources, max_concurrent=64)
    inputs = [f"in {i} \ud800" + (" [[stall_once:60]]" if i % 20 == 0 else "") for i in range(100)]
    out = llm.run_sync(inputs)
    assert out == [f"[S.] {text.split(' [[')[0]}" for text in inputs]
    assert plait.usage()["fast"]["hedged"] >= 5


def test_the_first_reply_wins_and_a_failed_copy_waits_for_the_other() -> None:
    async def reply(text: str, after: float) -> LLMResponse:
        await asyncio.sleep(after)
        return LLMResponse(text)

    async def failure(after: float) -> LLMResponse:
        await asyncio.sleep(after)
        raise ProviderError("HTTP 503", status=503)

    async def race(a: Any, b: Any) -> LLMResponse:
        return await first_reply(asyncio.ensure_future(a), asyncio.ensure_future(b))

    assert asyncio.run(race(failure(0), reply("late", 0.01))).text == "late"
    with pytest.raises(ProviderError, match="HTTP 503"):
        asyncio.run(race(failure(0.01), failure(0)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"hedge_after": "p100"}, "hedge_after='p100'"),
        ({"hedge_after": "fast"}, "a quantile of the alias's latency"),
        ({"hedge_after": -1}, "seconds must be a finite number > 0"),
        ({"max_hedge_fraction": 1.5}, "max_hedge_fraction"),
    ],
)
def test_bad_hedging_settings_are_refused_at_load(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(plait.ConfigurationError, match=message):
        plait.ResourceConfig({"fast": {"model": "m", "api_key": "sk-test", **settings}})
