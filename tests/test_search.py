"""`DemoSearch` (issue 24 point 3): many demonstration sets scored by successive halving
on validation, the best compared with the incumbent example by example, and the
Trainer's gate unchanged.

As in ``test_bootstrap.py`` the model's replies are the test's, through plait's `mock`
handler, as a function of the request (so of the demonstrations it shows): the
outcome of each candidate is known, and the search must find the good one.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning import DemoSearch
from plait.learning.bootstrap import BootstrapFewShot
from plait.learning.losses import ExactMatch
from plait.learning.search import paired_interval
from plait.learning.trainer import Trainer
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli
from .test_bootstrap import write_target


def numbers(start: int, count: int) -> list[tuple[str, str]]:
    return [(f"please ship item {n} today", str(n)) for n in range(start, start + count)]


def number_in(text: str) -> str:
    found = re.findall(r"\d+", text)
    return found[-1] if found else ""


def shown_inputs(request: LLMRequest) -> list[str]:
    return [m["content"] for m in request.messages[:-1] if m["role"] == "user"]


class Extract(plait.Module):
    def __init__(self, demos: Any = None) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", "Give the item number.", demos=demos or [])

    def forward(self, text: str) -> Any:
        return self.llm(text)


#: The one training input whose demonstration teaches the (mock) model the task.
KEY = "please ship item 7 today"


def right_only_with_the_key(request: LLMRequest) -> str:
    number = number_in(request.prompt_text)
    return number if KEY in shown_inputs(request) else "unsure"


def search_run(model: Extract, optimizer: Any, resources: plait.ResourceConfig) -> Any:
    trainer = Trainer(
        model,
        ExactMatch(),
        optimizer,
        numbers(1, 16),
        numbers(100, 12),
        batch_size=16,
        max_steps=1,
        resources=resources,
    )
    with mock({"fast": right_only_with_the_key}, strict=True):
        return trainer.fit_sync()


def test_the_search_finds_the_one_good_set_among_many(resources: plait.ResourceConfig) -> None:
    model = Extract()
    search = DemoSearch(model.parameters(), candidates=24, max_demos=2, seed=0)
    history = search_run(model, search, resources)
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    assert KEY in [pair["input"] for pair in model.llm.demos.value]
    (trial,) = history.steps[0].trials
    report = trial["search"]
    rungs = report["rungs"]
    # Successive halving: all candidates on a few examples, fewer on more, all on the end.
    assert rungs[0]["examples"] == 4 and len(rungs[0]["scores"]) == report["candidates"]
    assert [r["examples"] for r in rungs] == sorted(r["examples"] for r in rungs)
    assert rungs[-1]["examples"] == 12
    assert len(rungs[-1]["scores"]) < len(rungs[0]["scores"])
    comparison = report["comparison"]
    assert comparison["accepted"] is True and comparison["mean_difference"] == 1.0
    assert comparison["interval_95"][0] > 0 and comparison["wins"] == 12
    # The gate judged it as every update: kept because validation rose.
    assert trial["kept"] is True and trial["val_score"] == 1.0


def test_halving_scores_many_sets_for_a_fraction_of_full_validation(
    resources: plait.ResourceConfig,
) -> None:
    """Halving scores 25 candidates for well under what scoring each on all of
    validation would cost."""
    model = Extract()
    history = search_run(model, DemoSearch(model.parameters(), candidates=24), resources)
    report = history.steps[0].trials[0]["search"]
    scored = sum(len(rung["scores"]) for rung in report["rungs"])
    assert report["candidates"] == 25  # the incumbent and 24 proposals
    example_runs = sum(
        (rung["examples"] - previous) * len(rung["scores"])
        for rung, previous in zip(
            report["rungs"], [0] + [r["examples"] for r in report["rungs"]], strict=False
        )
    )
    assert example_runs <= 0.6 * 25 * 12 and scored > 25


def test_nothing_is_installed_when_no_candidate_beats_the_incumbent(
    resources: plait.ResourceConfig,
) -> None:
    def worse_when_shown(request: LLMRequest) -> str:
        return "no idea" if shown_inputs(request) else number_in(request.prompt_text)

    model = Extract()
    search = DemoSearch(model.parameters(), candidates=8)
    trainer = Trainer(
        model,
        ExactMatch(),
        search,
        numbers(1, 8),
        numbers(50, 8),
        batch_size=8,
        resources=resources,
    )
    with mock({"fast": worse_when_shown}, strict=True):
        history = trainer.fit_sync()
    (record,) = history.steps
    assert record.trials[0]["search"]["comparison"]["accepted"] is False
    assert record.kept is False and model.llm.demos.value == []
    assert history.best_val_score == 1.0


def test_require_confidence_refuses_a_gain_the_interval_does_not_support(
    resources: plait.ResourceConfig,
) -> None:
    def one_better(request: LLMRequest) -> str:
        # Shown anything, the model gets item 100 right too, and nothing else changes.
        number = number_in(request.prompt_text)
        right = int(number) % 2 == 0 or (number == "101" and shown_inputs(request))
        return number if right else "unsure"

    model = Extract()
    search = DemoSearch(model.parameters(), candidates=4, require_confidence=True)
    trainer = Trainer(
        model,
        ExactMatch(),
        search,
        numbers(1, 8),
        numbers(100, 12),
        batch_size=8,
        resources=resources,
    )
    with mock({"fast": one_better}, strict=True):
        history = trainer.fit_sync()
    comparison = history.steps[0].trials[0]["search"]["comparison"]
    assert comparison["mean_difference"] > 0 and comparison["interval_95"][0] == 0.0
    assert comparison["accepted"] is False and model.llm.demos.value == []


def test_a_pool_chosen_per_input_is_searched_over_k(resources: plait.ResourceConfig) -> None:
    model = Extract(plait.knn_demos(k=8))
    history = search_run(model, DemoSearch(model.parameters(), k_choices=(1, 2, 4)), resources)
    value = model.llm.demos.value
    assert value["k"] in (1, 2, 4) and len(value["pool"]) == 16
    assert history.best_val_score is not None and history.best_val_score > 0


def test_two_searches_at_once_find_what_each_finds_alone(resources: plait.ResourceConfig) -> None:
    def trainer_for(model: Extract, seed: int) -> Trainer:
        return Trainer(
            model,
            ExactMatch(),
            DemoSearch(model.parameters(), candidates=12, max_demos=2, seed=seed),
            numbers(1, 16),
            numbers(100, 12),
            batch_size=16,
            max_steps=1,
            resources=resources,
        )

    alone = [Extract(), Extract()]
    with mock({"fast": right_only_with_the_key}, strict=True):
        for seed, model in enumerate(alone):
            trainer_for(model, seed).fit_sync()

    together = [Extract(), Extract()]

    async def both() -> None:
        await asyncio.gather(
            *(trainer_for(model, seed).fit() for seed, model in enumerate(together))
        )

    with mock({"fast": right_only_with_the_key}, strict=True):
        asyncio.run(both())
    assert [m.llm.demos.value for m in together] == [m.llm.demos.value for m in alone]


def test_without_validation_it_behaves_as_bootstrap(resources: plait.ResourceConfig) -> None:
    picked = []
    for optimizer in (DemoSearch, BootstrapFewShot):
        model = Extract()
        trainer = Trainer(
            model,
            ExactMatch(),
            optimizer(model.parameters(), candidates=1, max_demos=2),
            numbers(1, 8),
            batch_size=8,
            resources=resources,
        )
        with mock({"fast": right_only_with_the_key}, strict=True):
            trainer.fit_sync()
        picked.append(model.llm.demos.value)
    assert picked[0] and picked[0] == picked[1]


def test_the_paired_interval_brackets_the_mean_difference() -> None:
    low, high = paired_interval([1.0] * 5 + [0.0] * 15, random.Random(0))
    assert 0.0 <= low < 0.25 < high <= 0.5
    assert paired_interval([0.0] * 10, random.Random(0)) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"eta": 1}, "eta must be at least 2"),
        ({"min_examples": 0}, "min_examples must be a positive integer"),
        ({"k_choices": (0,)}, "k_choices must be positive integers"),
    ],
)
def test_bad_settings_are_refused_naming_them(settings: dict[str, Any], message: str) -> None:
    model = Extract()
    with pytest.raises(ValueError, match=message):
        DemoSearch(model.parameters(), **settings)


class Triage(plait.Module):
    """Find the item number (stage ``find``), then say it back (stage ``say``)."""

    def __init__(self) -> None:
        super().__init__()
        self.find = plait.LLMInference("fast", "Find the item number.", demos=[])
        self.say = plait.LLMInference("fast", "Say it back.", demos=[])

    def forward(self, text: str) -> Any:
        return self.say(f"Item: {self.find(text)}")


def each_stage_needs_its_own_demos(request: LLMRequest) -> str:
    """`find` is right only when shown a pair that answers a number; `say` only when
    shown a pair whose answer is the number it was given."""
    number = number_in(request.prompt_text)
    system = request.messages[0]["content"]
    shown = [m["content"] for m in request.messages if m["role"] == "assistant"]
    if system.startswith("Find"):
        return number if any(s.isdigit() for s in shown) else "I think it is " + number
    return number if shown and all(s.isdigit() for s in shown) else "item " + number


def test_stage_targets_give_an_inner_stage_labelled_pairs(
    resources: plait.ResourceConfig,
) -> None:
    model = Triage()
    search = DemoSearch(
        model.parameters(), candidates=8, max_demos=2, stage_targets={"find": lambda t: t}
    )
    trainer = Trainer(
        model,
        ExactMatch(),
        search,
        numbers(1, 8),
        numbers(100, 8),
        batch_size=8,
        resources=resources,
    )
    with mock({"fast": each_stage_needs_its_own_demos}, strict=True):
        history = trainer.fit_sync()
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    assert all(pair["output"].isdigit() for pair in model.find.demos.value)
    assert all(pair["output"].isdigit() for pair in model.say.demos.value)


def test_stage_targets_naming_no_stage_is_refused_naming_the_stages() -> None:
    model = Triage()
    with pytest.raises(ValueError, match=r"'found'.*the stages are 'find', 'say'"):
        DemoSearch(model.parameters(), stage_targets={"found": lambda t: t})


def test_plait_train_searches_per_input_demonstrations_from_the_shell(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target, resources = write_target(tmp_path, server)
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"w{n}", "target": f"w{n}"}) + "\n" for n in range(6))
    )
    out = tmp_path / "out"
    result = plait_cli(
        "train", target, "--data", data, "--val", data, "--resources", resources,
        "--optimizer", "search", "--demos", "knn", "--k", "2", "--candidates", "6",
        "--out", out, "--batch-size", "6", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (step,) = json.loads((out / "history.json").read_text())["steps"]
    (trial,) = step["trials"]
    assert trial["optimizer"] == "DemoSearch"
    report = trial["search"]
    assert report["candidates"] >= 2 and report["rungs"][-1]["examples"] == 6
    # Every run already passes (the fake echoes): nothing beats the incumbent.
    assert report["comparison"]["accepted"] is False
    assert json.loads((out / "parameters.json").read_text())["llm.demos"]["k"] == 2


def test_plait_train_demos_knn_without_demonstrations_is_a_usage_error(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target, resources = write_target(tmp_path, server, demos=False)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"input": "a", "target": "a"}) + "\n")
    result = plait_cli(
        "train", target, "--data", data, "--resources", resources, "--demos", "knn",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2 and "--demos knn" in result.stderr
    assert "demos=[]" in result.stderr


# -- refit: the validation examples join the pools once training ends -----------------------
def refit_trainer(
    model: Extract, resources: plait.ResourceConfig, batch_size: int = 16, **options: Any
) -> Trainer:
    return Trainer(
        model,
        ExactMatch(),
        BootstrapFewShot(model.parameters()),
        numbers(1, 16),
        numbers(100, 12),
        batch_size=batch_size,
        max_steps=1,
        resources=resources,
        refit=True,
        **options,
    )


def answer_if_shown_any(request: LLMRequest) -> str:
    return number_in(request.prompt_text) if shown_inputs(request) else "unsure"


def test_refit_adds_the_validation_pairs_to_the_pool_once_the_gate_has_judged(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract(plait.knn_demos(k=1))
    with mock({"fast": answer_if_shown_any}, strict=True):
        history = refit_trainer(model, resources, test_data=numbers(200, 4)).fit_sync()
    # The gate judged the training pool (empty: 0; the 16 training pairs: 1.0)...
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    # ...then the 12 validation pairs joined it, after the training ones, once.
    assert history.refit == {"examples": 28, "pools": {"llm.demos": [16, 28]}}
    pool = model.llm.demos.value["pool"]
    pairs = [(p["input"], p["output"]) for p in pool]
    assert sorted(pairs[:16]) == sorted(numbers(1, 16)) and pairs[16:] == numbers(100, 12)
    assert model.llm.demos.value["k"] == 1 and history.final_test_score == 1.0
    seen: list[list[str]] = []

    def record(request: LLMRequest) -> str:
        seen.append(shown_inputs(request))
        return answer_if_shown_any(request)

    with mock({"fast": record}, strict=True):
        model.bind(resources=resources).run_sync("please ship item 105 today, thanks")
    assert seen == [["please ship item 105 today"]]  # a validation pair, the nearest


def test_refit_brings_in_the_training_examples_no_kept_step_had_gathered(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract(plait.knn_demos(k=1))
    with mock({"fast": answer_if_shown_any}, strict=True):
        history = refit_trainer(model, resources, batch_size=4).fit_sync()
    # One step of four examples: the gate kept a pool of those four...
    assert history.best_val_score == 1.0 and len(history.steps) == 1
    # ...and the refit added the twelve training examples no step showed, and validation's.
    assert history.refit == {"examples": 28, "pools": {"llm.demos": [4, 28]}}
    inputs = sorted(p["input"] for p in model.llm.demos.value["pool"])
    assert inputs == sorted(i for i, _ in numbers(1, 16) + numbers(100, 12))


def test_refit_is_done_once_a_resumed_run_keeps_it(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    model = Extract(plait.knn_demos(k=1))
    with mock({"fast": answer_if_shown_any}, strict=True):
        first = refit_trainer(model, resources, checkpoint_dir=tmp_path).fit_sync()
    again = Extract(plait.knn_demos(k=1))
    calls: list[LLMRequest] = []

    def counted(request: LLMRequest) -> str:
        calls.append(request)
        return answer_if_shown_any(request)

    with mock({"fast": counted}, strict=True):
        trainer = refit_trainer(again, resources, checkpoint_dir=tmp_path)
        assert trainer.resumed
        history = trainer.fit_sync()
    assert history.refit == first.refit and calls == []  # nothing run or grown again
    assert again.llm.demos.value == model.llm.demos.value


def test_two_refitting_runs_at_once_end_as_each_does_alone(
    resources: plait.ResourceConfig,
) -> None:
    alone = Extract(plait.knn_demos(k=1))
    with mock({"fast": answer_if_shown_any}, strict=True):
        refit_trainer(alone, resources).fit_sync()
    together = [Extract(plait.knn_demos(k=1)), Extract(plait.knn_demos(k=2))]

    async def both() -> list[Any]:
        with mock({"fast": answer_if_shown_any}, strict=True):
            return list(
                await asyncio.gather(*(refit_trainer(m, resources).fit() for m in together))
            )

    histories = asyncio.run(both())
    assert [h.refit for h in histories] == [{"examples": 28, "pools": {"llm.demos": [16, 28]}}] * 2
    assert together[0].llm.demos.value == alone.llm.demos.value
    assert together[1].llm.demos.value["pool"] == alone.llm.demos.value["pool"]


@pytest.mark.parametrize(
    ("model", "optimizer", "val", "message"),
    [
        (Extract(plait.knn_demos(k=1)), BootstrapFewShot, None, "give val_data"),
        (Extract([]), BootstrapFewShot, numbers(100, 2), r"demos=plait.knn_demos\(k=4\)"),
        (Extract(plait.knn_demos(k=1)), None, numbers(100, 2), "BootstrapFewShot or DemoSearch"),
    ],
)
def test_refit_without_what_it_needs_is_refused_naming_it(
    model: Extract, optimizer: Any, val: Any, message: str
) -> None:
    from plait.learning import SFAOptimizer
    from plait.learning.failures import TrainerError

    made = (
        optimizer(model.parameters())
        if optimizer is not None
        else SFAOptimizer(model.parameters(), alias="fast")
    )
    with pytest.raises(TrainerError, match=message):
        Trainer(model, ExactMatch(), made, numbers(1, 4), val, refit=True)


def test_plait_train_refit_from_the_shell(server: FakeOpenAIServer, tmp_path: Path) -> None:
    target, resources = write_target(tmp_path, server)
    data, val = tmp_path / "data.jsonl", tmp_path / "val.jsonl"
    for path, prefix in ((data, "w"), (val, "v")):
        path.write_text(
            "".join(json.dumps({"input": f"{prefix}{n}", "target": f"{prefix}{n}"}) + "\n"
                    for n in range(4))
        )  # fmt: skip
    out = tmp_path / "out"
    base = ("train", target, "--data", data, "--resources", resources, "--out", out, "-q")
    refused = plait_cli(*base, "--refit", "--demos", "knn")
    assert refused.returncode == 2 and "give --val" in refused.stderr
    refused = plait_cli(*base, "--refit", "--val", val)
    assert refused.returncode == 2 and "--demos knn" in refused.stderr
    done = plait_cli(
        *base, "--val", val, "--demos", "knn", "--refit", "--optimizer", "search",
        "--batch-size", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The fake echoes, so every run passes from the start and the gate keeps the empty
    # pool; the refit then fills it with the training and validation pairs.
    assert json.loads((out / "history.json").read_text())["refit"] == {
        "examples": 8,
        "pools": {"llm.demos": [0, 8]},
    }
    pool = json.loads((out / "parameters.json").read_text())["llm.demos"]["pool"]
    assert [p["input"] for p in pool] == [f"w{n}" for n in range(4)] + [f"v{n}" for n in range(4)]
    assert "refit on 8 labelled example(s): pools llm.demos 0 -> 8" in done.stderr


# -- instructions searched with a rewriter --------------------------------------------------
GOOD = "Answer with the item number only."


class Instructed(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter("Do the task.", description="what the step does"),
            demos=[],
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def right_only_with_the_good_instruction(request: LLMRequest) -> str:
    system = request.messages[0]["content"]
    return number_in(request.prompt_text) if system == GOOD else "unsure"


class Proposals:
    """The rewriter: the second proposal of each step is the good instruction, one is an
    echo of the request's headings (refused), the others are plausible but useless."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, request: LLMRequest) -> str:
        self.prompts.append(request.prompt_text)
        variant = int(re.findall(r"\(proposal (\d+)\)", request.prompt_text)[0])
        if variant == 2:
            return GOOD
        if variant == 3:
            return "## The instruction in place\nDo the task."
        return f"Do the task well, attempt {variant}."


