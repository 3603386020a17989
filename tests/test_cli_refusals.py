"""A refused command leaves every file as it was, and reports what it refused; and
what run, eval and train read reaches ``forward`` alike (several fields by name).

A re-run that is refused (an input edited since the checkpoint recorded it, an
endpoint or a parameter changed, code that cannot be traced) must not cost the
rows a finished run paid for: the output file and the trace stay byte-identical.

Every request goes to the loopback fake server.
"""

from __future__ import annotations

import json
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import plait_cli

PIPELINE = """
import plait

class Echo(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", system_prompt="S")

    def forward(self, text: str):
        return self.llm(text)

class Two(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("T", description="Answering."), demos=[]
        )

    def forward(self, question: str, context: str):
        return self.llm(f"{question} | {context}")


class ReturnsAModule(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Echo()

    async def forward(self, text: str):
        return {"pipeline": self.inner} if text == "nested" else self.inner if text == "m" else text


class ReturnsCode(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("C", description="Coding.")
        )

    async def forward(self, text: str):
        await self.llm(text)
        return len  # the function, by mistake: its repr holds "built-in function"


class ReturnsAnObject(plait.Module):
    async def forward(self, text: str):
        import threading

        return {"lock": threading.Lock()} if text == "lock" else object() if text == "o" else text


class Untraceable(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", system_prompt="S")

    def forward(self, text: str):
        reply = self.llm(text)
        if reply == "x":  # a branch on a value only known when the call returns
            return reply
        return reply
"""


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    write_resources(tmp_path / "resources.yaml", server.base_url, "m")
    return tmp_path


def write_resources(path: Path, base_url: str, model: str) -> Path:
    endpoint = {"provider": "openai", "model": model, "base_url": base_url, "api_key": "sk-test"}
    path.write_text(json.dumps({"fast": endpoint, "optimizer": endpoint}), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def refusal(run: Any) -> str:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("plait ") and ": error: " in line, run.stderr
    return line


def test_a_refused_rerun_leaves_the_output_and_the_trace_as_they_were(
    server: Any, project: Path
) -> None:
    inputs = write_jsonl(project / "in.jsonl", [f"doc {i}" for i in range(5)])
    out, trace = project / "out.jsonl", project / "trace.json"
    resources = project / "resources.yaml"

    def run(*extra: str | Path, target: str = "Echo", inputs: Path = inputs) -> Any:
        return plait_cli(
            "run", f"{project / 'pipeline.py'}:{target}", "-i", inputs, "-o", out,
            "--profile", trace, "--resources", resources, "-q", *extra,
        )  # fmt: skip

    first = run()
    assert first.returncode == 0, first.stderr
    paid = server.stats()["requests_total"]
    assert paid == 5
    rows, traced = out.read_bytes(), trace.read_bytes()
    assert len(rows.splitlines()) == 5

    # an input edited after the run: found only once the inputs are being answered
    edited = write_jsonl(project / "edited.jsonl", ["doc 0", "doc 1 EDITED", "doc 2"])
    line = refusal(run(inputs=edited))
    assert "input #1 differs" in line
    assert out.read_bytes() == rows and trace.read_bytes() == traced
    # the endpoint changed under the checkpoint
    write_resources(resources, server.base_url, "other-model")
    assert "model changed" in refusal(run())
    assert out.read_bytes() == rows and trace.read_bytes() == traced
    write_resources(resources, server.base_url, "m")
    # code that cannot be traced, with no checkpoint to refuse it first
    line = refusal(run("--no-checkpoint", target="Untraceable"))
    assert "cannot be traced" in line
    assert out.read_bytes() == rows and trace.read_bytes() == traced
    assert server.stats()["requests_total"] == paid
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == []

    # several refused re-runs at once (whichever takes the file first restores it)
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda _: run(inputs=edited), range(3)))
    assert all(d.returncode == 2 and "Traceback" not in d.stderr for d in done)
    assert out.read_bytes() == rows and trace.read_bytes() == traced

    # and a run that is not refused still rewrites both
    again = run()
    assert again.returncode == 0, again.stderr
    assert len(out.read_bytes().splitlines()) == 5


def test_a_refused_first_run_leaves_no_output_file(server: Any, project: Path) -> None:
    inputs = write_jsonl(project / "in.jsonl", ["a"])
    out = project / "out.jsonl"
    run = plait_cli(
        "run", f"{project / 'pipeline.py'}:Untraceable", "-i", inputs, "-o", out,
        "--resources", project / "resources.yaml",
    )  # fmt: skip
    assert "cannot be traced" in refusal(run)
    assert not out.exists()
    assert server.stats()["requests_total"] == 0


