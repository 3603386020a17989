"""`Trainer(workers=N)` and `plait train --workers N`: minibatches and validation on Ray workers.

The model and the optimizer call the loopback fake OpenAI server, whose replies
are a pure function of the request: the model's output is ``[<system prompt>]
<input>``, and the optimizer's rewrite echoes the feedback it was shown (applied:
``check=False``), so a
target word the loss reported missing ends up in the new prompt.  With
`Contains` as the loss, validation examples whose target is the input itself
always pass and those whose target is a word (``alpha``, ``beta``...) pass only
once the prompt carries that word: scores differ between examples and rise as
training goes, the same way in one process and on the workers.

The handlers (`mock`) of the other trainer tests live in the driver only, which
is why these tests answer every call from the server instead.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.learning.backward import upstream_rank
from plait.learning.losses import Contains
from plait.learning.optimizers import SFAOptimizer
from plait.learning.trainer import Trainer, TrainerError
from plait.testing import FakeOpenAIServer

from .conftest import make_resources, plait_cli, process_alive

INITIAL = "Answer."


class Answerer(plait.Module):
    """One LLM call whose system prompt is the learnable parameter."""

    def __init__(self, instructions: str = INITIAL) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter(instructions, description="How to answer."),
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def examples(words: list[str | None]) -> list[tuple[str, str]]:
    """``item n`` with the target ``words[n]``, or the input itself where that is None."""
    return [(f"item {n}", word or f"item {n}") for n, word in enumerate(words)]


TRAIN = examples(["alpha", None, "beta", None, "gamma", None, "delta", None])
VAL = examples(["alpha", None, "beta", "zeta", None, "gamma"])


def make_trainer(server: FakeOpenAIServer, **options: Any) -> Trainer:
    model = Answerer()
    # structured=False, check=False: the server's plain-text rewrite is an echo of the
    # rewrite prompt, which the
    # optimizer would otherwise (rightly) refuse; here it is how the prompt learns words.
    optimizer = SFAOptimizer(model.parameters(), alias="smart", check=False, structured=False)
    return Trainer(
        model,
        Contains(),
        optimizer,
        TRAIN,
        VAL,
        resources=make_resources(server, ("fast", "smart")),
        batch_size=4,
        shuffle=False,
        **options,
    )


def prompt_of(trainer: Trainer) -> str:
    value: str = trainer.model.state_dict()["llm.system_prompt"]
    return value


def test_validation_on_workers_gives_the_same_scores_and_history_as_one_process(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    alone = make_trainer(server)
    expected = alone.fit_sync()
    assert expected.initial_val_score == pytest.approx(2 / 6)  # the inputs-as-targets pass
    assert expected.best_val_score is not None
    assert expected.best_val_score > expected.initial_val_score  # the prompt learned words
    assert all(record.changed for record in expected.steps)

    on_workers = make_trainer(server, workers=2)
    history = on_workers.fit_sync()

    assert history.to_json() == expected.to_json()
    assert prompt_of(on_workers) == prompt_of(alone)
    assert ray_cluster.is_initialized()  # a Ray the run did not start is left running


class NotesItsProcess(plait.Module):
    """A leaf that writes down which process ran it and passes its input on."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    async def forward(self, text: str) -> str:
        with open(self.path, "a", encoding="utf-8") as notes:
            notes.write(f"{os.getpid()}\n")
        return text


class NotedAnswerer(Answerer):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.note = NotesItsProcess(path)

    def forward(self, text: str) -> Any:
        return self.llm(self.note(text))


