"""End-to-end tests of the fake OpenAI server: a real child process spoken to over real HTTP."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from typing import Any

import pytest

from plait.testing import BATCH_CONFIG_DEFAULTS, FakeOpenAIServer
from plait.testing.fake_openai import estimate_tokens, request_key, schema_instance

# Never send loopback requests through a proxy configured in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT_CONFIG: dict[str, Any] = {
    "latency_ms": 0.0,
    "jitter_ms": 0.0,
    "rate_429": 0.0,
    "rate_500": 0.0,
    "rate_drop": 0.0,
    "rate_timeout": 0.0,
    "rate_flex_unavailable": 0.0,
    "rate_stall": 0.0,
    "stall_s": 10.0,
    "retry_after_s": 1.0,
    "timeout_hang_s": 30.0,
    "seed": 0,
    "quote_key_in_401": False,
    "answer_like_demos": False,
    "rpm_limit": None,
    "tpm_limit": None,
    "limit_window_s": 60.0,
    "limit_retry_after": True,
    "reply_headers": {},
    **BATCH_CONFIG_DEFAULTS,
}


class Reply:
    def __init__(self, status: int, headers: Message[str, str], body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def content(self) -> str:
        text = self.body["choices"][0]["message"]["content"]
        assert isinstance(text, str)
        return text


def http_call(url: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return Reply(resp.status, resp.headers, json.loads(resp.read()))
    except urllib.error.HTTPError as err:
        with err:
            return Reply(err.code, err.headers, json.loads(err.read()))


def chat(
    server: FakeOpenAIServer,
    messages: list[dict[str, Any]],
    *,
    model: str = "fake-model",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Reply:
    body = {"model": model, "messages": messages, **extra}
    return http_call(f"{server.base_url}/chat/completions", body, headers)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def server(shared_server: FakeOpenAIServer) -> FakeOpenAIServer:
    """The module's server with default behaviour and empty statistics."""
    shared_server.configure(**_DEFAULT_CONFIG)
    shared_server.reset()
    return shared_server


# -- replies ----------------------------------------------------------------------------------


def test_echoes_last_user_message_without_system_prompt(server: FakeOpenAIServer) -> None:
    messages = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "hello there"},
    ]
    reply = chat(server, messages, temperature=0.3, n=3)

    assert reply.status == 200
    assert reply.content == "hello there"
    body = reply.body
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    assert body["model"] == "fake-model"
    assert body["choices"][0]["index"] == 0
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt_chars = len("first question") + len("first answer") + len("hello there")
    assert body["usage"] == {
        "prompt_tokens": estimate_tokens(prompt_chars),
        "completion_tokens": estimate_tokens(len("hello there")),
        "total_tokens": estimate_tokens(prompt_chars) + estimate_tokens(len("hello there")),
    }


def test_prefixes_system_prompt(server: FakeOpenAIServer) -> None:
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    reply = chat(server, messages)

    assert reply.status == 200
    assert reply.content == "[Be terse.] What is 2+2?"
    assert reply.body["usage"]["prompt_tokens"] == 6  # ceil(21 / 4)
    assert reply.body["usage"]["completion_tokens"] == 6  # ceil(24 / 4)


def test_answer_like_demos_copies_the_demonstration_next_to_the_input(
    server: FakeOpenAIServer,
) -> None:
    shown = [
        {"role": "system", "content": "Classify."},
        {"role": "user", "content": "charged twice"},
        {"role": "assistant", "content": "billing"},
        {"role": "user", "content": "parcel lost"},
        {"role": "assistant", "content": "shipping"},
        {"role": "user", "content": "where is my parcel"},
    ]
    assert chat(server, shown).content == "[Classify.] where is my parcel"  # off: the echo
    server.configure(answer_like_demos=True)
    assert chat(server, shown).content == "shipping"
    assert chat(server, [shown[0], shown[-1]]).content == "[Classify.] where is my parcel"
    scripted = [*shown[:-1], {"role": "user", "content": "x [[reply:own]]"}]
    assert chat(server, scripted).content == "own"  # a directive still comes first
    with pytest.raises(ValueError, match="answer_like_demos"):
        server.configure(answer_like_demos="yes")


