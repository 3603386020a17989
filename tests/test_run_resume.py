"""``plait run`` over a checkpoint, as a user reruns it: after an edit of the pipeline's
file or of its command-line settings, after Ctrl-C, and with ``--profile``.

Every run is the real command in a process of its own, against the fake OpenAI server;
what was paid is counted at the server.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from plait.testing import FakeOpenAIServer

from .conftest import ROOT, plait_cli
from .pipelines import echo, two_steps
from .test_cli import write_resources

TWO_STAGES = """
import plait


class Review(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.summary = plait.LLMInference("fast", system_prompt="@SUMMARY@", temperature=0)
        self.verdict = plait.LLMInference("fast", system_prompt="@VERDICT@", temperature=0)

    def forward(self, text: str) -> str:
        return self.verdict(self.summary(text))
"""

TEXTS = ["alpha", "beta", "gamma"]


def write_two_stages(path: Path, summary: str, verdict: str) -> None:
    path.write_text(
        TWO_STAGES.replace("@SUMMARY@", summary).replace("@VERDICT@", verdict), encoding="utf-8"
    )
    for cache in path.parent.glob("__pycache__"):  # as a user's edit would: no stale bytecode
        for compiled in cache.iterdir():
            compiled.unlink()


def outputs_of(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [row["output"] for row in sorted(rows, key=lambda row: row["index"])]


def sent(server: FakeOpenAIServer) -> list[tuple[str, str]]:
    """(system prompt, user message) of every request the server received, sorted."""
    found = []
    for record in server.stats(bodies=True)["requests"]:
        messages = record["body"]["messages"]
        found.append((messages[0]["content"], messages[-1]["content"]))
    return sorted(found)


class TwoStageRun:
    """``plait run code/review.py:Review`` over three inputs, with its checkpoint."""

    def __init__(self, server: FakeOpenAIServer, tmp_path: Path) -> None:
        self.code = tmp_path / "code"
        self.code.mkdir()
        self.source = self.code / "review.py"
        self.resources = write_resources(tmp_path / "resources.toml", server.base_url)
        self.inputs = tmp_path / "in.jsonl"
        self.inputs.write_text("".join(json.dumps(text) + "\n" for text in TEXTS))
        self.out = tmp_path / "out.jsonl"

    def __call__(self, *extra: str) -> subprocess.CompletedProcess[str]:
        target = f"{self.source}:Review"
        return plait_cli(
            "run", target, *extra, "--resources", self.resources, "-i", self.inputs,
            "-o", self.out,
        )  # fmt: skip


# -- an edit of the pipeline's file reruns only the calls whose requests changed ----------
def test_editing_a_system_prompt_in_init_reruns_only_that_stages_calls(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    run = TwoStageRun(server, tmp_path)
    write_two_stages(run.source, "Summarize.", "Judge.")
    first = run()
    assert first.returncode == 0, first.stderr
    assert outputs_of(run.out) == [echo("Judge.", echo("Summarize.", t)) for t in TEXTS]
    assert server.stats()["requests_total"] == 6

    server.reset()
    write_two_stages(run.source, "Summarize.", "Judge strictly.")
    edited = run()
    assert edited.returncode == 0, edited.stderr
    assert outputs_of(run.out) == [echo("Judge strictly.", echo("Summarize.", t)) for t in TEXTS]
    # The summary stage's requests did not change: none of its calls is sent again.
    assert sent(server) == sorted(("Judge strictly.", echo("Summarize.", text)) for text in TEXTS)
    assert "parameter 'verdict.system_prompt'" in edited.stderr
    assert "only calls whose requests changed are paid for" in edited.stderr
    assert "other settings" not in edited.stderr

    # Back to the first prompt: the outputs it made are served again, nothing is paid.
    server.reset()
    write_two_stages(run.source, "Summarize.", "Judge.")
    back = run()
    assert back.returncode == 0, back.stderr
    assert outputs_of(run.out) == [echo("Judge.", echo("Summarize.", t)) for t in TEXTS]
    assert server.stats()["requests_total"] == 0


def test_a_changed_command_line_setting_reruns_only_the_calls_it_changes(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """``verdict.system_prompt=...`` on the command line is the same change as the edit in
    the file above, so it is rerun the same way: new outputs, old calls reused."""
    run = TwoStageRun(server, tmp_path)
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run().returncode == 0

    server.reset()
    changed = run("verdict.system_prompt=Be fair.")
    assert changed.returncode == 0, changed.stderr
    assert outputs_of(run.out) == [echo("Be fair.", echo("Summarize.", t)) for t in TEXTS]
    assert sent(server) == sorted(("Be fair.", echo("Summarize.", text)) for text in TEXTS)
    assert "command-line arguments" in changed.stderr

    # The same command again: every output comes from the checkpoint.
    server.reset()
    again = run("verdict.system_prompt=Be fair.")
    assert again.returncode == 0, again.stderr
    assert server.stats()["requests_total"] == 0
    assert "3 from the checkpoint" in again.stderr


def test_what_a_rerun_cannot_reuse_is_still_refused(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Other inputs at the same positions, and another run seed, are refused before any
    call, as before: the first would mix two datasets' outputs, and the second changes
    every request, so nothing in the checkpoint would be of use."""
    run = TwoStageRun(server, tmp_path)
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run().returncode == 0

    server.reset()
    run.inputs.write_text("".join(json.dumps(text + "!") + "\n" for text in TEXTS))
    other_inputs = run()
    assert other_inputs.returncode == 2
    assert "input #0 differs" in other_inputs.stderr
    assert server.stats()["requests_total"] == 0

    run.inputs.write_text("".join(json.dumps(text) + "\n" for text in TEXTS))
    other_seed = run("--seed", "5")
    assert other_seed.returncode == 2
    assert "the run seed changed" in other_seed.stderr
    assert server.stats()["requests_total"] == 0


# -- Ctrl-C ------------------------------------------------------------------------------
def test_ctrl_c_on_a_fresh_run_says_what_was_kept_and_resumes_without_fresh(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """The resume hint of a run started with --fresh must not say --fresh again: that
    would delete the calls the interrupted run paid for."""
    count = 12
    resources = write_resources(tmp_path / "resources.toml", server.base_url)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(f"hold {i}") + "\n" for i in range(count)))
    out = tmp_path / "out.jsonl"
    command = [
        "run", "tests.pipelines:TwoSteps", "-i", str(inputs), "-o", str(out),
        "--resources", str(resources),
    ]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli", *command, "--fresh"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Every input's first call has its reply (logged) once its second call waits.
        server.wait_parked("hold", count)
    finally:
        proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert f"interrupted: 0 of {count} input(s) finished, 0 failed, {count} call(s) kept" in (
        stderr
    )
    hint = next(line for line in stderr.splitlines() if "to resume" in line)
    assert "without --fresh" in hint, hint
    assert "Traceback" not in stderr

    server.reset()
    server.open_gate("hold")
    done = plait_cli(*command)
    assert done.returncode == 0, done.stderr
    assert outputs_of(out) == [two_steps(f"hold {i}") for i in range(count)]
    # Only the second calls are paid: the first ones are answered from the checkpoint.
    assert [system for system, _ in sent(server)] == ["B"] * count


