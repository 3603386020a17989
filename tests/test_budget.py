"""`budget` against the loopback server: limits stop new calls, and a checkpointed run
stopped by one resumes under a larger one without paying twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers.budgeting import Budget, BudgetExceeded, budget
from plait.handlers.mocking import mock
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, echo


def expected(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def is_refusal(value: Any, limit: str) -> bool:
    return (
        isinstance(value, plait.Value)
        and value.is_error
        and value.meta["error_type"] == BudgetExceeded.__name__
        and f"of {limit}=" in value.meta["message"]
    )


def served_tokens(server: FakeOpenAIServer) -> int:
    return sum(r["prompt_tokens"] + r["completion_tokens"] for r in server.stats()["requests"])


def test_a_batch_stops_starting_calls_at_max_calls(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    inputs = [f"item {i}" for i in range(6)]
    with budget(max_calls=7) as limit:
        out = FanOutFanIn().bind(resources=resources).run_sync(inputs)
    assert server.stats()["requests_total"] == 7
    assert limit.calls == 7 and limit.refused >= 1
    assert limit.tokens == served_tokens(server)
    refused = [o for o in out if not isinstance(o, str)]
    assert refused and all(is_refusal(o, "max_calls") for o in refused)
    assert "7 calls made of max_calls=7" in refused[0].meta["message"]
    finished = [(text, o) for text, o in zip(inputs, out, strict=True) if isinstance(o, str)]
    assert all(o == expected(text) for text, o in finished)


def test_a_call_waits_for_the_reservations_in_flight_then_is_refused(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    # left and right are ready together: the first admitted reserves its estimate, the
    # other waits for it to settle, then is refused (1 token was the whole budget)
    limit = budget(max_tokens=1)
    with limit, pytest.raises(plait.ExecutionError) as info:
        FanOutFanIn().bind(resources=resources).run_sync("x")
    assert server.stats()["requests_total"] == 1
    assert limit.calls == 1 and limit.refused == 1
    assert limit.tokens == served_tokens(server) > 1
    assert isinstance(info.value.__cause__, BudgetExceeded)
    assert info.value.__cause__.limit == "max_tokens"
    message = str(info.value)
    assert "max_tokens=1" in message and f"{limit.tokens} tokens used" in message
    assert "'left'" in message or "'right'" in message


def test_max_tokens_refuses_once_the_replies_add_up(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = Echo("t").bind(resources=resources)
    limit = budget(max_tokens=20)
    answered = 0
    with limit:
        for _ in range(20):
            try:
                pipeline.run_sync("twelve chars")
            except plait.ExecutionError as exc:
                assert "max_tokens=20" in str(exc)
                break
            answered += 1
    assert answered == server.stats()["requests_total"] == limit.calls
    records = server.stats()["requests"]
    assert limit.tokens == served_tokens(server) >= 20
    # the last call was started while the total was still under the limit
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in records[:-1]) < 20
    assert limit.refused == 1


def test_max_cost_uses_the_alias_prices(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, input_price_per_mtok=1000.0, output_price_per_mtok=3000.0)
    pipeline = Echo("t").bind(resources=resources)
    limit = budget(max_cost=0.05)
    answered = 0
    with limit:
        for _ in range(20):
            try:
                pipeline.run_sync("some words to price")
            except plait.ExecutionError as exc:
                assert "of max_cost=$0.05" in str(exc)
                break
            answered += 1
    records = server.stats()["requests"]
    spent = sum(r["prompt_tokens"] * 1000.0 + r["completion_tokens"] * 3000.0 for r in records)
    assert limit.cost == pytest.approx(spent / 1e6)
    assert limit.cost >= 0.05
    assert answered == len(records) == limit.calls and limit.refused == 1


def test_max_cost_without_prices_is_a_clear_error(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    with budget(max_cost=1.0), pytest.raises(plait.ExecutionError) as info:
        Echo("t").bind(resources=resources).run_sync("q")
    message = str(info.value)
    assert "'fast'" in message and "input_price_per_mtok" in message
    assert server.stats()["requests_total"] == 0


def test_answered_calls_are_not_counted_wherever_the_mock_sits(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    outer = budget(max_calls=1)
    with outer, mock({"left": "l", "right": "r"}):
        assert pipeline.run_sync("x") == echo("C", "l | r")
    inner = budget(max_calls=1)
    with mock({"left": "l", "right": "r"}), inner:
        assert pipeline.run_sync("x") == echo("C", "l | r")
    assert (outer.calls, inner.calls) == (1, 1)
    assert outer.refused == inner.refused == 0
    assert server.stats()["requests_total"] == 2


def test_a_spent_budget_still_lets_answered_calls_through(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    limit = budget(max_calls=0)
    with mock({"left": "l", "right": "r"}), limit:  # the mock is outside the budget
        out = FanOutFanIn().bind(resources=resources).run_sync(["a"])
    assert is_refusal(out[0], "max_calls") and "'combine'" in out[0].meta["message"]
    assert (limit.calls, limit.refused) == (0, 1)
    assert server.stats()["requests_total"] == 0


@pytest.mark.parametrize("inner_is_smaller", [True, False])
def test_nested_budgets_count_each_call_once(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, inner_is_smaller: bool
) -> None:
    small, large = budget(max_calls=3), budget(max_calls=100)
    outer, inner = (large, small) if inner_is_smaller else (small, large)
    with outer, inner:
        out = FanOutFanIn().bind(resources=resources).run_sync(["a", "b", "c"])
    assert server.stats()["requests_total"] == 3
    # a call the smaller budget refused is not left counted in the larger one
    assert small.calls == large.calls == 3
    assert small.refused >= 1 and large.refused == 0
    assert small.tokens == large.tokens == served_tokens(server)
    assert any(is_refusal(o, "max_calls") for o in out)


def test_one_budget_entered_twice_counts_each_call_once(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    limit = budget(max_calls=100)
    with limit, limit:
        FanOutFanIn().bind(resources=resources).run_sync(["a", "b", "c"])
    assert limit.calls == server.stats()["requests_total"] == 9
    assert limit.tokens == served_tokens(server)


def test_a_zero_budget_refuses_everything(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    limit = budget(max_calls=0)
    with limit:
        out = FanOutFanIn().bind(resources=resources).run_sync(["a", "b"])
    assert all(is_refusal(o, "max_calls") for o in out)
    assert server.stats()["requests_total"] == 0
    assert limit.refused == 4  # left and right of each input; combine short-circuits


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_calls"):
        budget(max_calls=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        budget(max_tokens=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_cost"):
        budget(max_cost=float("nan"))


def test_a_checkpointed_run_resumes_under_a_larger_budget(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    inputs = [f"item {i}" for i in range(8)]
    total = 3 * len(inputs)
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    keys: dict[str, int] = {}

    def run(limit: Budget) -> list[Any]:
        server.reset()
        with limit:
            out: list[Any] = pipeline.run_sync(inputs)
        stats = server.stats()
        for key, n in stats["completed_by_key"].items():
            keys[key] = keys.get(key, 0) + n
        assert stats["requests_total"] == limit.calls
        return out

    first = run(budget(max_calls=10))
    assert server.stats()["requests_total"] == 10
    assert any(is_refusal(o, "max_calls") for o in first)

    second = run(budget(max_calls=9))  # resumed, still too small: 9 more calls
    assert server.stats()["requests_total"] == 9

    final = budget(max_calls=total)
    out = run(final)
    # only the calls the earlier runs had not completed are made
    assert final.calls == server.stats()["requests_total"] == total - 10 - 9
    assert out == [expected(text) for text in inputs]
    assert len(keys) == total and all(n == 1 for n in keys.values())  # no call made twice
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    outputs = [r["i"] for r in records if r["t"] == "out"]
    assert sorted(outputs) == list(range(len(inputs)))  # every output recorded exactly once
    finished_early = [i for i, o in enumerate(second) if isinstance(o, str)]
    assert all(second[i] == expected(inputs[i]) for i in finished_early)


def _one_call(server: FakeOpenAIServer, resources: plait.ResourceConfig) -> tuple[int, int]:
    """What one call of `_budgeted` spends at the server: (prompt, completion) tokens."""
    assert Echo("t").bind(resources=resources).run_sync("q00") == echo("t", "q00")
    (record,) = server.stats()["requests"]
    server.reset()
    return record["prompt_tokens"], record["completion_tokens"]


def _budgeted(resources: plait.ResourceConfig, limit: Budget, concurrently: bool) -> list[Any]:
    """40 calls of the same size, ready at once: one batch, or two batches gathered."""
    import asyncio

    pipeline = Echo("t").bind(resources=resources)
    inputs = [f"q{i:02d}" for i in range(40)]

    async def both() -> list[Any]:
        halves = await asyncio.gather(pipeline(inputs[:20]), pipeline(inputs[20:]))
        return [*halves[0], *halves[1]]

    with limit:
        return asyncio.run(both()) if concurrently else pipeline.run_sync(inputs)


@pytest.mark.parametrize("concurrently", [False, True], ids=["one batch", "two batches"])
def test_max_tokens_is_a_hard_limit_under_concurrency(
    server: FakeOpenAIServer, concurrently: bool
) -> None:
    resources = make_resources(server, max_concurrent=8)
    prompt, completion = _one_call(server, resources)
    per_call = prompt + completion
    # Room for 5 calls' worth (less one token).  A request is admitted only while what
    # was spent plus the estimates in flight is below the limit, and each estimate
    # (prompt/4 + 256) is above what a call spends, so 5 calls are sent and no more:
    # at every admission the calls before it, settled or reserved, took < the limit.
    limit = budget(max_tokens=5 * per_call - 1)
    out = _budgeted(resources, limit, concurrently)
    assert server.stats()["requests_total"] == 5
    assert limit.calls == 5 and limit.refused == 35
    assert limit.tokens == served_tokens(server) == 5 * per_call
    refused = [o for o in out if not isinstance(o, str)]
    assert len(refused) == 35 and all(is_refusal(o, "max_tokens") for o in refused)
    assert (
        f"{5 * per_call} tokens used of max_tokens={5 * per_call - 1}"
        in (refused[0].meta["message"])
    )


@pytest.mark.parametrize("concurrently", [False, True], ids=["one batch", "two batches"])
def test_max_cost_is_a_hard_limit_under_concurrency(
    server: FakeOpenAIServer, concurrently: bool
) -> None:
    prices = {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 3000.0}
    resources = make_resources(server, max_concurrent=8, **prices)
    prompt, completion = _one_call(server, resources)
    per_call = (prompt * 1000.0 + completion * 3000.0) / 1e6
    limit = budget(max_cost=4.5 * per_call)  # 5 calls' worth, less half a call
    out = _budgeted(resources, limit, concurrently)
    assert server.stats()["requests_total"] == 5
    assert limit.calls == 5 and limit.refused == 35
    assert limit.cost == pytest.approx(5 * per_call)
    refused = [o for o in out if not isinstance(o, str)]
    assert len(refused) == 35 and all(is_refusal(o, "max_cost") for o in refused)


def test_every_request_a_call_sends_is_admitted_and_paid_for_the_call_counted_once(
    server: FakeOpenAIServer,
) -> None:
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str

    resources = make_resources(server, max_retries=3)
    limit = budget(max_calls=2, max_tokens=10_000)
    structured = plait.LLMInference("fast", response_format=Person).bind(resources=resources)
    with limit:
        # an invalid reply is re-asked: two requests, both spent, one call
        assert isinstance(structured.run_sync("[[reply:not json]]who?"), Person)
    assert server.stats()["requests_total"] == 2
    assert (limit.calls, limit.tokens) == (1, served_tokens(server))
    server.reset()
    server.configure(rate_500=1.0)
    with limit, pytest.raises(plait.ExecutionError, match="gave up after 4 attempts"):
        Echo("t").bind(resources=resources).run_sync("q")
    # one call, four failed attempts: nothing spent, nothing left reserved
    assert server.stats()["requests_total"] == 4
    assert (limit.calls, limit.refused) == (2, 0)
    server.configure(rate_500=0.0)
    with limit, pytest.raises(plait.ExecutionError, match="max_calls=2"):
        Echo("t").bind(resources=resources).run_sync("q")


@pytest.mark.parametrize("inner_is_smaller", [True, False])
def test_nested_token_budgets_under_concurrency_send_what_the_smaller_allows(
    server: FakeOpenAIServer, inner_is_smaller: bool
) -> None:
    # The larger budget admits each request first or last; when the smaller asks it to
    # wait, the request gives the larger one's reservation back while it waits.
    resources = make_resources(server, max_concurrent=8)
    prompt, completion = _one_call(server, resources)
    per_call = prompt + completion
    small, large = budget(max_tokens=3 * per_call - 1), budget(max_tokens=1000 * per_call)
    outer, inner = (large, small) if inner_is_smaller else (small, large)
    with outer:
        out = _budgeted(resources, inner, concurrently=True)
    assert server.stats()["requests_total"] == 3
    assert small.calls == large.calls == 3 and small.refused == 37 and large.refused == 0
    assert small.tokens == large.tokens == served_tokens(server) == 3 * per_call
    assert sum(isinstance(o, str) for o in out) == 3
