"""Several deployments of one model behind one alias: calls go where there is headroom.

Three real fake servers play three deployments (regions, keys) of one model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import plait
from plait.resources.routing import reset_breakers
from plait.testing import FakeOpenAIServer

from .conftest import reset_fake_openai


@pytest.fixture(scope="module")
def regions() -> Iterator[list[FakeOpenAIServer]]:
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b, FakeOpenAIServer() as c:
        yield [a, b, c]


@pytest.fixture()
def servers(regions: list[FakeOpenAIServer]) -> Iterator[list[FakeOpenAIServer]]:
    for server in regions:
        reset_fake_openai(server)
    reset_breakers()
    plait.reset_usage()
    yield regions
    reset_breakers()


def pooled(servers: list[FakeOpenAIServer], *own: dict[str, Any], **alias: Any) -> Any:
    deployments = [
        {"base_url": server.base_url, **(own[i] if i < len(own) else {})}
        for i, server in enumerate(servers)
    ]
    settings = {"model": "m", "api_key": "sk-test", "max_retries": 0, **alias}
    return plait.ResourceConfig({"fast": {**settings, "deployments": deployments}})


def served(servers: list[FakeOpenAIServer]) -> list[int]:
    return [int(s.stats()["status_counts"].get("200", 0)) for s in servers]


def test_calls_spread_over_the_deployments(servers: list[FakeOpenAIServer]) -> None:
    for server in servers:
        server.configure(latency_ms=20)
    resources = pooled(servers, max_concurrent=2)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    inputs = [f"q{i}" for i in range(30)]
    assert llm.run_sync(inputs) == [f"[S.] {q}" for q in inputs]
    counts = served(servers)
    assert sum(counts) == 30 and min(counts) > 0
    by_deployment = plait.usage()["fast"]["deployments"]
    assert sorted(by_deployment.values()) == sorted(counts)
    assert all(label.startswith("openai/m @ 127.0.0.1:") for label in by_deployment)


def test_a_deployment_with_no_headroom_is_passed_over(servers: list[FakeOpenAIServer]) -> None:
    slow, free, _ = servers
    resources = pooled(servers[:2], {"requests_per_minute": 6})
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    inputs = [f"q{i}" for i in range(20)]
    assert llm.run_sync(inputs) == [f"[S.] {q}" for q in inputs]
    assert served([slow]) == [1]  # one request a ten-second window: then no headroom
    assert served([free]) == [19]


def test_a_failing_deployment_hands_its_calls_to_the_others(
    servers: list[FakeOpenAIServer],
) -> None:
    servers[1].configure(rate_500=1.0)
    resources = pooled(servers, breaker_failures=2, breaker_cooldown_s=3600)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    inputs = [f"q{i}" for i in range(30)]
    assert llm.run_sync(inputs) == [f"[S.] {q}" for q in inputs]
    assert served(servers)[1] == 0 and sum(served(servers)) == 30
    assert servers[1].stats()["requests_total"] <= 2 + 16  # then its breaker opened


def test_every_deployment_failing_fails_the_call_naming_each(
    servers: list[FakeOpenAIServer],
) -> None:
    for server in servers:
        server.configure(rate_500=1.0)
    llm = plait.LLMInference("fast").bind(resources=pooled(servers))
    [failed] = llm.run_sync(["x"])
    assert isinstance(failed, plait.Value) and failed.is_error
    assert "every alias of the chain failed" in failed.meta["message"]
    assert failed.meta["message"].count("HTTP 500") == 3


def test_each_deployment_has_its_own_key(servers: list[FakeOpenAIServer]) -> None:
    with FakeOpenAIServer(api_key="sk-east") as east, FakeOpenAIServer(api_key="sk-west") as west:
        resources = pooled([east, west], {"api_key": "sk-east"}, {"api_key": "sk-west"})
        llm = plait.LLMInference("fast", "S.").bind(resources=resources)
        assert llm.run_sync(["a", "b", "c", "d"]) == ["[S.] a", "[S.] b", "[S.] c", "[S.] d"]
        assert east.stats()["status_counts"].get("401") is None
        assert west.stats()["status_counts"].get("401") is None


@pytest.mark.parametrize(
    ("deployments", "message"),
    [
        ([{"input_price_per_mtok": 1.0}], "belong to the alias"),
        ([{"fallbacks": ["x"]}], "belong to the alias"),
        ([{"base_url": "http://a/v1"}, {"base_url": "http://a/v1"}], "the same endpoint"),
        ([{"bogus": 1}], "unknown setting"),
        ([{"max_concurrent": 0}], "max_concurrent"),
    ],
)
def test_bad_deployments_are_refused_at_load(
    deployments: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(plait.ConfigurationError, match=message):
        plait.ResourceConfig(
            {"fast": {"model": "m", "api_key": "sk-test", "deployments": deployments}}
        )


def test_looking_at_a_rate_limit_takes_nothing_from_it() -> None:
    from plait.resources.limits import PriorityLimiter
    from plait.resources.rate import RateGovernor

    governor = RateGovernor(PriorityLimiter(4), 4, 60, None)  # one request a second
    assert [governor.peek(10) for _ in range(5)] == [0.0] * 5
    assert governor.wait_time(10) == 0.0  # the one request it holds, still there
    assert governor.peek(10) > 0


def test_plait_check_lists_each_deployment(servers: list[FakeOpenAIServer], tmp_path: Any) -> None:
    import json

    from .conftest import plait_cli

    east, west, _ = servers
    path = tmp_path / "resources.toml"
    path.write_text(
        '[fast]\nmodel = "m"\napi_key = "sk-test"\ndeployments = [\n'
        f'  {{ base_url = "{east.base_url}", requests_per_minute = 600 }},\n'
        f'  {{ base_url = "{west.base_url}" }},\n]\n'
    )
    shown = plait_cli("check", "--resources", path, "--no-call", "--json")
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    detail = {s["step"]: s["detail"] for s in row["steps"]}["deployments"]
    assert f"127.0.0.1:{east.port}/v1 (16 at once, 600/min; circuit breaker closed)" in detail
    assert f"127.0.0.1:{west.port}/v1 (16 at once; circuit breaker closed)" in detail


def test_a_batch_run_sends_an_alias_with_deployments_through_its_first(
    servers: list[FakeOpenAIServer], tmp_path: Any
) -> None:
    for server in servers:
        server.configure(batch_turnaround_s=0.0)
    resources = pooled(servers, batch_idle_s=0.0, batch_poll_s=0.1)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    out = llm.run_sync(["a", "b"], backend="batch", checkpoint_dir=tmp_path / "ckpt")
    assert out == ["[S.] a", "[S.] b"]
    assert [s.batches()["batches_created"] for s in servers] == [1, 0, 0]


def test_a_hedged_copy_goes_to_another_deployment(servers: list[FakeOpenAIServer]) -> None:
    """The first deployment to get the request stalls on it (a slow replica); the copy
    goes to the other deployment, which answers at once."""
    resources = pooled(servers[:2], hedge_after=0.2, max_hedge_fraction=1.0, timeout=60)
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    assert llm.run_sync("x [[stall_once:60]]") == "[S.] x"
    assert [s.stats()["requests_total"] for s in servers[:2]] == [1, 1]
    assert plait.usage()["fast"]["hedged"] == 1


def test_an_alias_whose_deployments_all_fail_falls_back_on_another_alias(
    servers: list[FakeOpenAIServer],
) -> None:
    east, west, backup = servers
    east.configure(rate_500=1.0)
    west.configure(rate_500=1.0)
    deployments = [{"base_url": east.base_url}, {"base_url": west.base_url}]
    fast = {"model": "m", "api_key": "sk-test", "max_retries": 0, "deployments": deployments}
    resources = plait.ResourceConfig(
        {
            "fast": {**fast, "fallbacks": ["backup"]},
            "backup": {"model": "b", "base_url": backup.base_url, "api_key": "sk-test"},
        }
    )
    llm = plait.LLMInference("fast", "S.").bind(resources=resources)
    inputs = [f"q{i}" for i in range(12)]
    assert llm.run_sync(inputs) == [f"[S.] {q}" for q in inputs]
    assert served([backup]) == [12]
    assert plait.usage()["fast"]["moved_on"] == 12
