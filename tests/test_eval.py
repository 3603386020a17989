"""``plait eval`` (mean, interval, failures, --output) and ``--parameters`` for run and eval."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from plait.cli.eval import confidence_interval
from tests.conftest import plait_cli

PIPELINE = """
import plait

class Labeller(plait.Module):
    def __init__(self, instructions: str = "S") -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter(instructions, description="Labelling.")
        )

    def forward(self, text: str):
        return self.llm(text)
"""


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    endpoint = {
        "provider": "openai",
        "model": "m",
        "base_url": server.base_url,
        "api_key": "sk-test",
    }
    (tmp_path / "resources.yaml").write_text(json.dumps({"fast": endpoint}), encoding="utf-8")
    return tmp_path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def evaluate(project: Path, *args: str | Path) -> Any:
    return plait_cli(
        "eval",
        f"{project / 'pipeline.py'}:Labeller",
        "--resources",
        project / "resources.yaml",
        *args,
    )


def test_wilson_interval_for_binary_scores_and_normal_otherwise() -> None:
    low, high, method = confidence_interval([1.0, 1.0, 1.0, 0.0])
    assert method == "Wilson"
    assert (round(low, 4), round(high, 4)) == (0.3006, 0.9544)
    low, high, method = confidence_interval([1.0] * 5)
    assert method == "Wilson" and high == 1.0 and 0.5 < low < 0.6
    low, high, method = confidence_interval([0.5, 0.5, 0.5])
    assert method == "normal approximation" and low == high == 0.5
    low, high, method = confidence_interval([0.2, 0.4])
    assert method == "normal approximation"
    assert (round(low, 4), round(high, 4)) == (0.104, 0.496)


def test_eval_prints_mean_count_and_interval_and_writes_rows(project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [
            {"input": "a", "target": "[S] a"},
            {"input": "b", "target": "[S] b"},
            {"input": "c", "target": "[S] c"},
            {"input": "d", "target": "wrong"},
        ],
    )
    rows_file = project / "rows.jsonl"
    run = evaluate(project, "--data", data, "--loss", "exact", "--output", rows_file)
    assert run.returncode == 0, run.stderr
    assert "mean 0.7500 over 4 example(s); 95% CI [0.3006, 0.9544] (Wilson)" in run.stdout
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(row["input"], row["output"], row["score"]) for row in rows] == [
        ("a", "[S] a", 1.0),
        ("b", "[S] b", 1.0),
        ("c", "[S] c", 1.0),
        ("d", "[S] d", 0.0),
    ]
    assert rows[3]["target"] == "wrong" and "error" not in rows[3]


def test_eval_with_contains_and_other_fields(project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"q": "apple", "a": "apple"}, {"q": "pear", "a": "plum"}],
    )
    run = evaluate(
        project, "--data", data, "--loss", "contains", "--input-field", "q", "--target-field", "a"
    )
    assert run.returncode == 0, run.stderr
    assert "mean 0.5000 over 2 example(s)" in run.stdout


def test_a_failed_example_scores_zero_and_is_reported(server: Any, project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"input": "a", "target": "[S] a"}, {"input": "b", "target": "[S] b"}],
    )
    server.configure(rate_500=1.0)
    rows_file = project / "rows.jsonl"
    run = evaluate(project, "--data", data, "--output", rows_file)
    assert run.returncode == 1, run.stderr  # as plait run with a failed input
    assert "mean 0.0000 over 2 example(s)" in run.stdout
    assert "2 of 2 example(s) failed and scored 0" in run.stderr
    assert "example 0:" in run.stderr
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [row["score"] for row in rows] == [0.0, 0.0]
    assert all(row["error"] and row["output"] is None for row in rows)


def test_eval_usage_errors(project: Path) -> None:
    run = evaluate(project)
    assert run.returncode == 2 and "--data FILE is missing" in run.stderr
    run = evaluate(project, "--data", project / "none.jsonl")
    assert run.returncode == 2 and "none.jsonl" in run.stderr
    assert plait_cli("eval", "--help").returncode == 0
    assert "Wilson" in plait_cli("eval", "--help").stdout


def system_prompts(server: Any) -> list[str]:
    requests = server.stats(bodies=True)["requests"]
    return [request["body"]["messages"][0]["content"] for request in requests]


def test_parameters_change_the_prompt_eval_sends(server: Any, project: Path) -> None:
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "target": "[Learned] a"}])
    params = project / "parameters.json"
    params.write_text(json.dumps({"llm.system_prompt": "Learned"}), encoding="utf-8")
    run = evaluate(project, "--data", data, "--parameters", params)
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 1 example(s)" in run.stdout
    assert system_prompts(server) == ["Learned"]


def test_parameters_for_run_reach_the_server_and_the_checkpoint(server: Any, project: Path) -> None:
    inputs = write_jsonl(project / "in.jsonl", ["a", "b"])
    params = project / "parameters.json"
    params.write_text(json.dumps({"llm.system_prompt": "Learned"}), encoding="utf-8")
    out = project / "out.jsonl"
    base = [
        "run",
        f"{project / 'pipeline.py'}:Labeller",
        "--resources",
        project / "resources.yaml",
        "--input",
        inputs,
        "--output",
        out,
        "-q",
    ]
    run = plait_cli(*base, "--parameters", params)
    assert run.returncode == 0, run.stderr
    assert sorted(json.loads(line)["output"] for line in out.read_text().splitlines()) == [
        "[Learned] a",
        "[Learned] b",
    ]
    assert system_prompts(server) == ["Learned", "Learned"]
    # The same values resume (nothing re-sent); other values are another version of
    # the pipeline: its inputs run again with them, and each version keeps its outputs.
    server.reset()
    again = plait_cli(*base, "--parameters", params)
    assert again.returncode == 0, again.stderr
    assert system_prompts(server) == []
    params.write_text(json.dumps({"llm.system_prompt": "Other"}), encoding="utf-8")
    other = plait_cli(*base, "--parameters", params)
    assert other.returncode == 0, other.stderr
    assert sorted(json.loads(line)["output"] for line in out.read_text().splitlines()) == [
        "[Other] a",
        "[Other] b",
    ]
    assert system_prompts(server) == ["Other", "Other"]
    server.reset()
    params.write_text(json.dumps({"llm.system_prompt": "Learned"}), encoding="utf-8")
    back = plait_cli(*base, "--parameters", params)
    assert back.returncode == 0, back.stderr
    assert system_prompts(server) == []  # the first version's outputs, kept
    assert sorted(json.loads(line)["output"] for line in out.read_text().splitlines()) == [
        "[Learned] a",
        "[Learned] b",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"llm.system_prompt": "x", "nope.prompt": "y"}', "nope.prompt"),
        ("not json", "is not JSON"),
        ('["llm.system_prompt"]', "not an object"),
    ],
)
def test_bad_parameter_files_are_usage_errors_naming_the_file(
    project: Path, content: str, message: str
) -> None:
    params = project / "bad.json"
    params.write_text(content, encoding="utf-8")
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "target": "a"}])
    run = evaluate(project, "--data", data, "--parameters", params)
    assert run.returncode == 2
    line = run.stderr.strip().splitlines()[-1]
    assert "bad.json" in line and message in line
    inputs = write_jsonl(project / "in.jsonl", ["a"])
    run = plait_cli(
        "run",
        f"{project / 'pipeline.py'}:Labeller",
        "--resources",
        project / "resources.yaml",
        "--input",
        inputs,
        "--parameters",
        params,
    )
    assert run.returncode == 2
    assert "bad.json" in run.stderr and message in run.stderr


def test_parameters_the_file_does_not_set_keep_defaults_with_a_note(
    server: Any, project: Path
) -> None:
    params = project / "parameters.json"
    params.write_text("{}", encoding="utf-8")
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "target": "[S] a"}])
    run = evaluate(project, "--data", data, "--parameters", params)
    assert run.returncode == 0, run.stderr
    assert "does not set llm.system_prompt; they keep their defaults" in run.stderr
    assert "mean 1.0000" in run.stdout
    assert system_prompts(server) == ["S"]


def test_eval_seed_scores_the_same_samples_again(project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"input": f"q{i} [[sample:1000000]]", "target": "x"} for i in range(3)],
    )

    def outputs(seed: str, name: str) -> list[str]:
        rows_file = project / name
        run = evaluate(project, "--data", data, "--seed", seed, "--output", rows_file)
        assert run.returncode == 0, run.stderr
        return [json.loads(line)["output"] for line in rows_file.read_text().splitlines()]

    seven = outputs("7", "a.jsonl")
    assert all(" ~draw " in output for output in seven) and len(set(seven)) == 3
    assert outputs("7", "b.jsonl") == seven
    assert not set(outputs("8", "c.jsonl")) & set(seven)


def test_eval_seed_gives_every_example_its_own_seeds(project: Path, server: Any) -> None:
    """Each example is a run of its own; identical inputs still draw distinct samples."""
    data = write_jsonl(
        project / "data.jsonl",
        [{"input": "q [[sample:1000000]]", "target": "x"} for _ in range(3)],
    )
    rows_file = project / "rows.jsonl"
    run = evaluate(project, "--data", data, "--seed", "7", "--output", rows_file)
    assert run.returncode == 0, run.stderr
    outputs = [json.loads(line)["output"] for line in rows_file.read_text().splitlines()]
    assert len(set(outputs)) == 3, outputs
    sent = [record["body"].get("seed") for record in server.stats(bodies=True)["requests"]]
    assert len(sent) == 3 and len(set(sent)) == 3 and None not in sent


# -- the confusion table of a classification -------------------------------------------
LABELLED = [
    {"input": "a [[reply:Spam]]", "target": "spam"},
    {"input": "b [[reply:spam]]", "target": "spam"},
    {"input": "c [[reply:ham]]", "target": "spam"},
    {"input": "d [[reply:ham]]", "target": "Ham"},
    {"input": "e [[reply: HAM ]]", "target": "ham"},
    {"input": "f [[reply:maybe]]", "target": "ham"},  # none of the labels
    {"input": "g [[status:400]]", "target": "ham"},  # the pipeline fails
    {"input": "h [[reply:eggs]]", "target": "eggs"},
]
HEADER = ["eggs", "ham", "spam", "(other)", "(error)", "support", "precision", "recall", "F1"]


def confusion_rows(stdout: str) -> dict[str, list[str]]:
    """The printed table's cells, by true label; checks its header on the way."""
    headers = [line for line in stdout.splitlines() if line.startswith("┃")]
    assert len(headers) == 1, stdout
    assert [cell.strip() for cell in headers[0].strip("┃").split("┃")] == ["true label", *HEADER]
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("│"):
            label, *cells = (cell.strip() for cell in line.strip("│").split("│"))
            rows[label] = cells
    return rows


