"""backward(): feedback from a loss reaches every node and Parameter that shaped the output."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

import plait
from plait.learning import Feedback, TrainingStep
from plait.module import BackwardContext, BackwardResult
from plait.testing import FakeOpenAIServer


class Judge(plait.Module):
    """A loss: scores on real values and sends its text to the output it judged."""

    def forward(self, output: Any, target: Any = None) -> Feedback:
        ok = str(target) in str(output)
        return Feedback(1.0 if ok else 0.0, f"the answer must mention {target!r}")

    def backward(self, feedback: plait.Value, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(input_feedback={"output": feedback.payload})


def learnable(text: str, what: str) -> plait.Parameter:
    return plait.Parameter(text, description=f"system prompt of the {what} branch")


class TwoBranches(plait.Module):
    """Two learnable prompts on separate branches, fanned in by a third call."""

    def __init__(self) -> None:
        super().__init__()
        self.left = plait.LLMInference("fast", system_prompt=learnable("Be terse.", "left"))
        self.right = plait.LLMInference("fast", system_prompt=learnable("Be formal.", "right"))
        self.merge = plait.LLMInference("fast", system_prompt="Merge.")

    def forward(self, text: str) -> Any:
        return self.merge(f"{self.left(text)} || {self.right(text)}")


def feedback_of(param: plait.Parameter) -> str:
    return "\n".join(param.get_accumulated_feedback())


async def test_feedback_reaches_both_branches_through_a_fan_in(
    resources: plait.ResourceConfig,
) -> None:
    model = TwoBranches()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    loss = await step("a document", target="the deadline")
    assert isinstance(loss, plait.Value) and isinstance(loss.payload, Feedback)
    assert loss.payload.score == 0.0
    await loss.backward()
    for param in (model.left.system_prompt, model.right.system_prompt):
        assert param is not None
        assert "the answer must mention 'the deadline'" in feedback_of(param)


class Instructed(plait.Module):
    """A parameter spliced into the prompt (lifted into the graph), not a system prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.how = plait.Parameter("List the facts.", description="instruction for extraction")
        self.frozen = plait.Parameter("Use English.", requires_grad=False)
        self.llm = plait.LLMInference("fast")

    def forward(self, text: str) -> Any:
        return self.llm(f"{self.how} {self.frozen}\n{text}")


async def test_lifted_parameters_learn_and_frozen_ones_do_not(
    resources: plait.ResourceConfig,
) -> None:
    model = Instructed()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    loss = await step("text", target="names")
    await loss.backward()
    assert "mention 'names'" in feedback_of(model.how)
    assert model.frozen.get_accumulated_feedback() == []


class Rewriter(plait.Module):
    """A module with its own backward: it rewords feedback before passing it on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def forward(self, text: str) -> str:
        return text.upper()

    def backward(self, feedback: plait.Value, ctx: BackwardContext) -> BackwardResult:
        self.seen.append(str(feedback.payload))
        return BackwardResult(input_feedback={"text": f"upstream of shouting: {feedback.payload}"})


class Structured(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference("fast", system_prompt=learnable("Draft it.", "draft"))
        self.shout = Rewriter()

    def forward(self, text: str) -> Any:
        parts = {"body": self.draft(text), "tag": "x"}
        return self.shout(parts["body"])


async def test_a_modules_own_backward_is_honoured_through_structured_values(
    resources: plait.ResourceConfig,
) -> None:
    model = Structured()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    loss = await step("t", target="z")
    await loss.backward()
    assert model.shout.seen == ["the answer must mention 'z'"]
    assert model.draft.system_prompt is not None
    assert "upstream of shouting: the answer must mention 'z'" in feedback_of(
        model.draft.system_prompt
    )


class Rendezvous(plait.Module):
    """Each branch's backward waits for the other to start: only concurrency finishes."""

    def __init__(self, arrived: list[str], both: asyncio.Event, name: str) -> None:
        super().__init__()
        self.arrived, self.both, self.name = arrived, both, name

    def forward(self, text: str) -> str:
        return f"{self.name}:{text}"

    async def backward(self, feedback: plait.Value, ctx: BackwardContext) -> BackwardResult:
        self.arrived.append(self.name)
        if len(self.arrived) == 2:
            self.both.set()
        await self.both.wait()
        return BackwardResult(input_feedback={"text": feedback.payload})


