"""Losses run as real modules: plain ones on real outputs, judges against the loopback server."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import pytest

import plait
from plait.handlers.mocking import mock
from plait.learning.feedback import Feedback
from plait.learning.losses import (
    CompositeLoss,
    Contains,
    ExactMatch,
    FunctionLoss,
    LLMJudge,
    Loss,
    RubricJudge,
    VerifierLoss,
    aggregate,
    as_feedback,
    exact_text,
)
from plait.module import BackwardContext
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer
from plait.values import ExecutionError, Value, ValueKind

from .pipelines import Echo, echo


def run(
    loss: plait.Module, resources: plait.ResourceConfig, output: Any, target: Any = None
) -> Any:
    return loss.bind(resources=resources).run_sync(output, target)


class Graded(plait.Module):
    """A pipeline step followed by its loss: the loss sees the step's real reply."""

    def __init__(self, loss: Loss) -> None:
        super().__init__()
        self.llm = Echo("ans")
        self.loss = loss

    def forward(self, question: str, target: Any = None) -> Any:
        return self.loss(self.llm(question), target)


# -- ExactMatch and Contains -----------------------------------------------------------
def test_exact_match_passes_after_normalizing(resources: plait.ResourceConfig) -> None:
    fb = run(ExactMatch(), resources, "  Paris \n", "paris")
    assert fb == Feedback(1.0, "the output matches the expected answer")


def test_exact_match_failure_quotes_expected_and_actual(resources: plait.ResourceConfig) -> None:
    fb = run(ExactMatch(), resources, "Lyon", "Paris")
    assert fb.score == 0.0
    assert '"Paris"' in fb.text and '"Lyon"' in fb.text
    assert fb.details == {"expected": "Paris", "actual": "Lyon"}


def test_exact_match_without_normalizing_is_strict(resources: plait.ResourceConfig) -> None:
    assert run(ExactMatch(normalize=False), resources, "Paris", "Paris").score == 1.0
    fb = run(ExactMatch(normalize=False), resources, "paris", "Paris")
    assert fb.score == 0.0 and "ignoring case" not in fb.text


def test_exact_match_clips_long_outputs_in_its_text() -> None:
    fb = ExactMatch()("word " * 500, "short")
    assert fb.score == 0.0
    assert len(fb.text) < 400 and "..." in fb.text
    assert fb.details["actual"] == "word " * 500  # the whole output stays available


def test_exact_match_needs_a_target(resources: plait.ResourceConfig) -> None:
    with pytest.raises(ValueError, match="target is None"):
        ExactMatch()("Paris")
    with pytest.raises(ExecutionError, match="target is None"):
        run(ExactMatch(), resources, "Paris")


class Tone(Enum):
    """A plain Enum: its JSON text is quoted, its value is the label."""

    WARM = "Warm"
    COUNT = 3


class Mood(StrEnum):
    GLAD = "Glad"


def test_exact_match_reads_an_enum_as_its_value() -> None:
    """Was: a plain Enum compared as its JSON text, '"Warm"' with the quotes, so the
    right label scored 0; a str Enum compared as its value."""
    assert ExactMatch()(Tone.WARM, "warm").score == 1.0
    assert ExactMatch()(Mood.GLAD, " glad ").score == 1.0
    assert ExactMatch()(Tone.COUNT, 3).score == 1.0
    fb = ExactMatch()(Tone.WARM, "cold")
    assert fb.score == 0.0 and fb.details == {"expected": "cold", "actual": "Warm"}
    assert ExactMatch(normalize=False)(Tone.WARM, "warm").score == 0.0
    assert [exact_text(x) for x in (Tone.WARM, Mood.GLAD, "  A \n b ", 3)] == [
        "warm",
        "glad",
        "a b",
        "3",
    ]
    assert exact_text("  A  b ", normalize=False) == "  A  b "


