"""`ReflectiveSearch`: instructions rewritten from the failures a rewriter reads, a pool kept
as a Pareto frontier, merges stage by stage, an exact budget of metric calls, and a run
that resumes after kill -9 paying for nothing twice.

The pipeline's model and the rewriter are the test's, through plait's `mock` handler, as
functions of the request: what a candidate scores and what the rewriter proposes follow
from what each is shown, so every decision of the search is known in advance.
"""

from __future__ import annotations

import collections
import json
import random
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning import ReflectiveSearch
from plait.learning.failures import TrainerError
from plait.learning.losses import ExactMatch
from plait.learning.reflective import choose_parent, pareto_frontier
from plait.learning.trainer import Trainer
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer

from .conftest import ROOT, plait_cli

GOOD = "Answer with the item number only."


def numbers(start: int, count: int) -> list[tuple[str, str]]:
    return [(f"please ship item {n} today", str(n)) for n in range(start, start + count)]


def number_in(text: str) -> str:
    found = re.findall(r"\d+", text)
    return found[-1] if found else ""


class Extract(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", plait.Parameter("Do the task.", description="what the step does")
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


class Counted:
    """The pipeline's model: right (the item number) only under the good instruction,
    and right on even numbers under any instruction that mentions numbers; counts
    every call (each is one example scored: the pipeline has one stage)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: LLMRequest) -> str:
        self.calls += 1
        system, number = request.messages[0]["content"], number_in(request.prompt_text)
        if system == GOOD or ("number" in system and int(number) % 2 == 0):
            return number
        return "unsure"


class Rewriter:
    """The rewriter: the good instruction once it is shown an example it failed with the
    loss's words; records every prompt."""

    def __init__(self, proposal: str = GOOD) -> None:
        self.prompts: list[str] = []
        self.proposal = proposal

    def __call__(self, request: LLMRequest) -> str:
        self.prompts.append(request.prompt_text)
        return self.proposal if "expected exactly" in request.prompt_text else "Do it."


def trainer_for(
    model: plait.Module,
    search: ReflectiveSearch,
    resources: plait.ResourceConfig,
    train: list[tuple[str, str]] | None = None,
    val: list[tuple[str, str]] | None = None,
    **options: Any,
) -> Trainer:
    return Trainer(
        model,
        ExactMatch(),
        search,
        train or numbers(1, 4),
        val or numbers(100, 4),
        batch_size=options.pop("batch_size", 2),
        epochs=options.pop("epochs", 10),
        resources=resources,
        **options,
    )


# -- the frontier and the parents ------------------------------------------------------------
def test_the_frontier_holds_every_candidate_best_on_some_example_ties_for_all() -> None:
    scores = [
        [1.0, 0.0, 0.5, 0.0],  # best on example 0 alone, and tied on 3
        [0.0, 1.0, 0.5, 0.0],  # best on 1 alone, tied on 2 and 3
        [0.0, 0.0, 0.5, 0.0],  # tied best on 2 and 3: on the frontier too
        [0.0, 0.0, 0.0, 0.0],  # tied best on 3 only
    ]
    assert pareto_frontier(scores) == {0: 3, 1: 3, 2: 2, 3: 1}
    assert pareto_frontier([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]) == {0: 2, 1: 1}
    with pytest.raises(ValueError, match="same examples"):
        pareto_frontier([[1.0], [1.0, 0.0]])


def test_parents_are_drawn_in_proportion_to_the_examples_they_win() -> None:
    wins = {0: 1, 3: 2, 5: 5}
    draws = [choose_parent(wins, random.Random(f"draw:{i}")) for i in range(8000)]
    counts = collections.Counter(draws)
    assert set(counts) == {0, 3, 5}
    for candidate, share in wins.items():
        assert abs(counts[candidate] / 8000 - share / 8) < 0.02, counts
    # Seeded: the same stream draws the same parents.
    again = [choose_parent(wins, random.Random(f"draw:{i}")) for i in range(8000)]
    assert again == draws


def seeded_pool(search: ReflectiveSearch, scores: list[list[float]], **state: Any) -> None:
    """Give ``search`` a pool (candidate i holds instruction ``v<i>``), as a resumed run
    loads it."""
    pool = [
        {"id": i, "values": {"llm": f"v{i}"}, "scores": row,
         "origin": "seed" if i == 0 else "reflection", "parents": [] if i == 0 else [0]}
        for i, row in enumerate(scores)
    ]  # fmt: skip
    search.load_state_dict({"type": "ReflectiveSearch", "pool": pool, **state})


def test_each_step_draws_its_parent_from_the_frontier_and_says_why(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", seed=3)
    scores = [[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0], [0.0] * 4]
    seeded_pool(search, scores, steps=1)
    trainer = trainer_for(model, search, resources, epochs=1)
    parents = []
    with mock({"fast": lambda r: "unsure", "reflection": "Do it."}, strict=True):
        trainer.fit_sync()  # two steps; every proposal fails on the minibatch
    for record in trainer.history.steps:
        parent = record.trials[0]["search"]["parent"]
        parents.append(parent["id"])
        assert parent["id"] in (1, 2)  # candidates 0 and 3 win no example
        wins = {1: 1, 2: 3}[parent["id"]]
        assert parent["wins"] == wins and parent["probability"] == wins / 4
        assert record.trials[0]["search"]["frontier"] == {"1": 1, "2": 3}
    # The draws are the seed's and the step's: the same as choose_parent's.
    want = [choose_parent({1: 1, 2: 3}, random.Random(f"reflective:3:{s}")) for s in (1, 2)]
    assert parents == want


# -- reflection ------------------------------------------------------------------------------
def test_the_rewriter_reads_the_failed_examples_with_the_losss_feedback(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    rewriter = Rewriter()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=12)
    train = [("please ship item 7 today", "7"), ("please ship item 9 today", "nine")]
    trainer = trainer_for(model, search, resources, train=train, batch_size=2, epochs=1)

    def model_fn(request: LLMRequest) -> str:  # item 9's target ("nine") is never met
        return number_in(request.prompt_text) if "7" in request.prompt_text else "unsure"

    with mock({"fast": model_fn, "reflection": rewriter}, strict=True):
        trainer.fit_sync()
    (prompt,) = rewriter.prompts
    assert "what the step does" in prompt and "<<<\nDo the task.\n>>>" in prompt
    # Only the failed example, with what the stage was given and answered, the expected
    # answer, the loss's words and the feedback that reached the instruction.
    assert "item 7" not in prompt
    assert "The step was given:\nplease ship item 9 today" in prompt
    assert "It answered:\nunsure" in prompt and "The expected answer:\nnine" in prompt
    assert 'What the loss said:\nexpected exactly "nine" but the output was "unsure"' in prompt
    assert "The feedback that reached this instruction:\nGiven output feedback:" in prompt


def test_a_child_joins_the_pool_only_when_it_beats_its_parent_on_the_minibatch(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    counted = Counted()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=24)
    trainer = trainer_for(model, search, resources, epochs=1, batch_size=4)
    # The proposal gets nothing right: no better than its parent on the minibatch.
    with mock({"fast": counted, "reflection": Rewriter("Say hello.")}, strict=True):
        history = trainer.fit_sync()
    (record,) = history.steps
    proposal = record.trials[0]["search"]["proposal"]
    assert proposal["instruction"] == "Say hello."
    assert proposal["parent_minibatch"] == [0.0] * 4 and proposal["child_minibatch"] == [0.0] * 4
    assert proposal["accepted"] is False and "did not beat its parent" in proposal["why"]
    assert len(search.pool) == 1 and model.llm.system_prompt.value == "Do the task."
    # initial validation (4, taken by the seed) + parent and child on the minibatch: no
    # validation pass for a child that lost
    assert counted.calls == 4 + 4 + 4 and search.used == counted.calls


def test_an_accepted_child_is_installed_and_the_gate_pays_for_no_pass_of_its_own(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    counted = Counted()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=100)
    trainer = trainer_for(model, search, resources, epochs=1, batch_size=4)
    with mock({"fast": counted, "reflection": Rewriter()}, strict=True):
        history = trainer.fit_sync()
    (record,) = history.steps
    report = record.trials[0]["search"]
    assert report["proposal"]["accepted"] is True and report["proposal"]["candidate"] == 1
    assert report["installed"] == 1 and model.llm.system_prompt.value == GOOD
    assert history.initial_val_score == 0.0 and history.best_val_score == 1.0
    assert record.kept is True and record.val_score == 1.0
    assert record.train_score == 0.0  # the parent's minibatch, as the search ran it
    # initial validation (taken by the seed) 4, parent 4, child 4, child on validation 4;
    # the gate took the search's score of exactly the installed values
    assert counted.calls == 16 and search.used == 16


# -- the budget ------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [11, 12, 25, 31])
def test_the_budget_is_never_exceeded_and_spent_it_ends_the_run(
    resources: plait.ResourceConfig, budget: int
) -> None:
    model = Extract()
    counted = Counted()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=budget)
    # Every proposal is new (so the pool grows) and half right, beating "unsure".
    proposals = iter(f"Give the number, variant {n}." for n in range(100))

    def rewriter(request: LLMRequest) -> str:
        return next(proposals)

    trainer = trainer_for(model, search, resources, epochs=50, batch_size=2)
    with mock({"fast": counted, "reflection": rewriter}, strict=True):
        history = trainer.fit_sync()
    # Every example the pipeline ran is one metric call (the seed's came from the
    # Trainer's initial validation): the count is exact, and never over the budget.
    assert search.used == counted.calls <= budget
    # What is left cannot pay for another step: a parent and a child on a minibatch
    # of 2, and the child on the 4 validation examples.
    assert budget - search.used < 2 * 2 + 4
    assert history.stopped == "budget"
    last = history.steps[-1].trials[0]["search"]["metric_calls"]
    assert last == {"used": search.used, "left": budget - search.used, "budget": budget}


def test_a_budget_too_small_for_the_seed_ends_the_run_before_any_proposal(
    resources: plait.ResourceConfig,
) -> None:
    model = Extract()
    counted = Counted()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=3)
    trainer = trainer_for(model, search, resources)
    with mock({"fast": counted, "reflection": Rewriter()}, strict=True):
        history = trainer.fit_sync()
    assert history.stopped == "budget" and len(history.steps) == 1
    assert search.used == 0 and counted.calls == 4  # the Trainer's initial validation only


