"""The learning path as a user types it: ``plait train`` writes ``parameters.json``, and
``plait eval --parameters`` and ``plait run --parameters`` read back whatever it wrote,
for every ``--demos`` and ``--optimizer`` choice the command offers.

Every command is a real ``plait`` process on the fake OpenAI server, set to answer a
request that shows demonstrations as the one next to its input was answered (the one
plait chose as most like the input), so an output shows which demonstrations were
chosen for it; without demonstrations it echoes ``[system prompt] input``.  Each
output can so be predicted from ``parameters.json`` alone, and compared with what the
training run's own pipeline scored in memory (its held-out test score) and gave.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.demos import choose_demos, is_pool, knn_demos
from plait.learning import BootstrapFewShot, Contains
from plait.learning.state import (
    ParameterFileError,
    ParameterState,
    load_parameters,
    save_parameters,
    snapshot,
)
from plait.learning.trainer import Trainer
from plait.parameter import ParameterValueError
from plait.target import Target
from tests.conftest import plait_cli

#: What the fake server answers the optimizers' rewrite requests: those requests show
#: the parameter's description, and the server answers a request holding
#: ``[[reply:TEXT]]`` with TEXT.  So an instruction rewrite is "Answer billing.".
REWRITE = '[[reply:{"new_value": "Answer billing."}]]'

PIPELINE = f"""
import plait


class Triage(plait.Module):
    def __init__(self):
        super().__init__()
        self.classify = plait.LLMInference(
            "fast",
            plait.Parameter("Classify the message.", description='the task {REWRITE}'),
            demos=[],
            temperature=0,
        )

    def forward(self, message):
        return self.classify(message)
"""

TRAIN = [
    ("I was charged twice this month.", "billing"),
    ("I was charged for a plan I cancelled.", "billing"),
    ("My parcel has not arrived yet.", "shipping"),
    ("The parcel went to the wrong address.", "shipping"),
    ("The app crashes when I log in.", "technical"),
    ("The app crashes after the update.", "technical"),
]
VAL = [
    ("Why was I charged again?", "billing"),
    ("Where is my parcel?", "shipping"),
    ("The app crashes every morning.", "technical"),
]
TEST = [
    ("I was charged two times.", "billing"),
    ("My parcel is lost.", "shipping"),
    ("The app crashes on my phone.", "technical"),
]


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def examples(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"message": message, "target": target} for message, target in pairs]


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    """A user's folder: the pipeline, the resources, the data; the server answering as
    its demonstrations do."""
    server.configure(answer_like_demos=True)
    (tmp_path / "triage.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    endpoint = {"provider": "openai", "model": "m", "base_url": server.base_url}
    aliases = ("fast", "optimizer", "embedder")
    (tmp_path / "resources.toml").write_text(
        "".join(
            f'[resources.{alias}]\nprovider = "openai"\nmodel = "m"\n'
            f'base_url = "{endpoint["base_url"]}"\napi_key = "sk-test"\n'
            for alias in aliases
        ),
        encoding="utf-8",
    )
    write_jsonl(tmp_path / "train.jsonl", examples(TRAIN))
    write_jsonl(tmp_path / "val.jsonl", examples(VAL))
    write_jsonl(tmp_path / "test.jsonl", examples(TEST))
    write_jsonl(tmp_path / "messages.jsonl", [{"message": m} for m, _ in TEST])
    return tmp_path


def plait_in(project: Path, *args: str) -> Any:
    """``plait ARGS`` in the project's folder, with its resources (as its user would)."""
    return plait_cli(*args, "--resources", "resources.toml", cwd=project)


def expected_output(parameters: dict[str, Any], message: str) -> str:
    """What the fake server answers the pipeline with these values: the answer of the
    demonstration shown next to the input (the one most like it, for a pool), else the
    echo of the system prompt and the input."""
    demos = choose_demos(parameters["classify.demos"], message)
    if demos:
        return str(demos[-1]["output"])
    return f"[{parameters['classify.system_prompt']}] {message}"


def triage() -> Any:
    """The pipeline of the project's triage.py, built in this process."""
    namespace: dict[str, Any] = {}
    exec(textwrap.dedent(PIPELINE), namespace)
    return namespace["Triage"]()


