"""The flex tier and prompt caching placed by plait (issue 22), over real HTTP.

Flex against the fake OpenAI server, which refuses a share of flex requests with
OpenAI's 429 ``resource_unavailable``; prompt caching against the fake Anthropic
server, which caches prompt prefixes at ``cache_control`` marks and reports cache
reads and writes in usage as Anthropic does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import plait
from plait.execution.calls import manager_for
from plait.handlers import profile
from plait.testing import FakeAnthropicServer, FakeOpenAIServer

from .conftest import make_resources

KEY = "sk-ant-cost-test"
PRICES = {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 2000.0}
#: A system prompt long enough to be cached (about 1,500 tokens by the usual estimate).
LONG_RULES = "Follow the house style guide to the letter. " * 140


@pytest.fixture(autouse=True)
def _fresh_usage(anthropic_environment: None) -> None:
    plait.reset_usage()


@pytest.fixture(scope="module")
def anthropic_process() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(api_key=KEY) as server:
        yield server


@pytest.fixture()
def anthropic(anthropic_process: FakeAnthropicServer) -> FakeAnthropicServer:
    anthropic_process.reset()
    anthropic_process.configure(batch_turnaround_s=0.05)
    return anthropic_process


def anthropic_resources(server: FakeAnthropicServer, **settings: Any) -> plait.ResourceConfig:
    alias = {
        "provider": "anthropic",
        "model": "claude-test",
        "base_url": server.base_url,
        "api_key": KEY,
        **settings,
    }
    return plait.ResourceConfig({"fast": alias})


# -- flex --------------------------------------------------------------------------------
def test_flex_is_sent_priced_at_its_tier_and_out_of_capacity_429s_are_retried_apart(
    server: FakeOpenAIServer,
) -> None:
    server.configure(rate_flex_unavailable=0.4, seed=7)
    # A model name of its own: an endpoint's limits are process-wide, and another test's
    # 429s on the session's server must not decide what this one sees.
    resources = make_resources(
        server, service_tier="flex", max_retries=10, max_retry_after_s=0.05, max_concurrent=4,
        model="flex-model", **PRICES,
    )  # fmt: skip
    module = plait.LLMInference("fast").bind(resources=resources)
    docs = [f"question {i}" for i in range(12)]
    assert module.run_sync(docs) == docs

    stats = server.stats(bodies=True)
    assert all(r["body"]["service_tier"] == "flex" for r in stats["requests"])
    refused = stats["status_counts"].get("429", 0)
    assert refused > 0 and stats["requests_total"] == len(docs) + refused
    row = plait.usage()["fast"]
    assert row["flex_requests"] == len(docs)
    assert row["unavailable"] == refused and row["rate_limited"] == 0
    cost = (row["prompt_tokens"] * 1000.0 + row["completion_tokens"] * 2000.0) / 1e6
    assert row["cost_usd"] == pytest.approx(cost * 0.5)
    # Out of capacity is the tier's state, not this client's pace: the limit stands.
    endpoint = manager_for(resources).endpoint("fast")
    assert endpoint.limiter.limit == 4 and endpoint.governor.paused_until == 0.0


def test_an_ordinary_429_still_slows_the_endpoint(server: FakeOpenAIServer) -> None:
    server.configure(rate_429=1.0, retry_after_s=0.01)
    module = plait.LLMInference("fast").bind(
        resources=make_resources(server, service_tier="flex", max_retries=0)
    )
    module.train()
    [row] = module.run_sync(["question"])
    assert row.kind is plait.ValueKind.ERROR
    usage = plait.usage()["fast"]
    assert usage["rate_limited"] == 1 and usage["unavailable"] == 0


# -- prompt caching ----------------------------------------------------------------------
def test_a_call_sites_long_fixed_prefix_is_marked_for_the_cache_and_priced_as_cached(
    anthropic: FakeAnthropicServer,
) -> None:
    module = plait.LLMInference("fast", system_prompt=LONG_RULES).bind(
        resources=anthropic_resources(anthropic, max_concurrent=1, **PRICES)
    )
    docs = [f"question {i}" for i in range(4)]
    module.run_sync(docs)

    requests = anthropic.stats()["requests"]
    systems = [r["body"]["system"] for r in requests]
    assert all(isinstance(s, list) and s[-1]["cache_control"] == {"type": "ephemeral"}
               for s in systems)  # fmt: skip
    writes = [r["cache"]["write"] for r in requests]
    reads = [r["cache"]["read"] for r in requests]
    assert writes[0] > 1000 and writes[1:] == [0, 0, 0]
    assert reads[0] == 0 and all(read == writes[0] for read in reads[1:])
    row = plait.usage()["fast"]
    assert row["cache_write_tokens"] == writes[0] and row["cache_read_tokens"] == 3 * writes[0]
    plain = row["prompt_tokens"] - row["cache_read_tokens"] - row["cache_write_tokens"]
    prompt = plain + 0.1 * row["cache_read_tokens"] + 1.25 * row["cache_write_tokens"]
    cost = (prompt * 1000.0 + row["completion_tokens"] * 2000.0) / 1e6
    assert row["cost_usd"] == pytest.approx(cost)


def test_a_short_prefix_is_not_marked_and_caching_can_be_turned_off(
    anthropic: FakeAnthropicServer,
) -> None:
    short = plait.LLMInference("fast", system_prompt="Be brief.")
    short.bind(resources=anthropic_resources(anthropic)).run_sync(["a", "b"])
    off = plait.LLMInference("fast", system_prompt=LONG_RULES)
    off.bind(resources=anthropic_resources(anthropic, prompt_caching=False)).run_sync(["a"])
    for request in anthropic.stats()["requests"]:
        assert isinstance(request["body"]["system"], str)
    assert plait.usage()["fast"]["cache_read_tokens"] == 0


def test_batched_calls_mark_their_prefix_for_an_hour(anthropic: FakeAnthropicServer) -> None:
    module = plait.LLMInference("fast", system_prompt=LONG_RULES).bind(
        resources=anthropic_resources(
            anthropic, batch_idle_s=0.05, batch_poll_s=0.05, batch_max_requests=1
        )
    )
    module.run_sync([f"question {i}" for i in range(3)], backend="batch")
    stats = anthropic.batches()
    assert stats["batches_total"] == 3
    assert stats["cache"]["write_tokens"] > 1000 and stats["cache"]["read_tokens"] > 1000
    row = plait.usage()["fast"]
    assert row["batch_requests"] == 3 and row["cache_read_tokens"] > 0


def test_openai_requests_carry_one_prompt_cache_key_per_call_site(
    server: FakeOpenAIServer,
) -> None:
    class TwoSites(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = plait.LLMInference("fast", system_prompt="One.")
            self.second = plait.LLMInference("fast", system_prompt="Two.")

        def forward(self, doc: str) -> Any:
            return self.second(self.first(doc))

    TwoSites().bind(resources=make_resources(server)).run_sync(["a", "b", "c"])
    keys: dict[str, set[str]] = {}
    for request in server.stats(bodies=True)["requests"]:
        body = request["body"]
        keys.setdefault(body["messages"][0]["content"], set()).add(body["prompt_cache_key"])
    assert set(keys) == {"One.", "Two."}
    assert all(len(found) == 1 for found in keys.values())
    assert keys["One."] != keys["Two."]


def test_the_profile_warns_once_about_fixed_text_after_varying_text(
    server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    class Backwards(plait.Module):
        """The document first, then the long instructions: nothing can be cached."""

        def __init__(self) -> None:
            super().__init__()
            self.llm = plait.LLMInference("fast")

        def forward(self, doc: str) -> Any:
            return self.llm(f"{doc}\n\n{LONG_RULES}")

    module = Backwards().bind(resources=make_resources(server))
    with caplog.at_level(logging.WARNING, logger="plait"), profile() as prof:
        module.run_sync([f"document {i}" for i in range(5)])
    [advice] = prof.summary().cache_advice
    assert advice.site == "llm" and advice.calls == 5 and advice.fixed_tokens > 1000
    assert advice.tokens_saved == 4 * advice.fixed_tokens
    assert caplog.text.count("put the fixed text first") == 1

    with profile() as good:  # instructions first: nothing to advise
        plait.LLMInference("fast", system_prompt=LONG_RULES).bind(
            resources=make_resources(server)
        ).run_sync([f"document {i}" for i in range(3)])
    assert good.summary().cache_advice == []
