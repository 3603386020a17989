"""``plait serve``: a real server process, a real HTTP client, the fake OpenAI server behind.

Each server is ``plait serve`` in a process of its own on a free port (the port it
bound is read from its first line on stderr), ready once ``/health`` says so.  What
must happen at a moment (a request in flight, a job half done) is held there by the
fake server's gates, and every wait is for a state: a gate's count, a job's counts,
a process's exit.  One server serves most tests; the shutdown test starts two more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from plait.testing import FakeOpenAIServer
from tests.conftest import ROOT

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

TARGET = "tests/serve_targets.py:Answer"
#: The alias's max_concurrent on the shared server: the concurrency the fake may see.
LIMIT = 3
#: How long a wait for a state may take before it is a failure (never a pace).
PATIENCE_S = 60.0


def reply(question: str, style: str = "plain") -> str:
    """What the pipeline answers (the fake echoes the prompt behind the system prompt)."""
    return f"[Be brief.] {style}: {question}"


def write_resources(path: Path, server: FakeOpenAIServer, max_concurrent: int) -> Path:
    path.write_text(
        "[resources.fast]\n"
        'provider = "openai"\nmodel = "m"\n'
        f'base_url = "{server.base_url}"\napi_key = "sk-test"\n'
        f"max_concurrent = {max_concurrent}\n",
        encoding="utf-8",
    )
    return path


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Return once ``check()`` holds; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + PATIENCE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


class Served:
    """``plait serve`` in a process of its own, on a port it picks."""

    def __init__(self, log: Path, *args: str | Path) -> None:
        self.log = log
        with open(log, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "plait.cli", "serve", *map(str, args), "--port", "0"],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=dict(os.environ),
            )
        self.url = ""

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8")

    async def ready(self, session: aiohttp.ClientSession) -> str:
        """The server's base URL, once its ``/health`` says it is ready."""

        async def bound() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"plait serve exited early:\n{self.output()}")
            return " on http://" in self.output()

        await until(bound, "plait serve printed its address")
        line = next(line for line in self.output().splitlines() if " on http://" in line)
        self.url = "http://" + line.split(" on http://", 1)[1].strip()

        async def healthy() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"plait serve exited early:\n{self.output()}")
            try:
                async with session.get(f"{self.url}/health") as response:
                    return response.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await until(healthy, "plait serve's /health answered 200")
        return self.url

    def stop(self) -> int:
        """SIGTERM, and the exit status once the process has shut down."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=PATIENCE_S)


@pytest.fixture(scope="module")
def served(
    server_process: FakeOpenAIServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("serve")
    resources = write_resources(where / "resources.toml", server_process, LIMIT)
    process = Served(
        where / "serve.log", TARGET, "--resources", resources, "--jobs-dir", where / "jobs"
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
async def client(served: Served, server: FakeOpenAIServer) -> AsyncIterator[Any]:
    """A session and the shared server's URL (the fake's stats cleared for the test)."""
    async with aiohttp.ClientSession() as session:
        url = await served.ready(session)
        yield session, url


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json()


# -- invoke, batch, errors, schema -----------------------------------------------------------------
async def test_invoke_batch_and_their_errors(client: Any, server: FakeOpenAIServer) -> None:
    session, url = client
    assert await post(session, f"{url}/invoke", {"question": "why?"}) == (
        200,
        {"output": reply("why?")},
    )
    status, body = await post(session, f"{url}/invoke", {"question": "q", "style": "terse"})
    assert (status, body) == (200, {"output": reply("q", "terse")})

    # The endpoint behind the pipeline fails: 502, the cause and a traceback, no key.
    status, body = await post(session, f"{url}/invoke", {"question": "x [[status:400]]"})
    assert status == 502
    error = body["error"]
    assert error["kind"] == "ERROR" and error["type"] == "ProviderError"
    assert "HTTP 400" in error["message"] and error["module_path"] == "reply"
    assert "Traceback" in error["traceback"]
    assert "sk-test" not in json.dumps(body)

    # A bad body: 422 naming the field and what was expected.
    status, body = await post(session, f"{url}/invoke", {"questoin": "typo"})
    assert status == 422
    assert "question: Field required" in body["message"]
    assert "questoin: Extra inputs are not permitted" in body["message"]
    assert "question (string, required)" in body["message"]
    status, body = await post(session, f"{url}/invoke", {"question": ["not", "text"]})
    assert status == 422 and "question: Input should be a valid string" in body["message"]

    # A batch: rows in input order, the failed input's error inline, the others answered.
    questions = ["one", "two [[status:400]]", "three", "four"]
    status, body = await post(
        session, f"{url}/batch", {"inputs": [{"question": q} for q in questions]}
    )
    assert status == 200
    rows = body["rows"]
    assert [row["index"] for row in rows] == [0, 1, 2, 3]
    assert [row.get("output") for row in rows] == [
        reply("one"),
        None,
        reply("three"),
        reply("four"),
    ]
    assert rows[1]["error"]["type"] == "ProviderError"
    assert server.stats()["requests_total"] == 3 + 4

    # Jobs: an unknown id is a 404 that says so.
    async with session.get(f"{url}/jobs/nope") as response:
        assert response.status == 404
        assert "no job 'nope'" in (await response.json())["detail"]


async def test_openapi_schema_comes_from_forward(client: Any) -> None:
    session, url = client
    async with session.get(f"{url}/openapi.json") as response:
        assert response.status == 200
        spec = await response.json()
    schemas = spec["components"]["schemas"]
    assert schemas["AnswerInput"]["required"] == ["question"]
    assert schemas["AnswerInput"]["properties"]["question"]["type"] == "string"
    assert schemas["AnswerInput"]["properties"]["style"]["default"] == "plain"
    assert schemas["AnswerOutput"]["properties"]["output"]["type"] == "string"
    invoke = spec["paths"]["/invoke"]["post"]
    body = invoke["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/AnswerInput")
    assert invoke["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AnswerOutput"
    )
    assert invoke["responses"]["502"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Failure"
    )
    for path in ("/batch", "/stream", "/jobs", "/jobs/{job_id}", "/jobs/{job_id}/result"):
        assert path in spec["paths"]
    assert "Answers a question" in spec["info"]["description"]


# -- many clients at once --------------------------------------------------------------------------
async def test_concurrent_clients_share_one_set_of_limits(
    client: Any, server: FakeOpenAIServer
) -> None:
    session, url = client
    gate = "[[gate:crowd]]"
    singles = [f"single {i} {gate}" for i in range(12)]
    batches = [[f"batch {b}-{i} {gate}" for i in range(4)] for b in range(3)]

    async def invoke(question: str) -> Any:
        return await post(session, f"{url}/invoke", {"question": question})

    async def batch(questions: list[str]) -> Any:
        return await post(session, f"{url}/batch", {"inputs": [{"question": q} for q in questions]})

    answers = asyncio.gather(*map(invoke, singles), *map(batch, batches))
    # Every request is in; the alias lets exactly LIMIT calls through to the endpoint.
    await asyncio.to_thread(server.wait_parked, "crowd", LIMIT)
    stats = server.stats()
    assert stats["in_flight"] == LIMIT
    server.open_gate("crowd")
    results = await answers
    for question, (status, body) in zip(singles, results[: len(singles)], strict=True):
        assert (status, body) == (200, {"output": reply(question.replace(f" {gate}", ""))})
    for questions, (status, body) in zip(batches, results[len(singles) :], strict=True):
        assert status == 200
        assert [row["output"] for row in body["rows"]] == [
            reply(q.replace(f" {gate}", "")) for q in questions
        ]
    stats = server.stats()
    assert stats["requests_total"] == len(singles) + sum(map(len, batches))
    assert stats["max_in_flight"] == LIMIT  # reached, never exceeded, across all clients


# -- streaming -------------------------------------------------------------------------------------
async def read_events(response: aiohttp.ClientResponse, count: int) -> list[tuple[str, Any]]:
    """The next ``count`` server-sent events of ``response``: (event, data)."""
    events: list[tuple[str, Any]] = []
    kind, data = "", ""
    while len(events) < count:
        line = (await response.content.readline()).decode()
        assert line, f"the stream ended after {events}"
        line = line.rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "":
            events.append((kind, json.loads(data)))
    return events


async def test_stream_sends_rows_as_they_finish_then_a_summary(client: Any) -> None:
    session, url = client
    inputs = [{"question": "a"}, {"question": "b [[status:400]]"}, {"question": "c"}]
    async with session.post(f"{url}/stream", json={"inputs": inputs}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = await read_events(response, 4)
    rows = sorted((data for kind, data in events if kind == "row"), key=lambda r: r["index"])
    assert [row.get("output") for row in rows] == [reply("a"), None, reply("c")]
    assert rows[1]["error"]["type"] == "ProviderError"
    assert events[-1] == ("summary", {"total": 3, "done": 2, "failed": 1})


async def test_a_client_that_disconnects_mid_stream_cancels_only_its_own_work(
    client: Any, server: FakeOpenAIServer
) -> None:
    session, url = client
    # Another client's batch, held at its own gate while the stream comes and goes.
    other = asyncio.ensure_future(
        post(session, f"{url}/batch", {"inputs": [{"question": "other [[gate:other]]"}]})
    )
    await asyncio.to_thread(server.wait_parked, "other", 1)

    inputs = [{"question": "first"}] + [{"question": f"held {i} [[gate:never]]"} for i in range(2)]
    async with aiohttp.ClientSession() as leaving:
        response = await leaving.post(f"{url}/stream", json={"inputs": inputs})
        assert await read_events(response, 1) == [("row", {"index": 0, "output": reply("first")})]
        await asyncio.to_thread(server.wait_parked, "never", 2)
        response.close()  # the client goes away mid-stream

    async def cancelled() -> bool:
        stats = server.stats()
        return server.parked("never") == 0 and stats["status_counts"].get("499", 0) == 2

    await until(cancelled, "the server cancelled the departed client's two calls")
    # The other client was not disturbed, and the server goes on serving.
    server.open_gate("other")
    assert await other == (200, {"rows": [{"index": 0, "output": reply("other")}]})
    assert await post(session, f"{url}/invoke", {"question": "next"}) == (
        200,
        {"output": reply("next")},
    )
    assert server.stats()["status_counts"] == {"200": 3, "499": 2}


# -- jobs ------------------------------------------------------------------------------------------
async def job_status(session: aiohttp.ClientSession, url: str, job: str) -> dict[str, Any]:
    async with session.get(f"{url}/jobs/{job}") as response:
        assert response.status == 200
        result: dict[str, Any] = await response.json()
        return result


async def test_a_job_runs_in_the_background_and_can_be_cancelled(
    client: Any, server: FakeOpenAIServer
) -> None:
    session, url = client
    status, body = await post(
        session, f"{url}/jobs", {"inputs": [{"question": "j1"}, {"question": "j2", "style": "x"}]}
    )
    assert status == 202 and body["counts"] == {"total": 2, "done": 0, "failed": 0, "pending": 2}
    job = body["id"]

    async def finished() -> bool:
        return (await job_status(session, url, job))["state"] == "done"

    await until(finished, "the job finished")
    async with session.get(f"{url}/jobs/{job}/result") as response:
        assert response.status == 200
        assert (await response.json())["rows"] == [
            {"index": 0, "output": reply("j1")},
            {"index": 1, "output": reply("j2", "x")},
        ]

    # A job held at a gate: its result is not there yet (409), then it is cancelled.
    status, body = await post(session, f"{url}/jobs", {"inputs": [{"question": "[[gate:job]]"}]})
    held = body["id"]
    await asyncio.to_thread(server.wait_parked, "job", 1)
    async with session.get(f"{url}/jobs/{held}/result") as response:
        assert response.status == 409
        assert "running" in (await response.json())["detail"]
    async with session.delete(f"{url}/jobs/{held}") as response:
        assert response.status == 200
        assert (await response.json())["state"] == "cancelled"

    async def released() -> bool:
        return server.parked("job") == 0

    await until(released, "the cancelled job's call was cancelled")
    async with session.delete(f"{url}/jobs/{job}") as response:  # an ended job: deleted
        assert (await response.json())["deleted"] is True
    async with session.get(f"{url}/jobs/{job}") as response:
        assert response.status == 404


async def test_a_request_goes_before_a_jobs_waiting_calls(
    client: Any, server: FakeOpenAIServer
) -> None:
    """The endpoints' slots are shared, but a background job's calls queue behind the
    interactive requests': a client on /invoke is not starved by a big job."""
    session, url = client
    held = [{"question": f"a{i} [[gate:bg]]"} for i in range(LIMIT)]
    waiting = [{"question": f"b{i} [[gate:bg2]]"} for i in range(LIMIT)]
    status, body = await post(session, f"{url}/jobs", {"inputs": held + waiting})
    assert status == 202
    job = body["id"]
    await asyncio.to_thread(server.wait_parked, "bg", LIMIT)  # every slot taken by the job

    async def health() -> dict[str, Any]:
        async with session.get(f"{url}/health") as response:
            result: dict[str, Any] = (await response.json())["endpoints"]["fast"]
            return result

    urgent = asyncio.ensure_future(
        post(session, f"{url}/invoke", {"question": "urgent [[gate:u]]"})
    )

    async def queued() -> bool:
        return (await health())["waiting"] == LIMIT + 1

    await until(queued, "the invoke and the job's other calls wait for a slot")
    server.open_gate("bg")  # LIMIT slots free at once: the invoke takes the first
    await asyncio.to_thread(server.wait_parked, "u", 1)
    await asyncio.to_thread(server.wait_parked, "bg2", LIMIT - 1)
    assert await health() == {"limit": LIMIT, "in_flight": LIMIT, "waiting": 1}
    server.open_gate("u")
    assert await urgent == (200, {"output": reply("urgent")})
    server.open_gate("bg2")

    async def finished() -> bool:
        return (await job_status(session, url, job))["state"] == "done"

    await until(finished, "the job finished")
    async with session.get(f"{url}/jobs/{job}/result") as response:
        rows = (await response.json())["rows"]
    assert [row["output"] for row in rows] == [
        reply(item["question"].split(" [[", 1)[0]) for item in held + waiting
    ]