def test_contains_single_and_several(resources: plait.ResourceConfig) -> None:
    assert run(Contains(), resources, "The capital is PARIS.", "paris").score == 1.0
    fb = run(Contains(), resources, "It was 1889 in Paris", ["Paris", "Eiffel", "1889", "tower"])
    assert fb.score == 0.5
    assert '"Eiffel"' in fb.text and '"tower"' in fb.text and '"1889"' not in fb.text
    assert "It was 1889 in Paris" in fb.text
    assert fb.details == {"missing": ["Eiffel", "tower"]}


def test_contains_case_sensitive() -> None:
    assert Contains(case_sensitive=True)("PARIS", "Paris").score == 0.0
    assert Contains(case_sensitive=True)("in Paris", "Paris").score == 1.0


def test_contains_rejects_empty_or_missing_targets() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Contains()("x", [])
    with pytest.raises(ValueError, match="target is None"):
        Contains()("x")


def test_a_loss_sees_the_real_output_of_the_step_before_it(
    resources: plait.ResourceConfig,
) -> None:
    graded = Graded(ExactMatch()).bind(resources=resources)
    assert graded.run_sync("Paris", echo("ans", "paris")).score == 1.0
    fb = graded.run_sync("Paris", "Lyon")
    assert fb.score == 0.0 and echo("ans", "Paris") in fb.text


def test_train_mode_returns_a_value_holding_the_feedback(
    resources: plait.ResourceConfig,
) -> None:
    value = ExactMatch().train().bind(resources=resources).run_sync("a", "b")
    assert isinstance(value, Value)
    assert isinstance(value.payload, Feedback) and value.payload.score == 0.0
    assert as_feedback(value) is value.payload


# -- FunctionLoss and VerifierLoss -----------------------------------------------------
def is_short(output: str, target: Any) -> bool:
    return len(output) <= 5


def test_function_loss_normalizes_each_return_form(resources: plait.ResourceConfig) -> None:
    assert run(FunctionLoss(is_short), resources, "abc") == Feedback(
        1.0, "the output passed the check is_short"
    )
    assert run(FunctionLoss(is_short), resources, "abcdefg") == Feedback(
        0.0, "the output failed the check is_short"
    )
    fb = run(FunctionLoss(lambda o, t: 0.25, name="quarter"), resources, "x")
    assert fb.score == 0.25 and "quarter" in fb.text and "0.25" in fb.text
    fb = run(FunctionLoss(lambda o, t: (0.5, f"wanted {t}")), resources, "x", "y")
    assert fb == Feedback(0.5, "wanted y")
    given = Feedback(0.75, "close", {"k": 1})
    assert run(FunctionLoss(lambda o, t: given), resources, "x") == given


def test_function_loss_calls_a_one_argument_function_with_the_output_only() -> None:
    seen: list[Any] = []

    def check(output: str) -> bool:
        seen.append(output)
        return True

    assert FunctionLoss(check)("out", "target").score == 1.0
    assert seen == ["out"]


def test_function_loss_errors_name_the_function() -> None:
    def wordy(output: str, target: Any) -> str:
        return "not a score"

    with pytest.raises(TypeError, match=r"wordy returned str .*Feedback, a float"):
        FunctionLoss(wordy)("x")
    with pytest.raises(ValueError, match=r"too_big returned score 2"):
        FunctionLoss(lambda o, t: 2, name="too_big")("x")
    with pytest.raises(ValueError, match="outside"):
        FunctionLoss(lambda o, t: float("nan"))("x")
    with pytest.raises(TypeError, match="needs a callable"):
        FunctionLoss("nope")  # type: ignore[arg-type]

    async def slow(output: str, target: Any) -> bool:
        return True

    with pytest.raises(TypeError, match="slow is async"):
        FunctionLoss(slow)


