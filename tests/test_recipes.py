"""`RecipeSearch` (``plait train --optimizer auto``): the recipe chosen per task by
cross-validation, the label method saved with the parameters, the gate following the
search's verdict, the call budget, and a killed search resumed without paying twice.

The in-process tests answer with `mock` functions of the request, so the best recipe
is known: a model that answers right only when it is shown a demonstration like its
input (a pool chosen per input), or only with the ``calibrated`` label method.  The
command-line tests run real ``plait`` processes on the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest

import plait
from plait.demos import is_pool
from plait.handlers import mock
from plait.learning import ExactMatch, RecipeSearch, Trainer
from plait.learning.spend import current_phase
from plait.learning.state import load_parameters, save_parameters
from plait.providers import LLMRequest
from tests.conftest import plait_cli
from tests.test_serve import Served, post

ROOT = Path(__file__).resolve().parent.parent
Label = Literal["billing", "shipping"]
BILLING = ("charged", "refund", "invoice")
SHIPPING = ("parcel", "tracking", "courier")
ORDINALS = ("first", "second", "third")


class Classify(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.classify = plait.LLMInference(
            "fast", "Is the message about billing or shipping?", demos=[], response_format=Label
        )

    def forward(self, message: str) -> Any:
        return self.classify(message)


def dataset() -> list[tuple[str, str]]:
    """Messages whose one telling word says their label; three of each word."""
    return [
        (f"My {word} question, the {nth} one.", "billing" if word in BILLING else "shipping")
        for nth in ORDINALS
        for word in (*BILLING, *SHIPPING)
    ]


def shown(request: LLMRequest) -> tuple[list[str], list[str]]:
    """The demonstrations a request shows: their inputs and their answers."""
    turns = request.messages[:-1]
    return (
        [m["content"] for m in turns if m["role"] == "user"],
        [m["content"] for m in turns if m["role"] == "assistant"],
    )


def search_report(history: Any) -> dict[str, Any]:
    report: dict[str, Any] = history.steps[0].trials[0]["search"]
    return report


# -- the label method is a value saved with the parameters -----------------------------------
def test_a_label_method_is_saved_in_the_parameters_file_and_loaded_back(tmp_path: Path) -> None:
    """Was: the label method was a constructor option only, so a method chosen by
    training was lost in parameters.json and --parameters ran the code's."""
    trained = Classify()
    trained.load_state_dict({"classify.label_method": "calibrated"})
    assert trained.classify.label_method == "calibrated"
    save_parameters(trained, tmp_path / "parameters.json")
    saved = json.loads((tmp_path / "parameters.json").read_text(encoding="utf-8"))
    assert saved["classify.label_method"] == "calibrated"

    fresh = Classify()
    assert fresh.classify.label_method is None
    assert load_parameters(fresh, tmp_path / "parameters.json") == []
    assert fresh.classify.label_method == "calibrated"

    # A file written before the method was saved still loads, leaving the code's method.
    del saved["classify.label_method"]
    (tmp_path / "older.json").write_text(json.dumps(saved), encoding="utf-8")
    older = Classify()
    assert load_parameters(older, tmp_path / "older.json") == ["classify.label_method"]
    assert older.classify.label_method is None
    with pytest.raises(ValueError, match="label_method must be one of grammar"):
        older.load_state_dict({"classify.label_method": "vote"})


def test_the_method_loaded_is_the_one_the_request_carries() -> None:
    seen: list[str | None] = []

    def model(request: LLMRequest) -> str:
        seen.append(request.label_method)
        return "billing"

    pipeline = Classify()
    pipeline.load_state_dict({"classify.label_method": "grammar"})
    with mock({"fast": model}):
        assert pipeline.run_sync("My parcel.") == "billing"
    assert seen == ["grammar"]


# -- the choice ------------------------------------------------------------------------------
def fit(model: Any, search: RecipeSearch, answer: Any) -> Any:
    data = dataset()
    trainer = Trainer(model, ExactMatch(), search, data[:12], data[12:], max_steps=1, batch_size=4)
    with mock({"fast": answer}):
        return trainer.fit_sync()


