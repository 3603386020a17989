"""One call, one message (issue 21): interpreters give a module call its meaning,
handlers opt into message types by method, and a batch runs on a named backend.

Every test talks to the real fake OpenAI server through plait's real client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import plait
import plait.functional as F
from plait.effects import Interpreter, Runtime, current_interpreter
from plait.execution.backends import BackendError, backend, register_backend
from plait.execution.calls import NodeScope
from plait.handlers import Handler, Message, cache, override
from plait.testing import FakeOpenAIServer
from plait.tracing import Tracer

from .conftest import make_resources
from .pipelines import Echo, SummarizeAndAnalyze, echo


class Inner(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = Echo("in")

    def forward(self, text: str) -> Any:
        return self.llm(text)


class Outer(plait.Module):
    """A composite (Inner) inside a composite: its call is a composite module message."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.last = Echo("out")

    def forward(self, text: str) -> Any:
        return self.last(self.inner(text))


# -- handlers opt in by method ------------------------------------------------------------
class LLMOnly(Handler):
    def __init__(self) -> None:
        self.types: list[str] = []

    def process_llm(self, msg: Message) -> None:
        self.types.append(msg.type)


class ModulesOnly(Handler):
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def postprocess_module(self, msg: Message) -> None:
        self.calls.append((msg.name, bool(msg.meta.get("composite"))))


class Everything(Handler):
    """A handler written before typed hooks: the plain hooks see every message."""

    def __init__(self) -> None:
        self.types: list[str] = []

    def process(self, msg: Message) -> None:
        self.types.append(msg.type)