def test_no_command_writes_over_the_pipelines_own_source(server: Any, project: Path) -> None:
    source = project / "pipeline.py"
    before = source.read_bytes()
    inputs = write_jsonl(project / "in.jsonl", ["a"])
    data = write_jsonl(project / "data.jsonl", [{"text": "a", "target": "[S] a"}])
    for name, args in (
        ("run", ("-i", inputs, "-o", source)),
        ("run", ("-i", inputs, "-o", project / "out.jsonl", "--profile", source)),
        ("eval", ("--data", data, "-o", source)),
    ):
        run = plait_cli(name, f"{source}:Echo", "--resources", project / "resources.yaml", *args)
        line = refusal(run)
        assert f"is the pipeline's source file {source}" in line, line
        assert source.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_no_command_writes_over_a_module_the_pipeline_imports(server: Any, project: Path) -> None:
    """The pipeline's code is more than its own file: a helper it imports (and one that
    helper imports) is as much its code, and as much worth keeping."""
    package = project / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "helpers.py").write_text("from .deep import PREFIX\n", encoding="utf-8")
    (package / "deep.py").write_text('PREFIX = "> "\n', encoding="utf-8")
    (package / "pipe.py").write_text(
        textwrap.dedent(
            """
            import plait
            from pkg.helpers import PREFIX

            class P(plait.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.llm = plait.LLMInference("fast", system_prompt="S")

                def forward(self, text: str):
                    return self.llm(PREFIX + text)
            """
        ),
        encoding="utf-8",
    )
    inputs = write_jsonl(project / "in.jsonl", ["a"])
    data = write_jsonl(project / "data.jsonl", [{"text": "a", "target": "a"}])
    env = {"PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")])}
    for victim in ("helpers.py", "deep.py", "__init__.py"):
        path = package / victim
        before = path.read_bytes()
        for name, args in (
            ("run", ("-i", inputs, "-o", path)),
            ("eval", ("--data", data, "-o", path)),
        ):
            run = plait_cli(
                name, "pkg.pipe:P", "--resources", project / "resources.yaml", *args, env=env
            )
            line = refusal(run)
            assert f"is the pipeline's source file {path}" in line, line
            assert path.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_a_quoted_csv_field_spanning_lines_is_read_and_said(server: Any, project: Path) -> None:
    table = project / "data.csv"
    table.write_text('text,target\n"a,A\nb,A\nc",A\nd,[S] d\ne,[S] e\n', encoding="utf-8")
    for name, args in (
        ("run", ("-i", table, "-o", project / "out.jsonl", "-q")),
        ("eval", ("--data", table, "-q")),
    ):
        run = plait_cli(
            name, f"{project / 'pipeline.py'}:Echo", "--resources", project / "resources.yaml",
            *args,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        notes = [line for line in run.stderr.splitlines() if "spans lines" in line]
        assert len(notes) == 1, run.stderr
        assert "read as 3 row(s)" in notes[0] and "spans lines 2-4" in notes[0]
    assert "mean 0.6667 over 3 example(s)" in run.stdout
    # a file with no line break inside a field: nothing to say
    table.write_text("text,target\nd,[S] d\n", encoding="utf-8")
    run = plait_cli(
        "eval", f"{project / 'pipeline.py'}:Echo", "--resources", project / "resources.yaml",
        "--data", table, "-q",
    )  # fmt: skip
    assert run.returncode == 0 and run.stderr == "", run.stderr


def test_eval_refuses_code_that_cannot_be_traced_before_any_example_runs(
    server: Any, project: Path
) -> None:
    data = write_jsonl(project / "data.jsonl", [{"text": f"t{i}", "target": "x"} for i in range(6)])
    run = plait_cli(
        "eval", f"{project / 'pipeline.py'}:Untraceable", "--data", data,
        "--resources", project / "resources.yaml", "-q",
    )  # fmt: skip
    line = refusal(run)
    assert run.stderr.strip() == line  # said once, not once per example
    assert "cannot be traced, so no example was run" in line
    assert run.stdout == ""
    assert server.stats()["requests_total"] == 0


def test_eval_exits_1_when_examples_failed_and_still_prints_the_mean(
    server: Any, project: Path
) -> None:
    data = write_jsonl(project / "data.jsonl", [{"text": f"t{i}", "target": "x"} for i in range(3)])
    wrong = project / "wrong.yaml"
    endpoint = {"provider": "openai", "model": "m", "base_url": server.base_url, "api_key": "no"}
    wrong.write_text(json.dumps({"fast": endpoint}), encoding="utf-8")
    run = plait_cli(
        "eval", f"{project / 'pipeline.py'}:Echo", "--data", data, "--resources", wrong, "-q"
    )
    assert run.returncode == 1, run.stderr
    assert "mean 0.0000 over 3 example(s)" in run.stdout
    assert "3 of 3 example(s) failed" in run.stderr
    assert "Traceback" not in run.stderr
    good = write_jsonl(project / "good.jsonl", [{"text": "t", "target": "[S] t"}])
    run = plait_cli(
        "eval", f"{project / 'pipeline.py'}:Echo", "--data", good,
        "--resources", project / "resources.yaml", "-q",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 1 example(s)" in run.stdout


def test_a_module_returned_as_an_output_is_that_inputs_error_row(project: Path) -> None:
    inputs = write_jsonl(project / "in.jsonl", ["m", "nested", "fine"])
    out = project / "out.jsonl"
    run = plait_cli(
        "run", f"{project / 'pipeline.py'}:ReturnsAModule", "-i", inputs, "-o", out,
        "--resources", project / "resources.yaml", "--no-checkpoint", "-q",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows[2]["output"] == "fine"
    for index in (0, 1):
        assert "output" not in rows[index]
        assert rows[index]["error"]["type"] == "UnwritableOutput"
        assert "plait Module (Echo)" in rows[index]["error"]["message"]
    assert "3 input(s): 1 succeeded, 2 failed" in run.stderr


def test_code_returned_as_an_output_is_never_scored(project: Path) -> None:
    """eval and train score outputs as text: a function's repr must not pass for an
    answer (with a contains loss it even holds the target)."""
    rows = [{"text": f"q{i}", "target": "built-in function"} for i in range(3)]
    data = write_jsonl(project / "data.jsonl", rows)
    common = ["--loss", "contains", "--resources", project / "resources.yaml", "-q"]
    target = f"{project / 'pipeline.py'}:ReturnsCode"
    scored = plait_cli("eval", target, "--data", data, *common)
    assert scored.returncode == 1, scored.stderr
    assert scored.stdout.startswith("mean 0.0000 over 3 example(s)")
    assert "code, not data" in scored.stderr
    trained = plait_cli(
        "train", target, "--data", data, "--val", data, "--out", project / "out", *common
    )
    assert trained.returncode != 0 and "Traceback" not in trained.stderr
    assert "code, not data" in trained.stderr and "completed" not in trained.stderr


def test_an_object_whose_only_text_is_its_address_is_an_error_row(project: Path) -> None:
    """A lock or a bare object written as "<unlocked _thread.lock object at 0x...>"
    would pass for an output (on workers the same row is already an error)."""
    inputs = write_jsonl(project / "in.jsonl", ["lock", "o", "fine"])
    out = project / "out.jsonl"
    run = plait_cli(
        "run", f"{project / 'pipeline.py'}:ReturnsAnObject", "-i", inputs, "-o", out,
        "--no-checkpoint", "-q",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows[2]["output"] == "fine"
    for index, kind in ((0, "lock"), (1, "object")):
        assert "output" not in rows[index]
        assert rows[index]["error"]["type"] == "UnwritableOutput"
        assert (
            f"holds a {kind} whose only text is its place in memory"
            in (rows[index]["error"]["message"])
        )


def test_hidden_files_of_an_input_directory_are_not_inputs(server: Any, project: Path) -> None:
    folder = project / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("first", encoding="utf-8")
    (folder / ".hidden").write_text("secret notes", encoding="utf-8")
    (folder / ".DS_Store").write_bytes(b"\x00\x01")
    out = project / "out.jsonl"
    run = plait_cli(
        "run", f"{project / 'pipeline.py'}:Echo", "-i", folder, "-o", out,
        "--resources", project / "resources.yaml", "-q",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["input"] for row in rows] == [str(folder / "a.txt")]
    assert server.stats()["requests_total"] == 1
    assert "1 input(s): 1 succeeded" in run.stderr


def test_eval_and_train_pass_several_fields_by_name_as_run_does(server: Any, project: Path) -> None:
    data = write_jsonl(
        project / "data.jsonl",
        [{"question": f"q{i}", "context": "c", "target": f"[T] q{i} | c"} for i in range(3)],
    )
    target = f"{project / 'pipeline.py'}:Two"
    resources = project / "resources.yaml"
    rows = project / "rows.jsonl"
    run = plait_cli("eval", target, "--data", data, "--resources", resources, "-o", rows, "-q")
    assert run.returncode == 0, run.stderr
    assert "mean 1.0000 over 3 example(s)" in run.stdout
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    assert written[0]["input"] == {"question": "q0", "context": "c"}
    asked = sorted(
        r["body"]["messages"][-1]["content"] for r in server.stats(bodies=True)["requests"]
    )
    assert asked == ["q0 | c", "q1 | c", "q2 | c"]

    server.reset()
    out = project / "trained"
    run = plait_cli(
        "train", target, "--data", data, "--val", data, "--resources", resources,
        "--out", out, "--max-steps", "1", "-q",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (out / "parameters.json").is_file()
    asked = [r["body"]["messages"][-1]["content"] for r in server.stats(bodies=True)["requests"]]
    assert "q1 | c" in asked  # the pipeline got both fields by name while training

    server.reset()
    run = plait_cli(
        "train", target, "--data", data, "--resources", resources, "--out", project / "boot",
        "--optimizer", "bootstrap", "--max-steps", "1", "-q",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    asked = [r["body"]["messages"][-1]["content"] for r in server.stats(bodies=True)["requests"]]
    assert "q1 | c" in asked


def test_a_reader_that_leaves_ends_the_command_quietly() -> None:
    """``plait run T --help | head``: the pipe closes before plait has written; it stops
    with the status of a program stopped by SIGPIPE, not a BrokenPipeError traceback."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "plait.cli", "run"]
    command += ["examples/extract_and_compare.py:ExtractAndCompare", "--help"]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
