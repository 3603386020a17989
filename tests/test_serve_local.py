"""benchmarks/serve_local.py: the embedded model behind an OpenAI-compatible server.

Started as the DSPy baseline starts it (a subprocess, port 0, waited on through its
first line and its ready file), then asked with small ``max_tokens``.  Also the
learning data's third task (``triage``): deterministic and never repeating a message.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "benchmarks" / "serve_local.py"
DATA = ROOT / "benchmarks" / "data" / "learning"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    ready = tmp_path_factory.mktemp("serve") / "port"
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    try:
        assert line.startswith("serving http://127.0.0.1:"), line
        yield line.split(" ", 1)[1].strip().removesuffix("/v1"), ready
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_server_stops_when_its_stdin_closes(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    assert process.stdout.readline().startswith("serving ")
    process.stdin.close()
    assert process.wait(timeout=30) == 0


def post(root: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        root + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get(root: str, path: str) -> Any:
    with urllib.request.urlopen(root + path, timeout=30) as response:
        return json.load(response)


ASK = {
    "model": "any",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 4,
}


def test_the_ready_file_names_the_port(server: tuple[str, Path]) -> None:
    root, ready = server
    assert root.endswith(":" + ready.read_text().strip())
    models = get(root, "/v1/models")
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"


def test_a_chat_completion_is_answered_and_counted(server: tuple[str, Path]) -> None:
    root, _ = server
    before = get(root, "/stats")
    status, raw = post(root, ASK)
    assert status == 200
    reply = json.loads(raw)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"].strip()
    assert 0 < reply["usage"]["completion_tokens"] <= 4
    after = get(root, "/stats")
    assert after["requests"] == before["requests"] + 1
    assert after["completed"] == before["completed"] + 1
    assert (
        after["completion_tokens"] - before["completion_tokens"]
        == (reply["usage"]["completion_tokens"])
    )


def test_a_streamed_completion_ends_with_done(server: tuple[str, Path]) -> None:
    root, _ = server
    status, raw = post(root, ASK | {"stream": True})
    assert status == 200
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        choice["delta"].get("content") or ""
        for event in events[:-1]
        for choice in json.loads(event)["choices"]
    )
    assert text.strip()


def test_a_bad_request_is_a_400(server: tuple[str, Path]) -> None:
    root, _ = server
    status, raw = post(root, {"messages": []})
    assert status == 400
    assert "messages" in json.loads(raw)["error"]["message"]
    status, _ = post(root, ASK | {"n": 2})
    assert status == 400


def test_the_triage_data_is_deterministic_and_never_repeats(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_data", DATA / "make_data.py")
    assert spec is not None and spec.loader is not None
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    make_data.make_all(tmp_path)
    for task in ("extract", "classify", "triage"):
        for split in ("train", "val", "test"):
            name = f"{task}/{split}.jsonl"
            assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    rows = {
        split: (DATA / "triage" / f"{split}.jsonl").read_text().splitlines()
        for split in ("train", "val", "test")
    }
    assert [len(r) for r in rows.values()] == [40, 20, 60]
    messages = [json.loads(line)["input"] for lines in rows.values() for line in lines]
    assert len(set(messages)) == len(messages)
    for lines in rows.values():
        for line in lines:
            row = json.loads(line)
            label, order = row["target"].split(" ")
            assert label in {"billing", "shipping", "technical", "account"}
            assert order in row["input"]
