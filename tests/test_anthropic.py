"""The Anthropic provider against a real loopback fake of the Messages API, via the real SDK."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

import plait
from plait.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicProvider
from plait.providers.base import LLMRequest, ProviderError, Usage
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.structured import parse_reply, wire_schema
from plait.testing import FakeAnthropicServer
from plait.testing.fake_anthropic import RETRY_AFTER_S
from plait.testing.fake_openai import estimate_tokens

KEY = "sk-ant-test-7f3c9a1e5b"
WRONG_KEY = "sk-ant-wrong-2d8e4b6f0a"


class Answer(pydantic.BaseModel):
    title: str
    score: float = pydantic.Field(ge=1.0)
    tags: list[str]


#: A developer's own Anthropic settings and proxies kept out of the SDK's way.
pytestmark = pytest.mark.usefixtures("anthropic_environment")


@pytest.fixture(scope="module")
def server_process() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(api_key=KEY) as server:
        yield server
    assert server.returncode == 0
    assert KEY not in server.stderr_output()


@pytest.fixture()
def server(server_process: FakeAnthropicServer) -> FakeAnthropicServer:
    server_process.reset()
    return server_process


def make_provider(server: FakeAnthropicServer, **settings: Any) -> AnthropicProvider:
    options: dict[str, Any] = {
        "provider": "anthropic",
        "model": "claude-test",
        "base_url": server.base_url,
        "api_key": KEY,
        **settings,
    }
    return AnthropicProvider(EndpointConfig(**options))


def ask(text: str, **fields: Any) -> LLMRequest:
    return LLMRequest(alias="claude", messages=[{"role": "user", "content": text}], **fields)


def received(server: FakeAnthropicServer) -> list[dict[str, Any]]:
    """The bodies the server got, in order."""
    return [record["body"] for record in server.stats()["requests"]]


async def failure(provider: AnthropicProvider, request: LLMRequest) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await provider.send(request)
    return info.value


# -- replies ------------------------------------------------------------------------------------


async def test_plain_reply_with_usage(server: FakeAnthropicServer) -> None:
    response = await make_provider(server).send(ask("hello there"))

    assert response.text == "hello there"
    assert response.parsed is None
    chars = len("hello there")
    assert response.usage == Usage(estimate_tokens(chars), estimate_tokens(chars))
    assert response.model == "claude-test"
    assert response.finish_reason == "stop"
    [body] = received(server)
    assert body["model"] == "claude-test"
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert body["messages"] == [{"role": "user", "content": "hello there"}]
    assert "system" not in body and "temperature" not in body and "tools" not in body


async def test_system_messages_become_the_system_parameter(server: FakeAnthropicServer) -> None:
    request = LLMRequest(
        alias="claude",
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "content": "second"},
        ],
        temperature=0.25,
        max_tokens=50,
    )
    response = await make_provider(server).send(request)

    assert response.text == "[Be terse.\n\nUse French.] second"
    [body] = received(server)
    assert body["system"] == "Be terse.\n\nUse French."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["temperature"] == 0.25
    assert body["max_tokens"] == 50


async def test_running_out_of_tokens_finishes_with_length(server: FakeAnthropicServer) -> None:
    response = await make_provider(server).send(ask("a longer question", max_tokens=2))

    assert response.text == "a longer"
    assert response.finish_reason == "length"
    assert response.usage.completion_tokens == 2


async def test_extra_fields_reach_the_request_body(server: FakeAnthropicServer) -> None:
    await make_provider(server).send(ask("hi", extra={"top_k": 5}))

    assert received(server)[0]["top_k"] == 5


async def test_structured_request_is_a_forced_tool_call(server: FakeAnthropicServer) -> None:
    response = await make_provider(server).send(ask("rate it", response_format=Answer))

    assert response.parsed is None  # the endpoint layer validates, not the provider
    assert parse_reply(Answer, response.text) == Answer(title="x", score=1.0, tags=["x"])
    assert response.finish_reason == "stop"
    [body] = received(server)
    [tool] = body["tools"]
    assert tool["name"] == "Answer"
    assert tool["input_schema"] == wire_schema(Answer)
    assert body["tool_choice"] == {"type": "tool", "name": "Answer"}


async def test_structured_request_of_a_non_object_type(server: FakeAnthropicServer) -> None:
    response = await make_provider(server).send(ask("list them", response_format=list[int]))

    assert parse_reply(list[int], response.text) == [0]


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (403, "permission_error"), (404, "not_found_error")],
)
async def test_client_errors_fail_fast_with_the_server_message(
    server: FakeAnthropicServer, status: int, kind: str
) -> None:
    error = await failure(make_provider(server), ask(f"x [[status:{status}]]"))

    assert error.status == status
    assert not error.retryable
    assert f"HTTP {status}: {kind}: Injected failure with HTTP status {status}." in str(error)


async def test_invalid_request_quotes_the_validation_message(server: FakeAnthropicServer) -> None:
    error = await failure(make_provider(server), LLMRequest(alias="claude", messages=[]))

    assert error.status == 400
    assert not error.retryable
    assert "messages: Field required" in str(error)


async def test_wrong_key_is_401_and_not_retryable(server: FakeAnthropicServer) -> None:
    error = await failure(make_provider(server, api_key=WRONG_KEY), ask("hi"))

    assert error.status == 401
    assert not error.retryable
    assert "authentication_error: invalid x-api-key" in str(error)
    assert WRONG_KEY not in str(error)


async def test_wrong_path_is_404_even_without_an_error_body(server: FakeAnthropicServer) -> None:
    # A common slip: base_url ending in /v1 although the SDK appends /v1/messages itself.
    error = await failure(make_provider(server, base_url=f"{server.base_url}/v1"), ask("hi"))

    assert error.status == 404
    assert not error.retryable
    assert "Not Found" in str(error)


async def test_rate_limit_is_retryable_with_retry_after(server: FakeAnthropicServer) -> None:
    error = await failure(make_provider(server), ask("busy [[status:429]]"))

    assert error.status == 429
    assert error.retryable
    assert error.retry_after == float(RETRY_AFTER_S)
    assert "rate_limit_error: Number of requests has exceeded your rate limit" in str(error)
    # one attempt only: retrying is the endpoint layer's job, not the SDK's
    assert server.stats()["status_counts"] == {"429": 1}


@pytest.mark.parametrize(("status", "kind"), [(500, "api_error"), (529, "overloaded_error")])
async def test_server_errors_are_retryable(
    server: FakeAnthropicServer, status: int, kind: str
) -> None:
    error = await failure(make_provider(server), ask(f"x [[status:{status}]]"))

    assert error.status == status
    assert error.retryable
    assert error.retry_after is None
    assert kind in str(error)
    assert server.stats()["requests_total"] == 1


async def test_refused_connection_is_retryable(server: FakeAnthropicServer) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        error = await failure(make_provider(server, base_url=url), ask("hi"))

    assert error.status is None
    assert error.retryable
    assert f"connection to {url}" in str(error)


async def test_silent_server_times_out_retryably(server: FakeAnthropicServer) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nobody ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        error = await failure(make_provider(server, base_url=url, timeout=0.2), ask("hi"))

    assert error.status is None
    assert error.retryable
    assert "timed out after 0.2 s" in str(error)


async def test_unsupported_role_is_refused_before_sending(server: FakeAnthropicServer) -> None:
    request = LLMRequest(alias="claude", messages=[{"role": "tool", "content": "42"}])
    error = await failure(make_provider(server), request)

    assert not error.retryable
    assert "'tool'" in str(error)
    assert server.stats()["requests_total"] == 0


async def test_the_key_never_shows(server: FakeAnthropicServer) -> None:
    provider = make_provider(server)
    wrong = make_provider(server, api_key=WRONG_KEY)
    errors = [
        await failure(provider, ask("x [[status:429]]")),
        await failure(provider, ask("x [[status:500]]")),
        await failure(wrong, ask("hi")),
    ]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        errors.append(await failure(make_provider(server, base_url=url), ask("hi")))

    shown = [repr(provider), repr(wrong), repr(provider.config), str(provider.config)]
    for error in errors:
        shown += [str(error), repr(error), "".join(traceback.format_exception(error))]
    for text in shown:
        assert KEY not in text
        assert WRONG_KEY not in text


# -- the fake itself --------------------------------------------------------------------------


def raw_post(server: FakeAnthropicServer, headers: dict[str, str]) -> tuple[int, Any]:
    """A request without the SDK, to reach what this SDK version never sends."""
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hey"}]}
    request = urllib.request.Request(
        f"{server.base_url}/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_fake_takes_the_key_as_x_api_key_or_bearer(server: FakeAnthropicServer) -> None:
    version = {"anthropic-version": "2023-06-01"}
    by_header = raw_post(server, {"x-api-key": KEY, **version})
    by_bearer = raw_post(server, {"Authorization": f"Bearer {KEY}", **version})
    wrong = raw_post(server, {"x-api-key": WRONG_KEY, **version})
    missing = raw_post(server, version)
    unversioned = raw_post(server, {"x-api-key": KEY})

    for status, reply in (by_header, by_bearer):
        assert status == 200
        assert reply["content"] == [{"type": "text", "text": "hey"}]
    assert wrong == (
        401,
        {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        },
    )
    assert missing[0] == 401
    assert unversioned[0] == 400
    assert "anthropic-version" in unversioned[1]["error"]["message"]


# -- construction and event loops ---------------------------------------------------------------


def test_one_provider_serves_successive_event_loops(server: FakeAnthropicServer) -> None:
    # The SDK's HTTP client is bound to the loop it ran on; reusing it on the next loop fails.
    provider = make_provider(server)
    first = asyncio.run(provider.send(ask("one")))
    second = asyncio.run(provider.send(ask("two")))

    assert (first.text, second.text) == ("one", "two")


def test_missing_key_is_a_configuration_error(server: FakeAnthropicServer) -> None:
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        make_provider(server, api_key=None)


def test_key_from_the_sdk_environment_variable(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    response = asyncio.run(make_provider(server, api_key=None).send(ask("hi")))

    assert response.text == "hi"


def test_missing_sdk_names_the_extra(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # makes `import anthropic` fail
    with pytest.raises(ImportError, match=r"pip install plait\[anthropic\]"):
        make_provider(server)


def test_importing_plait_does_not_import_the_sdk() -> None:
    code = (
        "import sys, plait, plait.providers, plait.providers.anthropic; "
        "assert 'anthropic' not in sys.modules, 'the SDK was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- through a pipeline -------------------------------------------------------------------------


def claude_resources(server: FakeAnthropicServer) -> plait.ResourceConfig:
    return plait.ResourceConfig(
        {
            "claude": {
                "provider": "anthropic",
                "model": "claude-test",
                "base_url": server.base_url,
                "api_key": KEY,
            }
        }
    )


def test_pipeline_runs_on_anthropic(server: FakeAnthropicServer) -> None:
    module = plait.LLMInference("claude", system_prompt="Be brief.", temperature=0.5)
    result = module.bind(resources=claude_resources(server)).run_sync("hello")

    assert result == "[Be brief.] hello"
    [body] = received(server)
    assert body["system"] == "Be brief."
    assert body["temperature"] == 0.5


def test_pipeline_gets_typed_replies_from_anthropic(server: FakeAnthropicServer) -> None:
    module = plait.LLMInference("claude", response_format=Answer)
    result = module.bind(resources=claude_resources(server)).run_sync("rate it")

    assert result == Answer(title="x", score=1.0, tags=["x"])


async def test_a_run_seed_is_not_sent_to_the_messages_api(server: FakeAnthropicServer) -> None:
    # The API has no seed field; plait's derived seed keys caches, it is not sent.
    await make_provider(server).send(ask("hello", extra={"seed": 1234}))
    assert "seed" not in received(server)[-1]
