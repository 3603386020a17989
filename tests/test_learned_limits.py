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
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

import plait
from plait.cli import check
from plait.providers import ratelimits
from plait.providers.base import LLMRequest, ProviderError
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
        # One report, read twice: a second `usage()` counts its reset from a later now.
        report = usage()
        as_json = json.loads(json.dumps(report.as_dict()))
        assert as_json["fast"]["limits"] == report["fast"]["limits"]

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


# -- a reply is kept whatever its rate-limit headers say -----------------------------------------

#: How long a test lets a handful of calls to the local fake server take before it calls
#: them hung: it only turns a hang (a wait for a reset that never comes) into a failure.
HANG_S = 60.0

#: Replies whose rate-limit headers give no finite, sane number, and the header that does
#: not: each must be answered, with one warning naming that header.  The good headers
#: beside a bad reset or remaining are what would make a governor wait on it.
_OPENAI_BAD: list[tuple[dict[str, str], str]] = [
    ({"x-ratelimit-limit-requests": "1e999"}, "x-ratelimit-limit-requests"),
    ({"x-ratelimit-limit-requests": "inf"}, "x-ratelimit-limit-requests"),
    ({"x-ratelimit-limit-requests": "nan"}, "x-ratelimit-limit-requests"),
    ({"x-ratelimit-limit-tokens": "-Infinity"}, "x-ratelimit-limit-tokens"),
    ({"x-ratelimit-limit-requests": "9" * 400}, "x-ratelimit-limit-requests"),
    ({"x-ratelimit-limit-tokens": "9" * 5000}, "x-ratelimit-limit-tokens"),
    (
        {
            "x-ratelimit-limit-requests": "100",
            "x-ratelimit-remaining-requests": "Infinity",
            "x-ratelimit-reset-requests": "1s",
        },
        "x-ratelimit-remaining-requests",
    ),
    (
        {
            "x-ratelimit-limit-requests": "100",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "inf",
        },
        "x-ratelimit-reset-requests",
    ),
    (
        {
            "x-ratelimit-limit-requests": "100",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "1e999s",
        },
        "x-ratelimit-reset-requests",
    ),
    (
        {
            "x-ratelimit-limit-tokens": "100000",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "nan",
        },
        "x-ratelimit-reset-tokens",
    ),
    ({"retry-after": "inf"}, "retry-after"),
    ({"retry-after-ms": "1e999"}, "retry-after-ms"),
]

_ANTHROPIC_BAD: list[tuple[dict[str, str], str]] = [
    ({"anthropic-ratelimit-requests-limit": "inf"}, "anthropic-ratelimit-requests-limit"),
    ({"anthropic-ratelimit-requests-limit": "1e999"}, "anthropic-ratelimit-requests-limit"),
    ({"anthropic-ratelimit-tokens-limit": "nan"}, "anthropic-ratelimit-tokens-limit"),
    (
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "Infinity",
        },
        "anthropic-ratelimit-requests-remaining",
    ),
    (
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "inf",
        },
        "anthropic-ratelimit-requests-reset",
    ),
    (
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
        },
        "anthropic-ratelimit-requests-reset",
    ),
    ({"retry-after": "1e999"}, "retry-after"),
]


def _case_id(case: tuple[dict[str, str], str]) -> str:
    headers, name = case
    value = headers[name]
    return f"{name}={value if len(value) < 12 else value[:6] + '...'}"