#: (--demos, --optimizer(s), other arguments): every choice of both, and the options
#: that change what is saved (instructions, refit, embeddings, two optimizers).
CASES = [
    ("list", ["bootstrap"], []),
    ("knn", ["bootstrap"], []),
    ("list", ["search"], []),
    ("knn", ["search"], []),
    ("list", ["sfa"], []),
    ("knn", ["sfa"], []),
    ("list", ["textgrad"], []),
    ("knn", ["textgrad"], []),
    ("knn", ["search"], ["--instructions", "2"]),
    ("knn", ["bootstrap"], ["--refit"]),
    ("knn", ["bootstrap"], ["--embed", "embedder"]),
    ("list", ["bootstrap", "sfa"], []),
    ("list", ["reflective"], ["--max-metric-calls", "30"]),
    ("knn", ["reflective"], []),
    ("list", ["auto"], ["--folds", "3"]),
    ("knn", ["auto"], ["--folds", "3"]),
]


def test_the_cases_cover_every_choice_plait_train_offers() -> None:
    from plait.cli.train import build_parser

    choices = {action.dest: set(action.choices or ()) for action in build_parser()._actions}
    assert {demos for demos, _, _ in CASES} == choices["demos"]
    assert {name for _, names, _ in CASES for name in names} == choices["optimizer"]


@pytest.mark.parametrize(
    ("demos", "optimizers", "extra"),
    CASES,
    ids=[
        "-".join([demos, *names, *(a.lstrip("-") for a in extra)]) for demos, names, extra in CASES
    ],
)
def test_train_then_eval_then_run_use_what_training_learned(
    project: Path, demos: str, optimizers: list[str], extra: list[str]
) -> None:
    """Was: `plait train --demos knn` wrote a pool, and `plait eval --parameters` refused
    it (exit 2, "classify.demos (expected list, given object)")."""
    chosen = [arg for name in optimizers for arg in ("--optimizer", name)]
    train = plait_in(
        project,
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "val.jsonl"),
        *("--test", "test.jsonl", *chosen, "--demos", demos, "--k", "2", *extra),
        *("--loss", "contains", "--out", "runs/triage", "-q"),
    )
    assert train.returncode == 0, train.stderr
    parameters = json.loads((project / "runs/triage/parameters.json").read_text())
    if optimizers != ["auto"]:  # auto chooses a list or a pool itself
        assert is_pool(parameters["classify.demos"]) == (demos == "knn")
    history = json.loads((project / "runs/triage/history.json").read_text())
    # The untrained pipeline echoes (scores 0): what follows scores the trained one.
    assert history["initial_test_score"] == 0.0 < history["final_test_score"]

    evaluated = plait_in(
        project,
        *("eval", "triage.py:Triage", "--data", "test.jsonl", "--loss", "contains"),
        *("--parameters", "runs/triage/parameters.json", "--output", "scored.jsonl", "-q"),
    )
    assert evaluated.returncode == 0, evaluated.stderr
    # The score the training run's own pipeline had on the same examples, in memory.
    assert f"mean {history['final_test_score']:.4f} over 3 example(s)" in evaluated.stdout
    scored = [json.loads(line) for line in (project / "scored.jsonl").read_text().splitlines()]

    ran = plait_in(
        project,
        *("run", "triage.py:Triage", "--input", "messages.jsonl"),
        *("--parameters", "runs/triage/parameters.json", "--output", "answers.jsonl"),
    )
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in (project / "answers.jsonl").read_text().splitlines()]
    outputs = [row["output"] for row in sorted(answers, key=lambda row: row["index"])]
    assert outputs == [row["output"] for row in scored]
    if "--embed" in extra:  # ranked by the server's embeddings: every neighbour is right
        assert outputs == [target for _, target in TEST]
    else:  # the demonstrations parameters.json gives, chosen per input as it says
        assert outputs == [expected_output(parameters, message) for message, _ in TEST]
    rewrites = optimizers in (["sfa"], ["textgrad"], ["reflective"])
    if rewrites:  # (after demonstrations, an instruction no longer changes the answer;
        # reflective search learns the instruction alone, so a pool stays empty)
        assert parameters["classify.system_prompt"] == "Answer billing."
    elif is_pool(parameters["classify.demos"]):
        # a pool that chose per input: every message answered by its own kind's pair
        assert outputs == [target for _, target in TEST]


