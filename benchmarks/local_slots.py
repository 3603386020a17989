"""The embedded model's throughput with 1, 2, 4 and 8 parallel slots (issue 23).

A batch of 64 short chat calls (32 tokens each at most, temperature 0) goes to the
embedded model (SmolLM2-135M-Instruct, in-process) through plait's `LocalProvider`,
all at once, as a pipeline's calls would.  Each slot count gets a fresh process, so
the model is loaded with that many slots (the first load decides them), and the
model load is timed apart from the batch.  Reported: calls/s, completion tokens/s
and the load time.

Run from an older checkout it measures the provider there (before issue 23: one
generation at a time, behind a lock), which is how RESULTS.md compares the two.

    .venv/bin/python benchmarks/local_slots.py [--calls 64] [--slots 1,2,4,8] [--no-prompt-caching]

``--no-prompt-caching`` computes every prompt whole (the alias setting
``prompt_caching = false``: answers reproducible to the bit, at a price this measures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

PROMPTS = [
    "Name a fruit.",
    "Say a colour.",
    "Give a number between one and ten.",
    "Name an animal.",
]


def child(calls: int, slots: int, caching: bool) -> dict[str, Any]:
    """One measurement in this process: load the model, then the batch."""
    from plait.providers.base import LLMRequest
    from plait.providers.local import LocalProvider
    from plait.resources.config import EndpointConfig

    settings: dict[str, Any] = {} if caching else {"prompt_caching": False}
    provider = LocalProvider(EndpointConfig(provider="local", max_concurrent=slots, **settings))

    def ask(i: int) -> LLMRequest:
        text = f"{PROMPTS[i % len(PROMPTS)]} ({i})"
        message = {"role": "user", "content": text}
        return LLMRequest(alias="local", messages=[message], max_tokens=32, temperature=0)

    async def run() -> dict[str, Any]:
        started = time.perf_counter()
        await provider.send(ask(-1))  # loads the model
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        replies = await asyncio.gather(*(provider.send(ask(i)) for i in range(calls)))
        wall = time.perf_counter() - started
        tokens = sum(r.usage.completion_tokens for r in replies)
        return {
            "slots": slots,
            "calls": calls,
            "load_s": loaded,
            "wall_s": wall,
            "calls_per_s": calls / wall,
            "tokens_per_s": tokens / wall,
            "tokens": tokens,
        }

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--slots", default="1,2,4,8")
    parser.add_argument("--no-prompt-caching", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        result = child(args.calls, args.child, not args.no_prompt_caching)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    rows = []
    for slots in [int(s) for s in args.slots.split(",")]:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(slots), "--calls", str(args.calls)]
            + (["--no-prompt-caching"] if args.no_prompt_caching else []),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        row = json.loads(out.split("RESULT ", 1)[1])
        rows.append(row)
        print(
            f"{slots} slot(s): {row['calls_per_s']:.2f} calls/s, {row['tokens_per_s']:.1f} "
            f"tokens/s ({row['tokens']} tokens in {row['wall_s']:.1f} s), "
            f"load {row['load_s']:.2f} s",
            flush=True,
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