def test_a_classification_gets_a_confusion_table_and_its_json(server: Any, project: Path) -> None:
    data = write_jsonl(project / "data.jsonl", LABELLED)
    report = project / "report.json"
    run = evaluate(project, "--data", data, "-q", "--report", report)
    assert run.returncode == 1, run.stderr  # one example failed
    assert "mean 0.6250 over 8 example(s)" in run.stdout
    # counts, support, then precision, recall, F1
    assert confusion_rows(run.stdout) == {
        "eggs": ["1", "0", "0", "0", "0", "1", "1.0000", "1.0000", "1.0000"],
        "ham": ["0", "2", "0", "1", "1", "4", "0.6667", "0.5000", "0.5714"],
        "spam": ["0", "1", "2", "0", "0", "3", "1.0000", "0.6667", "0.8000"],
    }
    assert "accuracy 0.6250 (5 of 8 example(s))" in run.stdout
    assert "macro-F1 0.7905 over 3 label(s)" in run.stdout
    assert f"wrote the result to {report}" in run.stderr
    result = json.loads(report.read_text(encoding="utf-8"))
    assert (result["examples"], result["mean"], result["failed"]) == (8, 0.625, 1)
    assert result["interval"]["method"] == "Wilson"
    table = result["confusion"]
    assert table["labels"] == ["eggs", "ham", "spam"]
    assert (table["correct"], table["accuracy"]) == (5, 0.625)
    assert table["macro_f1"] == pytest.approx((1 + 4 / 7 + 0.8) / 3)
    ham = table["rows"][1]
    assert ham["label"] == "ham" and ham["predicted"] == {"eggs": 0, "ham": 2, "spam": 0}
    assert (ham["other"], ham["errors"], ham["support"]) == (1, 1, 4)


