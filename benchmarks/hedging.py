"""Hedged requests against a tail of stalled ones (issue 37, point 6c).

A fake OpenAI server answers after ``--latency-ms``, except a share ``--stall`` of
requests (drawn by the server's seeded stream), which it answers ``--stall-s`` seconds
later, as a slow replica would.  ``--n`` one-call inputs run on one alias with
``--concurrency`` slots, twice:

* ``no hedging``;
* ``hedge_after="p95"``, ``max_hedge_fraction`` at ``--fraction``.

The table gives the p50 and p99 call latency (`plait.usage()`'s percentiles of the
calls' attempts), the makespan, the requests sent (extra ones as a share of the
calls) and the error rows.  The target (issue 37): hedging cuts the p99 at least 5x
and the makespan at least 2x, with at most 5% extra requests.

    .venv/bin/python benchmarks/hedging.py [--n 2000] [--latency-ms 50] [--stall 0.02]
        [--stall-s 10] [--concurrency 64] [--fraction 0.05] [--write]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sections import write_section  # beside this file

import plait
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeOpenAIServer

SECTION = "## 18. Hedged requests against stalled ones (issue 37)"
#: What the numbers say, kept under them in RESULTS.md.
NOTES = """\
A copy waits for no call: it takes the next free slot ahead of every queued call (in a
saturated batch there is never a free one at once, and the first version of this measurement,
which sent a copy only into a free slot, hedged 4 of 40 stalled calls and changed nothing). The
calls sent before 20 replies had come in (the p95 unknown) look again every 0.5 s, so the first
wave's stalled calls are hedged too.
"""


def run(server: FakeOpenAIServer, args: argparse.Namespace, hedge: bool) -> dict[str, Any]:
    server.reset()
    server.configure(
        latency_ms=args.latency_ms, rate_stall=args.stall, stall_s=args.stall_s, seed=args.seed
    )
    reset_usage()
    fast: dict[str, Any] = {
        "model": "bench",
        "base_url": server.base_url,
        "api_key": "sk-bench",
        "max_concurrent": args.concurrency,
        "timeout": args.stall_s * 3,
    }
    if hedge:
        fast.update(hedge_after="p95", max_hedge_fraction=args.fraction)
    resources = plait.ResourceConfig({"fast": fast})
    llm = plait.LLMInference("fast", "Answer.", max_tokens=8).bind(
        resources=resources, max_concurrent=args.concurrency
    )
    inputs = [f"question {i}" for i in range(args.n)]
    start = time.monotonic()
    outputs = llm.run_sync(inputs)
    makespan = time.monotonic() - start
    row = usage()["fast"]
    return {
        "p50": row["latency_p50_s"],
        "p99": row["latency_p99_s"],
        "makespan": makespan,
        "requests": row["requests"],
        "hedged": row["hedged"],
        "stalled": sum(1 for r in server.stats()["requests"] if r["t_end"] - r["t_start"] > 1.0),
        "errors": sum(1 for out in outputs if isinstance(out, plait.Value)),
    }


def table(plain: dict[str, Any], hedged: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"{args.n} calls, {args.latency_ms} ms a reply, {args.stall:.0%} of requests answered "
        f"{args.stall_s:g} s late, {args.concurrency} slots.",
        "",
        "| run | p50 call | p99 call | makespan | requests | extra | error rows |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in (
        ("no hedging", plain),
        (f'hedge_after="p95", at most {args.fraction:.0%}', hedged),
    ):
        lines.append(
            f"| {name} | {row['p50'] * 1000:.0f} ms | {row['p99'] * 1000:.0f} ms | "
            f"{row['makespan']:.1f} s | {row['requests']} | "
            f"{(row['requests'] - args.n) / args.n:.1%} | {row['errors']} |"
        )
    lines += [
        "",
        f"p99 {plain['p99'] / hedged['p99']:.1f}x lower, makespan "
        f"{plain['makespan'] / hedged['makespan']:.1f}x shorter with hedging.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--latency-ms", type=int, default=50)
    parser.add_argument("--stall", type=float, default=0.02)
    parser.add_argument("--stall-s", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with FakeOpenAIServer() as server:
        plain = run(server, args, hedge=False)
        hedged = run(server, args, hedge=True)
    text = table(plain, hedged, args)
    print(text)
    if args.write:
        write_section(
            SECTION,
            f".venv/bin/python benchmarks/hedging.py --n {args.n} --latency-ms {args.latency_ms} "
            f"--stall {args.stall:g} --stall-s {args.stall_s:g} --concurrency {args.concurrency} "
            f"--fraction {args.fraction:g}",
            text,
            NOTES,
        )


if __name__ == "__main__":
    main()