def test_estimate_tokens_rounds_up() -> None:
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_reply_directive_sets_exact_text(server: FakeOpenAIServer) -> None:
    messages = [
        {"role": "system", "content": "ignored"},
        {"role": "user", "content": 'tell me [[reply:{"answer": [1, 2]} and more]]'},
    ]
    reply = chat(server, messages)

    assert reply.status == 200
    assert reply.content == '{"answer": [1, 2]} and more'


def test_a_directive_for_one_model_steers_only_its_requests(server: FakeOpenAIServer) -> None:
    text = "hi [[reply@cheap:from cheap]] [[status@broken:503]]"
    assert chat(server, user(text), model="cheap").content == "from cheap"
    assert chat(server, user(text), model="strong").content == "hi"
    assert chat(server, user(text), model="broken").status == 503


def test_directives_are_removed_from_the_echo(server: FakeOpenAIServer) -> None:
    reply = chat(server, user("ping [[latency_ms:1]]"))

    assert reply.status == 200
    assert reply.content == "ping"


def test_max_tokens_truncates_with_length_finish_reason(server: FakeOpenAIServer) -> None:
    reply = chat(server, user("abcdefghijklmnop"), max_tokens=2)

    assert reply.content == "abcdefgh"
    assert reply.body["choices"][0]["finish_reason"] == "length"
    assert reply.body["usage"]["completion_tokens"] == 2


def test_stream_is_rejected(server: FakeOpenAIServer) -> None:
    reply = chat(server, user("hi"), stream=True)

    assert reply.status == 400
    assert reply.body["error"]["type"] == "invalid_request_error"
    assert "stream" in reply.body["error"]["message"]


def test_models_endpoint(server: FakeOpenAIServer) -> None:
    reply = http_call(f"{server.base_url}/models")

    assert reply.status == 200
    assert reply.body == {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}


# -- errors -----------------------------------------------------------------------------------