def test_it_chooses_the_recipe_known_to_be_best() -> None:
    """Right only when calibrated and shown the pair most like the input (a pool ranked
    by BM25): that is the recipe chosen, with the fewest pairs (k ties), and it is
    installed fitted on every labelled pair."""

    def answer(request: LLMRequest) -> str:
        _, answers = shown(request)
        if request.label_method != "calibrated" or not answers:
            return "billing"
        return answers[-1]

    model = Classify()
    search = RecipeSearch(model.parameters(), folds=3, k_choices=(2, 4))
    history = fit(model, search, answer)
    report = search_report(history)
    assert report["chosen"] == report["best"] == "bm25 k=2 + calibrated"
    assert "beats with support the plain list k=4 and every simpler recipe" in report["why"]
    # Every recipe's score on every example, and its place in the simplicity order.
    named = {r["name"]: r for r in report["recipes"]}
    assert named["in place"]["mean"] == pytest.approx(0.5)
    assert named["bm25 k=2 + calibrated"]["scores"] == [1.0] * 18
    assert [r["simplicity"] for r in report["recipes"]] == list(range(len(report["recipes"])))
    assert report["label_methods"]["tried"] == ["grammar", "calibrated"]
    assert model.classify.label_method == "calibrated"
    demos = model.classify.demos.value
    assert is_pool(demos) and demos["k"] == 2 and len(demos["pool"]) == 18
    # The gate followed the search's verdict on every example, not the validation set
    # (now among the demonstrations).
    trial = history.steps[0].trials[0]
    assert trial["kept"] is True
    assert trial["decided_by"].startswith("3-fold cross-validation")
    assert "1.000 against 0.500" in trial["decided_by"]


def zebra_dataset() -> dict[str, str]:
    """`dataset`, with two messages only the nearest demonstration can tell."""
    targets = dict(dataset())
    targets["A zebra crossing fee."] = "billing"
    targets["The zebra fee again."] = "billing"
    return targets


def search_zebras(model: Classify, targets: dict[str, str], answer: Any) -> dict[str, Any]:
    """`RecipeSearch` (lists of 2 and 4, BM25 pools of 2; 4 folds; 90%) on ``targets``
    answered by ``answer``: the search's report."""
    data = list(targets.items())
    search = RecipeSearch(
        model.parameters(), folds=4, k_choices=(2,), label_methods=(), seed=4, confidence=0.9
    )
    trainer = Trainer(model, ExactMatch(), search, data[:14], data[14:], max_steps=1)
    with mock({"fast": answer}):
        history = trainer.fit_sync()
    return search_report(history)


def test_candidate_lists_are_halved_and_the_last_are_scored_on_all_they_do_not_hold() -> None:
    """Sixteen candidate lists fit in the budget because most are dropped after a
    few examples: each rung keeps the better half on more folds, the lists of the
    last rung are scored on every example they hold none of, and the list
    installed is one of them."""
    targets = zebra_dataset()

    def answer(request: LLMRequest) -> str:
        text = request.messages[-1]["content"]
        _, answers = shown(request)
        return targets[text] if answers and "zebra" not in text else "shipping"

    report = search_zebras(Classify(), targets, answer)
    lists = report["lists"]
    assert lists["searched"] and lists["candidates"] == 16
    alive = [len(rung["means"]) for rung in lists["rungs"]]
    assert alive[0] == 16 and alive == sorted(alive, reverse=True) and alive[-1] < 16
    assert lists["rungs"][0]["folds"] == 2  # never one fold of a few examples
    assert lists["rungs"][-1]["folds"] == len(report["folds"])
    last = [int(j) for j in lists["rungs"][-1]["means"]]
    n = report["examples"]
    for j in range(16):
        everything = n - len(lists["holds"][j])
        assert (lists["scored"][j] == everything) == (j in last) or j in lists["chosen_per_fold"]
    assert lists["best"] in last
    assert report["budget"]["used"] <= report["budget"]["max_calls"]