# -- merges ----------------------------------------------------------------------------------
class TwoStage(plait.Module):
    """Find the item number (stage ``find``), then say it back (stage ``say``)."""

    def __init__(self) -> None:
        super().__init__()
        self.find = plait.LLMInference(
            "fast", plait.Parameter("Find it.", description="what to find")
        )
        self.say = plait.LLMInference("fast", plait.Parameter("Say it.", description="how to say"))

    def forward(self, text: str) -> Any:
        return self.say(f"Found: {self.find(text)}")


def two_stage_model(request: LLMRequest) -> str:
    """``find`` gets the number under "Find the number."; ``say`` says it back under
    "Say the number.".  Odd items need only ``find`` right, even ones only ``say``."""
    system, text = request.messages[0]["content"], request.prompt_text
    if text.startswith("Found: "):
        found = text.removeprefix("Found: ")
        return found if system == "Say the number." or found.startswith("odd") else "?"
    number = number_in(text)
    if int(number) % 2 == 1:
        return f"odd {number}" if system == "Find the number." else "?"
    return number


def test_two_candidates_that_changed_different_stages_are_merged_stage_by_stage(
    resources: plait.ResourceConfig,
) -> None:
    model = TwoStage()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", merge_every=1)
    # Items 101, 103 (odd) and 102, 104 (even); targets as the merged pipeline answers.
    val = [
        (f"please ship item {n} today", f"odd {n}" if n % 2 else str(n)) for n in range(101, 105)
    ]
    seed = {"find": "Find it.", "say": "Say it."}
    pool = [
        {"id": 0, "values": seed, "scores": [0.0, 0.0, 0.0, 0.0], "origin": "seed"},
        {"id": 1, "values": {**seed, "find": "Find the number."}, "scores": [1.0, 0.0, 1.0, 0.0],
         "origin": "reflection", "parents": [0], "stage": "find"},
        {"id": 2, "values": {**seed, "say": "Say the number."}, "scores": [0.0, 1.0, 0.0, 1.0],
         "origin": "reflection", "parents": [0], "stage": "say"},
    ]  # fmt: skip
    search.load_state_dict({"type": "ReflectiveSearch", "pool": pool, "steps": 3})
    trainer = trainer_for(model, search, resources, val=val, epochs=1, batch_size=4)
    with mock({"fast": two_stage_model}, strict=True):  # no rewriter call: a merge step
        history = trainer.fit_sync()
    report = history.steps[0].trials[0]["search"]
    merge = report["merge"]
    assert merge["parents"] == [1, 2] and merge["ancestor"] == 0
    # Each stage from the candidate that changed it.
    assert merge["values"] == {"find": "Find the number.", "say": "Say the number."}
    assert merge["scores"] == [1.0, 1.0, 1.0, 1.0] and merge["added"] is True
    merged = report["pool"][3]
    assert merged["origin"] == "merge" and merged["parents"] == [1, 2]
    assert merged["ancestor"] == 0 and report["installed"] == 3
    assert report["frontier"] == {"1": 2, "2": 2, "3": 4}  # ties count for every tied one
    assert model.find.system_prompt.value == "Find the number."
    assert model.say.system_prompt.value == "Say the number."
    assert search.merged == [[1, 2]] and "proposal" not in report


