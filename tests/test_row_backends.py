"""Rows handed over as they arrive (`RowBackend`): ``plait run`` goes through the backend
registered by name, and the local backend's rows keep their order, their window and
their failures the way the command needs them.

Pipelines come from tests/cli_targets.py; every request goes to the loopback fake
server, whose replies echo "[system prompt] user text".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.cli import main
from plait.execution.backends import RowBackend, backend, register_backend
from plait.execution.runtime import LocalBackend
from plait.execution.settings import resolve_options
from plait.learning.passes import LocalTrainingBackend
from plait.testing import FakeOpenAIServer
from plait.values import Value, error_value
from tests.pipelines import echo


@pytest.fixture()
def res(server: FakeOpenAIServer, tmp_path: Path) -> Path:
    (tmp_path / "resources.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    return tmp_path / "resources.toml"


class Recording:
    """The local backend, noting each session and each row it hands to ``plait run``."""

    def __init__(self) -> None:
        self.local = LocalBackend()
        self.sessions = 0
        self.rows: list[tuple[int, Any, str | None]] = []

    async def run_batch(
        self,
        module: Any,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        return await self.local.run_batch(module, items, extra, kwargs, opts)

    def deliver_rows(
        self,
        module: Any,
        resources: Any,
        items: Iterable[Any],
        prepare: Any,
        deliver: Any,
        opts: dict[str, Any],
        checkpoint: Any = None,
    ) -> None:
        def noted(index: int, item: Any, value: Value) -> None:
            self.rows.append((index, value.payload, value.meta.get("checkpoint")))
            deliver(index, item, value)

        self.local.deliver_rows(module, resources, items, prepare, noted, opts, checkpoint)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        self.sessions += 1
        yield


class BatchesOnly:
    """A backend that returns whole batches and cannot hand rows over."""

    async def run_batch(
        self,
        module: Any,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        raise AssertionError("plait run must not fall back to a whole batch")


@contextlib.contextmanager
def registered_as_local(replacement: Any) -> Iterator[None]:
    previous = register_backend("local", lambda: replacement)
    assert previous is not None
    try:
        yield
    finally:
        register_backend("local", previous)


def records(path: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["index"]: row for row in rows}


def test_plait_run_goes_through_the_backend_registered_as_local(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = [f"row {i}" for i in range(5)]
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(t) + "\n" for t in texts))
    out = tmp_path / "out.jsonl"
    command = ["run", "tests.cli_targets:Tagged", "-i", str(inputs), "-o", str(out)]
    command += ["--resources", str(res)]
    recording = Recording()
    with registered_as_local(recording):
        assert isinstance(backend("local"), RowBackend)
        assert main(command) == 0
        written = records(out)
        assert {i: row["output"] for i, row in written.items()} == {
            i: echo("T", text) for i, text in enumerate(texts)
        }
        assert recording.sessions == 1
        assert sorted(index for index, _, _ in recording.rows) == list(range(5))
        assert {index: payload for index, payload, _ in recording.rows} == {
            i: row["output"] for i, row in written.items()
        }
        paid = server.stats()["requests_total"]
        assert paid == 5

        # The same command again: every row comes back from the checkpoint, through it.
        recording.rows.clear()
        assert main(command) == 0
        assert server.stats()["requests_total"] == paid
        assert sorted(index for index, _, hit in recording.rows if hit == "hit") == list(range(5))
        assert records(out) == written
    assert "5 succeeded, 0 failed, 5 from the checkpoint" in capsys.readouterr().err
    assert type(backend("local")) is LocalTrainingBackend  # put back


def test_plait_run_refuses_a_backend_that_cannot_hand_rows_over(
    server: FakeOpenAIServer, res: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps("a") + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    command = ["run", "tests.cli_targets:Tagged", "-i", str(inputs), "-o", str(out)]
    command += ["--resources", str(res), "--no-checkpoint"]
    with registered_as_local(BatchesOnly()):
        status = main(command)
    assert status == 2
    assert "cannot hand rows over" in capsys.readouterr().err
    assert out.read_text() == "kept\n"  # refused before the output was opened
    assert server.stats()["requests_total"] == 0


class Gated(plait.Module):
    """Input "hold" waits until the other inputs of the first window have finished."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window
        self.finished = 0
        self.gate = asyncio.Event()

    async def forward(self, text: str) -> str:
        if text == "hold":
            await self.gate.wait()
        else:
            self.finished += 1
            if self.finished == self.window - 1:
                self.gate.set()
        return text.upper()


def test_in_input_order_a_waiting_row_keeps_its_slot_of_the_window() -> None:
    window = 4
    module = Gated(window)
    texts = ["hold", *(f"r{i}" for i in range(11))]
    opts = resolve_options({"max_inputs_in_flight": window, "preserve_order": True}, {}, None)
    admitted: list[str] = []
    admitted_before_first_row: list[int] = []
    delivered: list[int] = []

    def prepare(text: str) -> Any:
        admitted.append(text)
        return (text,), {}

    def deliver(index: int, text: str, value: Value) -> None:
        if not delivered:
            admitted_before_first_row.append(len(admitted))
        delivered.append(index)
        assert value.payload == text.upper()

    LocalBackend().deliver_rows(module, None, iter(texts), prepare, deliver, opts)
    assert delivered == list(range(len(texts)))  # in input order
    # The rows finished behind "hold" kept their slots: no input past the window
    # was admitted until "hold"'s row was handed over.
    assert admitted_before_first_row == [window]
    assert admitted == texts


class Upper(plait.Module):
    async def forward(self, text: str) -> str:
        return text.upper()


def test_a_row_that_cannot_be_delivered_stops_the_run_at_once() -> None:
    opts = resolve_options({"max_inputs_in_flight": 4}, {}, None)
    admitted: list[int] = []
    failed_after: list[int] = []

    def inputs() -> Iterator[str]:
        for i in range(1000):
            yield f"r{i}"

    def prepare(text: str) -> Any:
        admitted.append(int(text[1:]))
        return (text,), {}

    def deliver(index: int, text: str, value: Value) -> None:
        if index == 2:
            failed_after.append(len(admitted))
            raise OSError("the disk is full")

    with pytest.raises(OSError, match="the disk is full"):
        LocalBackend().deliver_rows(Upper(), None, inputs(), prepare, deliver, opts)
    assert failed_after and len(admitted) == failed_after[0]  # nothing admitted after it


def test_an_input_prepared_as_an_error_is_its_row_without_running() -> None:
    opts = resolve_options({}, {}, None)
    refused = error_value(ValueError("not an input"), module_path=None)
    rows: dict[int, Value] = {}

    def prepare(text: str) -> Any:
        return refused if text == "unreadable" else ((text,), {})

    def deliver(index: int, text: str, value: Value) -> None:
        rows[index] = value

    LocalBackend().deliver_rows(Upper(), None, ["a", "unreadable", "b"], prepare, deliver, opts)
    assert [rows[i].payload for i in (0, 2)] == ["A", "B"]
    assert rows[1] is refused