def test_a_pool_trained_in_memory_gives_the_same_answers_after_plait_run_loads_it(
    project: Path, server: Any
) -> None:
    """The trained pipeline in memory, and `plait run`/`plait eval` with the file it
    saved, choose the same demonstrations for every input (a grown pool, after refit)."""
    model = Target(f"{project / 'triage.py'}:Triage").make()  # the user's file
    model.classify.demos.value = knn_demos(k=2)
    resources = plait.ResourceConfig.load(project / "resources.toml")
    trainer = Trainer(
        model,
        Contains(),
        BootstrapFewShot(model.parameters(), max_demos=2),
        project / "train.jsonl",
        project / "val.jsonl",
        batch_size=3,
        resources=resources,
        refit=True,
        checkpoint_dir=project / "checkpoint",
    )
    trainer.fit_sync()
    assert len(model.classify.demos.value["pool"]) == len(TRAIN) + len(VAL)
    messages = [message for message, _ in TEST] + ["Is my parcel charged twice?"]
    in_memory = model.run_sync(messages, resources=resources)
    save_parameters(model, project / "parameters.json")
    write_jsonl(project / "more.jsonl", [{"message": m} for m in messages])

    ran = plait_in(
        project,
        *("run", "triage.py:Triage", "--input", "more.jsonl"),
        *("--parameters", "parameters.json", "--output", "answers.jsonl"),
    )
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in (project / "answers.jsonl").read_text().splitlines()]
    assert [row["output"] for row in sorted(answers, key=lambda r: r["index"])] == in_memory
    write_jsonl(project / "scored-in.jsonl", [{"message": m, "target": "x"} for m in messages])
    evaluated = plait_in(
        project,
        *("eval", "triage.py:Triage", "--data", "scored-in.jsonl", "--no-labels"),
        *("--parameters", "parameters.json", "--output", "scored.jsonl", "-q"),
    )
    assert evaluated.returncode == 0, evaluated.stderr
    scored = [json.loads(line) for line in (project / "scored.jsonl").read_text().splitlines()]
    assert [row["output"] for row in scored] == in_memory


# -- the one check of loaded values ---------------------------------------------------------


def test_demonstrations_take_a_list_or_a_pool_and_a_prompt_takes_text() -> None:
    model = triage()
    pool = knn_demos(k=2, pool=[("a b", "x"), ("c d", "y"), ("e f", "z")])
    model.load_state_dict({"classify.demos": pool})
    assert model.classify.demos.value == pool
    model.load_state_dict({"classify.demos": [["in", "out"]]})  # pairs, normalized
    assert model.classify.demos.value == [{"input": "in", "output": "out"}]
    with pytest.raises(ParameterValueError) as refused:
        model.load_state_dict({"classify.system_prompt": "New.", "classify.demos": "three"})
    assert "classify.demos" in str(refused.value) and "pairs" in str(refused.value)
    # Nothing was loaded: not even the value that fitted.
    assert model.classify.system_prompt.value == "Classify the message."
    with pytest.raises(ParameterValueError, match=r"expected text, given number"):
        model.load_state_dict({"classify.system_prompt": 5})
    with pytest.raises(ParameterValueError, match=r"classify\.demos"):
        snapshot(model).updated({"classify.demos": {"k": 2}}).apply_to(model)


def test_a_parameter_state_file_loads_as_a_parameters_file(tmp_path: Path) -> None:
    model = triage()
    model.classify.demos.value = knn_demos(k=1, pool=[("a", "b")])
    model.classify.system_prompt.value = "Learned."
    snapshot(model).save(tmp_path / "state.json")
    save_parameters(model, tmp_path / "parameters.json")
    for name in ("state.json", "parameters.json"):
        fresh = triage()
        assert load_parameters(fresh, tmp_path / name) == []
        assert fresh.state_dict() == model.state_dict()
    (tmp_path / "bad.json").write_text('{"classify.demos": 3}', encoding="utf-8")
    with pytest.raises(ParameterFileError, match=r"bad\.json .*classify\.demos"):
        load_parameters(triage(), tmp_path / "bad.json")
    assert ParameterState.load(tmp_path / "state.json")["classify.system_prompt"] == "Learned."


