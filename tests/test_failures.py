"""Failures are visible: Value(ERROR) with cause, short-circuits, nothing silently lost."""

from __future__ import annotations

from typing import Any

import pytest

import plait
from plait.testing import FakeOpenAIServer

from .pipelines import Echo, echo


class TwoBranches(plait.Module):
    """A branch that fails (and a dependent of it) next to a branch that succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.bad = Echo("bad")
        self.after_bad = Echo("after")
        self.good = Echo("good")

    def forward(self, text: str) -> Any:
        return {"bad": self.after_bad(self.bad(text)), "good": self.good(text.split("[[")[0])}


def test_a_failed_node_reaches_the_caller_with_its_cause(
    resources: plait.ResourceConfig, server: FakeOpenAIServer
) -> None:
    pipeline = TwoBranches().bind(resources=resources)
    with pytest.raises(plait.ExecutionError) as info:
        pipeline.run_sync("x[[status:400]]!")
    value = info.value.value
    assert value.kind is plait.ValueKind.ERROR
    assert value.meta["module_path"] == "bad"
    assert value.meta["error_type"] == "ProviderError"
    assert "HTTP 400" in value.meta["message"]
    assert "Traceback" in value.meta["traceback"]
    assert "bad" in str(info.value)
    stats = server.stats()
    # the failing call was made once (400 is not retried), its dependent never ran,
    # and the independent branch finished
    assert stats["status_counts"] == {"400": 1, "200": 1}
    assert stats["requests_total"] == 2


class TwoFailures(plait.Module):
    """Two calls that both fail; the one written first answers last."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Echo("first")
        self.second = Echo("second")

    def forward(self, text: str) -> Any:
        return [self.first(text + " [[latency_ms:400]]"), self.second(text)]


def test_the_failure_reported_is_the_first_written_not_the_first_to_fail(
    resources: plait.ResourceConfig,
) -> None:
    """Which call fails first depends on timing; what the caller sees must not."""
    pipeline = TwoFailures().bind(resources=resources)
    [value] = pipeline.run_sync(["x [[status:400]]"])
    assert isinstance(value, plait.Value) and value.kind is plait.ValueKind.ERROR
    assert value.meta["module_path"] == "first"
    assert [error["module_path"] for error in value.meta["errors"]] == ["first", "second"]


def test_a_batch_keeps_every_slot(resources: plait.ResourceConfig) -> None:
    pipeline = TwoBranches().bind(resources=resources)
    out = pipeline.run_sync(["a", "b[[status:404]]", "c"])
    assert len(out) == 3
    assert out[0] == {"bad": echo("after", echo("bad", "a")), "good": echo("good", "a")}
    assert isinstance(out[1], plait.Value) and out[1].kind is plait.ValueKind.ERROR
    assert out[1].meta["module_path"] == "bad"
    assert out[2]["good"] == echo("good", "c")


async def test_streaming_reports_errors(resources: plait.ResourceConfig) -> None:
    pipeline = TwoBranches().bind(resources=resources)
    results = {r.index: r async for r in pipeline.stream(["ok", "no[[status:401]]"])}
    assert results[0].ok and results[0].error is None
    assert not results[1].ok
    assert isinstance(results[1].error, plait.ExecutionError)
    assert results[1].error.value.meta["module_path"] == "bad"


def test_an_exception_in_user_code_becomes_an_error_value(
    resources: plait.ResourceConfig,
) -> None:
    class Parse(plait.Module):
        def forward(self, text: str) -> int:
            return int(text)

    class Pipeline(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = Echo("n")
            self.parse = Parse()

        def forward(self, text: str) -> Any:
            return {"n": self.parse(self.llm(text)), "kept": self.llm(text)}

    out = Pipeline().bind(resources=resources).run_sync(["7", "x"])
    assert isinstance(out[1], plait.Value) and out[1].is_error
    assert out[1].meta["module_path"] == "parse"
    assert out[1].meta["error_type"] == "ValueError"
    assert isinstance(out[1].payload, ValueError)


def test_a_failure_nobody_reads_is_still_reported(resources: plait.ResourceConfig) -> None:
    class SideCall(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.audit = Echo("audit")
            self.main = Echo("main")

        def forward(self, text: str) -> Any:
            self.audit(text + "[[status:400]]")  # result unused
            return self.main(text)

    with pytest.raises(plait.ExecutionError, match="audit"):
        SideCall().bind(resources=resources).run_sync("x")


def test_tracing_errors_surface_per_input(resources: plait.ResourceConfig) -> None:
    class Decide(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = Echo("d")

        def forward(self, text: str) -> Any:
            return "yes" if self.llm(text) else "no"

    with pytest.raises(plait.ExecutionError, match="async def forward"):
        Decide().bind(resources=resources).run_sync("x")