class Meet(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        arrived: list[str] = []
        both = asyncio.Event()
        self.a = Rendezvous(arrived, both, "a")
        self.b = Rendezvous(arrived, both, "b")

    def forward(self, text: str) -> Any:
        return f"{self.a(text)} {self.b(text)}"


async def test_independent_nodes_run_their_backward_concurrently(
    resources: plait.ResourceConfig,
) -> None:
    step = TrainingStep(Meet(), Judge()).bind(resources=resources)
    step.train()
    loss = await step("t", target="q")
    await asyncio.wait_for(loss.backward(), timeout=30)  # sequential would never meet


async def test_a_batch_of_losses_backpropagates_concurrently(
    resources: plait.ResourceConfig,
) -> None:
    model = TwoBranches()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    losses = await asyncio.gather(*(step(f"doc {i}", target=f"t{i}") for i in range(4)))
    await asyncio.gather(*(loss.backward() for loss in losses))
    assert model.left.system_prompt is not None
    text = feedback_of(model.left.system_prompt)
    assert all(f"'t{i}'" in text for i in range(4))


def test_backward_needs_a_training_mode_output(resources: plait.ResourceConfig) -> None:
    step = TrainingStep(TwoBranches(), Judge()).bind(resources=resources)
    feedback = step.run_sync("doc", "x")  # eval mode: the raw Feedback, no record
    assert isinstance(feedback, Feedback)
    with pytest.raises(RuntimeError, match=r"after \.train\(\)"):
        asyncio.run(plait.Value(plait.ValueKind.TEXT, "x").backward())


def test_training_step_wants_modules() -> None:
    with pytest.raises(TypeError, match="FunctionLoss"):
        TrainingStep(TwoBranches(), lambda out, target: 0.0)  # type: ignore[arg-type]


class Who(TypedDict):
    name: str


class Person(plait.Module):
    """A structured call read by field: the field access is an op node on the traced value."""

    def __init__(self) -> None:
        super().__init__()
        self.extract = plait.LLMInference(
            "fast", system_prompt=learnable("Extract the person.", "extract"), response_format=Who
        )
        self.shout = Rewriter()

    def forward(self, text: str) -> Any:
        return self.shout(f"{self.extract(text)['name']}")


async def test_feedback_passes_through_getitem_on_a_structured_output(
    resources: plait.ResourceConfig,
) -> None:
    model = Person()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    loss = await step("Ada, 36", target="Ada")
    await loss.backward()
    assert model.extract.system_prompt is not None
    assert "upstream of shouting" in feedback_of(model.extract.system_prompt)


class Diamond(plait.Module):
    """One draft read by two critics, whose notes are merged: the draft hears both."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference("fast", system_prompt=learnable("Draft it.", "draft"))
        self.style = Rewriter()
        self.facts = Critic()
        self.merge = plait.LLMInference("fast", system_prompt="Merge.")

    def forward(self, text: str) -> Any:
        draft = self.draft(text)
        return self.merge(f"{self.style(draft)} / {self.facts(draft)}")


class Critic(plait.Module):
    def forward(self, text: str) -> str:
        return text[::-1]

    def backward(self, feedback: plait.Value, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(input_feedback={"text": f"check the facts: {feedback.payload}"})


async def test_a_node_read_by_two_others_hears_both(resources: plait.ResourceConfig) -> None:
    model = Diamond()
    step = TrainingStep(model, Judge()).bind(resources=resources)
    step.train()
    loss = await step("t", target="w")
    await loss.backward()
    assert model.draft.system_prompt is not None
    heard = feedback_of(model.draft.system_prompt)
    assert "upstream of shouting: the answer must mention 'w'" in heard
    assert "check the facts: the answer must mention 'w'" in heard


async def test_a_step_binding_one_option_keeps_the_models_resources(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    """Issue 20 point 13: a `TrainingStep` bound with a seed only still runs on the
    resources its model was bound to (name by name, as a child's bind does)."""
    model = TwoBranches().bind(resources=resources)
    step = TrainingStep(model, Judge()).bind(seed=7)
    step.train()
    loss = await step("a document", target="the deadline")
    assert isinstance(loss, plait.Value) and isinstance(loss.payload, Feedback), loss
    assert loss.payload.score == 0.0
    assert server.stats()["requests_total"] == 3  # left, right, merge: on the model's
