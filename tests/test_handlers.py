"""The effect-handler stack of seed 004: order, stop, done, errors and isolation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import plait
from plait.handlers import Handler, Message, apply_stack, apply_stack_sync, current_stack

from .pipelines import FanOutFanIn


class Log(Handler):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def process(self, msg: Message) -> None:
        self.log.append(f"process {self.name}")

    def postprocess(self, msg: Message) -> None:
        self.log.append(f"post {self.name}")


def test_process_runs_innermost_first_and_postprocess_as_the_seed_says() -> None:
    log: list[str] = []
    with Log("outer", log), Log("inner", log):
        value = apply_stack_sync(Message("module", "m", fn=lambda: log.append("call") or 7))
    assert value == 7
    # seed 004: process bottom-to-top (innermost first), default, postprocess top-to-bottom
    assert log == ["process inner", "process outer", "call", "post outer", "post inner"]


def test_stop_hides_the_message_from_outer_handlers() -> None:
    log: list[str] = []

    class Stopper(Log):
        def process(self, msg: Message) -> None:
            super().process(msg)
            msg.stop = True

    with Log("outer", log), Stopper("inner", log):
        apply_stack_sync(Message("module", "m", fn=lambda: log.append("call")))
    assert log == ["process inner", "call", "post inner"]


def test_done_skips_the_default_action() -> None:
    class Answer(Handler):
        def process(self, msg: Message) -> None:
            msg.value, msg.done = "answered", True

    calls: list[int] = []
    with Answer():
        assert apply_stack_sync(Message("module", "m", fn=lambda: calls.append(1))) == "answered"
    assert calls == []


def test_postprocess_sees_a_failure_and_may_recover() -> None:
    class Recover(Handler):
        def postprocess(self, msg: Message) -> None:
            assert isinstance(msg.error, ZeroDivisionError)
            msg.error, msg.value = None, "recovered"

    with Recover():
        assert apply_stack_sync(Message("module", "m", fn=lambda: 1 / 0)) == "recovered"
    with pytest.raises(ZeroDivisionError):
        apply_stack_sync(Message("module", "m", fn=lambda: 1 / 0))


async def test_async_hooks_and_async_default() -> None:
    class Slow(Handler):
        async def process(self, msg: Message) -> None:
            await asyncio.sleep(0)
            msg.kwargs["x"] += 1

    async def fn(x: int) -> int:
        return x * 10

    with Slow():
        assert await apply_stack(Message("llm", "m", fn=fn, kwargs={"x": 1})) == 20


async def test_the_stack_is_isolated_per_task() -> None:
    seen: dict[str, tuple[Handler, ...]] = {}
    entered = asyncio.Event()
    release = asyncio.Event()

    async def with_handler() -> None:
        with Log("a", []):
            entered.set()
            await release.wait()
            seen["a"] = current_stack()

    async def without() -> None:
        await entered.wait()
        seen["b"] = current_stack()
        release.set()

    await asyncio.gather(with_handler(), without())
    assert len(seen["a"]) == 1 and seen["b"] == ()


def test_handler_as_decorator() -> None:
    log: list[str] = []
    handler = Log("deco", log)

    @handler
    def work() -> int:
        return len(current_stack())

    assert work() == 1 and current_stack() == ()


def test_a_user_handler_sees_every_run_time_module_call() -> None:
    class Upper(plait.Module):
        def forward(self, text: str) -> str:
            return text.upper()

    class Exclaim(plait.Module):
        async def forward(self, text: str) -> str:
            return text + "!"

    class Pipeline(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.upper, self.exclaim = Upper(), Exclaim()

        def forward(self, text: str) -> Any:
            return self.exclaim(self.upper(text))

    class Record(Handler):
        def __init__(self) -> None:
            self.calls: list[tuple[str, str]] = []

        def postprocess(self, msg: Message) -> None:
            self.calls.append((msg.type, msg.name))
            msg.value = f"<{msg.value}>"

    with Record() as record:
        out = Pipeline().run_sync("hi")
    # The composite root is a module call too: its postprocess sees (and wraps) the output.
    assert record.calls == [("module", "upper"), ("module", "exclaim"), ("module", "Pipeline")]
    assert out == "<<<HI>!>>"


class CountCalls(Handler):  # the example in plait.handlers' documentation, line for line
    def __init__(self) -> None:
        self.by_module: dict[str, int] = {}

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm" and msg.error is None:
            self.by_module[msg.name] = self.by_module.get(msg.name, 0) + 1


def test_the_documented_user_handler_counts_llm_calls_per_module(
    resources: plait.ResourceConfig,
) -> None:
    import plait.handlers

    assert "class CountCalls(Handler):" in (plait.handlers.Handler.__doc__ or "")
    pipeline = FanOutFanIn().bind(resources=resources)
    with CountCalls() as counts:
        pipeline.run_sync(["a", "b", "c"])
    assert counts.by_module == {"left": 3, "right": 3, "combine": 3}


def test_outermost_enters_below_every_active_handler() -> None:
    inner, bottom = Handler(), Handler()
    with inner, bottom.outermost():
        assert current_stack() == (bottom, inner)
    assert current_stack() == ()


class Spy(Handler):
    """Notes, for one module, what each layer of the stack saw and when."""

    def __init__(self, name: str, log: list[tuple[str, str, bool]]) -> None:
        self.name, self.log = name, log

    def process(self, msg: Message) -> None:
        if msg.type == "llm" and msg.name == "combine" and msg.input_index == 0:
            self.log.append((self.name, "process", msg.done))

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm" and msg.name == "combine" and msg.input_index == 0:
            self.log.append((self.name, "postprocess", msg.done))


def test_cache_budget_and_profile_stack_in_order(
    server: Any, resources: plait.ResourceConfig, tmp_path: Any
) -> None:
    from collections import Counter

    from plait.handlers import budget, cache, profile

    pipeline = FanOutFanIn().bind(resources=resources)
    inputs = [f"s{i}" for i in range(10)]
    log: list[tuple[str, str, bool]] = []
    with (
        profile() as prof,
        Spy("outside budget", log),
        budget(max_calls=30) as spent,
        Spy("outside cache", log),
        cache(tmp_path / "calls.db") as store,
    ):
        first = pipeline.run_sync(inputs)
        assert server.stats()["requests_total"] == 30
        log.clear()
        second = pipeline.run_sync(inputs)  # every call a cache hit: nothing spent
    assert first == second
    assert server.stats()["requests_total"] == 30
    assert spent.calls == 30 and spent.refused == 0
    assert (store.hits, store.misses) == (30, 30)
    # the cache (innermost) answers first; the layers outside it see the call done,
    # and postprocess runs back from the outside in
    assert log == [
        ("outside cache", "process", True),
        ("outside budget", "process", True),
        ("outside budget", "postprocess", True),
        ("outside cache", "postprocess", True),
    ]
    events = prof.trace()["traceEvents"]
    outcomes = Counter(e["args"]["outcome"] for e in events if "outcome" in e.get("args", {}))
    assert outcomes == {"ok": 30, "cache hit": 30}


def test_a_budget_inside_a_cache_is_never_asked_about_hits(
    server: Any, resources: plait.ResourceConfig, tmp_path: Any
) -> None:
    from plait.handlers import budget, cache

    pipeline = FanOutFanIn().bind(resources=resources)
    with cache(tmp_path / "calls.db"):
        pipeline.run_sync(["x", "y"])  # warm the cache: 6 calls
        with budget(max_calls=1) as spent:
            assert pipeline.run_sync(["x", "y"]) == pipeline.run_sync(["x", "y"])
    assert spent.calls == 0 and server.stats()["requests_total"] == 6
