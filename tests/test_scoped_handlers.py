"""A handler entered inside a traced ``forward`` reaches exactly the calls made in its block.

``forward`` is recorded before any call runs, so a ``with`` block there cannot wrap the
calls as they happen: the tracer records the block on each call made inside it and the
engine enters the handler again around each of those calls when it runs them, inside
the handlers around the run.  A handler that cannot work that way (one that draws or
exports whole runs) is refused naming where to enter it, and so are blocks that do
not nest (left open, left out of order, or begun outside forward and ended inside it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import Handler, Message
from plait.testing import FakeOpenAIServer
from plait.tracing import TracingError

from .conftest import make_resources, plait_cli
from .pipelines import Echo, FanOutFanIn, echo
from .test_execution import gated, run_gated


class Trail(Handler):
    """Notes the LLM calls it sees: ``log`` (shared between trails) gets (name, module
    path) as each is processed; ``calls`` the module path of each that succeeded."""

    def __init__(self, name: str = "trail", log: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.log = log if log is not None else []
        self.calls: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def process_llm(self, msg: Message) -> None:
        self.log.append((self.name, msg.name))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def postprocess_llm(self, msg: Message) -> None:
        self.in_flight -= 1
        if msg.error is None:
            self.calls.append(msg.name)


class Staged(plait.Module):
    """Three calls inside the block of ``handler``, and one after it."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")
        self.after = Echo("A")

    def forward(self, text: str) -> Any:
        with self.handler:
            joined = self.combine(f"{self.left(text)} | {self.right(text)}")
        return self.after(joined)


def staged(text: str) -> str:
    return echo("A", echo("C", f"{echo('L', text)} | {echo('R', text)}"))


#: The temperature a request is sent with when nothing changed it.
DEFAULT = 1.0


def sent(server: FakeOpenAIServer) -> list[tuple[str, Any]]:
    """(system prompt, temperature) of every request the server received, sorted."""
    return sorted(
        (record["system"], record["body"].get("temperature"))
        for record in server.stats(bodies=True)["requests"]
    )


# -- applied: the calls in the block, and only those ------------------------------------------
def test_a_handler_entered_in_forward_sees_exactly_the_calls_in_its_block(
    resources: plait.ResourceConfig,
) -> None:
    trail = Trail()
    pipeline = Staged(trail).bind(resources=resources)
    assert pipeline.run_sync(["a", "b"]) == [staged("a"), staged("b")]
    assert sorted(trail.calls) == ["combine"] * 2 + ["left"] * 2 + ["right"] * 2
    # The block is over once its calls are: nothing was left active anywhere.
    assert trail.entered == 0 and plait.handlers.current_stack() == ()


class OverrideInForward(plait.Module):
    """An override made and entered inside forward, around two of its three calls."""

    def __init__(self) -> None:
        super().__init__()
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")

    def forward(self, text: str) -> Any:
        with plait.handlers.override(temperature=0.25):
            left, right = self.left(text), self.right(text)
        return self.combine(f"{left} | {right}")


