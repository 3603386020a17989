"""A provider outage in the middle of a run, with a fallback (issue 37, point 6a).

Two fake OpenAI servers play two providers, each answering after ``--latency-ms``.
A three-call pipeline (each call reads the one before) runs ``--n`` inputs on the
alias ``smart`` (the ``primary`` server), which falls back on ``backup`` (the
other server), each alias with ``--concurrency`` slots:

* ``no outage``: the primary answers every call;
* ``outage``: ``--outage-s`` seconds after the start (by default at 30% of the
  run without outage), the primary answers every request with an HTTP 500 for
  ``--outage-s`` seconds, then recovers.

The table gives each run's makespan and its ratio to the run without outage, the
error rows (target 0), whether every output came once and is the one expected, the
requests each server answered, the calls the primary handed on, and how often its
circuit breaker opened.  The target (issue 37): 0 error rows, every output once, a
makespan at most 1.15x the run without outage.

    .venv/bin/python benchmarks/fallbacks.py [--n 2000] [--latency-ms 400]
        [--concurrency 32] [--outage-s 30] [--write]   # --write: RESULTS.md section 16
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from sections import write_section  # beside this file

import plait
from plait.resources.routing import breaker_for, reset_breakers
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeOpenAIServer

SECTION = "## 16. Fallbacks, circuit breakers and an outage (issue 37)"
#: What the numbers say, kept under them in RESULTS.md.
NOTES = """\
During the outage, the requests of the calls in flight when it began failed at the primary
(and a few of their retries). The fifth failure in a row opened the primary's circuit breaker: from
then on calls went straight to `backup`, including calls already waiting for a slot at the
primary, and calls whose request had just failed moved on instead of retrying there. The breaker
stays open for its 30 s cooldown, past the outage's end, so `backup` answers until a probe finds
the primary back. The makespan is that of the run without an outage because `backup` has slots
of its own: a fallback with less capacity than the primary lengthens the run by the difference.
"""


class ThreeCalls(plait.Module):
    """Draft, revise, shorten: each call waits for the one before."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference("smart", system_prompt="Draft.", max_tokens=16)
        self.revise = plait.LLMInference("smart", system_prompt="Revise.", max_tokens=16)
        self.shorten = plait.LLMInference("smart", system_prompt="Shorten.", max_tokens=16)

    def forward(self, text: str) -> Any:
        return self.shorten(self.revise(self.draft(text)))


def expected(text: str) -> str:
    return f"[Shorten.] [Revise.] [Draft.] {text}"


def resources(primary: FakeOpenAIServer, backup: FakeOpenAIServer, slots: int) -> Any:
    common = {"api_key": "sk-bench", "max_concurrent": slots}
    return plait.ResourceConfig(
        {
            "smart": {
                **common,
                "model": "primary-model",
                "base_url": primary.base_url,
                "fallbacks": ["backup"],
            },
            "backup": {**common, "model": "backup-model", "base_url": backup.base_url},
        }
    )


def run(
    primary: FakeOpenAIServer,
    backup: FakeOpenAIServer,
    args: argparse.Namespace,
    outage_at: float | None,
) -> dict[str, Any]:
    for server in (primary, backup):
        server.reset()
        server.configure(latency_ms=args.latency_ms)
    reset_usage()
    reset_breakers()
    config = resources(primary, backup, args.concurrency)
    pipeline = ThreeCalls().bind(resources=config, max_concurrent=args.concurrency * 2)
    inputs = [f"item {i}" for i in range(args.n)]
    window: list[float] = []

    def outage() -> None:
        assert outage_at is not None
        time.sleep(outage_at)
        primary.configure(rate_500=1.0)
        window.append(time.monotonic())
        time.sleep(args.outage_s)
        primary.configure(rate_500=0.0)
        window.append(time.monotonic())

    fault = threading.Thread(target=outage, daemon=True) if outage_at is not None else None
    start = time.monotonic()
    if fault is not None:
        fault.start()
    outputs = pipeline.run_sync(inputs)
    makespan = time.monotonic() - start
    if fault is not None:
        fault.join()
    errors = sum(1 for out in outputs if isinstance(out, plait.Value))
    right = sum(1 for text, out in zip(inputs, outputs, strict=True) if out == expected(text))
    report = usage()
    return {
        "makespan": makespan,
        "errors": errors,
        "right": right,
        "primary": primary.stats()["status_counts"],
        "backup": backup.stats()["status_counts"],
        "moved_on": report["smart"]["moved_on"],
        "opened": breaker_for(config["smart"]).opened,
        "window": (window[0] - start, window[-1] - start) if len(window) == 2 else None,
    }


def table(rows: list[tuple[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    base = rows[0][1]["makespan"]
    lines = [
        f"{args.n} inputs x 3 calls, {args.latency_ms} ms a reply, {args.concurrency} slots per "
        f"alias; the outage: every primary request answered HTTP 500 for {args.outage_s:g} s.",
        "",
        "| run | makespan | vs no outage | error rows | outputs right, once | primary "
        "answered | backup answered | moved on | breaker opened |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows:
        window = row["window"]
        label = name if window is None else f"{name} ({window[0]:.0f}-{window[1]:.0f} s)"
        lines.append(
            f"| {label} | {row['makespan']:.1f} s | {row['makespan'] / base:.3f}x | "
            f"{row['errors']} | {row['right']} of {args.n} | {_counts(row['primary'])} | "
            f"{_counts(row['backup'])} | {row['moved_on']} | {row['opened']} |"
        )
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {status}" for status, n in sorted(counts.items())) or "0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--latency-ms", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with FakeOpenAIServer() as primary, FakeOpenAIServer() as backup:
        calm = run(primary, backup, args, None)
        hit = run(primary, backup, args, 0.3 * calm["makespan"])
    rows = [("no outage", calm), ("outage", hit)]
    text = table(rows, args)
    print(text)
    if args.write:
        command = (
            f".venv/bin/python benchmarks/fallbacks.py --n {args.n} --latency-ms "
            f"{args.latency_ms} --concurrency {args.concurrency} --outage-s {args.outage_s:g}"
        )
        write_section(SECTION, command, text, NOTES)


if __name__ == "__main__":
    main()
