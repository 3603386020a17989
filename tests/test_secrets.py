"""No credential in any output (issue 11): URLs with passwords, keys pasted in the wrong
place, empty key variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import plait
from plait._secrets import redact_url, scrub
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "pw-CANARY-7f3a91"
PASTED_KEY = "sk-proj-CANARYKEY0123456789abcdef"


def everything_written(*places: Path) -> str:
    texts = []
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        texts += [f.read_text(errors="replace") for f in files]
    return "\n".join(texts)


def test_redact_url_hides_userinfo_and_key_parameters() -> None:
    shown = redact_url(f"http://user:{PASSWORD}@host:8000/v1?api_key=abcdef123&mode=x")
    assert PASSWORD not in shown and "abcdef123" not in shown
    assert shown.startswith("http://***@host:8000/v1?") and "mode=x" in shown
    assert scrub(f"failed at user:{PASSWORD}@host") == "failed at user:***@host"


def test_a_password_in_base_url_reaches_no_output(server: FakeOpenAIServer, tmp_path: Path) -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:{server.port}/v1"
    resources = tmp_path / "resources.toml"
    resources.write_text(
        # No api_key: the URL's credentials are sent as basic auth (beside a key they are
        # refused at load); this server wants a key, so each call fails with a 401.
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{url}"\n'
        f'[smart]\nprovider = "openai"\nmodel = "m"\nbase_url = "{url}"\n'
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n"b"\n')
    out, trace = tmp_path / "out.jsonl", tmp_path / "trace.json"
    run = plait_cli(
        "run", "tests.pipelines:FanOutFanIn", "-i", inputs, "-o", out, "--resources", resources,
        "--profile", trace,
    )  # fmt: skip
    check = plait_cli("check", "--resources", resources)
    shown = "\n".join([run.stdout, run.stderr, check.stdout, check.stderr])
    written = everything_written(out, trace, Path(f"{out}.checkpoint"))
    assert run.returncode in (0, 1) and written  # the run happened and wrote its files
    assert PASSWORD not in shown and PASSWORD not in written
    assert "***@127.0.0.1" in check.stdout


def test_a_key_pasted_into_api_key_env_is_refused_without_being_shown(tmp_path: Path) -> None:
    with pytest.raises(plait.ConfigurationError) as info:
        plait.ResourceConfig({"fast": {"model": "m", "api_key_env": PASTED_KEY}})
    message = str(info.value)
    assert PASTED_KEY not in message and "name of an environment variable" in message
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\napi_key_env = "{PASTED_KEY}"\n'
    )
    for done in (
        plait_cli("check", "--resources", resources),
        plait_cli("run", "tests.pipelines:FanOutFanIn", "-i", resources, "--resources", resources),
    ):
        assert done.returncode != 0
        assert PASTED_KEY not in done.stdout + done.stderr
        assert "api_key_env" in done.stdout + done.stderr


def test_an_exported_but_empty_key_variable_is_an_error_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLAIT_TEST_EMPTY_KEY", "")
    with pytest.raises(plait.ConfigurationError, match=r"PLAIT_TEST_EMPTY_KEY.*set but empty"):
        plait.ResourceConfig({"fast": {"model": "m", "api_key_env": "PLAIT_TEST_EMPTY_KEY"}})


def test_a_configured_key_never_reaches_an_error_value(server: FakeOpenAIServer) -> None:
    key = "sk-live-CANARY-0000000000000000"
    resources = plait.ResourceConfig(
        {"fast": {"model": "m", "base_url": server.base_url, "api_key": key}}
    )

    class Leaky(plait.Module):
        async def forward(self, text: str) -> str:
            raise RuntimeError(f"upstream said: bad key {key}")

    with pytest.raises(plait.ExecutionError) as info:
        Leaky().bind(resources=resources).run_sync("x")
    value = info.value.value
    assert key not in str(info.value)
    assert key not in json.dumps({k: str(v) for k, v in value.meta.items()})


def test_an_unset_api_key_env_is_named_only_when_it_looks_like_a_variable_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pasted = "hf_CANARYabcdefghijklmnopqrstuv12345"  # a key that happens to fit a name
    conventional = "PLAIT_TEST_UNSET_KEY"
    monkeypatch.delenv(pasted, raising=False)
    monkeypatch.delenv(conventional, raising=False)
    with pytest.raises(plait.ConfigurationError) as info:
        plait.ResourceConfig({"fast": {"model": "m", "api_key_env": pasted}})
    assert pasted not in str(info.value)
    assert f"not set ({len(pasted)} characters, not shown" in str(info.value)
    with pytest.raises(plait.ConfigurationError, match=f"'{conventional}', which is not set"):
        plait.ResourceConfig({"fast": {"model": "m", "api_key_env": conventional}})
    for env, shown in ((pasted, False), (conventional, True)):
        resources = tmp_path / "resources.toml"
        resources.write_text(
            f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
            f'api_key_env = "{env}"\n'
        )
        for done in (
            plait_cli("check", "--resources", resources),
            plait_cli(
                "run", "tests.pipelines:FanOutFanIn", "-i", resources, "-o", tmp_path / "o.jsonl",
                "--resources", resources,
            ),
        ):  # fmt: skip
            said = done.stdout + done.stderr
            assert done.returncode != 0 and "api_key_env" in said
            assert (env in said) is shown, said