async def test_sigterm_finishes_requests_in_flight_and_a_restart_resumes_the_job(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = write_resources(tmp_path / "resources.toml", server, 8)
    trace = tmp_path / "trace.json"
    args = (TARGET, "--resources", resources, "--jobs-dir", tmp_path / "jobs", "--grace", "60")
    args += ("--profile", trace)  # the profile handler, over every request and job
    early = [f"early {i}" for i in range(3)]
    late = [f"late {i} [[gate:held]]" for i in range(2)]
    questions = early + late
    first = Served(tmp_path / "first.log", *args)
    try:
        async with aiohttp.ClientSession() as session:
            url = await first.ready(session)
            status, body = await post(
                session, f"{url}/jobs", {"inputs": [{"question": q} for q in questions]}
            )
            assert status == 202
            job = body["id"]

            async def half_done() -> bool:
                counts = (await job_status(session, url, job))["counts"]
                return counts["done"] == len(early) and server.parked("held") == len(late)

            await until(half_done, "the early inputs finished and the late ones wait")
            # An invoke in flight when SIGTERM comes: it is let finish.
            flying = asyncio.ensure_future(
                post(session, f"{url}/invoke", {"question": "last [[gate:flying]]"})
            )
            await asyncio.to_thread(server.wait_parked, "flying", 1)
            first.proc.send_signal(signal.SIGTERM)

            async def draining() -> bool:
                return "Waiting for connections to close" in first.output()

            await until(draining, "the server stopped accepting and waits for the invoke")
            server.open_gate("flying")
            assert await flying == (200, {"output": reply("last")})
        assert first.stop() == 0, first.output()
    finally:
        first.stop()

    async def stopped() -> bool:  # the job's calls in flight were stopped, not left
        return server.parked("held") == 0

    await until(stopped, "the stopped server's job calls were cancelled")
    paid = server.stats()["completed_by_key"]
    assert len(paid) == len(early) + 1

    second = Served(tmp_path / "second.log", *args)
    try:
        async with aiohttp.ClientSession() as session:
            url = await second.ready(session)
            await asyncio.to_thread(server.wait_parked, "held", len(late))

            async def resumed() -> bool:  # the early inputs answered from the checkpoint
                status_now = await job_status(session, url, job)
                assert status_now["state"] == "running"
                return bool(status_now["counts"]["done"] == len(early))

            await until(resumed, "the resumed job's finished inputs came from its checkpoint")
            assert server.stats()["completed_by_key"] == paid  # and none was sent again
            server.open_gate("held")

            async def finished() -> bool:
                return (await job_status(session, url, job))["state"] == "done"

            await until(finished, "the resumed job finished")
            async with session.get(f"{url}/jobs/{job}/result") as response:
                rows = (await response.json())["rows"]
    finally:
        assert second.stop() == 0, second.output()
    assert [row["index"] for row in rows] == list(range(len(questions)))
    assert [row["output"] for row in rows] == [
        reply(q.replace(" [[gate:held]]", "")) for q in questions
    ]
    assert f"plait serve: trace: {trace}" in second.output()
    assert any(event.get("ph") == "X" for event in json.loads(trace.read_text())["traceEvents"])
    stats = server.stats()
    # Every call was paid for once: the early ones before SIGTERM only, the late ones after.
    assert sorted(stats["completed_by_key"].values()) == [1] * (len(questions) + 1)
    assert stats["status_counts"] == {"200": len(questions) + 1, "499": len(late)}


def test_a_target_or_jobs_dir_that_cannot_be_used_is_the_usual_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plait.cli", "serve", "tests/serve_targets.py:Nope", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("plait serve: error:")
    assert "Nope" in done.stderr and "on http://" not in done.stderr

    taken = tmp_path / "a-file"
    taken.write_text("", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "plait.cli", "serve", TARGET, "--jobs-dir", taken / "jobs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"plait serve: error: cannot create --jobs-dir {taken / 'jobs'}" in done.stderr
    assert "on http://" not in done.stderr


# -- the Python entry ---------------------------------------------------------------------------
def fake_resources(server: FakeOpenAIServer, model: str = "m") -> Any:
    import plait

    return plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": model,
                "base_url": server.base_url,
                "api_key": "sk-test",
            }
        }
    )


