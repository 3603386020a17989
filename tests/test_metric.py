"""``--metric module:function``: ``plait eval`` and ``plait train`` score with a function
of the user's, ``metric(example, prediction)`` as DSPy writes metrics.

Real ``plait`` processes on the fake OpenAI server, which echoes ``[system prompt]
input`` (or, set so, answers as the demonstration next to the input was answered).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import plait_cli

PIPELINE = """
import plait


class Triage(plait.Module):
    def __init__(self):
        super().__init__()
        self.classify = plait.LLMInference(
            "fast",
            plait.Parameter("S", description="the task"),
            demos=[],
            temperature=0,
        )

    def forward(self, message):
        return self.classify(message)
"""

METRICS = '''
THRESHOLD = 3


def echoes(example, prediction):
    """The pipeline's echo holds the expected word: 1, else 0."""
    return example.label in prediction


def dspy_shaped(example, pred, trace=None):
    assert trace is None
    return 0.25 if example["message"] == "b" else 1.0


def picky(example, prediction):
    if example.message == "b":
        raise KeyError("no rule for b")
    return True


def no_score(example, prediction):
    return "yes" if example.message == "b" else 0.5


def out_of_range(example, prediction):
    return 2.0


def one_argument(prediction):
    return 1.0


async def later(example, prediction):
    return 1.0


class Scorer:
    def __init__(self, example, prediction):
        pass