def test_free_text_targets_get_no_table_unless_forced(server: Any, project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"input": f"question {i}", "target": f"[S] question {i}"} for i in range(3)],
    )
    report = project / "report.json"
    run = evaluate(project, "--data", data, "-q", "--report", report)
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 3 example(s)" in run.stdout
    assert "confusion" not in run.stdout and "macro-F1" not in run.stdout
    assert json.loads(report.read_text(encoding="utf-8"))["confusion"] is None
    # Long answers, even repeated: no table either (over the label length).
    answers = ["a sentence of some length, " * 2 + end for end in ("yes", "yes", "no")]
    long = write_jsonl(project / "long.jsonl", [{"input": a, "target": a} for a in answers])
    assert "macro-F1" not in evaluate(project, "--data", long, "-q").stdout
    assert "macro-F1" in evaluate(project, "--data", long, "-q", "--labels").stdout
    forced = evaluate(project, "--data", data, "-q", "--labels")
    assert forced.returncode == 0, forced.stderr
    assert "accuracy 1.0000 (3 of 3 example(s))" in forced.stdout
    assert "macro-F1 1.0000 over 3 label(s)" in forced.stdout


def test_no_labels_turns_the_table_off(server: Any, project: Path) -> None:
    data = write_jsonl(project / "data.jsonl", LABELLED)
    run = evaluate(project, "--data", data, "-q", "--no-labels")
    assert "mean 0.6250 over 8 example(s)" in run.stdout
    assert "macro-F1" not in run.stdout and "┃" not in run.stdout


def test_forced_labels_need_a_target_on_every_example_before_anything_runs(
    server: Any, project: Path
) -> None:
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "label": "x"}, {"input": "b"}])
    run = evaluate(
        project, "--data", data, "--loss", "judge", "--criteria", "polite", "--labels", "-q"
    )
    assert run.returncode == 2
    assert "--labels: example 0's target None is missing" in run.stderr
    assert server.stats()["requests"] == []


def test_report_must_not_be_the_output_or_the_data(server: Any, project: Path) -> None:
    data = write_jsonl(project / "data.jsonl", LABELLED)
    rows = project / "rows.jsonl"
    run = evaluate(project, "--data", data, "--output", rows, "--report", rows)
    assert run.returncode == 2 and "--report" in run.stderr and "another path" in run.stderr
    run = evaluate(project, "--data", data, "--report", data)
    assert run.returncode == 2 and "another path" in run.stderr
    assert json.loads(data.read_text(encoding="utf-8").splitlines()[0]) == LABELLED[0]
    assert server.stats()["requests"] == []