def test_a_tie_goes_to_the_plain_list() -> None:
    """A pool wins an example or two of 20 more than the plain list of four pairs
    (those only the nearest pair answers), which a paired bootstrap at 90% cannot
    tell from luck: the plain list, what `BootstrapFewShot` installs, is chosen over
    the pool, and the history says why."""
    targets = zebra_dataset()

    def answer(request: LLMRequest) -> str:
        inputs, answers = shown(request)
        text = request.messages[-1]["content"]
        if not answers:
            return "shipping"
        if "zebra" in text:  # only the nearest pair tells this one
            return targets[text] if "zebra" in inputs[-1] else "shipping"
        return targets[text]

    model = Classify()
    report = search_zebras(model, targets, answer)
    assert report["best"] == "bm25 k=2"
    assert report["chosen"] == "list k=4"
    assert "the tie goes to the plain list, what BootstrapFewShot installs" in report["why"]
    versus = {c["recipe"]: c for c in report["comparisons"]}
    plain = versus["list k=4"]
    assert plain["best_wins"] in (1, 2) and plain["best_losses"] == 0
    assert plain["interval"][0] <= 0 < plain["best_minus_this"]
    assert isinstance(model.classify.demos.value, list) and len(model.classify.demos.value) == 4


def test_a_tie_goes_to_the_simpler_recipe_when_the_plain_list_is_beaten() -> None:
    """A model that four demonstrations confuse: the plain list of four is beaten with
    support, and the pool's two-example gain over the list of two is not supported,
    so the simpler list of two is chosen."""
    targets = zebra_dataset()

    def answer(request: LLMRequest) -> str:
        inputs, answers = shown(request)
        text = request.messages[-1]["content"]
        if not answers or len(answers) > 2:
            return "shipping" if targets[text] == "billing" else "billing"
        if "zebra" in text:
            return targets[text] if "zebra" in inputs[-1] else "shipping"
        return targets[text]

    model = Classify()
    report = search_zebras(model, targets, answer)
    versus = {c["recipe"]: c for c in report["comparisons"]}
    assert versus["list k=4"]["beaten_with_support"]
    assert report["best"] == "bm25 k=2"
    assert report["chosen"] == "list k=2"
    assert "the tie goes to the simpler recipe" in report["why"]
    assert isinstance(model.classify.demos.value, list) and len(model.classify.demos.value) == 2


def test_the_budget_is_honoured_and_reported() -> None:
    """Every request the search makes is counted; the most complex recipes are left out
    to stay within it, the baselines never."""
    counted: list[str | None] = []
    phases: list[str | None] = []

    def answer(request: LLMRequest) -> str:
        phases.append(current_phase())
        if current_phase() in ("evaluating", "proposing"):
            counted.append(current_phase())
        _, answers = shown(request)
        return answers[-1] if answers else "billing"

    model = Classify()
    search = RecipeSearch(
        model.parameters(), max_calls=60, folds=3, k_choices=(2, 4, 8), label_methods=("grammar",)
    )
    history = fit(model, search, answer)
    report = search_report(history)
    assert report["budget"]["max_calls"] == 60
    # Validation is scored before the first step, and after the search the gate scores
    # there whatever it installed; the Trainer runs no minibatch the search would not read.
    val_size = len(dataset()) - 12
    gate = val_size if history.steps[0].trials[0]["tried"] else 0
    assert report["budget"]["used"] == len(counted) - val_size - gate == search.used <= 60
    assert "training" not in phases
    assert history.steps[0].train_score is None
    assert report["not_tried"], "a budget this small leaves recipes out"
    assert {n["reason"] for n in report["not_tried"]} == {"over the call budget"}
    finalists = {r["name"] for r in report["recipes"] if r["finalist"]}
    assert {"in place", "list k=4"} <= finalists