def test_verifier_loss_uses_reasons_and_failure_text(resources: plait.ResourceConfig) -> None:
    import json

    def parses(output: str, target: Any) -> bool | tuple[bool, str]:
        try:
            json.loads(output)
        except json.JSONDecodeError as exc:
            return False, f"the reply is not valid JSON: {exc.msg}"
        return True

    loss = VerifierLoss(parses)
    assert run(loss, resources, '{"a": 1}').score == 1.0
    fb = run(loss, resources, "{oops")
    assert fb.score == 0.0 and fb.text.startswith("the reply is not valid JSON")

    bare = VerifierLoss(lambda o, t: o == t, failure_text="the label is wrong")
    assert run(bare, resources, "a", "b") == Feedback(0.0, "the label is wrong")
    with pytest.raises(TypeError, match="must return a bool"):
        VerifierLoss(lambda o, t: 0.5, name="scorer")("x")


# -- LLMJudge ----------------------------------------------------------------------------
def test_llm_judge_against_the_server_default_reply(
    resources: plait.ResourceConfig, server: FakeOpenAIServer
) -> None:
    # The fake server answers a schema with its minimal instance: the lowest score.
    fb = run(LLMJudge("fast", "is accurate"), resources, "Paris")
    assert fb.score == 0.0 and fb.text
    assert fb.details["raw_score"] == 1.0 and fb.details["scale"] == (1.0, 10.0)
    assert server.stats()["requests"][-1]["status"] == 200


def test_llm_judge_normalizes_the_score_and_returns_the_feedback(
    resources: plait.ResourceConfig,
) -> None:
    sent: list[LLMRequest] = []

    def verdict(request: LLMRequest) -> dict[str, Any]:
        sent.append(request)
        return {"feedback": "names the wrong river", "score": 4}

    judge = LLMJudge("smart", ["is accurate", "cites a source"])
    with mock({"*judge": verdict}):
        fb = run(judge, resources, "The Seine flows through Lyon.", "Paris is on the Seine.")
    assert fb.score == pytest.approx(3 / 9)
    assert fb.text == "names the wrong river"
    [request] = sent
    assert request.alias == "smart" and request.temperature == 0.0
    prompt = request.prompt_text
    for part in ("- is accurate", "- cites a source", "The Seine flows", "Paris is on the Seine"):
        assert part in prompt


def test_llm_judge_on_a_unit_scale_without_reference(resources: plait.ResourceConfig) -> None:
    judge = LLMJudge("fast", "is polite", scale=(0, 1))
    with mock({"*judge": {"feedback": "curt", "score": 0.3}}):
        fb = run(judge, resources, "no.")
    assert fb == Feedback(
        0.3, "curt", {"raw_score": 0.3, "scale": (0.0, 1.0), "criteria": ["is polite"]}
    )


def test_llm_judge_rejects_an_out_of_scale_reply(resources: plait.ResourceConfig) -> None:
    with (
        mock({"*judge": {"feedback": "great", "score": 11}}),
        pytest.raises(ExecutionError, match="less than or equal to 10"),
    ):
        run(LLMJudge("fast", "is good"), resources, "x")


def test_llm_judge_inside_a_pipeline_grades_the_real_reply(
    resources: plait.ResourceConfig,
) -> None:
    prompts: list[str] = []

    def verdict(request: LLMRequest) -> dict[str, Any]:
        prompts.append(request.prompt_text)
        return {"feedback": "fine", "score": 10}

    graded = Graded(LLMJudge("fast", "answers the question")).bind(resources=resources)
    with mock({"loss.judge": verdict}):
        assert graded.run_sync("What is 2+2?").score == 1.0
    assert echo("ans", "What is 2+2?") in prompts[0]


def test_llm_judge_argument_errors() -> None:
    with pytest.raises(ValueError, match="criteria"):
        LLMJudge("fast", [])
    with pytest.raises(ValueError, match="criteria"):
        LLMJudge("fast", "  ")
    with pytest.raises(ValueError, match="low < high"):
        LLMJudge("fast", "ok", scale=(10, 1))
    with pytest.raises(ValueError, match="alias"):
        LLMJudge("", "ok")


# -- RubricJudge -------------------------------------------------------------------------
RUBRIC = {
    "accuracy": "Facts are correct.",
    "completeness": "Covers every part of the question.",
    "clear language": "Short sentences, no jargon.",
}


