"""Answers that are always a label (`plait.labels`): reading replies, scoring labels by
their log-probabilities, and label calls end to end on the real embedded model and on
the project's OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import enum
import json
import math
from typing import Any, Literal

import pytest

import plait
from plait.labels import choose_label, label_choices, label_scores, match_label
from plait.providers.base import LLMRequest
from plait.providers.local import LocalProvider
from plait.resources.config import EndpointConfig
from plait.testing import FakeOpenAIServer

Topic = Literal["billing", "shipping", "technical", "account"]


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Level(enum.StrEnum):
    LOW = "low"
    HIGH = "high"


# -- which types are labels ----------------------------------------------------------------
def test_literal_and_text_enums_are_labels_and_other_types_are_not() -> None:
    assert label_choices(Topic) == ("billing", "shipping", "technical", "account")
    assert label_choices(Mood) == ("happy", "sad")
    assert label_choices(Level) == ("low", "high")
    assert label_choices(Literal[1, 2]) is None
    assert label_choices(str) is None
    assert label_choices(list[str]) is None


def test_labels_that_differ_only_in_case_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="differ only in case"):
        plait.LLMInference("local", response_format=Literal["Yes", "yes"])
    with pytest.raises(TypeError, match="empty label"):
        plait.LLMInference("local", response_format=Literal["yes", " "])


def test_an_unknown_label_method_is_refused_naming_the_methods() -> None:
    with pytest.raises(ValueError, match="grammar, logprob, calibrated"):
        plait.LLMInference("local", response_format=Topic, label_method="vote")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only for a response_format of labels"):
        plait.LLMInference("local", response_format=list[str], label_method="logprob")


# -- reading a reply -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("billing", "billing"),
        ("  Billing.\n", "billing"),
        ('"shipping"', "shipping"),
        ('{"value": "technical"}', "technical"),
        ("This message is about the account.", "account"),
        ("shiping", "shipping"),
        ("**Technical**", "technical"),
    ],
)
def test_a_reply_is_read_as_the_label_it_names(reply: str, label: str) -> None:
    assert match_label(Topic, reply) == label


def test_an_enum_reply_is_the_member() -> None:
    assert match_label(Mood, "Happy") is Mood.HAPPY
    assert match_label(Level, '{"value": "high"}') is Level.HIGH


@pytest.mark.parametrize("reply", ["It is billing or shipping.", "no idea", ""])
def test_a_reply_naming_no_label_or_several_is_an_error_naming_the_labels(reply: str) -> None:
    with pytest.raises(ValueError, match="billing, shipping, technical, account"):
        match_label(Topic, reply)


# -- scoring labels from log-probabilities ---------------------------------------------------
def test_a_labels_score_is_the_mass_of_the_tokens_that_begin_it_alone() -> None:
    top = [
        {"token": "This", "logprob": math.log(0.4)},
        {"token": " Bill", "logprob": math.log(0.2)},
        {"token": "b", "logprob": math.log(0.1)},
        {"token": "Sh", "logprob": math.log(0.05)},
        {"token": "t", "logprob": math.log(0.01)},
    ]
    scores = label_scores(top, ["billing", "shipping", "technical", "test"])
    assert scores["billing"] == pytest.approx(math.log(0.3))
    assert scores["shipping"] == pytest.approx(math.log(0.05))
    # "t" begins two labels: it says nothing about which, so neither gets it.
    assert scores["technical"] < math.log(0.01) and scores["test"] < math.log(0.01)
    assert choose_label(scores) == "billing"


def test_calibration_takes_the_prior_out() -> None:
    scores = {"yes": math.log(0.6), "no": math.log(0.4)}
    prior = {"yes": math.log(0.9), "no": math.log(0.1)}
    assert choose_label(scores) == "yes"
    assert choose_label(scores, prior) == "no"


# -- end to end on the embedded model ---------------------------------------------------------
SYSTEM = "Classify the customer's message as billing, shipping, technical or account."
MESSAGES = [
    ("I was charged twice for my subscription this month.", "billing"),
    ("My parcel has not arrived and the tracking page is stuck.", "shipping"),
    ("The app crashes every time I open the settings screen.", "technical"),
    ("Please change the email address on my profile.", "account"),
]
DEMOS = [
    ("Why is there a second payment on my card?", "billing"),
    ("When will my package be delivered?", "shipping"),
    ("The website shows an error when I log in.", "technical"),
    ("I want to delete my account.", "account"),
]


class Classifier(plait.Module):
    def __init__(self, method: str | None, labels: Any = Topic) -> None:
        super().__init__()
        self.classify = plait.LLMInference(
            "local",
            SYSTEM,
            temperature=0,
            response_format=labels,
            label_method=method,  # type: ignore[arg-type]
            demos=DEMOS,
        )

    def forward(self, message: str) -> Any:
        return self.classify(message)


@pytest.mark.parametrize("method", [None, "grammar", "logprob", "calibrated"])
def test_every_method_answers_with_a_label_on_the_embedded_model(method: str | None) -> None:
    model = Classifier(method)
    outputs = model.run_sync([m for m, _ in MESSAGES])
    # Whatever the model makes of them, every answer is a label, never a sentence.
    assert all(output in {"billing", "shipping", "technical", "account"} for output in outputs)


def test_an_enum_call_returns_members_on_the_embedded_model() -> None:
    class Topics(enum.Enum):
        BILLING = "billing"
        SHIPPING = "shipping"
        TECHNICAL = "technical"
        ACCOUNT = "account"

    outputs = Classifier("grammar", Topics).run_sync([m for m, _ in MESSAGES])
    assert all(isinstance(output, Topics) for output in outputs)


def test_scored_replies_carry_each_labels_probability() -> None:
    provider = LocalProvider(EndpointConfig(provider="local"))
    request = LLMRequest(
        alias="local",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2+2?"}],
        response_format=Topic,
        label_method="calibrated",
    )

    async def both() -> list[Any]:
        return list(await asyncio.gather(provider.send(request), provider.send(request)))

    first, second = asyncio.run(both())
    for response in (first, second):
        assert response.text in {"billing", "shipping", "technical", "account"}
        assert response.label_scores is not None
        assert set(response.label_scores) == {"billing", "shipping", "technical", "account"}
        assert sum(response.label_scores.values()) == pytest.approx(1.0)
    assert first.text == second.text and first.label_scores == second.label_scores


# -- on an OpenAI-compatible endpoint ---------------------------------------------------------
def _remote(server: FakeOpenAIServer, method: str | None) -> tuple[plait.Module, Any]:
    class Remote(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classify = plait.LLMInference(
                "fast",
                SYSTEM,
                response_format=Topic,
                label_method=method,  # type: ignore[arg-type]
            )

        def forward(self, message: str) -> Any:
            return self.classify(message)

    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": server.base_url,
                "api_key": "sk-test",
            }
        }
    )
    return Remote(), resources


def test_an_openai_endpoint_is_sent_an_enum_schema_and_its_reply_is_the_label(
    server: FakeOpenAIServer,
) -> None:
    model, resources = _remote(server, None)
    with plait.ExecutionSettings(resources=resources):
        output = model.run_sync("My card was charged twice.")
    assert output in {"billing", "shipping", "technical", "account"}
    (record,) = server.stats(bodies=True)["requests"]
    schema = record["body"]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["value"]["enum"] == list(label_choices(Topic) or ())


def test_an_endpoint_without_structured_outputs_is_mapped_to_the_label(
    server: FakeOpenAIServer,
) -> None:
    model, resources = _remote(server, None)
    with plait.ExecutionSettings(resources=resources):
        output = model.run_sync("[[reply:I think this is about Shipping.]]")
    assert output == "shipping"


def test_a_reply_that_is_no_label_is_re_asked_naming_the_labels(
    server: FakeOpenAIServer,
) -> None:
    model, resources = _remote(server, None)
    with plait.ExecutionSettings(resources=resources):
        output = model.run_sync("[[reply:Sorry, I cannot help.]]")
    # The fake answers the re-ask (no directive in its last turn) with the schema's enum.
    assert output == "billing"
    _, second = (r["body"] for r in server.stats(bodies=True)["requests"])
    reask = second["messages"][-1]["content"]
    assert "is none of them" in reask
    assert "Answer with exactly one of: billing, shipping, technical, account." in reask


def test_logprob_scoring_on_an_openai_endpoint(server: FakeOpenAIServer) -> None:
    model, resources = _remote(server, "logprob")
    with plait.ExecutionSettings(resources=resources):
        output = model.run_sync("[[top:The -0.2|Tech -1.0|bill -1.5|ship -3.0]]")
    assert output == "technical"
    (record,) = server.stats(bodies=True)["requests"]
    assert record["body"]["max_tokens"] == 1 and record["body"]["top_logprobs"] == 20
    assert "response_format" not in record["body"]


def test_calibration_on_an_openai_endpoint_measures_the_prior_once(
    server: FakeOpenAIServer,
) -> None:
    model, resources = _remote(server, "calibrated")
    # The content-free input gets the fake's default reply, whose first word is the
    # system prompt's: no label begins it, so the prior is flat and leaves the order.
    with plait.ExecutionSettings(resources=resources):
        outputs = model.run_sync(["[[top:bill -0.5|ship -0.9]]", "[[top:ship -0.4|bill -0.6]]"])
    assert outputs == ["billing", "shipping"]
    sent = [r["body"]["messages"][-1]["content"] for r in server.stats(bodies=True)["requests"]]
    assert sent.count("N/A") == 1 and len(sent) == 3


def test_a_prior_measured_by_a_stored_call_is_not_measured_again(
    server: FakeOpenAIServer, tmp_path: Any
) -> None:
    """A second run whose first call is answered from the cache (as a resumed run's
    are from its checkpoint) takes the prior that call was divided by: the next call
    on the same prompt sends only itself."""
    from plait.handlers import cache

    first, second = "[[top:bill -0.5|ship -0.9]]", "[[top:ship -0.4|bill -0.6]]"
    model, resources = _remote(server, "calibrated")
    with plait.ExecutionSettings(resources=resources), cache(tmp_path / "calls.db"):
        assert model.run_sync(first) == "billing"
    assert len(server.stats()["requests"]) == 2  # the call and its prior
    model, resources = _remote(server, "calibrated")  # new endpoints, nothing measured
    with plait.ExecutionSettings(resources=resources), cache(tmp_path / "calls.db"):
        assert model.run_sync([first, second]) == ["billing", "shipping"]
    sent = [r["body"]["messages"][-1]["content"] for r in server.stats(bodies=True)["requests"]]
    assert sent[2:] == [second]


def test_with_no_label_among_the_alternatives_the_schema_answers(
    server: FakeOpenAIServer,
) -> None:
    model, resources = _remote(server, "logprob")
    with plait.ExecutionSettings(resources=resources):
        output = model.run_sync("[[top:Hello -0.1|World -0.5]]")
    assert output == "billing"  # the fake's minimal instance of the enum schema
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    assert [("response_format" in b) for b in bodies] == [False, True]


def test_anthropic_refuses_scoring_by_log_probability_with_a_clear_error() -> None:
    from plait.providers.anthropic import AnthropicProvider
    from plait.providers.base import ProviderError
    from plait.resources.config import EndpointConfig as Config

    provider = AnthropicProvider(Config(provider="anthropic", model="claude", api_key="k"))
    request = LLMRequest(
        "a", [{"role": "user", "content": "hi"}], response_format=Topic, label_method="logprob"
    )
    with pytest.raises(ProviderError, match="Anthropic's API does not return"):
        asyncio.run(provider.send(request))


def test_a_label_call_tells_the_model_its_labels(server: FakeOpenAIServer) -> None:
    model, resources = _remote(server, None)
    with plait.ExecutionSettings(resources=resources):
        model.run_sync("Where is my parcel?")
    (record,) = server.stats(bodies=True)["requests"]
    system = record["body"]["messages"][0]
    assert system == {
        "role": "system",
        "content": SYSTEM
        + "\n\nAnswer with exactly one of: billing, shipping, technical, account.",
    }


def test_concurrent_calls_share_one_prior_measurement_and_a_failure_is_not_kept() -> None:
    from plait.providers.scoring import LabelPriors

    priors = LabelPriors()
    measured: list[int] = []
    gate: asyncio.Event

    async def measure() -> dict[str, float]:
        measured.append(1)
        await gate.wait()
        return {"yes": -1.0, "no": -2.0}

    async def many() -> list[tuple[dict[str, float], bool]]:
        nonlocal gate
        gate = asyncio.Event()
        calls = [asyncio.ensure_future(priors.get("k", measure)) for _ in range(8)]

        async def open_gate() -> None:  # runs after every call has reached its first wait
            gate.set()

        opener = asyncio.ensure_future(open_gate())
        results = list(await asyncio.gather(*calls))
        await opener
        return results

    results = asyncio.run(many())
    assert len(measured) == 1 and [made for _, made in results].count(True) == 1
    assert all(prior == {"yes": -1.0, "no": -2.0} for prior, _ in results)

    async def failing() -> dict[str, float]:
        raise RuntimeError("endpoint down")

    async def fail_then_succeed() -> tuple[dict[str, float], bool]:
        with pytest.raises(RuntimeError, match="endpoint down"):
            await priors.get("other", failing)

        async def works() -> dict[str, float]:
            return {"yes": 0.0, "no": 0.0}

        return await priors.get("other", works)

    assert asyncio.run(fail_then_succeed()) == ({"yes": 0.0, "no": 0.0}, True)


def test_a_stored_label_reply_keeps_each_labels_probability() -> None:
    """What a cache or a checkpoint stores of a scored label call reads back with its
    probabilities: a resumed run's replies are the ones the first run got."""
    from plait.handlers.llm import response_from_json, response_to_json
    from plait.providers import LLMResponse, Usage

    request = LLMRequest(
        alias="fast", messages=[{"role": "user", "content": "hi"}], response_format=Topic
    )
    scores = {"billing": 0.7, "shipping": 0.1, "technical": 0.1, "account": 0.1}
    stored = response_to_json(
        LLMResponse("billing", "billing", Usage(12, 1), "m", "stop", label_scores=scores)
    )
    back = response_from_json(json.loads(json.dumps(stored)), request)
    assert back.label_scores == scores
    assert back.text == back.parsed == "billing" and back.usage.prompt_tokens == 12
    plain = LLMRequest(alias="fast", messages=[{"role": "user", "content": "hi"}])
    unscored = response_from_json(response_to_json(LLMResponse("hi")), plain)
    assert unscored.label_scores is None
