"""Fallbacks: a call its alias cannot answer moves on to the next alias of its chain.

Two real fake servers on 127.0.0.1 play two providers: ``primary`` is made to fail
(HTTP 5xx, 429s asking for long waits, a wrong key, a withdrawn path, a closed
port) and ``backup`` answers, with a model name and prices of its own.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers.budgeting import budget
from plait.providers.base import LLMRequest
from plait.resources.routing import CircuitBreaker, breaker_for, failure_kind, reset_breakers
from plait.testing import FakeOpenAIServer

from .conftest import reset_fake_openai

PRICES = {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 2000.0}


@pytest.fixture(scope="module")
def primary_process() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def backup_process() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture()
def primary(primary_process: FakeOpenAIServer) -> FakeOpenAIServer:
    reset_fake_openai(primary_process)
    return primary_process


@pytest.fixture()
def backup(backup_process: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    reset_fake_openai(backup_process)
    reset_breakers()
    plait.reset_usage()
    yield backup_process
    reset_breakers()


def chain(
    primary: FakeOpenAIServer | str, backup: FakeOpenAIServer, **smart: Any
) -> plait.ResourceConfig:
    """``smart`` on the primary falling back on ``backup`` (another model, dearer)."""
    url = primary if isinstance(primary, str) else primary.base_url
    first = {"model": "primary-m", "base_url": url, "api_key": "sk-test", "max_retries": 1}
    second = {"model": "backup-m", "base_url": backup.base_url, "api_key": "sk-test", **PRICES}
    return plait.ResourceConfig(
        {"smart": {**first, "fallbacks": ["backup"], **smart}, "backup": second}
    )


def requests_to(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


def test_calls_the_primary_fails_are_answered_by_the_fallback(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_500=1.0)
    resources = chain(primary, backup, breaker_failures=100)
    llm = plait.LLMInference("smart", "Be brief.").bind(resources=resources)
    inputs = [f"question {i}" for i in range(6)]
    assert llm.run_sync(inputs) == [f"[Be brief.] {text}" for text in inputs]
    # each call tried the primary twice (one retry), then the backup once
    assert primary.stats()["status_counts"] == {"500": 12}
    assert backup.stats()["status_counts"] == {"200": 6}
    assert {r["model"] for r in backup.stats()["requests"]} == {"backup-m"}
    usage = plait.usage()
    assert usage["smart"]["moved_on"] == 6 and usage["smart"]["failed"] == 6
    assert usage["smart"]["cost_usd"] is None  # the primary answered nothing, priced nothing
    assert usage["backup"]["succeeded"] == 6
    records = backup.stats()["requests"]
    spent = sum(r["prompt_tokens"] * 1000.0 + r["completion_tokens"] * 2000.0 for r in records)
    assert usage["backup"]["cost_usd"] == pytest.approx(spent / 1e6)


def test_the_reply_says_which_alias_answered(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_500=1.0)
    manager = plait.ResourceManager(chain(primary, backup, max_retries=0))
    request = LLMRequest("smart", [{"role": "user", "content": "hi"}])

    async def ask() -> Any:
        return await manager.endpoint("smart").complete(request)

    import asyncio

    response = asyncio.run(ask())
    assert response.fallback == "backup" and response.model == "backup-m"


def test_a_400_fails_the_call_and_never_moves_on(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    llm = plait.LLMInference("smart").bind(resources=chain(primary, backup))
    [failed] = llm.run_sync(["bad [[status:400]]"])
    assert isinstance(failed, plait.Value) and failed.is_error
    assert "HTTP 400" in failed.meta["message"] and "falling back" not in failed.meta["message"]
    assert requests_to(primary) == 1 and requests_to(backup) == 0


def test_when_every_alias_fails_the_error_names_each(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_500=1.0)
    backup.configure(rate_500=1.0)
    resources = chain(primary, backup, max_retries=0)
    llm = plait.LLMInference("smart").bind(resources=resources)
    [failed] = llm.run_sync(["x"])
    assert isinstance(failed, plait.Value) and failed.is_error
    message = failed.meta["message"]
    assert "every alias of the chain failed" in message and "smart: HTTP 500" in message


def test_a_429_asking_longer_than_allowed_moves_on_at_once(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_429=1.0, retry_after_s=120)
    resources = chain(primary, backup, max_retries=5, max_retry_after_s=1)
    llm = plait.LLMInference("smart", "S.").bind(resources=resources)
    assert llm.run_sync(["a", "b"]) == ["[S.] a", "[S.] b"]
    assert primary.stats()["status_counts"] == {"429": 2}  # no retry waited there
    assert plait.usage()["smart"]["rate_limited"] == 2


@pytest.mark.parametrize("kind", ["auth", "not_found", "connection"])
def test_a_revoked_key_a_withdrawn_model_and_a_dead_host(
    kind: str, primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    """A 401 moves on only when ``fallback_on`` names ``auth``; a 404 and a refused
    connection move on by default."""
    smart: dict[str, Any] = {"max_retries": 0}
    url: FakeOpenAIServer | str = primary
    if kind == "auth":
        smart["api_key"] = "sk-revoked"
        with FakeOpenAIServer(api_key="sk-test") as strict:
            resources = chain(strict, backup, **smart)
            refused = plait.LLMInference("smart").bind(resources=resources).run_sync(["x"])
            assert isinstance(refused[0], plait.Value) and "HTTP 401" in refused[0].meta["message"]
            smart["fallback_on"] = ["auth", "server_error"]
            resources = chain(strict, backup, **smart)
            llm = plait.LLMInference("smart", "S.").bind(resources=resources)
            assert llm.run_sync(["x"]) == ["[S.] x"]
        return
    if kind == "not_found":
        url = primary.base_url + "/withdrawn"
    else:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    llm = plait.LLMInference("smart", "S.").bind(resources=chain(url, backup, **smart))
    assert llm.run_sync(["x"]) == ["[S.] x"]
    assert plait.usage()["smart"]["moved_on"] == 1


def test_an_open_breaker_sends_calls_straight_to_the_fallback(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_500=1.0)
    resources = chain(
        primary,
        backup,
        max_retries=0,
        max_concurrent=1,
        breaker_failures=2,
        breaker_cooldown_s=3600,
    )
    llm = plait.LLMInference("smart", "S.").bind(resources=resources)
    inputs = [str(i) for i in range(10)]
    assert llm.run_sync(inputs) == [f"[S.] {i}" for i in inputs]
    assert requests_to(primary) == 2  # then the breaker opened
    assert requests_to(backup) == 10
    breaker = breaker_for(resources["smart"])
    assert breaker.state == "open" and breaker.opened == 1


def test_a_probe_after_the_cooldown_closes_the_breaker(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    now = [0.0]
    resources = chain(primary, backup, max_retries=0, breaker_failures=1, breaker_cooldown_s=30)
    breaker_for(resources["smart"]).clock = lambda: now[0]
    llm = plait.LLMInference("smart", "S.").bind(resources=resources)
    primary.configure(rate_500=1.0)
    assert llm.run_sync(["a"]) == ["[S.] a"]
    assert breaker_for(resources["smart"]).state == "open"
    primary.configure(rate_500=0.0)  # the primary is back, but the breaker is still open
    assert llm.run_sync(["b"]) == ["[S.] b"]
    assert requests_to(primary) == 1
    now[0] = 31.0  # the cooldown has passed: the next call probes the primary
    assert breaker_for(resources["smart"]).state == "half-open"
    assert llm.run_sync(["c"]) == ["[S.] c"]
    assert primary.stats()["status_counts"] == {"500": 1, "200": 1}
    assert breaker_for(resources["smart"]).state == "closed"


def test_the_breaker_state_machine() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=3, cooldown_s=10, clock=lambda: now[0])
    for _ in range(2):
        breaker.failed()
    assert breaker.state == "closed" and breaker.admit() is True
    breaker.succeeded()  # a reply resets the count
    for _ in range(2):
        breaker.failed()
    assert breaker.state == "closed"
    breaker.failed()
    assert breaker.state == "open" and breaker.admit() is False
    now[0] = 10.0
    assert breaker.admit() is None  # this call probes
    assert breaker.admit() is False  # one probe at a time
    breaker.failed()  # a failed probe opens it again at once
    assert breaker.state == "open" and breaker.opened == 2
    now[0] = 20.0
    assert breaker.admit() is None
    breaker.abandoned()  # the probe was cancelled: another call may probe
    assert breaker.admit() is None
    breaker.succeeded()
    assert breaker.state == "closed" and breaker.admit() is True


def test_failure_kinds() -> None:
    from plait.providers.base import ProviderError, ReplyFormatError

    assert failure_kind(ProviderError("x", status=503)) == "server_error"
    assert failure_kind(ProviderError("x", status=429)) == "rate_limit"
    assert failure_kind(ProviderError("x", status=404)) == "not_found"
    assert failure_kind(ProviderError("x", status=403)) == "auth"
    assert failure_kind(ProviderError("x", status=400)) is None
    assert failure_kind(ProviderError("x", transport="timeout")) == "timeout"
    assert failure_kind(ProviderError("x", transport="connection")) == "connection"
    assert failure_kind(ReplyFormatError("x")) is None
    assert failure_kind(ProviderError("x")) is None


def test_a_resumed_run_does_not_pay_again_for_a_call_a_fallback_answered(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer, tmp_path: Path
) -> None:
    primary.configure(rate_500=1.0)
    resources = chain(primary, backup, max_retries=0)
    inputs = ["one", "two", "three"]
    first = plait.LLMInference("smart", "S.").bind(
        resources=resources, checkpoint_dir=tmp_path / "ckpt"
    )
    assert first.run_sync(inputs) == [f"[S.] {t}" for t in inputs]
    log = (tmp_path / "ckpt" / "log.jsonl").read_text()
    assert log.count('"fallback":"backup"') == 3
    paid = requests_to(primary), requests_to(backup)
    again = plait.LLMInference("smart", "S.").bind(
        resources=resources, checkpoint_dir=tmp_path / "ckpt"
    )
    assert again.run_sync(inputs) == [f"[S.] {t}" for t in inputs]
    assert (requests_to(primary), requests_to(backup)) == paid


def test_a_budget_counts_the_fallback_at_its_own_price(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    primary.configure(rate_500=1.0)
    resources = chain(primary, backup, max_retries=0, **{k: 0.0 for k in PRICES})
    llm = plait.LLMInference("smart", "S.").bind(resources=resources)
    with budget(max_cost=1.0) as limit:
        llm.run_sync(["a few words"])
    [record] = backup.stats()["requests"]
    spent = (record["prompt_tokens"] * 1000.0 + record["completion_tokens"] * 2000.0) / 1e6
    assert limit.cost == pytest.approx(spent) and spent > 0


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        ({"a": {"fallbacks": ["a"]}}, "names the alias itself"),
        ({"a": {"fallbacks": ["nowhere"]}}, "fallback 'nowhere' is not a configured alias"),
        ({"a": {"fallbacks": ["b", "b"]}, "b": {}}, "names 'b' twice"),
        ({"a": {"fallbacks": ["b"]}, "b": {"fallbacks": ["a"]}}, "cycle: a -> b -> a"),
        ({"a": {"fallback_on": ["bad_request"]}}, "fallback_on"),
        ({"a": {"breaker_failures": 0}}, "breaker_failures"),
    ],
)
def test_bad_fallback_settings_are_refused_at_load(
    aliases: dict[str, dict[str, Any]], message: str
) -> None:
    base = {"model": "m", "api_key": "sk-test"}
    with pytest.raises(plait.ConfigurationError, match=message):
        plait.ResourceConfig({alias: {**base, **spec} for alias, spec in aliases.items()})


def test_a_chain_follows_each_fallbacks_own_fallbacks() -> None:
    from plait.resources.config import fallback_chain

    base = {"model": "m", "api_key": "sk-test"}
    resources = plait.ResourceConfig(
        {
            "a": {**base, "fallbacks": ["b", "c"]},
            "b": {**base, "fallbacks": ["d"]},
            "c": {**base, "fallbacks": ["d"]},
            "d": base,
        }
    )
    assert fallback_chain(resources.fallbacks(), "a") == ["a", "b", "d", "c"]
    assert fallback_chain(resources.fallbacks(), "d") == ["d"]


def test_a_trace_and_a_profile_say_which_alias_answered(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.handlers import otel
    from plait.handlers.profiling import profile

    primary.configure(rate_500=1.0)
    llm = plait.LLMInference("smart").bind(resources=chain(primary, backup, max_retries=0))
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    with otel(provider), profile() as prof:
        llm.run_sync(["x"])
    (call,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    attributes = dict(call.attributes or {})
    assert attributes["plait.alias"] == "smart" and attributes["plait.fallback"] == "backup"
    assert attributes["gen_ai.response.model"] == "backup-m"
    [record] = backup.stats()["requests"]
    spent = (record["prompt_tokens"] * 1000.0 + record["completion_tokens"] * 2000.0) / 1e6
    assert attributes["plait.cost_usd"] == pytest.approx(spent)  # the backup's prices
    attempts = [dict(e.attributes or {}) for e in call.events if e.name == "plait.request"]
    assert [a["plait.alias"] for a in attempts] == ["smart", "backup"]
    requests = [e for e in prof.trace()["traceEvents"] if e.get("name", "").startswith("request")]
    assert sorted((e["name"], e["args"]["alias"]) for e in requests) == [
        ("request", "backup"),
        ("request failed", "smart"),
    ]


def test_plait_check_shows_each_chain_and_refuses_a_cycle(
    backup: FakeOpenAIServer, tmp_path: Path
) -> None:
    from .conftest import plait_cli

    url = backup.base_url
    good = tmp_path / "resources.toml"
    good.write_text(
        f'[smart]\nmodel = "a"\nbase_url = "{url}"\napi_key = "sk-test"\n'
        'fallbacks = ["backup"]\n'
        f'[backup]\nmodel = "b"\nbase_url = "{url}"\napi_key = "sk-test"\n'
    )
    shown = plait_cli("check", "--resources", good, "--no-call", "--json")
    assert shown.returncode == 0, shown.stderr
    steps = {
        row["alias"]: {s["step"]: s["detail"] for s in row["steps"]}
        for row in json.loads(shown.stdout)
    }
    assert steps["smart"]["fallbacks"].startswith("smart -> backup; moves on after: server_error")
    assert "circuit breaker closed" in steps["smart"]["fallbacks"]
    assert "fallbacks" not in steps["backup"]
    table = plait_cli("check", "--resources", good, "--no-call")
    assert table.returncode == 0 and "fallbacks" in table.stdout
    looped = tmp_path / "looped.toml"
    looped.write_text(good.read_text() + 'fallbacks = ["smart"]\n')
    refused = plait_cli("check", "--resources", looped, "--no-call")
    assert refused.returncode == 1
    assert "cycle: smart -> backup -> smart" in " ".join(refused.stderr.split())


def test_many_calls_at_once_through_a_flapping_primary_each_come_back_once(
    primary: FakeOpenAIServer, backup: FakeOpenAIServer
) -> None:
    """Half the primary's requests fail at random and its breaker opens, probes and
    closes again and again while 64 calls are in flight: every input gets its own
    answer, once, from one of the two."""
    primary.configure(rate_500=0.5, seed=7)
    settings = {"max_concurrent": 16, "breaker_failures": 3, "breaker_cooldown_s": 0.001}
    resources = chain(primary, backup, max_retries=0, **settings)
    llm = plait.LLMInference("smart", "S.").bind(resources=resources, max_concurrent=64)
    inputs = [f"input {i} \ud800 {float('nan')}" for i in range(300)]
    assert llm.run_sync(inputs) == [f"[S.] {text}" for text in inputs]
    answered = primary.stats()["status_counts"].get("200", 0)
    assert answered + backup.stats()["status_counts"]["200"] == 300
    assert plait.usage()["smart"]["moved_on"] == 300 - answered