def test_status_directive_429_has_retry_after(server: FakeOpenAIServer) -> None:
    server.configure(retry_after_s=3)
    reply = chat(server, user("slow down [[status:429]]"))

    assert reply.status == 429
    assert reply.headers["Retry-After"] == "3"
    error = reply.body["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == "rate_limit_exceeded"
    assert isinstance(error["message"], str) and error["message"]


def test_wrong_api_key_is_rejected_and_never_logged() -> None:
    secret = "sk-fake-secret-0123456789"
    with FakeOpenAIServer(api_key=secret) as server:
        wrong = chat(server, user("hi"), headers={"Authorization": "Bearer sk-wrong"})
        missing = chat(server, user("hi"))
        models = http_call(f"{server.base_url}/models")
        right = chat(server, user("hi"), headers={"Authorization": f"Bearer {secret}"})
        stats = server.stats()

    assert wrong.status == 401
    assert wrong.body["error"]["code"] == "invalid_api_key"
    assert missing.status == 401
    assert models.status == 401
    assert right.status == 200
    assert right.content == "hi"
    assert secret not in json.dumps(wrong.body)
    assert stats["status_counts"] == {"401": 2, "200": 1}
    assert server.returncode == 0  # SIGTERM is a clean shutdown
    assert secret not in server.stderr_output()


def test_a_401_quotes_the_key_it_was_sent_when_asked_to() -> None:
    with FakeOpenAIServer(api_key="sk-right-0123456789") as server:
        server.configure(quote_key_in_401=True)
        wrong = chat(server, user("hi"), headers={"Authorization": "Bearer sk-sent-by-client"})
        listing = http_call(
            f"{server.base_url}/models", headers={"Authorization": "Bearer sk-sent-by-client"}
        )
        missing = chat(server, user("hi"))
        with pytest.raises(ValueError, match="quote_key_in_401"):
            server.configure(quote_key_in_401="yes")

    assert wrong.status == listing.status == missing.status == 401
    assert "sk-sent-by-client" in wrong.body["error"]["message"]
    assert "sk-sent-by-client" in listing.body["error"]["message"]
    assert "sk-right" not in json.dumps([wrong.body, listing.body, missing.body])
    assert missing.body["error"]["message"] == "You didn't provide an API key."


def test_rate_500_fails_every_request(server: FakeOpenAIServer) -> None:
    server.configure(rate_500=1.0)
    replies = [chat(server, user(f"q{i}")) for i in range(3)]

    assert [r.status for r in replies] == [500, 500, 500]
    assert all(r.body["error"]["type"] == "server_error" for r in replies)
    assert server.stats()["status_counts"] == {"500": 3}


def test_rate_drop_closes_the_connection(server: FakeOpenAIServer) -> None:
    server.configure(rate_drop=1.0)
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        chat(server, user("hello"))

    stats = server.stats()
    assert stats["requests_total"] == 1
    assert stats["status_counts"] == {"0": 1}
    assert stats["in_flight"] == 0


def test_rate_timeout_answers_504_after_the_hang(server: FakeOpenAIServer) -> None:
    server.configure(rate_timeout=1.0, timeout_hang_s=0.01)
    reply = chat(server, user("hello"))

    assert reply.status == 504
    assert reply.body["error"]["type"] == "server_error"


def test_seeded_faults_are_reproducible(server: FakeOpenAIServer) -> None:
    def run() -> list[int]:
        return [chat(server, user(f"q{i}")).status for i in range(12)]

    server.configure(seed=7, rate_500=0.5)
    first = run()
    server.configure(seed=7)
    second = run()

    assert first == second
    assert set(first) == {200, 500}


# -- structured output ------------------------------------------------------------------------

NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "count": {"type": "integer"},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["alpha", "beta"]},
        "author": {"$ref": "#/$defs/Person"},
        "reviewers": {"type": "array", "items": {"$ref": "#/$defs/Person"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "tags": {"type": ["array", "null"], "items": {"type": "string"}},
    },
    "required": ["title", "count", "author"],
    "$defs": {
        "Person": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 18},
                "address": {"$ref": "#/$defs/Address"},
            },
        },
        "Address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "nullable": True}},
        },
    },
}

PERSON = {"name": "x", "age": 18, "address": {"city": "x", "zip": "x"}}
NESTED_INSTANCE = {
    "title": "x",
    "count": 0,
    "score": 0.0,
    "ok": False,
    "kind": "alpha",
    "author": PERSON,
    "reviewers": [PERSON],
    "note": "x",
    "tags": ["x"],
}


def test_json_schema_reply_is_minimal_instance(server: FakeOpenAIServer) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "Doc", "schema": NESTED_SCHEMA, "strict": True},
    }
    reply = chat(server, user("fill it"), response_format=response_format)

    assert reply.status == 200
    assert json.loads(reply.content) == NESTED_INSTANCE
    assert isinstance(json.loads(reply.content)["score"], float)


def test_json_object_reply(server: FakeOpenAIServer) -> None:
    plain = chat(server, user("x"), response_format={"type": "json_object"})
    with_schema = chat(
        server,
        user("x"),
        response_format={
            "type": "json_object",
            "schema": {"$ref": "#/$defs/Person", **NESTED_SCHEMA},
        },
    )
    overridden = chat(server, user("x [[reply:not json]]"), response_format={"type": "json_object"})

    assert json.loads(plain.content) == {}
    assert json.loads(with_schema.content) == PERSON
    assert overridden.content == "not json"


def test_schema_instance_handles_cycles_and_bounds() -> None:
    tree = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            }
        },
    }
    assert schema_instance(tree) == {"children": [None]}
    assert schema_instance({"type": "integer", "exclusiveMinimum": 3}) == 4
    assert schema_instance({"type": "string", "minLength": 3}) == "xxx"
    assert schema_instance({"type": "array", "maxItems": 0}) == []
    assert schema_instance({"oneOf": [{"const": "a"}, {"type": "integer"}]}) == "a"


