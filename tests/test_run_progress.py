"""What ``plait run`` tells a user while it runs and when it is stopped: calls moving
before any input has finished, and for a batch-API run, the batches pending at the
provider and how to collect them.  Each run is the real command in a process of its
own against the fake OpenAI server; it is watched through its own progress lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import plait
from plait.cli.progress import Tally, call_sites
from plait.resources.usage import reset_usage
from plait.testing import FakeOpenAIServer

from .conftest import ROOT
from .pipelines import TwoSteps
from .test_cli import write_resources


def _line_with(stream: IO[str], text: str, within: int = 8) -> str:
    """The first line of ``stream`` holding ``text``, among its next ``within`` lines
    (a progress line comes every 2 s, so a run that never says it fails, not hangs)."""
    seen = []
    for line in stream:
        if text in line:
            return line
        seen.append(line)
        if len(seen) >= within:
            break
    raise AssertionError(f"no line holding {text!r} in:\n{''.join(seen)}")


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "plait.cli", "run", *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_progress_shows_the_calls_of_inputs_none_of_which_has_finished(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Three inputs of two calls each, every second call held at the server: no input
    can finish, and the progress line says how far the calls are out of how many."""
    resources = write_resources(tmp_path / "resources.toml", server.base_url)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(f"hold {i}") + "\n" for i in range(3)))
    run = _start(
        "tests.pipelines:TwoSteps", "-i", str(inputs), "-o", str(tmp_path / "out.jsonl"),
        "--resources", str(resources),
    )  # fmt: skip
    assert run.stderr is not None
    try:
        server.wait_parked("hold", 3)
        line = _line_with(run.stderr, "calls: 3 of ~6 done, 3 sending")
        assert line.startswith("plait run: 0/3 inputs (0%) · calls: 3 of ~6 done"), line
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=60)
    assert run.returncode == 130


def test_the_bar_moves_with_the_calls_before_an_input_finishes(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    """A terminal's bar: one input of two calls, its first done, its second held at the
    server, is half way, not at zero."""
    reset_usage()
    pipeline = TwoSteps().bind(resources=resources)
    tally = Tally(total=1)
    tally.calls_per_input = call_sites(pipeline)
    tally.in_flight = 1
    assert tally.calls_per_input == 2 and tally.completed() == 0.0
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(pipeline.run_sync, "hold on")
        try:
            server.wait_parked("hold", 1)
            halfway = tally.completed()
        finally:
            server.open_gate("hold")
        future.result(timeout=120)
    assert halfway == 0.5
    tally.in_flight, tally.succeeded = 0, 1
    assert tally.completed() == 1.0 and "of ~" not in tally.headline()


# -- --batch-api ------------------------------------------------------------------------
def test_batch_api_without_resources_says_what_to_pass_on_the_command_line(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n')
    out = tmp_path / "out.jsonl"
    out.write_text("rows of an earlier run\n")
    done = subprocess.run(
        [
            sys.executable, "-m", "plait.cli", "run", "tests.pipelines:FanOutFanIn",
            "-i", str(inputs), "-o", str(out), "--batch-api",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "pass --resources FILE" in done.stderr
    assert "resources=" not in done.stderr and "ResourceConfig" not in done.stderr
    assert "Traceback" not in done.stderr
    assert out.read_text() == "rows of an earlier run\n"  # refused before it was opened


QUICK = {"batch_idle_s": 0.05, "batch_poll_s": 0.05, "batch_poll_max_s": 0.2}


def test_a_batch_run_names_its_pending_batches_and_ctrl_c_says_how_to_collect_them(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """The fake's batches are held in processing: the progress names the batch at the
    provider; Ctrl-C says it is still pending there and gives the command that collects
    it, which, run as printed, finishes the run without submitting it again."""
    import shlex

    server.close_gate("held")
    server.configure(batch_gate="held")
    resources = write_resources(tmp_path / "resources.toml", server.base_url, **QUICK)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(f"doc {i}") + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    run = _start(
        "tests/pipelines.py:FanOutFanIn", "-i", str(inputs), "-o", str(out),
        "--resources", str(resources), "--batch-api", "--fresh",
    )  # fmt: skip
    assert run.stderr is not None
    try:
        line = _line_with(run.stderr, "batch(es) pending at the provider: batch_")
    finally:
        run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    (batch,) = server.batches()["batches"]
    assert f"1 batch(es) pending at the provider: {batch['id']} (fast, 6 calls)" in line
    told = next(x for x in stderr.splitlines() if "still pending at the provider" in x)
    assert batch["id"] in told and "billed" in told
    command = shlex.split(told.split("run: ", 2)[2])
    assert command[:2] == ["plait", "run"] and "--fresh" not in command

    server.open_gate("held")
    collected = subprocess.run(
        [sys.executable, "-m", "plait.cli", *command[1:]],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    assert len(out.read_text().splitlines()) == 3
    assert max(server.batches()["custom_ids"].values()) == 1  # nothing submitted twice
