"""`plait.functional`: the atomic LLM op every call takes, usable on its own and in modules."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

import plait
import plait.functional as F
from plait.handlers import budget, cache, mock, override, profile, record, replay
from plait.handlers.recording import NotRecordedError
from plait.handlers.stack import Handler, Message
from plait.providers.base import LLMResponse, ProviderError
from plait.resources.config import ConfigurationError
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo


class Person(pydantic.BaseModel):
    name: str
    age: int


def requests(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


def bodies(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r["body"] for r in server.stats(bodies=True)["requests"]]


class LLMMessages(Handler):
    """Keeps every ``"llm"`` message that reaches the handler stack."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def process(self, msg: Message) -> None:
        if msg.type == "llm":
            self.seen.append(msg)


# -- standalone ----------------------------------------------------------------------------
async def test_chat_complete_returns_a_response_value(server: FakeOpenAIServer) -> None:
    resources = make_resources(server)
    reply = await F.chat_complete(
        "fast", [F.system("terse"), F.user("hello")], resources=resources, seed=7
    )
    assert reply.kind is plait.ValueKind.RESPONSE
    assert isinstance(reply.payload, LLMResponse)
    assert F.text_of(reply) == reply.payload.text == "[terse] hello"
    assert reply.meta["module_path"] == "chat_complete"
    assert reply.meta["alias"] == "fast"
    assert reply.meta["answered_by"] == "endpoint"
    assert reply.meta["usage"].total_tokens > 0 and reply.meta["model"]
    (body,) = bodies(server)
    assert body["messages"] == [
        {"role": "system", "content": "terse"},
        {"role": "user", "content": "hello"},
    ]
    assert body["seed"] == 7 and "temperature" not in body