def test_plait_train_refuses_a_value_it_could_not_save_before_any_call(
    project: Path, server: Any
) -> None:
    (project / "odd.py").write_text(
        PIPELINE
        + textwrap.dedent(
            """
            class Odd(Triage):
                def __init__(self):
                    super().__init__()
                    self.tags = plait.Parameter({"a", "b"}, requires_grad=False)
            """
        ),
        encoding="utf-8",
    )
    train = plait_in(
        project,
        *("train", "odd.py:Odd", "--data", "train.jsonl", "--optimizer", "bootstrap", "-q"),
    )
    assert train.returncode == 2
    assert "'tags' holds a set" in train.stderr.strip().splitlines()[-1]
    assert server.stats()["requests_total"] == 0


# -- answers that are labels ----------------------------------------------------------------

#: The pipeline as a classifier: its answers are labels.  Without demonstrations the
#: fake server answers the JSON schema plait sends for labels with its first label
#: (``{"value": "billing"}``), so the billing examples pass and bootstrap keeps that
#: raw reply beside the other examples' targets.
LABEL_PIPELINE = """
from typing import Literal

import plait


class Triage(plait.Module):
    def __init__(self):
        super().__init__()
        self.classify = plait.LLMInference(
            "fast",
            "Classify the message.",
            response_format=Literal["billing", "shipping", "technical"],
            demos=[],
            temperature=0,
        )

    def forward(self, message):
        return self.classify(message)
"""
LABELS = ("billing", "shipping", "technical")


def shown_answers(server: Any) -> list[list[str]]:
    """Per chat request the server received, the assistant turns it showed the model."""
    bodies = [record["body"] for record in server.stats(bodies=True)["requests"]]
    return [
        [message["content"] for message in body["messages"] if message["role"] == "assistant"]
        for body in bodies
        if "messages" in body
    ]


def demo_outputs(value: Any) -> list[Any]:
    """The answers of a demonstrations value (a list or a pool) as it is saved."""
    pairs = value["pool"] if is_pool(value) else value
    return [pair["output"] for pair in pairs]


LABEL_CASES = [
    ("list", ["bootstrap"], []),
    ("knn", ["bootstrap"], []),
    ("knn", ["bootstrap"], ["--refit"]),
    ("knn", ["search"], []),
]


@pytest.mark.parametrize(
    ("demos", "optimizers", "extra"),
    LABEL_CASES,
    ids=["-".join([d, *o, *(a.lstrip("-") for a in e)]) for d, o, e in LABEL_CASES],
)
def test_a_label_calls_demonstrations_are_its_labels_on_the_wire_and_in_the_file(
    project: Path, server: Any, demos: str, optimizers: list[str], extra: list[str]
) -> None:
    """Was: bootstrap kept a run's raw reply as its demonstration's answer
    (``{"value": "billing"}``, the JSON the label schema asks an endpoint for) beside
    labelled examples' bare labels (``shipping``): parameters.json mixed both, and one
    request showed the model both forms after "Answer with exactly one of: ...".  Now
    every demonstration answers with the label itself, whatever made it."""
    (project / "triage.py").write_text(LABEL_PIPELINE, encoding="utf-8")
    # A dataset's targets as people type them (the loss ignores case): the saved
    # demonstrations still answer with the labels as the call spells them.
    write_jsonl(project / "train.jsonl", examples([(m, t.title()) for m, t in TRAIN]))
    chosen = [arg for name in optimizers for arg in ("--optimizer", name)]
    train = plait_in(
        project,
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "val.jsonl"),
        *(*chosen, "--demos", demos, "--k", "2", *extra),
        *("--loss", "exact", "--out", "runs/triage", "-q"),
    )
    assert train.returncode == 0, train.stderr
    during = shown_answers(server)
    assert any(during), "no request of the training run showed demonstrations"
    assert {answer for answers in during for answer in answers} <= set(LABELS)

    parameters = json.loads((project / "runs/triage/parameters.json").read_text())
    history = json.loads((project / "runs/triage/history.json").read_text())
    tried = [t["tried"]["classify.demos"] for s in history["steps"] for t in s["trials"]]
    saved = [parameters["classify.demos"], *tried]
    assert any(demo_outputs(value) for value in saved), "training made no demonstration"
    assert all(set(demo_outputs(value)) <= set(LABELS) for value in saved), saved

    server.reset()
    evaluated = plait_in(
        project,
        *("eval", "triage.py:Triage", "--data", "test.jsonl", "--loss", "exact"),
        *("--parameters", "runs/triage/parameters.json", "-q"),
    )
    assert evaluated.returncode == 0, evaluated.stderr
    shown = shown_answers(server)
    assert len(shown) == len(TEST)
    if demo_outputs(parameters["classify.demos"]):
        assert all(shown)
    assert {answer for answers in shown for answer in answers} <= set(LABELS)