def test_the_passes_of_a_training_run_share_its_worker_processes(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    """Each pass (the initial validation, every minibatch and validation) used to start
    worker processes of its own, about three seconds each for passes that take a
    fraction of one; the passes of one run now share them, and the run stops them."""
    notes = tmp_path / "pids.txt"
    model = NotedAnswerer(str(notes))
    optimizer = SFAOptimizer(model.parameters(), alias="smart", check=False, structured=False)
    resources = make_resources(server, ("fast", "smart"))
    trainer = Trainer(
        model, Contains(), optimizer, TRAIN, VAL, resources=resources, batch_size=4,
        shuffle=False, workers=2,
    )  # fmt: skip
    history = trainer.fit_sync()
    assert len(history.steps) == 2  # the first validation, then two minibatches and theirs
    assert len(notes.read_text().split()) >= len(VAL) * 2 + len(TRAIN)
    pids = {int(pid) for pid in notes.read_text().split()}
    assert 1 <= len(pids) <= 2
    assert os.getpid() not in pids
    deadline = time.monotonic() + 60
    while any(process_alive(pid) for pid in pids):  # stopped with the run (Ray reaps them)
        assert time.monotonic() < deadline, f"workers {pids} outlived their training run"
        time.sleep(0.05)


class Critiqued(plait.LLMInference):
    """An LLM call whose backward asks another LLM call to word its prompt's feedback."""

    def __init__(self, instructions: str) -> None:
        super().__init__("fast", system_prompt=plait.Parameter(instructions, description="Polish."))
        self.critic = plait.LLMInference("fast", system_prompt="Critic.")

    def backward(self, feedback: Any, ctx: Any) -> Any:
        result = super().backward(feedback, ctx)
        result.parameter_feedback["system_prompt"] = self.critic(f"Reword: {feedback.payload}")
        return result


class Drafter(plait.Module):
    """Two learnable prompts one after the other: a draft, then a critiqued polish."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference(
            "fast", system_prompt=plait.Parameter(INITIAL, description="How to draft.")
        )
        self.polish = Critiqued("Polish.")

    def forward(self, text: str) -> Any:
        return self.polish(self.draft(text))


class RecordingOptimizer(SFAOptimizer):
    """`SFAOptimizer` that notes, at each step, each parameter's feedback and rank."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, alias="smart")
        self.seen: list[dict[str, Any]] = []

    async def step(self) -> dict[str, Any]:
        self.seen.append(
            {
                param.qualified_name: (param.get_accumulated_feedback(), upstream_rank(param))
                for param in self.params
                if param.requires_grad
            }
        )
        return await super().step()


def drafting_trainer(server: FakeOpenAIServer, **options: Any) -> Trainer:
    model = Drafter()
    return Trainer(
        model,
        Contains(),
        RecordingOptimizer(model.parameters()),
        TRAIN,
        VAL,
        resources=make_resources(server, ("fast", "smart")),
        batch_size=4,
        shuffle=False,
        **options,
    )


def test_minibatches_on_workers_give_the_optimizer_the_same_feedback_as_one_process(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    alone = drafting_trainer(server)
    expected = alone.fit_sync()
    seen = alone.optimizer.seen
    assert len(seen) == len(expected.steps) == 2
    for step in seen:  # every example's feedback, the polish's worded by the critic's call
        assert set(step) == {"draft.system_prompt", "polish.system_prompt"}
        draft, polish = step["draft.system_prompt"], step["polish.system_prompt"]
        assert len(draft[0]) == len(polish[0]) == 4
        assert all(text.startswith("[Critic.] Reword: ") for text in polish[0])
        assert draft[1] < polish[1]  # the draft is upstream: rewritten first
    assert seen[0]["draft.system_prompt"][0] != seen[1]["draft.system_prompt"][0]

    on_workers = drafting_trainer(server, workers=2)
    history = on_workers.fit_sync()

    assert on_workers.optimizer.seen == seen  # same texts, same order, same ranks
    assert history.to_json() == expected.to_json()  # train and validation scores, kept
    assert on_workers.model.state_dict() == alone.model.state_dict()
    assert [param.get_accumulated_feedback() for param in on_workers.model.parameters()] == [
        [] for _ in on_workers.model.parameters()
    ]


def test_a_call_that_fails_in_a_minibatch_on_a_worker_stops_the_run(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    model = Answerer()
    trainer = Trainer(
        model,
        Contains(),
        SFAOptimizer(model.parameters(), alias="smart"),
        [("item 0 [[status:400]]", "alpha"), ("item 1", "item 1")],
        resources=make_resources(server, ("fast", "smart")),
        workers=2,
    )
    with pytest.raises(TrainerError, match="a training call failed"):
        trainer.fit_sync()
    assert prompt_of(trainer) == INITIAL


async def test_each_validation_pass_ships_the_current_parameter_values(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    trainer = make_trainer(server, workers=2)
    alone = make_trainer(server)
    param = trainer.model.llm.system_prompt

    assert await trainer.evaluate() == pytest.approx(2 / 6)
    param.value = "Answer with alpha, beta and zeta."
    alone.model.llm.system_prompt.value = param.value
    assert await trainer.evaluate() == await alone.evaluate() == pytest.approx(5 / 6)
    param.value = INITIAL  # as a roll-back restores it
    assert await trainer.evaluate() == pytest.approx(2 / 6)
    assert param.value == INITIAL  # scoring on the workers changes nothing here


async def test_a_call_that_fails_on_a_worker_stops_the_run(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    trainer = make_trainer(server, workers=2)
    with pytest.raises(TrainerError, match="a training call failed"):
        await trainer.evaluate([("item 0 [[status:400]]", "item 0"), ("item 1", "item 1")])


def test_workers_must_be_a_positive_integer(server: FakeOpenAIServer) -> None:
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        make_trainer(server, workers=0)


# -- the command --------------------------------------------------------------------------------
def test_plait_train_with_workers_runs_end_to_end_like_one_process(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "pipeline.py"
    target.write_text(
        textwrap.dedent(
            f"""
            import plait

            class Answerer(plait.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.llm = plait.LLMInference(
                        "fast",
                        system_prompt=plait.Parameter({INITIAL!r}, description="How to answer."),
                    )

                def forward(self, text: str):
                    return self.llm(text)
            """
        ),
        encoding="utf-8",
    )
    config = tmp_path / "resources.yaml"  # JSON is YAML
    endpoint = {"provider": "openai", "model": "m", "base_url": server.base_url}
    endpoint["api_key"] = "sk-test"
    config.write_text(json.dumps({"optimizer": endpoint, "fast": endpoint}), encoding="utf-8")
    for name, rows in (("train", TRAIN), ("val", VAL)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"input": i, "target": t}) + "\n" for i, t in rows),
            encoding="utf-8",
        )

    def train(out: str, *extra: str) -> dict[str, Any]:
        result = plait_cli(
            "train",
            f"{target}:Answerer",
            "--data",
            tmp_path / "train.jsonl",
            "--val",
            tmp_path / "val.jsonl",
            "--loss",
            "contains",
            "--batch-size",
            "4",
            "--resources",
            config,
            "--out",
            tmp_path / out,
            *extra,
        )
        assert result.returncode == 0, result.stderr
        assert "plait train: completed after 2 step(s)" in result.stderr
        return {
            name: json.loads((tmp_path / out / name).read_text(encoding="utf-8"))
            for name in ("history.json", "parameters.json")
        }

    alone = train("alone")
    on_workers = train("workers", "--workers", "2")

    assert on_workers == alone
    # `plait train`'s rewriter asks for structured output, which the server answers with
    # a minimal instance ({"new_value": "x"}): no better on validation, so the gate
    # rolls it back and the prompt keeps its value, the same way in both runs.
    assert alone["parameters.json"] == {"llm.system_prompt": INITIAL}