def test_rubric_judge_scores_each_criterion_and_names_the_weakest(
    resources: plait.ResourceConfig,
) -> None:
    reply = {
        "accuracy": {"feedback": "the year is wrong", "score": 2},
        "completeness": {"feedback": "", "score": 5},
        "clear language": {"feedback": "too much jargon", "score": 3},
    }
    with mock({"*judge": reply}):
        fb = run(RubricJudge("fast", RUBRIC), resources, "It happened in 1999.")
    assert fb.score == pytest.approx((0.25 + 1.0 + 0.5) / 3)
    assert fb.text == (
        "weakest criteria: accuracy (2/5): the year is wrong; clear language (3/5): too much jargon"
    )
    assert fb.details["criteria"]["accuracy"] == {
        "score": 2.0,
        "normalized": 0.25,
        "feedback": "the year is wrong",
    }
    assert fb.details["scale"] == (1.0, 5.0)


def test_rubric_judge_prompt_and_schema_list_every_criterion(
    resources: plait.ResourceConfig,
) -> None:
    sent: list[LLMRequest] = []

    def full_marks(request: LLMRequest) -> dict[str, Any]:
        sent.append(request)
        return {name: {"feedback": "good", "score": 10} for name in RUBRIC}

    judge = RubricJudge("fast", list(RUBRIC.items()), scale=(0, 10))
    with mock({"*judge": full_marks}):
        fb = run(judge, resources, "An answer.", "The reference.")
    assert fb == Feedback(1.0, "every rubric criterion is fully met", fb.details)
    from plait.structured import schema_for

    schema = schema_for(sent[0].response_format)
    assert set(schema["properties"]) == set(RUBRIC)
    for name, text in RUBRIC.items():
        assert f"- {name}: {text}" in sent[0].prompt_text
    assert "The reference." in sent[0].prompt_text


def test_rubric_judge_against_the_server_default_reply(resources: plait.ResourceConfig) -> None:
    fb = run(RubricJudge("fast", RUBRIC), resources, "x")
    assert fb.score == 0.0
    assert fb.text.startswith("weakest criteria: accuracy (1/5)")
    assert set(fb.details["criteria"]) == set(RUBRIC)


def test_rubric_judge_argument_errors() -> None:
    with pytest.raises(ValueError, match="non-empty dict"):
        RubricJudge("fast", {})
    with pytest.raises(ValueError, match="non-empty dict"):
        RubricJudge("fast", [("accuracy", "")])
    with pytest.raises(ValueError, match="distinct"):
        RubricJudge("fast", [("a", "x"), ("a ", "y")])


# -- CompositeLoss -------------------------------------------------------------------------
def fixed(score: float, text: str) -> FunctionLoss:
    return FunctionLoss(lambda o, t: (score, text))


def test_composite_weights_scores_and_labels_texts(resources: plait.ResourceConfig) -> None:
    loss = CompositeLoss({fixed(0.2, "too long"): 1, fixed(0.8, "mostly right"): 3})
    fb = run(loss, resources, "x")
    assert fb.score == pytest.approx((0.2 * 1 + 0.8 * 3) / 4)
    assert fb.text == (
        "[function_loss] (score 0.20, weight 1) too long\n"
        "[function_loss_2] (score 0.80, weight 3) mostly right"
    )
    assert fb.details["components"]["function_loss_2"]["weight"] == 3.0


def test_composite_mixes_sync_and_judge_children(resources: plait.ResourceConfig) -> None:
    loss = CompositeLoss(
        [(ExactMatch(), 1.0), (Contains(), 1.0), (LLMJudge("fast", "is terse"), 2.0)]
    )
    with mock({"*llm_judge.judge": {"feedback": "add the unit", "score": 7}}):
        fb = run(loss, resources, "42", "42 km")
    assert fb.score == pytest.approx((0.0 + 0.0 + 2 * (6 / 9)) / 4)
    assert [line.split("]")[0] for line in fb.text.splitlines()] == [
        "[exact_match",
        "[contains",
        "[llm_judge",
    ]
    assert fb.text.endswith("add the unit")