# -- statistics and control ------------------------------------------------------------------


def test_stats_count_requests_statuses_and_keys(server: FakeOpenAIServer) -> None:
    repeated = user("same prompt")
    for _ in range(3):
        chat(server, repeated)
    chat(server, user("other prompt"), model="other-model")
    chat(server, user("boom [[status:500]]"))
    chat(server, user("busy [[status:429]]"))

    stats = server.stats()
    assert stats["requests_total"] == 6
    assert stats["in_flight"] == 0
    assert stats["max_in_flight"] == 1
    assert stats["status_counts"] == {"200": 4, "500": 1, "429": 1}
    assert stats["completed_by_key"] == {
        request_key("fake-model", repeated): 3,
        request_key("other-model", user("other prompt")): 1,
    }
    records = stats["requests"]
    assert len(records) == 6
    assert [r["status"] for r in records] == [200, 200, 200, 200, 500, 429]
    assert records[3]["model"] == "other-model"
    assert records[0]["key"] == request_key("fake-model", repeated)
    assert records[0]["prompt_tokens"] == estimate_tokens(len("same prompt"))
    assert records[0]["completion_tokens"] == estimate_tokens(len("same prompt"))
    assert all(0.0 <= r["t_start"] <= r["t_end"] for r in records)
    assert stats["busy_time_s"] >= 0.0
    assert stats["in_flight_time_s"] >= 0.0
    assert set(stats["time_at_level_s"]) <= {"0", "1"}


def test_max_in_flight_counts_concurrent_requests(server: FakeOpenAIServer) -> None:
    workers = 8

    def send(i: int) -> int:
        # Parked at the gate until all eight have arrived, however loaded the machine.
        return chat(server, user(f"request {i} [[gate:all]]")).status

    with ThreadPoolExecutor(max_workers=workers) as pool:
        sent = [pool.submit(send, i) for i in range(workers)]
        try:
            server.wait_parked("all", workers)
            assert server.stats()["in_flight"] == workers
        finally:
            server.open_gate("all")
        statuses = [future.result(timeout=60) for future in sent]

    stats = server.stats()
    assert statuses == [200] * workers
    assert stats["requests_total"] == workers
    assert stats["max_in_flight"] == workers
    assert stats["in_flight"] == 0
    assert str(workers) in stats["time_at_level_s"]
    assert len(stats["completed_by_key"]) == workers


def test_config_rejects_unknown_and_invalid_keys(server: FakeOpenAIServer) -> None:
    with pytest.raises(ValueError, match="bogus_knob"):
        server.configure(bogus_knob=1)
    with pytest.raises(ValueError, match="rate_500"):
        server.configure(rate_500=1.5)
    with pytest.raises(ValueError, match="gate_texts"):
        server.configure(gate_texts={"": "held"})
    with pytest.raises(ValueError, match="rpm_limit"):
        server.configure(rpm_limit=0)
    with pytest.raises(ValueError, match="limit_window_s"):
        server.configure(rpm_limit=60, limit_window_s=-1)
    raw = http_call(f"http://127.0.0.1:{server.port}/_config", {"latency_ms": 5, "nope": 1})

    assert raw.status == 400
    assert "nope" in raw.body["error"]["message"]
    # rejected requests change nothing
    assert server.configure() == {**_DEFAULT_CONFIG, "gate_texts": {}}


def test_reply_headers_are_sent_as_given_on_every_reply(server: FakeOpenAIServer) -> None:
    """A test sends what a provider (or a proxy) might: any header, any text, over the
    server's own rate-limit headers, on replies and refusals alike."""
    with pytest.raises(ValueError, match="not a header name"):
        server.configure(reply_headers={"bad name": "1"})
    with pytest.raises(ValueError, match="one line"):
        server.configure(reply_headers={"x-a": "1\r\nx-b: 2"})
    wanted = {"x-ratelimit-limit-requests": "1e999", "retry-after": "inf"}
    assert server.configure(reply_headers=wanted)["reply_headers"] == wanted
    for reply in (chat(server, user("hi")), chat(server, user("[[status:429]] hi"))):
        assert reply.headers["x-ratelimit-limit-requests"] == "1e999"
        assert reply.headers.get_all("retry-after") == ["inf"]
    embedded = http_call(f"{server.base_url}/embeddings", {"model": "e", "input": ["a"]})
    assert embedded.status == 200 and embedded.headers["retry-after"] == "inf"
    server.configure(reply_headers={})
    assert "x-ratelimit-limit-requests" not in chat(server, user("hi")).headers


