"""The usage table `plait run` prints on stderr: off a terminal (a log, CI, a pipe) it
is never cut, so the alias and the model that ran can be read whole."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plait.cli.progress import show
from plait.resources.usage import UsageReport
from plait.testing import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]

#: Names as long as real ones: a dated model and an alias that says what it is for.
MODEL = "gpt-4o-mini-2024-07-18-long-fine-tune-name"
ALIAS = "customer_feedback_summarizer"


def _run(server: FakeOpenAIServer, tmp_path: Path, env: dict[str, str]) -> str:
    """``plait run`` as a CI job runs it: its own process, stderr a pipe; the stderr."""
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[{ALIAS}]\nprovider = "openai"\nmodel = "{MODEL}"\n'
        f'base_url = "{server.base_url}"\napi_key = "sk-test"\n',
        encoding="utf-8",
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(f"doc {i}") + "\n" for i in range(3)))
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PLAIT_TEST_GATE")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plait.cli",
            "run",
            "tests.cli_targets:Tagged",
            f"alias={ALIAS}",
            "-i",
            str(inputs),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--resources",
            str(resources),
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,  # stderr a pipe, as in a CI job
        text=True,
        env={**environ, **env},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("columns", [None, "80"], ids=["no-COLUMNS", "COLUMNS=80"])
def test_the_usage_table_names_the_whole_model_and_alias_in_a_log(
    server: FakeOpenAIServer, tmp_path: Path, columns: str | None
) -> None:
    """A CI shell may export ``COLUMNS`` too: off a terminal it cuts nothing either."""
    stderr = _run(server, tmp_path, {} if columns is None else {"COLUMNS": columns})
    assert "plait usage" in stderr
    (row,) = [line for line in stderr.splitlines() if f"openai/{MODEL}" in line]
    assert ALIAS in row and "…" not in row
    assert server.stats()["requests_total"] == 3


def _report(model: str) -> UsageReport:
    row = {
        "alias": ALIAS,
        "provider": "openai",
        "model": model,
        "requests": 12,
        "batch_requests": 0,
        "retries": 0,
        "rate_limited": 0,
        "prompt_tokens": 1200,
        "cache_read_tokens": 0,
        "completion_tokens": 300,
        "latency_p50_s": 0.01,
        "latency_p90_s": 0.02,
        "cost_usd": None,
        "limits": None,
    }
    return UsageReport([row])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_at_a_terminal_the_table_still_fits_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """At an 80-column terminal the table keeps to 80 columns (rich folds or cuts cells);
    only a log or a pipe gets the width the content needs."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TERM", "xterm")
    terminal = _Terminal()
    show(terminal, _report(MODEL).table())
    seen = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())  # a terminal's styles
    assert max(len(line) for line in seen.splitlines()) <= 80
    log = io.StringIO()
    show(log, _report(MODEL).table())
    lines = log.getvalue().splitlines()
    assert max(len(line) for line in lines) > 80
    assert any(f"openai/{MODEL}" in line and ALIAS in line for line in lines)
