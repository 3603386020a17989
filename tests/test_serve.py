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
    resumed = f"plait serve: resuming job {job}: 5 inputs, 3 finished and 3 calls kept"
    assert resumed in second.output()
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

    # A forward parameter no request could set: refused at start, not by every request.
    done = subprocess.run(
        [sys.executable, "-m", "plait.cli", "serve", "tests/serve_targets.py:Private"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "plait serve: error: Private.forward's parameter '_trace' starts with an underscore, "
        "which an HTTP input cannot carry (such names are private to the request model): "
        "rename it, e.g. 'trace'"
    )
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
        async with session.get(f"{url}/jobs/{job}/result") as response:  # no row delivered
            assert (response.status, await response.json()) == (
                200,
                {"state": "failed", "rows": [], "error": error},
            )
    assert server.stats()["requests_total"] == 2  # nothing sent on the other model


# -- values JSON cannot carry ----------------------------------------------------------------------
def strict_json(raw: bytes) -> Any:
    """``raw`` read as a strict parser reads it: UTF-8, no NaN or Infinity, no lone
    surrogate escape (Python's own parser accepts all three)."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"not strict JSON: {token} in {raw[:200]!r}")

    data = json.loads(raw.decode("utf-8"), parse_constant=refuse)

    def check(value: Any) -> None:
        if isinstance(value, str):
            assert not any("\ud800" <= c <= "\udfff" for c in value), f"a lone surrogate: {raw!r}"
        elif isinstance(value, dict):
            for key, inner in value.items():
                check(key)
                check(inner)
        elif isinstance(value, list):
            for inner in value:
                check(inner)

    check(data)
    return data


async def fetch(
    session: aiohttp.ClientSession, method: str, url: str, data: str | bytes | None = None
) -> tuple[int, Any]:
    """A request with a body as a client wrote it; the reply read strictly."""
    headers = {"Content-Type": "application/json"}
    async with session.request(method, url, data=data, headers=headers) as response:
        return response.status, strict_json(await response.read())


def sse_events(raw: bytes) -> list[tuple[str, Any]]:
    """Every server-sent event of a finished stream, each ``data`` read strictly."""
    events = []
    for block in raw.decode("utf-8").strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], strict_json(lines["data"].encode())))
    return events


async def test_an_output_json_cannot_carry_costs_only_its_row_on_every_route(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A score of NaN or Infinity, or text holding half an emoji, in one row: that row
    is its error, naming the value and why, on /invoke, /batch, /stream and a job;
    every other row is delivered, and every reply (and the job's results file) is strict
    JSON."""
    import plait.serve
    from tests.serve_targets import Rated

    questions = ["a", "nan", "cut", "inf"]
    why = {
        1: 'output["score"] is NaN, which strict JSON has no form for',
        2: 'output["text"] holds a lone surrogate (\\ud83d at character',
        3: 'output["score"] is Infinity, which strict JSON has no form for',
    }
    inputs = json.dumps({"inputs": [{"question": q} for q in questions]})

    def check_rows(rows: list[dict[str, Any]]) -> None:
        assert [row["index"] for row in rows] == [0, 1, 2, 3]
        assert rows[0] == {"index": 0, "output": {"text": "[Be brief.] a", "score": 1.0}}
        for index, message in why.items():
            error = rows[index]["error"]
            assert error["type"] == "UnservableOutput" and message in error["message"], error
            assert error["module_path"] == "Rated output"

    api = plait.serve.app(Rated(), fake_resources(server), jobs_dir=tmp_path / "jobs")
    async with in_process(api) as (session, url):

        async def invoke() -> None:
            status, body = await fetch(session, "POST", f"{url}/invoke", '{"question": "nan"}')
            assert status == 500 and why[1] in body["error"]["message"], body

        async def batch() -> None:
            status, body = await fetch(session, "POST", f"{url}/batch", inputs)
            assert status == 200
            check_rows(body["rows"])

        async def stream() -> None:
            json_body = {"Content-Type": "application/json"}
            async with session.post(f"{url}/stream", data=inputs, headers=json_body) as response:
                assert response.status == 200
                events = sse_events(await response.read())
            rows = [data for kind, data in events if kind == "row"]
            check_rows(sorted(rows, key=lambda row: row["index"]))
            assert events[-1] == ("summary", {"total": 4, "done": 1, "failed": 3})

        async def job() -> None:
            status, body = await fetch(session, "POST", f"{url}/jobs", inputs)
            assert status == 202
            job = body["id"]

            async def ended() -> bool:
                return (await job_status(session, url, job))["state"] != "running"

            await until(ended, "the job ended")
            status_now = await job_status(session, url, job)
            assert status_now["state"] == "done"
            assert status_now["counts"] == {"total": 4, "done": 1, "failed": 3, "pending": 0}
            status, body = await fetch(session, "GET", f"{url}/jobs/{job}/result")
            assert status == 200 and body["state"] == "done"
            check_rows(body["rows"])
            lines = (tmp_path / "jobs" / job / "results.jsonl").read_bytes().splitlines()
            check_rows([strict_json(line) for line in lines])

        paid = 0
        for route, calls in ((invoke, 1), (batch, 4), (stream, 4), (job, 4)):  # one at a time
            await route()
            paid += calls
            assert server.stats()["requests_total"] == paid  # every input paid once
        await asyncio.gather(invoke(), batch(), stream(), job())  # and all at once
        assert server.stats()["requests_total"] == 2 * paid


async def test_an_input_json_cannot_carry_is_refused_before_any_call(
    client: Any, server: FakeOpenAIServer
) -> None:
    """A lone surrogate (a client cut a UTF-16 string inside an emoji), NaN or 1e400 in
    one input of three: a 422 naming the input and the field, on every route, before
    any call is made; so are the other odd bodies a real client sends."""
    session, url = client
    cut = '"cut \\ud83d"'  # valid JSON: the escape of half a surrogate pair
    for route, many in (("/invoke", False), ("/batch", True), ("/stream", True), ("/jobs", True)):
        for value, why in (
            (cut, "holds a lone surrogate (\\ud83d at character 4)"),
            ("NaN", "is NaN, which strict JSON has no form for"),
            ("1e400", "is Infinity, which strict JSON has no form for"),
        ):
            odd = '{"question": ' + value + "}"
            body = '{"inputs": [{"question": "a"}, ' + odd + ', {"question": "c"}]}'
            status, reply = await fetch(session, "POST", url + route, body if many else odd)
            where = "inputs.1.question" if many else "question"
            assert status == 422, (route, value, reply)
            assert f"{where}: Value error, question {why}" in reply["message"], reply

    # Bodies that are not an input at all: each a 4xx saying what is wrong, in strict JSON.
    status, reply = await fetch(session, "POST", f"{url}/invoke", b"")
    assert status == 422 and "the body: Field required" in reply["message"]
    status, reply = await fetch(session, "POST", f"{url}/batch", '{"inputs": [{"question": "a"')
    assert status == 422 and "the body is not JSON (Expecting" in reply["message"], reply
    status, reply = await fetch(
        session, "POST", f"{url}/invoke", '{"question": ' + "9" * 5000 + "}"
    )
    assert status == 400 and "a number with more digits than are read" in reply["detail"]
    status, reply = await fetch(
        session, "POST", f"{url}/jobs", '{"inputs": [{"question": ' + "[" * 300 + "]" * 300 + "}]}"
    )
    assert status == 422
    assert (
        "inputs.0.question: Value error, question nests deeper than 200 levels" in reply["message"]
    )
    deep = '{"question": ' + "[" * 100_000 + "]" * 100_000 + "}"
    status, reply = await fetch(session, "POST", f"{url}/batch", deep)
    assert status == 400 and "nests deeper than can be read" in reply["detail"]
    status, reply = await fetch(session, "POST", f"{url}/invoke", '{"question": "a", "x": NaN}')
    assert status == 422 and "x: Extra inputs are not permitted" in reply["message"]
    assert reply["detail"][0]["input"] == "NaN"  # quoted as text: the reply stays strict
    assert server.stats()["requests_total"] == 0  # nothing refused was paid for
    async with session.get(f"{url}/jobs") as response:
        assert all(job["counts"]["total"] != 3 for job in await response.json())


# -- clients that leave ----------------------------------------------------------------------------
async def test_a_client_that_leaves_a_batch_or_an_invoke_stops_paying_for_it(
    client: Any, server: FakeOpenAIServer
) -> None:
    """A /batch of 20 and an /invoke whose clients close their sockets while calls are at
    the endpoint: their inputs still running are cancelled with their calls, and none of
    the batch's other inputs is sent; another client's batch, running alongside, is
    answered."""
    session, url = client
    stays = asyncio.ensure_future(
        post(session, f"{url}/batch", {"inputs": [{"question": "stays [[gate:stays]]"}]})
    )
    await asyncio.to_thread(server.wait_parked, "stays", 1)
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def leaving(route: str, body: Any) -> asyncio.StreamWriter:
        """A client that sends its request and reads nothing: it will just go away."""
        _, writer = await asyncio.open_connection(host, int(port))
        data = json.dumps(body).encode()
        head = f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        return writer

    invoke = await leaving("/invoke", {"question": "gone [[gate:gone]]"})
    await asyncio.to_thread(server.wait_parked, "gone", 1)
    questions = ["one", "two", "three"] + [f"left {i} [[gate:left]]" for i in range(17)]
    batch = await leaving("/batch", {"inputs": [{"question": q} for q in questions]})
    # The last of LIMIT slots: the batch's first three inputs, then its fourth, held.
    await asyncio.to_thread(server.wait_parked, "left", 1)
    assert server.stats()["requests_total"] == 1 + 1 + 3 + 1

    async def cancelled(gate: str, count: int) -> bool:
        stats = server.stats()
        return server.parked(gate) == 0 and stats["status_counts"].get("499", 0) == count

    # One client at a time: a slot the first frees must not go to the other's next input.
    batch.close()
    await batch.wait_closed()
    await until(lambda: cancelled("left", 1), "the batch's call in flight was cancelled")
    invoke.close()
    await invoke.wait_closed()
    await until(lambda: cancelled("gone", 2), "the invoke's call was cancelled")
    server.open_gate("stays")
    assert await stays == (200, {"rows": [{"index": 0, "output": reply("stays")}]})
    stats = server.stats()
    assert stats["requests_total"] == 6  # 16 of the batch's 20 inputs were never sent
    assert stats["status_counts"] == {"200": 4, "499": 2}
    assert await post(session, f"{url}/invoke", {"question": "next"}) == (
        200,
        {"output": reply("next")},
    )


# -- jobs: ended, counted, limited -----------------------------------------------------------------
async def test_a_cancelled_jobs_finished_rows_can_be_read(
    client: Any, server: FakeOpenAIServer
) -> None:
    """DELETE mid-run, then its result: the rows that finished (paid for), with the
    job's state; its calls at the endpoint are cancelled, the others never sent."""
    session, url = client
    done = [{"question": f"q{i}"} for i in range(6)]
    held = [{"question": f"h{i} [[gate:held]]"} for i in range(24)]
    status, body = await post(session, f"{url}/jobs", {"inputs": done + held})
    assert status == 202
    job = body["id"]

    async def six_done() -> bool:
        counts = (await job_status(session, url, job))["counts"]
        return counts["done"] == 6 and server.parked("held") == LIMIT

    await until(six_done, "six inputs finished and the next ones wait at the endpoint")
    async with session.delete(f"{url}/jobs/{job}") as response:
        assert (await response.json())["state"] == "cancelled"
    async with session.get(f"{url}/jobs/{job}/result") as response:
        assert response.status == 200
        result = strict_json(await response.read())
    assert result == {
        "state": "cancelled",
        "rows": [{"index": i, "output": reply(f"q{i}")} for i in range(6)],
    }
    assert (await job_status(session, url, job))["calls"] == {
        "done": 6,
        "failed": 0,
        "in_flight": 0,
    }

    async def released() -> bool:
        return server.parked("held") == 0

    await until(released, "the cancelled job's calls were cancelled")
    stats = server.stats()
    assert stats["status_counts"] == {"200": 6, "499": LIMIT}
    assert stats["requests_total"] == 6 + LIMIT


async def test_a_jobs_status_counts_its_calls_as_they_finish(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """An input that makes several calls: the job's ``calls`` move as each is answered,
    while no input has finished yet; inputs are counted as each finishes."""
    import plait.serve
    from tests.serve_targets import Several

    api = plait.serve.app(Several(), fake_resources(server), jobs_dir=tmp_path / "jobs")
    async with in_process(api) as (session, url):
        inputs = [
            {"questions": ["a", "b", "c [[gate:last]]"]},
            {"questions": ["d [[gate:first]]"]},
            {"questions": ["e [[status:400]]"]},
        ]
        status, body = await post(session, f"{url}/jobs", {"inputs": inputs})
        assert status == 202 and body["calls"] == {"done": 0, "failed": 0, "in_flight": 0}
        job = body["id"]

        async def counted(calls: dict[str, int], counts: dict[str, int]) -> bool:
            now = await job_status(session, url, job)
            return bool(now["calls"] == calls and now["counts"] == counts)

        pending = {"total": 3, "done": 0, "failed": 1, "pending": 2}
        await until(
            lambda: counted({"done": 2, "failed": 1, "in_flight": 2}, pending),
            "two calls answered, one failed, two at the endpoint; no input done",
        )
        server.open_gate("first")
        one_done = {"total": 3, "done": 1, "failed": 1, "pending": 1}
        await until(
            lambda: counted({"done": 3, "failed": 1, "in_flight": 1}, one_done),
            "the second input counted as done while the first still runs",
        )
        server.open_gate("last")
        all_done = {"total": 3, "done": 2, "failed": 1, "pending": 0}
        await until(
            lambda: counted({"done": 4, "failed": 1, "in_flight": 0}, all_done),
            "every call and input counted",
        )
        assert (await job_status(session, url, job))["state"] == "done"


async def test_max_concurrent_holds_for_requests_and_jobs_together(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """``--max-concurrent 3`` with three jobs, a batch and invokes all waiting at once (the
    alias would allow 8): 3 calls in flight, the rest queued on the server's one limit."""
    resources = write_resources(tmp_path / "resources.toml", server, 8)
    args = (TARGET, "--resources", resources, "--jobs-dir", tmp_path / "jobs")
    process = Served(tmp_path / "serve.log", *args, "--max-concurrent", "3")
    try:
        async with aiohttp.ClientSession() as session:
            url = await process.ready(session)
            for j in range(3):
                held = [{"question": f"job {j}-{i} [[gate:cap]]"} for i in range(3)]
                assert (await post(session, f"{url}/jobs", {"inputs": held}))[0] == 202
            requests = asyncio.gather(
                post(session, f"{url}/batch", {"inputs": [{"question": "b [[gate:cap]]"}] * 3}),
                *(
                    post(session, f"{url}/invoke", {"question": f"i{i} [[gate:cap]]"})
                    for i in range(3)
                ),
            )

            async def queued() -> bool:
                async with session.get(f"{url}/health") as response:
                    limit = (await response.json())["max_concurrent"]
                return bool(limit == {"limit": 3, "in_flight": 3, "waiting": 15 - 3})

            await until(queued, "every call started: 3 at the endpoint, the others queued")
            assert server.parked("cap") == 3 and server.stats()["in_flight"] == 3
            server.open_gate("cap")
            answers = await requests
            assert [status for status, _ in answers] == [200] * 4

            async def jobs_done() -> bool:
                async with session.get(f"{url}/jobs") as response:
                    return all(job["state"] == "done" for job in await response.json())

            await until(jobs_done, "the jobs finished")
    finally:
        assert process.stop() == 0, process.output()
    stats = server.stats()
    assert stats["requests_total"] == 15
    assert stats["max_in_flight"] == 3  # reached, never exceeded, jobs and requests together


async def test_inputs_of_concurrent_requests_never_share_a_seed(server: FakeOpenAIServer) -> None:
    """With a run seed, two requests' inputs numbered 0 (as their rows are) still send
    seeds of their own: each input takes its own place on the shared run."""
    import plait.serve
    from tests.serve_targets import Answer

    api = plait.serve.app(Answer(), fake_resources(server), seed=7)
    async with in_process(api) as (session, url):
        same = {"question": "same [[gate:seeds]]"}
        answers = asyncio.gather(
            post(session, f"{url}/invoke", same),
            post(session, f"{url}/invoke", same),
            post(session, f"{url}/batch", {"inputs": [same, same]}),
        )
        await asyncio.to_thread(server.wait_parked, "seeds", 4)  # all in flight at once
        server.open_gate("seeds")
        assert [status for status, _ in await answers] == [200, 200, 200]
    seeds = [record["body"]["seed"] for record in server.stats(bodies=True)["requests"]]
    assert len(seeds) == 4 and len(set(seeds)) == 4
