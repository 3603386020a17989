"""The fake Anthropic server's Message Batches and prompt-cache accounting, over real HTTP.

Most calls go through the official SDK pointed at the fake, so the shapes are the ones the SDK
parses; a few go raw, to see status codes and bodies the SDK would turn into exceptions.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from plait.testing import FakeAnthropicServer
from plait.testing.fake_openai import estimate_tokens

KEY = "sk-ant-test-batches-4c1d"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Long enough to be cached at the default minimum of 1,024 tokens (4 characters a token).
LONG = "The rules of the house, repeated at length. " * 100  # 4,400 characters
assert estimate_tokens(len(LONG)) >= 1024


#: A developer's own Anthropic settings and proxies kept out of the SDK's way.
pytestmark = pytest.mark.usefixtures("anthropic_environment")


@pytest.fixture(scope="module")
def server_process() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(api_key=KEY) as server:
        yield server
    assert server.returncode == 0


@pytest.fixture()
def server(server_process: FakeAnthropicServer) -> FakeAnthropicServer:
    server_process.reset()
    server_process.configure(batch_turnaround_s=0.0)
    return server_process


@pytest.fixture()
def client(server: FakeAnthropicServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def params(text: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": "claude-test",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        **fields,
    }


def call(
    server: FakeAnthropicServer, method: str, path: str, body: Any = None, *, key: str = KEY
) -> tuple[int, Any]:
    """One request without the SDK: the status and the parsed body (text when not JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{server.base_url}{path}",
        data=data,
        method=method,
        headers={
            "content-type": "application/json",
            "x-api-key": key,
            "anthropic-version": "2023-06-01",
        },
    )
    try:
        with OPENER.open(request, timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        with err:
            status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def submit(client: anthropic.Anthropic, items: dict[str, dict[str, Any]]) -> MessageBatch:
    """Create a batch of these params, each under its custom_id."""
    requests: Any = [{"custom_id": cid, "params": body} for cid, body in items.items()]
    return client.messages.batches.create(requests=requests)


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60.0) -> Any:
    """Poll until the batch has ended; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(0.005)


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    return {line.custom_id: line.result for line in client.messages.batches.results(batch_id)}


def comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A reply without what differs between two answers to the same request."""
    content = [{k: v for k, v in block.items() if k != "id"} for block in message["content"]]
    usage = {k: v for k, v in message["usage"].items() if k != "service_tier"}
    return {**message, "id": None, "content": content, "usage": usage}


# -- batches ------------------------------------------------------------------------------------