def test_a_merge_that_another_candidate_dominates_is_not_added(
    resources: plait.ResourceConfig,
) -> None:
    model = TwoStage()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", merge_every=1)
    val = [(f"please ship item {n} today", "never") for n in range(101, 105)]
    seed = {"find": "Find it.", "say": "Say it."}
    pool = [
        {"id": 0, "values": seed, "scores": [0.0] * 4, "origin": "seed"},
        {"id": 1, "values": {**seed, "find": "Find the number."}, "scores": [1.0, 0.0, 0.0, 0.0],
         "origin": "reflection", "parents": [0]},
        {"id": 2, "values": {**seed, "say": "Say the number."}, "scores": [0.0, 1.0, 0.0, 0.0],
         "origin": "reflection", "parents": [0]},
    ]  # fmt: skip
    search.load_state_dict({"type": "ReflectiveSearch", "pool": pool, "steps": 0})
    trainer = trainer_for(model, search, resources, val=val, epochs=1, batch_size=4)
    with mock({"fast": two_stage_model}, strict=True):
        history = trainer.fit_sync()
    merge = history.steps[0].trials[0]["search"]["merge"]
    assert merge["scores"] == [0.0] * 4 and merge["added"] is False
    assert "scores at least as well on every example" in merge["why"]
    assert len(search.pool) == 3