'''

ROWS = [
    {"message": "a", "label": "a"},
    {"message": "b", "label": "zzz"},
    {"message": "c", "label": "c"},
]


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    (tmp_path / "triage.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    (tmp_path / "metrics.py").write_text(textwrap.dedent(METRICS), encoding="utf-8")
    (tmp_path / "resources.toml").write_text(
        f'[resources.fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n',
        encoding="utf-8",
    )
    write_jsonl(tmp_path / "data.jsonl", ROWS)
    return tmp_path


def evaluate(project: Path, metric: str, *args: str) -> Any:
    return plait_cli(
        *("eval", "triage.py:Triage", "--data", "data.jsonl", "--target-field", "label"),
        *("--metric", metric, "--resources", "resources.toml", "-q", *args),
        cwd=project,
    )


def scored(project: Path) -> list[dict[str, Any]]:
    lines = (project / "rows.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("where", ["module", "file"])
def test_eval_scores_every_example_with_the_metric(project: Path, where: str) -> None:
    metric = "metrics:echoes" if where == "module" else f"{project / 'metrics.py'}:echoes"
    run = evaluate(project, metric, "--output", "rows.jsonl", "--no-labels")
    assert run.returncode == 0, run.stderr
    assert "mean 0.6667 over 3 example(s)" in run.stdout
    assert [(row["output"], row["score"]) for row in scored(project)] == [
        ("[S] a", 1.0),
        ("[S] b", 0.0),
        ("[S] c", 1.0),
    ]


def test_a_metric_of_dspy_shape_is_given_no_trace(project: Path) -> None:
    run = evaluate(project, "metrics:dspy_shaped", "--output", "rows.jsonl", "--no-labels")
    assert run.returncode == 0, run.stderr
    assert [row["score"] for row in scored(project)] == [1.0, 0.25, 1.0]


@pytest.mark.parametrize(
    ("metric", "said"),
    [
        ("metrics:picky", "the metric metrics:picky raised KeyError: 'no rule for b'"),
        ("metrics:no_score", "the metric metrics:no_score returned 'yes'"),
    ],
)
def test_a_metric_that_fails_on_one_example_fails_that_example_only(
    project: Path, metric: str, said: str
) -> None:
    run = evaluate(project, metric, "--output", "rows.jsonl", "--no-labels")
    assert run.returncode == 1, run.stderr  # as for a failed input: the mean is not whole
    assert "1 of 3 example(s) failed and scored 0" in run.stderr
    assert said in run.stderr and "example 1:" in run.stderr
    rows = scored(project)
    assert "error" not in rows[0] and "error" not in rows[2]
    assert said in rows[1]["error"] and rows[1]["score"] == 0.0


def test_a_score_outside_zero_to_one_is_each_examples_error(project: Path) -> None:
    run = evaluate(project, "metrics:out_of_range", "--no-labels")
    assert run.returncode == 1
    assert "3 of 3 example(s) failed" in run.stderr
    assert "the metric metrics:out_of_range returned 2.0" in run.stderr
    assert "a bool or a score in [0, 1]" in run.stderr


@pytest.mark.parametrize(
    ("metric", "said"),
    [
        ("nowhere:echoes", "cannot import module 'nowhere'"),
        ("metrics:missing", "has no attribute 'missing'"),
        ("missing.py:echoes", "no such file: missing.py"),
        ("metrics", "no function named"),
        ("metrics:THRESHOLD", "metrics:THRESHOLD is not a function but 3 (int)"),
        ("metrics:Scorer", "is a class, not a function"),
        ("metrics:one_argument", "takes (prediction); a metric takes (example, prediction)"),
        ("metrics:later", "is async"),
    ],
)
@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_bad_metric_is_one_line_and_exit_2_before_any_call(
    project: Path, server: Any, command: str, metric: str, said: str
) -> None:
    args = ["--data", "data.jsonl", "--target-field", "label", "--metric", metric]
    if command == "train":
        args += ["--optimizer", "bootstrap", "--out", "runs/t"]
    run = plait_cli(
        command, "triage.py:Triage", *args, "--resources", "resources.toml", "-q", cwd=project
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"plait {command}: error: --metric ")
    assert said in lines[0]
    assert server.stats()["requests_total"] == 0


def test_a_metric_and_a_loss_together_are_refused(project: Path, server: Any) -> None:
    run = evaluate(project, "metrics:echoes", "--loss", "exact")
    assert run.returncode == 2
    assert "--loss exact and --metric metrics:echoes both say how to score" in run.stderr
    assert server.stats()["requests_total"] == 0


def test_train_learns_by_the_metric_and_eval_scores_the_result_with_it(
    project: Path, server: Any
) -> None:
    server.configure(answer_like_demos=True)  # a demonstration's answer is copied
    (project / "labels.py").write_text(
        "def same(example, prediction):\n    return prediction == example.label\n",
        encoding="utf-8",
    )
    pairs = [("charged twice", "billing"), ("parcel lost", "shipping"), ("app crashes", "bug")]
    write_jsonl(project / "train.jsonl", [{"message": m, "label": t} for m, t in pairs])
    tests = [("charged again", "billing"), ("parcel late", "shipping"), ("app crashes now", "bug")]
    write_jsonl(project / "test.jsonl", [{"message": m, "label": t} for m, t in tests])
    common = ["--target-field", "label", "--metric", "labels.py:same"]
    common += ["--resources", "resources.toml", "-q"]
    train = plait_cli(
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "train.jsonl"),
        *("--test", "test.jsonl", "--optimizer", "bootstrap", "--demos", "knn", "--k", "1"),
        *("--out", "runs/triage", *common),
        cwd=project,
    )
    assert train.returncode == 0, train.stderr
    history = json.loads((project / "runs/triage/history.json").read_text())
    assert (history["initial_test_score"], history["final_test_score"]) == (0.0, 1.0)
    run = plait_cli(
        *("eval", "triage.py:Triage", "--data", "test.jsonl"),
        *("--parameters", "runs/triage/parameters.json", *common),
        cwd=project,
    )
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 3 example(s)" in run.stdout


def test_train_on_ray_workers_sends_them_the_metric_from_its_file(
    project: Path, server: Any
) -> None:
    """Was: the workers could not import the metric's file by the name plait loaded it
    under (ModuleNotFoundError); it now travels by value, as the pipeline's file does."""
    pytest.importorskip("ray")
    write_jsonl(project / "train.jsonl", ROWS)
    train = plait_cli(
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "train.jsonl"),
        *("--target-field", "label", "--metric", "metrics.py:echoes", "--workers", "1"),
        *("--optimizer", "bootstrap", "--out", "runs/triage", "--resources", "resources.toml"),
        "-q",
        cwd=project,
    )
    assert train.returncode == 0, train.stderr
    history = json.loads((project / "runs/triage/history.json").read_text())
    assert history["initial_val_score"] == pytest.approx(2 / 3)  # scored by the metric


def test_a_resume_after_the_metric_was_edited_is_refused_naming_its_file(
    project: Path, server: Any
) -> None:
    """The checkpoint's best score was measured by the metric as it was: an edited
    metric's scores would be compared with it, so the resume is refused, naming the
    file, before any call."""
    write_jsonl(project / "train.jsonl", ROWS)
    train = [
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "train.jsonl"),
        *("--target-field", "label", "--metric", "metrics.py:echoes", "--optimizer"),
        *("bootstrap", "--out", "runs/triage", "--resources", "resources.toml", "-q"),
    ]
    first = plait_cli(*train, "--max-steps", "1", cwd=project)
    assert first.returncode == 0, first.stderr
    metrics = project / "metrics.py"
    metrics.write_text(metrics.read_text().replace("in prediction", "not in prediction"))
    server.reset()
    again = plait_cli(*train, "--max-steps", "2", cwd=project)
    assert again.returncode == 2, again.stderr
    assert "another loss" in again.stderr and "code changed (metrics.py)" in again.stderr
    assert server.stats()["requests_total"] == 0
