"""Limits learned from the provider's rate-limit headers (issue 25, point 2).

The parsers read both spellings (OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``) and shrug off malformed values; the endpoint adopts what
replies state, against the real fake servers enforcing a limit plait was not told.
The bounds on 429s are counts, never times: the fake server's fixed windows admit
a known number of requests each, and a client that follows the stated remaining
budget until the reset is refused only while it knows nothing yet.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from plait.cli import check
from plait.providers import ratelimits
from plait.providers.base import LLMRequest
from plait.providers.ratelimits import anthropic_limits, openai_limits, parse_duration
from plait.resources.manager import ResourceManager
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeAnthropicServer, FakeOpenAIServer

#: The fake server's limit in the end-to-end tests: 300 requests a minute in 2-second
#: windows, so 10 requests a window; at most 8 in flight, so the first burst (sent
#: before any reply stated anything) fits in one window.
RPM, WINDOW_S, PER_WINDOW, IN_FLIGHT = 300, 2.0, 10, 8


@pytest.fixture(autouse=True)
def _fresh_usage() -> None:
    reset_usage()


def _requests(alias: str, n: int, tag: str = "") -> list[LLMRequest]:
    return [
        LLMRequest(alias=alias, messages=[{"role": "user", "content": f"q{tag}{i}"}], max_tokens=8)
        for i in range(n)
    ]


def _resources(server: FakeOpenAIServer, **settings: Any) -> dict[str, Any]:
    alias = {
        "provider": "openai",
        "model": "m",
        "base_url": server.base_url,
        "api_key": "sk-test",
        "max_concurrent": IN_FLIGHT,
        **settings,
    }
    return {"fast": alias}


async def _complete_all(manager: ResourceManager, requests: list[LLMRequest]) -> list[str]:
    endpoint = manager.endpoint("fast")
    replies = await asyncio.gather(*(endpoint.complete(r) for r in requests))
    return [reply.text for reply in replies]


# -- parsing ------------------------------------------------------------------------------------


def test_openai_headers_are_read_with_their_durations() -> None:
    headers = CIMultiDict(
        {
            "X-RateLimit-Limit-Requests": "5000",
            "x-ratelimit-limit-tokens": "2000000",
            "x-ratelimit-remaining-requests": "4999",
            "x-ratelimit-remaining-tokens": "1999985",
            "x-ratelimit-reset-requests": "12ms",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    limits = openai_limits(headers)
    assert limits is not None
    assert (limits.requests_limit, limits.requests_remaining) == (5000, 4999)
    assert (limits.tokens_limit, limits.tokens_remaining) == (2_000_000, 1_999_985)
    assert limits.requests_reset_s == pytest.approx(0.012)
    assert limits.tokens_reset_s == pytest.approx(360.0)
    assert limits.retry_after_s is None
    assert openai_limits(CIMultiDict({"content-type": "application/json"})) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("0.5s", 0.5), ("20ms", 0.02), ("6m0s", 360.0), ("1h2m3.5s", 3723.5), ("7", 7.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_retry_after_in_milliseconds_seconds_or_an_http_date() -> None:
    ms = openai_limits(CIMultiDict({"retry-after-ms": "1500", "retry-after": "9"}))
    assert ms is not None and ms.retry_after_s == pytest.approx(1.5)
    plain = openai_limits(CIMultiDict({"retry-after": "3"}))
    assert plain is not None and plain.retry_after_s == 3.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    dated = openai_limits(CIMultiDict({"Retry-After": later}))
    assert dated is not None and dated.retry_after_s is not None
    assert 100 < dated.retry_after_s <= 120


def test_anthropic_headers_with_rfc3339_resets() -> None:
    reset = (datetime.now(UTC) + timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    headers = CIMultiDict(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-input-tokens-reset": reset,
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7990",
            "anthropic-ratelimit-output-tokens-reset": reset,
            "retry-after": "4",
        }
    )
    limits = anthropic_limits(headers)
    assert limits is not None
    assert (limits.requests_limit, limits.requests_remaining) == (50, 49)
    assert limits.requests_reset_s is not None and 20 < limits.requests_reset_s <= 30
    # No combined ``tokens`` budget: the strictest of the ones stated is paced.
    assert (limits.tokens_limit, limits.tokens_remaining) == (8000, 7990)
    assert limits.retry_after_s == 4.0
    with_total = CIMultiDict(
        {
            "anthropic-ratelimit-tokens-limit": "90000",
            "anthropic-ratelimit-tokens-remaining": "100",
            "anthropic-ratelimit-output-tokens-limit": "8000",
        }
    )
    total = anthropic_limits(with_total)
    assert total is not None and (total.tokens_limit, total.tokens_remaining) == (90000, 100)
    assert anthropic_limits(CIMultiDict({"x-request-id": "r"})) is None


def test_malformed_headers_are_ignored_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ratelimits, "_warned", set())
    bad = CIMultiDict(
        {
            "x-ratelimit-limit-requests": "lots",
            "x-ratelimit-remaining-requests": "-3",
            "x-ratelimit-reset-requests": "soon",
            "x-ratelimit-limit-tokens": "1000",
            "retry-after": "whenever",
        }
    )
    with caplog.at_level(logging.WARNING, logger="plait"):
        for _ in range(3):
            limits = openai_limits(bad)
            assert limits is not None
            assert limits.requests_limit is None and limits.requests_remaining is None
            assert limits.requests_reset_s is None and limits.retry_after_s is None
            assert limits.tokens_limit == 1000  # the good ones still count
        stale = anthropic_limits(
            CIMultiDict(
                {
                    "anthropic-ratelimit-requests-limit": "50",
                    "anthropic-ratelimit-requests-reset": "tuesday",
                }
            )
        )
    assert stale is not None and stale.requests_limit == 50 and stale.requests_reset_s is None
    warned = [r.getMessage() for r in caplog.records if "does not parse" in r.getMessage()]
    # One per malformed header, however many replies carried it.
    assert len(warned) == 5
    assert any("x-ratelimit-limit-requests" in message for message in warned)


# -- the endpoint adopts them --------------------------------------------------------------------


def test_an_unconfigured_alias_learns_the_limit_and_is_rarely_refused() -> None:
    n = 3 * PER_WINDOW
    with FakeOpenAIServer(api_key="sk-test", rpm_limit=RPM, limit_window_s=WINDOW_S) as server:
        blind = ResourceManager(_resources(server, learn_limits=False, max_retries=10))
        outputs = asyncio.run(_complete_all(blind, _requests("fast", n, "blind")))
        assert len(outputs) == n
        refused_blind = server.stats()["rate_limit"]["refused"]

        server.reset()
        reset_usage()
        learning = ResourceManager(_resources(server, max_retries=10))
        outputs = asyncio.run(_complete_all(learning, _requests("fast", n)))
        assert outputs == [f"q{i}" for i in range(n)]
        stats = server.stats()
        refused = stats["rate_limit"]["refused"]
    # The first IN_FLIGHT requests go before any reply said anything, and fit in a
    # window; after that the stated remaining budget is never overdrawn.
    assert refused <= 1
    assert stats["status_counts"]["200"] == n
    assert usage()["fast"]["rate_limited"] == refused
    # The same run not learning is refused again and again (the server does enforce).
    assert refused_blind >= 3 * max(refused, 1)


def test_an_embedding_model_s_limit_is_learned_from_its_replies_too() -> None:
    """Embedding requests reach ``/embeddings``, whose replies state the embedding
    model's own limit: learned as a chat model's is, so a pool embedded in many small
    requests is rarely refused."""
    n = 3 * PER_WINDOW
    requests = [
        LLMRequest(alias="fast", messages=[{"role": "user", "content": f"text {i}"}], embed=True)
        for i in range(n)
    ]
    with FakeOpenAIServer(api_key="sk-test", rpm_limit=RPM, limit_window_s=WINDOW_S) as server:
        manager = ResourceManager(_resources(server, max_retries=10))
        endpoint = manager.endpoint("fast")
        replies = asyncio.run(_gather(*(endpoint.complete(r) for r in requests)))
        stats = server.stats()
    assert all(len(reply.parsed) == 1 for reply in replies)
    assert stats["status_counts"]["200"] == n
    assert stats["rate_limit"]["refused"] <= 1
    assert endpoint.governor.effective()[0] == RPM
    assert usage()["fast"]["limits"]["requests_per_minute"]["reported"] == RPM


async def _gather(*calls: Any) -> list[Any]:
    return list(await asyncio.gather(*calls))


def test_the_smaller_of_configured_and_reported_wins() -> None:
    with FakeOpenAIServer(
        api_key="sk-test", rpm_limit=600, tpm_limit=60_000, limit_window_s=WINDOW_S
    ) as server:
        stricter = ResourceManager(_resources(server, requests_per_minute=120))
        asyncio.run(_complete_all(stricter, _requests("fast", 2)))
        governor = stricter.endpoint("fast").governor
        assert governor.effective() == (120, 60_000)
        assert governor.requests is not None and governor.requests.per_minute == 120
        row = usage()["fast"]["limits"]
        assert row["requests_per_minute"] == {
            **row["requests_per_minute"],
            "configured": 120,
            "reported": 600,
            "effective": 120,
        }
        assert row["tokens_per_minute"]["configured"] is None
        assert row["tokens_per_minute"]["effective"] == 60_000

        looser = ResourceManager(_resources(server, requests_per_minute=5000))
        asyncio.run(_complete_all(looser, _requests("fast", 2, "b")))
        assert looser.endpoint("fast").governor.effective() == (600, 60_000)


def test_usage_and_check_show_the_learned_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer(
        api_key="sk-test", rpm_limit=RPM, tpm_limit=50_000, limit_window_s=WINDOW_S
    ) as server:
        manager = ResourceManager(_resources(server, tokens_per_minute=20_000))
        asyncio.run(_complete_all(manager, _requests("fast", 3)))
        limits = usage()["fast"]["limits"]
        requests, tokens = limits["requests_per_minute"], limits["tokens_per_minute"]
        assert (requests["configured"], requests["reported"], requests["effective"]) == (
            None,
            RPM,
            RPM,
        )
        assert (tokens["configured"], tokens["reported"], tokens["effective"]) == (
            20_000,
            50_000,
            20_000,
        )
        assert 0 <= requests["remaining"] < PER_WINDOW
        assert 0 <= requests["reset_s"] <= WINDOW_S
        assert json.loads(json.dumps(usage().as_dict()))["fast"]["limits"] == limits

        from rich.console import Console

        console = Console(width=400, record=True, file=io.StringIO())
        console.print(usage().table())
        text = console.export_text()
        assert f"req {RPM}/min (reported {RPM}, configured -)" in text
        assert "tok 20,000/min (reported 50,000, configured 20,000)" in text

        resources = tmp_path / "resources.toml"
        resources.write_text(
            f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
            'api_key = "sk-test"\nrequests_per_minute = 120\n',
            encoding="utf-8",
        )
        assert check.main(["--resources", str(resources), "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["ok"] and row["steps"][-1]["step"] == "limits"
        assert "req 120/min (reported 300, configured 120)" in row["steps"][-1]["detail"]
        assert row["limits"]["requests_per_minute"]["effective"] == 120
        assert check.main(["--resources", str(resources)]) == 0
        assert "reported 300" in capsys.readouterr().out


def test_runs_sharing_one_endpoint_share_the_learned_budget() -> None:
    """Three runs at once, each with its own manager: one process-wide governor for the
    endpoint learns the limit and paces all three by it."""
    n = 12
    with FakeOpenAIServer(api_key="sk-test", rpm_limit=RPM, limit_window_s=WINDOW_S) as server:
        managers = [
            ResourceManager(_resources(server, max_concurrent=IN_FLIGHT // 2, max_retries=10))
            for _ in range(3)
        ]
        assert len({id(m.endpoint("fast").governor) for m in managers}) == 1

        async def together() -> list[list[str]]:
            return await asyncio.gather(
                *(_complete_all(m, _requests("fast", n, f"r{k}-")) for k, m in enumerate(managers))
            )

        results = asyncio.run(together())
        refused = server.stats()["rate_limit"]["refused"]
    assert results == [[f"qr{k}-{i}" for i in range(n)] for k in range(3)]
    assert refused <= 1
    assert usage()["fast"]["limits"]["requests_per_minute"]["effective"] == RPM


def test_a_429_without_retry_after_waits_for_the_reported_reset() -> None:
    """A refusal that says when to come back only in its reset headers: one request a
    window, two sent at once, one retry allowed.  The refused one succeeds on its only
    retry because it waits for the stated reset (an exponential backoff's first pause,
    a quarter second at most, would land in the same window and be refused again)."""
    with FakeOpenAIServer(api_key="sk-test", rpm_limit=30, limit_window_s=WINDOW_S) as server:
        assert server.configure(limit_retry_after=False)["limit_retry_after"] is False
        manager = ResourceManager(_resources(server, max_concurrent=2, max_retries=1))
        outputs = asyncio.run(_complete_all(manager, _requests("fast", 2)))
        stats = server.stats()
    assert outputs == ["q0", "q1"]
    assert stats["rate_limit"]["refused"] == 1
    assert stats["status_counts"] == {"200": 2, "429": 1}
    assert usage()["fast"]["rate_limited"] == 1


def test_anthropic_spelling_end_to_end() -> None:
    pytest.importorskip("anthropic")
    n = 2 * PER_WINDOW
    with FakeAnthropicServer(
        api_key="sk-ant-test", rpm_limit=RPM, tpm_limit=90_000, limit_window_s=WINDOW_S
    ) as server:
        manager = ResourceManager(
            {
                "fast": {
                    "provider": "anthropic",
                    "model": "claude-fake",
                    "base_url": server.base_url,
                    "api_key": "sk-ant-test",
                    "max_concurrent": IN_FLIGHT,
                    "max_retries": 10,
                }
            }
        )
        outputs = asyncio.run(_complete_all(manager, _requests("fast", n)))
        stats = server.stats()
    assert outputs == [f"q{i}" for i in range(n)]
    assert stats["rate_limit"]["refused"] <= 1
    limits = usage()["fast"]["limits"]
    assert limits["requests_per_minute"]["reported"] == RPM
    assert limits["requests_per_minute"]["effective"] == RPM
    assert limits["tokens_per_minute"]["reported"] == 90_000
    assert 0 <= limits["requests_per_minute"]["reset_s"] <= WINDOW_S
