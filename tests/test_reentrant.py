"""One handler or `ExecutionSettings` entered by several tasks at once (issue 20, point 1).

Each block belongs to the task that entered it: a task leaving its block first must
not take another task's block (or its own) with it, whichever order they finish in.
"""

from __future__ import annotations

import asyncio

import plait
import plait.functional as F
from plait.execution.settings import get_execution_settings
from plait.handlers import Handler, current_stack, override
from plait.testing import FakeOpenAIServer

from .conftest import make_resources


def _first_leaves_first() -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
    """Three events: the first task entered, the second entered, the first left."""
    return asyncio.Event(), asyncio.Event(), asyncio.Event()


async def test_a_handler_decorating_an_async_def_gathered_twice_holds_in_both(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server)
    first_in, second_in, first_out = _first_leaves_first()

    @override(temperature=0.0)
    async def ask(text: str, entered: asyncio.Event, after: asyncio.Event) -> str:
        entered.set()
        await after.wait()
        return F.text_of(await F.complete("fast", text, resources=resources))

    async def first() -> str:
        try:
            return await ask("one", first_in, second_in)
        finally:
            first_out.set()

    # The first task leaves its block while the second is still inside its own.
    out = await asyncio.gather(first(), ask("two", second_in, first_out))
    assert out == ["one", "two"]
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    assert [b["temperature"] for b in bodies] == [0.0, 0.0]
    assert current_stack() == ()


async def test_one_execution_settings_entered_by_two_tasks_with_async_with(
    server: FakeOpenAIServer,
) -> None:
    settings = plait.ExecutionSettings(resources=make_resources(server), max_concurrent=3)
    first_in, second_in, first_out = _first_leaves_first()

    async def ask(text: str, entered: asyncio.Event, after: asyncio.Event) -> str:
        async with settings:
            entered.set()
            await after.wait()
            inside = get_execution_settings()
            assert inside is not None and inside.max_concurrent == 3
            reply = await F.complete("fast", text)
        assert get_execution_settings() is None
        return F.text_of(reply)

    async def first() -> str:
        try:
            return await ask("one", first_in, second_in)
        finally:
            first_out.set()

    assert await asyncio.gather(first(), ask("two", second_in, first_out)) == ["one", "two"]
    assert server.stats()["requests_total"] == 2
    assert get_execution_settings() is None


async def test_a_handler_entered_by_many_tasks_leaves_each_task_its_own_stack() -> None:
    marker = Handler()
    inside = asyncio.Event()
    left = [asyncio.Event() for _ in range(8)]
    entered = 0

    async def hold(position: int) -> tuple[Handler, ...]:
        nonlocal entered
        with marker:
            entered += 1
            if entered == 8:
                inside.set()
            await inside.wait()
            # Leave in the order of entry, the opposite of a stack's.
            if position:
                await left[position - 1].wait()
            seen = current_stack()
        left[position].set()
        assert current_stack() == ()
        return seen

    seen = await asyncio.gather(*(hold(i) for i in range(8)))
    assert seen == [(marker,)] * 8
    assert marker.entered == 0


def test_a_handler_entered_twice_in_one_task_nests() -> None:
    marker = Handler()
    with marker:
        with marker:
            assert current_stack() == (marker, marker) and marker.entered == 2
        assert current_stack() == (marker,) and marker.entered == 1
    assert current_stack() == () and marker.entered == 0
