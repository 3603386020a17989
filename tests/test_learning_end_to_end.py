"""Shown end to end: a fan-in pipeline's two branch prompts learn from feedback naming them."""

from __future__ import annotations

import asyncio
from typing import Any

import plait
from plait.handlers import mock
from plait.learning import Feedback, Loss, SFAOptimizer, TrainingStep
from plait.providers.base import LLMRequest

from .conftest import make_resources


class Review(plait.Module):
    """Two learnable branch prompts (tone, facts) fanned in by a writer."""

    def __init__(self) -> None:
        super().__init__()
        self.tone = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter(
                "Describe the tone.", description="tone branch: how to read the review's tone"
            ),
        )
        self.facts = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter(
                "List the facts.", description="facts branch: which facts to extract"
            ),
        )
        self.write = plait.LLMInference("fast", system_prompt="Write the summary.")

    def forward(self, review: str) -> Any:
        return self.write(f"tone: {self.tone(review)}\nfacts: {self.facts(review)}")


class NamesBothBranches(Loss):
    """Feedback that names each branch's parameter and what it must change."""

    def forward(self, output: Any, target: Any = None) -> Feedback:
        return Feedback(
            0.2,
            "tone branch: say whether the reviewer would buy again; "
            "facts branch: always include the price",
        )


def rewrite(request: LLMRequest) -> str:
    """The optimizer's endpoint: a new prompt that applies the feedback it was given."""
    prompt = request.messages[-1]["content"]
    if "tone branch:" in prompt and "Describe the tone." in prompt:
        return "Describe the tone and say whether the reviewer would buy again."
    if "facts branch:" in prompt and "List the facts." in prompt:
        return "List the facts, always including the price."
    raise AssertionError(f"unexpected rewrite request: {prompt[:200]}")


async def test_both_branch_parameters_are_rewritten_from_feedback_naming_them(
    server: Any,
) -> None:
    resources = make_resources(server, ("fast", "optimizer"))
    model = Review()
    step = TrainingStep(model, NamesBothBranches()).bind(resources=resources)
    optimizer = SFAOptimizer(model.parameters()).bind(resources)
    step.train()
    optimizer.zero_feedback()
    losses = await asyncio.gather(*(step(f"review {i}") for i in range(3)))
    await asyncio.gather(*(loss.backward() for loss in losses))
    learnable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert set(learnable) == {"tone.system_prompt", "facts.system_prompt"}
    for param in learnable.values():
        heard = "\n".join(param.get_accumulated_feedback())
        assert "tone branch:" in heard and "facts branch:" in heard
    versions = {name: p.module_state_version for name, p in learnable.items()}
    with mock({"rewriter": rewrite}):
        updates = await optimizer.step()
    # names are the model's own state_dict keys (the TrainingStep wraps it, does not own it)
    assert updates == {
        "tone.system_prompt": "Describe the tone and say whether the reviewer would buy again.",
        "facts.system_prompt": "List the facts, always including the price.",
    }
    assert model.tone.system_prompt is not None and model.facts.system_prompt is not None
    assert model.tone.system_prompt.value == updates["tone.system_prompt"]
    assert model.facts.system_prompt.value == updates["facts.system_prompt"]
    for name, p in learnable.items():
        assert p.get_accumulated_feedback() == []
        assert p.module_state_version > versions[name]
    # the forward calls reached the real loopback server; the rewrites went to the mock
    assert server.stats()["requests_total"] == 9
    # the next forward pass runs with the learned prompts
    step.eval()
    server.reset()
    await step("review 9")
    systems = {r["system"] for r in server.stats()["requests"]}
    assert {model.tone.system_prompt.value, model.facts.system_prompt.value} <= systems


class Chain(plait.Module):
    """An upstream prompt whose output feeds a downstream one."""

    def __init__(self) -> None:
        super().__init__()
        self.first = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("Outline.", description="upstream: outline")
        )
        self.second = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("Expand.", description="downstream: expand")
        )

    def forward(self, text: str) -> Any:
        return self.second(self.first(text))


async def test_the_optimizer_rewrites_upstream_parameters_first(server: Any) -> None:
    resources = make_resources(server, ("fast", "optimizer"))
    model = Chain()
    step = TrainingStep(model, NamesBothBranches()).bind(resources=resources)
    assert model.second.system_prompt is not None and model.first.system_prompt is not None
    # given downstream first: the order comes from the graph, not from this list
    optimizer = SFAOptimizer([model.second.system_prompt, model.first.system_prompt])
    step.train()
    loss = await step("x")
    await loss.backward()
    seen: list[str] = []

    def rewrite_in_order(request: LLMRequest) -> str:
        prompt = request.messages[-1]["content"]
        seen.append("downstream" if "downstream: expand" in prompt else "upstream")
        return f"new {seen[-1]}"

    with mock({"rewriter": rewrite_in_order}):
        await optimizer.bind(resources).step()
    assert seen == ["upstream", "downstream"]
