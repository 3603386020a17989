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


ECHOED_KEY = "sk-CANARY-echoed-by-the-server-42"


def _quoting_resources(server: FakeOpenAIServer, path: Path) -> Path:
    """Resources whose key (from the environment) the server refuses and quotes back."""
    server.configure(quote_key_in_401=True)
    path.write_text(
        "".join(
            f'[{alias}]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
            'api_key_env = "PLAIT_TEST_ECHOED_KEY"\nmax_retries = 0\n'
            for alias in ("fast", "smart")
        )
    )
    return path


def test_a_key_the_endpoint_quotes_in_its_401_reaches_no_output(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = _quoting_resources(server, tmp_path / "resources.toml")
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"a"\n"b"\n')
    data = tmp_path / "data.jsonl"
    data.write_text('{"input": "a", "target": "a"}\n{"input": "b", "target": "b"}\n')
    target = tmp_path / "learner.py"
    target.write_text(
        "import plait\n"
        "class Copy(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.llm = plait.LLMInference("fast", system_prompt=plait.Parameter("",'
        ' description="the task"))\n'
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    out, trace, trained = tmp_path / "out.jsonl", tmp_path / "trace.json", tmp_path / "trained"
    env = {"PLAIT_TEST_ECHOED_KEY": ECHOED_KEY}
    done = [
        plait_cli(
            "run", "tests.pipelines:FanOutFanIn", "-i", inputs, "-o", out,
            "--resources", resources, "--profile", trace, env=env,
        ),
        plait_cli(
            "train", f"{target}:Copy", "--data", data, "--val", data, "--resources", resources,
            "--optimizer-alias", "smart",
            "--out", trained, env=env,
        ),
        plait_cli(
            "eval", f"{target}:Copy", "--data", data, "--resources", resources, env=env,
        ),
        plait_cli("check", "--resources", resources, env=env),
    ]  # fmt: skip
    # The server did quote the key: every call was refused with it in the body.
    assert server.stats()["status_counts"] == {"401": server.stats()["requests_total"]}
    assert all(d.returncode != 0 for d in done)  # every command saw its calls refused
    assert "401" in done[3].stdout + done[3].stderr
    assert "401" in done[0].stderr and "401" in done[1].stderr
    shown = "\n".join(d.stdout + d.stderr for d in done)
    written = everything_written(out, trace, Path(f"{out}.checkpoint"), trained)
    assert trace.is_file() and '"error"' in trace.read_text()
    assert ECHOED_KEY not in shown and ECHOED_KEY not in written
    assert "***" in trace.read_text()


def test_a_key_the_endpoint_quotes_reaches_no_error_value_or_exception(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import traceback

    from .pipelines import FanOutFanIn

    monkeypatch.setenv("PLAIT_TEST_ECHOED_KEY", ECHOED_KEY)
    resources = plait.ResourceConfig.load(_quoting_resources(server, tmp_path / "r.toml"))
    pipeline = FanOutFanIn().bind(resources=resources)
    (row,) = pipeline.run_sync(["a"])
    with pytest.raises(plait.ExecutionError) as info:
        pipeline.run_sync("b")
    assert isinstance(row, plait.Value) and row.is_error
    assert server.stats()["status_counts"] == {"401": server.stats()["requests_total"]}
    texts = [
        json.dumps({k: str(v) for k, v in row.meta.items()}),
        str(row.payload),
        repr(row.payload),
        "".join(traceback.format_exception(info.value)),  # the cause chain included
    ]
    assert all("401" in text for text in texts)
    assert not any(ECHOED_KEY in text for text in texts)