async def test_a_conversation_and_content_parts_are_sent_as_given(
    server: FakeOpenAIServer,
) -> None:
    first = await F.complete("fast", "one", resources=make_resources(server))
    messages = [
        F.user("one"),
        F.assistant(first),  # a previous reply: its text is used
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
    ]
    second = await F.chat_complete("fast", messages, resources=make_resources(server))
    assert F.text_of(second) == "two"
    sent = bodies(server)[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": "one"}
    assert sent[2]["content"] == [{"type": "text", "text": "two"}]


async def test_structured_replies_are_parsed(server: FakeOpenAIServer) -> None:
    reply = await F.complete(
        "fast", "who?", response_format=Person, resources=make_resources(server)
    )
    person = F.parsed_of(reply)
    assert isinstance(person, Person)
    assert Person.model_validate_json(F.text_of(reply)) == person
    plain = await F.complete("fast", "who?", resources=make_resources(server))
    with pytest.raises(ValueError, match="no response_format"):
        F.parsed_of(plain)


async def test_resources_come_from_execution_settings(server: FakeOpenAIServer) -> None:
    with plait.ExecutionSettings(resources=make_resources(server)):
        reply = await F.complete("fast", "hi", system="sys")
    assert F.text_of(reply) == "[sys] hi" and requests(server) == 1


async def test_with_nothing_configured_the_embedded_default_is_the_alias(
    server: FakeOpenAIServer,
) -> None:
    # Any alias means the embedded model; a mock answers before it would be needed.
    with mock({"anything": "canned"}):
        reply = await F.complete("anything", "hi", name="probe")
    assert F.text_of(reply) == "canned"
    assert reply.meta["answered_by"] == "mock" and reply.meta["module_path"] == "probe"


async def test_complete_sends_what_an_llm_inference_sends(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    with record(path):
        recorded = await Echo("sum").bind(resources=make_resources(server))("text")
    server.reset()
    with replay(path):
        again = await F.complete("fast", "text", system="sum", temperature=1.0)
    assert F.text_of(again) == recorded == "[sum] text"
    assert again.meta["answered_by"] == "replay" and requests(server) == 0


# -- failures are values; bad arguments raise -----------------------------------------------
async def test_a_failed_call_is_an_error_value_with_cause_and_traceback(
    server: FakeOpenAIServer,
) -> None:
    reply = await F.complete("fast", "[[status:400]] no", resources=make_resources(server))
    assert reply.kind is plait.ValueKind.ERROR
    assert isinstance(reply.payload, ProviderError)
    assert reply.meta["error_type"] == "ProviderError"
    assert "HTTP 400" in reply.meta["message"]
    assert "Traceback" in reply.meta["traceback"]
    assert reply.meta["module_path"] == "complete"
    with pytest.raises(plait.ExecutionError, match="HTTP 400") as raised:
        F.text_of(reply)
    assert raised.value.__cause__ is reply.payload


async def test_handler_failures_are_error_values_too(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "empty.jsonl"
    with record(path):
        pass
    with replay(path):
        missing = await F.complete("fast", "never recorded", name="probe")
    assert missing.kind is plait.ValueKind.ERROR
    assert isinstance(missing.payload, NotRecordedError)
    assert "probe" in missing.meta["message"]
    with budget(max_calls=0):
        refused = await F.complete("fast", "hi", resources=make_resources(server))
    assert refused.kind is plait.ValueKind.ERROR and requests(server) == 0


async def test_an_error_value_as_content_short_circuits(server: FakeOpenAIServer) -> None:
    failed = await F.complete("fast", "[[status:400]] x", resources=make_resources(server))
    downstream = await F.complete("fast", failed, resources=make_resources(server))
    assert downstream.kind is plait.ValueKind.ERROR
    assert downstream.payload is failed.payload
    assert downstream.meta["short_circuited"] is True
    assert requests(server) == 1


@pytest.mark.parametrize(
    ("messages", "error", "fix"),
    [
        ("hello", TypeError, r"complete\(alias, prompt\)"),
        ({"role": "user", "content": "x"}, TypeError, "list of"),
        ([], ValueError, "at least one message"),
        (["hello"], TypeError, r"F\.user\(text\)"),
        ([{"role": "bot", "content": "x"}], ValueError, "'system', 'developer', 'user'"),
        ([{"role": "user"}], ValueError, "no 'content'"),
        ([{"role": "user", "content": 42}], TypeError, "content of type int"),
        ([{"role": "user", "content": None}], ValueError, "content None"),
        ([{"role": "user", "content": [{"text": "x"}]}], TypeError, "content part"),
        ([F.system("only instructions")], ValueError, "add the user's turn"),
    ],
)
async def test_malformed_messages_raise_naming_the_fix(
    server: FakeOpenAIServer, messages: Any, error: type[Exception], fix: str
) -> None:
    with pytest.raises(error, match=fix):
        await F.chat_complete("fast", messages, resources=make_resources(server))
    assert requests(server) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "fix"),
    [
        ({"temperature": "hot"}, TypeError, "temperature must be a number"),
        ({"max_tokens": 0}, ValueError, "positive integer"),
        ({"response_format": object()}, TypeError, "cannot be turned into a JSON schema"),
        ({"model": "gpt"}, TypeError, "configure it in the resources"),
        ({"temprature": 0}, TypeError, "did you mean temperature="),
        ({"stop": object()}, TypeError, "must be JSON data"),
        ({"system": "x"}, TypeError, r"F\.system\(text\)"),
    ],
)
async def test_bad_arguments_raise_naming_the_fix(
    server: FakeOpenAIServer, kwargs: dict[str, Any], error: type[Exception], fix: str
) -> None:
    with pytest.raises(error, match=fix):
        await F.chat_complete("fast", [F.user("x")], resources=make_resources(server), **kwargs)
    assert requests(server) == 0


async def test_an_unknown_alias_is_a_configuration_error_before_any_request(
    server: FakeOpenAIServer,
) -> None:
    with pytest.raises(ConfigurationError, match=r"'fsat' is not in the resources.*fast"):
        await F.complete("fsat", "hi", resources=make_resources(server))
    with pytest.raises(TypeError, match="non-empty string"):
        await F.complete("", "hi", resources=make_resources(server))
    assert requests(server) == 0


# -- the handler stack applies --------------------------------------------------------------
async def test_cache_override_and_profile_apply_to_functional_calls(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server)
    with profile() as prof, cache(tmp_path / "c.db"), override(temperature=0):
        first = await F.complete("fast", "hi", resources=resources, temperature=0.9)
        second = await F.complete("fast", "hi", resources=resources, temperature=0.9)
    assert first.meta["answered_by"] == "endpoint"
    assert second.meta["answered_by"] == "cache"
    assert requests(server) == 1 and bodies(server)[0]["temperature"] == 0
    assert prof.summary().aliases["fast"].calls == 2


# -- inside a module ------------------------------------------------------------------------
class Voter(plait.Module):
    """A hand-written module: an LLMInference, then functional calls fanned out."""

    def __init__(self, votes: int = 3) -> None:
        super().__init__()
        self.draft = Echo("draft")
        self.votes = votes

    async def forward(self, text: str) -> str:
        draft = await self.draft(text)
        replies = await asyncio.gather(
            *(F.complete("fast", f"{draft} #{i}", name="vote") for i in range(self.votes))
        )
        return " | ".join(F.text_of(r) for r in replies)


async def test_functional_calls_inside_a_module_run_on_its_engine(
    server: FakeOpenAIServer,
) -> None:
    seen = LLMMessages()
    with seen:
        out = await Voter().bind(resources=make_resources(server))("x")
    assert out == " | ".join(f"[draft] x #{i}" for i in range(3))
    names = sorted(m.name for m in seen.seen)
    assert names == ["draft", "vote", "vote", "vote"]  # named like the root's children
    for msg in seen.seen:
        # Both kinds of call carry what handlers rely on, and the run's node identity.
        assert msg.input_index == 0 and msg.node_id is not None
        assert set(msg.meta) >= {"resources", "timing", "upstream"}
    votes = [m for m in seen.seen if m.name == "vote"]
    queue_limits = {s.info.get("limit") for m in votes for s in m.meta["timing"].spans}
    assert "run" in queue_limits  # the run-wide limiter's slot was taken


async def test_functional_calls_are_named_under_their_module(server: FakeOpenAIServer) -> None:
    class Team(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.agent = Voter(votes=1)

        def forward(self, text: str) -> Any:
            return self.agent(text)

    seen = LLMMessages()
    with seen:
        await Team().bind(resources=make_resources(server))("x")
    assert sorted(m.name for m in seen.seen) == ["agent.draft", "agent.vote"]


async def test_the_run_wide_limit_bounds_functional_calls(server: FakeOpenAIServer) -> None:
    server.configure(latency_ms=30)
    outputs = await Voter(votes=6).bind(resources=make_resources(server), max_concurrent=2)(
        ["a", "b"]
    )
    assert len(outputs) == 2 and all(isinstance(o, str) for o in outputs)
    stats = server.stats()
    assert stats["requests_total"] == 14
    assert stats["max_in_flight"] <= 2


async def test_mocks_and_failures_inside_a_module(server: FakeOpenAIServer) -> None:
    with mock({"vote": "yes"}):
        out = await Voter(votes=2).bind(resources=make_resources(server))("x")
    assert out == "yes | yes" and requests(server) == 1  # only the draft was sent

    class Fragile(plait.Module):
        async def forward(self, text: str) -> str:
            reply = await F.complete("fast", f"[[status:400]] {text}")
            assert reply.is_error  # a failed call is a value the forward may handle
            return F.text_of(reply)  # ... or let raise, failing the node with the cause

    with pytest.raises(plait.ExecutionError, match="HTTP 400"):
        await Fragile().bind(resources=make_resources(server))("x")


def test_llm_inference_outputs_are_unchanged(server: FakeOpenAIServer) -> None:
    class Typed(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = Echo("t")
            self.person = plait.LLMInference("fast", response_format=Person)

        def forward(self, x: str) -> Any:
            return {"text": self.text(x), "person": self.person(x)}

    out = Typed().bind(resources=make_resources(server)).run_sync("x")
    assert out["text"] == "[t] x"
    assert isinstance(out["person"], Person)


# -- packaging ------------------------------------------------------------------------------
def test_plait_functional_is_a_lazy_export() -> None:
    code = (
        "import sys, plait\n"
        "assert 'plait.functional' not in sys.modules\n"
        "F = plait.functional\n"
        "import plait.functional as G\n"
        "assert F is G and callable(F.chat_complete) and 'functional' in plait.__all__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
