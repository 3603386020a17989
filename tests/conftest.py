"""Shared fixtures: one real OpenAI-compatible server on 127.0.0.1 for the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import plait
from plait.testing import FakeOpenAIServer


@pytest.fixture(scope="session")
def server_process() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key="sk-test") as server:
        yield server


@pytest.fixture()
def server(server_process: FakeOpenAIServer) -> FakeOpenAIServer:
    """The session's server with its stats cleared and its faults and latency off."""
    server_process.configure(
        latency_ms=0,
        jitter_ms=0,
        rate_429=0,
        rate_500=0,
        rate_drop=0,
        rate_timeout=0,
        retry_after_s=1.0,
        timeout_hang_s=30.0,
        seed=0,
    )
    server_process.reset()
    return server_process


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
