"""What the commands read and write: records mapped to ``forward`` by name, data files
read by one reader (CSV quoting, BOM, documents, directories), values refused rather
than sent, files never destroyed, and the quiet and progress output of run and eval.

Every request goes to the loopback fake server, whose replies echo
"[system prompt] user text", so a test sees exactly what reached the model.
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

def _llm(instructions):
    return plait.LLMInference(
        "fast", system_prompt=plait.Parameter(instructions, description="Labelling.")
    )

class Labeller(plait.Module):
    def __init__(self, instructions: str = "S") -> None:
        super().__init__()
        self.llm = _llm(instructions)

    def forward(self, text: str):
        return self.llm(text)

class Untyped(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = _llm("U")

    def forward(self, x):
        return self.llm(x)

class WholeByType(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = _llm("W")

    def forward(self, fields: dict):
        return self.llm(fields)

class WholeByName(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = _llm("N")

    def forward(self, record):
        return self.llm(record)

class Joiner(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = _llm("J")

    def forward(self, parts: list):
        return self.llm(" + ".join(parts))

class NotData(plait.Module):
    async def forward(self, text: str):
        import types
        if text == "function":
            return lambda: 1
        if text == "module":
            return types
        if text == "generator":
            return (c for c in text)
        if text == "class":
            return dict
        return {"nested": [print]} if text == "nested" else text.upper()
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
    aliases = {"fast": endpoint, "optimizer": endpoint}
    (tmp_path / "resources.yaml").write_text(json.dumps(aliases), encoding="utf-8")
    return tmp_path


def write_jsonl(path: Path, rows: list[Any], bom: bool = False) -> Path:
    text = "".join(json.dumps(row) + "\n" for row in rows)
    path.write_text(("\ufeff" if bom else "") + text, encoding="utf-8")
    return path


def command(project: Path, name: str, target: str, *args: str | Path) -> Any:
    return plait_cli(
        name,
        f"{project / 'pipeline.py'}:{target}",
        "--resources",
        project / "resources.yaml",
        *args,
    )


def user_texts(server: Any) -> list[str]:
    requests = server.stats(bodies=True)["requests"]
    return sorted(request["body"]["messages"][-1]["content"] for request in requests)


def rows_of(path: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return {row["index"]: row for row in rows}


def one_line_error(run: Any) -> str:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


# -- point 9: a record's fields map to forward's parameters by name ------------------------------
def test_a_records_fields_reach_forward_by_name_and_the_rest_are_named_once(
    server: Any, project: Path
) -> None:
    rows = [{"text": f"t{i}", "label": f"secret{i}", "id": i} for i in range(3)]
    data = write_jsonl(project / "in.jsonl", rows)
    csv_file = project / "in.csv"
    csv_file.write_text(
        "text,label,id\n" + "".join(f"t{i},secret{i},{i}\n" for i in range(3)), encoding="utf-8"
    )
    for source in (data, csv_file):
        server.reset()
        out = project / f"out-{source.suffix[1:]}.jsonl"
        run = command(project, "run", "Labeller", "-i", source, "-o", out)
        assert run.returncode == 0, run.stderr
        # the label never reaches the model: only the text does
        assert user_texts(server) == ["t0", "t1", "t2"]
        assert {i: row["output"] for i, row in rows_of(out).items()} == {
            i: f"[S] t{i}" for i in range(3)
        }
        assert rows_of(out)[1]["input"]["label"] == "secret1"  # the row echoes the record
        notes = [line for line in run.stderr.splitlines() if "not passed" in line]
        assert len(notes) == 1, run.stderr  # one line for the run, not one per row
        assert "label, id" in notes[0] and "--field" in notes[0]


def test_a_record_that_fits_no_parameter_is_refused_before_the_run(
    server: Any, project: Path
) -> None:
    data = write_jsonl(project / "in.jsonl", [{"question": "q", "label": "x"}] * 3)
    out = project / "out.jsonl"
    for target in ("Labeller", "Untyped"):
        line = one_line_error(command(project, "run", target, "-i", data, "-o", out))
        assert "question, label" in line and "--field" in line
        assert "forward(" in line
    assert server.stats()["requests_total"] == 0
    assert not out.exists()
    # --field still picks one field; a forward that takes a whole record still gets it
    run = command(project, "run", "Labeller", "-i", data, "-o", out, "--field", "question")
    assert run.returncode == 0, run.stderr
    assert user_texts(server) == ["q"] * 3
    for target, tag in (("WholeByType", "W"), ("WholeByName", "N")):
        server.reset()
        out = project / f"{target}.jsonl"
        run = command(project, "run", target, "-i", data, "-o", out)
        assert run.returncode == 0, run.stderr
        assert rows_of(out)[0]["output"].startswith(f"[{tag}] ")
        assert '"label": "x"' in rows_of(out)[0]["output"]


def test_eval_and_train_map_fields_by_name_and_refuse_a_missing_target(
    server: Any, project: Path
) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"text": "a", "label": "[S] a", "note": "n"}, {"text": "b", "label": "x", "note": "n"}],
    )
    run = command(project, "eval", "Labeller", "--data", data, "--target-field", "label")
    assert run.returncode == 0, run.stderr
    assert "mean 0.5000 over 2 example(s)" in run.stdout
    assert user_texts(server) == ["a", "b"]  # neither the label nor the note
    assert run.stderr.count("not passed") == 1
    assert "the field(s) note are not passed" in run.stderr

    out = project / "trained"
    for name, extra in (("eval", ()), ("train", ("--out", str(out), "-q"))):
        server.reset()
        line = one_line_error(
            command(project, name, "Labeller", "--data", data, "--target-field", "labl", *extra)
        )
        assert "'labl'" in line and "text, label, note" in line and "--target-field" in line
        assert server.stats()["requests_total"] == 0
    assert not (out / "parameters.json").exists()


# -- point 16: one reader for train and eval; a list input is one input ----------------------------
def test_eval_and_train_read_a_bom_and_csv_as_run_does(server: Any, project: Path) -> None:
    data = write_jsonl(
        project / "bom.jsonl",
        [{"input": "a", "target": "[S] a"}, {"input": "b", "target": "[S] b"}],
        bom=True,
    )
    run = command(project, "eval", "Labeller", "--data", data)
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 2 example(s)" in run.stdout
    table = project / "data.csv"
    table.write_text("\ufefftext,target\na,[S] a\nb,nope\n", encoding="utf-8")
    run = command(project, "eval", "Labeller", "--data", table)
    assert run.returncode == 0, run.stderr
    assert "mean 0.5000 over 2 example(s)" in run.stdout
    out = project / "trained"
    run = command(
        project, "train", "Labeller", "--data", data, "--val", table, "--out", out,
        "--max-steps", "1", "-q",
    )  # fmt: skip
    assert "Traceback" not in run.stderr
    assert "not JSON" not in run.stderr and "line 1" not in run.stderr
    assert (out / "history.json").exists(), run.stderr


def test_eval_passes_a_list_input_as_one_input(server: Any, project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"input": ["a", "b"], "target": "[J] a + b"}, {"input": ["c"], "target": "[J] c"}],
    )
    rows = project / "rows.jsonl"
    run = command(project, "eval", "Joiner", "--data", data, "--output", rows)
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 2 example(s)" in run.stdout
    assert user_texts(server) == ["a + b", "c"]
    assert rows_of(rows)[0]["output"] == "[J] a + b"


# -- point 3: no file is destroyed by a mistake ----------------------------------------------------
def test_eval_never_writes_over_its_data(server: Any, project: Path) -> None:
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "target": "[S] a"}])
    before = data.read_bytes()
    link = project / "link.jsonl"
    link.symlink_to(data)
    for target in (data, link, project / "." / "data.jsonl"):
        line = one_line_error(command(project, "eval", "Labeller", "--data", data, "-o", target))
        assert f"--output {target} is the --data file" in line
        assert data.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_train_never_writes_its_results_over_its_data(server: Any, project: Path) -> None:
    rows = [{"input": "a", "target": "[S] a"}]
    out = project / "trained"
    out.mkdir()
    data = write_jsonl(out / "history.json", rows)  # a dataset where a result would go
    val = write_jsonl(project / "val.jsonl", rows)
    before = data.read_bytes()
    line = one_line_error(command(project, "train", "Labeller", "--data", data, "--out", out))
    assert f"--out {out / 'history.json'} is the --data file" in line
    line = one_line_error(
        command(project, "train", "Labeller", "--data", val, "--val", val, "--out", val)
    )
    assert f"--out {val} is a file" in line  # caught before training, not after it
    assert data.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_a_csv_with_an_unclosed_quote_is_refused_naming_the_line(
    server: Any, project: Path
) -> None:
    broken = project / "broken.csv"
    # line 3 opens a quote that the csv module would close on line 5, merging rows
    broken.write_text('text,target\na,[S] a\n"b x,1\nc,2\nd "q",4\ne,5\n', encoding="utf-8")
    unclosed = project / "unclosed.csv"
    unclosed.write_text('text,target\na,1\nb,2\n"c,3\nd,4\n', encoding="utf-8")
    out = project / "out.jsonl"
    for name, args in (
        ("run", ("-i", "{}", "-o", str(out))),
        ("eval", ("--data", "{}")),
        ("train", ("--data", "{}", "--out", str(project / "trained"), "-q")),
    ):
        for path, line_number in ((broken, 3), (unclosed, 4)):
            argv = [str(path) if arg == "{}" else arg for arg in args]
            line = one_line_error(command(project, name, "Labeller", *argv))
            assert f"{path} line {line_number}" in line, (name, line)
            assert "quoted field" in line
    assert server.stats()["requests_total"] == 0
    assert not out.exists()


# -- point 12: bad values are refused, not sent ---------------------------------------------------
@pytest.mark.parametrize(("value", "given"), [(None, "null"), (5, "number"), (["x"], "list")])
def test_a_parameter_value_of_the_wrong_type_is_refused(
    server: Any, project: Path, value: Any, given: str
) -> None:
    params = project / "parameters.json"
    params.write_text(json.dumps({"llm.system_prompt": value}), encoding="utf-8")
    data = write_jsonl(project / "data.jsonl", [{"input": "a", "target": "a"}])
    inputs = write_jsonl(project / "in.jsonl", ["a"])
    for name, args in (("eval", ("--data", data)), ("run", ("-i", inputs))):
        line = one_line_error(command(project, name, "Labeller", *args, "--parameters", params))
        assert "llm.system_prompt" in line and str(params) in line
        assert f"expected text, given {given}" in line
    assert server.stats()["requests_total"] == 0


def test_code_returned_as_an_output_is_that_inputs_error_row(project: Path) -> None:
    kinds = ["function", "module", "generator", "class", "nested", "fine"]
    inputs = write_jsonl(project / "in.jsonl", kinds)
    out = project / "out.jsonl"
    run = command(project, "run", "NotData", "-i", inputs, "-o", out)
    assert run.returncode == 1, run.stderr
    rows = rows_of(out)
    assert rows[5]["output"] == "FINE"
    for index, kind in enumerate(["function", "module", "generator", "type", "builtin"]):
        error = rows[index]["error"]
        assert error["type"] == "UnwritableOutput" and "output" not in rows[index]
        assert f"it holds a {kind}" in error["message"], error
    assert "6 input(s): 1 succeeded, 5 failed" in run.stderr


# -- friction: quiet, progress, documents --------------------------------------------------------
def test_quiet_means_the_summary_line_and_eval_shows_progress(server: Any, project: Path) -> None:
    inputs = write_jsonl(project / "in.jsonl", ["a", "b"])
    run = command(project, "run", "Labeller", "-i", inputs, "-o", project / "out.jsonl", "-q")
    assert run.returncode == 0, run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert "2 input(s): 2 succeeded, 0 failed" in run.stderr
    assert "plait usage" not in run.stderr
    data = write_jsonl(project / "data.jsonl", [{"input": x, "target": f"[S] {x}"} for x in "abcd"])
    run = command(project, "eval", "Labeller", "--data", data)
    assert run.returncode == 0, run.stderr
    assert "plait eval: 4/4 inputs (100%)" in run.stderr
    quiet = command(project, "eval", "Labeller", "--data", data, "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "" and quiet.stdout == run.stdout


def test_a_whole_file_or_each_file_of_a_directory_is_one_input(server: Any, project: Path) -> None:
    folder = project / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("second\n\nparagraph two\n", encoding="utf-8")
    (folder / "a.md").write_text("\ufefffirst doc", encoding="utf-8")
    (folder / "sub").mkdir()  # not a regular file: not an input
    out = project / "out.jsonl"
    run = command(project, "run", "Labeller", "-i", folder, "-o", out)
    assert run.returncode == 0, run.stderr
    rows = rows_of(out)
    assert rows[0] == {"index": 0, "input": str(folder / "a.md"), "output": "[S] first doc"}
    assert rows[1]["output"] == "[S] second\n\nparagraph two\n"
    assert len(rows) == 2
    # an output inside the directory would be an input of the next run: refused
    line = one_line_error(command(project, "run", "Labeller", "-i", folder, "-o", folder / "o"))
    assert "inside the input directory" in line and not (folder / "o").exists()
    server.reset()
    out = project / "one.jsonl"
    run = command(
        project, "run", "Labeller", "-i", folder / "b.txt", "--format", "document", "-o", out
    )
    assert run.returncode == 0, run.stderr
    assert user_texts(server) == ["second\n\nparagraph two\n"]
