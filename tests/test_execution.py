"""Execution against the real loopback server: modes, batches, streams, limits, settings."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

import plait
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Assistant, DeepPipeline, Echo, FanOutFanIn, Shapes, Synthesizer, echo

T = TypeVar("T")


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def gated(text: str, gate: str = "g") -> str:
    """``text`` with a directive that parks its call at the server until the test opens
    ``gate``.  The server strips the directive: the reply is the one ``text`` alone gets."""
    return f"[[gate:{gate}]]{text}"


def run_gated(call: Callable[[], T], server: FakeOpenAIServer, waits: dict[str, int]) -> T:
    """Run ``call`` in a thread; once ``waits[gate]`` calls are parked at each gate, open
    them all and return its result.  Only states are waited for, never durations."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call)
        try:
            for gate, count in waits.items():
                server.wait_parked(gate, count)
        finally:
            for gate in waits:
                server.open_gate(gate)
        return future.result(timeout=120)


async def await_gated(call: Awaitable[T], server: FakeOpenAIServer, waits: dict[str, int]) -> T:
    """`run_gated` for a coroutine on this test's own loop."""
    task = asyncio.ensure_future(call)
    try:
        for gate, count in waits.items():
            await asyncio.to_thread(server.wait_parked, gate, count)
    finally:
        for gate in waits:
            await asyncio.to_thread(server.open_gate, gate)
    return await task


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition``; the timeout only turns a hang into a failure naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def test_resource_config_as_seed_000_shows(server: FakeOpenAIServer) -> None:
    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": server.base_url,
                "api_key": "sk-test",
                "max_concurrent": 8,
            }
        }
    )
    pipeline = FanOutFanIn().bind(resources=resources)
    assert pipeline.run_sync("doc") == expected_fan("doc")
    assert server.stats()["requests_total"] == 3


async def test_await_single_batch_and_training_modes(resources: plait.ResourceConfig) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    assert await pipeline("a") == expected_fan("a")
    assert await pipeline(["a", "b"]) == [expected_fan("a"), expected_fan("b")]
    pipeline.train()
    value = await pipeline("a")
    assert isinstance(value, plait.Value) and value.payload == expected_fan("a")
    assert value.meta["_tape_ids"]
    values = await pipeline(["a", "b"])
    assert [v.payload for v in values] == [expected_fan("a"), expected_fan("b")]


def test_run_sync_works_inside_a_running_event_loop(resources: plait.ResourceConfig) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)

    async def notebook_cell() -> Any:
        return pipeline.run_sync("jupyter")

    assert asyncio.run(notebook_cell()) == expected_fan("jupyter")


def test_deep_pipeline_output_is_exact(resources: plait.ResourceConfig) -> None:
    out = DeepPipeline().bind(resources=resources).run_sync("doc")
    stage1 = echo("ana", echo("sum", "doc"))
    user = echo("user", stage1)
    parts = "\n".join(
        f"{k}: {echo(t, user)}"
        for k, t in [("technical", "tech"), ("business", "biz"), ("user", "user")]
    )
    assert out == echo("syn", parts)


def test_output_structure_and_constants_survive_execution(
    resources: plait.ResourceConfig,
) -> None:
    out = Shapes().bind(resources=resources).run_sync("x")
    assert out == {
        "list": ["[a] x", 1],
        "tuple": ("[a] x", "k"),
        "nested": {"deep": [("[A] X",)]},
        "const": 3.5,
        "piece": "[a]",
    }


def test_parameters_reach_the_request(
    resources: plait.ResourceConfig, server: FakeOpenAIServer
) -> None:
    assistant = Assistant("Be brief.").bind(resources=resources)
    assert assistant.run_sync("hi") == "Be brief.\n\nUser: hi"
    assistant.instructions.apply_update("Be warm.")
    assert assistant.run_sync("hi") == "Be warm.\n\nUser: hi"


def test_independent_leaves_anywhere_in_the_tree_run_concurrently(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, ("fast", "smart"), max_concurrent=16)
    pipeline = Synthesizer().bind(resources=resources)
    # the three nested analyzer calls all reach the server before any of them is answered
    out = run_gated(lambda: pipeline.run_sync(gated("t")), server, {"g": 3})
    tags = {"technical": "tech", "business": "biz", "user": "user"}
    assert out == echo("syn", "\n".join(f"{k}: {echo(tag, 't')}" for k, tag in tags.items()))
    assert server.stats()["max_in_flight"] == 3