# -- resuming --------------------------------------------------------------------------------
def test_a_resume_with_another_budget_is_refused_naming_it(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    model = Extract()
    search = ReflectiveSearch(model.parameters(), rewriter="smart", max_metric_calls=30)
    with mock({"fast": Counted(), "reflection": Rewriter()}, strict=True):
        trainer_for(model, search, resources, max_steps=1, checkpoint_dir=tmp_path).fit_sync()
    other = Extract()
    changed = ReflectiveSearch(other.parameters(), rewriter="smart", max_metric_calls=40)
    with pytest.raises(TrainerError, match="max_metric_calls was 30, now 40"):
        trainer_for(other, changed, resources, checkpoint_dir=tmp_path)
    again = Extract()
    same = ReflectiveSearch(again.parameters(), rewriter="smart", max_metric_calls=30)
    resumed = trainer_for(again, same, resources, checkpoint_dir=tmp_path)
    assert resumed.resumed and same.used == search.used and len(same.pool) == len(search.pool)


PIPELINE = textwrap.dedent(
    """
    import json

    import plait


    class Say(plait.Module):
        def __init__(self):
            super().__init__()
            self.llm = plait.LLMInference(
                "fast", system_prompt=plait.Parameter("Say", description="the words to say")
            )

        def forward(self, text):
            return self.llm(text)


    def metric(example, prediction):
        # The fake server answers "[INSTRUCTION] INPUT": the instruction must hold the
        # target word.  The feedback asks the rewriter (the same fake server) for the
        # instruction with the word added, through a reply directive.
        target = example.target
        if target in prediction:
            return 1.0
        instruction = prediction[1 : prediction.index("]")]
        wanted = json.dumps({"new_value": f"{instruction} {target}"})
        return (0.0, f"the answer lacks {target} [[reply:{wanted}]]")
    """
)

WORDS = ["alpha", "beta", "gamma", "delta"]


def reflective_command(directory: Path, base_url: str) -> list[str]:
    directory.mkdir(exist_ok=True)
    (directory / "pipeline.py").write_text(PIPELINE)
    endpoint = {"provider": "openai", "model": "m", "base_url": base_url, "api_key": "sk-test"}
    (directory / "resources.yaml").write_text(json.dumps({"fast": endpoint, "optimizer": endpoint}))
    rows = [{"input": f"w{n}", "target": WORDS[n % 4]} for n in range(8)]
    for name, part in (("train", rows), ("val", rows[:4])):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return [
        sys.executable, "-m", "plait.cli", "train", f"{directory / 'pipeline.py'}:Say",
        "--data", str(directory / "train.jsonl"), "--val", str(directory / "val.jsonl"),
        "--resources", str(directory / "resources.yaml"),
        "--metric", f"{directory / 'pipeline.py'}:metric", "--optimizer", "reflective",
        "--max-metric-calls", "60", "--batch-size", "2", "--out", str(directory / "out"), "-q",
    ]  # fmt: skip


@pytest.mark.parametrize("kill_at", ["first step", "later step"])
def test_plait_train_reflective_killed_mid_run_resumes_paying_for_nothing_twice(
    server: FakeOpenAIServer, tmp_path: Path, kill_at: str
) -> None:
    """The uninterrupted run first; then a run killed (SIGKILL) while a rewriter request
    waits at a gate (in the first step, before the search has saved anything, or in a
    later one), and run again with the same command: it ends with the same parameters
    and the same history, and the server saw no request twice but the one in flight at
    the kill."""
    whole_dir = tmp_path / "whole"
    whole = subprocess.run(
        reflective_command(whole_dir, server.base_url),
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    uninterrupted = server.stats()["requests_total"]
    history = json.loads((whole_dir / "out" / "history.json").read_text())
    assert history["stopped"] == "budget"
    reports = [step["trials"][0]["search"] for step in history["steps"]]
    assert len(reports[-1]["pool"]) >= 3  # the search found candidates step after step
    # The kill comes while the rewriter is asked about the first parent (the seed, in
    # the first step), or about a parent found at a later step: its instruction in
    # place, as the reflection prompt shows it, marks the request.
    later = "Say"
    if kill_at == "later step":
        later = next(
            r["pool"][r["parent"]["id"]]["values"]["llm"]
            for r in reports[1:]
            if r.get("parent") and r["parent"]["id"] > 0 and "instruction" in r["proposal"]
        )
    used = reports[-1]["metric_calls"]["used"]
    assert 60 - 8 < used <= 60 and f"the search used {used} of 60 metric calls" in whole.stderr

    server.reset()
    server.configure(gate_texts={f"<<<\n{later}\n>>>": "reflect"})
    server.close_gate("reflect")
    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        reflective_command(killed_dir, server.base_url),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        server.wait_parked("reflect", 1, timeout=240)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first_paid = server.stats()["requests_total"]
    assert 0 < first_paid < uninterrupted

    server.reset()  # (which closes every gate)
    server.open_gate("reflect")
    resumed = subprocess.run(
        reflective_command(killed_dir, server.base_url),
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert ("at step 0" in resumed.stderr) == (kill_at == "first step")
    second_paid = server.stats()["requests_total"]
    # Only the request in flight at the kill was paid twice.
    assert first_paid + second_paid == uninterrupted + 1
    got_total = json.loads((killed_dir / "out" / "history.json").read_text())["spend"]["total"][
        "requests"
    ]
    want_total = json.loads((whole_dir / "out" / "history.json").read_text())["spend"]["total"][
        "requests"
    ]
    for name in ("parameters.json", "history.json"):
        got = json.loads((killed_dir / "out" / name).read_text())
        want = json.loads((whole_dir / "out" / name).read_text())
        if name == "history.json":  # what each process spent differs, by design
            for history in (got, want):
                assert history.pop("spend")["total"]["requests"] > 0
                for record in history["steps"]:
                    del record["calls"], record["tokens"], record["spend"]
                    for trial in record["trials"]:
                        del trial["spend"]
            # What was paid in all: both processes, the request in flight twice.
            assert got_total == first_paid + second_paid and want_total == uninterrupted
        assert got == want, name

    changed = reflective_command(killed_dir, server.base_url)
    changed[changed.index("60")] = "80"
    refused = subprocess.run(changed, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "max_metric_calls was 60, now 80" in refused.stderr


def test_plait_train_reflective_usage_errors_name_the_fix(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    command = reflective_command(tmp_path, server.base_url)
    val_at = command.index("--val")
    no_val = command[:val_at] + command[val_at + 2 :]
    done = plait_cli(*no_val[3:])
    assert done.returncode == 2 and "give --val" in done.stderr
    stray = [*command[3:], "--optimizer", "sfa"]
    done = plait_cli(*stray)
    assert done.returncode == 2 and "no other --optimizer" in done.stderr
    budget_at = command.index("--optimizer")
    no_search = command[3:budget_at] + command[budget_at + 2 :]
    done = plait_cli(*no_search)
    assert done.returncode == 2
    assert "--max-metric-calls goes with --optimizer reflective" in done.stderr
    assert server.stats()["requests_total"] == 0