def test_reset_clears_stats_but_keeps_config(server: FakeOpenAIServer) -> None:
    server.configure(retry_after_s=2)
    chat(server, user("one"))
    chat(server, user("two [[status:503]]"))
    assert server.stats()["requests_total"] == 2

    server.reset()
    stats = server.stats()

    assert stats["requests_total"] == 0
    assert stats["status_counts"] == {}
    assert stats["completed_by_key"] == {}
    assert stats["requests"] == []
    assert stats["max_in_flight"] == 0
    assert stats["busy_time_s"] == 0.0
    assert server.configure()["retry_after_s"] == 2.0


def test_refuses_non_loopback_host() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plait.testing.fake_openai", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode != 0
    assert "loopback" in result.stderr
    assert "PLAIT_FAKE_OPENAI_READY" not in result.stdout


def test_start_reports_child_failure_with_stderr() -> None:
    server = FakeOpenAIServer(latency_ms=-1.0)
    with pytest.raises(RuntimeError, match="latency-ms"):
        server.start()
    server.stop()  # idempotent after a failed start


def test_a_gate_parks_requests_until_opened_and_reset_opens_every_gate(
    server: FakeOpenAIServer,
) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = [pool.submit(chat, server, user(f"q{i} [[gate:a]]")) for i in range(2)]
        other = pool.submit(chat, server, user("r [[gate:b]]"))
        server.wait_parked("a", 2)
        server.wait_parked("b", 1)
        assert server.stats()["gated"] == {"a": 2, "b": 1}
        assert not any(f.done() for f in first) and not other.done()
        server.open_gate("a")
        replies = [f.result(timeout=60) for f in first]
        assert [r.body["choices"][0]["message"]["content"] for r in replies] == ["q0", "q1"]
        assert chat(server, user("late [[gate:a]]")).status == 200  # an open gate stays open
        server.close_gate("a")
        again = pool.submit(chat, server, user("again [[gate:a]]"))
        server.wait_parked("a", 1)
        server.reset()  # opens every gate: a failed test never leaves requests parked
        assert again.result(timeout=60).status == 200 and other.result(timeout=60).status == 200
    assert server.stats()["gated"] == {}


def test_a_client_that_leaves_while_parked_is_counted_and_not_leaked(
    server: FakeOpenAIServer,
) -> None:
    import socket

    body = json.dumps({"model": "m", "messages": user("gone [[gate:x]]")}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Authorization: Bearer sk-test\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(head + body)
        server.wait_parked("x", 1)
    server.open_gate("x")
    deadline = time.monotonic() + 60
    while server.stats()["in_flight"]:
        assert time.monotonic() < deadline, "the abandoned request never left"
        time.sleep(0.005)
    stats = server.stats()
    assert stats["gated"] == {} and "200" not in stats["status_counts"]


def test_a_gate_needs_a_name(server: FakeOpenAIServer) -> None:
    assert chat(server, user("x [[gate: ]]")).status == 400


def test_a_lone_surrogate_is_answered_not_a_server_error(server: FakeOpenAIServer) -> None:
    # JSON may carry a lone surrogate as an escape; UTF-8 cannot encode it
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
    request = urllib.request.Request(
        f"{server.base_url}/chat/completions",
        data=raw,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        reply = json.loads(response.read())
    assert reply["choices"][0]["message"]["content"] == "bad \ud800 text"
    assert server.stats()["status_counts"] == {"200": 1}
