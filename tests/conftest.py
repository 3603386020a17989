"""Shared fixtures: one real OpenAI-compatible server on 127.0.0.1 for the whole session.

Every test also runs under a guard (autouse, so no test can forget it): if any fake server
received a request holding a tracing placeholder while the test ran, the test fails at
teardown with the offending excerpt.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.testing import (
    BATCH_CONFIG_DEFAULTS,
    FakeAnthropicServer,
    FakeOpenAIServer,
    take_placeholder_requests,
)
from tests.page_runner import Document, Session, session_environment

# The tests that press Ctrl-C on a child process need SIGINT to reach it. A suite
# started in the background of a shell without job control (`nohup ... &`, some CI
# runners) inherits SIGINT ignored, and so would every process it starts; a handler
# set here is reset to the default in each child it starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

PLACEHOLDER_GUARD_MESSAGE = "a fake server received a request holding a tracing placeholder"


@pytest.fixture(autouse=True)
def _fail_on_tracing_placeholder_requests() -> Iterator[None]:
    """Fail the test if a fake server (of any scope, started anywhere) saw a placeholder.

    A placeholder in a request means plait sent a stand-in for an output it had not
    computed yet instead of the real text. Servers count these outside their resettable
    statistics, and servers stopped during the test hand theirs over as they stop.
    """
    yield
    hits = take_placeholder_requests()
    if hits:
        lines = [f"{PLACEHOLDER_GUARD_MESSAGE} ({len(hits)} request(s)):"]
        for hit in hits:
            excerpt = str(hit.get("excerpt")).replace("\n", "\\n")
            lines.append(
                f"  {hit.get('server')} {hit.get('endpoint')} model={hit.get('model')!r} "
                f"at {hit.get('where')}: «{excerpt}»"
            )
        pytest.fail("\n".join(lines), pytrace=False)


@pytest.fixture(scope="session")
def server_process() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key="sk-test") as server:
        yield server


@pytest.fixture()
def server(server_process: FakeOpenAIServer) -> FakeOpenAIServer:
    """The session's server with its stats, files and batches cleared, its faults and latency
    off and its batch settings at their defaults."""
    reset_fake_openai(server_process)
    return server_process


FAKE_OPENAI_DEFAULTS: dict[str, Any] = {
    **BATCH_CONFIG_DEFAULTS,
    "latency_ms": 0,
    "jitter_ms": 0,
    "rate_429": 0,
    "rate_500": 0,
    "rate_drop": 0,
    "rate_timeout": 0,
    "rate_flex_unavailable": 0,
    "rate_stall": 0,
    "stall_s": 10.0,
    "retry_after_s": 1.0,
    "timeout_hang_s": 30.0,
    "seed": 0,
    "quote_key_in_401": False,
    "answer_like_demos": False,
    "gate_texts": {},
    "reply_headers": {},
}
"""The fake OpenAI server's settings as a test (or a documentation page) starts."""


def reset_fake_openai(server: FakeOpenAIServer) -> None:
    """Clear the server's stats, files and batches and put its settings back."""
    server.configure(**FAKE_OPENAI_DEFAULTS)
    server.reset()


def make_resources(
    server: FakeOpenAIServer, aliases: tuple[str, ...] = ("fast",), **limits: Any
) -> plait.ResourceConfig:
    settings = {
        "provider": "openai",
        "model": "m",
        "base_url": server.base_url,
        "api_key": "sk-test",
        **limits,
    }
    return plait.ResourceConfig({alias: dict(settings) for alias in aliases})


@pytest.fixture()
def resources(server: FakeOpenAIServer) -> plait.ResourceConfig:
    return make_resources(server, ("fast", "smart"), max_concurrent=8)


ROOT = Path(__file__).resolve().parent.parent


def plait_cli(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """The ``plait`` command as a user runs it: a process of its own, no terminal
    (in ``cwd``: the repository unless a test gives the user's project folder)."""
    return subprocess.run(
        [sys.executable, "-m", "plait.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray for the session's multi-process tests (started here, stopped after)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            namespace="plait",
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture()
def anthropic_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep a developer's own Anthropic settings and proxies out of the SDK's way (it
    reads ANTHROPIC_* variables and credential profiles under HOME)."""
    for name in list(os.environ):
        if name.startswith("ANTHROPIC_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture(scope="session")
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection: bound for the whole session and
    never listened on.  A port merely freed after a bind could be taken meanwhile by
    anything the suite starts (Ray opens many), and then answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        yield port


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a worker a test expects to be stopped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


PAGE_KEY = "sk-test"
"""The key a documentation page's session has in OPENAI_API_KEY and ANTHROPIC_API_KEY,
and the one the fake servers it talks to accept."""

PageServers = tuple[FakeOpenAIServer, FakeAnthropicServer]


@pytest.fixture(scope="module")
def page_servers() -> Iterator[PageServers]:
    """The fake OpenAI and Anthropic servers the documentation examples talk to."""
    with (
        FakeOpenAIServer(api_key=PAGE_KEY) as openai,
        FakeAnthropicServer(api_key=PAGE_KEY) as anthropic,
    ):
        yield openai, anthropic


def run_document(document: Document, directory: Path, servers: PageServers) -> None:
    """Run a page's (or a docstring's) examples in ``directory`` as the documentation
    contract says: a session of its own, the fake servers reset and named in
    OPENAI_BASE_URL / ANTHROPIC_BASE_URL with their keys, ``run: fake`` configuring
    the OpenAI one."""
    openai, anthropic = servers
    reset_fake_openai(openai)
    anthropic.reset()
    env = session_environment(
        os.environ,
        {
            "OPENAI_BASE_URL": openai.base_url,
            "OPENAI_API_KEY": PAGE_KEY,
            "ANTHROPIC_BASE_URL": anthropic.base_url,
            "ANTHROPIC_API_KEY": PAGE_KEY,
        },
    )
    Session(document, directory / "page", env, directory / "runner", openai.configure).run()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """After the run, list what the documentation tests want seen in every log: each
    block a page leaves unrun, with its reason, and where the site's screenshot is."""
    notes: dict[str, None] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == "skipped_block":
                    notes[f"skipped block: {value}"] = None
                elif name == "site_screenshot":
                    notes[f"home page screenshot: {value}"] = None
    if notes:
        terminalreporter.write_sep("-", "documentation site")
        for line in notes:
            terminalreporter.write_line(line)