def test_composite_in_train_mode_returns_a_value(resources: plait.ResourceConfig) -> None:
    loss = CompositeLoss({ExactMatch(): 1}).train()
    value = loss.bind(resources=resources).run_sync("a", "a")
    assert isinstance(value, Value) and value.payload.score == 1.0


def test_composite_argument_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CompositeLoss({})
    with pytest.raises(TypeError, match="must be Loss modules"):
        CompositeLoss({Echo("x"): 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="positive number, got 0"):
        CompositeLoss({ExactMatch(): 0})
    with pytest.raises(ValueError, match="positive number"):
        CompositeLoss([(ExactMatch(), True)])
    with pytest.raises(TypeError, match=r"\{loss: weight\}"):
        CompositeLoss([ExactMatch()])  # type: ignore[list-item]


# -- aggregate -------------------------------------------------------------------------------
def test_aggregate_means_and_lists_the_worst() -> None:
    batch = [
        Feedback(1.0, "ok"),
        Feedback(0.5, "half"),
        Feedback(0.0, "wrong date"),
        Feedback(0.25, "no unit"),
        Feedback(0.75, "minor"),
    ]
    fb = aggregate(batch, k=3)
    assert fb.score == pytest.approx(0.5)
    assert fb.text == (
        "mean score 0.50 over 5 outputs; the 3 lowest:\n"
        "- (score 0.00) wrong date\n"
        "- (score 0.25) no unit\n"
        "- (score 0.50) half"
    )
    assert fb.details == {"scores": [1.0, 0.5, 0.0, 0.25, 0.75], "count": 5, "worst": [2, 3, 1]}


def test_aggregate_accepts_train_mode_values(resources: plait.ResourceConfig) -> None:
    loss = ExactMatch().train().bind(resources=resources)
    values = [loss.run_sync(out, "a") for out in ("a", "A ", "b")]
    fb = aggregate(values)
    assert fb.score == pytest.approx(2 / 3)
    assert fb.text.startswith("mean score 0.67 over 3 outputs; the 1 lowest:\n- (score 0.00) ")


def test_aggregate_all_perfect_and_errors() -> None:
    assert aggregate([Feedback(1.0, "ok")]).text == (
        "mean score 1.00 over 1 output; every output fully met the criteria"
    )
    with pytest.raises(ValueError, match="empty"):
        aggregate([])
    with pytest.raises(ValueError, match="failed call"):
        aggregate([Value(ValueKind.ERROR, RuntimeError("boom"))])
    with pytest.raises(TypeError, match="got str"):
        aggregate([Value(ValueKind.TEXT, "just text")])
    with pytest.raises(TypeError, match="sequence"):
        aggregate(Feedback(1.0, "ok"))  # type: ignore[arg-type]


# -- backward ----------------------------------------------------------------------------------
def test_backward_sends_the_text_to_the_output_only() -> None:
    ctx = BackwardContext(inputs={"output": "Lyon", "target": "Paris"})
    from_feedback = Value(ValueKind.STRUCTURED, Feedback(0.0, "wrong city"))
    assert ExactMatch().backward(from_feedback, ctx).input_feedback == {"output": "wrong city"}
    from_text = Value(ValueKind.TEXT, "wrong city")
    result = LLMJudge("fast", "x").backward(from_text, ctx)
    assert result.input_feedback == {"output": "wrong city"}
    assert result.parameter_feedback == {}


def test_backward_follows_a_renamed_first_input() -> None:
    class Judge(Loss):
        def forward(self, answer: str, expected: str | None = None) -> Feedback:
            return Feedback(1.0, "ok")

    ctx = BackwardContext(inputs={"answer": "a", "expected": "b"})
    result = Judge().backward(Value(ValueKind.TEXT, "fix it"), ctx)
    assert result.input_feedback == {"answer": "fix it"}
