"""The `plait` command: run, graph and check, as processes and in-process.

Pipelines come from tests/pipelines.py and tests/cli_targets.py; every request goes
to the loopback fake server, whose replies echo "[system prompt] user text".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.cli import main
from plait.testing import FakeOpenAIServer
from tests.pipelines import echo

ROOT = Path(__file__).resolve().parents[1]
FAN = "tests.pipelines:FanOutFanIn"


def fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def write_resources(path: Path, base_url: str, api_key: str = "sk-test", **extra: Any) -> Path:
    settings = {"provider": "openai", "model": "m", "base_url": base_url, **extra}
    lines = []
    for alias in ("fast", "smart"):
        lines.append(f"[{alias}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
        if api_key:
            lines.append(f'api_key = "{api_key}"')
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def res(server: FakeOpenAIServer, tmp_path: Path) -> Path:
    return write_resources(tmp_path / "resources.toml", server.base_url)


def cli(
    *args: str | Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: a process of its own, with no terminal."""
    environ = {k: v for k, v in os.environ.items() if k != "PLAIT_TEST_GATE"}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "plait.cli", *map(str, args)],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def by_index(lines: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    indexes = [line["index"] for line in lines]
    assert sorted(indexes) == list(range(len(lines))), indexes  # every index exactly once
    return {line["index"]: line for line in lines}


def jsonl(path: Path, values: list[Any]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


def calls_recorded(checkpoint: Path) -> int:
    lines = (checkpoint / "log.jsonl").read_text().splitlines()
    return sum(1 for line in lines if json.loads(line)["t"] == "call")


# -- plait run ------------------------------------------------------------------------------------
def test_run_over_jsonl_writes_each_input_once_with_progress_and_usage(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    texts = [f"doc {i}" for i in range(12)]
    out = tmp_path / "runs" / "out.jsonl"  # the directory is created
    done = cli(
        "run", FAN, "--input", jsonl(tmp_path / "in.jsonl", texts), "-o", out, "--resources", res
    )
    assert done.returncode == 0, done.stderr
    lines = by_index(records(out.read_text()))
    assert {i: line["output"] for i, line in lines.items()} == {
        i: fan(t) for i, t in enumerate(texts)
    }
    assert all(lines[i]["input"] == t for i, t in enumerate(texts))
    # no terminal: plain progress lines on stderr, then the summary and the usage table
    assert "plait run: 12/12 inputs (100%)" in done.stderr
    assert f"outputs: {out}" in done.stderr
    assert f"checkpoint: {out}.checkpoint" in done.stderr
    assert "plait usage" in done.stderr and "fast" in done.stderr
    assert done.stdout == ""
    assert server.stats()["requests_total"] == 3 * len(texts)


def test_show_prints_every_result_in_a_table(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    texts = ["alpha", "beta", "[[status:400]]gamma"]
    out = tmp_path / "out.jsonl"
    done = cli(
        "run", FAN, "-i", jsonl(tmp_path / "in.jsonl", texts), "-o", out, "--resources", res,
        "--show",
    )  # fmt: skip
    assert done.returncode == 1
    assert f"results ({out})" in done.stdout
    assert "alpha" in done.stdout and "beta" in done.stdout
    assert "ERROR" in done.stdout  # the failed input is shown as an error, not dropped


def test_show_prints_the_whole_path_of_a_long_output(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    """A table title is wrapped and cut to the table's width: the path was shown as
    ``(/tmp/pytest-of-root/pope...``; it is printed whole, on a line of its own."""
    out = tmp_path / ("a-long-folder-name-" * 6) / "out.jsonl"
    done = cli(
        "run", FAN, "-i", jsonl(tmp_path / "in.jsonl", ["alpha"]), "-o", out, "--resources", res,
        "--show",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"results ({out})" in done.stdout.splitlines()


def test_run_reads_stdin_and_writes_stdout(server: FakeOpenAIServer, res: Path) -> None:
    # JSON objects whose keys are forward's parameters are spread into keyword arguments
    lines = [{"question": "why", "context": "sky"}, {"question": "how"}]
    done = cli(
        "run",
        "tests.cli_targets:Pair",
        "--resources",
        res,
        stdin="".join(json.dumps(line) + "\n" for line in lines),
    )
    assert done.returncode == 0, done.stderr
    outputs = by_index(records(done.stdout))
    assert outputs[0]["output"] == echo("P", "why / sky")
    assert outputs[1]["output"] == echo("P", "how / none")
    assert outputs[0]["input"] == lines[0]
    assert "checkpoint: none" in done.stderr  # stdout output: resumable only with --checkpoint

    # plain text on stdin: sniffed, one input per non-empty line
    done = cli(
        "run",
        "tests.cli_targets:Tagged",
        "--resources",
        res,
        "--input",
        "-",
        stdin="first line\n\n  second, with a comma\n",
    )
    assert done.returncode == 0, done.stderr
    outputs = by_index(records(done.stdout))
    assert [outputs[i]["output"] for i in (0, 1)] == [
        echo("T", "first line"),
        echo("T", "  second, with a comma"),
    ]


def test_run_reads_csv_and_text_files(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "rows.csv"
    table.write_text('question,context\nwhat,"a, b"\nwho,c\n')
    out = tmp_path / "csv.jsonl"
    assert (
        main(
            [
                "run",
                "tests.cli_targets:Pair",
                "-i",
                str(table),
                "-o",
                str(out),
                "--resources",
                str(res),
                "-q",
            ]
        )
        == 0
    )
    lines = by_index(records(out.read_text()))
    assert lines[0]["output"] == echo("P", "what / a, b")
    assert lines[1]["input"] == {"question": "who", "context": "c"}

    # a row whose columns are not forward's parameters: --field picks the argument
    table.write_text("id,text\n1,alpha\n2,beta\n")
    out = tmp_path / "field.jsonl"
    assert (
        main(
            [
                "run",
                "tests.cli_targets:Tagged",
                "-i",
                str(table),
                "-o",
                str(out),
                "--field",
                "text",
                "--resources",
                str(res),
                "-q",
            ]
        )
        == 0
    )
    lines = by_index(records(out.read_text()))
    assert [lines[i]["output"] for i in (0, 1)] == [echo("T", "alpha"), echo("T", "beta")]
    assert lines[1]["input"] == {"id": "2", "text": "beta"}

    text = tmp_path / "lines.txt"
    text.write_text('{"not": "json here"}\n\nplain\n')
    out = tmp_path / "text.jsonl"
    assert (
        main(
            [
                "run",
                "tests.cli_targets:Tagged",
                "-i",
                str(text),
                "-o",
                str(out),
                "--resources",
                str(res),
                "--preserve-order",
                "-q",
            ]
        )
        == 0
    )
    assert [line["output"] for line in records(out.read_text())] == [
        echo("T", '{"not": "json here"}'),
        echo("T", "plain"),
    ]
    capsys.readouterr()


def test_a_failing_input_gives_an_error_line_a_summary_and_status_1(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["fine", "broken [[status:400]]", "also fine"])
    out = tmp_path / "out.jsonl"
    done = cli("run", FAN, "-i", inputs, "-o", out, "--resources", res)
    assert done.returncode == 1, done.stderr
    lines = by_index(records(out.read_text()))
    assert lines[0]["output"] == fan("fine") and lines[2]["output"] == fan("also fine")
    error = lines[1]["error"]
    assert error["type"] == "ProviderError"
    assert "HTTP 400" in error["message"]
    assert error["module_path"] in ("left", "right")
    assert "output" not in lines[1]
    assert "plait run: 1 of 3 input(s) failed: #1 ProviderError" in done.stderr


def test_an_unusable_record_fails_alone(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"ok"\n{"broken json\n{"text": "x"}\n')
    out = tmp_path / "out.jsonl"
    status = main(
        [
            "run",
            "tests.cli_targets:Tagged",
            "-i",
            str(inputs),
            "-o",
            str(out),
            "--field",
            "text",
            "--resources",
            str(res),
        ]
    )
    assert status == 1
    lines = by_index(records(out.read_text()))
    assert lines[0]["error"]["type"] == "InputError"  # a string has no field "text"
    assert "not valid JSON" in lines[1]["error"]["message"]
    assert lines[2]["output"] == echo("T", "x")
    assert "2 of 3 input(s) failed" in capsys.readouterr().err


def test_key_value_arguments_reach_the_module(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["hello"])
    out = tmp_path / "out.jsonl"
    done = cli(
        "run",
        "tests.cli_targets:Tagged",
        "tag=You are terse.",
        "-i",
        inputs,
        "-o",
        out,
        "--resources",
        res,
    )
    assert done.returncode == 0, done.stderr
    assert records(out.read_text())[0]["output"] == echo("You are terse.", "hello")

    # a function returning a module is a target too; options and arguments may interleave
    assert (
        main(
            [
                "run",
                "tests.cli_targets:make_tagged",
                "-i",
                str(inputs),
                "tag=Q",
                "-o",
                str(out),
                "--fresh",
                "--resources",
                str(res),
                "-q",
            ]
        )
        == 0
    )
    assert records(out.read_text())[0]["output"] == echo("Q", "hello")

    # other arguments make another version of the pipeline: its inputs run again, with them
    status = main(
        [
            "run",
            "tests.cli_targets:make_tagged",
            "-i",
            str(inputs),
            "tag=R",
            "-o",
            str(out),
            "--resources",
            str(res),
            "-q",
        ]
    )
    assert status == 0
    assert records(out.read_text())[0]["output"] == echo("R", "hello")
    assert "the command-line arguments (tag)" in capsys.readouterr().err


def test_run_help_lists_the_blueprint_arguments_with_their_layers() -> None:
    done = cli("run", "tests.cli_targets:Tagged", "tag=X", "--help")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert "'X'" in rows["tag"] and "command line" in rows["tag"]
    assert "'fast'" in rows["alias"] and "default" in rows["alias"]
    assert "--resources" in done.stdout and "--checkpoint" in done.stdout


def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    count, gate = 30, 10
    inputs = jsonl(tmp_path / "in.jsonl", [f"item {i}" for i in range(count)])
    checkpoint = tmp_path / "ckpt"
    command = [
        sys.executable,
        "-m",
        "plait.cli",
        "run",
        "tests.cli_targets:Gated",
        "-i",
        str(inputs),
        "--checkpoint",
        str(checkpoint),
        "--resources",
        str(res),
    ]
    # Inputs from the gate-th on wait at the gate forever, so exactly gate - 1 finish and
    # the run can only end by being interrupted: wait for those lines, then press Ctrl-C.
    environ = dict(os.environ, PLAIT_TEST_GATE=str(gate))
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = [json.loads(proc.stdout.readline()) for _ in range(gate - 1)]
    proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert rest == ""  # nothing past the gate finished
    assert "re-run the same command" in stderr and str(checkpoint) in stderr
    assert "Traceback" not in stderr
    recorded = calls_recorded(checkpoint)
    assert recorded >= 2 * (gate - 1)

    server.reset()
    done = cli(
        "run",
        "tests.cli_targets:Gated",
        "-i",
        inputs,
        "--checkpoint",
        checkpoint,
        "--resources",
        res,
    )
    assert done.returncode == 0, done.stderr
    lines = by_index(records(done.stdout))
    assert len(lines) == count
    assert all(lines[i]["output"] == echo("A", echo("B", f"item {i}")) for i in range(count))
    assert all(lines[line["index"]] == line for line in first)  # the same outputs again
    # every call the first run completed is answered from the checkpoint, none is paid twice
    stats = server.stats()
    assert stats["requests_total"] == 2 * count - recorded
    assert f"{gate - 1} from the checkpoint" in done.stderr


def test_an_interrupted_output_file_is_rebuilt_with_each_input_once(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    count = 24
    inputs = jsonl(tmp_path / "in.jsonl", [f"row {i}" for i in range(count)])
    out = tmp_path / "out.jsonl"
    args = [
        "-m",
        "plait.cli",
        "run",
        "tests.cli_targets:Gated",
        "-i",
        str(inputs),
        "-o",
        str(out),
        "--resources",
        str(res),
    ]
    environ = dict(os.environ, PLAIT_TEST_GATE="8")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=environ,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # progress lines, then the gate's announcement
        if line.strip() == "GATE":
            break
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    before = records(out.read_text())
    assert len(before) < count
    assert (tmp_path / "out.jsonl.checkpoint" / "manifest.json").exists()

    done = cli(*args[2:])
    assert done.returncode == 0, done.stderr
    lines = by_index(records(out.read_text()))
    assert len(lines) == count
    assert all(lines[i]["output"] == echo("A", echo("B", f"row {i}")) for i in range(count))


def test_preserve_order_limit_and_profile(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = ["slow [[latency_ms:50]]", *(f"quick {i}" for i in range(9))]
    inputs = jsonl(tmp_path / "in.jsonl", texts)
    out, trace = tmp_path / "out.jsonl", tmp_path / "prof" / "trace.json"
    status = main(
        [
            "run",
            "tests.cli_targets:Tagged",
            "-i",
            str(inputs),
            "-o",
            str(out),
            "--resources",
            str(res),
            "--preserve-order",
            "--limit",
            "6",
            "--profile",
            str(trace),
            "--max-concurrent",
            "4",
        ]
    )
    assert status == 0
    assert [line["index"] for line in records(out.read_text())] == list(range(6))
    assert server.stats()["requests_total"] == 6
    assert json.loads(trace.read_text())["traceEvents"]
    assert f"trace: {trace}" in capsys.readouterr().err


def test_usage_and_configuration_errors_exit_2(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["a", "b"])
    out = str(tmp_path / "out.jsonl")
    cases = [
        (["run", "no_such_file.py:X", "-i", str(inputs)], "no_such_file.py"),
        (["run", "tests.cli_targets", "-i", str(inputs)], "file.py:Name"),
        (["run", "tests.cli_targets:Nope", "-i", str(inputs)], "Nope"),
        (["run", FAN, "-i", str(inputs), "--resources", "missing.toml"], "missing.toml"),
        (["run", FAN, "-i", str(tmp_path / "absent.jsonl"), "--resources", str(res)], "absent"),
        (["run", FAN, "nonsense", "-i", str(inputs)], "nonsense"),
        (["run", FAN, "temperature=2", "-i", str(inputs), "--resources", str(res)], "temperature"),
        (
            [
                "run",
                "tests.cli_targets:Tagged",
                "alias=elsewhere",
                "-i",
                str(inputs),
                "--resources",
                str(res),
            ],
            "elsewhere",
        ),
        (["run", FAN, "-i", str(inputs), "--limit", "0"], "positive integer"),
        (["run"], "TARGET"),
        (["launch"], "unknown command"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        assert expected in capsys.readouterr().err, argv
    assert server.stats()["requests_total"] == 0

    # a checkpoint that recorded other inputs at the same positions is refused, not mixed in
    assert main(["run", FAN, "-i", str(inputs), "-o", out, "--resources", str(res), "-q"]) == 0
    jsonl(inputs, ["a", "changed"])
    assert main(["run", FAN, "-i", str(inputs), "-o", out, "--resources", str(res), "-q"]) == 2
    assert "--fresh" in capsys.readouterr().err
    assert (
        main(["run", FAN, "-i", str(inputs), "-o", out, "--resources", str(res), "-q", "--fresh"])
        == 0
    )
    assert by_index(records(Path(out).read_text()))[1]["output"] == fan("changed")


# -- plait graph ----------------------------------------------------------------------------------
def test_graph_prints_mermaid_and_dot_and_writes_html(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    page = tmp_path / "graph.html"
    done = cli("graph", FAN, "--input", "a sample", "--html", page)
    assert done.returncode == 0, done.stderr
    mermaid, _, dot = done.stdout.partition("digraph plait {")
    assert "flowchart TD" in mermaid
    for path in ("left", "right", "combine"):
        assert f'["{path}<br/>' in mermaid
        assert f'[label="{path}\\nEcho · module · alias fast"]' in dot
    ids = {
        path: line.split()[0]
        for line in dot.splitlines()
        for path in ("left", "right", "combine")
        if f'label="{path}\\n' in line
    }
    assert f"{ids['left']} -> {ids['combine']};" in dot
    assert f"{ids['right']} -> {ids['combine']};" in dot
    assert f"{ids['combine']} -> output;" in dot
    html = page.read_text()
    assert '<pre class="mermaid">' in html and "digraph plait" in html and "combine" in html
    assert server.stats()["requests_total"] == 0  # traced, never called


def test_graph_shows_or_collapses_ops_and_reads_a_sample_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["graph", "tests.pipelines:Shapes", "--format", "dot"]) == 0
    shown = capsys.readouterr().out
    assert "a.upper()" in shown and "style=dashed" in shown
    assert (
        main(["graph", "tests.pipelines:Shapes", "--format", "mermaid", "--ops", "collapsed"]) == 0
    )
    collapsed = capsys.readouterr().out
    assert "upper" not in collapsed and "n1 --> output" in collapsed  # n0: the root's call

    sample = jsonl(tmp_path / "in.jsonl", [{"question": "q", "context": "c"}])
    assert main(["graph", "tests.cli_targets:Pair", "--input", str(sample)]) == 0
    assert '["llm<br/>' in capsys.readouterr().out


# -- plait check ----------------------------------------------------------------------------------
def test_check_reports_each_alias(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, refused_port: int
) -> None:
    done = cli("check", "--resources", res, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "answered in" in done.stdout and "problem" not in done.stdout
    assert "2 of 2 alias(es) ok" in done.stderr

    config = tmp_path / "mixed.toml"
    config.write_text(
        f'[good]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
        f'[wrong_key]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-nope"\n'
        f'[no_env]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key_env = "PLAIT_CLI_TEST_UNSET_KEY"\n'
        f'[down]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:{refused_port}/v1"\n'
        'api_key = "sk-test"\n'
        '[typo]\nprovider = "openai"\nmodel = "m"\nmax_concurent = 3\n'
    )
    done = cli("check", "--resources", config, env={"COLUMNS": "200"})
    assert done.returncode == 1
    problems = {
        line.split("'")[1]: line
        for line in done.stderr.splitlines()
        if line.startswith("plait check: alias")
    }
    assert set(problems) == {"wrong_key", "no_env", "down", "typo"}
    assert "HTTP 401" in problems["wrong_key"] and "key was refused" in problems["wrong_key"]
    assert "PLAIT_CLI_TEST_UNSET_KEY" in problems["no_env"] and "not set" in problems["no_env"]
    assert "cannot connect" in problems["down"]
    assert "max_concurent" in problems["typo"]
    assert "sk-test" not in done.stdout + done.stderr and "sk-nope" not in done.stdout
    assert "1 of 5 alias(es) ok" in done.stderr

    # one alias; --no-call stops short of the request
    server.reset()
    assert cli("check", "--resources", config, "--alias", "good", "--no-call").returncode == 0
    assert server.stats()["requests_total"] == 0
    assert cli("check", "--resources", config, "--alias", "absent").returncode == 2


def test_check_without_resources_loads_and_asks_the_embedded_model() -> None:
    done = cli("check", env={"COLUMNS": "300"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "local/default" in done.stdout and "runtime xllamacpp 20" in done.stdout
    assert "answered in" in done.stdout
    assert "1 of 1 alias(es) ok" in done.stderr


def test_top_level_help() -> None:
    done = cli("--help")
    assert done.returncode == 0
    assert all(name in done.stdout for name in ("run", "graph", "check"))


# -- blueprint knobs of built submodules, as the README spells them --------------------------
EXTRACT = "examples/extract_and_compare.py:ExtractAndCompare"


def test_readme_paths_and_wildcards_reach_the_llm_calls_a_pipeline_builds(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.jsonl"
    done = cli(
        "run", EXTRACT, "-i", jsonl(tmp_path / "in.jsonl", ["great but loud"]), "-o", out,
        "--resources", res, "...temperature=0", "praise.temperature=0.3", "max_tokens=9",
        "compare.max_tokens=5", "compare.system_prompt=Answer in one word.",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sent = {}
    for record in server._call("GET", "/_stats?bodies=1")["requests"]:
        body = record["body"]
        question = body["messages"][-1]["content"]
        which = "complaints" if "dislike?" in question else "praise" if "like?" in question else ""
        sent[which or "compare"] = body
    assert sent["praise"]["temperature"] == 0.3  # exact beats the wildcard
    assert sent["complaints"]["temperature"] == 0 and sent["compare"]["temperature"] == 0
    assert sent["praise"]["max_tokens"] == 9 and sent["compare"]["max_tokens"] == 5
    assert sent["compare"]["messages"][0] == {"role": "system", "content": "Answer in one word."}


def test_run_help_lists_built_submodules_knobs_with_values_and_provenance() -> None:
    done = cli("run", EXTRACT, "praise.temperature=0.3", "--help")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert "0.3" in rows["praise.temperature"] and "command line" in rows["praise.temperature"]
    compare = rows["compare.temperature"].split()
    assert compare[-4:] == ["0", "built", "by", "__init__"]
    assert "'smart'" in rows["compare.alias"]
    assert "64" in rows["max_tokens"] and "default" in rows["max_tokens"]


def test_a_knob_typo_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    done = cli("run", EXTRACT, "-i", jsonl(tmp_path / "in.jsonl", ["x"]), "praise.temprature=0")
    assert done.returncode == 2
    assert "praise.temprature (from command line): unknown argument" in done.stderr
    assert "did you mean 'praise.temperature'" in done.stderr


def test_make_from_argv_builds_from_a_scripts_arguments_and_answers_help(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'examples')!r})\n"
        "import plait\n"
        "from extract_and_compare import ExtractAndCompare\n"
        "built = plait.make_from_argv(ExtractAndCompare)\n"
        "print(built.praise.temperature, built.compare.max_tokens, built.praise.max_tokens)\n"
    )
    run = [sys.executable, str(script)]
    done = subprocess.run(
        [*run, "...temperature=0.5", "max_tokens=3", "compare.max_tokens=8"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.5", "8", "3"]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "praise.temperature" in shown.stdout
    bad = subprocess.run([*run, "compare.max_tokens=0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "compare.max_tokens (from command line): expected a positive whole number" in bad.stderr


@pytest.mark.parametrize("flag", ["--output", "--profile"])
def test_a_run_never_writes_over_its_input(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, flag: str
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["a", "b"])
    before = inputs.read_bytes()
    link = tmp_path / "same.jsonl"
    link.symlink_to(inputs)
    for target in (inputs, link, tmp_path / "." / "in.jsonl"):
        others = ["-o", str(tmp_path / "out.jsonl")] if flag == "--profile" else []
        done = cli("run", FAN, "-i", inputs, flag, target, *others, "--resources", res)
        assert done.returncode == 2, done.stderr
        assert f"{flag} {target} is the input file" in done.stderr
        assert inputs.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_a_run_never_writes_over_the_file_stdin_reads(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["a", "b"])
    before = inputs.read_bytes()
    for flag in ("-o", "--profile"):
        others = ["-o", str(tmp_path / "out.jsonl")] if flag == "--profile" else []
        with open(inputs, "rb") as stdin:
            done = subprocess.run(
                [sys.executable, "-m", "plait.cli", "run", FAN, flag, str(inputs), *others,
                 "--resources", str(res)],
                cwd=ROOT, stdin=stdin, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "is the file stdin reads the inputs from" in done.stderr
        assert inputs.read_bytes() == before
    assert server.stats()["requests_total"] == 0


def test_a_trace_that_cannot_be_written_is_refused_before_the_run(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    inputs = jsonl(tmp_path / "in.jsonl", ["a", "b"])
    out = tmp_path / "out.jsonl"
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (out, "is the --output file"),
        (tmp_path, "is a directory"),
        (a_file / "trace.json", "cannot write --profile"),
    ]
    for trace, said in cases:
        done = cli("run", FAN, "-i", inputs, "-o", out, "--profile", trace, "--resources", res)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and "Traceback" not in done.stderr
        assert not out.exists()
    assert server.stats()["requests_total"] == 0


def test_a_resource_file_that_is_not_utf8_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[fast]\nprovider = "openai"\nmodel = "m\xff"\n')
    inputs = jsonl(tmp_path / "in.jsonl", ["a"])
    for args in (
        ["run", FAN, "-i", inputs, "-o", tmp_path / "out.jsonl", "--resources", bad],
        ["check", "--resources", bad],
    ):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert f"{bad} is not UTF-8 text" in done.stderr and "save it as UTF-8" in done.stderr
    with pytest.raises(plait.ConfigurationError, match="not UTF-8 text"):
        plait.ResourceConfig.load(bad)


# -- clean errors, each naming the file and the fix ------------------------------------------
def test_bad_inputs_and_outputs_are_clean_errors(
    server: FakeOpenAIServer, res: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'"fine"\n\xff\xfe not utf-8\n"also fine"\n')
    out = tmp_path / "out.jsonl"
    done = cli("run", FAN, "-i", bad, "-o", out, "--resources", res)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    rows = by_index(records(out.read_text()))
    assert rows[1]["error"]["message"].startswith(f"{bad} line 2 is not UTF-8 (byte 0xff")
    assert "re-encode" in rows[1]["error"]["message"]
    assert rows[0]["output"] == fan("fine") and rows[2]["output"] == fan("also fine")
    assert "3 input(s): 2 succeeded, 1 failed" in done.stderr

    big = tmp_path / "big.csv"
    big.write_text("text\n" + "x" * 200_000 + "\n")  # past the csv module's 128 KiB default
    wide = tmp_path / "wide.jsonl"
    done = cli("run", FAN, "-i", big, "-o", wide, "--resources", res, "--field", "text")
    assert done.returncode == 0, done.stderr
    assert records(wide.read_text())[0]["output"] == fan("x" * 200_000)

    for target, extra, says in (
        (tmp_path, (), "is a directory; give the path of a file"),
        (bad / "x.jsonl", (), "cannot create the checkpoint directory"),  # under a file
        (bad / "x.jsonl", ("--no-checkpoint",), "cannot write --output"),
    ):
        done = cli("run", FAN, "-i", bad, "-o", target, "--resources", res, *extra)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "--fresh" not in done.stderr


def test_closed_stdin_is_a_clean_error(res: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plait.cli", "run", FAN, "--resources", str(res)],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    assert done.returncode == 2
    assert "stdin is closed" in done.stderr and "Traceback" not in done.stderr
