"""The hook a search runs any examples with (`TrainingBatch.run_examples`): the same
passes as the Trainer's own, with the values of the moment, the loss's words and each
stage's call, on training and validation examples alike."""

from __future__ import annotations

from typing import Any

import plait
from plait.handlers import mock
from plait.learning import ExactMatch, Trainer
from plait.learning.bootstrap import ExampleRun, TrainingBatch
from plait.providers.base import LLMRequest


class Echo(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", plait.Parameter("Answer.", description="the instruction"), demos=[]
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


class Probe:
    """An optimizer that only looks: it runs examples with two different values."""

    needs_feedback = False

    def __init__(self, model: Echo) -> None:
        self.model = model
        self.runs: list[list[ExampleRun]] = []
        self.batch: TrainingBatch | None = None

    def zero_feedback(self) -> None:
        pass

    async def observe(self, batch: TrainingBatch) -> None:
        self.batch = batch

    async def step(self) -> dict[str, Any]:
        batch = self.batch
        assert batch is not None and batch.run_examples is not None
        examples = [*batch.train_examples[:2], *batch.val_examples[:1]]
        self.runs.append(await batch.run_examples(examples, feedback=True))
        self.model.llm.system_prompt.value = "Answer in capitals."
        self.runs.append(await batch.run_examples(examples))
        self.model.llm.system_prompt.value = "Answer."
        return {}


def reply(request: LLMRequest) -> str:
    text = request.messages[-1]["content"]
    return f"{text} {text}" if "capitals" in request.messages[0]["content"] else text


def test_run_examples_runs_any_examples_with_the_values_of_the_moment(
    resources: plait.ResourceConfig,
) -> None:
    model = Echo()
    probe = Probe(model)
    train = [("a", "a a"), ("b", "b b"), ("c", "c c")]
    val = [("d", "d d")]
    trainer = Trainer(model, ExactMatch(), probe, train, val, batch_size=3, resources=resources)
    with mock({"fast": reply}, strict=True):
        trainer.fit_sync()
    plain, capitals = probe.runs
    assert [run.example for run in plain] == [*trainer.train_data[:2], trainer.val_data[0]]
    assert [run.score for run in plain] == [0.0, 0.0, 0.0]
    assert [run.score for run in capitals] == [1.0, 1.0, 1.0]
    # The loss's words and each stage's call, as a rewriter would be shown them.
    assert plain[0].text and plain[0].text != capitals[0].text
    assert plain[0].trace is not None and plain[0].trace.output == "a"
    (call,) = plain[0].trace.calls
    assert call.path == "llm" and call.input == "a" and call.text == "a"
    # Feedback only when asked for: the backward pass reached the instruction.
    assert capitals[0].feedback == {}
    assert "model.llm.system_prompt" in plain[0].feedback
    assert all(
        isinstance(text, str) and text for text in plain[0].feedback["model.llm.system_prompt"]
    )