def test_bad_settings_are_refused_naming_them() -> None:
    model = Classify()
    params = list(model.parameters())
    with pytest.raises(ValueError, match="folds must be an integer of at least 2"):
        RecipeSearch(params, folds=1)
    with pytest.raises(ValueError, match="max_calls must be a positive integer"):
        RecipeSearch(params, max_calls=0)
    with pytest.raises(ValueError, match="label_methods holds 'vote'"):
        RecipeSearch(params, label_methods=("vote",))


# -- the path a user types -------------------------------------------------------------------
PIPELINE = """
from typing import Literal

import plait


class Triage(plait.Module):
    def __init__(self):
        super().__init__()
        self.classify = plait.LLMInference(
            "fast",
            plait.Parameter(
                "Classify the message.",
                description='Labelling. [[reply:{"new_value": "Classify it."}]]',
            ),
            response_format=Literal["billing", "shipping", "technical"],
            demos=[],
            temperature=0,
        )

    def forward(self, message):
        return self.classify(message)
"""

#: Each message carries its label's first token as the likeliest alternative: a label
#: scored by log-probability is right, the constrained reply (the fake server's first
#: label for a schema) is "billing" whatever the message.
TOP = {"billing": "bill -0.1|ship -2|tech -3", "shipping": "ship -0.1|bill -2|tech -3"}
TOP["technical"] = "tech -0.1|bill -2|ship -3"
MESSAGES = [
    ("I was charged twice.", "billing"),
    ("My parcel is late.", "shipping"),
    ("The app crashes.", "technical"),
    ("Refund my invoice.", "billing"),
    ("Where is my parcel?", "shipping"),
    ("Login fails.", "technical"),
    ("A second payment.", "billing"),
    ("The courier lost it.", "shipping"),
    ("The screen is blank.", "technical"),
    ("Charged for nothing.", "billing"),
    ("Tracking is stuck.", "shipping"),
    ("It crashes on start.", "technical"),
]


def rows(pairs: list[tuple[str, str]], *, target: bool = True) -> str:
    return "".join(
        json.dumps({"message": f"{m} [[top:{TOP[t]}]]", **({"target": t} if target else {})}) + "\n"
        for m, t in pairs
    )


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    (tmp_path / "triage.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    (tmp_path / "resources.toml").write_text(
        "".join(
            f'[resources.{alias}]\nprovider = "openai"\nmodel = "m"\n'
            f'base_url = "{server.base_url}"\napi_key = "sk-test"\n'
            for alias in ("fast", "optimizer")
        ),
        encoding="utf-8",
    )
    (tmp_path / "train.jsonl").write_text(rows(MESSAGES[:6]), encoding="utf-8")
    (tmp_path / "val.jsonl").write_text(rows(MESSAGES[6:9]), encoding="utf-8")
    (tmp_path / "test.jsonl").write_text(rows(MESSAGES[9:]), encoding="utf-8")
    (tmp_path / "messages.jsonl").write_text(rows(MESSAGES[9:], target=False), encoding="utf-8")
    return tmp_path


def plait_in(project: Path, *args: str) -> Any:
    return plait_cli(*args, "--resources", "resources.toml", cwd=project)