def instruction_search(model: Instructed, resources: plait.ResourceConfig, seed: int) -> Trainer:
    return Trainer(
        model,
        ExactMatch(),
        DemoSearch(model.parameters(), rewriter="smart", instructions=4, seed=seed),
        numbers(1, 8),
        numbers(100, 8),
        batch_size=8,
        max_steps=1,
        resources=resources,
    )


def test_a_rewriter_adds_instructions_to_the_search_and_the_best_is_installed(
    resources: plait.ResourceConfig,
) -> None:
    model = Instructed()
    proposals = Proposals()
    with mock(
        {"fast": right_only_with_the_good_instruction, "instructions": proposals}, strict=True
    ):
        history = instruction_search(model, resources, seed=0).fit_sync()
    assert model.llm.system_prompt.value == GOOD
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    (trial,) = history.steps[0].trials
    report = trial["search"]
    assert report["instructions"] == {
        "llm#instruction": ["Do the task well, attempt 1.", GOOD, "Do the task well, attempt 4."]
    }
    assert any(v.get("llm#instruction") == GOOD for v in report["values"])
    assert "llm.system_prompt" in trial["rejected"]  # the echo, refused
    # Each proposal saw the purpose, the instruction in place and labelled pairs.
    assert len(proposals.prompts) == 4
    for prompt in proposals.prompts:
        assert "what the step does" in prompt and "Do the task." in prompt
        assert re.search(r"Input:\nplease ship item \d+ today\nAnswer:\n\d+", prompt)


