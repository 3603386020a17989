"""Endpoints under stress: faults, retries, rate limits, structured output and usage."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path
from typing import Any, TypedDict

import pydantic
import pytest

import plait
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, echo


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def test_a_faulty_endpoint_still_returns_every_output_exactly_once(
    server: FakeOpenAIServer,
) -> None:
    server.configure(
        latency_ms=2,
        rate_429=0.10,
        rate_500=0.05,
        rate_drop=0.02,
        rate_timeout=0.005,
        retry_after_s=0.01,
        timeout_hang_s=6.0,
        seed=7,
    )
    # A hung request outlasts the client's timeout, so the client gives up on it and
    # retries.  The timeout is long enough that no reply the server did send goes
    # unread, even on a loaded machine: that would be a second completion of its key
    # (1 s was not: a CI run beside three benchmark servers, load 7 on 2 cores, read
    # one reply late).
    resources = make_resources(
        server, model="faulty", max_concurrent=16, max_retries=10, timeout=3.0
    )
    inputs = [f"doc {i}" for i in range(1000)]
    outputs = FanOutFanIn().bind(resources=resources).run_sync(inputs)
    assert outputs == [expected_fan(x) for x in inputs]
    stats = server.stats()
    assert stats["max_in_flight"] <= 16
    # every distinct call succeeded exactly once: a retry re-sent only the failed request
    assert len(stats["completed_by_key"]) == 3000
    assert set(stats["completed_by_key"].values()) == {1}
    codes = stats["status_counts"]
    assert codes.get("429", 0) > 100 and codes.get("500", 0) > 50  # the faults did happen


def _starts(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return sorted(server.stats()["requests"], key=lambda r: r["t_start"])


def _seconds_after(server: FakeOpenAIServer, anchor: float) -> list[float]:
    """When each request reached the server, in arrival order, counted from ``anchor``.

    ``anchor`` is a `time.monotonic()` the test took before the run; the server stamps
    arrivals on the same clock.  A request reaches the server after the client sent it,
    so a loaded machine only makes these later: the limits below are lower bounds on them
    that the rate limiter has to enforce, and no machine is too slow to meet them.
    """
    stats = server.stats()
    return [stats["t0_monotonic"] + r["t_start"] - anchor for r in _starts(server)]


def test_requests_per_minute_holds(server: FakeOpenAIServer) -> None:
    rpm = 600  # 10 a second, a burst of one second's worth
    rate = burst = rpm / 60
    anchor = time.monotonic()
    resources = make_resources(server, model="rpm", max_concurrent=50, requests_per_minute=rpm)
    Echo("fast").bind(resources=resources).run_sync([f"q{i}" for i in range(35)])
    arrivals = _seconds_after(server, anchor)
    assert len(arrivals) == 35
    # By time t the limiter has let at most burst + rate * t requests go, so the n-th
    # arrival comes no sooner than (n - burst) / rate; the +1 absorbs float rounding.
    for n, t in enumerate(arrivals, start=1):
        assert n <= burst + rate * t + 1, (n, t)


def test_tokens_per_minute_holds(server: FakeOpenAIServer) -> None:
    tpm = 12_000  # 200 tokens a second
    rate = burst = tpm / 60
    largest = 40 + 10  # a request may overdraw by at most its own estimate
    anchor = time.monotonic()
    resources = make_resources(server, model="tpm", max_concurrent=50, tokens_per_minute=tpm)
    pipeline = plait.LLMInference("fast", max_tokens=40)
    pipeline.bind(resources=resources).run_sync([f"question number {i:03d}" for i in range(40)])
    arrivals = _seconds_after(server, anchor)
    records = _starts(server)
    assert len(records) == 40
    # The tokens of every request that has arrived by time t were drawn by then.
    total = 0
    for record, t in zip(records, arrivals, strict=True):
        total += record["prompt_tokens"] + record["completion_tokens"]
        assert total <= burst + rate * t + largest, (total, t)


@pytest.mark.parametrize("status", [400, 401, 404])
def test_non_retryable_errors_fail_fast_with_the_server_message(
    server: FakeOpenAIServer, status: int
) -> None:
    resources = make_resources(server, model="strict", max_retries=5)
    with pytest.raises(plait.ExecutionError) as info:
        Echo("fast").bind(resources=resources).run_sync(f"[[status:{status}]]hello")
    assert server.stats()["requests_total"] == 1
    message = info.value.value.meta["message"]
    assert f"HTTP {status}" in message
    assert "sk-test" not in message


def test_a_retryable_error_that_persists_reports_the_attempts(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, model="flaky", max_retries=2)
    with pytest.raises(plait.ExecutionError) as info:
        Echo("fast").bind(resources=resources).run_sync("[[status:503]]hello")
    assert server.stats()["requests_total"] == 3
    assert "gave up after 3 attempts" in info.value.value.meta["message"]


class Person(pydantic.BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Movie(TypedDict):
    title: str
    year: int


@pytest.mark.parametrize(
    ("response_format", "check"),
    [
        (Person, lambda v: isinstance(v, Person)),
        (Point, lambda v: isinstance(v, Point)),
        (Movie, lambda v: isinstance(v, dict) and set(v) == {"title", "year"}),
        (list[str], lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v)),
        (dict[str, int], lambda v: isinstance(v, dict)),
    ],
)
def test_structured_output_returns_the_typed_object(
    resources: plait.ResourceConfig, response_format: Any, check: Any
) -> None:
    module = plait.LLMInference("fast", response_format=response_format).bind(resources=resources)
    module.train()
    value = module.run_sync("describe it")
    assert isinstance(value, plait.Value) and value.kind is plait.ValueKind.STRUCTURED
    assert check(value.payload)


def test_an_invalid_structured_reply_is_re_asked_once(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    reset_usage()
    module = plait.LLMInference("fast", response_format=Person).bind(resources=resources)
    person = module.run_sync("[[reply:not json at all]]who?")
    assert isinstance(person, Person)
    assert server.stats()["requests_total"] == 2
    assert usage()["fast"]["reasks"] == 1


def test_usage_counts_tokens_retries_and_cost(server: FakeOpenAIServer) -> None:
    reset_usage()
    server.configure(rate_429=0.3, retry_after_s=0.01, seed=3)
    resources = make_resources(
        server,
        model="priced",
        max_retries=10,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
    )
    Echo("p").bind(resources=resources).run_sync([f"u{i}" for i in range(40)])
    stats = server.stats()
    row = usage()["fast"]
    assert row["requests"] == stats["requests_total"]
    assert row["rate_limited"] == stats["status_counts"].get("429", 0) > 0
    assert row["retries"] == row["rate_limited"]
    served = [r for r in stats["requests"] if r["status"] == 200]
    assert row["prompt_tokens"] == sum(r["prompt_tokens"] for r in served)
    assert row["completion_tokens"] == sum(r["completion_tokens"] for r in served)
    expected_cost = (row["prompt_tokens"] * 1.0 + row["completion_tokens"] * 2.0) / 1e6
    assert row["cost_usd"] == pytest.approx(expected_cost)
    assert 0 < row["latency_p50_s"] <= row["latency_p90_s"]

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=160).print(usage().table())
    assert "openai/priced" in out.getvalue() and "$" in out.getvalue()


def test_resource_config_loads_toml_and_yaml(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PLAIT_TEST_KEY", "sk-from-env")
    toml = tmp_path / "resources.toml"
    toml.write_text(
        '[resources.fast]\nprovider = "openai"\nmodel = "m"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "PLAIT_TEST_KEY"\n'
        "max_concurrent = 4\nrequests_per_minute = 100\n"
    )
    yaml = tmp_path / "resources.yaml"
    yaml.write_text("smart:\n  model: big\n  api_key_env: PLAIT_TEST_KEY\n  max_concurrent: 2\n")
    fast = plait.ResourceConfig.load(toml)["fast"]
    assert fast.max_concurrent == 4 and fast.requests_per_minute == 100
    assert fast.resolved_api_key() == "sk-from-env"
    assert plait.ResourceConfig.load(yaml)["smart"].model == "big"
    assert "sk-from-env" not in repr(plait.ResourceConfig.load(toml))


def test_resource_file_errors_name_the_file_alias_and_variable(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.delenv("PLAIT_MISSING_KEY", raising=False)
    bad = tmp_path / "r.toml"
    bad.write_text('[fast]\nmodel = "m"\napi_key_env = "PLAIT_MISSING_KEY"\n')
    with pytest.raises(plait.ConfigurationError, match=r"r\.toml.*'fast'.*PLAIT_MISSING_KEY"):
        plait.ResourceConfig.load(bad)
    broken = tmp_path / "r.yaml"
    broken.write_text("fast: [unclosed\n")
    with pytest.raises(plait.ConfigurationError, match="not valid YAML"):
        plait.ResourceConfig.load(broken)
    with pytest.raises(plait.ConfigurationError, match=r"\.toml, \.yaml or \.yml"):
        plait.ResourceConfig.load(tmp_path / "r.json")


def test_a_429_halves_concurrency_and_successes_win_it_back() -> None:
    from plait.resources.limits import PriorityLimiter
    from plait.resources.rate import RateGovernor

    limiter = PriorityLimiter(16)
    governor = RateGovernor(limiter, 16, None, None)
    governor.rate_limited(retry_after=None)
    assert limiter.limit == 8
    governor.rate_limited(retry_after=None)  # the same burst of 429s: no second cut
    assert limiter.limit == 8
    successes = 0
    while limiter.limit < 16:
        governor.settle(10, 10)
        successes += 1
        assert successes < 200
    # additive increase: one slot per window of successes, so 8 -> 16 takes ~8+9+...+15
    assert successes == sum(range(8, 16))


def test_retry_after_pauses_every_sender(server: FakeOpenAIServer) -> None:
    server.configure(retry_after_s=0.4)
    resources = make_resources(server, model="pause", max_concurrent=4, max_retries=3)
    inputs = ["[[status:429]]first"] + [f"later {i}" for i in range(6)]
    pipeline = Echo("fast").bind(resources=resources, max_inputs_in_flight=1)
    out = pipeline.run_sync(inputs)
    assert isinstance(out[0], plait.Value) and out[0].is_error  # 429 every time: gave up
    records = _starts(server)
    first_429 = records[0]["t_end"]
    later = [r for r in records if r["status"] == 200]
    assert len(later) == 6
    # after the first 429 nothing is sent until its Retry-After has passed
    assert all(r["t_start"] >= first_429 + 0.4 * 0.95 for r in records[1:])


async def test_an_hour_long_retry_after_never_stalls_the_endpoint(
    server: FakeOpenAIServer,
) -> None:
    import asyncio

    server.configure(retry_after_s=3600.0)  # every 429 asks for an hour
    resources = make_resources(server, model="hour-long-429", max_retries=2, max_retry_after_s=0.05)
    pipeline = Echo("e").bind(resources=resources)
    # the guard only turns an hour's stall into a failure; nothing here is timed
    outs = await asyncio.wait_for(pipeline(["[[status:429]]stuck", "b", "c"]), 120)
    assert outs[1:] == ["[e] b", "[e] c"]  # the others went on
    failed = outs[0]
    assert isinstance(failed, plait.Value) and failed.is_error
    message = failed.meta["message"]
    assert "gave up after 3 attempts" in message
    assert (
        "asked to wait 3600 s (retry-after-ms header), more than this alias's "
        "max_retry_after_s=0.05" in message
    )
    assert server.stats()["status_counts"] == {"429": 3, "200": 2}


def test_max_retry_after_must_be_positive() -> None:
    with pytest.raises(plait.ConfigurationError, match="max_retry_after_s"):
        plait.ResourceConfig({"a": {"model": "m", "max_retry_after_s": 0}})


def test_the_endpoints_pages_resources_file_loads_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resources.toml the endpoints guide has a reader write loads, each alias with
    the provider and model it shows."""
    from tests.page_runner import load_page

    root = Path(__file__).resolve().parent.parent
    page = load_page(root / "docs" / "how-to" / "endpoints-and-keys.md", root)
    block = next(b.body for b in page.blocks if b.title == "resources.toml")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-page")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-page")
    config = plait.ResourceConfig.load(_write(tmp_path, block))
    assert (config["fast"].provider, config["fast"].model) == ("openai", "gpt-4o-mini")
    assert config["claude"].provider == "anthropic"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "resources.toml"
    path.write_text(text)
    return path
