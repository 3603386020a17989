"""Cascades: a cheap alias answers first, and a call escalates only when its answer is
not accepted (by a function of the reply, or by the label's probability)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

import plait
from plait.testing import FakeOpenAIServer

CHEAP = {"input_price_per_mtok": 0.1, "output_price_per_mtok": 0.4}
STRONG = {"input_price_per_mtok": 10.0, "output_price_per_mtok": 40.0}


def tiers(server: FakeOpenAIServer) -> plait.ResourceConfig:
    common = {"base_url": server.base_url, "api_key": "sk-test"}
    return plait.ResourceConfig(
        {
            "fast": {**common, "model": "cheap", **CHEAP},
            "smart": {**common, "model": "strong", **STRONG},
        }
    )


def models(server: FakeOpenAIServer) -> list[str]:
    return [r["model"] for r in server.stats()["requests"]]


def sure(reply: str) -> bool:
    return "unsure" not in reply


@pytest.fixture()
def fresh_usage() -> None:
    plait.reset_usage()


def test_a_call_escalates_only_when_its_answer_is_not_accepted(
    server: FakeOpenAIServer, fresh_usage: None
) -> None:
    llm = plait.LLMInference("fast", "S.", escalate_to="smart", accept=sure)
    out = llm.bind(resources=tiers(server)).run_sync(["sure: a", "unsure: b", "sure: c"])
    assert out == ["[S.] sure: a", "[S.] unsure: b", "[S.] sure: c"]
    assert sorted(models(server)) == ["cheap", "cheap", "cheap", "strong"]
    usage = plait.usage()
    assert usage["fast"]["escalated"] == 1 and usage["smart"]["requests"] == 1
    # each tier's calls are priced at its own alias's prices
    records = server.stats()["requests"]
    for alias, model, prices in (("fast", "cheap", CHEAP), ("smart", "strong", STRONG)):
        spent = sum(
            r["prompt_tokens"] * prices["input_price_per_mtok"]
            + r["completion_tokens"] * prices["output_price_per_mtok"]
            for r in records
            if r["model"] == model
        )
        assert usage[alias]["cost_usd"] == pytest.approx(spent / 1e6)


def test_a_label_probability_under_the_threshold_escalates(
    server: FakeOpenAIServer, fresh_usage: None
) -> None:
    llm = plait.LLMInference(
        "fast",
        "Is it spam?",
        response_format=Literal["yes", "no"],
        label_method="logprob",
        escalate_to="smart",
        accept=0.8,
    )
    confident, torn = "[[top:yes -0.05|no -4.0]]", "[[top:no -0.7|yes -0.69]]"
    assert llm.bind(resources=tiers(server)).run_sync([confident, torn]) == ["yes", "yes"]
    assert models(server).count("strong") == 1 and models(server).count("cheap") == 2
    assert plait.usage()["fast"]["escalated"] == 1


def test_a_threshold_without_label_probabilities_is_a_clear_error(
    server: FakeOpenAIServer,
) -> None:
    llm = plait.LLMInference(
        "fast", response_format=Literal["yes", "no"], escalate_to="smart", accept=0.8
    )
    [failed] = llm.bind(resources=tiers(server)).run_sync(["x"])
    assert isinstance(failed, plait.Value) and failed.is_error
    assert "label_method='logprob' or 'calibrated'" in failed.meta["message"]


def test_a_tier_that_cannot_answer_in_the_format_asked_for_escalates(
    server: FakeOpenAIServer,
) -> None:
    from pydantic import BaseModel

    class Total(BaseModel):
        total: float

    llm = plait.LLMInference(
        "fast", response_format=Total, max_reasks=0, escalate_to="smart", accept=lambda t: True
    )
    [failed] = llm.bind(resources=tiers(server)).run_sync(["[[reply:no JSON here]]"])
    assert isinstance(failed, plait.Value) and failed.meta["error_type"] == "ReplyFormatError"
    assert models(server) == ["cheap", "strong"]


def test_three_tiers_stop_at_the_first_accepted_answer(server: FakeOpenAIServer) -> None:
    common = {"base_url": server.base_url, "api_key": "sk-test"}
    resources = plait.ResourceConfig(
        {
            "fast": {**common, "model": "cheap"},
            "mid": {**common, "model": "middle"},
            "smart": {**common, "model": "strong"},
        }
    )
    calls: list[str] = []

    def second_time(reply: str) -> bool:
        calls.append(reply)
        return len(calls) > 1

    llm = plait.LLMInference("fast", escalate_to=["mid", "smart"], accept=second_time)
    assert llm.bind(resources=resources).run_sync("x") == "x"
    assert models(server) == ["cheap", "middle"]


def test_a_resumed_run_does_not_pay_again_for_either_tier(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    def make() -> Any:
        llm = plait.LLMInference("fast", "S.", escalate_to="smart", accept=sure)
        return llm.bind(resources=tiers(server), checkpoint_dir=tmp_path / "ckpt")

    first = make().run_sync(["sure", "unsure"])
    assert len(models(server)) == 3
    assert make().run_sync(["sure", "unsure"]) == first and len(models(server)) == 3


def test_many_inputs_at_once_each_take_their_own_tiers(server: FakeOpenAIServer) -> None:
    inputs = [f"{'unsure' if i % 3 == 0 else 'sure'} {i} \ud800 {float('nan')}" for i in range(120)]
    llm = plait.LLMInference("fast", "S.", escalate_to="smart", accept=sure)
    out = llm.bind(resources=tiers(server), max_concurrent=48).run_sync(inputs)
    assert out == [f"[S.] {text}" for text in inputs]
    assert models(server).count("strong") == 40 and models(server).count("cheap") == 120


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"escalate_to": "fast", "accept": sure}, "a cascade to itself"),
        ({"escalate_to": ["smart", "smart"], "accept": sure}, "names an alias twice"),
        ({"accept": sure}, "give escalate_to too"),
        ({"escalate_to": "smart"}, "needs accept="),
        ({"escalate_to": "smart", "accept": 1.5}, r"a probability in \(0, 1\]"),
        ({"escalate_to": "smart", "accept": 0.9}, "must answer with labels"),
        ({"escalate_to": [], "accept": sure}, "an alias, or a list of aliases"),
    ],
)
def test_bad_cascades_are_refused_where_the_call_is_made(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plait.LLMInference("fast", **settings)