def test_two_instruction_searches_at_once_find_what_each_finds_alone(
    resources: plait.ResourceConfig,
) -> None:
    models = [Instructed(), Instructed()]

    async def both() -> list[Any]:
        replies = {"fast": right_only_with_the_good_instruction, "instructions": Proposals()}
        with mock(replies, strict=True):
            return list(
                await asyncio.gather(
                    *(instruction_search(m, resources, seed).fit() for seed, m in enumerate(models))
                )
            )

    histories = asyncio.run(both())
    assert [m.llm.system_prompt.value for m in models] == [GOOD, GOOD]
    assert [h.best_val_score for h in histories] == [1.0, 1.0]


def test_a_rewriter_with_no_learnable_instruction_is_refused_naming_the_fix() -> None:
    model = Extract()  # its instruction is plain text, not a Parameter
    with pytest.raises(ValueError, match=r"system_prompt=plait.Parameter"):
        DemoSearch(model.parameters(), rewriter="smart")


def test_plait_train_searches_instructions_from_the_shell(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target, resources = write_target(tmp_path, server)
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"w{n}", "target": f"w{n}"}) + "\n" for n in range(4))
    )
    out = tmp_path / "out"
    base = ("train", target, "--data", data, "--val", data, "--resources", resources)
    refused = plait_cli(*base, "--instructions", "2", "--out", out)
    assert (
        refused.returncode == 2 and "--instructions goes with --optimizer search" in refused.stderr
    )
    done = plait_cli(
        *base, "--optimizer", "search", "--instructions", "2", "--out", out, "--batch-size", "4",
        "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    asked = [
        r for r in server.stats(bodies=True)["requests"]
        if "Write a new instruction" in r["body"]["messages"][-1]["content"]
    ]  # fmt: skip
    assert len(asked) == 2  # on the optimizer alias, one request per proposal
    (step,) = json.loads((out / "history.json").read_text())["steps"]
    report = step["trials"][0]["search"]
    # The fake server fills a structured reply with "x": both proposals are that one.
    assert report["instructions"] == {"llm#instruction": ["x"]}
    assert any(value["llm#instruction"] == "x" for value in report["values"])


