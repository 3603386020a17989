"""`mock` and `override` against the loopback server: what is answered, what is sent."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

import plait
from plait.handlers import Handler, Message
from plait.handlers.mocking import Mock, UnmockedCallError, mock
from plait.handlers.overriding import Override, override
from plait.providers.base import LLMRequest, LLMResponse
from plait.structured import parse_reply
from plait.testing import FakeOpenAIServer

from .pipelines import DeepPipeline, Echo, FanOutFanIn, SummarizeAndAnalyze, echo


def systems(server: FakeOpenAIServer) -> Counter[str]:
    """How many requests the server answered under each system prompt (module tag)."""
    return Counter(r["system"] for r in server.stats()["requests"] if r["status"] == 200)


class Sent(Handler):
    """Entered outermost: its postprocess sees the request the default action was given."""

    def __init__(self) -> None:
        self.requests: dict[str, LLMRequest] = {}
        self.mocked: dict[str, bool] = {}
        self.replies: dict[str, str] = {}

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm":
            self.requests[msg.name] = msg.kwargs["request"]
            self.mocked[msg.name] = bool(msg.meta.get("mock"))
            self.replies[msg.name] = msg.value.text


class Verdict(BaseModel):
    label: str
    score: int


class Judge(plait.Module):
    def __init__(self, response_format: Any) -> None:
        super().__init__()
        self.judge = plait.LLMInference(alias="fast", response_format=response_format)

    def forward(self, text: str) -> Any:
        return self.judge(text)


# -- mock --------------------------------------------------------------------------------------


class Note(BaseModel):
    text: str


def test_a_plain_string_answers_a_one_text_field_format(resources: plait.ResourceConfig) -> None:
    judge = Judge(Note).bind(resources=resources)
    with mock({"judge": "just words"}):
        assert judge.run_sync("t") == Note(text="just words")
    with mock({"judge": '{"text": "as JSON"}'}):
        assert judge.run_sync("t") == Note(text="as JSON")
    with mock({"judge": '{"other": 1}'}):  # JSON without the field: the whole string
        assert judge.run_sync("t") == Note(text='{"other": 1}')
    with mock({"judge": "not JSON"}), pytest.raises(Exception, match="give the object"):
        Judge(Verdict).bind(resources=resources).run_sync("t")  # two fields: no coercion


def test_a_label_answers_a_label_call_as_it_stands(resources: plait.ResourceConfig) -> None:
    """A call that answers with labels is mocked with the label, as a test writes it
    (it was refused: "is a str, but the call asks for a Literal"); its JSON still works,
    and a string that is none of the labels is refused naming it."""
    import enum
    from typing import Literal

    class Mood(enum.Enum):
        HAPPY = "happy"
        SAD = "sad"

    sentiment = Judge(Literal["positive", "negative"]).bind(resources=resources)
    with mock({"judge": "positive"}):
        assert sentiment.run_sync("t") == "positive"
    with mock({"judge": '"negative"'}):
        assert sentiment.run_sync("t") == "negative"
    with mock({"judge": "sad"}):
        assert Judge(Mood).bind(resources=resources).run_sync("t") is Mood.SAD
    with mock({"judge": "neutral"}), pytest.raises(Exception, match="'neutral', which is no"):
        sentiment.run_sync("t")


def test_mock_by_alias_answers_only_that_alias(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    sent = Sent()
    with sent, mock({"smart": "from the mock"}) as m:
        out = SummarizeAndAnalyze().bind(resources=resources).run_sync("hello")
    assert isinstance(m, Mock)
    assert out == "from the mock"
    assert systems(server) == {"sum": 1}  # the summarizer (fast) was sent, the analyzer not
    assert sent.mocked == {"summarizer": False, "analyzer": True}


def test_mock_by_module_path_glob(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    with mock({"stage2.*": "P"}):
        out = DeepPipeline().bind(resources=resources).run_sync("x")
    # stage3 still sees stage2's mocked "user" output, through real calls
    assert out.startswith("[syn] technical: [tech] P")
    # tech/biz/user run twice in the pipeline (stage2 and stage3.analyzer): only once were sent
    assert systems(server) == {"sum": 1, "ana": 1, "tech": 1, "biz": 1, "user": 1, "syn": 1}


def test_first_matching_pattern_wins(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    specific_first, catch_all_first = Sent(), Sent()
    with specific_first, mock({"left": "specific", "*": "catch-all"}):
        pipeline.run_sync("x")
    with catch_all_first, mock({"*": "catch-all", "left": "specific"}):
        pipeline.run_sync("x")
    assert specific_first.replies == {
        "left": "specific",
        "right": "catch-all",
        "combine": "catch-all",
    }
    assert set(catch_all_first.replies.values()) == {"catch-all"}
    assert server.stats()["requests_total"] == 0


def test_callable_replies_sync_and_async(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    async def shout(request: LLMRequest) -> str:
        await asyncio.sleep(0)
        return request.prompt_text.upper()

    def tagged(request: LLMRequest) -> str:
        return f"<{request.messages[0]['content']}:{request.prompt_text}>"

    with mock({"left": shout, "right": tagged}):
        out = FanOutFanIn().bind(resources=resources).run_sync(["ab", "cd"])
    assert out == [echo("C", "AB | <R:ab>"), echo("C", "CD | <R:cd>")]
    assert systems(server) == {"C": 2}


def test_a_callable_may_return_a_whole_response(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    replies: list[LLMResponse] = []

    class Keep(Handler):
        def postprocess(self, msg: Message) -> None:
            if msg.type == "llm":
                replies.append(msg.value)

    with Keep(), mock({"*": lambda request: LLMResponse("r", finish_reason="length")}):
        assert Echo("e").bind(resources=resources).run_sync("q") == "r"
    assert [r.finish_reason for r in replies] == ["length"]
    assert server.stats()["requests_total"] == 0


def test_structured_replies_are_validated_like_real_ones(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    replies: list[tuple[Any, LLMResponse]] = []

    class Keep(Handler):
        def postprocess(self, msg: Message) -> None:
            if msg.type == "llm":
                replies.append((msg.kwargs["request"].response_format, msg.value))

    judge = Judge(Verdict).bind(resources=resources)
    with Keep():
        with mock({"judge": {"label": "good", "score": "7"}}):
            assert judge.run_sync("t") == Verdict(label="good", score=7)  # converted
        with mock({"judge": Verdict(label="bad", score=1)}):
            assert judge.run_sync("t") == Verdict(label="bad", score=1)
        with mock({"judge": '{"label": "json", "score": 3}'}):
            assert judge.run_sync("t") == Verdict(label="json", score=3)
        with mock({"judge": ["a", "b"]}):
            assert Judge(list[str]).bind(resources=resources).run_sync("t") == ["a", "b"]
    # the text is the wire form (a list travels wrapped), which caches and checkpoints
    # parse again when they read a stored reply back
    assert len(replies) == 4
    for response_format, reply in replies:
        assert parse_reply(response_format, reply.text) == reply.parsed
    with mock({"judge": {"label": "x"}}), pytest.raises(plait.ExecutionError) as info:
        judge.run_sync("t")
    assert "'judge'" in str(info.value) and "score" in str(info.value)
    assert server.stats()["requests_total"] == 0


def test_a_text_call_rejects_a_non_text_reply(resources: plait.ResourceConfig) -> None:
    with mock({"*": {"not": "text"}}), pytest.raises(plait.ExecutionError, match="must be a str"):
        Echo("e").bind(resources=resources).run_sync("q")


def test_strict_mock_names_the_unmatched_module(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = FanOutFanIn().bind(resources=resources)
    with mock({"left": "l", "right": "r"}, strict=True):
        out = pipeline.run_sync(["a"])
    [value] = out
    assert isinstance(value, plait.Value) and value.is_error
    assert value.meta["error_type"] == UnmockedCallError.__name__
    assert "'combine'" in value.meta["message"]
    assert server.stats()["requests_total"] == 0
    with mock({"*": "all"}, strict=True):
        assert pipeline.run_sync("a") == "all"


def test_mocks_leave_calls_answered_inside_them_alone(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    def joined(request: LLMRequest) -> str:
        return request.prompt_text

    sent = Sent()
    with sent, mock({"combine": joined, "*": "outer"}), mock({"left": "inner"}):
        out = FanOutFanIn().bind(resources=resources).run_sync("x")
    assert out == "inner | outer"
    assert sent.mocked == {"left": True, "right": True, "combine": True}
    assert server.stats()["requests_total"] == 0


def test_mock_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="mapping"):
        mock("fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty"):
        mock({"": "x"})


# -- override ----------------------------------------------------------------------------------


def test_override_rewrites_a_copy_of_the_request(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    seen: list[LLMRequest] = []

    class Before(Handler):  # innermost: sees the request before the override
        def process(self, msg: Message) -> None:
            if msg.type == "llm":
                seen.append(msg.kwargs["request"])

    sent = Sent()
    with sent, override(temperature=0, seed=7, top_p=0.5), Before():
        assert Echo("e").bind(resources=resources).run_sync("q") == echo("e", "q")
    [original] = seen
    assert (original.temperature, original.extra) == (1.0, {})  # never mutated
    [final] = sent.requests.values()
    assert final is not original
    assert (final.temperature, final.extra) == (0, {"seed": 7, "top_p": 0.5})
    assert server.stats()["requests_total"] == 1


def test_max_tokens_and_extra_fields_reach_the_server(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = Echo("tag").bind(resources=resources)
    text = "a long prompt that the server echoes back in full"
    with override(max_tokens=2):
        assert pipeline.run_sync(text) == echo("tag", text)[:8]  # truncated at 2 tokens
    # the fake server reads max_completion_tokens before max_tokens: an extra field is sent
    with override(max_tokens=50, extra={"max_completion_tokens": 1}):
        assert pipeline.run_sync(text) == echo("tag", text)[:4]
    assert [r["completion_tokens"] for r in server.stats()["requests"]] == [2, 1]


def test_override_alias_sends_to_the_other_endpoint(server: FakeOpenAIServer) -> None:
    settings = {"provider": "openai", "base_url": server.base_url, "api_key": "sk-test"}
    resources = plait.ResourceConfig(
        {"fast": {**settings, "model": "small-model"}, "smart": {**settings, "model": "big-model"}}
    )
    pipeline = FanOutFanIn().bind(resources=resources)
    with override("combine", alias="smart"):
        assert pipeline.run_sync("x") == echo("C", f"{echo('L', 'x')} | {echo('R', 'x')}")
    models = {r["system"]: r["model"] for r in server.stats()["requests"]}
    assert models == {"L": "small-model", "R": "small-model", "C": "big-model"}


def test_override_to_an_unconfigured_alias_is_a_clear_error(
    resources: plait.ResourceConfig,
) -> None:
    with override(alias="nowhere"), pytest.raises(plait.ExecutionError, match="nowhere"):
        Echo("e").bind(resources=resources).run_sync("q")


def test_glob_matching_only_changes_matching_modules(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    sent = Sent()
    with sent, override(["stage2.*", "stage3.synth*"], max_tokens=99):
        DeepPipeline().bind(resources=resources).run_sync("x")
    changed = sorted(name for name, request in sent.requests.items() if request.max_tokens == 99)
    assert changed == [
        "stage2.business",
        "stage2.technical",
        "stage2.user",
        "stage3.synthesizer",
    ]
    assert len(sent.requests) == 9


def test_nesting_order_decides_what_a_mock_sees(resources: plait.ResourceConfig) -> None:
    """The innermost handler processes first: an override inside a mock changes what the
    mock sees; one outside it comes too late for calls the mock answers."""

    def temperature(request: LLMRequest) -> str:
        return str(request.temperature)

    pipeline = Echo("e").bind(resources=resources)
    with mock({"*": temperature}), override(temperature=0.25):
        assert pipeline.run_sync("q") == "0.25"
    with override(temperature=0.25), mock({"*": temperature}):
        assert pipeline.run_sync("q") == "1.0"


def test_unknown_and_bad_parameters_fail_at_construction() -> None:
    with pytest.raises(TypeError, match=r"'temprature'.*allowed: alias, temperature, max_tokens"):
        override(temprature=0)
    with pytest.raises(TypeError, match="alias="):
        override(model="gpt-x")
    with pytest.raises(ValueError, match="temperature"):
        override(temperature=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        override(max_tokens=0)
    with pytest.raises(TypeError, match="at least one change"):
        override("left")
    with pytest.raises(TypeError, match="glob"):
        override([], temperature=0)
    assert isinstance(override(seed=None), Override)


def test_none_removes_an_extra_field(resources: plait.ResourceConfig) -> None:
    sent = Sent()
    with sent, override(seed=None), override(seed=3, user="u"):
        Echo("e").bind(resources=resources).run_sync("q")
    [request] = sent.requests.values()
    assert request.extra == {"user": "u"}
