"""Tracing: nested modules flatten into one graph; text operations keep dependencies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.testing import FakeOpenAIServer
from plait.tracing import trace
from plait.tracing.graph import NodeRef, ParamRef, Struct, Template

from .conftest import make_resources, plait_cli
from .pipelines import Assistant, DeepPipeline, Echo, Shapes, Synthesizer


def module_nodes(graph: Any) -> list[Any]:
    return [n for n in graph.nodes if n.kind == "module"]


def test_nested_pipeline_flattens_into_one_graph_of_leaf_calls() -> None:
    graph = trace(DeepPipeline(), ("doc",))
    paths = [n.path for n in module_nodes(graph)]
    assert paths == [
        "stage1.summarizer",
        "stage1.analyzer",
        "stage2.technical",
        "stage2.business",
        "stage2.user",
        "stage3.analyzer.technical",
        "stage3.analyzer.business",
        "stage3.analyzer.user",
        "stage3.synthesizer",
    ]
    by_path = {n.path: n for n in graph.nodes}
    calls = graph.call_deps  # what a node waits on, looking through ops and call brackets
    assert calls(by_path["stage1.analyzer"].id) == [by_path["stage1.summarizer"].id]
    # stage2's three calls all wait only for stage1's output: they run concurrently.
    for name in ("technical", "business", "user"):
        assert calls(by_path[f"stage2.{name}"].id) == [by_path["stage1.analyzer"].id]
    synth = by_path["stage3.synthesizer"]
    assert set(calls(synth.id)) == {
        by_path[f"stage3.analyzer.{n}"].id for n in ("technical", "business", "user")
    }


def test_fstring_plus_format_and_join_all_create_dependencies() -> None:
    class Combine(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Echo("a"), Echo("b")
            self.f, self.p, self.fmt, self.j = Echo("f"), Echo("p"), Echo("fmt"), Echo("j")

        def forward(self, x: str) -> Any:
            a, b = self.a(x), self.b(x)
            return [
                self.f(f"{a} and {b}"),
                self.p("start " + a + " mid " + b),
                self.fmt("{} vs {}".format(a, b)),  # noqa: UP032 (str.format is under test)
                self.j(", ".join([a, b, "lit"])),
            ]

    graph = trace(Combine(), ("x",))
    ids = {n.path: n.id for n in graph.nodes}
    for consumer in ("f", "p", "fmt", "j"):
        node = graph.nodes[ids[consumer]]
        assert set(graph.call_deps(node.id)) == {ids["a"], ids["b"]}, consumer
        assert isinstance(node.args[0], Template)
    template = graph.nodes[ids["f"]].args[0]
    assert [type(p) for p in template.parts] == [NodeRef, str, NodeRef]


def test_output_keeps_its_exact_structure_with_constants() -> None:
    out = trace(Shapes(), ("x",)).output
    assert isinstance(out, Struct) and out.kind is dict
    items = dict(out.items)
    assert items["const"] == 3.5
    assert items["tuple"].kind is tuple and items["list"].kind is list


def test_parameters_used_in_forward_are_lifted_with_stable_refs() -> None:
    graph = trace(Assistant(), ("hi",))
    (node,) = module_nodes(graph)
    template = node.args[0]
    refs = [p for p in template.parts if isinstance(p, ParamRef)]
    assert [r.param.qualified_name for r in refs] == ["instructions"]
    assert "instructions" in {p.qualified_name for p in graph.params.values()}


@pytest.mark.parametrize(
    "decide",
    [
        lambda out: bool(out),
        lambda out: out == "yes",
        lambda out: len(out),
        lambda out: "x" in out,
        lambda out: [c for c in out],
        lambda out: out < "b",
    ],
)
def test_branching_on_a_traced_value_names_the_fix(decide: Any) -> None:
    class Decider(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.judge = Echo("judge")

        def forward(self, x: str) -> Any:
            return decide(self.judge(x))

    with pytest.raises(plait.TracingError, match="async def forward") as info:
        trace(Decider(), ("x",))
    assert "judge" in str(info.value)


def test_composite_forward_receives_real_inputs_so_it_can_iterate_them() -> None:
    class PerDoc(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = Echo("d")

        def forward(self, docs: list[str]) -> list[Any]:
            return [self.llm(d) for d in docs if d]

    graph = trace(PerDoc(), (["a", "", "b"],))
    assert len(module_nodes(graph)) == 2


def test_wrong_arguments_to_a_leaf_name_its_path() -> None:
    class Bad(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = Echo("x")

        def forward(self, x: str) -> Any:
            return self.llm(x, "extra")

    with pytest.raises(TypeError, match="llm"):
        trace(Bad(), ("x",))


def test_tracing_is_an_interpreter_beside_the_handler_stack() -> None:
    """The tracer is the innermost interpreter while forward is recorded, in a slot of
    its own: the handler stack holds handlers only."""
    seen: dict[str, Any] = {}

    class Spy(plait.Module):
        def forward(self, x: str) -> str:
            return x

    class Root(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.spy = Spy()

        def forward(self, x: str) -> Any:
            from plait.effects import current_interpreter
            from plait.handlers import current_stack

            seen["stack"] = current_stack()
            seen["interpreter"] = current_interpreter()
            return self.spy(x)

    trace(Root(), ("x",))
    from plait.tracing import Tracer

    assert seen["stack"] == () and isinstance(seen["interpreter"], Tracer)


def test_synthesizer_graph_has_the_fan_in_shape() -> None:
    graph = trace(Synthesizer(), ("t",))
    assert len(module_nodes(graph)) == 4
    synthesizer = module_nodes(graph)[-1]
    assert synthesizer.path == "synthesizer" and len(graph.call_deps(synthesizer.id)) == 3


class Questions(plait.Module):
    """Asks a question of an output in a sync forward: a mistake in the code (for every
    input, or only for inputs starting with "bad": then it is about those inputs)."""

    def __init__(self, always: bool = True) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast")
        self.always = always

    def forward(self, text: str) -> Any:
        out = self.llm(text)
        if self.always or text.startswith("bad"):
            return len(out)
        return out


def test_a_tracing_error_stops_a_batch_once_before_any_call_is_paid_for(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    pipeline = Questions().bind(resources=make_resources(server))
    inputs = [f"item {i}" for i in range(20)]
    with pytest.raises(plait.TracingError, match="async def forward"):
        pipeline.run_sync(inputs)
    with pytest.raises(plait.TracingError, match="async def forward"):
        pipeline.run_sync(inputs, checkpoint_dir=tmp_path / "ckpt", max_inputs_in_flight=4)

    async def streamed() -> None:
        async for _ in pipeline.stream(inputs):
            pass

    with pytest.raises(plait.TracingError, match="async def forward"):
        asyncio.run(streamed())
    assert server.stats()["requests_total"] == 0


def test_a_tracing_error_of_a_later_input_is_that_input_s_error_row(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Questions(always=False).bind(resources=make_resources(server))
    out = pipeline.run_sync(["fine", "bad one", "also fine"])
    assert out[0] == "fine" and out[2] == "also fine"
    assert isinstance(out[1], plait.Value) and out[1].meta["error_type"] == "TracingError"
    assert server.stats()["requests_total"] == 2
    # The first input traced decides: when it is the one that fails, the run stops.
    with pytest.raises(plait.TracingError):
        pipeline.run_sync(["bad first", "fine"])
    assert server.stats()["requests_total"] == 2


def test_plait_run_reports_a_tracing_error_once_and_sends_nothing(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from .test_cli import write_resources

    resources = write_resources(tmp_path / "resources.toml", server.base_url)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(f"item {i}") + "\n" for i in range(20)))
    run = plait_cli(
        "run",
        "tests.test_tracing:Questions",
        "--resources",
        resources,
        "-i",
        data,
        "-o",
        tmp_path / "out.jsonl",
    )
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "cannot be traced" in errors[0] and "async def forward" in errors[0]
    assert server.stats()["requests_total"] == 0


@pytest.mark.usefixtures("ray_cluster")
def test_a_tracing_error_stops_a_batch_on_workers_before_any_call(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Questions().bind(resources=make_resources(server))
    with pytest.raises(plait.TracingError, match="async def forward"):
        pipeline.run_sync([f"item {i}" for i in range(8)], workers=2)
    assert server.stats()["requests_total"] == 0