def test_alias_limit_holds_across_a_whole_batch(server: FakeOpenAIServer) -> None:
    # Inputs 0-3 take the alias's four slots and park at the server: input 0 at gate
    # "first", 1-3 at gate "rest".  How fully the slots are kept busy is a speed
    # question, measured by benchmarks/run.py ("time at limit").
    resources = make_resources(server, max_concurrent=4)
    texts = [f"doc {i}" for i in range(200)]
    inputs = [gated(texts[0], "first"), *(gated(t, "rest") for t in texts[1:4]), *texts[4:]]
    pipeline = Echo("e").bind(resources=resources, max_concurrent=64)

    def scenario() -> None:
        server.wait_parked("first", 1)
        server.wait_parked("rest", 3)
        # all four slots taken: nothing more can be in flight, though the run allows 64
        assert server.stats()["in_flight"] == 4
        server.open_gate("rest")
        # the slots inputs 1-3 free are refilled while input 0 still waits: all 199
        # others finish before it (a scheduler working in waves of four would stall here)
        wait_until(
            lambda: server.stats()["status_counts"].get("200", 0) == 199,
            "199 replies while input 0 was parked",
        )
        assert server.parked("first") == 1
        server.open_gate("first")

    with ThreadPoolExecutor(1) as pool:
        checks = pool.submit(scenario)
        try:
            outputs = pipeline.run_sync(inputs)
        finally:
            server.open_gate("first")
            server.open_gate("rest")
        checks.result(timeout=120)
    assert outputs == [echo("e", x) for x in texts]
    stats = server.stats()
    assert stats["requests_total"] == 200
    assert stats["max_in_flight"] == 4  # never more than the alias allows


async def test_two_concurrent_batches_share_the_endpoint_limit(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, max_concurrent=3)
    one, two = FanOutFanIn().bind(resources=resources), FanOutFanIn().bind(resources=resources)
    # each batch's first input parks its two calls: four parked calls that two separate
    # limits of 3 would let through together, and one shared limit caps at 3
    a_texts, b_texts = [f"a{i}" for i in range(40)], [f"b{i}" for i in range(40)]
    both = asyncio.gather(
        one([gated(a_texts[0]), *a_texts[1:]]), two([gated(b_texts[0]), *b_texts[1:]])
    )
    a, b = await await_gated(both, server, {"g": 3})
    assert a == [expected_fan(x) for x in a_texts]
    assert b == [expected_fan(x) for x in b_texts]
    assert server.stats()["max_in_flight"] == 3


def test_run_wide_max_concurrent_caps_llm_calls(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, max_concurrent=50)
    texts = [str(i) for i in range(60)]
    pipeline = FanOutFanIn().bind(resources=resources, max_concurrent=2)
    # input 0's two parallel calls park: the run's cap of 2 is reached, whatever the load
    outputs = run_gated(lambda: pipeline.run_sync([gated(texts[0]), *texts[1:]]), server, {"g": 2})
    assert outputs == [expected_fan(x) for x in texts]
    assert server.stats()["max_in_flight"] == 2


def test_a_generator_batch_is_consumed_lazily(resources: plait.ResourceConfig) -> None:
    pulled = 0

    def inputs() -> Iterator[str]:
        nonlocal pulled
        for i in range(200):
            pulled += 1
            yield f"doc {i}"

    pipeline = FanOutFanIn().bind(resources=resources, max_inputs_in_flight=5)

    async def first_result() -> tuple[int, int]:
        async with plait.ExecutionSettings(streaming=True):
            stream = pipeline(inputs())
            async for result in stream:
                seen = pulled
                await stream.aclose()  # type: ignore[attr-defined]
                return result.index, seen
        raise AssertionError("no result")

    index, seen = asyncio.run(first_result())
    assert index == 0
    assert seen <= 6  # the window (5) plus the one waiting for a slot, not all 200


def test_a_generator_batch_runs_to_completion(resources: plait.ResourceConfig) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    out = pipeline.run_sync(f"g{i}" for i in range(30))
    assert out == [expected_fan(f"g{i}") for i in range(30)]