def test_a_resume_with_other_search_settings_is_refused_naming_them(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    """The checkpoint's choices were made under its settings: a rerun that changes the
    number of candidates (or any other option) is refused, naming what changed."""

    def trainer(candidates: int) -> Trainer:
        model = Extract()
        search = DemoSearch(model.parameters(), candidates=candidates, max_demos=2, seed=0)
        return Trainer(
            model,
            ExactMatch(),
            search,
            numbers(1, 16),
            numbers(100, 12),
            batch_size=8,
            max_steps=1,
            checkpoint_dir=tmp_path / "ckpt",
            resources=resources,
        )

    first = trainer(8)
    with mock({"fast": right_only_with_the_key}, strict=True):
        first.fit_sync()
    assert trainer(8).resumed  # the same settings resume
    with pytest.raises(plait.learning.TrainerError) as refused:
        trainer(16)
    message = str(refused.value)
    assert "other DemoSearch settings (candidates was 8, now 16)" in message
    assert "--fresh" in message


def test_the_paired_interval_by_group_weighs_each_group_the_same() -> None:
    """Three of twenty examples gain 1, all of the rarer label: by example the mean
    gain is 0.15, by label 0.5, and the interval by label lies around that."""
    diffs = [0.0] * 17 + [1.0] * 3
    groups = ["positive"] * 17 + ["negative"] * 3
    low, high = paired_interval(diffs, random.Random(0), 0.9)
    assert low < 0.15 < high < 0.4
    low, high = paired_interval(diffs, random.Random(0), 0.9, groups)
    assert low > 0.2 and high >= 0.5
    # Without groups the resamples are the ones they always were.
    assert paired_interval(diffs, random.Random(0), 0.9, None) == paired_interval(
        diffs, random.Random(0), 0.9
    )
