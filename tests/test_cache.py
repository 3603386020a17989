"""`cache(path)`: a warm rerun costs no request, only identical calls hit, processes share it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

import plait
import plait.handlers
from plait.handlers import Handler, Message
from plait.handlers.caching import Cache, CacheError, bypass, cache
from plait.handlers.llm import answer
from plait.providers.base import LLMResponse
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, echo

ROOT = Path(__file__).resolve().parent.parent


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def requests(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


def test_a_warm_cache_reruns_a_thousand_inputs_without_a_single_request(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = [f"item {i}" for i in range(1000)]
    pipeline = FanOutFanIn().bind(resources=make_resources(server, max_concurrent=32))
    path = tmp_path / "calls.db"

    with cache(path) as cold:
        first = pipeline.run_sync(inputs)
    assert first == [expected_fan(text) for text in inputs]
    assert (cold.hits, cold.misses, cold.stores) == (0, 3000, 3000)
    assert requests(server) == 3000

    server.reset()
    with cache(path) as warm:  # a new handler on the same file: the replies are on disk
        second = pipeline.run_sync(inputs)
    assert second == first
    assert requests(server) == 0
    assert not path.with_name("calls.db-wal").exists()  # closed: one self-contained file
    assert warm.stats() == {
        "hits": 3000,
        "misses": 0,
        "stores": 0,
        "hit_rate": 1.0,
        "entries": 3000,
    }


def test_only_a_call_that_could_get_the_same_reply_hits(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "calls.db"
    resources = make_resources(server)

    def ask(temperature: float = 0.0, resources: Any = resources, namespace: str = "") -> Cache:
        module = Echo("t")
        module.temperature = temperature
        with cache(path, namespace=namespace) as handler:
            assert module.bind(resources=resources).run_sync("hello") == echo("t", "hello")
        return handler

    assert ask().misses == 1
    assert ask().hits == 1
    assert ask(temperature=0.7).misses == 1  # only the temperature changed
    assert ask(resources=make_resources(server, model="m2")).misses == 1  # only the model
    assert ask(namespace="experiment-2").misses == 1  # the same call in another namespace
    assert ask(namespace="experiment-2").hits == 1
    # The alias and the API key are local details: neither is part of the key.
    renamed = make_resources(server, ("other",), api_key="sk-rotated")
    module = Echo("t", alias="other")
    module.temperature = 0.0
    with cache(path) as handler:  # a miss would fail: the server does not know that key
        assert module.bind(resources=renamed).run_sync("hello") == echo("t", "hello")
    assert handler.hits == 1
    assert requests(server) == 4
    assert b"sk-test" not in path.read_bytes()


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_a_structured_reply_comes_back_from_the_cache_as_the_typed_object(
    server: FakeOpenAIServer, tmp_path: Path, resources: plait.ResourceConfig
) -> None:
    module = plait.LLMInference("fast", response_format=Person).bind(resources=resources)
    with cache(tmp_path / "calls.db"):
        fresh = module.run_sync("who is it?")
    server.reset()
    with cache(tmp_path / "calls.db") as handler:
        cached = module.run_sync("who is it?")
    assert isinstance(cached, Person) and cached == fresh
    assert handler.hits == 1 and requests(server) == 0


class SeeCacheMark(Handler):
    def __init__(self) -> None:
        self.marks: list[str | None] = []

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm":
            self.marks.append(msg.meta.get("cache"))


def test_other_handlers_can_tell_a_hit_from_a_call(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Echo("x").bind(resources=resources)
    with SeeCacheMark() as seen, cache(tmp_path / "calls.db"):
        module.run_sync("a")
        module.run_sync("a")
    assert seen.marks == ["miss", "hit"]


def test_bypass_neither_reads_nor_writes(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Echo("x").bind(resources=resources)
    with cache(tmp_path / "calls.db") as handler:
        module.run_sync("warm")
        with plait.handlers.cache.bypass():  # the documented spelling
            module.run_sync("warm")  # not read: goes to the server
            module.run_sync("cold")  # not written
        assert requests(server) == 3
        assert handler.stats()["entries"] == 1
        assert (handler.hits, handler.misses) == (0, 1)
        module.run_sync("cold")  # outside the block the cache applies again
    assert handler.misses == 2 and handler.stores == 2

    with cache(tmp_path / "calls.db") as kept, cache(tmp_path / "other.db") as skipped:
        with skipped.bypass():  # one cache only
            module.run_sync("warm")
        with bypass():
            module.run_sync("warm")
    assert (kept.hits, skipped.misses, skipped.stores) == (1, 0, 0)


def test_a_failed_call_is_not_stored(resources: plait.ResourceConfig, tmp_path: Path) -> None:
    module = Echo("x").bind(resources=resources)
    with cache(tmp_path / "calls.db") as handler, pytest.raises(plait.ExecutionError, match="400"):
        module.run_sync("[[status:400]] refuse this")
    assert handler.misses == 1 and handler.stores == 0
    assert handler.stats()["entries"] == 0


class Canned(Handler):
    """Answers every call itself, the way a mock does."""

    def process(self, msg: Message) -> None:
        if msg.type == "llm":
            answer(msg, LLMResponse("canned"))


def test_a_reply_another_handler_made_up_is_not_stored(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Echo("x").bind(resources=resources)
    with Canned(), cache(tmp_path / "calls.db") as handler:  # the cache misses, then Canned answers
        assert module.run_sync("q") == "canned"
    assert handler.misses == 1 and handler.stores == 0
    with cache(tmp_path / "calls.db"):
        assert module.run_sync("q") == echo("x", "q")
    assert requests(server) == 1


def test_a_path_that_is_not_a_usable_cache_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="is a directory"):
        cache(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheError, match="cannot create the folder"):
        cache(blocker / "calls.db")
    notes = tmp_path / "notes.txt"
    notes.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(CacheError, match="not a plait cache"):
        cache(notes)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE people (name TEXT)")
    db.close()
    with pytest.raises(CacheError, match="not a plait cache"):
        cache(other)
    assert notes.read_text().startswith("these are my notes")  # nothing was overwritten


# Each child opens the cache, says so, and waits for the parent's go: both then write at once.
CHILD = """
import sys
import plait
from plait.handlers.caching import cache
from tests.pipelines import FanOutFanIn