#: A parameters.json an earlier plait wrote for the label pipeline: bootstrapped
#: answers kept as the raw JSON reply, labelled ones as labels.
OLD_DEMOS = [
    {"input": "I was charged twice this month.", "output": '{"value": "billing"}'},
    {"input": "My parcel has not arrived yet.", "output": "shipping"},
    {"input": "The app crashes when I log in.", "output": '{"value": "technical"}'},
]


@pytest.mark.parametrize("form", ["list", "pool"])
def test_an_older_parameters_file_with_raw_replies_loads_as_labels(
    project: Path, server: Any, form: str
) -> None:
    (project / "triage.py").write_text(LABEL_PIPELINE, encoding="utf-8")
    value: Any = OLD_DEMOS if form == "list" else {"pool": OLD_DEMOS, "k": 2}
    old = {"classify.system_prompt": "Classify the message.", "classify.demos": value}
    (project / "old.json").write_text(json.dumps(old), encoding="utf-8")
    model = Target(f"{project / 'triage.py'}:Triage").make()
    # Written before the label method was saved: the method stays the code's.
    assert load_parameters(model, project / "old.json") == ["classify.label_method"]
    assert model.classify.label_method is None
    assert demo_outputs(model.classify.demos.value) == ["billing", "shipping", "technical"]

    for command in (
        ("eval", "triage.py:Triage", "--data", "test.jsonl", "--loss", "exact", "-q"),
        ("run", "triage.py:Triage", "--input", "messages.jsonl", "--output", "answers.jsonl"),
    ):
        server.reset()
        result = plait_in(project, *command, "--parameters", "old.json")
        assert result.returncode == 0, result.stderr
        shown = shown_answers(server)
        assert len(shown) == len(TEST) and all(shown)
        assert {answer for answers in shown for answer in answers} <= set(LABELS)


def test_a_label_calls_own_demonstrations_read_as_its_labels(server: Any) -> None:
    """A user's list (or an older file) may spell an answer as the reply's JSON, in
    another case, or as an Enum member: the call holds, saves and shows the label."""
    import enum

    class Topic(enum.Enum):
        BILLING = "billing"
        SHIPPING = "shipping"

    call = plait.LLMInference(
        "fast",
        "Classify.",
        response_format=Topic,
        demos=[
            ("Charged twice", Topic.BILLING),
            ("Parcel late", '{"value": "shipping"}'),
            ("Refund?", " Billing. "),
            ("Hello", "not a label"),  # states no label: kept as written
        ],
    )
    held = ["billing", "shipping", "billing", "not a label"]
    assert demo_outputs(call.demos.value) == held
    assistant = [m["content"] for m in call.messages("Where is it?") if m["role"] == "assistant"]
    assert assistant == held
    call.load_state_dict({"demos": [("Parcel late", '"SHIPPING"')]})
    assert call.demos.value == [{"input": "Parcel late", "output": "shipping"}]
    # Set directly (not loaded), the value is still shown as the call's labels.
    call.demos.value = [("Parcel late", '{"value": "shipping"}')]
    assert call.messages("Where is it?")[2] == {"role": "assistant", "content": "shipping"}
    # A call without labels keeps its answers as written.
    plain = plait.LLMInference("fast", demos=[("Parcel late", '{"value": "shipping"}')])
    assert demo_outputs(plain.demos.value) == ['{"value": "shipping"}']
