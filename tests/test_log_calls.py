"""`log_calls(show=True)` prints one line per finished call (issue 20, friction).

Before, `log_calls()` kept its records in memory and printed nothing, though the
README said it "shows" what every call was given and answered.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys

import plait
from plait.handlers import log_calls
from plait.testing import FakeOpenAIServer

from .pipelines import Echo


class Two(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Echo("one")
        self.second = Echo("two")

    def forward(self, text: str) -> str:
        return self.second(self.first(text))


def test_show_prints_one_line_per_call_with_its_failures(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    out = io.StringIO()
    with log_calls(show=out) as log:
        Two().bind(resources=resources).run_sync(["hello world", "bad[[status:400]]"])
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # two calls for the first input, one failed for the second
    assert "plait call first #0: 'hello world' -> '[one] hello world'" in lines
    assert "plait call second #0: '[one] hello world' -> '[two] [one] hello world'" in lines
    (failed,) = [line for line in lines if "failed" in line]
    assert failed.startswith("plait call first #1: 'bad[[status:400]]' failed: ProviderError")
    assert len(log.calls) == 2  # the records still hold the calls that succeeded


async def test_concurrent_runs_print_whole_lines(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    out = io.StringIO()
    pipeline = Two().bind(resources=resources)
    with log_calls(show=out):
        await asyncio.gather(pipeline([f"a{i}" for i in range(10)]), pipeline(["b"] * 10))
    lines = out.getvalue().splitlines()
    assert len(lines) == 40 and all(line.startswith("plait call ") for line in lines)


SCRIPT = """
import sys
import plait
from plait.handlers import log_calls
from tests.pipelines import Echo

resources = plait.ResourceConfig(
    {"fast": {"provider": "openai", "model": "m", "base_url": sys.argv[1], "api_key": "sk-test"}}
)
with log_calls(show=True):
    Echo("tag").bind(resources=resources).run_sync("hi")
"""


def test_show_true_prints_to_stderr(server: FakeOpenAIServer) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, server.base_url], capture_output=True, text=True,
        timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == "plait call Echo #0: 'hi' -> '[tag] hi'\n"
