"""An optimizer's own verdict on its update (`Judgement`): a validation score it has
already measured is used, not paid for again; a decision made on more evidence than
the validation set holds is followed and recorded."""

from __future__ import annotations

from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning import ExactMatch, Judgement, Trainer
from plait.providers.base import LLMRequest


class Echo(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", plait.Parameter("Answer.", description="the instruction")
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


class Rewrite:
    """Sets the instruction to ``value`` and gives ``judgement`` as its verdict."""

    needs_feedback = False

    def __init__(self, model: Echo, value: str, judgement: Judgement | None) -> None:
        self.model, self.value, self.verdict = model, value, judgement
        self.judgement: Judgement | None = None

    def zero_feedback(self) -> None:
        pass

    async def step(self) -> dict[str, Any]:
        self.model.llm.system_prompt.value = self.value
        self.judgement = self.verdict
        return {"model.llm.system_prompt": self.value}


#: Validation examples the test's model answers right with each instruction.
TRAIN = [("a", "a!"), ("b", "b!")]
VAL = [("c", "c!"), ("d", "d"), ("e", "e")]


def reply(request: LLMRequest) -> str:
    text = request.messages[-1]["content"]
    return f"{text}!" if "Shout" in request.messages[0]["content"] else text


def fit(value: str, judgement: Judgement | None, resources: plait.ResourceConfig) -> Any:
    model = Echo()
    optimizer = Rewrite(model, value, judgement)
    trainer = Trainer(
        model, ExactMatch(), optimizer, TRAIN, VAL, batch_size=2, max_steps=1, resources=resources
    )
    asked: list[str] = []

    def counted(request: LLMRequest) -> str:
        asked.append(request.messages[-1]["content"])
        return reply(request)

    with mock({"fast": counted}, strict=True):
        history = trainer.fit_sync()
    return model, history, asked


def test_a_validation_score_the_optimizer_measured_is_not_paid_for_again(
    resources: plait.ResourceConfig,
) -> None:
    # Without a verdict the gate scores the update on validation: 2 + 3 + 3 calls.
    _, history, asked = fit("Answer briefly.", None, resources)
    assert len(asked) == 8 and history.steps[0].trials[0]["val_score"] == pytest.approx(2 / 3)
    # With one, the gate takes its score: the minibatch and the first validation only.
    model, history, asked = fit("Answer briefly.", Judgement(val_score=0.9), resources)
    assert len(asked) == 5
    (trial,) = history.steps[0].trials
    assert trial["val_score"] == 0.9 and trial["kept"] is True and trial["decided_by"] == ""
    assert model.llm.system_prompt.value == "Answer briefly."


def test_a_decision_on_more_evidence_is_followed_and_recorded(
    resources: plait.ResourceConfig,
) -> None:
    # "Shout" scores 1/3 on validation, below the start's 2/3: the gate rolls it back...
    model, history, _ = fit("Shout.", None, resources)
    assert history.steps[0].trials[0]["kept"] is False
    assert model.llm.system_prompt.value == "Answer."
    # ...unless the optimizer decided on evidence the validation set does not hold.
    verdict = Judgement(keep=True, evidence="5-fold cross-validation over 5 examples")
    model, history, _ = fit("Shout.", verdict, resources)
    (trial,) = history.steps[0].trials
    assert trial["kept"] is True and trial["val_score"] == pytest.approx(1 / 3)
    assert trial["decided_by"] == "5-fold cross-validation over 5 examples"
    assert model.llm.system_prompt.value == "Shout."
    assert history.best_val_score == pytest.approx(1 / 3)
    # And a refusal is followed even where validation rose.
    model, history, _ = fit("Answer briefly.", Judgement(keep=False, evidence="x"), resources)
    assert history.steps[0].trials[0]["kept"] is False
    assert model.llm.system_prompt.value == "Answer."


def test_a_judgement_of_the_wrong_type_is_refused(resources: plait.ResourceConfig) -> None:
    with pytest.raises(TypeError, match=r"judgement must be a plait.learning.Judgement"):
        fit("Answer briefly.", {"keep": True}, resources)  # type: ignore[arg-type]