async def test_streaming_yields_batch_results(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = FanOutFanIn()
    inputs = [gated("slow"), "fast1", "fast2"]
    results = []
    async with plait.ExecutionSettings(resources=resources, streaming=True):
        async for result in pipeline(inputs):
            results.append(result)
            if len(results) == 2:  # both fast ones are out while "slow" still waits
                await asyncio.to_thread(server.open_gate, "g")
    assert sorted(r.index for r in results[:2]) == [1, 2]
    assert results[-1].index == 0  # completion order: the parked one last
    assert all(r.ok and r.output == expected_fan(r.input.split("]]")[-1]) for r in results)
    server.reset()  # closes the gate again for the ordered run
    async with plait.ExecutionSettings(resources=resources, streaming=True, preserve_order=True):
        ordered = [r.index async for r in pipeline(["first", "second", "third"])]
    assert ordered == [0, 1, 2]


async def test_module_stream_method(resources: plait.ResourceConfig) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    got = {r.index: r.output async for r in pipeline.stream(["a", "b"])}
    assert got == {0: expected_fan("a"), 1: expected_fan("b")}


async def test_plait_run_with_per_call_options(resources: plait.ResourceConfig) -> None:
    out = await plait.run(FanOutFanIn(), "x", resources=resources, max_concurrent=5)
    assert out == expected_fan("x")


async def test_settings_precedence(server: FakeOpenAIServer) -> None:
    from plait.execution.settings import get_execution_settings, resolve_options

    def batch(limit: int) -> list[str]:
        # enough parked inputs (two calls each) to fill ``limit`` slots at once
        return [gated(str(i)) if 2 * i < limit else str(i) for i in range(30)]

    resources = make_resources(server, max_concurrent=50)
    with plait.ExecutionSettings(resources=resources, max_concurrent=7, preserve_order=True):  # noqa: SIM117
        with plait.ExecutionSettings(max_concurrent=5):
            inner = get_execution_settings()
            assert inner is not None
            assert inner.max_concurrent == 5 and inner.preserve_order is True  # inherited
            assert inner.resources is resources
            assert resolve_options({}, {}, None)["max_concurrent"] == 5  # context
            assert resolve_options({}, {"max_concurrent": 3}, None)["max_concurrent"] == 3  # bind
            assert (
                resolve_options({"max_concurrent": 2}, {"max_concurrent": 3}, None)[
                    "max_concurrent"
                ]
                == 2
            )  # call
            pipeline = FanOutFanIn()
            expected = [expected_fan(str(i)) for i in range(30)]
            assert await await_gated(pipeline(batch(5)), server, {"g": 5}) == expected
            assert server.stats()["max_in_flight"] == 5
            server.reset()
            bound = pipeline.bind(None, max_concurrent=3)
            assert await await_gated(bound(batch(3)), server, {"g": 3}) == expected
            assert server.stats()["max_in_flight"] == 3
            server.reset()
            capped = pipeline(batch(2), max_concurrent=2)
            assert await await_gated(capped, server, {"g": 2}) == expected
            assert server.stats()["max_in_flight"] == 2
    assert get_execution_settings() is None
    assert resolve_options({}, {}, None)["max_concurrent"] == 100  # default


async def test_async_forward_decides_on_real_values(
    resources: plait.ResourceConfig, server: FakeOpenAIServer
) -> None:
    class Router(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classify = Echo("cls")
            self.short = Echo("short")
            self.long = Echo("long")

        async def forward(self, text: str) -> Any:
            label = await self.classify(text)
            if "urgent" in label:
                return await self.short(label)
            return await self.long(label)

    class Pipeline(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = Router()
            self.final = Echo("fin")

        def forward(self, text: str) -> Any:
            return self.final(self.router(text))

    pipeline = Pipeline().bind(resources=resources)
    assert pipeline.run_sync("urgent!") == echo("fin", echo("short", echo("cls", "urgent!")))
    assert pipeline.run_sync("calm") == echo("fin", echo("long", echo("cls", "calm")))
    assert server.stats()["requests_total"] == 6


def test_missing_alias_is_a_clear_error_before_any_call(
    resources: plait.ResourceConfig, server: FakeOpenAIServer
) -> None:
    with pytest.raises(plait.ConfigurationError, match="'nowhere'"):
        plait.LLMInference("nowhere").bind(resources=resources).run_sync("x")
    assert server.stats()["requests_total"] == 0


def test_a_draining_batch_runs_the_critical_path_first(server: FakeOpenAIServer) -> None:
    # One slot, and every input admitted at once: the batch drains from the start, so the
    # calls that still have a call after them (the fan-out) go before the final combines,
    # instead of input by input.  That ordering is what keeps the last wave short.
    resources = make_resources(server, max_concurrent=1)
    inputs = [f"doc {i}" for i in range(5)]
    outputs = FanOutFanIn().bind(resources=resources).run_sync(inputs)
    assert outputs == [expected_fan(x) for x in inputs]
    order = [r["system"] for r in sorted(server.stats()["requests"], key=lambda r: r["t_start"])]
    assert sorted(order[:10]) == ["L"] * 5 + ["R"] * 5
    assert order[10:] == ["C"] * 5


def test_a_batch_still_being_admitted_serves_the_oldest_inputs_first(
    server: FakeOpenAIServer,
) -> None:
    # A window of one input at a time: each input's calls finish before the next starts.
    resources = make_resources(server, max_concurrent=1)
    inputs = [f"doc {i}" for i in range(4)]
    FanOutFanIn().bind(resources=resources, max_inputs_in_flight=1).run_sync(inputs)
    records = sorted(server.stats()["requests"], key=lambda r: r["t_start"])
    assert [r["system"] for r in records[2::3]] == ["C"] * 4


class _SyncInsideAsync(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Echo("i")

    async def forward(self, text: str) -> Any:
        return self.inner.run_sync(text)


def test_run_sync_on_the_runtime_loop_is_a_clear_error(resources: plait.ResourceConfig) -> None:
    with pytest.raises(plait.ExecutionError) as info:
        _SyncInsideAsync().bind(resources=resources).run_sync("x")
    message = info.value.value.meta["message"]
    assert "await module(...)" in message


def test_background_tasks_left_on_the_runtime_loop_are_cancelled_at_exit(
    tmp_path: Path,
) -> None:
    """A task that outlives its run (a Ray lease task does) is cancelled and unwinds
    when the process exits, instead of being destroyed pending with a warning."""
    marker = tmp_path / "unwound"
    script = tmp_path / "leave_a_task.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, contextvars
            from pathlib import Path
            from plait.execution.loop import runtime_loop

            async def forever():
                try:
                    await asyncio.Event().wait()
                finally:
                    Path({str(marker)!r}).write_text("yes")

            kept = []  # held, as a lease task is by its governor

            async def start():
                kept.append(asyncio.get_running_loop().create_task(forever()))

            runtime_loop().submit(start(), contextvars.Context()).future.result()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Task was destroyed" not in done.stderr
    assert marker.read_text() == "yes"


def test_consecutive_run_sync_calls_reuse_the_runtime(resources: plait.ResourceConfig) -> None:
    from plait.execution.loop import runtime_loop

    pipeline = Echo("fast").bind(resources=resources)
    assert pipeline.run_sync("a") == echo("fast", "a")
    first = runtime_loop()
    assert pipeline.run_sync("b") == echo("fast", "b")
    assert runtime_loop() is first and first.thread.is_alive()


class _Tag(plait.Module):
    async def forward(self, text: str) -> str:
        return text[::-1]


async def test_a_long_stream_runs_in_bounded_memory(resources: plait.ResourceConfig) -> None:
    # Memory is held by the work in flight, not by the inputs seen so far: the peak over
    # inputs 10,000-20,000 stays near the peak over the first 2,000.
    import tracemalloc

    pipeline = _Tag().bind(resources=resources, max_inputs_in_flight=64)
    count = 0
    tracemalloc.start()
    try:
        early_peak = 0
        async for result in pipeline.stream(f"input {i}" for i in range(20_000)):
            assert result.ok
            count += 1
            if count == 2_000:
                early_peak = tracemalloc.get_traced_memory()[1]
            elif count == 10_000:
                tracemalloc.reset_peak()
        late_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 20_000
    assert late_peak < 1.5 * early_peak, (early_peak, late_peak)


def test_the_seeds_import_path_for_the_context_settings(resources: plait.ResourceConfig) -> None:
    from plait.execution.context import get_execution_settings

    assert get_execution_settings() is None
    with plait.ExecutionSettings(resources=resources, max_concurrent=3):
        settings = get_execution_settings()
        assert settings is not None and settings.max_concurrent == 3
