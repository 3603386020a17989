"""`Trainer` and `plait train`: keep-or-roll-back, early stopping, resume, history and plot.

Every LLM call is answered by plait's own `mock` handler, so each step's outcome
is decided by the test, not by a model:

* the classifier's reply depends on the system prompt it is sent: a prompt
  containing ``GOOD`` labels every text correctly, one containing ``BAD`` labels
  every text wrongly, and the initial prompt answers "positive" to everything
  (right for half of a balanced set);
* the optimizer's rewriter answers with the proposal the test planned for the
  step being taken (``PLAN[trainer.global_step]``).

The runs go through the loopback fake server's resources (never reached: the
mock answers first), so no embedded model is loaded.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.cli import main as cli_main
from plait.handlers import mock
from plait.learning.losses import ExactMatch
from plait.learning.optimizers import SFAOptimizer
from plait.learning.trainer import (
    CHECKPOINT_FILE,
    HISTORY_FILE,
    Trainer,
    TrainerError,
    TrainingEvent,
    TrainingHistory,
    load_examples,
)
from plait.providers.base import LLMRequest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
INITIAL = "Label the sentiment."


class Classifier(plait.Module):
    """One LLM call whose system prompt is the learnable parameter."""

    def __init__(self, instructions: str = INITIAL) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter(
                instructions, description="How to label a review: positive or negative."
            ),
            max_tokens=4,
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def classify(request: LLMRequest) -> str:
    """The mock classifier: its accuracy is set by a word in the system prompt."""
    system = next(m["content"] for m in request.messages if m["role"] == "system")
    truth = "positive" if "good" in request.prompt_text else "negative"
    if "GOOD" in system:
        return truth
    if "BAD" in system:
        return "negative" if truth == "positive" else "positive"
    return "positive"


def dataset(size: int) -> list[tuple[str, str]]:
    """A balanced set: "a good thing n" is positive, "a poor thing n" negative."""
    return [
        (
            f"a {'good' if n % 2 == 0 else 'poor'} thing {n}",
            "positive" if n % 2 == 0 else "negative",
        )
        for n in range(size)
    ]


class Calls:
    """Counts classifier calls (the mock callable wraps `classify`)."""

    def __init__(self) -> None:
        self.classifier = 0

    def __call__(self, request: LLMRequest) -> str:
        self.classifier += 1
        return classify(request)


def make_trainer(
    plan: list[str],
    resources: plait.ResourceConfig,
    *,
    train: int = 8,
    val: int = 4,
    **options: Any,
) -> Trainer:
    model = Classifier()
    optimizer = SFAOptimizer(model.parameters(), alias="smart")
    trainer = Trainer(
        model, ExactMatch(), optimizer, dataset(train), dataset(val), resources=resources, **options
    )
    trainer.plan = plan  # type: ignore[attr-defined]
    return trainer


def train(trainer: Trainer, calls: Calls | None = None) -> TrainingHistory:
    """Run `fit` with the classifier and the rewriter answered by mocks."""
    plan: list[str] = trainer.plan  # type: ignore[attr-defined]
    replies = {
        "rewriter": lambda request: plan[trainer.global_step],
        "fast": calls if calls is not None else classify,
    }
    with mock(replies, strict=True):
        return trainer.fit_sync()


def prompt_of(trainer: Trainer) -> str:
    value: str = trainer.model.state_dict()["llm.system_prompt"]
    return value


# -- keep or roll back --------------------------------------------------------------------------
def test_an_update_that_worsens_validation_is_rolled_back_and_one_that_helps_is_kept(
    resources: plait.ResourceConfig,
) -> None:
    trainer = make_trainer(["Answer BAD.", "Answer GOOD."], resources, batch_size=4)
    history = train(trainer)

    assert history.initial_val_score == 0.5
    first, second = history.steps
    assert (first.val_score, first.kept, first.improved) == (0.0, False, False)
    assert (second.val_score, second.kept, second.improved) == (1.0, True, True)
    assert first.changed == second.changed == ["llm.system_prompt"]
    # Each batch scored under the prompt in force: the initial one both times (the
    # first update was rolled back before the second batch ran).
    assert first.train_score == second.train_score == 0.5
    assert first.train_loss == 0.5
    assert prompt_of(trainer) == "Answer GOOD."
    assert history.best_val_score == history.final_val_score == 1.0
    assert history.stopped == "completed"


def test_an_update_that_only_ties_validation_is_rolled_back(
    resources: plait.ResourceConfig,
) -> None:
    # "Say so." leaves the classifier as it was: validation neither drops nor improves,
    # so the update earns nothing and the values already proven stay.
    trainer = make_trainer(["Say so."], resources, train=4, batch_size=4)
    history = train(trainer)
    (record,) = history.steps
    assert (record.val_score, record.kept, record.improved) == (0.5, False, False)
    assert prompt_of(trainer) == INITIAL
    assert history.final_val_score == history.initial_val_score == 0.5


def test_a_refused_rewrite_is_shown_in_the_history(resources: plait.ResourceConfig) -> None:
    # A small model echoing the rewrite prompt: refused, so nothing changes.
    trainer = make_trainer(["## Current value\nAnswer GOOD."], resources, train=4, batch_size=4)
    history = train(trainer)
    (record,) = history.steps
    assert record.changed == [] and prompt_of(trainer) == INITIAL
    assert list(record.rejected) == ["llm.system_prompt"]
    assert "echoes the rewrite prompt" in record.rejected["llm.system_prompt"]
    assert type(history).from_json(history.to_json()).steps[0].rejected == record.rejected


def test_min_delta_rolls_back_an_improvement_smaller_than_it(
    resources: plait.ResourceConfig,
) -> None:
    # GOOD takes validation from 0.5 to 1.0: kept under min_delta=0.5, not under 0.6.
    kept = make_trainer(["GOOD"], resources, train=4, batch_size=4, min_delta=0.5)
    assert [r.kept for r in train(kept).steps] == [True]
    assert prompt_of(kept) == "GOOD"
    refused = make_trainer(["GOOD"], resources, train=4, batch_size=4, min_delta=0.6)
    assert [r.kept for r in train(refused).steps] == [False]
    assert prompt_of(refused) == INITIAL
    with pytest.raises(ValueError, match="min_delta must be a number >= 0"):
        make_trainer([], resources, min_delta=-0.1)


def test_a_test_set_is_scored_before_the_first_update_and_after_the_last(
    resources: plait.ResourceConfig,
) -> None:
    trainer = make_trainer(["BAD", "GOOD"], resources, train=4, batch_size=2, test_data=dataset(6))
    history = train(trainer)
    assert [r.kept for r in history.steps] == [False, True]
    assert (history.initial_test_score, history.final_test_score) == (0.5, 1.0)
    saved = TrainingHistory.from_json(json.loads(json.dumps(history.to_json())))
    assert (saved.initial_test_score, saved.final_test_score) == (0.5, 1.0)


def test_patience_stops_training_after_steps_without_improvement(
    resources: plait.ResourceConfig,
) -> None:
    events: list[TrainingEvent] = []
    trainer = make_trainer(
        ["BAD 1", "BAD 2", "BAD 3", "BAD 4"],
        resources,
        train=8,
        batch_size=2,
        patience=2,
        on_event=events.append,
    )
    history = train(trainer)

    assert history.stopped == "early_stopping"
    assert len(history.steps) == 2
    assert [r.kept for r in history.steps] == [False, False]
    assert prompt_of(trainer) == INITIAL
    assert [e.kind for e in events] == ["validated", "step", "step", "stopped"]
    assert events[-1].total_steps == 4


def test_without_validation_every_update_is_kept(resources: plait.ResourceConfig) -> None:
    model = Classifier()
    trainer = Trainer(
        model,
        ExactMatch(),
        SFAOptimizer(model.parameters(), alias="smart"),
        dataset(4),
        resources=resources,
    )
    trainer.plan = ["Answer BAD."]  # type: ignore[attr-defined]
    history = train(trainer)
    assert history.initial_val_score is None
    (record,) = history.steps
    assert (record.val_score, record.kept) == (None, True)
    assert prompt_of(trainer) == "Answer BAD."


# -- checkpoints and resume ---------------------------------------------------------------------
def test_a_stopped_run_resumes_from_its_checkpoint(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    plan = ["Answer BAD.", "Answer GOOD.", "Answer BAD again."]
    directory = tmp_path / "ckpt"

    # The "killed" run: it stops after one step, as a process killed then would.
    first = make_trainer(plan, resources, batch_size=2, train=6, checkpoint_dir=directory)
    first.max_steps = 1
    assert train(first).stopped == "max_steps"
    saved = json.loads((directory / CHECKPOINT_FILE).read_text())
    assert (saved["epoch"], saved["batch"], saved["global_step"], saved["seed"]) == (0, 1, 1, 0)
    assert saved["optimizer"]["steps"] == 1

    # A new process: fresh model and optimizer, the same directory.
    calls = Calls()
    resumed = make_trainer(plan, resources, batch_size=2, train=6, checkpoint_dir=directory)
    assert resumed.resumed and resumed.global_step == 1
    assert resumed.optimizer.steps == 1
    history = train(resumed, calls)

    # Only the two remaining steps ran: two batches of two, two validations of four,
    # and no repeat of the initial validation.
    assert calls.classifier == 2 * 2 + 2 * 4
    assert [r.step for r in history.steps] == [1, 2, 3]
    assert [r.kept for r in history.steps] == [False, True, False]
    assert prompt_of(resumed) == "Answer GOOD."

    # The same run uninterrupted gives the same history.
    whole = make_trainer(plan, resources, batch_size=2, train=6)
    assert train(whole).to_json() == history.to_json()


def test_a_finished_early_stopped_run_is_not_rerun(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    options: dict[str, Any] = {"batch_size": 2, "patience": 1, "checkpoint_dir": tmp_path}
    assert train(make_trainer(["BAD"] * 4, resources, **options)).stopped == "early_stopping"
    calls = Calls()
    again = make_trainer(["BAD"] * 4, resources, **options)
    assert train(again, calls).stopped == "early_stopping"
    assert calls.classifier == 0


def test_a_checkpoint_from_another_run_is_refused(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    trainer = make_trainer(["GOOD"], resources, batch_size=4, checkpoint_dir=tmp_path)
    trainer.max_steps = 1
    train(trainer)
    with pytest.raises(TrainerError, match="batch_size: checkpoint 4, now 2"):
        make_trainer(["GOOD"], resources, batch_size=2, checkpoint_dir=tmp_path)


def test_checkpoint_writes_are_atomic_and_leave_no_temporary_files(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    train(make_trainer(["GOOD", "BAD"], resources, batch_size=4, checkpoint_dir=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [HISTORY_FILE, CHECKPOINT_FILE]


# -- history and plot ---------------------------------------------------------------------------
def test_history_is_saved_as_json_and_plotted_to_png(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    trainer = make_trainer(["BAD", "GOOD"], resources, batch_size=4, checkpoint_dir=tmp_path)
    history = train(trainer)

    saved = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert saved == history.to_json()
    assert [s["kept"] for s in saved["steps"]] == [False, True]
    assert TrainingHistory.from_json(saved) == history

    png = history.plot(tmp_path / "plots" / "history.png")
    assert png.read_bytes().startswith(PNG_SIGNATURE)


# -- data ---------------------------------------------------------------------------------------
def test_examples_come_from_pairs_mappings_or_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n\n{"text": "b"}\n', encoding="utf-8")
    assert load_examples(path, "text", "label") == [("a", "x"), ("b", None)]
    assert load_examples([("a", 1), ["b", 2]]) == [("a", 1), ("b", 2)]
    assert load_examples([{"input": "a", "target": "x"}]) == [("a", "x")]
    with pytest.raises(TrainerError, match="has no 'input' field"):
        load_examples(path)
    with pytest.raises(TrainerError, match="expected an"):
        load_examples(["just text"])


def test_minibatches_are_a_seeded_permutation(resources: plait.ResourceConfig) -> None:
    trainer = make_trainer([], resources, train=10, batch_size=4, seed=7)
    batches = trainer.batches(0)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(x for b in batches for x in b) == sorted(dataset(10))
    assert trainer.batches(0) == batches
    assert trainer.batches(1) != batches


# -- the command --------------------------------------------------------------------------------
def test_plait_train_writes_parameters_history_and_plot(
    resources: plait.ResourceConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "pipeline.py"
    target.write_text(
        textwrap.dedent(
            """
            import plait

            class Classifier(plait.Module):
                def __init__(self, instructions: str = "Label it.") -> None:
                    super().__init__()
                    self.llm = plait.LLMInference(
                        "fast",
                        system_prompt=plait.Parameter(instructions, description="Labelling."),
                    )

                def forward(self, text: str):
                    return self.llm(text)
            """
        ),
        encoding="utf-8",
    )
    config = tmp_path / "resources.yaml"  # JSON is YAML
    endpoint = {"provider": "openai", "model": "m", "base_url": resources["fast"].base_url}
    config.write_text(json.dumps({"optimizer": endpoint, "fast": endpoint}), encoding="utf-8")
    for name, size in (("train", 4), ("val", 4), ("test", 6)):
        rows = [{"text": text, "label": label} for text, label in dataset(size)]
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
        )
    out = tmp_path / "out"
    argv = [
        "train",
        f"{target}:Classifier",
        "instructions=Start here.",
        "--data",
        str(tmp_path / "train.jsonl"),
        "--val",
        str(tmp_path / "val.jsonl"),
        "--input-field",
        "text",
        "--target-field",
        "label",
        "--resources",
        str(config),
        "--out",
        str(out),
        "--test",
        str(tmp_path / "test.jsonl"),
        "-q",
    ]
    with mock({"rewriter": "Answer GOOD.", "fast": classify}, strict=True):
        assert cli_main(argv) == 0
        assert "held-out test" in capsys.readouterr().err
        # Running it again resumes the finished checkpoint: nothing left to do.
        assert cli_main(argv) == 0

    assert json.loads((out / "parameters.json").read_text()) == {
        "llm.system_prompt": "Answer GOOD."
    }
    history = json.loads((out / "history.json").read_text())
    assert (history["initial_val_score"], history["best_val_score"]) == (0.5, 1.0)
    assert (history["initial_test_score"], history["final_test_score"]) == (0.5, 1.0)
    assert len(history["steps"]) == 1
    assert (out / "history.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (out / "checkpoint" / CHECKPOINT_FILE).exists()


def test_plait_train_reports_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["train"]) == 2
    assert "TARGET is missing" in capsys.readouterr().err
    assert cli_main(["train", "tests/pipelines.py:Echo"]) == 2
    assert "--data FILE is missing" in capsys.readouterr().err
    assert cli_main(["train", "tests/pipelines.py:Echo", "--data", "x", "--min-delta", "-1"]) == 2
    assert "expected a number >= 0" in capsys.readouterr().err


def test_a_killed_run_resumes_from_its_last_checkpoint(server: Any, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    directory = tmp_path / "ckpt"

    def child(gate: int) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "tests.trainer_child", server.base_url, str(directory)]
        return subprocess.Popen(
            [*command, str(gate)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = child(gate=1)
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        assert line == "step 1\n", line + first.stderr.read()  # type: ignore[union-attr]
        os.kill(first.pid, signal.SIGKILL)  # after step 1's checkpoint, mid-run
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

    second = child(gate=0)
    stdout, stderr = second.communicate(timeout=120)
    assert second.returncode == 0, stderr
    result = json.loads(stdout.splitlines()[-1].removeprefix("RESULT "))
    assert result["resumed_at"] == 1
    assert result["steps"] == [1, 2, 3] and result["kept"] == [False, True, False]
    # only the two remaining steps ran: two batches of two and two validations of four
    assert result["classifier_calls"] == 2 * 2 + 2 * 4
    assert result["prompt"] == "Answer GOOD."


def test_an_example_whose_input_is_a_list_is_one_input_not_a_batch(
    resources: plait.ResourceConfig,
) -> None:
    class Joiner(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = plait.LLMInference(
                "fast", system_prompt=plait.Parameter("Join.", description="the task")
            )

        def forward(self, words: list[str]) -> Any:
            return self.llm(" ".join(words))

    model = Joiner()
    data = [(["a", "b"], "a b"), (["c", "d", "e"], "c d e")]
    trainer = Trainer(
        model, ExactMatch(), SFAOptimizer(model.parameters(), alias="smart"), data, data,
        batch_size=2, resources=resources,
    )  # fmt: skip
    with mock({"fast": lambda request: request.prompt_text, "rewriter": "Join them."}):
        history = trainer.fit_sync()
    assert history.initial_val_score == 1.0 and history.steps[0].train_score == 1.0


# -- where the passes run -----------------------------------------------------------------------
class RecordingPasses:
    """The local backend, noting each training pass the Trainer hands it."""

    def __init__(self) -> None:
        from plait.learning.passes import LocalTrainingBackend

        self.local = LocalTrainingBackend()
        self.passes: list[tuple[bool, int]] = []  # (train, examples)
        self.sessions = 0

    async def run_batch(self, *args: Any) -> list[Any]:
        return await self.local.run_batch(*args)

    async def run_steps(
        self, step: Any, examples: list[Any], opts: dict[str, Any], **flags: Any
    ) -> list[Any]:
        self.passes.append((flags["train"], len(examples)))
        return await self.local.run_steps(step, examples, opts, **flags)

    def session(self) -> Any:
        self.sessions += 1
        return self.local.session()


def test_the_passes_in_this_process_go_through_the_backend_registered_as_local(
    resources: plait.ResourceConfig,
) -> None:
    """One mechanism for where passes run: without workers, the minibatches and the
    validation passes are the ``"local"`` backend's ``run_steps`` (as on Ray workers
    they are the ``"ray"`` backend's), within one session of it."""
    from plait.execution.backends import register_backend

    recording = RecordingPasses()
    previous = register_backend("local", lambda: recording)
    assert previous is not None
    try:
        trainer = make_trainer(["Answer BAD.", "Answer GOOD."], resources, batch_size=4)
        history = train(trainer)
    finally:
        register_backend("local", previous)
    # The initial validation, then per step its minibatch and the validation of the update.
    assert recording.passes == [(False, 4), (True, 4), (False, 4), (True, 4), (False, 4)]
    assert recording.sessions == 1
    assert [step.kept for step in history.steps] == [False, True]  # as without the recording
    assert prompt_of(trainer) == "Answer GOOD."
