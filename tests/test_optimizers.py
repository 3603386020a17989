"""Optimizers against the loopback server: what is rewritten, from what prompt, in what order.

The optimizer's LLM calls are answered by `plait.handlers.mock` (by the call's module
path ``"rewriter"``) so each reply is chosen by the test and every prompt can be read;
one test lets the call reach the fake server to show it is routed on alias "optimizer".
Feedback is put in place with ``accumulate_feedback``, which is what backward() calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

import plait
from plait.handlers.mocking import mock
from plait.learning.optimizers import (
    OptimizerStepError,
    Rewrite,
    SFAOptimizer,
    TextGradOptimizer,
    aggregate_feedback,
    check_rewrite,
    meta_markers,
    rewrite_budget,
    rewrite_max_tokens,
)
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer

from .conftest import make_resources

FACTS = "facts.system_prompt"


class Review(plait.Module):
    """Three learnable parameters and one fixed one, in a two-step pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.style = plait.Parameter("Be concrete.", description="Tone of the verdict.")
        self.layout = plait.Parameter("Answer in prose.", description="Layout of the verdict.")
        self.rubric = plait.Parameter("Score 1-5.", requires_grad=False)
        self.facts = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter(
                "List the facts.", description="How the first step extracts facts from a doc."
            ),
        )
        self.judge = plait.LLMInference("fast", system_prompt=self.style)

    def forward(self, doc: str) -> Any:
        facts = self.facts(doc)
        return self.judge(f"{self.layout}\n{self.rubric}\n{facts}")


@pytest.fixture()
def opt_resources(server: FakeOpenAIServer) -> plait.ResourceConfig:
    return make_resources(server, ("fast", "optimizer"))


async def ran(resources: plait.ResourceConfig) -> tuple[Review, dict[str, plait.Parameter]]:
    """A Review that has run once, so its parameters carry their dotted names."""
    review = Review().bind(resources=resources)
    await review("a doc")
    return review, dict(review.named_parameters())


def param_name(prompt: str) -> str:
    found = re.search(r"Rewrite the parameter `([^`]+)`", prompt)
    assert found is not None, prompt
    return found.group(1)


