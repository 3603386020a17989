"""`record(path)` / `replay(path)`: one real run, then the same outputs with no endpoint at all."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

import plait
from plait.handlers.recording import (
    NotRecordedError,
    Recorder,
    RecordingError,
    Replayer,
    record,
    replay,
)
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, SummarizeAndAnalyze, echo


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def requests(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


def nowhere(port: int, aliases: tuple[str, ...] = ("fast",)) -> plait.ResourceConfig:
    """Resources whose endpoint is ``port``, which refuses every connection (the
    ``refused_port`` fixture): any request fails."""
    settings = {
        "provider": "openai",
        "model": "m",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "api_key": "sk-none",
        "max_retries": 0,
    }
    return plait.ResourceConfig({alias: dict(settings) for alias in aliases})


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_recorded_batch_replays_offline_with_identical_outputs(
    server: FakeOpenAIServer, tmp_path: Path, refused_port: int
) -> None:
    path = tmp_path / "run.jsonl"
    inputs = [f"item {i}" for i in range(100)]
    with record(path) as recorder:
        recorded = FanOutFanIn().bind(resources=make_resources(server)).run_sync(inputs)
    assert recorded == [expected_fan(text) for text in inputs]
    assert recorder.calls == 300 and requests(server) == 300

    server.reset()
    with replay(path) as replayer:
        offline = FanOutFanIn().bind(resources=nowhere(refused_port)).run_sync(inputs)
    assert offline == recorded
    assert replayer.replayed == 300
    assert requests(server) == 0
    with replay(path):  # and with no resources configured at all
        assert FanOutFanIn().run_sync(inputs[:3]) == recorded[:3]


def test_a_single_call_and_a_two_alias_pipeline_replay(
    server: FakeOpenAIServer, tmp_path: Path, refused_port: int
) -> None:
    path = tmp_path / "run.jsonl"
    with record(path):
        first = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
        recorded = first.run_sync("text")
    assert recorded == echo("ana", echo("sum", "text"))
    server.reset()
    with replay(path):
        offline = nowhere(refused_port, ("fast", "smart"))
        again = SummarizeAndAnalyze().bind(resources=offline).run_sync("text")
    assert again == recorded and requests(server) == 0


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_a_structured_reply_replays_as_the_typed_object(
    server: FakeOpenAIServer, tmp_path: Path, refused_port: int
) -> None:
    path = tmp_path / "run.jsonl"
    module = plait.LLMInference("fast", response_format=Person)
    with record(path):
        recorded = module.bind(resources=make_resources(server)).run_sync("who is it?")
    server.reset()
    with replay(path):
        replayed = module.bind(resources=nowhere(refused_port)).run_sync("who is it?")
    assert isinstance(replayed, Person) and replayed == recorded
    assert requests(server) == 0


def test_a_changed_prompt_fails_naming_the_module_and_the_prompt(
    server: FakeOpenAIServer, tmp_path: Path, refused_port: int
) -> None:
    path = tmp_path / "run.jsonl"
    with record(path):
        FanOutFanIn().bind(resources=make_resources(server)).run_sync("the original prompt")

    pipeline = FanOutFanIn().bind(resources=nowhere(refused_port))
    assert pipeline.right.system_prompt is not None
    pipeline.right.system_prompt.value = "R, but changed"  # one module's prompt moved on
    with replay(path), pytest.raises(plait.ExecutionError) as caught:
        pipeline.run_sync("the original prompt")
    message = str(caught.value)
    assert isinstance(caught.value.__cause__, NotRecordedError)
    assert "right" in message and "'the original prompt'" in message
    assert "Re-record" in message and str(path) in message

    with replay(path):  # in a batch the changed input fails alone, as its Value(ERROR)
        outputs = (
            FanOutFanIn()
            .bind(resources=nowhere(refused_port))
            .run_sync(["the original prompt", "a new input " + "long " * 40])
        )
    assert outputs[0] == expected_fan("the original prompt")
    assert isinstance(outputs[1], plait.Value) and outputs[1].kind is plait.ValueKind.ERROR
    error = str(outputs[1].meta["message"])
    assert error.startswith(("left:", "right:"))
    assert "'a new input long long" in error and "…'" in error  # an excerpt, not the whole
    assert requests(server) == 3


def test_the_recording_names_each_call_and_holds_no_key(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "run.jsonl"
    with record(path):
        Echo("E").bind(resources=make_resources(server)).run_sync("line one\nline two")
    header, call = lines(path)
    assert header["format"] == "plait-recording"
    assert call["module"] == "Echo" and call["prompt"] == "line one line two"
    assert call["reply"]["text"] == echo("E", "line one\nline two")  # type: ignore[index]
    assert "sk-test" not in path.read_text()


def test_recording_again_adds_to_a_recording_unless_told_to_start_afresh(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "run.jsonl"
    module = Echo("E").bind(resources=make_resources(server))
    with record(path):
        module.run_sync("old")
    with record(path):
        module.run_sync("new")
    assert [c.get("prompt") for c in lines(path)[1:]] == ["old", "new"]  # never wiped
    with record(path, append=False):
        module.run_sync("more")
    assert [c.get("prompt") for c in lines(path)[1:]] == ["more"]

    recorder = Recorder(path, append=False)  # a decorated function run twice keeps both

    @recorder
    def run(text: str) -> str:
        return str(module.run_sync(text))

    run("a")
    run("b")
    assert [c.get("prompt") for c in lines(path)[1:]] == ["a", "b"]


def test_a_checkpointed_rerun_under_record_keeps_a_recording_of_the_whole_run(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path, checkpoint = tmp_path / "run.jsonl", tmp_path / "ckpt"
    texts = [f"doc {i}" for i in range(20)]
    pipeline = FanOutFanIn().bind(resources=make_resources(server), checkpoint_dir=checkpoint)
    with record(path, append=False):
        first = pipeline.run_sync(texts)
    assert len(lines(path)) == 1 + 60
    with record(path, append=False):  # even a fresh recording: the checkpoint answers all
        assert pipeline.run_sync(texts) == first
    assert server.stats()["requests_total"] == 60  # the rerun paid for nothing
    assert len(lines(path)) == 1 + 60  # and recorded every call again
    with replay(path):
        assert FanOutFanIn().run_sync(texts) == first  # no resources: all from the file


def test_a_failed_call_is_not_recorded(server: FakeOpenAIServer, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with record(path) as recorder, pytest.raises(plait.ExecutionError):
        Echo("E").bind(resources=make_resources(server)).run_sync("[[status:400]] no")
    assert recorder.calls == 0 and len(lines(path)) == 1


def test_a_missing_or_corrupt_recording_is_a_clear_error(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    with pytest.raises(RecordingError, match="no recording at"), replay(tmp_path / "none.jsonl"):
        pass

    path = tmp_path / "run.jsonl"
    with record(path):
        Echo("E").bind(resources=make_resources(server)).run_sync("hello")
    good = path.read_text().splitlines()

    path.write_text("\n".join([good[0], '{"key": "abc", "fingerprint": "de', good[1]]) + "\n")
    with pytest.raises(RecordingError, match="line 2 is corrupt"), replay(path):
        pass
    path.write_text("\n".join([good[0], '{"key": "abc", "fingerprint": "def"}']) + "\n")
    with pytest.raises(RecordingError, match="line 2 is corrupt"):
        Replayer(path).load()
    path.write_text('{"some": "other json lines"}\n' + good[1] + "\n")
    with pytest.raises(RecordingError, match="not a plait recording"), replay(path):
        pass
    with pytest.raises(RecordingError, match="not a plait recording"), record(path, append=True):
        pass
    path.write_text("")
    with pytest.raises(RecordingError, match="empty"), replay(path):
        pass
