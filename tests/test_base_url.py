"""A ``base_url`` with credentials or a query string (issue 20 point 18).

Credentials in the URL are sent as HTTP basic auth (and never shown); a query string
(Azure's ``?api-version=``) is kept on every request; credentials next to an API key
are refused when the resources are loaded, naming both settings.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

import plait
from plait.resources.config import ConfigurationError
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli

PASSWORD = "s:cret-pw-93z"  # a test credential; its ":" is quoted in the URL


@pytest.fixture(scope="module")
def open_server() -> Iterator[FakeOpenAIServer]:
    """A fake server that asks for no key, so the credentials the client sends are
    only recorded."""
    with FakeOpenAIServer() as server:
        yield server


def _with_credentials(server: FakeOpenAIServer, query: str = "") -> str:
    host = server.base_url.removeprefix("http://")
    return f"http://alice:{PASSWORD.replace(':', '%3A')}@{host}{query}"


def test_a_query_string_is_kept_on_every_request(server: FakeOpenAIServer) -> None:
    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": server.base_url + "/?api-version=2024-06-01",
                "api_key": "sk-test",
            }
        }
    )
    llm = plait.LLMInference("fast").bind(resources=resources)
    assert llm.run_sync(["a", "b", "c"]) == ["a", "b", "c"]  # was: HTTP 404 for each
    records = server.stats()["requests"]
    assert [r["query"] for r in records] == ["api-version=2024-06-01"] * 3
    assert {r["authorization"] for r in records} == {"Bearer sk-test"}


def test_url_credentials_are_sent_as_basic_auth_and_never_shown(
    open_server: FakeOpenAIServer,
) -> None:
    open_server.reset()
    url = _with_credentials(open_server, "?api-version=1")
    resources = plait.ResourceConfig(
        {"fast": {"provider": "openai", "model": "m", "base_url": url}}
    )
    llm = plait.LLMInference("fast").bind(resources=resources)
    out = llm.run_sync(["one", "two", "bad[[status:400]]"])
    assert out[:2] == ["one", "two"]
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    records = open_server.stats()["requests"]
    assert {r["authorization"] for r in records} == {f"Basic {token}"}
    assert {r["query"] for r in records} == {"api-version=1"}
    assert out[2].is_error
    shown = " ".join(str(v) for v in out[2].meta.values())
    assert "HTTP 400" in shown and PASSWORD not in shown and token not in shown
    assert PASSWORD not in repr(resources) and "cret-pw" not in repr(resources)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"api_key": "sk-test-key"}, "api_key is set too"),
        ({"api_key_env": "PATH"}, "api_key_env is set too"),
        ({"provider": "anthropic"}, "'anthropic' provider does not send"),
    ],
)
def test_url_credentials_beside_a_key_are_refused_at_load(
    open_server: FakeOpenAIServer, settings: dict[str, str], named: str
) -> None:
    spec = {"provider": "openai", "model": "m", "base_url": _with_credentials(open_server)}
    with pytest.raises(ConfigurationError, match="base_url holds credentials") as info:
        plait.ResourceConfig({"fast": {**spec, **settings}})
    assert named in str(info.value) and "'fast'" in str(info.value)
    assert "cret-pw" not in str(info.value)


def test_a_query_the_anthropic_provider_would_drop_is_refused_at_load() -> None:
    spec = {"provider": "anthropic", "model": "m", "base_url": "http://127.0.0.1:9/?v=1"}
    with pytest.raises(ConfigurationError, match="'fast': base_url has a query string"):
        plait.ResourceConfig({"fast": spec})


def test_plait_run_refuses_credentials_beside_a_key_in_one_line(
    open_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    open_server.reset()
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{_with_credentials(open_server)}"\n'
        'api_key = "sk-test"\n'
    )
    (tmp_path / "in.jsonl").write_text('"x"\n')
    result = plait_cli(
        "run", "tests.cli_targets:Tagged", "--input", tmp_path / "in.jsonl",
        "--output", tmp_path / "out.jsonl", "--resources", resources,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "base_url holds credentials" in result.stderr and "Traceback" not in result.stderr
    assert "cret-pw" not in result.stderr + result.stdout
    assert open_server.stats()["requests_total"] == 0


def test_an_alias_without_base_url_takes_the_sdk_variable(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OPENAI_BASE_URL`` (``ANTHROPIC_BASE_URL``), as the providers' own SDKs read it,
    sends an alias with no ``base_url`` to a proxy or gateway; a base_url given wins."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/anthropic")
    resources = plait.ResourceConfig(
        {
            "fast": {"provider": "openai", "model": "m", "api_key": "sk-test"},
            "claude": {"provider": "anthropic", "model": "c", "api_key": "sk-test"},
            "pinned": {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
        }
    )
    assert resources["fast"].base_url == server.base_url
    assert resources["claude"].base_url == "http://127.0.0.1:9/anthropic"
    assert resources["pinned"].base_url == "http://127.0.0.1:9/v1"
    reply = plait.LLMInference("fast", system_prompt="S").run_sync("x", resources=resources)
    assert reply == "[S] x"
    assert server.stats()["requests_total"] == 1
