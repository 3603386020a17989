"""The fake OpenAI server's Batch API (files, batches, their lifecycle and faults), spoken to
over real HTTP with aiohttp, as plait's batch backend will speak to it.

Tests wait for the server's state (a batch's status, a gate's parked count), never for time:
the polling loop below only bounds how long a hang may last before it fails the test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from plait.testing import BATCH_CONFIG_DEFAULTS, FakeOpenAIServer, take_placeholder_requests

KEY = "sk-test"  # the session server's key (tests/conftest.py)
ENDPOINT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")
LIFECYCLE = ("validating", "in_progress", "finalizing", "completed")
# Fast batches: a few lines each, a turnaround well under a second even on a slow machine.
TURNAROUND_S = 0.05
WAIT_LIMIT_S = 60.0


def line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    """One batch input line asking the fake model about ``text``."""
    request = {"model": "fake-model", "messages": [{"role": "user", "content": text}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": request}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in lines)


class Api:
    """The batch routes of one server, through one aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, server: FakeOpenAIServer) -> None:
        self.session = session
        self.server = server
        self.root = f"http://127.0.0.1:{server.port}"

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.session.request(method, self.root + path, **kwargs) as response:
            raw = await response.read()
            if response.content_type == "application/json":
                return response.status, json.loads(raw)
            return response.status, raw

    async def upload(
        self, content: bytes | list[Any], *, filename: str = "batch.jsonl", purpose: str = "batch"
    ) -> tuple[int, dict[str, Any]]:
        form = aiohttp.FormData()
        form.add_field("purpose", purpose)
        data = content if isinstance(content, bytes) else jsonl(content)
        form.add_field("file", data, filename=filename, content_type="application/jsonl")
        return await self.call("POST", "/v1/files", data=form)

    async def file_id(self, lines: list[Any]) -> str:
        status, file = await self.upload(lines)
        assert status == 200, file
        file_id = file["id"]
        assert isinstance(file_id, str)
        return file_id

    async def create(self, file_id: str, **overrides: Any) -> tuple[int, dict[str, Any]]:
        body = {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h"}
        return await self.call("POST", "/v1/batches", json={**body, **overrides})

    async def submit(self, lines: list[Any], **overrides: Any) -> dict[str, Any]:
        status, batch = await self.create(await self.file_id(lines), **overrides)
        assert status == 200, batch
        return batch

    async def batch(self, batch_id: str) -> dict[str, Any]:
        status, batch = await self.call("GET", f"/v1/batches/{batch_id}")
        assert status == 200, batch
        return batch

    async def wait(
        self, batch_id: str, until: tuple[str, ...] = ENDED, seen: list[str] | None = None
    ) -> dict[str, Any]:
        """The batch once its status is one of ``until``; ``seen`` collects each status the
        polls met, in order."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while True:
            batch = await self.batch(batch_id)
            if seen is not None and (not seen or seen[-1] != batch["status"]):
                seen.append(batch["status"])
            if batch["status"] in until:
                return batch
            assert time.monotonic() < deadline, f"batch still {batch['status']}: {batch}"
            await asyncio.sleep(0.01)

    async def lines_of(self, file_id: str | None) -> dict[str, dict[str, Any]]:
        """An output or error file's lines by custom_id (none for a missing file)."""
        if file_id is None:
            return {}
        status, raw = await self.call("GET", f"/v1/files/{file_id}/content")
        assert status == 200, raw
        records = [json.loads(text) for text in raw.decode().splitlines()]
        return {record["custom_id"]: record for record in records}

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        status, reply = await self.call("POST", ENDPOINT, json=body)
        assert status == 200, reply
        return reply


@pytest.fixture
def batch_server(server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The session server with fast batches; settings and batches are put back afterwards."""
    server.configure(batch_turnaround_s=TURNAROUND_S)
    yield server
    server.configure(**BATCH_CONFIG_DEFAULTS)
    server.reset()  # opens the gates and stops the batches a failed test left running


@pytest.fixture
async def api(batch_server: FakeOpenAIServer) -> AsyncIterator[Api]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        yield Api(session, batch_server)


def in_lifecycle_order(seen: list[str]) -> bool:
    return [LIFECYCLE.index(status) for status in seen] == sorted(map(LIFECYCLE.index, seen))


# -- the happy path -----------------------------------------------------------------------------


async def test_a_batch_answers_each_line_as_the_online_endpoint_does(api: Api) -> None:
    bodies = {
        "plain": line("plain", "hello there")["body"],
        "system": {
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "What is 2+2?"},
            ],
        },
        "reply": line("reply", "anything [[reply:fixed text]]")["body"],
        "sample": line("sample", "pick one [[sample:1000]]", seed=41)["body"],
        "schema": line(
            "schema",
            "structured",
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
                },
            },
        )["body"],
        "short": line("short", "a reply too long for two tokens", max_tokens=2)["body"],
    }
    lines = [
        {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": body}
        for cid, body in bodies.items()
    ]
    created = await api.submit(lines, metadata={"run": "r1"})

    assert created["object"] == "batch"
    assert created["id"].startswith("batch_")
    assert created["status"] == "validating"
    assert created["endpoint"] == ENDPOINT
    assert created["completion_window"] == "24h"
    assert created["metadata"] == {"run": "r1"}
    assert created["output_file_id"] is None and created["errors"] is None
    assert created["expires_at"] == created["created_at"] + 24 * 3600

    seen: list[str] = []
    done = await api.wait(created["id"], seen=seen)
    assert done["status"] == "completed", done
    assert in_lifecycle_order(seen), seen
    assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert done[stamp] >= done["created_at"]
    assert done["error_file_id"] is None  # no error file without an error
    outputs = await api.lines_of(done["output_file_id"])
    assert set(outputs) == set(bodies)

    for custom_id, body in bodies.items():
        record = outputs[custom_id]
        assert record["id"].startswith("batch_req_")
        assert record["error"] is None
        assert record["response"]["status_code"] == 200
        assert record["response"]["request_id"]
        batch_reply = record["response"]["body"]
        online = await api.chat(body)
        assert batch_reply["object"] == "chat.completion"
        assert batch_reply["choices"] == online["choices"], custom_id
        assert batch_reply["usage"] == online["usage"], custom_id
        assert batch_reply["model"] == online["model"]
    assert outputs["short"]["response"]["body"]["choices"][0]["finish_reason"] == "length"

    status, output_file = await api.call("GET", f"/v1/files/{done['output_file_id']}")
    assert status == 200
    assert output_file["purpose"] == "batch_output"
    assert output_file["object"] == "file"
    # Batch lines are kept apart from the online statistics.
    stats = api.server.stats()
    assert stats["requests_total"] == len(bodies)  # the online calls above, and only those
    assert stats["batch_lines_answered"] == len(bodies)


async def test_http_errors_go_to_the_error_file_with_their_status(api: Api) -> None:
    lines = [
        line("ok", "fine"),
        line("boom", "fail [[status:500]]"),
        line("limited", "slow down [[status:429]]"),
        {"custom_id": "bad", "method": "POST", "url": ENDPOINT, "body": {"model": "fake-model"}},
    ]
    batch = await api.wait((await api.submit(lines))["id"])

    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert set(await api.lines_of(batch["output_file_id"])) == {"ok"}
    errors = await api.lines_of(batch["error_file_id"])
    statuses = {cid: record["response"]["status_code"] for cid, record in errors.items()}
    assert statuses == {"boom": 500, "limited": 429, "bad": 400}
    for record in errors.values():
        assert record["error"] is None
        assert set(record["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert "messages" in errors["bad"]["response"]["body"]["error"]["message"]


# -- validation ---------------------------------------------------------------------------------

GOOD = json.dumps(line("a", "x")).encode()


@pytest.mark.parametrize(
    ("content", "code", "where"),
    [
        (GOOD + b"\n{not json\n", "invalid_json_line", "Line 2:"),
        (GOOD + b"\n" + GOOD + b"\n", "duplicate_custom_id", "Line 2:"),
        (
            jsonl([line("a", "x"), {**line("b", "y"), "url": "/v1/embeddings"}]),
            "url_mismatch",
            "Line 2:",
        ),
        (jsonl([{**line("a", "x"), "method": "GET"}]), "invalid_value", "Line 1:"),
        (
            jsonl([{"custom_id": "a", "method": "POST", "url": ENDPOINT}]),
            "missing_required_parameter",
            "Line 1:",
        ),
        (jsonl([line("a", "x"), line("b", "y", model="other-model")]), "model_mismatch", "Line 2:"),
        (b"", "empty_file", ""),
    ],
    ids=["not-json", "duplicate", "url", "method", "no-body", "two-models", "empty"],
)
async def test_a_bad_input_line_is_refused_at_upload_naming_the_line(
    api: Api, content: bytes, code: str, where: str
) -> None:
    status, reply = await api.upload(content)

    assert status == 400
    error = reply["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(where)
    assert api.server.batches()["files_uploaded"] == 0


async def test_the_request_and_byte_limits_are_configurable(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    batch_server.configure(batch_max_requests=3, batch_max_bytes=4096)
    four = [line(f"r{i}", "x") for i in range(4)]

    status, reply = await api.upload(four)
    assert status == 400
    assert reply["error"]["code"] == "too_many_tasks"
    assert reply["error"]["message"].startswith("Line 4:")
    assert (await api.upload(four[:3]))[0] == 200

    status, reply = await api.upload([line("big", "y" * 5000)])
    assert status == 400
    assert reply["error"]["param"] == "file"
    assert "4096" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("filename", "purpose", "param"),
    [("batch.txt", "batch", "file"), ("batch.jsonl", "fine-tune", "purpose")],
)
async def test_an_upload_must_be_a_jsonl_batch_file(
    api: Api, filename: str, purpose: str, param: str
) -> None:
    status, reply = await api.upload([line("a", "x")], filename=filename, purpose=purpose)

    assert status == 400
    assert reply["error"]["param"] == param


async def test_with_validation_deferred_a_bad_file_fails_its_batch_as_openai_does(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    batch_server.configure(batch_validate_on_upload=False)
    content = GOOD + b"\n" + GOOD + b"\n{not json\n" + json.dumps(line("c", "z")).encode()
    status, file = await api.upload(content)
    assert status == 200  # accepted as it is: the batch reports the problems

    batch = await api.wait((await api.create(file["id"]))[1]["id"])

    assert batch["status"] == "failed"
    assert batch["failed_at"] is not None
    assert batch["output_file_id"] is None and batch["error_file_id"] is None
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    errors = batch["errors"]
    assert errors["object"] == "list"
    assert [(e["code"], e["line"]) for e in errors["data"]] == [
        ("duplicate_custom_id", 2),
        ("invalid_json_line", 3),
    ]


async def test_creating_a_batch_checks_its_arguments(api: Api) -> None:
    file_id = await api.file_id([line("a", "x")])

    status, reply = await api.create("file-missing")
    assert (status, reply["error"]["param"]) == (404, "input_file_id")
    for field, value in [
        ("endpoint", "/v1/embeddings"),
        ("completion_window", "1h"),
        ("metadata", {"k": 1}),
    ]:
        status, reply = await api.create(file_id, **{field: value})
        assert (status, reply["error"]["param"]) == (400, field), reply
    status, reply = await api.call("POST", "/v1/batches", json={"endpoint": ENDPOINT})
    assert (status, reply["error"]["param"]) == (400, "input_file_id")

    done = await api.wait((await api.submit([line("b", "y")]))["id"])
    status, reply = await api.create(done["output_file_id"])  # an output file is no input
    assert (status, reply["error"]["param"]) == (400, "input_file_id")
    assert api.server.batches()["batches_created"] == 1


def test_batch_settings_are_checked(batch_server: FakeOpenAIServer) -> None:
    for bad in (
        {"batch_turnaround_s": -1},
        {"batch_max_requests": 0},
        {"batch_item_fail_rate": 1.5},
        {"batch_expire": "yes"},
        {"batch_gate": " "},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            batch_server.configure(**bad)
    assert batch_server.configure()["batch_turnaround_s"] == TURNAROUND_S


# -- faults -------------------------------------------------------------------------------------


async def test_item_failures_land_in_the_error_file_drawn_from_the_seed(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    batch_server.configure(batch_item_fail_rate=0.5)
    lines = [line(f"r{i}", f"question {i}") for i in range(20)]

    async def failed_ids() -> set[str]:
        batch = await api.wait((await api.submit(lines))["id"])
        assert batch["status"] == "completed"
        errors = await api.lines_of(batch["error_file_id"])
        outputs = await api.lines_of(batch["output_file_id"])
        assert set(errors) | set(outputs) == {item["custom_id"] for item in lines}
        assert batch["request_counts"] == {
            "total": 20,
            "completed": len(outputs),
            "failed": len(errors),
        }
        for record in errors.values():
            assert record["response"] is None
            assert record["error"]["code"] == "server_error"
        return set(errors)

    first = await failed_ids()
    assert 0 < len(first) < 20
    batch_server.reset()  # the same seed and the same place in creation order: the same draws
    assert await failed_ids() == first


async def test_an_expired_batch_returns_the_work_it_finished(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    batch_server.configure(batch_expire=True, batch_expire_fraction=0.5)
    lines = [line(f"r{i}", f"question {i}") for i in range(6)]

    batch = await api.wait((await api.submit(lines))["id"])

    assert batch["status"] == "expired"
    assert batch["expired_at"] is not None and batch["completed_at"] is None
    assert batch["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    outputs = await api.lines_of(batch["output_file_id"])
    assert sorted(outputs) == ["r0", "r1", "r2"]
    assert outputs["r0"]["response"]["body"]["choices"][0]["message"]["content"] == "question 0"
    errors = await api.lines_of(batch["error_file_id"])
    assert sorted(errors) == ["r3", "r4", "r5"]
    assert {record["error"]["code"] for record in errors.values()} == {"batch_expired"}
    assert all(record["response"] is None for record in errors.values())


async def test_a_batch_can_fail_validation(api: Api, batch_server: FakeOpenAIServer) -> None:
    batch_server.configure(batch_fail_validation=True)

    batch = await api.wait((await api.submit([line("a", "x")]))["id"])

    assert batch["status"] == "failed"
    assert batch["in_progress_at"] is None
    assert [error["code"] for error in batch["errors"]["data"]] == ["token_limit_exceeded"]
    assert batch["output_file_id"] is None and batch["error_file_id"] is None
    assert api.server.batches()["batch_lines_answered"] == 0


# -- holding and cancelling ---------------------------------------------------------------------


async def test_cancelling_keeps_the_finished_lines_and_drops_the_rest(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    lines = [
        line("a", "first"),
        line("b", "second"),
        line("c", "third [[gate:held]]"),
        line("d", "x"),
    ]
    batch_id = (await api.submit(lines))["id"]
    await asyncio.to_thread(batch_server.wait_parked, "held", 1)
    held = await api.batch(batch_id)
    assert held["status"] == "in_progress"
    assert held["request_counts"] == {"total": 4, "completed": 2, "failed": 0}

    status, cancelling = await api.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200
    assert cancelling["status"] == "cancelling"
    assert cancelling["cancelling_at"] is not None
    batch = await api.wait(batch_id)

    assert batch["status"] == "cancelled"
    assert batch["cancelled_at"] is not None
    assert batch_server.parked("held") == 0  # the batch left the gate
    assert sorted(await api.lines_of(batch["output_file_id"])) == ["a", "b"]
    errors = await api.lines_of(batch["error_file_id"])
    assert sorted(errors) == ["c", "d"]
    assert {record["error"]["code"] for record in errors.values()} == {"batch_cancelled"}
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    status, again = await api.call("POST", f"/v1/batches/{batch_id}/cancel")
    assert (status, again["status"]) == (200, "cancelled")

    finished = await api.wait((await api.submit([line("e", "y")]))["id"])
    status, reply = await api.call("POST", f"/v1/batches/{finished['id']}/cancel")
    assert status == 409
    assert "completed" in reply["error"]["message"]


async def test_a_gate_holds_batches_in_progress_while_their_client_goes_away(
    batch_server: FakeOpenAIServer,
) -> None:
    batch_server.configure(batch_gate="batches")
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:  # the client that goes away
        first = Api(session, batch_server)
        ids = [(await first.submit([line(f"{n}-{i}", "x") for i in range(3)]))["id"] for n in "ab"]
        await asyncio.to_thread(batch_server.wait_parked, "batches", 2)

    async with aiohttp.ClientSession(headers=headers) as session:  # the client that resumes
        api = Api(session, batch_server)
        for batch_id in ids:
            held = await api.batch(batch_id)
            assert held["status"] == "in_progress"
            assert held["request_counts"]["completed"] == 0
        assert batch_server.batches()["batch_lines_answered"] == 0
        batch_server.open_gate("batches")
        for batch_id in ids:
            assert (await api.wait(batch_id))["status"] == "completed"
    assert batch_server.submitted_twice() == {}
    assert batch_server.batches()["batch_lines_answered"] == 6


# -- listing, statistics, files, auth -----------------------------------------------------------


async def test_batches_are_listed_newest_first_a_page_at_a_time(api: Api) -> None:
    file_id = await api.file_id([line("a", "x")])
    ids = [(await api.create(file_id))[1]["id"] for _ in range(5)]
    newest_first = ids[::-1]

    pages: list[list[str]] = []
    after: str | None = None
    while True:
        query = {"limit": "2"} if after is None else {"limit": "2", "after": after}
        status, page = await api.call("GET", "/v1/batches", params=query)
        assert status == 200
        assert page["object"] == "list"
        pages.append([batch["id"] for batch in page["data"]])
        assert (page["first_id"], page["last_id"]) == (pages[-1][0], pages[-1][-1])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == [newest_first[:2], newest_first[2:4], newest_first[4:]]

    status, everything = await api.call("GET", "/v1/batches")
    assert [batch["id"] for batch in everything["data"]] == newest_first
    for query in ({"limit": "0"}, {"limit": "101"}, {"after": "batch_unknown"}):
        status, reply = await api.call("GET", "/v1/batches", params=query)
        assert status == 400, (query, reply)


async def test_statistics_count_every_custom_id_submitted(
    api: Api, batch_server: FakeOpenAIServer
) -> None:
    first = await api.submit([line("shared", "x"), line("one", "y")], metadata={"step": "1"})
    second_file = await api.file_id([line("shared", "x"), line("two", "z")])
    second = (await api.create(second_file))[1]
    for batch in (first, second):
        await api.wait(batch["id"])

    stats = batch_server.batches()
    assert stats["batches_created"] == 2
    assert stats["files_uploaded"] == 2  # output files are not uploads
    assert stats["batch_requests_total"] == 4
    assert stats["batch_lines_answered"] == 4
    assert stats["custom_ids"] == {"shared": 2, "one": 1, "two": 1}
    assert batch_server.submitted_twice() == {"shared": 2}
    records = stats["batches"]
    assert [(r["id"], r["seq"], r["status"], r["requests"]) for r in records] == [
        (first["id"], 1, "completed", 2),
        (second["id"], 2, "completed", 2),
    ]
    assert records[0]["metadata"] == {"step": "1"}
    status, input_file = await api.call("GET", f"/v1/files/{second_file}")
    assert records[1]["input_bytes"] == input_file["bytes"]
    assert stats["api_calls"]["POST /v1/batches"] == 2

    batch_server.reset()
    cleared = batch_server.batches()
    assert (cleared["batches_created"], cleared["custom_ids"], cleared["batches"]) == (0, {}, [])
    status, _ = await api.call("GET", f"/v1/batches/{first['id']}")
    assert status == 404  # a reset forgets the batches and files themselves


async def test_files_can_be_read_back_and_deleted(api: Api) -> None:
    content = jsonl([line("a", "x"), line("b", "y")])
    status, file = await api.upload(content, filename="calls.jsonl")
    assert status == 200
    assert file["id"].startswith("file-")
    assert (file["object"], file["purpose"], file["filename"]) == ("file", "batch", "calls.jsonl")
    assert file["bytes"] == len(content)

    assert await api.call("GET", f"/v1/files/{file['id']}") == (200, file)
    assert await api.call("GET", f"/v1/files/{file['id']}/content") == (200, content)
    status, deleted = await api.call("DELETE", f"/v1/files/{file['id']}")
    assert (status, deleted) == (200, {"id": file["id"], "object": "file", "deleted": True})
    for method, path in [
        ("GET", f"/v1/files/{file['id']}"),
        ("GET", f"/v1/files/{file['id']}/content"),
        ("DELETE", f"/v1/files/{file['id']}"),
    ]:
        status, reply = await api.call(method, path)
        assert status == 404
        assert reply["error"]["code"] is None


async def test_every_batch_route_wants_the_key(api: Api) -> None:
    batch = await api.submit([line("a", "x")])
    file_id = batch["input_file_id"]
    routes = [
        ("POST", "/v1/files"),
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches"),
        ("GET", f"/v1/batches/{batch['id']}"),
        ("POST", f"/v1/batches/{batch['id']}/cancel"),
    ]
    async with aiohttp.ClientSession() as anonymous:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            for method, path in routes:
                async with anonymous.request(method, api.root + path, headers=headers) as reply:
                    assert reply.status == 401, (method, path, headers)
                    assert (await reply.json())["error"]["type"] == "invalid_request_error"
    # Nothing was changed by the refused calls.
    assert (await api.wait(batch["id"]))["status"] == "completed"
    assert (await api.call("GET", f"/v1/files/{file_id}"))[0] == 200


async def test_a_placeholder_in_a_batch_line_is_reported(api: Api) -> None:
    status, _ = await api.upload([line("a", "the answer is \ue000x\ue001")])
    assert status == 200

    hits = take_placeholder_requests()  # taken here, so the suite's guard does not fail us

    assert [(hit["endpoint"], hit["model"]) for hit in hits] == [("/v1/files", "fake-model")]
    assert hits[0]["where"] == "$.body.messages[0].content"