url, path, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
resources = plait.ResourceConfig(
    {"fast": {"provider": "openai", "model": "m", "base_url": url, "api_key": "sk-test",
              "max_concurrent": 16}}
)
pipeline = FanOutFanIn().bind(resources=resources)
handler = cache(path)
print("ready", flush=True)
sys.stdin.readline()
with handler:
    outputs = pipeline.run_sync([f"item {i}" for i in range(start, stop)])
print(handler.hits, handler.misses, handler.stores, len(outputs), flush=True)
"""


def test_two_processes_share_one_cache_file(server: FakeOpenAIServer, tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    ranges = [(0, 300), (200, 500)]  # they overlap: both may write the same keys
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, server.base_url, str(path), str(a), str(b)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a, b in ranges
    ]
    try:
        for child in children:
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert ready == "ready\n", child.stderr.read()  # type: ignore[union-attr]
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child, (a, b) in zip(children, ranges, strict=True):
            stdout, stderr = child.communicate(timeout=120)
            assert child.returncode == 0, stderr
            hits, misses, stores, count = map(int, stdout.split())
            # A child may hit what the other one wrote a moment before (the ranges overlap).
            assert count == b - a and hits + misses == 3 * count and stores == misses
    finally:
        for child in children:  # a failed child must not keep loading the shared server
            if child.poll() is None:
                child.kill()
                child.wait()

    server.reset()
    inputs = [f"item {i}" for i in range(500)]
    pipeline = FanOutFanIn().bind(resources=make_resources(server, max_concurrent=16))
    with cache(path) as third:
        outputs = pipeline.run_sync(inputs)
    assert outputs == [expected_fan(text) for text in inputs]
    assert (third.hits, third.misses) == (1500, 0)
    assert requests(server) == 0


def test_a_damaged_cache_file_is_named_with_the_fix(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "calls.db"
    module = Echo("E").bind(resources=make_resources(server))
    with cache(path):
        module.run_sync([f"prompt {i} " + "x" * 2000 for i in range(200)])
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # overwrite the pages after the first with garbage
        fh.seek(4096)
        fh.write(b"\x13" * (size - 4096))
    with pytest.raises(CacheError) as info, cache(path):
        module.run_sync(["prompt 1 " + "x" * 2000])
    message = str(info.value)  # before any call is made, naming the file and the fix
    assert str(path) in message and "malformed" in message and "delete it" in message


def test_a_stored_row_that_is_not_utf8_is_named_with_the_fix_and_not_quoted(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "calls.db"
    module = Echo("E").bind(resources=make_resources(server))
    with cache(path):
        module.run_sync("SECRET-PROMPT")
    db = sqlite3.connect(path)
    with db:  # the reply's bytes scrambled: no longer UTF-8, still stored as text
        db.execute("UPDATE plait_cache_replies SET reply = CAST(X'ff53454352455452455059' AS TEXT)")
    db.close()
    with pytest.raises(plait.ExecutionError) as info, cache(path):
        module.run_sync("SECRET-PROMPT")
    cause = info.value.value.payload
    assert isinstance(cause, CacheError)
    message = str(cause)
    assert str(path) in message and "not valid UTF-8" in message and "delete it" in message
    assert "SECRETREPY" not in message and "with text" not in message
