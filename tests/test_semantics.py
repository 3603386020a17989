"""Semantics that must never be silently wrong (issue 10): placeholders, module calls,
parameter snapshots and names, bind(), composite calls on the handler stack, backward."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import plait
from plait import valueify
from plait.handlers import Handler, Message, mock
from plait.learning import FunctionLoss, TrainingStep
from plait.testing import FakeOpenAIServer
from plait.tracing import TracingError

from .conftest import make_resources
from .pipelines import Echo


def bodies(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    """Each request's system prompt and user message, in arrival order."""
    out = []
    for record in server._call("GET", "/_stats?bodies=1")["requests"]:
        messages = record["body"]["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), None)
        out.append({"system": system, "user": messages[-1]["content"], "t": record["t_start"]})
    return out


def by_system(server: FakeOpenAIServer) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for body in bodies(server):
        found.setdefault(body["system"], []).append(body["user"])
    return found


class Two(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.technical = Echo("t")
        self.business = Echo("b")

    def forward(self, text: str) -> dict[str, Any]:
        return {"technical": self.technical(text), "business": self.business(text)}


# -- 1. no placeholder ever reaches a model --------------------------------------------
class Converting(plait.Module):
    """Seed 000's DeepPipeline shape: stage3 reads stage2's dict of outputs as text."""

    def __init__(self, convert: Any) -> None:
        super().__init__()
        self.convert = convert
        self.stage2 = Two()
        self.stage3 = Echo("s3")

    def forward(self, text: str) -> Any:
        return self.stage3(self.convert(self.stage2(text)))


TEXT = 'he said "hi"\n'
REAL = {"technical": f"[t] {TEXT}", "business": f"[b] {TEXT}"}


@pytest.mark.parametrize(
    ("name", "convert"),
    [
        ("str(dict)", str),
        ("repr(dict)", repr),
        ("f-string of dict", lambda d: f"{d}"),
        ("str(list)", lambda d: str(list(d.values()))),
        ("join(map(str))", lambda d: "\n".join(map(str, d.values()))),
        ("json.dumps", json.dumps),
        ("json.dumps unicode", lambda d: json.dumps(d, ensure_ascii=False)),
        ("json.dumps in a sentence", lambda d: "data: " + json.dumps([d["business"], 1])),
        ("%r", lambda d: "%r and %s" % (d["technical"], d["business"])),  # noqa: UP031
        ("pprint", lambda d: __import__("pprint").pformat(d, width=200)),
    ],
)
def test_text_made_from_outputs_through_a_container_is_exactly_pythons(
    server: FakeOpenAIServer, name: str, convert: Any
) -> None:
    out = Converting(convert).bind(resources=make_resources(server)).run_sync(TEXT)
    assert out == f"[s3] {convert(REAL)}", name
    seen = bodies(server)
    assert [b["system"] for b in seen][-1] == "s3"  # stage3 waited for both of stage2's calls
    assert seen[-1]["user"] == convert(REAL)


@pytest.mark.parametrize(
    ("name", "convert", "says"),
    [
        ("repr of a composed string", lambda d: str([f"<{d['technical']}>"]), "repr()"),
        ("str method on composed text", lambda d: f"{d['technical']}!".upper(), "cannot follow"),
        ("slice of composed text", lambda d: f"x{d['technical']}"[:3], "cannot follow"),
    ],
)
def test_text_plait_cannot_reproduce_is_a_tracing_error(
    server: FakeOpenAIServer, name: str, convert: Any, says: str
) -> None:
    with pytest.raises(plait.ExecutionError) as info:
        Converting(convert).bind(resources=make_resources(server)).run_sync("x")
    assert isinstance(info.value.__cause__, TracingError), name
    assert says in str(info.value)
    assert [b["system"] for b in bodies(server)].count("s3") == 0


def test_a_parameter_value_in_a_container_formats_as_python_would(
    server: FakeOpenAIServer,
) -> None:
    class Listing(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rule = plait.Parameter("don't lie", description="a rule")
            self.llm = Echo("e")

        def forward(self, x: str) -> Any:
            return self.llm(str({"rule": self.rule.value, "x": x}))

    out = Listing().bind(resources=make_resources(server)).run_sync("q")
    assert out == "[e] " + str({"rule": "don't lie", "x": "q"})


# -- 2. any module call is traced -------------------------------------------------------
class PlainListLeaf(plait.Module):
    """No registered submodules: a leaf whose sync forward calls modules in a list."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = [Echo("one"), Echo("two")]
        self.table = {"last": Echo("three")}

    def forward(self, text: str) -> Any:
        out = text
        for step in self.steps:
            out = step(out)
        return self.table["last"](out)


class MixedComposite(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Echo("reg")
        self.extra = [Echo("plain")]

    def forward(self, text: str) -> Any:
        return self.extra[0](self.first(text))


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (PlainListLeaf, "[three] [two] [one] x"),
        (MixedComposite, "[plain] [reg] x"),
    ],
)
def test_modules_in_plain_lists_and_dicts_are_called_for_real(
    server: FakeOpenAIServer, module: Any, expected: str
) -> None:
    pipeline = module().bind(resources=make_resources(server))
    assert pipeline.run_sync("x") == expected
    assert pipeline.run_sync(["x", "x"]) == [expected, expected]
    assert server.stats()["requests_total"] == expected.count("[") * 3


# -- 3. parameters are immutable during a forward pass -----------------------------------
class TwoSteps(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.style = plait.Parameter("OLD", description="style")
        self.draft = Echo("draft")
        self.polish = Echo("polish")

    def forward(self, text: str) -> Any:
        first = self.draft(f"{self.style} {text}")
        return self.polish(f"{self.style.value} {first}")


def test_an_update_during_a_batch_never_mixes_values_within_one_input(
    server: FakeOpenAIServer,
) -> None:
    pipeline = TwoSteps().bind(resources=make_resources(server))

    class UpdateOnFirstCall(Handler):
        def process(self, msg: Message) -> None:
            if msg.type == "llm" and msg.input_index == 0 and msg.name == "draft":
                pipeline.style.value = "NEW"

    with UpdateOnFirstCall():
        outs = pipeline.run_sync(["a", "b", "c"])
    # each input runs wholly on the values it started with, never half and half; the
    # first started before the update (inputs admitted later may see either value)
    assert outs[0] == "[polish] OLD [draft] OLD a"
    for out, x in zip(outs, "abc", strict=True):
        assert out in (f"[polish] {v} [draft] {v} {x}" for v in ("OLD", "NEW")), out
    assert pipeline.style.value == "NEW"
    assert pipeline.run_sync("d") == "[polish] NEW [draft] NEW d"  # later inputs see it


# -- 4. stable hierarchical refs -----------------------------------------------------------
def test_parameter_refs_are_the_owning_roots_names_whichever_module_runs(
    server: FakeOpenAIServer,
) -> None:
    class Inner(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = plait.Parameter("w", description="d")
            self.llm = Echo("e")

        def forward(self, x: str) -> Any:
            return self.llm(f"{self.w} {x}")

    class Root(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()
            self.a = plait.ParameterList([plait.Parameter("a0", description="d")])
            self.b = plait.ParameterList([plait.Parameter("b0", description="d")])

        def forward(self, x: str) -> Any:
            return self.inner(f"{self.a[0]} {self.b[0]} {x}")

    root = Root().bind(resources=make_resources(server))
    assert valueify(root.inner.w).ref == "param:inner.w"
    root.run_sync("x")
    assert valueify(root.inner.w).ref == "param:inner.w"
    root.inner.run_sync("x")
    assert valueify(root.inner.w).ref == "param:inner.w"
    assert {valueify(root.a[0]).ref, valueify(root.b[0]).ref} == {"param:a.0", "param:b.0"}
    assert (
        set(root.state_dict())
        == {p.qualified_name for p in root.parameters()}
        == {"inner.w", "inner.llm.system_prompt", "a.0", "b.0"}
    )


async def test_optimizer_keys_are_state_dict_keys(server: FakeOpenAIServer) -> None:
    model = TwoSteps()
    step = TrainingStep(model, FunctionLoss(lambda out, target: (0.0, "shorter please")))
    step.train()
    resources = make_resources(server, ("fast", "optimizer"))
    async with plait.ExecutionSettings(resources=resources):
        loss = await step("x")
    await loss.backward()
    optimizer = plait.learning.SFAOptimizer([model.style]).bind(resources)
    with mock({"*": "BETTER"}):
        updates = await optimizer.step()
    assert set(updates) == {"style"} and set(updates) <= set(model.state_dict())


# -- 5. bind() propagates to child modules --------------------------------------------------
def test_bind_on_a_root_reaches_its_children(server: FakeOpenAIServer) -> None:
    class Root(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = Two()

        def forward(self, x: str) -> Any:
            return self.child(x)

    root = Root().bind(resources=make_resources(server))
    assert root.child.run_sync("x") == {"technical": "[t] x", "business": "[b] x"}
    assert root.child.technical.run_sync("y") == "[t] y"
    assert server.stats()["requests_total"] == 3


def test_a_childs_own_bind_wins_over_its_roots() -> None:
    with FakeOpenAIServer() as mine, FakeOpenAIServer() as theirs:
        root = plait.Sequential(Echo("e")).bind(resources=make_resources(theirs))
        root[0].bind(resources=make_resources(mine))
        assert root[0].run_sync("x") == "[e] x"
        assert (mine.stats()["requests_total"], theirs.stats()["requests_total"]) == (1, 0)


# -- 7. every module call is a message on the handler stack ----------------------------------
class Outer(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.two = Two()
        self.final = Echo("final")

    def forward(self, x: str) -> Any:
        views = self.two(x)
        return self.final(f"{views['technical']} + {views['business']}")


def test_handlers_see_composite_calls_with_real_arguments_and_outputs(
    server: FakeOpenAIServer,
) -> None:
    seen: list[tuple[str, Any, Any]] = []

    class Watch(Handler):
        def postprocess(self, msg: Message) -> None:
            if msg.type == "module":
                seen.append((msg.name, msg.args, msg.value))

    with Watch():
        out = Outer().bind(resources=make_resources(server)).run_sync("x")
    assert out == "[final] [t] x + [b] x"
    assert ("two", ("x",), {"technical": "[t] x", "business": "[b] x"}) in seen
    assert seen[-1] == ("Outer", ("x",), out)


def test_a_handler_can_answer_rewrite_or_recover_a_composite_call(
    server: FakeOpenAIServer,
) -> None:
    class Answer(Handler):
        def process(self, msg: Message) -> None:
            if msg.type == "module" and msg.name == "two":
                msg.value = {"technical": "T", "business": msg.args[0].upper()}
                msg.done = True

    pipeline = Outer().bind(resources=make_resources(server))
    with Answer():
        assert pipeline.run_sync("x") == "[final] T + X"
    assert [b["system"] for b in bodies(server)] == ["final"]  # the inside never ran

    class Rewrite(Handler):
        def postprocess(self, msg: Message) -> None:
            if msg.type == "module" and msg.name == "two":
                msg.value = {k: v + "!" for k, v in msg.value.items()}

    with Rewrite():
        assert pipeline.run_sync("y") == "[final] [t] y! + [b] y!"

    class Recover(Handler):
        def postprocess(self, msg: Message) -> None:
            if msg.type == "module" and msg.name == "two" and msg.error is not None:
                msg.error = None
                msg.value = {"technical": "fallback", "business": "fallback"}

    with Recover(), mock({"two.business": lambda request: 1 / 0}):
        assert pipeline.run_sync("z") == "[final] fallback + fallback"
    with mock({"two.business": lambda request: 1 / 0}), pytest.raises(plait.ExecutionError):
        pipeline.run_sync("z")  # nobody recovers: the failure reaches the caller


# -- 8. parameter .value inside a traced forward ----------------------------------------------
def test_param_value_in_forward_stays_in_the_graph_and_questions_raise(
    server: FakeOpenAIServer,
) -> None:
    class UsesValue(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.instr = plait.Parameter("  Be brief  ", description="instructions")
            self.llm = Echo("e")

        def forward(self, x: str) -> Any:
            return self.llm(self.instr.value.strip().upper() + " " + x)

    model = UsesValue().bind(resources=make_resources(server))
    assert model.run_sync("x") == "[e] BE BRIEF x"
    step = TrainingStep(model, FunctionLoss(lambda out, target: (0.0, "too terse")))
    step.bind(resources=make_resources(server)).train()
    loss = step.run_sync("x")
    asyncio.run(loss.backward())
    assert any("too terse" in f for f in model.instr.get_accumulated_feedback())

    class Asks(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.instr = plait.Parameter("p", description="d")
            self.llm = Echo("e")

        def forward(self, x: str) -> Any:
            if len(self.instr.value) > 3:
                return self.llm(x)
            return self.llm(x + "!")

    with pytest.raises(plait.ExecutionError, match=r"param:instr.*len"):
        Asks().bind(resources=make_resources(server)).run_sync("x")


# -- 6. backward as the seed writes it ---------------------------------------------------------
class Assistant(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.instructions = plait.Parameter("Be kind.", description="core behaviour")
        self.llm = plait.LLMInference(
            alias="fast", system_prompt=plait.Parameter("inner", description="inner prompt")
        )
        self.critic = Echo("critic")
        self.calls = 0

    def forward(self, request: str) -> Any:
        return self.llm(f"{self.instructions}\n\nUser: {request}")

    def backward(self, feedback: Any, ctx: Any) -> Any:
        self.calls += 1
        result = plait.BackwardResult()
        result.input_feedback["request"] = feedback.payload
        improvement = self.critic(f"improve {self.instructions.value} given {feedback.payload}")
        result.parameter_feedback["instructions"] = improvement
        return result


def test_a_composites_own_backward_runs_and_its_llm_calls_go_to_the_server(
    server: FakeOpenAIServer,
) -> None:
    model = Assistant()
    step = TrainingStep(model, FunctionLoss(lambda out, target: (0.0, "be warmer")))
    step.bind(resources=make_resources(server)).train()
    loss = step.run_sync("hello")
    before = server.stats()["requests_total"]
    asyncio.run(loss.backward())
    assert model.calls == 1
    assert server.stats()["requests_total"] == before + 1
    assert model.instructions.get_accumulated_feedback() == [
        "[critic] improve Be kind. given be warmer"
    ]
    # its own backward speaks for its inside: the inner prompt hears nothing
    assert model.llm.system_prompt is not None
    assert model.llm.system_prompt.get_accumulated_feedback() == []


# -- 11. Parameter as the seed's dataclass ------------------------------------------------------
def test_parameters_compare_like_the_seeds_dataclass_and_hash_by_identity() -> None:
    a = plait.Parameter("Be brief.", description="tone")
    b = plait.Parameter("Be brief.", description="tone")
    assert a == b and a is not b
    assert a != plait.Parameter("Be brief.", description="other")
    assert a != plait.Parameter("Be brief.", requires_grad=False)
    b.accumulate_feedback("shorter")
    assert a != b  # the feedback buffer is a field too
    assert len({a, b}) == 2 and {a: 1}[a] == 1  # as torch: usable as keys, by identity
    assert repr(a) == "Parameter(value='Be brief.', description='tone', requires_grad=True)"
    # plait's own bookkeeping never merges two equal parameters
    optimizer = plait.learning.SFAOptimizer([a, plait.Parameter("Be brief.", description="tone")])
    assert len(optimizer.params) == 2
