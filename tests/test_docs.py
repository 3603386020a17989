"""The docs say what plait does: README examples run as written, and examples/README.md
names every example and data file (issue 20, friction)."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_fake_server_example_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Testing without endpoints\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "FakeOpenAIServer" in block and "base_url" in block
    # A process of its own, as a user would run it: the block starts and stops its server.
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_readme_batch_api_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Cutting cost\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'backend="batch"' in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "batched" / "batches.jsonl").is_file()


def test_the_examples_readme_names_every_example_and_data_file() -> None:
    """Was stale: no `train_classifier.py`, "training gets its own example once the
    optimizer lands", and half the data files unexplained."""
    examples = ROOT / "examples"
    text = (examples / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in examples.glob("*.py") if not p.name.startswith("_"))
    data = sorted(p.name for p in (examples / "data").iterdir())
    assert scripts and data
    assert [name for name in scripts if f"| `{name}` |" not in text] == []
    assert [name for name in data if f"`data/{name}`" not in text] == []
    assert "once the optimizer lands" not in text


def test_the_architecture_documents_handler_example_counts_calls(tmp_path: Path) -> None:
    """docs/architecture.md's handler, as written, counts a real run's LLM calls."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class CountCalls(Handler)" in block
    script = tmp_path / "count.py"
    script.write_text(
        block
        + """
import plait
from plait.testing import FakeOpenAIServer

class Pair(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = plait.LLMInference("fast", system_prompt="A")
        self.b = plait.LLMInference("fast", system_prompt="B")

    def forward(self, text: str) -> object:
        return self.b(self.a(text))

with FakeOpenAIServer() as server:
    resources = plait.ResourceConfig(
        {"fast": {"provider": "openai", "model": "m", "base_url": server.base_url,
                  "api_key": "sk-test"}}
    )
    with CountCalls() as counts:
        Pair().bind(resources=resources).run_sync(["x", "y", "z"])
    print(sorted(counts.by_module.items()))
""",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('a', 3), ('b', 3)]"


def test_the_readme_embedded_model_settings_are_valid_and_run(tmp_path: Path) -> None:
    import tomllib

    import plait

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### The embedded model\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    settings = tomllib.loads(block)["resources"]["fast"]
    settings.pop("model_path")  # an example path: the packaged model stands in for it
    resources = plait.ResourceConfig({"fast": settings})
    assert resources["fast"].provider == "local" and resources["fast"].max_concurrent == 4
    answer = plait.LLMInference("fast", max_tokens=4).run_sync("Say hi.", resources=resources)
    assert isinstance(answer, str) and answer.strip()


def test_the_readme_labels_example_prints_labels(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### Answers that are labels\n", 1)[1].split("\n### ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "knn_demos" in block and "Literal[" in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    printed = ast.literal_eval(result.stdout.strip().splitlines()[-1])  # two labels
    labels = {"billing", "shipping", "technical", "account"}
    assert len(printed) == 2 and set(printed) <= labels


def test_the_readme_serve_commands_show_what_they_say(server: Any, tmp_path: Path) -> None:
    """The "Serving a pipeline" section, run as written: its pipeline file and resources,
    its `plait serve` command (on a free port), and each curl command, whose reply must be
    the one shown (a job's id and the fields shown as ``...`` aside)."""
    pytest.importorskip("fastapi")
    if shutil.which("curl") is None:
        pytest.skip("no curl here")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Serving a pipeline\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    python_block, toml_block, start, session = (body for _, body in blocks)
    assert [kind for kind, _ in blocks] == ["python", "toml", "", ""]
    (tmp_path / "review.py").write_text(python_block, encoding="utf-8")
    (tmp_path / "resources.toml").write_text(
        toml_block.replace("http://127.0.0.1:8000/v1", server.base_url), encoding="utf-8"
    )
    assert "python -m plait.testing.fake_openai --port 8000" in start  # the fixture's stand-in
    command = next(line for line in start.splitlines() if line.startswith("plait serve"))
    args = shlex.split(command.split("#", 1)[0])[2:]
    args[args.index("--port") + 1] = "0"
    log = tmp_path / "serve.log"
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plait.cli", "serve", *args],
            cwd=tmp_path,  # where review.py is, as for the user
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *path])},
        )
    try:
        port = _served_port(proc, log)
        ran = 0
        job = ""
        for step in session.split("$ ")[1:]:
            shown_command, _, shown = step.partition("\n")
            shell = shown_command.replace("localhost:8080", f"localhost:{port}")
            if "/jobs/JOB" in shell:
                _wait_for_job(port, job)
                shell = shell.replace("JOB", job)
            out = subprocess.run(
                shell, shell=True, capture_output=True, text=True, timeout=60, check=True
            ).stdout
            if "/stream" in shell:  # rows come as they finish: any order, the summary last
                got, want = out.strip().split("\n\n"), shown.strip().split("\n\n")
                assert sorted(got[:-1]) == sorted(want[:-1]) and got[-1] == want[-1], out
            elif "..." in shown:
                reply = json.loads(out)
                job = job or reply["id"]
                expected = shown.strip().replace("JOB", job).replace(",...}", "}")
                assert {k: reply[k] for k in json.loads(expected)} == json.loads(expected)
            else:
                assert out == shown.strip(), out
            ran += 1
        assert ran == 6
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text(encoding="utf-8")


