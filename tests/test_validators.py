"""Validators that re-ask: a rejected reply goes back with its error, within bounds.

The fake server echoes ``[SYSTEM PROMPT] LAST USER MESSAGE``, so a re-ask's reply
quotes the error it was sent, which lets a validator accept the second answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

import plait
from plait.handlers.budgeting import budget
from plait.testing import FakeOpenAIServer


def second_answer(reply: str) -> None:
    """Accept only an answer given after a re-ask."""
    assert "not valid" in reply, "say it again"


def never(reply: str) -> None:
    raise ValueError(f"no digits in {reply[:12]!r}")


def requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    """Each request's record, with its messages."""
    return [{**r, "messages": r["body"]["messages"]} for r in server.stats(bodies=True)["requests"]]


def test_a_rejected_reply_goes_back_with_its_error(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    plait.reset_usage()
    llm = plait.LLMInference("fast", "S.", validate=second_answer).bind(resources=resources)
    out = llm.run_sync("x")
    assert out.startswith("[S.] That reply is not valid: the reply failed a check: say it again")
    _, second = requests(server)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][2]["content"] == "[S.] x"
    assert plait.usage()["fast"]["reasks"] == 1 and plait.usage()["fast"]["requests"] == 2


def test_after_its_re_asks_the_input_fails_naming_the_last_error(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    llm = plait.LLMInference("fast", "S.", validate=never, max_reasks=3)
    [failed, fine] = llm.bind(resources=resources).run_sync(["x", "y"])
    assert isinstance(failed, plait.Value) and failed.is_error
    assert failed.meta["error_type"] == "ReplyFormatError"
    assert "no digits in '[S.] That re'" in failed.meta["message"]
    assert "also after re-asking 3 times" in failed.meta["message"]
    sent = requests(server)
    assert len(sent) == 8  # two inputs, four attempts each
    # each re-ask holds the original messages and the last answer only
    assert sorted(len(r["messages"]) for r in sent) == [2, 2, 4, 4, 4, 4, 4, 4]
    assert isinstance(fine, plait.Value)


def test_a_validator_that_returns_false_rejects_and_a_broken_one_is_not_re_asked(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    def short(reply: str) -> bool:
        return len(reply) < 5

    def broken(reply: str) -> None:
        raise TypeError("a bug in the validator")

    rejected = plait.LLMInference("fast", validate=short, max_reasks=0).bind(resources=resources)
    [value] = rejected.run_sync(["a long enough text"])
    assert isinstance(value, plait.Value) and "rejected by short" in value.meta["message"]
    buggy = plait.LLMInference("fast", validate=broken, max_reasks=5).bind(resources=resources)
    [value] = buggy.run_sync(["x"])
    assert isinstance(value, plait.Value) and value.meta["error_type"] == "TypeError"
    assert len(requests(server)) == 2  # one each: a bug is not the model's to fix


class Invoice(BaseModel):
    total: float

    @field_validator("total")
    @classmethod
    def positive(cls, total: float) -> float:
        if total <= 0:
            raise ValueError("the total must be positive")
        return total


def test_pydantic_validators_on_the_response_format_drive_the_re_asks(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    # The fake server answers a schema with its minimal instance: a total of 0.
    llm = plait.LLMInference("fast", response_format=Invoice, max_reasks=2)
    [failed] = llm.bind(resources=resources).run_sync(["Total: 12 EUR"])
    assert (
        isinstance(failed, plait.Value) and "the total must be positive" in failed.meta["message"]
    )
    sent = requests(server)
    assert len(sent) == 3
    assert "the total must be positive" in sent[1]["messages"][-1]["content"]


def test_every_attempt_is_counted_in_a_budget_as_it_is_sent(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    llm = plait.LLMInference("fast", "S.", validate=never, max_reasks=2).bind(resources=resources)
    with budget(max_tokens=100_000) as limit:
        llm.run_sync(["x"])
    sent = requests(server)
    assert len(sent) == 3
    assert limit.tokens == sum(r["prompt_tokens"] + r["completion_tokens"] for r in sent)


def test_a_budget_refuses_the_re_ask_that_would_pass_it(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    llm = plait.LLMInference("fast", "S.", validate=never, max_reasks=5, max_tokens=20)
    with budget(max_calls=1, max_tokens=150) as limit:
        [failed] = llm.bind(resources=resources).run_sync(["x"])
    assert isinstance(failed, plait.Value) and failed.meta["error_type"] == "BudgetExceeded"
    assert 1 <= len(requests(server)) < 6 and limit.refused == 1


def test_max_tokens_per_call_bounds_the_attempts_together(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    llm = plait.LLMInference("fast", "S.", validate=never, max_reasks=50, max_tokens_per_call=120)
    [failed] = llm.bind(resources=resources).run_sync(["x"])
    assert isinstance(failed, plait.Value)
    assert "max_tokens_per_call=120" in failed.meta["message"]
    sent = requests(server)
    assert 1 < len(sent) < 51
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in sent) <= 120


def test_a_resumed_run_does_not_pay_again_for_a_call_that_needed_re_asks(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    def make() -> Any:
        return plait.LLMInference("fast", "S.", validate=second_answer).bind(
            resources=resources, checkpoint_dir=tmp_path / "ckpt"
        )

    first = make().run_sync(["a", "b"])
    paid = len(requests(server))
    assert make().run_sync(["a", "b"]) == first and len(requests(server)) == paid == 4


def test_bad_validator_settings_are_refused_where_the_call_is_made() -> None:
    with pytest.raises(TypeError, match="takes a function of the reply"):
        plait.LLMInference("fast", validate="digits")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_reasks"):
        plait.LLMInference("fast", max_reasks=-1)
    with pytest.raises(ValueError, match="max_tokens_per_call"):
        plait.LLMInference("fast", max_tokens_per_call=0)


def test_the_functional_calls_re_ask_as_llm_inference_does(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    """`complete` and `chat_complete` take the same reply checks as `LLMInference`."""
    import asyncio

    import plait.functional as F

    async def calls() -> tuple[plait.Value, plait.Value]:
        good = await F.complete(
            "fast", "x", system="S.", validate=second_answer, resources=resources
        )
        bad = await F.chat_complete(
            "fast",
            [F.system("S."), F.user("y")],
            validate=never,
            max_reasks=2,
            resources=resources,
        )
        return good, bad

    good, bad = asyncio.run(calls())
    assert F.text_of(good).startswith("[S.] That reply is not valid: the reply failed a check")
    assert bad.is_error and "also after re-asking 2 times" in bad.meta["message"]
    assert len(requests(server)) == 2 + 3
    with pytest.raises(TypeError, match=r"complete\(validate=\.\.\.\) takes a function"):
        asyncio.run(F.complete("fast", "x", validate="digits", resources=resources))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"chat_complete\(max_reasks=\.\.\.\)"):
        asyncio.run(F.chat_complete("fast", [F.user("x")], max_reasks=-1, resources=resources))


def test_a_validator_is_part_of_the_cache_key(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    from plait.providers.base import LLMRequest

    plain = LLMRequest("fast", [{"role": "user", "content": "x"}])
    checked = LLMRequest("fast", [{"role": "user", "content": "x"}], validate=never)
    assert plain.fingerprint() != checked.fingerprint()
    assert checked.checks() == [f"validate={__name__}.never"]


def test_many_inputs_at_once_each_re_asked_on_their_own(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    inputs = [f"in {i} \ud800 {float('inf')}" for i in range(100)]
    llm = plait.LLMInference("fast", "S.", validate=second_answer)
    out = llm.bind(resources=resources, max_concurrent=32).run_sync(inputs)
    assert all(isinstance(o, str) and "not valid" in o for o in out)
    sent = requests(server)
    assert len(sent) == 200
    answered = {r["messages"][2]["content"] for r in sent if len(r["messages"]) == 4}
    assert answered == {f"[S.] {text}" for text in inputs}