def test_a_handler_sees_only_the_message_types_it_has_hooks_for(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Outer().bind(resources=make_resources(server))
    llm, modules, everything = LLMOnly(), ModulesOnly(), Everything()
    with everything, modules, llm:
        assert pipeline.run_sync("x") == echo("out", echo("in", "x"))
    assert llm.types == ["llm", "llm"]
    # The root and Inner are composite calls; the two LLM calls are "llm" messages.
    assert sorted(modules.calls) == [("Outer", True), ("inner", True)]
    assert sorted(everything.types) == ["llm", "llm", "module", "module"]


def test_seeing_composite_calls_is_inferred_from_the_hooks(tmp_path: Path) -> None:
    assert not LLMOnly.sees("module") and LLMOnly.sees("llm")
    assert ModulesOnly.sees("module") and not ModulesOnly.sees("llm")
    assert Everything.sees("module") and Everything.sees("llm")
    for catalogued in (cache(tmp_path / "calls.db"), override(temperature=0.0)):
        assert not type(catalogued).sees("module"), catalogued
        assert type(catalogued).sees("llm"), catalogued


async def test_typed_hooks_hold_under_concurrent_runs(server: FakeOpenAIServer) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    llm = LLMOnly()
    with llm:
        results = await asyncio.gather(*(pipeline([f"d{i}", f"e{i}"]) for i in range(4)))
    assert [r for pair in results for r in pair] == [
        echo("ana", echo("sum", f"{p}{i}")) for i in range(4) for p in "de"
    ]
    assert llm.types == ["llm"] * 16


# -- interpreters ---------------------------------------------------------------------------
def test_what_a_call_means_is_decided_by_the_innermost_interpreter(
    server: FakeOpenAIServer,
) -> None:
    seen: dict[str, Interpreter] = {}

    class Plain(plait.Module):
        def forward(self, x: str) -> str:
            seen.setdefault("plain", current_interpreter())
            return x + "!"

    class Async(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = Echo("a")

        async def forward(self, x: str) -> Any:
            seen["async"] = current_interpreter()
            return await self.llm(x)

    class Traced(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.step = Async()

        def forward(self, x: str) -> Any:
            seen["traced"] = current_interpreter()
            return self.step(x)

    assert Plain()("x") == "x!"  # no LLM in its tree: forward runs on the spot
    assert isinstance(seen["plain"], Runtime)
    pipeline = Traced().bind(resources=make_resources(server))
    assert pipeline.run_sync("y") == echo("a", "y")
    assert isinstance(seen["traced"], Tracer)
    assert isinstance(seen["async"], NodeScope)
    assert isinstance(current_interpreter(), Runtime)  # nothing left entered


async def test_a_functional_call_inside_an_async_forward_is_that_nodes_call(
    server: FakeOpenAIServer,
) -> None:
    class Ask(plait.Module):
        async def forward(self, x: str) -> Any:
            reply = await F.complete("fast", x, name="ask")
            return F.text_of(reply)

    class Root(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ask = Ask()

        def forward(self, x: str) -> Any:
            return self.ask(x)

    names: list[tuple[str, str | None, int | None]] = []

    class Names(Handler):
        def process_llm(self, msg: Message) -> None:
            names.append((msg.name, msg.node_id, msg.input_index))

    pipeline = Root().bind(resources=make_resources(server))
    with Names():
        outputs = await pipeline(["p", "q"])
    assert outputs == ["p", "q"]
    # Named like the module's children, keyed by the input and the node that made it.
    site = ("ask.ask", "1:ask/fn:ask.ask")  # node 1 (after the input), path "ask"
    assert sorted(names) == [(*site, 0), (*site, 1)]


# -- backends -------------------------------------------------------------------------------
class Counting:
    """A backend of a user's own: runs each batch locally, counting what it was given."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def run_batch(
        self,
        module: Any,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        listed = list(items)
        self.batches.append(len(listed))
        return await backend("local").run_batch(module, listed, extra, kwargs, opts)


@pytest.fixture()
def counting() -> Counting:
    found = Counting()
    register_backend("counting", lambda: found)
    return found


def test_a_batch_runs_on_the_backend_it_names(server: FakeOpenAIServer, counting: Counting) -> None:
    resources = make_resources(server, ("fast", "smart"))
    pipeline = SummarizeAndAnalyze().bind(resources=resources)
    expected = [echo("ana", echo("sum", t)) for t in ("a", "b", "c")]
    assert pipeline.run_sync(["a", "b", "c"], backend="counting") == expected
    with plait.ExecutionSettings(backend="counting"):
        assert pipeline.run_sync(["a", "b", "c"]) == expected
    bound = SummarizeAndAnalyze().bind(resources=resources, backend="counting")
    assert bound.run_sync(["a", "b", "c"]) == expected
    assert pipeline.run_sync(["a", "b", "c"]) == expected  # the default: local
    assert counting.batches == [3, 3, 3]


async def test_concurrent_batches_on_one_backend_each_get_their_rows(
    server: FakeOpenAIServer, counting: Counting
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    runs = [[f"{k}{i}" for i in range(5)] for k in "xyz"]
    results = await asyncio.gather(*(pipeline(items, backend="counting") for items in runs))
    assert results == [[echo("ana", echo("sum", t)) for t in items] for items in runs]
    assert counting.batches == [5, 5, 5]


def test_a_backend_that_cannot_do_what_was_asked_is_refused(
    server: FakeOpenAIServer, counting: Counting
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    with pytest.raises(BackendError, match=r"'nowhere'.*known: .*counting.*local.*ray"):
        pipeline.run_sync(["a"], backend="nowhere")
    with pytest.raises(ValueError, match="backend='local' runs the batch in this process"):
        pipeline.run_sync(["a"], backend="local", workers=2)
    with pytest.raises(ValueError, match="cannot stream"):
        pipeline.stream(["a"], backend="counting")
    with pytest.raises(ValueError, match="backend must be the name"):
        plait.ExecutionSettings(backend="")
    assert counting.batches == []  # nothing ran, nothing was paid


def test_a_subclass_overriding_a_plain_hook_wins_over_its_bases_typed_one() -> None:
    class Base(Handler):
        def postprocess_llm(self, msg: Message) -> None:
            msg.meta["by"] = "base"

    class Child(Base):
        def postprocess(self, msg: Message) -> None:
            msg.meta["by"] = "child"

    class Grandchild(Child):
        def postprocess_module(self, msg: Message) -> None:
            msg.meta["by"] = "grandchild"

    for handler, kind, expected in [
        (Base(), "llm", "base"),
        (Child(), "llm", "child"),
        (Child(), "module", "child"),
        (Grandchild(), "module", "grandchild"),
        (Grandchild(), "llm", "child"),
    ]:
        msg = Message(type=kind, name="x")
        hook = type(handler).hooks_for(kind)[1]
        assert hook is not None
        hook(handler, msg)
        assert msg.meta["by"] == expected, (type(handler).__name__, kind)
    assert Base.hooks_for("module") == (None, None)