class Rewrites:
    """A mock reply that records each rewrite prompt and answers ``<name> v<n>``."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, request: LLMRequest) -> str:
        self.prompts.append(request.prompt_text)
        name = param_name(request.prompt_text)
        count = sum(param_name(p) == name for p in self.prompts)
        return f"{name} v{count}"

    def for_param(self, name: str) -> list[str]:
        return [p for p in self.prompts if param_name(p) == name]


async def test_sfa_rewrites_only_trainable_parameters_with_feedback(
    server: FakeOpenAIServer, opt_resources: plait.ResourceConfig
) -> None:
    review, params = await ran(opt_resources)
    optimizer = SFAOptimizer(review.parameters()).bind(opt_resources)
    params[FACTS].accumulate_feedback("The facts omit the date.")
    params[FACTS].accumulate_feedback("The facts  omit the date.")
    params[FACTS].accumulate_feedback("Too many adjectives.")
    params["layout"].accumulate_feedback("Use bullet points.")
    params["layout"].requires_grad = False  # frozen after it got feedback: never rewritten
    facts_version = review.facts.module_state_version
    root_version = review.module_state_version
    served = server.stats()["requests_total"]

    rewrites = Rewrites()
    with mock({"rewriter": rewrites}):
        new = await optimizer.step()

    assert new == {FACTS: f"{FACTS} v1"}
    assert params[FACTS].value == f"{FACTS} v1"
    assert params[FACTS].get_accumulated_feedback() == []
    assert params["style"].value == "Be concrete."  # no feedback: untouched
    assert params["layout"].value == "Answer in prose."  # frozen: untouched
    assert params["rubric"].value == "Score 1-5."
    assert review.facts.module_state_version == facts_version + 1
    assert review.module_state_version == root_version
    meta = plait.valueify(params[FACTS]).meta
    assert meta["module_state_version"] == facts_version + 1
    assert server.stats()["requests_total"] == served  # the mock answered

    (prompt,) = rewrites.prompts
    assert "How the first step extracts facts from a doc." in prompt  # the description
    assert "List the facts." in prompt  # the current value
    assert "- The facts omit the date. (reported 2 times)" in prompt
    assert "- Too many adjectives." in prompt
    assert "Reply with ONLY the new value (as text), in the field new_value." in prompt
    assert "Updates already made" not in prompt

    # Nothing left to learn from: a second step changes nothing.
    with mock({"rewriter": rewrites}):
        assert await optimizer.step() == {}
    assert review.facts.module_state_version == facts_version + 1


async def test_the_rewrite_goes_through_the_optimizer_alias(
    server: FakeOpenAIServer, opt_resources: plait.ResourceConfig
) -> None:
    review, params = await ran(opt_resources)
    params["style"].accumulate_feedback(
        'Be warmer. [[reply:{"new_value": "Be concrete and kind."}]]'
    )
    new = await SFAOptimizer([params["style"]]).bind(opt_resources).step()
    assert new == {"style": "Be concrete and kind."}
    assert review.style.value == "Be concrete and kind."
    systems = [r["system"] for r in server.stats()["requests"]]
    assert sum(s.startswith("You improve one parameter") for s in systems) == 1


async def test_later_rewrites_see_earlier_updates_in_the_given_order(
    opt_resources: plait.ResourceConfig,
) -> None:
    review, params = await ran(opt_resources)
    for name in (FACTS, "style"):
        params[name].accumulate_feedback("The verdict misses the date.")
    optimizer = SFAOptimizer(review.parameters(), order=[FACTS, "style"]).bind(opt_resources)
    rewrites = Rewrites()
    with mock({"rewriter": rewrites}):
        await optimizer.step()
    assert [param_name(p) for p in rewrites.prompts] == [FACTS, "style"]
    first, second = rewrites.prompts
    assert "Updates already made" not in first
    assert "Updates already made in this step" in second
    assert f"`{FACTS}` (How the first step extracts facts from a doc.)" in second
    assert f"{FACTS} v1" in second


async def test_independent_parameters_are_rewritten_concurrently(
    opt_resources: plait.ResourceConfig,
) -> None:
    review, params = await ran(opt_resources)
    for name in (FACTS, "style", "layout"):
        params[name].accumulate_feedback("Shorter, please.")
    both_started = asyncio.Event()
    started: list[str] = []

    async def barrier(request: LLMRequest) -> str:
        # Each rewrite waits until all three have started: sequential rewrites would
        # never get past the first one (the timeout only turns a hang into a failure).
        started.append(param_name(request.prompt_text))
        if len(started) == 3:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), timeout=30)
        assert "Updates already made" not in request.prompt_text
        return "short"

    optimizer = SFAOptimizer(review.parameters(), concurrent=True).bind(opt_resources)
    with mock({"rewriter": barrier}):
        new = await optimizer.step()
    assert new == {name: "short" for name in ("style", "layout", FACTS)}
    assert sorted(started) == sorted(new)


async def test_a_failed_rewrite_keeps_the_value_and_its_feedback(
    opt_resources: plait.ResourceConfig,
) -> None:
    review, params = await ran(opt_resources)
    params[FACTS].accumulate_feedback("Name the sources.")
    params["style"].accumulate_feedback("Be warmer.")

    def reply(request: LLMRequest) -> str:
        if param_name(request.prompt_text) == "style":
            raise ConnectionError("the endpoint went away")
        return "```\nList facts.\n```"

    optimizer = SFAOptimizer(review.parameters(), concurrent=True).bind(opt_resources)
    with mock({"rewriter": reply}), pytest.raises(OptimizerStepError, match="went away") as info:
        await optimizer.step()
    assert info.value.applied == {FACTS: "List facts."}  # code fence stripped
    assert set(info.value.failures) == {"style"}
    assert params["style"].value == "Be concrete."
    assert params["style"].get_accumulated_feedback() == ["Be warmer."]


async def test_long_feedback_is_condensed_before_the_rewrite(
    opt_resources: plait.ResourceConfig,
) -> None:
    _review, params = await ran(opt_resources)
    for i in range(20):
        params["style"].accumulate_feedback(f"Complaint number {i} about the tone.")
    summaries: list[str] = []

    def summarize(request: LLMRequest) -> str:
        summaries.append(request.prompt_text)
        return "- The tone is off."

    rewrites = Rewrites()
    optimizer = SFAOptimizer([params["style"]], max_feedback_chars=200).bind(opt_resources)
    with mock({"summarizer": summarize, "rewriter": rewrites}):
        await optimizer.step()
    (summary_prompt,) = summaries
    assert "Tone of the verdict." in summary_prompt
    assert "Complaint number 19" in summary_prompt
    (prompt,) = rewrites.prompts
    assert "- The tone is off." in prompt
    assert "Complaint number" not in prompt


async def test_structured_parameters_are_rewritten_as_json(
    opt_resources: plait.ResourceConfig,
) -> None:
    param = plait.Parameter({"max_words": 50}, description="Limits on the summary.")
    param.accumulate_feedback("Summaries are cut off.")
    rewrites: list[str] = []

    def reply(request: LLMRequest) -> str:
        rewrites.append(request.prompt_text)
        return '{"max_words": 80}'

    with mock({"rewriter": reply}):
        await SFAOptimizer([param]).bind(opt_resources).step()
    assert param.value == {"max_words": 80}
    assert '"max_words": 50' in rewrites[0]
    assert "as JSON of the same shape" in rewrites[0]


async def test_sfa_state_dict_round_trips(opt_resources: plait.ResourceConfig) -> None:
    review, params = await ran(opt_resources)
    optimizer = SFAOptimizer(review.parameters()).bind(opt_resources)
    params["style"].accumulate_feedback("Be warmer.")
    with mock({"rewriter": Rewrites()}):
        await optimizer.step()
    state = json.loads(json.dumps(optimizer.state_dict()))
    assert state == {"type": "SFAOptimizer", "steps": 1, "alias": "optimizer"}
    fresh = SFAOptimizer(review.parameters())
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    with pytest.raises(ValueError, match="SFAOptimizer cannot be loaded into TextGradOptimizer"):
        TextGradOptimizer(review.parameters()).load_state_dict(state)


async def test_textgrad_momentum_carries_past_feedback_into_later_prompts(
    opt_resources: plait.ResourceConfig,
) -> None:
    review, params = await ran(opt_resources)
    style = params["style"]
    optimizer = TextGradOptimizer(review.parameters(), momentum=2).bind(opt_resources)
    rewrites = Rewrites()
    with mock({"rewriter": rewrites}):
        style.accumulate_feedback("Too vague.")
        await optimizer.step()
        style.accumulate_feedback("Too long.")
        await optimizer.step()
        style.accumulate_feedback("Too formal.")
        await optimizer.step()

    first, second, third = rewrites.for_param("style")
    assert "Past feedback that still applies" not in first
    assert "Past feedback that still applies" in second
    assert "Be concrete." in second and "- Too vague." in second
    assert "- Too long." in second  # this step's own feedback
    # momentum=2 keeps the last two rewrites: both steps' feedback, both old values
    assert "- Too vague." in third and "- Too long." in third
    assert "Be concrete." in third and "style v1" in third
    assert style.value == "style v3"
    assert [e["value"] for e in optimizer.history(style)] == ["style v1", "style v2"]

    state = json.loads(json.dumps(optimizer.state_dict()))
    assert state["momentum"] == 2 and state["steps"] == 3
    assert state["history"] == {
        "style": [
            {"value": "style v1", "feedback": "- Too long."},
            {"value": "style v2", "feedback": "- Too formal."},
        ]
    }
    fresh = TextGradOptimizer(review.parameters(), momentum=2).bind(opt_resources)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    style.accumulate_feedback("Too cold.")
    restored = Rewrites()
    with mock({"rewriter": restored}):
        await fresh.step()
    (prompt,) = restored.prompts
    assert "- Too formal." in prompt and "style v2" in prompt

    state["history"]["nowhere"] = []
    with pytest.raises(KeyError, match="nowhere"):
        fresh.load_state_dict(state)


async def test_order_must_name_held_parameters(opt_resources: plait.ResourceConfig) -> None:
    review, params = await ran(opt_resources)
    params["style"].accumulate_feedback("Be warmer.")
    optimizer = SFAOptimizer(review.parameters(), order=["stlye"]).bind(opt_resources)
    with pytest.raises(KeyError, match="'stlye'"):
        await optimizer.step()
    assert params["style"].get_accumulated_feedback() == ["Be warmer."]


def test_optimizer_arguments_are_checked() -> None:
    review = Review()
    held = SFAOptimizer([*review.parameters(), review.style])  # shared/duplicate: held once
    assert len(held.params) == len(list(review.parameters()))
    with pytest.raises(TypeError, match=r"module\.parameters\(\)"):
        SFAOptimizer(review)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no parameters"):
        SFAOptimizer([])
    with pytest.raises(ValueError, match="twice"):
        SFAOptimizer(review.parameters(), order=["style", ["style"]])
    with pytest.raises(ValueError, match="momentum"):
        TextGradOptimizer(review.parameters(), momentum=-1)


def test_aggregate_feedback_dedupes_and_counts() -> None:
    items = ["a  b", "c", "a b", "", "  ", "a b"]
    assert aggregate_feedback(items) == ["a b (reported 3 times)", "c"]


def test_zero_feedback_clears_every_held_parameter() -> None:
    review = Review()
    for param in review.parameters():
        param.accumulate_feedback("x")
    SFAOptimizer(review.parameters()).zero_feedback()
    assert all(p.get_accumulated_feedback() == [] for p in review.parameters())


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("   ", "empty"),
        ("## What the parameter is for\nBe concrete.", "echoes the rewrite prompt"),
        ("The new value is: Be concrete and kind.", "echoes the rewrite prompt"),
        ("<<<\nBe kind.\n>>> extra", "echoes the rewrite prompt"),
        ("Be kind. " * 60, "over the budget of 412"),
    ],
)
async def test_a_bad_rewrite_is_rejected_and_the_value_stays(
    opt_resources: plait.ResourceConfig, reply: str, reason: str
) -> None:
    _review, params = await ran(opt_resources)
    style = params["style"]
    style.accumulate_feedback("Be warmer.")
    version = style.value
    optimizer = SFAOptimizer([style]).bind(opt_resources)
    with mock({"rewriter": lambda request: reply}):
        assert await optimizer.step() == {}
    assert style.value == version == "Be concrete."
    assert style.get_accumulated_feedback() == ["Be warmer."]  # retried next step
    (rejection,) = optimizer.rejected
    assert rejection.step == 0 and rejection.name == "style"
    assert reason in rejection.reason


def test_check_rewrite_and_markers_come_from_the_prompt() -> None:
    param = plait.Parameter("# Role\nYou answer.", description="The role.")
    prompt = SFAOptimizer([param]).rewrite_prompt(param, "p", "- Too short.")
    markers = meta_markers(prompt)
    assert "## Current value" in markers and "## What the parameter is for" in markers
    assert "# Role" not in markers  # inside the fence: the value's own heading
    assert check_rewrite("# Role\nYou answer.", "# Role\nYou answer well.", markers) is None
    assert check_rewrite("x", "## Current value\nx", markers) is not None
    assert check_rewrite({"n": 1}, {"n": 2}, markers) is None
    assert rewrite_budget("a" * 10) == 410 and rewrite_budget("a" * 1000) == 4000


async def test_rewriter_max_tokens_scales_with_the_parameter(
    opt_resources: plait.ResourceConfig,
) -> None:
    short = plait.Parameter("Be brief.", description="Short.")
    long = plait.Parameter("Explain. " * 300, description="Long.")
    seen: list[int | None] = []
    expected = [rewrite_max_tokens(short.value), rewrite_max_tokens(long.value)]

    def reply(request: LLMRequest) -> str:
        seen.append(request.max_tokens)
        return "Be brief, and kind."

    for param in (short, long):
        param.accumulate_feedback("Kinder.")
        with mock({"rewriter": reply}):
            await SFAOptimizer([param]).bind(opt_resources).step()
    assert seen == expected
    assert seen[0] < seen[1] <= 4096
    assert rewrite_max_tokens("x" * 100_000) == 4096

    long.accumulate_feedback("Kinder.")
    optimizer = SFAOptimizer([long]).bind(opt_resources)
    optimizer.rewriter.max_tokens = 50  # set by the user: kept
    with mock({"rewriter": reply}):
        await optimizer.step()
    assert seen[-1] == 50


async def test_the_rewriter_answers_through_structured_output(
    opt_resources: plait.ResourceConfig,
) -> None:
    _review, params = await ran(opt_resources)
    style = params["style"]
    style.accumulate_feedback("Be warmer.")
    formats: list[Any] = []

    def reply(request: LLMRequest) -> dict[str, str]:
        formats.append(request.response_format)
        return {"new_value": "Be concrete and kind."}

    optimizer = SFAOptimizer([style]).bind(opt_resources)
    assert optimizer.rewriter.response_format is Rewrite
    with mock({"rewriter": reply}):
        assert await optimizer.step() == {"style": "Be concrete and kind."}
    assert formats == [Rewrite] and optimizer.rejected == []

    # A plain-text rewriter (structured=False) is asked for text, and its text is the value.
    style.accumulate_feedback("Warmer still.")
    plain = SFAOptimizer([style], structured=False).bind(opt_resources)
    assert plain.rewriter.response_format is None
    with mock({"rewriter": "Be concrete and warm."}):
        assert await plain.step() == {"style": "Be concrete and warm."}
