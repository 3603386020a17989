"""Progress of a run (issue 20, friction): calls done and sending next to inputs, so a
few long inputs do not read "0/1 inputs" for minutes; no ETA while the first window of
inputs is still running."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import plait
from plait.cli.progress import Tally
from plait.resources.usage import reset_usage
from plait.testing import FakeOpenAIServer

from .pipelines import Echo


class Chain(plait.Module):
    """Two calls in a row; the second parks at the server's gate ``p``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Echo("one")
        self.second = Echo("two")

    def forward(self, text: str) -> Any:
        return self.second(f"[[gate:p]]{self.first(text)}")


def test_a_long_input_shows_its_calls_before_it_finishes(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    reset_usage()
    tally = Tally(total=1)
    tally.in_flight = 1
    pipeline = Chain().bind(resources=resources)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(pipeline.run_sync, "x")
        try:
            server.wait_parked("p", 1)
            headline = tally.headline()
        finally:
            server.open_gate("p")
        assert future.result(timeout=120) == "[two] [one] x"
    assert headline.startswith("0/1 inputs (0%) · calls: 1 done, 1 sending"), headline
    assert "calls: 2 done, 0 sending" in tally.headline()


def test_no_eta_until_a_window_of_inputs_finished() -> None:
    reset_usage()
    tally = Tally(total=1000)
    tally.in_flight = 64  # the first window: every one started together
    tally.succeeded = 3
    assert tally.eta() is None and "ETA" not in tally.headline()
    tally.succeeded = 63
    assert tally.eta() is None
    tally.succeeded = 64
    assert tally.eta() is not None and "ETA" in tally.headline()
    # Few inputs at once: still not before MIN_ETA_INPUTS of them finished.
    small = Tally(total=10)
    small.in_flight, small.succeeded = 1, 2
    assert small.eta() is None
    small.succeeded = 5
    assert small.eta() is not None
    # Inputs from the checkpoint finished no work of this run: they do not count.
    resumed = Tally(total=1000)
    resumed.in_flight, resumed.succeeded, resumed.resumed = 8, 100, 95
    assert resumed.eta() is None