# -- --profile on a rerun -----------------------------------------------------------------
def test_a_rerun_restoring_every_output_draws_the_calls_that_made_them_in_its_trace(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A full trace is never replaced by one saying only "restored, 0 calls": the new
    trace draws, beside each restored output, the calls the checkpoint logged for it,
    marked restored, with the tokens and model each reply had."""
    from .test_profile import validate_trace

    run = TwoStageRun(server, tmp_path)
    trace = tmp_path / "trace.json"
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run("--profile", str(trace)).returncode == 0
    first = validate_trace(json.loads(trace.read_text()))
    made = sorted(
        (e["args"]["input_index"], e["args"]["node_id"])
        for e in first
        if e.get("cat") == "llm" and e.get("ph") == "X"
    )
    assert len(made) == 6

    server.reset()
    again = run("--profile", str(trace))
    assert again.returncode == 0, again.stderr
    assert server.stats()["requests_total"] == 0
    second = validate_trace(json.loads(trace.read_text()))
    assert not [e for e in second if e.get("cat") == "llm"]  # nothing was sent
    drawn = [e for e in second if e.get("cat") == "checkpoint" and e.get("ph") == "X"]
    assert sorted((e["args"]["input_index"], e["args"]["node_id"]) for e in drawn) == made
    assert all(
        e["args"]["outcome"] == "restored" and e["name"].endswith("(restored)") for e in drawn
    )
    assert all(e["args"]["model"] == "m" and len(e["args"]["tokens"]) == 2 for e in drawn)
    assert all("made_at" in e["args"] for e in drawn)
    assert "checkpoint: 3 output(s) restored, 0 calls sent; the 6 earlier call(s)" in json.dumps(
        second
    )


def test_a_restored_output_draws_the_calls_of_its_own_version_after_an_edit(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """After an edit and a return to the first prompt, the outputs restored are the
    first version's: their trace draws that version's calls, not the edited ones."""
    from .test_profile import validate_trace

    run = TwoStageRun(server, tmp_path)
    trace = tmp_path / "trace.json"
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run().returncode == 0
    write_two_stages(run.source, "Summarize.", "Judge strictly.")
    assert run().returncode == 0
    write_two_stages(run.source, "Summarize.", "Judge.")
    server.reset()
    assert run("--profile", str(trace)).returncode == 0
    assert server.stats()["requests_total"] == 0
    drawn = [
        e
        for e in validate_trace(json.loads(trace.read_text()))
        if e.get("cat") == "checkpoint" and e.get("ph") == "X"
    ]
    assert len(drawn) == 6  # two calls per input, not the edited stage's third
    # The drawn verdict calls are the first version's, which the log holds first.
    log = [json.loads(line) for line in (tmp_path / "out.jsonl.checkpoint" / "log.jsonl").open()]
    verdicts = [r for r in log if r["t"] == "call" and r["n"].endswith("verdict")]
    assert len(verdicts) == 6
    first, edited = verdicts[:3], verdicts[3:]
    assert {r["h"] for r in first}.isdisjoint(r["h"] for r in edited)
    assert sorted(
        (e["args"]["input_index"], e["args"]["made_at"])
        for e in drawn
        if e["args"]["node_id"].endswith("verdict")
    ) == sorted((r["i"], _local_time(r["at"])) for r in first)
    assert [r["v"]["usage"] for r in first] != [r["v"]["usage"] for r in edited]
    assert sorted(
        e["args"]["tokens"] for e in drawn if e["args"]["node_id"].endswith("verdict")
    ) == sorted(r["v"]["usage"] for r in first)


def _local_time(at: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at / 1e6))
