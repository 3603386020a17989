"""Checkpoints: a run killed with SIGKILL resumes with every output exactly once."""

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
from plait.execution.checkpoint import Checkpoint, CheckpointError
from plait.testing import FakeOpenAIServer

from .conftest import make_resources, plait_cli
from .pipelines import FanOutFanIn, echo

ROOT = Path(__file__).resolve().parent.parent


def expected(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def child(
    server: FakeOpenAIServer, directory: Path, count: int, mode: str = "stream", gate: int = 0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.checkpoint_child",
            server.base_url,
            str(directory),
            str(count),
            mode,
            str(gate),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def count_records(directory: Path) -> dict[str, int]:
    counts = {"call": 0, "out": 0}
    for line in (directory / "log.jsonl").read_text().splitlines():
        counts[json.loads(line)["t"]] += 1
    return counts


def test_a_killed_run_resumes_without_repeating_completed_calls(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    server.configure(latency_ms=20)
    count = 120
    proc = child(server, tmp_path, count, gate=40)
    assert proc.stdout is not None
    for _ in range(40):  # the child holds after 40 finished inputs: kill -9 it there
        line = proc.stdout.readline()
        assert line.startswith("done"), line + proc.stderr.read()  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first_run_requests = server.stats()["requests_total"]
    recorded = count_records(tmp_path)
    assert 40 <= recorded["out"] < count
    assert recorded["call"] <= first_run_requests

    server.reset()
    proc = child(server, tmp_path, count)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    outputs = json.loads(stdout.strip().splitlines()[-1].removeprefix("OUTPUTS "))
    assert outputs == [expected(f"item {i}") for i in range(count)]
    second = server.stats()
    # every call the first run completed and recorded is answered from the checkpoint
    assert second["requests_total"] == 3 * count - recorded["call"]
    assert all(n == 1 for n in second["completed_by_key"].values())
    final = count_records(tmp_path)
    assert final["out"] == count  # every output recorded exactly once


def test_ctrl_c_stops_run_sync_cleanly_and_the_run_resumes(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    server.configure(latency_ms=20)
    count = 60
    proc = child(server, tmp_path, count, mode="sync", gate=60)
    assert proc.stdout is not None
    for _ in range(60):  # the child holds after 60 LLM calls: interrupt as Ctrl-C would
        line = proc.stdout.readline()
        assert line.startswith("call"), line + proc.stderr.read()  # type: ignore[union-attr]
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate("go\n", timeout=60)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in stderr
    recorded = count_records(tmp_path)
    assert recorded["call"] >= 60 and recorded["out"] < count

    server.reset()
    proc = child(server, tmp_path, count, mode="sync")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    outputs = json.loads(stdout.strip().splitlines()[-1].removeprefix("OUTPUTS "))
    assert outputs == [expected(f"item {i}") for i in range(count)]
    assert server.stats()["requests_total"] == 3 * count - recorded["call"]
    assert count_records(tmp_path)["out"] == count


def test_resume_in_process_pays_nothing_for_a_finished_batch(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    inputs = [f"x{i}" for i in range(10)]
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    first = pipeline.run_sync(inputs)
    assert server.stats()["requests_total"] == 30
    server.reset()
    assert pipeline.run_sync(inputs) == first
    assert server.stats()["requests_total"] == 0


# Python 3.12 made asyncio.gather over awaitables that are all done already return a
# finished future, so awaiting it does not yield to the loop (3.11's yields once). The
# child below gives 3.11 that gather, so this suite, on any supported Python, covers
# the path 3.12 and 3.13 take.
_RESUME_ON_NEWER_GATHER = """
import asyncio, json, sys
import plait
from tests.checkpoint_child import make_pipeline

if sys.version_info < (3, 12):
    _gather = asyncio.gather

    def gather(*aws, return_exceptions=False):
        futures = [asyncio.ensure_future(aw) for aw in aws]
        if not futures or not all(f.done() for f in futures):
            return _gather(*futures, return_exceptions=return_exceptions)
        outer = asyncio.get_running_loop().create_future()
        results = [
            asyncio.CancelledError() if f.cancelled() else f.exception() or f.result()
            for f in futures
        ]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed and not return_exceptions:
            outer.set_exception(failed[0])
        else:
            outer.set_result(results)
        return outer

    asyncio.gather = gather

pipeline = make_pipeline(sys.argv[1], sys.argv[2])
inputs = [f"item {i}" for i in range(10)]
first = pipeline.run_sync(inputs)
print(json.dumps([first, pipeline.run_sync(inputs)]), flush=True)
"""


def test_a_finished_batch_resumes_in_process_on_pythons_whose_gather_does_not_yield(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    # The second run is answered from the checkpoint: its inputs' tasks were all done
    # before the driver waited for them, and it waited by spinning for ever.
    done = subprocess.run(
        [sys.executable, "-c", _RESUME_ON_NEWER_GATHER, server.base_url, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout)
    assert first == second == [expected(f"item {i}") for i in range(10)]
    assert server.stats()["requests_total"] == 30  # the second run sent nothing


def test_failed_inputs_are_retried_on_resume(server: FakeOpenAIServer, tmp_path: Path) -> None:
    resources = make_resources(server, max_retries=0)
    pipeline = FanOutFanIn().bind(resources=resources)
    server.configure(rate_500=1.0)
    with plait.ExecutionSettings(checkpoint_dir=tmp_path):
        out = pipeline.run_sync(["a", "c"])
    assert all(isinstance(o, plait.Value) and o.is_error for o in out)
    assert count_records(tmp_path)["out"] == 0
    server.configure(rate_500=0.0)
    server.reset()
    assert pipeline.run_sync(["a", "c"], checkpoint_dir=tmp_path) == [expected("a"), expected("c")]
    assert server.stats()["requests_total"] == 6


def test_changed_inputs_are_refused(resources: plait.ResourceConfig, tmp_path: Path) -> None:
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    pipeline.run_sync(["a", "b"])
    with pytest.raises(plait.CheckpointError, match="input #1 differs"):
        pipeline.run_sync(["a", "changed"])


def test_foreign_and_corrupt_checkpoints_are_clear_errors(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    class Other(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = plait.LLMInference("fast")

        def forward(self, x: str) -> object:
            return self.llm(x)

    FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path).run_sync(["a"])
    with pytest.raises(plait.CheckpointError, match="belongs to pipeline"):
        Other().bind(resources=resources, checkpoint_dir=tmp_path).run_sync(["a"])

    log = tmp_path / "log.jsonl"
    log.write_text("{not json\n" + log.read_text())
    with pytest.raises(plait.CheckpointError, match="line 1 is corrupt"):
        FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path).run_sync(["a"])

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"hello": 1}')
    with pytest.raises(plait.CheckpointError, match="not a plait checkpoint"):
        FanOutFanIn().bind(resources=resources, checkpoint_dir=foreign).run_sync(["a"])
    (foreign / "manifest.json").write_text("garbage")
    with pytest.raises(plait.CheckpointError, match="corrupt"):
        FanOutFanIn().bind(resources=resources, checkpoint_dir=foreign).run_sync(["a"])


def test_a_torn_last_line_is_dropped(resources: plait.ResourceConfig, tmp_path: Path) -> None:
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    pipeline.run_sync(["a"])
    with open(tmp_path / "log.jsonl", "a") as fh:
        fh.write('{"t":"call","i":3,"n":"x"')  # what a kill mid-write leaves
    assert pipeline.run_sync(["a"]) == [expected("a")]
    assert (tmp_path / "log.jsonl").read_text().endswith("\n")


@pytest.mark.parametrize(("resume_temperature", "resumed_calls"), [(0.3, 1), (0.9, 3)])
def test_checkpoints_key_on_the_request_as_handlers_left_it(
    server: FakeOpenAIServer,
    tmp_path: Path,
    resume_temperature: float,
    resumed_calls: int,
) -> None:
    # The checkpoint sits below every handler, so it records the overridden request:
    # resuming under the same override reuses input 1's finished fan-out calls, and a
    # different override does not pass its calls off as the new ones.
    from plait.handlers import budget, override

    resources = make_resources(server, max_concurrent=1)  # one call at a time: a fixed order
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    with override(temperature=0.3), budget(max_calls=5):
        first = pipeline.run_sync(["a", "b"])
    assert first[0] == expected("a") and isinstance(first[1], plait.Value)
    server.reset()
    with override(temperature=resume_temperature):
        assert pipeline.run_sync(["a", "b"]) == [expected("a"), expected("b")]
    assert server.stats()["requests_total"] == resumed_calls


# -- one run per checkpoint and per output file -----------------------------------------------
def _plait_run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return plait_cli("run", *args)


def _resources_file(tmp_path: Path, server: FakeOpenAIServer) -> Path:
    path = tmp_path / "resources.toml"
    lines = [
        f'[{alias}]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
        for alias in ("fast", "smart")
    ]
    path.write_text("".join(lines))
    return path


def test_a_second_run_on_a_busy_checkpoint_is_refused_naming_the_holder(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n"b"\n')
    res, directory = _resources_file(tmp_path, server), tmp_path / "ckpt"
    common = ("tests.pipelines:FanOutFanIn", "-i", inputs, "--resources", res)
    holder = Checkpoint(directory, "tests.pipelines.FanOutFanIn").open()
    try:
        busy = _plait_run(*common, "-o", tmp_path / "out.jsonl", "--checkpoint", directory)
        assert busy.returncode == 2
        assert f"is in use by process {os.getpid()}" in busy.stderr
        fresh = _plait_run(
            *common, "-o", tmp_path / "o.jsonl", "--checkpoint", directory, "--fresh"
        )
        assert fresh.returncode == 2 and "while process" in fresh.stderr
        assert directory.exists()  # --fresh never deletes a checkpoint in use
        assert server.stats()["requests_total"] == 0
    finally:
        holder.close()
    done = _plait_run(*common, "-o", tmp_path / "out.jsonl", "--checkpoint", directory)
    assert done.returncode == 0, done.stderr
    assert server.stats()["requests_total"] == 6


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    code = (
        "import os, signal, sys\n"
        "from plait.execution.checkpoint import Checkpoint\n"
        f"Checkpoint({str(directory)!r}, 'p').open()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert killed.returncode == -9
    assert (directory / "lock").exists()  # the file stays; the kernel dropped the lock
    Checkpoint(directory, "p").open().close()


def test_two_runs_never_write_one_output_file(server: FakeOpenAIServer, tmp_path: Path) -> None:
    from plait._locks import hold

    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n')
    out = tmp_path / "out.jsonl"
    out.write_text("rows of a run in progress\n")
    fd = hold(out, record_pid=False)
    try:
        done = _plait_run(
            "tests.pipelines:FanOutFanIn", "-i", inputs, "-o", out, "--no-checkpoint",
            "--resources", _resources_file(tmp_path, server),
        )  # fmt: skip
        assert done.returncode == 2
        assert "is being written by another process" in done.stderr
        assert out.read_text() == "rows of a run in progress\n"  # not truncated
    finally:
        os.close(fd)


# -- a checkpoint knows what its outputs were made with ---------------------------------------
def requests_of(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = server.stats(bodies=True)["requests"]
    return requests


def test_a_rerun_with_a_changed_parameter_recomputes_outputs_paying_only_changed_calls(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    pipeline = FanOutFanIn().bind(resources=make_resources(server), checkpoint_dir=tmp_path / "c")
    pipeline.run_sync(["a", "b"])
    assert pipeline.left.system_prompt is not None
    pipeline.left.system_prompt.value = "N"

    server.reset()
    outputs = pipeline.run_sync(["a", "b"])
    assert outputs == [echo("C", f"{echo('N', t)} | {echo('R', t)}") for t in ("a", "b")]
    # The right calls' requests did not change; the left and combining ones did.
    sent = sorted(r["body"]["messages"][0]["content"] for r in requests_of(server))
    assert sent == ["C", "C", "N", "N"]

    server.reset()
    pipeline.left.system_prompt.value = "L"  # back: its outputs are served again
    assert pipeline.run_sync(["a", "b"]) == [expected("a"), expected("b")]
    assert server.stats()["requests_total"] == 0


@pytest.mark.parametrize(
    ("setting", "value"), [("temperature", 0.9), ("max_tokens", 7), ("alias", "smart")]
)
def test_a_rerun_with_a_changed_llm_setting_pays_for_that_calls_requests_only(
    server: FakeOpenAIServer, tmp_path: Path, setting: str, value: Any
) -> None:
    resources = make_resources(server, ("fast", "smart"))
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path / "c")
    pipeline.run_sync(["a", "b"])
    setattr(pipeline.right, setting, value)
    server.reset()
    assert pipeline.run_sync(["a", "b"]) == [expected("a"), expected("b")]
    # Only the changed call's requests are new (the combining call's prompt is the same
    # text: the fake server's reply does not depend on these settings).
    sent = sorted(r["body"]["messages"][0]["content"] for r in requests_of(server))
    assert sent == ["R", "R"]


def test_resuming_with_another_seed_is_refused_naming_it(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    pipeline = FanOutFanIn().bind(resources=make_resources(server), checkpoint_dir=tmp_path / "c")
    pipeline.run_sync(["a", "b"], seed=1)
    with pytest.raises(plait.CheckpointError, match=r"the run seed changed \(1 -> 2"):
        pipeline.run_sync(["a", "b"], seed=2)


def test_plait_run_with_other_resources_names_the_change_and_offers_fresh(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n')
    res = _resources_file(tmp_path, server)
    common = ("tests.pipelines:FanOutFanIn", "-i", inputs, "-o", tmp_path / "out.jsonl")
    assert _plait_run(*common, "--resources", res).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text(res.read_text().replace('model = "m"', 'model = "m2"'))
    refused = _plait_run(*common, "--resources", other)
    assert refused.returncode == 2
    assert "alias 'fast': model changed 'm' -> 'm2'" in refused.stderr
    assert "--fresh" in refused.stderr
    paid = server.stats()["requests_total"]
    assert _plait_run(*common, "--resources", other, "--fresh").returncode == 0
    assert server.stats()["requests_total"] == paid + 3


def test_an_offline_resume_answers_what_it_can_and_refuses_new_calls_elsewhere(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "c"
    done = FanOutFanIn().bind(resources=make_resources(server), checkpoint_dir=checkpoint)
    first = done.run_sync(["a", "b"])
    # no resources at all: the finished inputs come back; a new one is not sent elsewhere
    outputs = FanOutFanIn().bind(checkpoint_dir=checkpoint).run_sync(["a", "b", "c"])
    assert outputs[:2] == first
    failed = outputs[2]
    assert isinstance(failed, plait.Value) and failed.is_error
    assert "alias 'fast': provider changed 'openai' -> 'local'" in failed.meta["message"]
    assert server.stats()["requests_total"] == 6


def test_an_output_that_is_a_reply_is_logged_once_and_resumes_from_it(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    inputs = [f"document {i} " + "z" * 500 for i in range(20)]
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    first = pipeline.run_sync(inputs)
    assert first == [expected(text) for text in inputs]
    log = (tmp_path / "log.jsonl").read_text()
    for text in first:
        # the final reply is the output: its text is in the log once, not twice
        assert log.count(json.dumps(text)[1:-1]) == 1
    outs = [json.loads(line) for line in log.splitlines() if '"t":"out"' in line]
    assert len(outs) == 20 and all("c" in rec and "v" not in rec for rec in outs)
    server.reset()
    again = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    assert again.run_sync(inputs) == first
    assert server.stats()["requests_total"] == 0


def test_an_output_pointing_at_a_missing_reply_is_a_clear_error(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path)
    pipeline.run_sync(["a"])
    log = tmp_path / "log.jsonl"
    # drop the final call's record but keep the output that points at it
    final = next(line for line in log.read_text().splitlines() if '"t":"out"' in line)
    pointed = json.loads(final)["c"]
    kept = [
        line
        for line in log.read_text().splitlines()
        if not (json.loads(line)["t"] == "call" and json.loads(line)["n"] == pointed[0])
    ]
    log.write_text("\n".join(kept) + "\n")
    with pytest.raises(CheckpointError, match="points at a reply the log does not hold"):
        pipeline.run_sync("a")


def test_a_reply_with_a_lone_surrogate_is_logged_and_resumed(tmp_path: Path) -> None:
    text = "bad \ud800 text"
    checkpoint = Checkpoint(tmp_path, "p").open()
    checkpoint.record_call(0, "1:llm", "h", {"text": text, "usage": [1, 2]})
    checkpoint.record_output(0, "in", text)
    checkpoint.close()
    checkpoint = Checkpoint(tmp_path, "p").open()
    try:
        assert checkpoint.stored_call((0, "1:llm", "h"))["text"] == text
        assert checkpoint.finished_output(0, "in") == (True, text)
    finally:
        checkpoint.close()


def test_digests_tell_apart_what_differs_and_ignore_key_order() -> None:
    from plait._digest import digest

    assert digest({"a": 1, "b": [2, "x"]}) == digest({"b": [2, "x"], "a": 1})
    distinct = [
        ["ab", "c"],
        ["a", "bc"],
        {"a": "b"},
        {"a": ["b"]},
        {1: "a"},
        {"1": "a"},
        "\ud800",
        "\udc00",
        1,
        1.0,
        True,
        None,
        "None",
        [],
        {},
        2**70,
        str(2**70),
    ]
    assert len({digest(value) for value in distinct}) == len(distinct)


class _BigNumbers(plait.Module):
    async def forward(self, text: str) -> object:
        return {"big": 2**70, "negative": -(2**64) - 1, "u64": 2**64 - 1, "items": [10**30]}


def test_integers_beyond_64_bits_come_back_from_the_checkpoint_exactly(tmp_path: Path) -> None:
    from plait._jsonl import loads, text_line

    expected_output = {"big": 2**70, "negative": -(2**64) - 1, "u64": 2**64 - 1, "items": [10**30]}
    for _ in range(2):  # computed, then answered from the checkpoint
        out = _BigNumbers().bind(checkpoint_dir=tmp_path / "ckpt").run_sync(["x", "y"])
        assert out == [expected_output, expected_output]
        assert all(type(o["big"]) is int for o in out)
    record = {"n": 2**70, "text": "12345678901234567890123", "f": 0.1}
    assert loads(text_line(record)) == record  # orjson refuses the int: the stdlib writes it


EDITED_PIPELINE = """
import plait


class Summarize(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = plait.LLMInference("fast")
        self.second = plait.LLMInference("fast")

    def forward(self, text: str):
        return self.second(f"{PREFIX}{self.first(text)}")


PREFIX = "@@"
"""


def write_pipeline(path: Path, prefix: str) -> None:
    path.write_text(EDITED_PIPELINE.replace("@@", prefix), encoding="utf-8")


def sent_prompts(server: FakeOpenAIServer) -> list[str]:
    records = server.stats(bodies=True)["requests"]
    return sorted(record["body"]["messages"][-1]["content"] for record in records)


def test_a_resume_after_editing_the_pipeline_recomputes_outputs_paying_only_changed_calls(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    import importlib.util

    source = tmp_path / "edited_pipeline_api.py"

    def load(prefix: str) -> plait.Module:
        write_pipeline(source, prefix)
        spec = importlib.util.spec_from_file_location("edited_pipeline_api", source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["edited_pipeline_api"] = module
        spec.loader.exec_module(module)
        pipeline: plait.Module = module.Summarize().bind(resources=make_resources(server))
        return pipeline

    inputs = ["alpha", "beta", "gamma"]
    checkpoint = tmp_path / "ckpt"
    try:
        assert load("").run_sync(inputs, checkpoint_dir=checkpoint) == inputs
        assert server.stats()["requests_total"] == 6

        server.reset()
        edited = load("Briefly: ").run_sync(inputs, checkpoint_dir=checkpoint)
        assert edited == [f"Briefly: {text}" for text in inputs]
        # The first call's requests did not change: only the second call's are paid for.
        assert sent_prompts(server) == [f"Briefly: {text}" for text in inputs]

        server.reset()
        assert load("Briefly: ").run_sync(inputs, checkpoint_dir=checkpoint) == edited
        # Back to the code that made the first outputs: they are served again.
        assert load("").run_sync(inputs, checkpoint_dir=checkpoint) == inputs
        assert server.stats()["requests_total"] == 0
    finally:
        sys.modules.pop("edited_pipeline_api", None)


def test_plait_run_resumed_after_editing_the_pipeline_file_reflects_the_new_code(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from .test_cli import write_resources

    source = tmp_path / "edited_pipeline_cli.py"
    resources = write_resources(tmp_path / "resources.toml", server.base_url)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(text) + "\n" for text in ["alpha", "beta", "gamma"]))
    out = tmp_path / "out.jsonl"

    def run(prefix: str) -> tuple[list[str], str]:
        write_pipeline(source, prefix)
        args = ["run", f"{source}:Summarize", "--resources", resources, "-i", data, "-o", out]
        result = plait_cli(*args)
        assert result.returncode == 0, result.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return [row["output"] for row in sorted(rows, key=lambda row: row["index"])], result.stderr

    assert run("")[0] == ["alpha", "beta", "gamma"]
    assert server.stats()["requests_total"] == 6

    server.reset()
    outputs, stderr = run("Briefly: ")
    assert outputs == ["Briefly: alpha", "Briefly: beta", "Briefly: gamma"]
    assert sent_prompts(server) == outputs
    assert "the pipeline changed since" in stderr


HELPED_PIPELINE = """
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import plait
from helped_prompt import after, prompt


class Helped(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast")

    async def forward(self, text: str) -> str:
        return after(await self.llm(prompt(text)))
"""


def write_helpers(directory: Path, prefix: str, suffix: str) -> None:
    """``helped_prompt`` builds the prompt and imports ``helped_finish``, which
    post-processes the reply: both are code the pipeline runs, in files of their own."""
    (directory / "helped_prompt.py").write_text(
        "import json\n"
        "from helped_finish import finish\n\n\n"
        f"def prompt(text):\n    return {prefix!r} + text\n\n\n"
        "def after(reply):\n    return finish(reply)\n",
        encoding="utf-8",
    )
    (directory / "helped_finish.py").write_text(
        f"def finish(reply):\n    return reply + {suffix!r}\n", encoding="utf-8"
    )


def test_plait_run_resumed_after_editing_an_imported_helper_reflects_the_new_code(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Issue 20 point 10: a helper the pipeline file imports (and one that helper
    imports) is the pipeline's code; a file beside them that nothing imports is not."""
    from .test_cli import write_resources

    code = tmp_path / "code"
    code.mkdir()
    (code / "helped_pipeline.py").write_text(HELPED_PIPELINE, encoding="utf-8")
    unrelated = code / "unrelated_notes.py"
    unrelated.write_text("NOTE = 1\n", encoding="utf-8")
    resources = write_resources(tmp_path / "resources.toml", server.base_url)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(text) + "\n" for text in ["alpha", "beta", "gamma"]))
    out = tmp_path / "out.jsonl"

    def run() -> tuple[list[str], str]:
        for cache in code.glob("__pycache__"):  # as a user's edit would: no stale bytecode
            for compiled in cache.iterdir():
                compiled.unlink()
        target = f"{code / 'helped_pipeline.py'}:Helped"
        result = plait_cli("run", target, "--resources", resources, "-i", data, "-o", out)
        assert result.returncode == 0, result.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return [row["output"] for row in sorted(rows, key=lambda row: row["index"])], result.stderr

    write_helpers(code, "P:", "!")
    assert run()[0] == ["P:alpha!", "P:beta!", "P:gamma!"]
    assert server.stats()["requests_total"] == 3

    # A file nobody imports changed: the finished outputs are still current.
    server.reset()
    unrelated.write_text("NOTE = 2\n", encoding="utf-8")
    outputs, stderr = run()
    assert outputs == ["P:alpha!", "P:beta!", "P:gamma!"]
    assert "the pipeline changed since" not in stderr
    assert server.stats()["requests_total"] == 0

    # The helper's helper post-processes differently: new outputs, the same requests.
    server.reset()
    write_helpers(code, "P:", "?")
    outputs, stderr = run()
    assert outputs == ["P:alpha?", "P:beta?", "P:gamma?"]
    assert "the pipeline changed since" in stderr
    assert server.stats()["requests_total"] == 0

    # The imported helper builds other prompts: those calls, and only those, are paid.
    server.reset()
    write_helpers(code, "Q:", "?")
    outputs, stderr = run()
    assert outputs == ["Q:alpha?", "Q:beta?", "Q:gamma?"]
    assert sent_prompts(server) == ["Q:alpha", "Q:beta", "Q:gamma"]


def test_the_code_identity_covers_imported_user_files_but_not_the_installation(
    tmp_path: Path,
) -> None:
    """What `code_of` hashes: the pipeline's file and the user files it imports,
    transitively (an import inside a function too), never the stdlib, site-packages
    or plait, and the same whatever else the process has imported."""
    import importlib.util

    from plait.execution.checkpoint import code_of

    write_helpers(tmp_path, "P:", "!")
    (tmp_path / "helped_lazy.py").write_text("VALUE = 1\n", encoding="utf-8")
    (tmp_path / "unrelated_notes.py").write_text("NOTE = 1\n", encoding="utf-8")
    lazy = "    def lazy(self):\n        import helped_lazy\n\n"
    source = HELPED_PIPELINE.replace("    async def forward", lazy + "    async def forward")
    installed = "import plait\nimport pytest\nimport collections.abc\n"
    source = source.replace("import plait\n", installed)
    (tmp_path / "helped_api.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("helped_api", tmp_path / "helped_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["helped_api"] = module
    try:
        spec.loader.exec_module(module)
        pipeline = module.Helped()
        first = code_of(pipeline)
        assert set(first) == {"helped_api", "helped_prompt", "helped_finish", "helped_lazy"}
        # helped_lazy was never imported: it was found from the text, not sys.modules.
        assert "helped_lazy" not in sys.modules
        import helped_lazy  # type: ignore[import-not-found]  # noqa: F401

        assert code_of(pipeline) == first  # what else was imported does not matter
        (tmp_path / "helped_lazy.py").write_text("VALUE = 2\n", encoding="utf-8")
        changed = code_of(pipeline)
        assert changed["helped_lazy"] != first["helped_lazy"]
        assert {k: v for k, v in changed.items() if k != "helped_lazy"} == {
            k: v for k, v in first.items() if k != "helped_lazy"
        }
    finally:
        for name in ("helped_api", "helped_prompt", "helped_finish", "helped_lazy"):
            sys.modules.pop(name, None)
        while str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_the_code_identity_follows_imports_through_namespace_packages(tmp_path: Path) -> None:
    """A pipeline that imports, inside a function, from a namespace package (a folder
    without ``__init__.py``, mine or installed) that nothing has imported yet: its
    identity is found, and the user file inside the package counts as its code.
    (importlib's path finder raised KeyError for such a subpackage.)"""
    import importlib.util

    from plait.execution.checkpoint import code_of

    (tmp_path / "nsuser" / "inner").mkdir(parents=True)
    helper = tmp_path / "nsuser" / "inner" / "shaped.py"
    helper.write_text("SHAPE = 1\n", encoding="utf-8")
    lazy = (
        "    def lazy(self):\n"
        "        from nsuser.inner.shaped import SHAPE\n"
        "        from opentelemetry.sdk.trace import TracerProvider\n"
        "        return SHAPE, TracerProvider\n\n"
    )
    write_helpers(tmp_path, "P:", "!")
    source = HELPED_PIPELINE.replace("    async def forward", lazy + "    async def forward")
    (tmp_path / "ns_api.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ns_api", tmp_path / "ns_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ns_api"] = module
    try:
        spec.loader.exec_module(module)
        assert "nsuser" not in sys.modules
        first = code_of(module.Helped())
        assert "nsuser.inner.shaped" in first
        assert not any(name.startswith("opentelemetry") for name in first)
        helper.write_text("SHAPE = 2\n", encoding="utf-8")
        assert code_of(module.Helped())["nsuser.inner.shaped"] != first["nsuser.inner.shaped"]
    finally:
        for name in ("ns_api", "helped_prompt", "helped_finish"):
            sys.modules.pop(name, None)
        while str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_a_pipeline_class_without_source_is_keyed_by_name_and_says_so(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    namespace: dict[str, Any] = {"__name__": "pipeline_without_source"}
    exec(  # a class no file defines, as in an interactive session
        "import plait\n"
        "class Nameless(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.llm = plait.LLMInference('fast')\n"
        "    def forward(self, text):\n"
        "        return self.llm(text)\n",
        namespace,
    )
    pipeline = namespace["Nameless"]().bind(resources=resources)
    with pytest.warns(UserWarning, match="no source found for pipeline_without_source.Nameless"):
        assert pipeline.run_sync(["a", "b"], checkpoint_dir=tmp_path / "ckpt") == ["a", "b"]


def test_a_checkpoint_refuses_to_be_pickled_naming_what_to_send_instead(tmp_path: Path) -> None:
    """An open checkpoint holds this process's file descriptors: a pickled copy in a Ray
    worker once wrote call records into whatever those numbers were there."""
    import pickle

    from plait.execution.checkpoint import Checkpoint

    checkpoint = Checkpoint(tmp_path / "ck", "pipeline").open()
    try:
        with pytest.raises(TypeError, match=r"cannot be pickled.*send its directory"):
            pickle.dumps(checkpoint)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps({"nested": [checkpoint]})
    finally:
        checkpoint.close()
