"""What counting a training run's spending adds to each LLM call's client CPU.

A `Trainer` puts a `plait.learning.spend.SpendLedger` on the handler stack for the
whole run: every call then carries a gate its endpoint tells of each request sent
and of its reply's usage.  This script runs the extract-and-compare pipeline of
``run.py`` (3 calls an input) against the loopback fake OpenAI server, alternating
runs with no handler, with an empty handler that sees every call (what a training
run's call log already costs: the message path), with the ledger (the gates on top)
and with the ledger keeping its log (as in a run with a checkpoint), and prints the
median process CPU per call of each and the differences.

    .venv/bin/python benchmarks/profile_spend.py [--n 1000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from run import FanOutFanIn, bound_pipeline  # beside this file

from plait.effects import Handler, Message
from plait.learning.spend import SpendLedger, account, phase
from plait.testing import FakeOpenAIServer


class _Sees(Handler):
    """Sees every LLM call and does nothing: the message path alone."""

    def process_llm(self, msg: Message) -> None:
        return None


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _sees() -> Iterator[None]:
    with _Sees():
        yield


@contextlib.contextmanager
def _ledger() -> Iterator[None]:
    with SpendLedger(), account(("step", 1)), phase("training"):
        yield


@contextlib.contextmanager
def _logged() -> Iterator[None]:
    """The ledger appending each request to its log, as in a run with a checkpoint."""
    ledger = SpendLedger()
    with tempfile.TemporaryDirectory() as folder:
        ledger.keep_log(Path(folder) / "spend.jsonl")
        with ledger, account(("step", 1)), phase("training"):
            yield
        ledger.keep_log(None)


def _cpu_per_call(pipeline: Any, inputs: list[str], around: Callable[[], Any]) -> float:
    with around():
        start = time.process_time()
        pipeline.run_sync(inputs)
        spent = time.process_time() - start
    return spent / (3 * len(inputs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="inputs per run (3 calls each)")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each, interleaved")
    ns = parser.parse_args()
    inputs = [f"document {i}" for i in range(ns.n)]
    cases = {
        "no handler": _nothing,
        "a handler seeing calls": _sees,
        "SpendLedger": _ledger,
        "SpendLedger and its log": _logged,
    }
    with FakeOpenAIServer(api_key="sk-test") as server:
        pipeline = bound_pipeline(FanOutFanIn, server.base_url, 64)
        for around in cases.values():  # warm up
            _cpu_per_call(pipeline, inputs[:50], around)
        seen: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(ns.repeats):
            for name, around in cases.items():
                seen[name].append(_cpu_per_call(pipeline, inputs, around))
    medians = {name: statistics.median(values) for name, values in seen.items()}
    for name, value in medians.items():
        print(f"{name:24s} {value * 1e6:8.1f} us CPU per call")
    base, sees, ledger, logged = medians.values()
    print(f"ledger - handler seeing calls:         {(ledger - sees) * 1e6:+.1f} us per call")
    print(f"ledger and log - handler seeing calls: {(logged - sees) * 1e6:+.1f} us per call")
    print(f"ledger - no handler:                   {(ledger - base) * 1e6:+.1f} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