@contextlib.asynccontextmanager
async def in_process(app: Any, mount: str = "") -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """``app`` served by uvicorn on this test's loop, on a free port: a session and the
    URL, once ``/health`` answers 200; the server shut down (lifespan and all) after."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}{mount}"
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(uv.serve(sockets=[sock]))
    try:
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                assert not serving.done(), "the in-process server stopped"
                try:
                    async with session.get(f"{url}/health") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await until(healthy, "the in-process server is ready")
            yield session, url
    finally:
        uv.should_exit = True
        await serving
        sock.close()


async def test_the_asgi_app_runs_every_request_through_its_handlers(
    server: FakeOpenAIServer,
) -> None:
    """`plait.serve.app` mounted in an app of the caller's own, served by uvicorn in this
    process (the mounted app's lifespan is not run: it starts on its first request): its
    handlers (a mock of the LLM call) answer every request, several at once, and without
    ``jobs_dir`` the job routes say how to get them."""
    from fastapi import FastAPI

    import plait
    import plait.serve
    from tests.serve_targets import Answer

    mocked = plait.handlers.mock(
        {"reply": lambda request: "mocked " + request.messages[-1]["content"]}
    )
    site = FastAPI()  # the caller's own app, the pipeline mounted in it
    site.mount("/answer", plait.serve.app(Answer(), fake_resources(server), handlers=[mocked]))
    async with in_process(site, "/answer") as (session, url):
        answers = await asyncio.gather(
            *(post(session, f"{url}/invoke", {"question": f"q{i}"}) for i in range(8))
        )
        assert answers == [(200, {"output": f"mocked plain: q{i}"}) for i in range(8)]
        status, body = await post(session, f"{url}/jobs", {"inputs": []})
        assert status == 404 and "--jobs-dir" in body["detail"]
    assert server.stats()["requests_total"] == 0  # every call answered by the handler


async def test_a_job_that_cannot_resume_under_other_settings_fails_saying_why(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A job stopped mid-way, then a server on the same jobs directory with the alias on
    another model: resuming would mix two models' outputs, so the job fails, and its
    status says why (the checkpoint's own refusal) instead of running again."""
    import plait.serve
    from tests.serve_targets import Answer

    jobs = tmp_path / "jobs"
    before = plait.serve.app(Answer(), fake_resources(server), jobs_dir=jobs)
    async with in_process(before) as (session, url):
        inputs = [{"question": "done"}, {"question": "held [[gate:moved]]"}]
        status, body = await post(session, f"{url}/jobs", {"inputs": inputs})
        assert status == 202
        job = body["id"]
        await asyncio.to_thread(server.wait_parked, "moved", 1)

        async def one_done() -> bool:
            return (await job_status(session, url, job))["counts"]["done"] == 1

        await until(one_done, "the job's first input finished")
    # The server has stopped: the job is left running on disk, for the next one.
    assert json.loads((jobs / job / "job.json").read_text())["state"] == "running"

    after = plait.serve.app(Answer(), fake_resources(server, model="m2"), jobs_dir=jobs)
    async with in_process(after) as (session, url):

        async def failed() -> bool:
            return (await job_status(session, url, job))["state"] == "failed"

        await until(failed, "the job that cannot resume failed")
        error = (await job_status(session, url, job))["error"]
        assert "CheckpointError" in error and "'m' -> 'm2'" in error, error
        async with session.get(f"{url}/jobs/{job}/result") as response:
            assert response.status == 409
    assert server.stats()["requests_total"] == 2  # nothing sent on the other model
