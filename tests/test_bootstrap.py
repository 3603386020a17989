"""`BootstrapFewShot` and the Trainer's list of optimizers (issue 13 points 2, 3 and 5).

The model's replies are decided by the test through plait's `mock` handler, as
a function of the request it is sent (so of its demonstrations and system
prompt): each step's outcome is the test's, not a model's.  The runs go through
the loopback fake server's resources; the last tests send real requests to it
and count them.
"""

from __future__ import annotations

import enum
import json
import re
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest

import plait
from plait.demos import label_of
from plait.handlers import mock
from plait.learning.bootstrap import BootstrapFewShot
from plait.learning.losses import ExactMatch
from plait.learning.optimizers import SFAOptimizer
from plait.learning.trainer import Trainer, TrainerError
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli


def numbers(start: int, count: int) -> list[tuple[str, str]]:
    return [(f"please ship item {n} today", str(n)) for n in range(start, start + count)]


def number_in(text: str) -> str:
    found = re.findall(r"\d+", text)
    return found[-1] if found else ""


def shown_demos(request: LLMRequest) -> int:
    return sum(1 for m in request.messages if m["role"] == "assistant")


def system_of(request: LLMRequest) -> str:
    return next((m["content"] for m in request.messages if m["role"] == "system"), "")


class Extract(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter("Give the item number.", description="the task"),
            demos=[],
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def chatty_unless_shown(request: LLMRequest) -> str:
    """A small model: answers with a sentence until it is shown how to answer."""
    number = number_in(request.prompt_text)
    return number if shown_demos(request) else f"The item number is {number}."


def test_labelled_demos_take_a_pipeline_from_zero_when_no_run_passes(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    boot = BootstrapFewShot(model.parameters(), max_demos=3, candidates=2)
    trainer = Trainer(
        model,
        ExactMatch(),
        boot,
        numbers(1, 8),
        numbers(100, 4),
        batch_size=4,
        resources=resources,
        test_data=numbers(200, 5),
    )
    with mock({"fast": chatty_unless_shown}, strict=True):
        history = trainer.fit_sync()
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    assert (history.initial_test_score, history.final_test_score) == (0.0, 1.0)
    first = history.steps[0]
    (trial,) = first.trials
    assert trial["optimizer"] == "BootstrapFewShot" and trial["kept"] is True
    assert len(trial["candidates"]) == 2 and trial["val_score"] == 1.0
    demos = model.llm.demos.value
    assert 1 <= len(demos) <= 3
    training = dict(numbers(1, 8))
    # No run passed before the first step: the pairs are labelled ones, each a
    # training input with its target.
    assert all(training[d["input"]] == d["output"] for d in demos)
    assert trial["tried"]["llm.demos"] == demos


class TwoStages(plait.Module):
    """Normalise the text (alias fast), then pull the number out (alias smart)."""

    def __init__(self) -> None:
        super().__init__()
        self.normalize = plait.LLMInference("fast", demos=[])
        self.extract = plait.LLMInference("smart", demos=[])

    def forward(self, text: str) -> Any:
        return self.extract(f"Number in: {self.normalize(text)}")


def shout(request: LLMRequest) -> str:
    return request.prompt_text.upper()


def even_or_shown(request: LLMRequest) -> str:
    """Right for even numbers; for odd ones only once shown demonstrations."""
    number = number_in(request.prompt_text)
    return number if int(number) % 2 == 0 or shown_demos(request) else "unsure"


def test_each_stage_gets_demonstrations_from_its_own_inputs_and_outputs(
    resources: plait.ResourceConfig,
) -> None:
    model = TwoStages()
    boot = BootstrapFewShot(model.parameters(), max_demos=2, candidates=1)
    trainer = Trainer(
        model, ExactMatch(), boot, numbers(1, 4), numbers(11, 4), batch_size=4, resources=resources
    )
    with mock({"fast": shout, "smart": even_or_shown}, strict=True):
        history = trainer.fit_sync()
    assert (history.initial_val_score, history.best_val_score) == (0.5, 1.0)
    # The passing runs were those of items 2 and 4: each stage's pairs are what that
    # stage was given and answered in them.
    passed = {"PLEASE SHIP ITEM 2 TODAY", "PLEASE SHIP ITEM 4 TODAY"}
    first = model.normalize.demos.value
    assert {d["output"] for d in first} <= passed
    assert all(d["output"] == d["input"].upper() for d in first)
    second = model.extract.demos.value
    assert {d["input"] for d in second} <= {f"Number in: {text}" for text in passed}
    assert all(d["output"] == number_in(d["input"]) for d in second)
    assert len(first) == len(second) == 2


def test_a_demonstration_set_that_scores_worse_is_rolled_back(
    resources: plait.ResourceConfig,
) -> None:
    def worse_when_shown(request: LLMRequest) -> str:
        return "no idea" if shown_demos(request) else number_in(request.prompt_text)

    model = Extract()
    boot = BootstrapFewShot(model.parameters(), candidates=1)
    trainer = Trainer(
        model, ExactMatch(), boot, numbers(1, 4), numbers(20, 4), batch_size=4, resources=resources
    )
    with mock({"fast": worse_when_shown}, strict=True):
        history = trainer.fit_sync()
    (record,) = history.steps
    assert record.trials[0]["val_score"] == 0.0 and record.kept is False
    assert record.trials[0]["tried"]["llm.demos"]  # what was tried is on record
    assert model.llm.demos.value == []  # ... and the proven (empty) set is back
    assert history.best_val_score == history.initial_val_score == 1.0


def test_bootstrap_and_instruction_rewriting_in_one_run_each_gated_on_its_own(
    resources: plait.ResourceConfig,
) -> None:
    def needs_both(request: LLMRequest) -> str:
        number = number_in(request.prompt_text)
        if not shown_demos(request):
            return f"It is {number}."
        if "EXACT" in system_of(request) or int(number) % 2 == 0:
            return number
        return f"It is {number}."

    model = Extract()
    boot = BootstrapFewShot(model.parameters(), candidates=1)
    sfa = SFAOptimizer(model.parameters(), alias="smart")
    trainer = Trainer(
        model,
        ExactMatch(),
        [boot, sfa],
        numbers(1, 4),
        numbers(30, 4),
        batch_size=4,
        resources=resources,
    )
    with mock({"fast": needs_both, "rewriter": "Answer with the EXACT number only."}, strict=True):
        history = trainer.fit_sync()
    (record,) = history.steps
    boot_trial, sfa_trial = record.trials
    assert (boot_trial["optimizer"], boot_trial["val_score"], boot_trial["kept"]) == (
        "BootstrapFewShot",
        0.5,
        True,
    )
    assert (sfa_trial["optimizer"], sfa_trial["val_score"], sfa_trial["kept"]) == (
        "SFAOptimizer",
        1.0,
        True,
    )
    assert sfa_trial["tried"] == {"llm.system_prompt": "Answer with the EXACT number only."}
    assert record.changed == ["llm.demos", "llm.system_prompt"]
    assert model.llm.system_prompt.value == "Answer with the EXACT number only."
    assert model.llm.demos.value
    assert history.best_val_score == 1.0


def test_a_teacher_alias_produces_the_demonstrations(resources: plait.ResourceConfig) -> None:
    asked: list[str] = []

    def student(request: LLMRequest) -> str:
        asked.append("fast")
        return chatty_unless_shown(request)

    def teacher(request: LLMRequest) -> str:
        asked.append("smart")
        return number_in(request.prompt_text)

    model = Extract()
    boot = BootstrapFewShot(model.parameters(), teacher_alias="smart", candidates=1)
    trainer = Trainer(
        model, ExactMatch(), boot, numbers(1, 4), numbers(40, 4), batch_size=4, resources=resources
    )
    with mock({"fast": student, "smart": teacher}, strict=True):
        history = trainer.fit_sync()
    assert asked.count("smart") == 4  # the teacher ran the minibatch
    assert set(boot.passed["llm"]) == {text for text, _ in numbers(1, 4)}
    assert history.best_val_score == 1.0
    assert model.llm.alias == "fast"  # the pipeline itself stays on its alias


def test_bootstrap_needs_demonstration_parameters() -> None:
    class NoDemos(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = plait.LLMInference(
                "fast", system_prompt=plait.Parameter("x", description="the task")
            )

    with pytest.raises(ValueError, match=r"demos=\[\]"):
        BootstrapFewShot(NoDemos().parameters())
    model = Extract()
    with pytest.raises(ValueError, match="max_demos must be a positive integer"):
        BootstrapFewShot(model.parameters(), max_demos=0)


def test_bootstrap_state_and_a_resume_with_other_optimizers(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    model = Extract()
    boot = BootstrapFewShot(model.parameters(), candidates=1)
    trainer = Trainer(
        model,
        ExactMatch(),
        [boot],
        numbers(1, 4),
        numbers(50, 2),
        batch_size=4,
        resources=resources,
        checkpoint_dir=tmp_path,
    )
    with mock({"fast": chatty_unless_shown}, strict=True):
        trainer.fit_sync()
    twin = Extract()
    again = BootstrapFewShot(twin.parameters())
    again.load_state_dict(json.loads(json.dumps(boot.state_dict())))
    assert again.labelled == boot.labelled and again.steps == boot.steps == 1
    other = Extract()
    with pytest.raises(TrainerError, match="written with 1 optimizer"):
        Trainer(
            other,
            ExactMatch(),
            [BootstrapFewShot(other.parameters()), SFAOptimizer(other.parameters())],
            numbers(1, 4),
            numbers(50, 2),
            batch_size=4,
            resources=resources,
            checkpoint_dir=tmp_path,
        )


class Copy(plait.Module):
    """Echoed by the fake server (no system prompt): every run passes."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", demos=[], temperature=0)

    def forward(self, text: str) -> Any:
        return self.llm(text)


def test_the_history_counts_the_requests_and_tokens_each_step_spent(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    data = [(f"word {n}", f"word {n}") for n in range(6)]
    model = Copy()
    boot = BootstrapFewShot(model.parameters(), candidates=3, max_demos=2)
    trainer = Trainer(model, ExactMatch(), boot, data, data[:3], batch_size=3, resources=resources)
    history = trainer.fit_sync()
    sent = server.stats()["requests_total"]
    assert len(history.steps) == 2
    assert all(record.calls > 0 and record.tokens > 0 for record in history.steps)
    # Everything but the initial validation pass (3 requests) was spent in a step.
    assert sum(record.calls for record in history.steps) + 3 == sent
    # Validation was already perfect: each demonstration set only ties it.
    assert [record.kept for record in history.steps] == [False, False]
    assert model.llm.demos.value == []


class Triage(plait.Module):
    def __init__(self, labels: Any) -> None:
        super().__init__()
        self.classify = plait.LLMInference("fast", "Classify.", response_format=labels, demos=[])

    def forward(self, message: str) -> Any:
        return self.classify(message)


class Team(enum.Enum):
    BILLING = "billing"
    SHIPPING = "shipping"


@pytest.mark.parametrize("labels", [Literal["billing", "shipping"], Team], ids=["literal", "enum"])
def test_a_label_calls_demonstrations_show_its_labels_as_the_labelled_pairs_do(
    resources: plait.ResourceConfig, labels: Any
) -> None:
    """The fake server answers a label call's JSON schema as an endpoint with structured
    outputs does (``{"value": "billing"}``: its first label, so the billing examples
    pass).  Was: a pair from a run that passed showed that JSON, the labelled pairs the
    bare label, so one set showed two forms and the search could not tell its label."""
    data = [
        ("I was charged twice.", "billing"),
        ("My parcel is late.", "shipping"),
        ("I want a refund.", "billing"),
        ("The box was lost.", "shipping"),
    ]
    model = Triage(labels)
    boot = BootstrapFewShot(model.parameters(), max_demos=4, candidates=1)
    trainer = Trainer(model, ExactMatch(), boot, data, data, batch_size=4, resources=resources)
    history = trainer.fit_sync()
    tried = history.steps[0].trials[0]["tried"]["classify.demos"]
    assert sorted((d["input"], d["output"]) for d in tried) == sorted(data)
    assert all(label_of(d["output"], ["billing", "shipping"]) for d in tried)


def test_a_label_calls_demonstrations_show_every_label_when_its_passed_runs_do_not() -> None:
    """A model that answers "billing" to everything passes on the billing examples only;
    a list of those alone would teach it to go on doing so.  Each candidate shows both
    labels: a labelled shipping pair takes the place of one billing pair."""
    data = [(f"Message {i} about money.", "billing") for i in range(6)]
    data += [(f"Message {i} about a parcel.", "shipping") for i in range(6, 8)]
    model = Triage(Literal["billing", "shipping"])
    boot = BootstrapFewShot(model.parameters(), max_demos=4, candidates=3, seed=1)
    trainer = Trainer(model, ExactMatch(), boot, data, data, batch_size=8, max_steps=1)
    with mock({"fast": lambda request: "billing"}):
        history = trainer.fit_sync()
    tried = history.steps[0].trials[0]["tried"]["classify.demos"]
    shown = [d["output"] for d in tried]
    assert len(shown) == 4 and shown.count("billing") == 3 and shown.count("shipping") == 1
    assert all(d["input"].endswith("about a parcel.") for d in tried if d["output"] == "shipping")


def write_target(tmp_path: Path, server: FakeOpenAIServer, demos: bool = True) -> tuple[str, Path]:
    target = tmp_path / "copy.py"
    extra = ", demos=[]" if demos else ""
    target.write_text(
        textwrap.dedent(
            f"""
            import plait
            class Copy(plait.Module):
                def __init__(self):
                    super().__init__()
                    self.llm = plait.LLMInference(
                        "fast",
                        system_prompt=plait.Parameter("", description="the task"){extra},
                    )
                def forward(self, text):
                    return self.llm(text)
            """
        )
    )
    resources = tmp_path / "resources.toml"
    resources.write_text(
        "".join(
            f'[{alias}]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
            'api_key = "sk-test"\n'
            for alias in ("fast", "optimizer")
        )
    )
    return f"{target}:Copy", resources


def test_plait_train_combines_bootstrap_and_sfa_and_records_both(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target, resources = write_target(tmp_path, server)
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"w{n}", "target": f"w{n}"}) + "\n" for n in range(4))
    )
    out = tmp_path / "out"
    result = plait_cli(
        "train", target, "--data", data, "--val", data, "--resources", resources,
        "--optimizer", "bootstrap", "--optimizer", "sfa", "--out", out, "--batch-size", "4", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    history = json.loads((out / "history.json").read_text())
    (step,) = history["steps"]
    assert [t["optimizer"] for t in step["trials"]] == ["BootstrapFewShot", "SFAOptimizer"]
    assert step["calls"] > 0 and step["tokens"] > 0
    assert "llm.demos" in json.loads((out / "parameters.json").read_text())


def test_plait_train_bootstrap_without_demos_is_a_usage_error(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target, resources = write_target(tmp_path, server, demos=False)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"input": "a", "target": "a"}) + "\n")
    result = plait_cli(
        "train", target, "--data", data, "--resources", resources, "--optimizer", "bootstrap",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2
    assert "demos=[]" in result.stderr
    result = plait_cli(
        "train", target, "--data", data, "--resources", resources, "--teacher-alias", "smart",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2 and "--teacher-alias goes with --optimizer bootstrap" in (
        result.stderr
    )