def test_batch_results_equal_the_online_replies(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    requests = {
        "plain": params("hello there"),
        "system": params("second", system="Be terse."),
        "cut": params("a longer question", max_tokens=2),
        "tool": params(
            "rate it",
            tools=[{"name": "Rate", "input_schema": schema}],
            tool_choice={"type": "tool", "name": "Rate"},
        ),
    }
    server.close_batch_gate()
    created = submit(client, requests)
    assert created.id.startswith("msgbatch_")
    assert created.type == "message_batch"
    assert created.processing_status == "in_progress"
    assert created.request_counts.processing == 4
    assert created.results_url is None and created.ended_at is None
    assert created.expires_at - created.created_at == timedelta(hours=24)

    server.open_batch_gate()
    ended = wait_ended(client, created.id)
    assert ended.request_counts.model_dump() == {
        "processing": 0,
        "succeeded": 4,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    assert ended.results_url == f"{server.base_url}/v1/messages/batches/{created.id}/results"
    assert ended.ended_at is not None and ended.ended_at >= ended.created_at

    got = results(client, created.id)
    assert set(got) == set(requests)
    for custom_id, body in requests.items():
        result = got[custom_id]
        assert result.type == "succeeded"
        assert result.message.usage.service_tier == "batch"
        online = client.messages.create(**body)
        assert online.usage.service_tier == "standard"
        assert comparable(result.message.model_dump()) == comparable(online.model_dump())
    assert got["system"].message.content[0].text == "[Be terse.] second"
    assert got["cut"].message.stop_reason == "max_tokens"
    assert got["tool"].message.content[0].input == {"n": 0}

    # Batched requests are not online requests.
    assert server.stats()["requests_total"] == len(requests)


def test_results_file_is_jsonl_in_the_configured_order(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    server.configure(batch_results_order="reversed")
    ids = ["a", "b", "c"]
    batch = submit(client, {cid: params(cid) for cid in ids})
    wait_ended(client, batch.id)

    status, text = call(server, "GET", f"/v1/messages/batches/{batch.id}/results")
    assert status == 200
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["custom_id"] for line in lines] == ids[::-1]
    assert [line["result"]["message"]["content"][0]["text"] for line in lines] == ids[::-1]


def test_status_directive_and_fail_rate_give_errored_results(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    batch = submit(
        client,
        {
            "ok": params("fine"),
            "busy": params("x [[status:429]]"),
            "broken": params("x [[status:500]]"),
        },
    )
    ended = wait_ended(client, batch.id)
    assert (ended.request_counts.succeeded, ended.request_counts.errored) == (1, 2)
    got = results(client, batch.id)
    assert got["ok"].type == "succeeded"
    busy, broken = got["busy"], got["broken"]
    assert busy.type == "errored" and busy.error.type == "error"
    assert busy.error.error.type == "rate_limit_error"
    assert broken.error.error.type == "api_error"
    assert broken.error.error.message == "Injected failure with HTTP status 500."

    def failed_ids(seed: int) -> set[str]:
        server.reset()
        server.configure(batch_turnaround_s=0.0, batch_item_fail_rate=0.5, seed=seed)
        batch = submit(client, {f"r{i}": params(f"q{i}") for i in range(20)})
        wait_ended(client, batch.id)
        got = results(client, batch.id)
        failed = {cid for cid, result in got.items() if result.type == "errored"}
        for cid in failed:
            assert got[cid].error.error.type == "api_error"
        return failed

    first = failed_ids(7)
    assert 0 < len(first) < 20
    assert failed_ids(7) == first  # the same seed fails the same requests


def test_expired_batches_end_with_their_last_requests_expired(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    server.configure(batch_expire=True, batch_expire_fraction=0.5)
    batch = submit(client, {f"r{i}": params(f"q{i}") for i in range(3)})
    ended = wait_ended(client, batch.id)

    assert (ended.request_counts.succeeded, ended.request_counts.expired) == (1, 2)
    assert {cid: r.type for cid, r in results(client, batch.id).items()} == {
        "r0": "succeeded",
        "r1": "expired",
        "r2": "expired",
    }


def test_gate_holds_a_batch_and_cancel_ends_it_canceled(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    server.close_batch_gate()
    batch = submit(client, {"a": params("a"), "b": params("b")})
    # The client that created it goes away; another one finds it still processing.
    client.close()
    with anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as other:
        held = other.messages.batches.retrieve(batch.id)
        assert held.processing_status == "in_progress"
        assert held.request_counts.processing == 2
        with pytest.raises(anthropic.AnthropicError, match="Has it finished processing"):
            other.messages.batches.results(batch.id)
        status, error = call(server, "GET", f"/v1/messages/batches/{batch.id}/results")
        assert status == 400
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.BadRequestError, match="still processing"):
            other.messages.batches.delete(batch.id)

        canceling = other.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling"
        assert canceling.cancel_initiated_at is not None
        assert other.messages.batches.retrieve(batch.id).processing_status == "canceling"
        assert server.batches()["status_counts"] == {"canceling": 1}

        server.open_batch_gate()
        ended = wait_ended(other, batch.id)
        assert ended.request_counts.canceled == 2
        assert {r.type for r in results(other, batch.id).values()} == {"canceled"}
        with pytest.raises(anthropic.BadRequestError, match="already ended"):
            other.messages.batches.cancel(batch.id)

        deleted = other.messages.batches.delete(batch.id)
        assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
        with pytest.raises(anthropic.NotFoundError):
            other.messages.batches.retrieve(batch.id)
        assert list(other.messages.batches.list()) == []
    assert server.batches()["batches"][batch.id]["deleted"] is True


def test_list_pages_newest_first(server: FakeAnthropicServer, client: anthropic.Anthropic) -> None:
    ids = [submit(client, {"only": params(f"batch {i}")}).id for i in range(5)]
    newest_first = ids[::-1]

    status, page = call(server, "GET", "/v1/messages/batches?limit=2")
    assert status == 200
    assert [b["id"] for b in page["data"]] == newest_first[:2]
    assert (page["has_more"], page["first_id"], page["last_id"]) == (True, ids[4], ids[3])
    _, page = call(server, "GET", f"/v1/messages/batches?limit=2&after_id={ids[1]}")
    assert [b["id"] for b in page["data"]] == [ids[0]]
    assert page["has_more"] is False
    _, page = call(server, "GET", f"/v1/messages/batches?limit=2&before_id={ids[1]}")
    assert [b["id"] for b in page["data"]] == [ids[3], ids[2]]
    assert page["has_more"] is True

    # The SDK's own paging walks all of them, in the same order.
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    assert call(server, "GET", "/v1/messages/batches?limit=0")[0] == 400
    assert call(server, "GET", "/v1/messages/batches?after_id=msgbatch_nope")[0] == 400
    assert server.batches()["calls"]["create"] == 5


def test_stats_count_every_custom_id_and_batch(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    client.messages.create(**params("online"))
    first = {"requests": [{"custom_id": c, "params": params(c)} for c in ("a", "b")]}
    status, one = call(server, "POST", "/v1/messages/batches", first)
    assert status == 200
    two = submit(client, {c: params(c) for c in ("b", "c")}).id
    call(server, "POST", "/v1/messages/batches", {"requests": []})  # refused: not counted

    stats = server.batches()
    assert stats["custom_ids"] == {"a": 1, "b": 2, "c": 1}
    assert stats["order"] == [one["id"], two]
    assert stats["batches_total"] == 2 and stats["requests_total"] == 4
    assert stats["rejected"] == 1
    assert stats["batches"][one["id"]]["bytes"] == len(json.dumps(first).encode())
    assert stats["bytes_total"] == sum(b["bytes"] for b in stats["batches"].values())
    assert stats["batches"][two]["order"] == 2
    assert stats["batches"][two]["custom_ids"] == ["b", "c"]
    # Online requests are counted on their own.
    assert server.stats()["requests_total"] == 1

    server.reset()
    assert server.batches()["batches_total"] == 0
    assert server.batches()["custom_ids"] == {}
    assert call(server, "GET", f"/v1/messages/batches/{two}")[0] == 404


@pytest.mark.parametrize(
    ("requests", "status", "kind", "message"),
    [
        ([], 400, "invalid_request_error", "requests: List should have at least 1 item"),
        (
            [{"custom_id": "same", "params": params("a")}] * 2,
            400,
            "invalid_request_error",
            "requests.1.custom_id: 'same' is used by more than one request",
        ),
        (
            [{"custom_id": "has space", "params": params("a")}],
            400,
            "invalid_request_error",
            "requests.0.custom_id: String should match pattern",
        ),
        (
            [{"custom_id": "x" * 65, "params": params("a")}],
            400,
            "invalid_request_error",
            "requests.0.custom_id",
        ),
        (
            [{"custom_id": "ok", "params": params("a")}, {"custom_id": "no", "params": {}}],
            400,
            "invalid_request_error",
            "requests.1.params.model: Field required",
        ),
        (
            [{"custom_id": "s", "params": params("a", stream=True)}],
            400,
            "invalid_request_error",
            "requests.0.params.stream: streaming is not supported in Message Batches",
        ),
        (
            [{"custom_id": "z", "params": params("a", max_tokens=0)}],
            400,
            "invalid_request_error",
            "requests.0.params.max_tokens",
        ),
        (
            [{"custom_id": f"r{i}", "params": params("a")} for i in range(4)],
            400,
            "invalid_request_error",
            "at most 3 requests, got 4",
        ),
        (
            [{"custom_id": "big", "params": params("a" * 2000)}],
            413,
            "request_too_large",
            "the limit is 1000 bytes",
        ),
    ],
)
def test_invalid_batches_are_refused_whole(
    server: FakeAnthropicServer, requests: list[Any], status: int, kind: str, message: str
) -> None:
    server.configure(batch_max_requests=3, batch_max_bytes=1000)
    got = call(server, "POST", "/v1/messages/batches", {"requests": requests})

    assert got[0] == status
    assert got[1]["type"] == "error"
    assert got[1]["error"]["type"] == kind
    assert message in got[1]["error"]["message"]
    stats = server.batches()
    assert (stats["batches_total"], stats["rejected"], stats["custom_ids"]) == (0, 1, {})


def test_batches_need_the_key(server: FakeAnthropicServer) -> None:
    body = {"requests": [{"custom_id": "a", "params": params("a")}]}
    status, error = call(server, "POST", "/v1/messages/batches", body, key="wrong")
    assert (status, error["error"]["type"]) == (401, "authentication_error")
    assert call(server, "GET", "/v1/messages/batches", key="wrong")[0] == 401
    assert call(server, "GET", "/v1/messages/batches/msgbatch_nope")[0] == 404


def test_params_can_fail_as_results_instead(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    server.configure(batch_params_validation="results")
    status, batch = call(
        server,
        "POST",
        "/v1/messages/batches",
        {
            "requests": [
                {"custom_id": "good", "params": params("fine")},
                {"custom_id": "bad", "params": {"model": "claude-test", "messages": []}},
            ]
        },
    )
    assert status == 200
    got = results(client, wait_ended(client, batch["id"]).id)
    assert got["good"].type == "succeeded"
    assert got["bad"].type == "errored"
    assert got["bad"].error.error.type == "invalid_request_error"
    assert "max_tokens: Field required" in got["bad"].error.error.message


def test_config_is_checked_and_reset(server: FakeAnthropicServer) -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        server._call("POST", "/_config", {"no_such_setting": 1})
    with pytest.raises(ValueError, match="between 0 and 1"):
        server.configure(batch_item_fail_rate=1.5)
    with pytest.raises(ValueError, match="one of submitted, reversed, shuffled"):
        server.configure(batch_results_order="sideways")  # type: ignore[arg-type]
    assert server.configure(cache_min_tokens=10)["cache_min_tokens"] == 10
    server.reset()
    config = server.config()
    assert config["cache_min_tokens"] == 1024
    assert config["batch_turnaround_s"] == 0.2
    assert config["batch_gate_open"] is True


# -- prompt caching -----------------------------------------------------------------------------


def cached_system(text: str = LONG, **control: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", **control}}]


def usage_of(client: anthropic.Anthropic, body: dict[str, Any]) -> dict[str, Any]:
    usage: dict[str, Any] = client.messages.create(**body).usage.model_dump()
    return usage


def test_a_cached_prefix_is_written_then_read(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    prefix = estimate_tokens(len(LONG))
    first = usage_of(client, params("q1", system=cached_system()))
    second = usage_of(client, params("another question", system=cached_system()))

    total = estimate_tokens(len(LONG) + 2)
    assert first["cache_creation_input_tokens"] == prefix
    assert first["cache_read_input_tokens"] == 0
    assert first["input_tokens"] == total - prefix
    assert first["cache_creation"] == {
        "ephemeral_5m_input_tokens": prefix,
        "ephemeral_1h_input_tokens": 0,
    }
    assert second["cache_read_input_tokens"] == prefix
    assert second["cache_creation_input_tokens"] == 0
    assert second["input_tokens"] == estimate_tokens(len(LONG) + 16) - prefix

    stats = server.stats()
    assert [r["cache"] for r in stats["requests"]] == [
        {"read": 0, "write": prefix},
        {"read": prefix, "write": 0},
    ]
    assert stats["cache"] == {"read_tokens": prefix, "write_tokens": prefix, "entries": 1}


def test_short_or_unmarked_prefixes_are_not_cached(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    short = cached_system("Be terse.")
    for _ in range(2):
        usage = usage_of(client, params("q", system=short))
        assert (usage["cache_creation_input_tokens"], usage["cache_read_input_tokens"]) == (0, 0)
        assert usage["input_tokens"] == estimate_tokens(len("Be terse.q"))
        unmarked = usage_of(client, params("q", system=LONG))
        assert unmarked["cache_creation_input_tokens"] == 0
        assert unmarked["cache_read_input_tokens"] == 0

    server.configure(cache_min_tokens=1)
    assert usage_of(client, params("q", system=short))["cache_creation_input_tokens"] == 3


def test_a_different_prefix_misses(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    usage_of(client, params("q", system=cached_system()))
    other_text = usage_of(client, params("q", system=cached_system(LONG + "!")))
    other_model = usage_of(client, params("q", model="claude-other", system=cached_system()))

    for usage in (other_text, other_model):
        assert usage["cache_read_input_tokens"] == 0
        assert usage["cache_creation_input_tokens"] > 0
    # The ttl is no part of the key: the same prefix marked "1h" reads the "5m" entry.
    same = usage_of(client, params("q", system=cached_system(ttl="1h")))
    assert same["cache_read_input_tokens"] == estimate_tokens(len(LONG))


def test_ttls_expire_on_the_cache_clock(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    hour = params("q", system=cached_system(ttl="1h"))
    five = params("q", system=cached_system(LONG + " 5m"))
    prefix = estimate_tokens(len(LONG))
    assert usage_of(client, hour)["cache_creation"]["ephemeral_1h_input_tokens"] == prefix
    usage_of(client, five)

    server.advance_cache_clock(301)
    assert usage_of(client, hour)["cache_read_input_tokens"] == prefix
    assert usage_of(client, five)["cache_read_input_tokens"] == 0  # expired: written anew
    server.advance_cache_clock(3601)
    assert usage_of(client, hour)["cache_read_input_tokens"] == 0
    server.reset()
    assert usage_of(client, hour)["cache_read_input_tokens"] == 0


def test_breakpoints_in_tools_system_and_messages(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    plain_tool = {
        "name": "lookup",
        "description": LONG,
        "input_schema": {"type": "object", "properties": {}},
    }
    tool = {**plain_tool, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    # A tool counts for the characters of its compact JSON, its cache_control left out.
    tool_chars = len(json.dumps(plain_tool, sort_keys=True, separators=(",", ":")))
    turn = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    body = params("unused", tools=[tool], system="Be terse.")
    body["messages"] = [{"role": "user", "content": turn}]

    first = usage_of(client, body)
    # Tools come first: their prefix is the 1h entry, the rest up to the turn the 5m one.
    tools_only = estimate_tokens(tool_chars)
    whole = estimate_tokens(tool_chars + len("Be terse.") + len(LONG))
    assert first["cache_creation"] == {
        "ephemeral_1h_input_tokens": tools_only,
        "ephemeral_5m_input_tokens": whole - tools_only,
    }
    assert first["input_tokens"] == 0

    # Another system prompt: only the tools' prefix is still the same.
    body["system"] = "Be verbose."
    second = usage_of(client, body)
    assert second["cache_read_input_tokens"] == tools_only

    # A later turn, marked only at its end, still finds the first request's prefix among
    # the blocks checked before its breakpoint (cache_control is no part of the content).
    body.update(
        system="Be terse.",
        tools=[plain_tool],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": LONG}]},
            {"role": "assistant", "content": "noted"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}
                ],
            },
        ],
    )
    third = usage_of(client, body)
    longer = estimate_tokens(tool_chars + len("Be terse.") + len(LONG) + len("noted") + len("more"))
    assert third["cache_read_input_tokens"] == whole
    assert third["cache_creation_input_tokens"] == longer - whole
    assert third["input_tokens"] == 0


@pytest.mark.parametrize(
    ("system", "message"),
    [
        (cached_system() * 5, "A maximum of 4 blocks with cache_control may be provided. Found 5."),
        (cached_system(ttl="2h"), "system.0.cache_control.ttl: Input should be '5m' or '1h'"),
        (
            [{"type": "text", "text": "x", "cache_control": {"type": "persistent"}}],
            "system.0.cache_control.type: Input should be 'ephemeral'",
        ),
        (
            cached_system() + cached_system(ttl="1h"),
            "must not come after a ttl='5m' one",
        ),
        (
            [{"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}],
            "cache_control cannot be set for empty text blocks",
        ),
    ],
)
def test_invalid_cache_control_is_refused(
    server: FakeAnthropicServer, system: list[dict[str, Any]], message: str
) -> None:
    status, error = call(server, "POST", "/v1/messages", params("q", system=system))

    assert status == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]


def test_batched_requests_share_the_cache(
    server: FakeAnthropicServer, client: anthropic.Anthropic
) -> None:
    prefix = estimate_tokens(len(LONG))
    batch = submit(
        client,
        {
            "first": params("a", system=cached_system()),
            "second": params("b", system=cached_system()),
        },
    )
    wait_ended(client, batch.id)
    got = results(client, batch.id)
    assert got["first"].message.usage.cache_creation_input_tokens == prefix
    assert got["second"].message.usage.cache_read_input_tokens == prefix

    stats = server.stats()
    assert stats["cache"]["read_tokens"] == 0  # online requests only
    assert stats["batches"]["cache"] == {"read_tokens": prefix, "write_tokens": prefix}
    assert stats["batches"]["batches"][batch.id]["items"]["second"] == {
        "result": "succeeded",
        "cache": {"read": prefix, "write": 0},
    }
    # ... and the online route reads what a batch wrote.
    assert (
        usage_of(client, params("c", system=cached_system()))["cache_read_input_tokens"] == prefix
    )