def _served_port(proc: subprocess.Popen[bytes], log: Path) -> int:
    """The port ``plait serve`` bound, once its /health answers 200 (polled, never slept)."""
    deadline = time.monotonic() + 60
    port = 0
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(encoding="utf-8")
        text = log.read_text(encoding="utf-8")
        if not port and " on http://" in text:
            port = int(text.split(" on http://", 1)[1].split()[0].rsplit(":", 1)[1])
        if port:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        return port
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError(f"plait serve never became ready:\n{log.read_text(encoding='utf-8')}")


def _wait_for_job(port: int, job: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/{job}") as response:
            if json.loads(response.read())["state"] == "done":
                return
        time.sleep(0.02)
    raise AssertionError(f"job {job} never finished")


def test_the_readme_opentelemetry_example_prints_one_trace_per_run(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## OpenTelemetry\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "otel(" in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("chat gpt-4o-mini summarize 0") == 1
    assert lines.count("chat gpt-4o-mini grade 1") == 1
    assert lines.count("Review Review 0") == 1
    assert lines[-2] == "run Review None None"
    assert lines[-1].endswith(" tokens") and float(lines[-1].split()[0]) > 0


def test_the_readme_learned_limits_example_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Limits learned from the provider\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "rpm_limit" in block and "limits" in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "'reported': 300" in result.stdout


def test_the_readme_learning_commands_run_as_written(server: Any, tmp_path: Path) -> None:
    """Every ``plait`` command of the Learning section, in its order, in a user's folder
    holding the section's own pipeline files (and the examples it names): each exits 0,
    and what `plait train` wrote is what `plait eval` and `plait run` then use.

    The one thing added to each command is ``--resources resources.toml`` (the fake
    server for every alias, answering a request that shows demonstrations as the one
    next to its input was answered), as a user adds theirs; without it the commands run
    on the embedded model.  Was: `plait eval --parameters` refused what `plait train
    --demos knn` wrote."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Learning\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    code = {kind: [body for k, body in blocks if k == kind] for kind in ("python", "")}
    files = {
        "extract.py": next(body for body in code["python"] if "class Extract(" in body),
        "triage.py": next(body for body in code["python"] if "class Triage(" in body),
        "metrics.py": next(body for body in code["python"] if body.startswith("# metrics.py")),
    }
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    (tmp_path / "examples" / "data").mkdir(parents=True)
    for name in ("train_classifier.py", "_resources.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / "examples" / name)
    for name in ("sentiment_train.jsonl", "sentiment_val.jsonl"):
        shutil.copy(ROOT / "examples" / "data" / name, tmp_path / "examples" / "data" / name)
    messages = {
        "train": [
            ("I was charged twice this month.", "billing"),
            ("My parcel has not arrived yet.", "shipping"),
            ("The app crashes when I log in.", "technical"),
            ("Please change my email address.", "account"),
        ],
        "val": [("Why was I charged again?", "billing"), ("Where is my parcel?", "shipping")],
        "test": [("I was charged two times.", "billing"), ("The app crashes again.", "technical")],
    }
    for name, pairs in messages.items():
        rows = [{"message": message, "target": target} for message, target in pairs]
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
        )
    (tmp_path / "messages.jsonl").write_text(
        "".join(json.dumps({"message": m}) + "\n" for m, _ in messages["test"]), encoding="utf-8"
    )
    server.configure(answer_like_demos=True)
    (tmp_path / "resources.toml").write_text(
        "".join(
            f'[resources.{alias}]\nprovider = "openai"\nmodel = "m"\n'
            f'base_url = "{server.base_url}"\napi_key = "sk-test"\n'
            for alias in ("fast", "local", "classifier", "optimizer", "judge")
        ),
        encoding="utf-8",
    )
    commands = [
        shlex.split(line, comments=True)
        for body in code[""]
        for line in body.replace("\\\n", " ").splitlines()
        if line.startswith("plait ")
    ]
    assert [argv[:3] for argv in commands] == [
        ["plait", "train", "extract.py:Extract"],
        ["plait", "train", "triage.py:Triage"],
        ["plait", "eval", "triage.py:Triage"],
        ["plait", "run", "triage.py:Triage"],
        ["plait", "train", "examples/train_classifier.py:SentimentClassifier"],
        ["plait", "eval", "examples/train_classifier.py:SentimentClassifier"],
        ["plait", "eval", "examples/train_classifier.py:SentimentClassifier"],
    ]
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *path])}
    printed: list[str] = []
    for argv in commands:
        result = subprocess.run(
            [sys.executable, "-m", "plait.cli", *argv[1:], "--resources", "resources.toml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert result.returncode == 0, (argv, result.stderr)
        printed.append(result.stdout)

    def history(out: str) -> dict[str, Any]:
        saved: dict[str, Any] = json.loads((tmp_path / out / "history.json").read_text())
        return saved

    # eval scores the pipeline train left, as train's own held-out test scored it
    triage = history("runs/triage")["final_test_score"]
    assert f"mean {triage:.4f} over 2 example(s)" in printed[2]
    assert triage == 1.0  # the pool chose each message's own kind of example
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert sorted((row["index"], row["output"]) for row in answers) == [
        (0, "billing"),
        (1, "technical"),
    ]
    classifier = history("runs/train")["final_test_score"]
    assert f"mean {classifier:.4f} over 8 example(s)" in printed[5]
    assert (tmp_path / "scored.jsonl").is_file()
    assert "mean " in printed[6] and "over 8 example(s)" in printed[6]