TRAIN = ("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "val.jsonl")


def test_the_chosen_label_method_goes_from_train_to_eval_run_and_serve(
    project: Path, server: Any
) -> None:
    """``plait train --optimizer auto`` chooses log-probability scoring (the only method
    that answers right here), saves it in parameters.json, and ``plait eval``,
    ``plait run`` and ``plait serve`` with ``--parameters`` send their label requests
    by it."""
    train = plait_in(
        project,
        *TRAIN,
        *("--test", "test.jsonl", "--optimizer", "auto", "--folds", "3", "--loss", "exact"),
        *("--candidates", "3", "--out", "runs/triage", "-q"),
    )
    assert train.returncode == 0, train.stderr
    parameters = json.loads((project / "runs/triage/parameters.json").read_text())
    assert parameters["classify.label_method"] == "logprob"
    history = json.loads((project / "runs/triage/history.json").read_text())
    report = history["steps"][0]["trials"][0]["search"]
    assert report["chosen"] == "in place + logprob"
    assert report["label_methods"]["tried"] == ["logprob", "calibrated"]
    assert report["lists"]["wanted"] == 3  # --candidates: the lists searched
    assert history["final_test_score"] == 1.0 > history["initial_test_score"]

    server.reset()
    evaluated = plait_in(
        project,
        *("eval", "triage.py:Triage", "--data", "test.jsonl", "--loss", "exact", "-q"),
        *("--parameters", "runs/triage/parameters.json", "--output", "scored.jsonl"),
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "mean 1.0000 over 3 example(s)" in evaluated.stdout
    ran = plait_in(
        project,
        *("run", "triage.py:Triage", "--input", "messages.jsonl"),
        *("--parameters", "runs/triage/parameters.json", "--output", "answers.jsonl"),
    )
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in (project / "answers.jsonl").read_text().splitlines()]
    outputs = [row["output"] for row in sorted(answers, key=lambda row: row["index"])]
    assert outputs == [t for _, t in MESSAGES[9:]]
    message, target = MESSAGES[9]
    served = Served(
        project / "serve.log",
        f"{project / 'triage.py'}:Triage",
        *("--resources", project / "resources.toml", "--jobs-dir", project / "jobs"),
        *("--parameters", project / "runs/triage/parameters.json"),
    )
    try:
        assert asyncio.run(invoke(served, f"{message} [[top:{TOP[target]}]]")) == (
            200,
            {"output": target},
        )
    finally:
        served.stop()
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    # Scored by log-probability on the wire: one token and its alternatives, no schema.
    assert len(bodies) == 3 + 3 + 1  # eval, run, serve
    assert all(b.get("logprobs") is True and "response_format" not in b for b in bodies)


async def invoke(served: Served, message: str) -> tuple[int, Any]:
    """``POST /invoke`` to ``plait serve`` once it is ready."""
    async with aiohttp.ClientSession() as session:
        url = await served.ready(session)
        return await post(session, f"{url}/invoke", {"message": message})


def _train(project: Path, argv: list[str], *, background: bool = False) -> Any:
    """``plait train`` with ``argv`` in ``project``: finished, or started in the background."""
    full = [sys.executable, "-m", "plait.cli", *argv]
    if background:
        return subprocess.Popen(
            full, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(full, cwd=project, capture_output=True, text=True, timeout=300)


def _assert_killed_chose_as_whole(project: Path) -> None:
    """The run killed and resumed (``killed/``) installed what the uninterrupted one
    (``whole/``) did, on the same evidence."""
    got = json.loads((project / "killed/parameters.json").read_text(encoding="utf-8"))
    want = json.loads((project / "whole/parameters.json").read_text(encoding="utf-8"))
    assert got == want
    reports = [
        json.loads((project / f"{out}/history.json").read_text())["steps"][0]["trials"][0]
        for out in ("killed", "whole")
    ]
    for key in ("chosen", "recipes", "comparisons", "budget"):
        assert reports[0]["search"][key] == reports[1]["search"][key]


def test_a_killed_search_resumes_paying_only_for_the_call_in_flight(
    project: Path, server: Any
) -> None:
    """kill -9 while the instruction proposal waits at the gate (every example already
    run once): the rerun of the same command is answered every call the killed one
    completed, pays again only the proposal in flight, and ends with the choice an
    uninterrupted run makes.  A rerun with another budget or other data is refused,
    naming what changed."""
    gate = "propose"
    argv = [*TRAIN, "--optimizer", "auto", "--folds", "3", "--instructions", "1"]
    argv += ["--loss", "exact", "--resources", "resources.toml", "-q"]

    def run(out: str, *extra: str, background: bool = False) -> Any:
        return _train(project, [*argv, "--out", out, *extra], background=background)

    server.configure(gate_texts={"Labelling.": gate})
    server.close_gate(gate)
    proc = run("killed", background=True)
    try:
        server.wait_parked(gate, 1, timeout=240)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first_paid = server.stats()["requests_total"]
    assert first_paid > 9  # the initial validation, every example once

    refused = run("killed", "--max-calls", "500")
    assert refused.returncode == 2
    assert "max_calls was 600, now 500" in refused.stderr
    (project / "val.jsonl").write_text(rows(MESSAGES[6:8]), encoding="utf-8")
    refused = run("killed")
    assert refused.returncode == 2 and "the validation data (--val)" in refused.stderr
    (project / "val.jsonl").write_text(rows(MESSAGES[6:9]), encoding="utf-8")
    assert server.stats()["requests_total"] == first_paid  # refused before any call

    server.reset()  # (which closes every gate)
    server.open_gate(gate)
    resumed = run("killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    second_paid = server.stats()["requests_total"]

    server.reset()
    server.open_gate(gate)
    whole = run("whole")
    assert whole.returncode == 0, whole.stderr
    uninterrupted = server.stats()["requests_total"]

    assert first_paid + second_paid == uninterrupted + 1
    _assert_killed_chose_as_whole(project)


@pytest.mark.parametrize("method", ["logprob", "calibrated"])
def test_a_search_killed_while_it_scores_recipes_resumes_paying_at_most_one_call_again(
    project: Path, server: Any, method: str
) -> None:
    """kill -9 half-way through the scoring of the recipes, one call in flight at most
    (the alias takes one at a time): the rerun pays only for what the killed run had not
    completed (and at most once more for the call in flight, with the prior it may have
    been measuring), and chooses as an uninterrupted run does.  A calibrated call's
    prior comes back with the stored replies, so it is not measured again."""
    from tests.test_training_trust import _wait_logged

    text = (project / "resources.toml").read_text(encoding="utf-8")
    (project / "serial.toml").write_text(
        text.replace('api_key = "sk-test"\n', 'api_key = "sk-test"\nmax_concurrent = 1\n', 1),
        encoding="utf-8",
    )
    argv = [*TRAIN, "--optimizer", "auto", "--folds", "3", "--label-methods", method]
    argv += ["--loss", "exact", "--resources", "serial.toml", "-q"]

    def run(out: str, *, background: bool = False) -> Any:
        return _train(project, [*argv, "--out", out], background=background)

    whole = run("whole")
    assert whole.returncode == 0, whole.stderr
    uninterrupted = server.stats()["requests_total"]
    # The initial validation (3) and every example once (9) come first, the recipes'
    # scoring after, and the gate's validation (3) last.
    first_scoring = 3 + 9
    assert uninterrupted > first_scoring + 3 + 10
    half_way = first_scoring + (uninterrupted - first_scoring - 3) // 2

    server.reset()
    proc = run("killed", background=True)
    try:
        _wait_logged(project / "killed" / "checkpoint", half_way, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first_paid = server.stats()["requests_total"]
    assert first_scoring < first_paid < uninterrupted

    server.reset()
    resumed = run("killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    second_paid = server.stats()["requests_total"]

    in_flight = 2 if method == "calibrated" else 1  # the call, and the prior it measured
    assert uninterrupted <= first_paid + second_paid <= uninterrupted + in_flight
    _assert_killed_chose_as_whole(project)


def test_auto_options_are_checked_before_any_call(project: Path, server: Any) -> None:
    for extra, message in (
        (["--embed", "nowhere"], "--embed nowhere: the resources do not configure that alias"),
        (["--optimizer", "sfa"], "--optimizer auto chooses the whole recipe in one step"),
        (["--refit"], "--refit goes with bootstrap or search"),
        (["--k-choices", "2,x"], "--k-choices takes comma-separated whole numbers"),
        (["--label-methods", "vote"], "label_methods holds 'vote'"),
        (["--teacher-alias", "fast"], "--teacher-alias goes with --optimizer bootstrap"),
    ):
        refused = plait_in(project, *TRAIN, "--optimizer", "auto", *extra, "--out", "runs/x")
        assert refused.returncode == 2, refused.stderr
        assert message in refused.stderr
    refused = plait_in(project, *TRAIN, "--optimizer", "bootstrap", "--max-calls", "9")
    assert refused.returncode == 2 and "--max-calls go(es) with --optimizer auto" in refused.stderr
    assert server.stats()["requests_total"] == 0


def test_a_tight_budget_keeps_every_kind_of_demonstrations_before_other_methods() -> None:
    """Was: recipes were left out most complex first in the simplicity order, where the
    kind of demonstrations outranks the label method, so a budget too small for every
    recipe dropped every pool before any label-method variant of a fixed list (on the
    two-stage benchmark task, the pools were the recipe that works). A pool chosen per
    input, right here, must still be tried."""

    def answer(request: LLMRequest) -> str:
        inputs, answers = shown(request)
        asked = request.messages[-1]["content"].split()[1]
        # Right only when shown a pair with the same telling word: what BM25 finds.
        for text, label in zip(inputs, answers, strict=True):
            if text.split()[1] == asked:
                return label
        return "billing"

    model = Classify()
    search = RecipeSearch(
        model.parameters(),
        max_calls=150,
        folds=3,
        k_choices=(2, 4),
        label_methods=("grammar", "logprob", "calibrated"),
    )
    history = fit(model, search, answer)
    report = search_report(history)
    tried = {r["name"] for r in report["recipes"]}
    dropped = {n["name"] for n in report["not_tried"]}
    assert dropped, "a budget this small leaves recipes out"
    assert "bm25 k=2" in tried and "bm25 k=4" in tried
    # What goes first is the label-method variants.
    assert all(" + " in name for name in dropped), dropped
    assert report["chosen"].startswith("bm25")


@pytest.mark.parametrize("lists", [20, 0])
def test_the_fixed_list_installed_is_the_one_cross_validation_scored_best(lists: int) -> None:
    """The model answers billing only when one pair (an input like no other, so no
    pool ranks it near anything) is among those shown: the lists that hold it win.
    The list installed is such a list, not a new draw nobody scored: the candidate
    list that scored best on the examples it does not hold (or, with ``lists=0``, the
    list of the fold that scored best)."""
    key = "Qwerty zxcv."

    def answer(request: LLMRequest) -> str:
        inputs, _ = shown(request)
        return targets[request.messages[-1]["content"]] if key in inputs else "shipping"

    targets = {key: "billing", **dict(dataset())}
    data = list(targets.items())
    model = Classify()
    search = RecipeSearch(
        model.parameters(),
        max_calls=2000,
        folds=4,
        k_choices=(4,),
        label_methods=(),
        lists=lists,
        seed=0,
    )
    trainer = Trainer(model, ExactMatch(), search, data[:14], data[14:], max_steps=1)
    with mock({"fast": answer}):
        history = trainer.fit_sync()
    report = search_report(history)
    assert report["chosen"] == "list k=4"
    installed = model.classify.demos.value
    assert isinstance(installed, list) and len(installed) == 4
    assert key in [pair["input"] for pair in installed]
    with mock({"fast": answer}):
        assert model.run_sync("My refund question, the first one.") == "billing"
    if lists:
        searched = report["lists"]
        assert searched["searched"] and searched["candidates"] == lists
        # The later half are the earlier half reversed: the same pairs, the other order.
        assert searched["reversed"] == [[j, j - lists // 2] for j in range(lists // 2, lists)]
        for j, source in searched["reversed"]:
            assert searched["holds"][j] == searched["holds"][source]
        means = searched["means"]
        assert min(means) < max(means)  # some candidates hold the pair, some not
        best = means.index(max(means))
        assert searched["best"] == best
        assert report["installed"].startswith(f"candidate list {best + 1} of {lists},")
        return
    assert report["lists"] == {"k": 4, "wanted": 0, "searched": False, "why": "lists=0"}
    fold_scores = {r["name"]: r["fold_means"] for r in report["recipes"]}["list k=4"]
    assert min(fold_scores) < max(fold_scores)  # some folds' lists hold the pair, some not
    best = fold_scores.index(max(fold_scores)) + 1
    assert report["installed"].startswith(f"the list of fold {best},")


def test_no_example_is_ever_answered_with_its_own_pair_shown() -> None:
    """Cross-validation is honest only if no run the search scores shows the example's
    own pair: every recipe's draws, every pool and every candidate list of the plain
    recipe leave it out; and the plain list answering a fold is a candidate holding
    none of that fold's examples (the choice among candidates is cross-validated too)."""
    searching: list[bool] = []
    leaks: list[str] = []
    asked_during_search: list[str] = []

    class Watched(RecipeSearch):
        async def step(self) -> dict[str, Any]:
            searching.append(True)
            try:
                return await super().step()
            finally:
                searching.clear()

    def answer(request: LLMRequest) -> str:
        inputs, answers = shown(request)
        asked = request.messages[-1]["content"]
        if searching:
            asked_during_search.append(asked)
            if asked in inputs:
                leaks.append(asked)
        return answers[-1] if answers else "billing"

    model = Classify()
    search = Watched(model.parameters(), max_calls=400, folds=3, lists=4, label_methods=())
    history = fit(model, search, answer)
    report = search_report(history)
    assert report["lists"]["searched"] and report["lists"]["candidates"] == 4
    assert len(asked_during_search) == search.used  # every request was counted
    assert leaks == []
    for fold, j in zip(report["folds"], report["lists"]["chosen_per_fold"], strict=True):
        assert not set(fold) & set(report["lists"]["holds"][j])
    # The plain list was scored on every example without a run of its own.
    plain = {r["name"]: r for r in report["recipes"]}["list k=4"]
    assert None not in plain["scores"]


def test_with_labels_every_label_weighs_the_same_so_the_majority_answer_does_not_tie() -> None:
    """Was: recipes were compared by plain accuracy, so on a few dozen examples with
    more of one label, a model that answers that label to everything (the values in
    place) scored about as well as a list that teaches it the other label (right on
    every shipping message, on a third of the billing ones), and could be kept.
    Every label now weighs the same (balanced accuracy), unless
    ``balance_labels=False``."""
    key = "Qwerty zxcv."
    billing = [(f"My {w} question, the {n} one.", "billing") for w in BILLING for n in ORDINALS]
    shipping = [
        (f"My {w} question, the {n} one.", "shipping") for w in SHIPPING[:2] for n in ORDINALS
    ]
    data = [(key, "billing"), *billing[:8], *shipping[:4], *billing[8:], *shipping[4:]]

    def answer(request: LLMRequest) -> str:
        inputs, _ = shown(request)
        asked = request.messages[-1]["content"]
        if key not in inputs:
            return "billing"
        if any(word in asked for word in SHIPPING):
            return "shipping"
        return "billing" if "first" in asked else "shipping"

    def train(balance_labels: bool) -> tuple[dict[str, Any], Classify]:
        model = Classify()
        search = RecipeSearch(
            model.parameters(),
            folds=3,
            k_choices=(4,),
            label_methods=(),
            lists=20,
            balance_labels=balance_labels,
        )
        trainer = Trainer(model, ExactMatch(), search, data[:13], data[13:], max_steps=1)
        with mock({"fast": answer}):
            return search_report(trainer.fit_sync()), model

    plain, _ = train(balance_labels=False)
    assert plain["statistic"].startswith("mean")
    in_place = {r["name"]: r for r in plain["recipes"]}["in place"]
    assert in_place["mean"] == pytest.approx(10 / 16)  # "billing" to all: the majority

    report, model = train(balance_labels=True)
    assert report["statistic"].startswith("balanced accuracy")
    assert report["chosen"] == "list k=4"
    recipes = {r["name"]: r for r in report["recipes"]}
    assert recipes["list k=4"]["mean"] > recipes["in place"]["mean"] == pytest.approx(0.5)
    assert key in [pair["input"] for pair in model.classify.demos.value]
    with mock({"fast": answer}):
        assert model.run_sync("My parcel question, the second one.") == "shipping"