def test_an_override_in_forward_changes_only_the_requests_made_in_its_block(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = OverrideInForward().bind(resources=resources)
    assert pipeline.run_sync("x") == echo("C", f"{echo('L', 'x')} | {echo('R', 'x')}")
    assert sent(server) == [("C", DEFAULT), ("L", 0.25), ("R", 0.25)]


class Nested(plait.Module):
    """Blocks of ``outer`` and ``inner`` nested in forward, and a call outside both."""

    def __init__(self, outer: Handler, inner: Handler) -> None:
        super().__init__()
        self.outer, self.inner = outer, inner
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")

    def forward(self, text: str) -> Any:
        with self.outer:
            left = self.left(text)
            with self.inner:
                right = self.right(text)
        return self.combine(f"{left} | {right}")


def test_nested_blocks_sit_inside_the_handlers_around_the_run_innermost_first(
    resources: plait.ResourceConfig,
) -> None:
    log: list[tuple[str, str]] = []
    pipeline = Nested(Trail("outer", log), Trail("inner", log)).bind(resources=resources)
    with Trail("run", log):
        pipeline.run_sync("x")

    def seen_by(call: str) -> list[str]:
        return [name for name, path in log if path == call]

    # process runs from the innermost block outwards: the forward's blocks come first.
    assert seen_by("right") == ["inner", "outer", "run"]
    assert seen_by("left") == ["outer", "run"]
    assert seen_by("combine") == ["run"]


class Fanned(plait.Module):
    """Two independent calls inside one block: they run at the same time."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.left = Echo("L")
        self.right = Echo("R")

    def forward(self, text: str) -> Any:
        with self.handler:
            left, right = self.left(text), self.right(text)
        return [left, right]


def test_one_handler_around_concurrent_calls_sees_them_all_at_once(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    """Four calls (two inputs, two calls each) wait at the server together, a state
    the test waits for: all four are inside the same handler object at that moment."""
    trail = Trail()
    pipeline = Fanned(trail).bind(resources=resources)
    texts = [gated("a"), gated("b")]
    outputs = run_gated(lambda: pipeline.run_sync(texts), server, {"g": 4})
    assert outputs == [[echo("L", t), echo("R", t)] for t in ("a", "b")]
    assert trail.most_in_flight == 4
    assert sorted(trail.calls) == ["left", "left", "right", "right"]
    assert trail.entered == 0


class Composite(plait.Module):
    """A module that makes calls of its own (a composite), called inside a block."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.fan = FanOutFanIn()
        self.after = Echo("A")

    def forward(self, text: str) -> Any:
        with self.handler:
            fanned = self.fan(text)
        return self.after(fanned)


class ModuleTrail(Trail):
    """A trail that also notes the module calls it sees (composites included)."""

    def __init__(self) -> None:
        super().__init__()
        self.modules: list[tuple[str, bool]] = []

    def process_module(self, msg: Message) -> None:
        self.modules.append((msg.name, bool(msg.meta.get("composite"))))


def test_the_calls_of_a_module_called_in_a_block_run_inside_it(
    resources: plait.ResourceConfig,
) -> None:
    trail = ModuleTrail()
    pipeline = Composite(trail).bind(resources=resources)
    fanned = echo("C", f"{echo('L', 'x')} | {echo('R', 'x')}")
    assert pipeline.run_sync("x") == echo("A", fanned)
    assert sorted(trail.calls) == ["fan.combine", "fan.left", "fan.right"]
    assert trail.modules == [("fan", True)]  # the module's own call, processed in the block


class Decider(plait.Module):
    """A leaf with an ``async def forward``: it runs on real values."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = Echo("D")

    async def forward(self, text: str) -> Any:
        return await self.llm(text)


class AsyncInBlock(plait.Module):
    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.decide = Decider()
        self.after = Echo("A")

    def forward(self, text: str) -> Any:
        with self.handler:
            decided = self.decide(text)
        return self.after(decided)


def test_an_async_forward_called_in_a_block_makes_its_calls_inside_it(
    resources: plait.ResourceConfig,
) -> None:
    trail = Trail()
    pipeline = AsyncInBlock(trail).bind(resources=resources)
    assert pipeline.run_sync("x") == echo("A", echo("D", "x"))
    assert trail.calls == ["decide.llm"]


class AsyncEntering(plait.Module):
    """An ``async def forward`` that enters a handler itself, around one of two calls."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.first = Echo("1")
        self.second = Echo("2")

    async def forward(self, text: str) -> Any:
        with self.handler:
            first = await self.first(text)
        return await self.second(first)


def test_a_handler_entered_in_an_async_forward_sees_the_calls_in_its_block(
    resources: plait.ResourceConfig,
) -> None:
    trail = Trail()
    pipeline = AsyncEntering(trail).bind(resources=resources)
    assert pipeline.run_sync("x") == echo("2", echo("1", "x"))
    assert trail.calls == ["first"]


# -- the catalogue inside forward ---------------------------------------------------------------
class CatalogueInForward(plait.Module):
    """``make()`` builds a handler inside forward, entered around the first two calls."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")

    def forward(self, text: str) -> Any:
        with self.make():
            left, right = self.left(text), self.right(text)
        return self.combine(f"{left} | {right}")


def fan(text: str, left: str | None = None) -> str:
    return echo("C", f"{left or echo('L', text)} | {echo('R', text)}")


def test_a_mock_in_forward_answers_the_calls_in_its_block(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = CatalogueInForward(lambda: plait.handlers.mock({"left": "mocked"}))
    assert pipeline.bind(resources=resources).run_sync("x") == fan("x", left="mocked")
    assert sent(server) == [("C", DEFAULT), ("R", DEFAULT)]


def test_a_cache_in_forward_answers_the_calls_of_its_block_again(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    path = tmp_path / "calls.db"
    pipeline = CatalogueInForward(lambda: plait.handlers.cache(path)).bind(resources=resources)
    assert pipeline.run_sync("x") == fan("x")
    assert server.stats()["requests_total"] == 3
    server.reset()
    assert pipeline.run_sync("x") == fan("x")
    assert sent(server) == [("C", DEFAULT)]  # left and right came from the cache


def test_a_recorder_in_forward_records_the_calls_of_its_block(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    pipeline = CatalogueInForward(lambda: plait.handlers.record(path)).bind(resources=resources)
    assert pipeline.run_sync(["x", "y"]) == [fan("x"), fan("y")]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["module"] for line in lines[1:]) == ["left", "left", "right", "right"]


def test_a_budget_in_forward_limits_the_calls_of_its_block(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    limit = plait.handlers.budget(max_calls=1)
    pipeline = CatalogueInForward(lambda: limit).bind(resources=resources)
    with pytest.raises(plait.ExecutionError, match="max_calls=1"):
        pipeline.run_sync("x")
    assert (limit.calls, limit.refused) == (1, 1)
    assert len(sent(server)) == 1  # the combining call waited for the refused one


def test_a_call_log_in_forward_keeps_the_calls_of_its_block(
    resources: plait.ResourceConfig,
) -> None:
    log = plait.handlers.log_calls()
    pipeline = CatalogueInForward(lambda: log).bind(resources=resources)
    assert pipeline.run_sync("x") == fan("x")
    assert sorted(call.path for call in log.calls) == ["left", "right"]


# -- refused: handlers that cannot be entered again around each call ----------------------------
def test_a_profile_in_forward_is_refused_before_any_call_naming_where_it_goes(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    pipeline = CatalogueInForward(lambda: plait.handlers.profile(tmp_path / "trace.json"))
    with pytest.raises(TracingError) as info:
        pipeline.bind(resources=resources).run_sync(["x", "y"])
    message = str(info.value)
    assert "Profiler" in message and "CatalogueInForward.forward()" in message
    assert "around the run" in message
    assert server.stats()["requests_total"] == 0


def test_otel_in_forward_is_refused_as_it_exports_whole_runs(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = CatalogueInForward(plait.handlers.otel)  # refused before it exports anything
    with pytest.raises(TracingError, match=r"Telemetry.*hooks runs.*around the run"):
        pipeline.bind(resources=resources).run_sync(["x"])
    assert server.stats()["requests_total"] == 0


class RunHook(Handler):
    def process_run(self, msg: Message) -> None:
        pass


def test_a_handler_of_ones_own_that_hooks_runs_is_refused_in_forward(
    resources: plait.ResourceConfig,
) -> None:
    pipeline = CatalogueInForward(RunHook)
    with pytest.raises(TracingError, match=r"RunHook.*hooks runs"):
        pipeline.bind(resources=resources).run_sync(["x"])


# -- blocks that do not nest --------------------------------------------------------------------
class Entering(plait.Module):
    """Enters and leaves ``handlers`` by hand, in the order ``steps`` says."""

    def __init__(self, handlers: list[Handler], steps: list[tuple[str, int]]) -> None:
        super().__init__()
        self.handlers = handlers
        self.steps = steps
        self.llm = Echo("E")

    def forward(self, text: str) -> Any:
        out = self.llm(text)
        for step, which in self.steps:
            handler = self.handlers[which]
            if step == "enter":
                handler.__enter__()
            else:
                handler.__exit__(None, None, None)
        return out


def test_a_handler_left_open_in_forward_is_refused_and_closed(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    trail = Trail()
    pipeline = Entering([trail], [("enter", 0)]).bind(resources=resources)
    left_open = r"left open in forward\(\): the handler Trail \(entered in Entering.forward"
    with pytest.raises(TracingError, match=left_open):
        pipeline.run_sync(["x"])
    assert trail.entered == 0 and trail.calls == []
    assert server.stats()["requests_total"] == 0


def test_handlers_left_out_of_order_in_forward_are_refused(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    first, second = Trail("first"), Trail("second")
    steps = [("enter", 0), ("enter", 1), ("exit", 0), ("exit", 1)]
    pipeline = Entering([first, second], steps).bind(resources=resources)
    with pytest.raises(TracingError, match=r"Trail was left .* \(Trail\) .* reverse order"):
        pipeline.run_sync(["x"])
    assert first.entered == second.entered == 0
    assert server.stats()["requests_total"] == 0


def test_a_block_begun_around_the_run_cannot_end_inside_forward(
    resources: plait.ResourceConfig,
) -> None:
    outside = Trail()
    pipeline = Entering([outside], [("exit", 0)]).bind(resources=resources)
    with outside, pytest.raises(TracingError, match="entered outside it"):
        pipeline.run_sync(["x"])
    assert outside.entered == 0


class AroundNothing(plait.Module):
    """A block that encloses no call: its handler has nothing to see, as in plain Python."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.llm = Echo("N")

    def forward(self, text: str) -> Any:
        with self.handler:
            shown = text.upper()
        return self.llm(shown)


def test_a_block_around_no_call_sees_nothing_and_leaves_nothing_active(
    resources: plait.ResourceConfig,
) -> None:
    trail = Trail()
    pipeline = AroundNothing(trail).bind(resources=resources)
    assert pipeline.run_sync("x") == echo("N", "X")
    assert trail.calls == [] and trail.entered == 0


# -- what a block in forward leaves alone: checkpoints, cache keys --------------------------------
class LeftOverridden(plait.Module):
    """The override of ``where="left"`` around the run, moved into forward."""

    def __init__(self) -> None:
        super().__init__()
        self.left = Echo("L")
        self.right = Echo("R")
        self.combine = Echo("C")

    def forward(self, text: str) -> Any:
        with plait.handlers.override(temperature=0.25):
            left = self.left(text)
        return self.combine(f"{left} | {self.right(text)}")


def test_cache_keys_are_those_of_the_same_override_around_the_run(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    path = tmp_path / "calls.db"
    with plait.handlers.cache(path), plait.handlers.override("left", temperature=0.25):
        FanOutFanIn().bind(resources=resources).run_sync(["a", "b"])
    assert server.stats()["requests_total"] == 6
    server.reset()
    with plait.handlers.cache(path) as cached:
        outputs = LeftOverridden().bind(resources=resources).run_sync(["a", "b"])
    assert outputs == [fan("a"), fan("b")]
    assert server.stats()["requests_total"] == 0 and cached.hits == 6


def test_a_resumed_run_pays_nothing_again_for_calls_made_in_a_block(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    pipeline = LeftOverridden().bind(resources=resources, checkpoint_dir=tmp_path / "ckpt")
    assert pipeline.run_sync(["a", "b"]) == [fan("a"), fan("b")]
    assert sorted(sent(server)) == [("C", DEFAULT)] * 2 + [("L", 0.25)] * 2 + [("R", DEFAULT)] * 2
    server.reset()
    # A recorder must see every call, so the finished inputs are run again through their
    # calls, each answered by the checkpoint under the key of the request the block made.
    with plait.handlers.record(tmp_path / "calls.jsonl") as recorder:
        assert pipeline.run_sync(["a", "b"]) == [fan("a"), fan("b")]
    assert server.stats()["requests_total"] == 0 and recorder.calls == 6


# -- plait run, and Ray workers -----------------------------------------------------------------
PIPELINE_FILE = """
import plait


class Review(plait.Module):
    def __init__(self):
        super().__init__()
        self.facts = plait.LLMInference("fast", system_prompt="F")
        self.risks = plait.LLMInference("fast", system_prompt="R")
        self.judge = plait.LLMInference("fast", system_prompt="J")

    def forward(self, doc):
        with plait.handlers.mock({"facts": "no facts"}):
            with plait.handlers.override(temperature=0.25):
                facts, risks = self.facts(doc), self.risks(doc)
        return self.judge(f"{facts} / {risks}")
"""


def test_plait_run_applies_a_handler_entered_in_forward(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    (tmp_path / "review.py").write_text(PIPELINE_FILE)
    (tmp_path / "in.jsonl").write_text('"a"\n"b"\n')
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    out = tmp_path / "out.jsonl"
    done = plait_cli(
        "run",
        f"{tmp_path / 'review.py'}:Review",
        "--input",
        tmp_path / "in.jsonl",
        "-o",
        out,
        "--resources",
        resources,
    )
    assert done.returncode == 0, done.stderr
    rows = sorted(json.loads(line)["output"] for line in out.read_text().splitlines())
    assert rows == [echo("J", f"no facts / {echo('R', t)}") for t in ("a", "b")]
    assert sent(server) == [("J", DEFAULT)] * 2 + [("R", 0.25)] * 2


@pytest.mark.usefixtures("ray_cluster")
def test_on_ray_workers_a_block_in_forward_applies_on_each_worker(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, ("fast",), max_concurrent=8)
    pipeline = OverrideInForward().bind(resources=resources)
    texts = [f"doc {i}" for i in range(6)]
    assert pipeline.run_sync(texts, workers=2) == [fan(t) for t in texts]
    assert sent(server) == sorted([("C", DEFAULT)] * 6 + [("L", 0.25)] * 6 + [("R", 0.25)] * 6)


@pytest.mark.usefixtures("ray_cluster")
def test_on_ray_workers_a_budget_in_forward_is_refused_before_any_call(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, ("fast",), max_concurrent=8)
    pipeline = CatalogueInForward(lambda: plait.handlers.budget(max_calls=5))
    with pytest.raises(TracingError, match=r"Budget.*Ray workers.*around the run"):
        pipeline.bind(resources=resources).run_sync(["a", "b"], workers=2)
    assert server.stats()["requests_total"] == 0


def test_the_handlers_page_example_of_a_handler_in_forward_does_what_it_says(
    server: FakeOpenAIServer,
) -> None:
    from tests.page_runner import load_page

    root = Path(__file__).resolve().parent.parent
    page = load_page(root / "docs" / "concepts" / "handlers.md", root)
    block = next(b.body for b in page.blocks if "class Review" in b.body and "override(" in b.body)
    definitions = block.split("\nreview = Review()", 1)[0]  # the page's own run aside
    space: dict[str, Any] = {}
    exec(compile(definitions, "docs/concepts/handlers.md", "exec"), space)
    resources = make_resources(server, ("fast",))
    review = space["Review"]().bind(resources=resources)
    review.run_sync("a doc")
    assert sent(server) == [
        ("List the facts.", 0),
        ("List the risks.", 0),
        ("Weigh them.", DEFAULT),
    ]
    assert review.counts.by_module == {"facts": 1, "risks": 1}