def _ignored(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    """The warnings that said a header called ``name`` was ignored."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and f" {name} header" in r.getMessage()
    ]


def _fresh_endpoint_settings(learn: bool) -> dict[str, Any]:
    """An alias of its own endpoint (a model name no other test uses): what one test
    teaches its governor reaches no other test."""
    return {"model": f"headers-{uuid.uuid4().hex[:12]}", "learn_limits": learn, "max_retries": 0}


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "not-learning"])
@pytest.mark.parametrize("case", _OPENAI_BAD, ids=_case_id)
def test_a_reply_is_kept_whatever_its_openai_rate_limit_headers(
    server: FakeOpenAIServer,
    case: tuple[dict[str, str], str],
    learn: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Many calls at once, every reply carrying the bad header: every output arrives (none
    is an error after being paid for), and the header is named in one warning."""
    headers, name = case
    monkeypatch.setattr(ratelimits, "_warned", set())
    server.configure(reply_headers=headers)
    n = 2 * IN_FLIGHT
    manager = ResourceManager(_resources(server, **_fresh_endpoint_settings(learn)))
    with caplog.at_level(logging.WARNING, logger="plait"):
        outputs = asyncio.run(
            asyncio.wait_for(_complete_all(manager, _requests("fast", n)), HANG_S)
        )
    assert outputs == [f"q{i}" for i in range(n)]
    assert server.stats()["status_counts"] == {"200": n}
    assert len(_ignored(caplog, name)) == 1, caplog.text


@pytest.fixture(scope="module")
def anthropic_server() -> Iterator[FakeAnthropicServer]:
    pytest.importorskip("anthropic")
    with FakeAnthropicServer(api_key="sk-ant-test") as server:
        yield server


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "not-learning"])
@pytest.mark.parametrize("case", _ANTHROPIC_BAD, ids=_case_id)
def test_a_reply_is_kept_whatever_its_anthropic_rate_limit_headers(
    anthropic_server: FakeAnthropicServer,
    case: tuple[dict[str, str], str],
    learn: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers, name = case
    monkeypatch.setattr(ratelimits, "_warned", set())
    anthropic_server.reset()
    anthropic_server.configure(reply_headers=headers)
    n = 2 * IN_FLIGHT
    manager = ResourceManager(
        {
            "fast": {
                "provider": "anthropic",
                "base_url": anthropic_server.base_url,
                "api_key": "sk-ant-test",
                "max_concurrent": IN_FLIGHT,
                **_fresh_endpoint_settings(learn),
            }
        }
    )
    with caplog.at_level(logging.WARNING, logger="plait"):
        outputs = asyncio.run(
            asyncio.wait_for(_complete_all(manager, _requests("fast", n)), HANG_S)
        )
    assert outputs == [f"q{i}" for i in range(n)]
    statuses = [record["status"] for record in anthropic_server.stats()["requests"]]
    assert statuses == [200] * n
    assert len(_ignored(caplog, name)) == 1, caplog.text


@pytest.mark.parametrize(
    "value", ["inf", "-inf", "Infinity", "nan", "NaN", "1e999", "-1", "1e30", "9" * 400, "9" * 5000]
)
def test_a_count_that_is_no_finite_sane_number_is_ignored(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ratelimits, "_warned", set())
    headers = CIMultiDict({"x-ratelimit-limit-requests": value, "x-ratelimit-limit-tokens": "9"})
    with caplog.at_level(logging.WARNING, logger="plait"):
        limits = openai_limits(headers)
        again = anthropic_limits(CIMultiDict({"anthropic-ratelimit-requests-limit": value}))
    assert limits is not None and limits.requests_limit is None and limits.tokens_limit == 9
    assert again is None
    assert len(_ignored(caplog, "x-ratelimit-limit-requests")) == 1
    assert len(_ignored(caplog, "anthropic-ratelimit-requests-limit")) == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-ratelimit-reset-requests", "inf"),
        ("x-ratelimit-reset-requests", "1e999s"),
        ("x-ratelimit-reset-requests", "nan"),
        ("x-ratelimit-reset-requests", "1e999h"),
        ("retry-after", "inf"),
        ("retry-after", "nan"),
        ("retry-after-ms", "1e999"),
        ("retry-after-ms", "NaN"),
    ],
)
def test_a_duration_that_is_no_finite_number_is_ignored(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ratelimits, "_warned", set())
    headers = CIMultiDict(
        {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0", name: value}
    )
    with caplog.at_level(logging.WARNING, logger="plait"):
        limits = openai_limits(headers)
    assert limits is not None and limits.requests_limit == 60
    assert limits.requests_reset_s is None and limits.retry_after_s is None
    assert limits.wait() is None
    assert len(_ignored(caplog, name)) == 1


# -- a reset far away holds calls no longer than a Retry-After may --------------------------------

#: The bound on any wait a server asks for in these tests (``max_retry_after_s``).
CAP_S = 0.2

_DAY_SPENT = {
    "x-ratelimit-limit-requests": "100",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "24h",
}


def _waits(caplog: pytest.LogCaptureFixture, alias: str, header: str) -> list[str]:
    """The log lines that said ``alias`` waits because of ``header``."""
    return [
        r.getMessage()
        for r in caplog.records
        if f"alias {alias!r} waits" in r.getMessage() and f" {header} header" in r.getMessage()
    ]


def test_a_reset_a_day_away_holds_the_next_call_no_longer_than_max_retry_after(
    server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply says no request remains until a reset in 24 hours: the next call is held
    at most ``max_retry_after_s`` (then sent, and answered), and the wait is logged with
    the alias and the header that asked for it."""
    server.configure(reply_headers=_DAY_SPENT)
    manager = ResourceManager(
        _resources(server, **_fresh_endpoint_settings(True), max_retry_after_s=CAP_S)
    )
    with caplog.at_level(logging.WARNING, logger="plait"):
        for i in range(2):
            (output,) = asyncio.run(
                asyncio.wait_for(_complete_all(manager, _requests("fast", 1, f"s{i}-")), HANG_S)
            )
            assert output == f"qs{i}-0"
    (said,) = _waits(caplog, "fast", "x-ratelimit-reset-requests")
    assert "says to wait 86400 s" in said and f"max_retry_after_s={CAP_S:g}" in said
    assert manager.endpoint("fast").governor.effective()[0] == 100  # still learned


def test_many_calls_held_by_a_far_reset_all_complete_and_it_is_said_once_a_stall(
    server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Three times the calls the endpoint sends at once, every reply saying the day's
    budget is spent: the calls go in rounds (each held at most ``max_retry_after_s``,
    then sent) and all are answered; the wait is logged once per stall, not per call
    (the calls meet at most two stalls: one before each round after the first)."""
    server.configure(reply_headers=_DAY_SPENT)
    n = 3 * IN_FLIGHT
    manager = ResourceManager(
        _resources(server, **_fresh_endpoint_settings(True), max_retry_after_s=CAP_S)
    )
    with caplog.at_level(logging.WARNING, logger="plait"):
        outputs = asyncio.run(
            asyncio.wait_for(_complete_all(manager, _requests("fast", n)), HANG_S)
        )
    assert outputs == [f"q{i}" for i in range(n)]
    assert server.stats()["status_counts"] == {"200": n}
    said = _waits(caplog, "fast", "x-ratelimit-reset-requests")
    assert 1 <= len(said) <= 2, said


def test_anthropic_reset_a_day_away_is_bounded_and_said(
    anthropic_server: FakeAnthropicServer, caplog: pytest.LogCaptureFixture
) -> None:
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    anthropic_server.reset()
    anthropic_server.configure(
        reply_headers={
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": tomorrow,
        }
    )
    manager = ResourceManager(
        {
            "claude": {
                "provider": "anthropic",
                "base_url": anthropic_server.base_url,
                "api_key": "sk-ant-test",
                "max_retry_after_s": CAP_S,
                **_fresh_endpoint_settings(True),
            }
        }
    )
    endpoint = manager.endpoint("claude")

    async def two_in_a_row() -> list[str]:
        return [(await endpoint.complete(r)).text for r in _requests("claude", 2)]

    with caplog.at_level(logging.WARNING, logger="plait"):
        outputs = asyncio.run(asyncio.wait_for(two_in_a_row(), HANG_S))
    assert outputs == ["q0", "q1"]
    (said,) = _waits(caplog, "claude", "anthropic-ratelimit-requests-reset")
    assert f"max_retry_after_s={CAP_S:g}" in said


def test_a_429_asking_for_a_day_fails_saying_why_and_the_wait_is_logged(
    server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 429 whose Retry-After is a day: each retry waits ``max_retry_after_s``, and the
    call then fails naming the wait asked for, the header and the setting to raise."""
    server.configure(retry_after_s=86400.0)
    manager = ResourceManager(
        _resources(
            server, **{**_fresh_endpoint_settings(True), "max_retries": 2}, max_retry_after_s=CAP_S
        )
    )
    request = LLMRequest(alias="fast", messages=[{"role": "user", "content": "[[status:429]] q"}])
    with caplog.at_level(logging.WARNING, logger="plait"), pytest.raises(ProviderError) as refused:
        asyncio.run(asyncio.wait_for(manager.endpoint("fast").complete(request), HANG_S))
    message = str(refused.value)
    assert "gave up after 3 attempts" in message
    assert "asked to wait 86400 s (retry-after-ms header)" in message
    assert f"max_retry_after_s={CAP_S:g}: raise it" in message
    (said,) = _waits(caplog, "fast", "retry-after-ms")
    assert "says to wait 86400 s" in said
    assert server.stats()["status_counts"] == {"429": 3}


class _UnreadableHeaders:
    """Headers whose lookup fails, as no client's should: the parsers' last guard."""

    def get(self, key: str, /) -> str | None:
        raise RuntimeError(f"cannot look up {key}")


def test_headers_that_cannot_be_read_at_all_cost_the_limits_not_the_reply(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ratelimits, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="plait"):
        for _ in range(3):
            assert openai_limits(_UnreadableHeaders()) is None
            assert anthropic_limits(_UnreadableHeaders()) is None
    (said,) = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert "RuntimeError: cannot look up" in said


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "not-learning"])
def test_a_pipeline_s_rows_are_outputs_not_errors_whatever_the_headers(
    server: FakeOpenAIServer, learn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue as a user met it: a batch through a pipeline whose replies say
    ``x-ratelimit-limit-requests: 1e999``; every row is its output, none an error."""
    monkeypatch.setattr(ratelimits, "_warned", set())
    server.configure(
        reply_headers={
            "x-ratelimit-limit-requests": "1e999",
            "x-ratelimit-remaining-requests": "inf",
        }
    )
    alias = _resources(server, **_fresh_endpoint_settings(learn))["fast"]
    pipeline = plait.LLMInference("fast").bind(resources=plait.ResourceConfig({"fast": alias}))
    outputs = pipeline.run_sync(["a", "b", "c"])
    assert outputs == ["a", "b", "c"]
