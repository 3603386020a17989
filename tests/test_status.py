"""``plait status CHECKPOINT``: what a checkpoint holds, read without running anything.

A checkpoint is made by a real batch-API run against the fake OpenAI server, then
damaged as a disk, an editor or a killed copy would damage it; the command runs in a
process of its own, as a user runs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plait.testing import FakeOpenAIServer

from .conftest import make_resources, plait_cli
from .pipelines import FanOutFanIn
from .test_run_resume import TwoStageRun, write_two_stages

QUICK = {"batch_idle_s": 0.05, "batch_poll_s": 0.05, "batch_poll_max_s": 0.2}


@pytest.fixture()
def batch_checkpoint(server: FakeOpenAIServer, tmp_path: Path) -> Path:
    """The checkpoint of a finished batch-API run of two inputs (a log and a ledger)."""
    server.configure(batch_turnaround_s=0.05)
    directory = tmp_path / "made"
    module = FanOutFanIn().bind(resources=make_resources(server, **QUICK))
    module.run_sync(["one", "two"], backend="batch", checkpoint_dir=directory)
    assert (directory / "batches.jsonl").is_file()
    return directory


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


#: (file, line to damage (1-based), what to write there): each is a whole line, so it
#: is read as a record, never skipped as the torn end of a file still being written.
DAMAGE = {
    "ledger: a JSON line cut short": ("batches.jsonl", 1, '{"t": "intent", "b": "x", "al\n'),
    "ledger: garbage": ("batches.jsonl", 2, "\x00\x17garbage{{\n"),
    "ledger: a list, not a record": ("batches.jsonl", 1, "[1, 2, 3]\n"),
    "ledger: a time that is text": (
        "batches.jsonl",
        1,
        '{"t": "intent", "b": "k", "alias": "fast", "at": "soon", "calls": []}\n',
    ),
    "ledger: calls that are a number": (
        "batches.jsonl",
        1,
        '{"t": "intent", "b": "k", "alias": "fast", "at": 1.0, "calls": 5}\n',
    ),
    "ledger: a batch id for no batch": (
        "batches.jsonl",
        2,
        '{"t": "submitted", "b": "no such token", "id": "batch_1"}\n',
    ),
    "ledger: a result that is a number": (
        "batches.jsonl",
        2,
        '{"t": "result", "id": "x", "o": 5}\n',
    ),
    "log: garbage": ("log.jsonl", 1, "not json at all\n"),
    "log: a record that is a list": ("log.jsonl", 1, '["call"]\n'),
    "log: an output whose index is text": (
        "log.jsonl",
        1,
        '{"t": "out", "i": "first", "h": "x"}\n',
    ),
    "log: an unknown record": ("log.jsonl", 1, '{"t": "mystery"}\n'),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_status_of_a_damaged_checkpoint_is_one_line_naming_the_file_and_line(
    batch_checkpoint: Path, tmp_path: Path, case: str
) -> None:
    name, number, text = DAMAGE[case]
    directory = tmp_path / "damaged"
    shutil.copytree(batch_checkpoint, directory)
    lines = _lines(directory / name)
    assert len(lines) > number  # the damaged line is not the last one
    lines[number - 1] = text
    (directory / name).write_text("".join(lines), encoding="utf-8")

    shown = plait_cli("status", directory)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "Traceback" not in shown.stderr
    message = shown.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert message.startswith("plait status: error: ")
    assert f"{directory / name} line {number}" in message


@pytest.mark.parametrize(
    "text", ["{not json", "[1, 2]", '{"format": "plait-checkpoint", "pipeline": 5}']
)
def test_status_of_a_damaged_manifest_is_one_line_naming_it(
    batch_checkpoint: Path, text: str
) -> None:
    (batch_checkpoint / "manifest.json").write_text(text, encoding="utf-8")
    shown = plait_cli("status", batch_checkpoint)
    assert shown.returncode == 2
    assert "Traceback" not in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
    assert str(batch_checkpoint / "manifest.json") in shown.stderr


def test_status_of_an_intact_checkpoint_counts_what_it_holds(batch_checkpoint: Path) -> None:
    shown = plait_cli("status", batch_checkpoint)
    assert shown.returncode == 0, shown.stderr
    assert "inputs finished: 2; calls kept: 6" in shown.stdout
    assert "calls in batches: 0 pending, 6 succeeded, 0 failed" in shown.stdout


def test_status_names_the_pipeline_as_the_command_named_it(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    run = TwoStageRun(server, tmp_path)
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run().returncode == 0
    shown = plait_cli("status", f"{run.out}.checkpoint")
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert f"({run.source}:Review)" in first, first
    assert "_plait_blueprint_" not in shown.stdout


def test_status_names_a_file_pipeline_by_its_file_in_an_older_checkpoint(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A checkpoint whose manifest does not say how the command named its pipeline (made
    from Python, or by an older plait) still shows the file, not the internal module."""
    run = TwoStageRun(server, tmp_path)
    write_two_stages(run.source, "Summarize.", "Judge.")
    assert run().returncode == 0
    manifest_path = Path(f"{run.out}.checkpoint") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("target", None)
    assert manifest["pipeline"].startswith("_plait_blueprint_review_")
    manifest_path.write_text(json.dumps(manifest))
    shown = plait_cli("status", manifest_path.parent)
    assert shown.returncode == 0, shown.stderr
    assert "(review.py:Review)" in shown.stdout.splitlines()[0]


def test_status_of_a_python_checkpoint_names_its_class(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    FanOutFanIn().bind(resources=make_resources(server)).run_sync(
        ["a"], checkpoint_dir=tmp_path / "c"
    )
    shown = plait_cli("status", tmp_path / "c", "--json")
    assert json.loads(shown.stdout)["pipeline"] == "tests.pipelines.FanOutFanIn"
