"""Limits learned from the provider's headers (issue 25, point 2): 429s and throughput.

A fake server enforces a requests/min limit that plait was not told (fixed windows
of ``--window-s`` seconds, each admitting its share of the per-minute limit) and
states it on every reply, in OpenAI's spelling (``x-ratelimit-*``) or Anthropic's
(``anthropic-ratelimit-*``).  One pipeline (one LLM call per input, ``--n`` inputs,
``--in-flight`` at most at once) runs against it:

* ``not learning``: the alias has no limits and ``learn_limits = false``, so plait
  only backs off when refused (a 429's Retry-After, AIMD on concurrency);
* ``learning``: the same alias, learning the limit from the replies (the default);
* ``configured by hand``: the limit written into the alias (``requests_per_minute``)
  and learning off: what a user who copied the limit into ``resources.toml`` gets.

Each row is the median of ``--repeats`` runs (the modes interleaved), each against
a freshly reset server: the server's 429s (its own count), throughput as a fraction
of the server's limit (requests answered / wall time / the limit per second) and the
wall time.  A run starts in the middle of a window, so a fraction a little above 1
is possible for a short run (its first window is partly spent already).

    .venv/bin/python benchmarks/learned_limits.py [--n 150] [--rpm 600] [--repeats 2]
        [--write]   # add the table to benchmarks/RESULTS.md (section 14)
"""

from __future__ import annotations

import argparse
import datetime
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import plait
from plait.resources.manager import use_governors
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeAnthropicServer, FakeOpenAIServer

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
SECTION = "## 14. Limits learned from the provider's headers (issue 25)"
MODES = ("not learning", "learning", "configured by hand")


class Ask(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ask = plait.LLMInference("fast", system_prompt="Answer briefly.", max_tokens=16)

    def forward(self, text: str) -> Any:
        return self.ask(text)


def alias(spelling: str, base_url: str, mode: str, rpm: int, in_flight: int) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "provider": spelling,
        "model": "bench",
        "base_url": base_url,
        "api_key": "sk-bench",
        "max_concurrent": in_flight,
        "max_retries": 50,
        "learn_limits": mode == "learning",
    }
    if mode == "configured by hand":
        settings["requests_per_minute"] = rpm
    return {"fast": settings}


def run_once(
    server: FakeOpenAIServer | FakeAnthropicServer,
    spelling: str,
    mode: str,
    args: argparse.Namespace,
    tag: int,
) -> dict[str, float]:
    server.reset()
    reset_usage()
    # A fresh governor per run: the endpoint's limits live once per process, so a run
    # would otherwise start with what the run before it learned (and its AIMD state).
    use_governors(None)
    settings = alias(spelling, server.base_url, mode, args.rpm, args.in_flight)
    resources = plait.ResourceConfig(settings)
    pipeline = Ask().bind(resources=resources)
    inputs = [f"question {tag}-{i}" for i in range(args.n)]
    started = time.monotonic()
    outputs = pipeline.run_sync(inputs)
    wall = time.monotonic() - started
    assert len(outputs) == args.n and all(isinstance(o, str) for o in outputs), outputs[:3]
    stats = server.stats()
    refused = int(stats["rate_limit"]["refused"])
    assert usage()["fast"]["rate_limited"] == refused
    per_second = args.n / wall
    return {
        "429s": refused,
        "fraction": per_second / (args.rpm / 60.0),
        "wall": wall,
        "per_second": per_second,
    }


def measure(spelling: str, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    limits = {"rpm_limit": args.rpm, "limit_window_s": args.window_s}
    server = (
        FakeOpenAIServer(latency_ms=args.latency_ms, **limits)
        if spelling == "openai"
        else FakeAnthropicServer(**limits)
    )
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with server:
        if spelling == "openai":
            server.configure(latency_ms=args.latency_ms)
        for k in range(args.repeats):
            for mode in MODES if k % 2 == 0 else tuple(reversed(MODES)):
                result = run_once(server, spelling, mode, args, k)
                runs[mode].append(result)
                print(
                    f"  {spelling:9} {mode:18} 429s {result['429s']:4.0f}  "
                    f"{result['per_second']:5.2f}/s = {result['fraction']:.2f} of the limit  "
                    f"wall {result['wall']:5.1f} s",
                    flush=True,
                )
    return runs


def table(results: dict[str, dict[str, list[dict[str, float]]]], args: argparse.Namespace) -> str:
    lines = [
        "| spelling | plait | 429s (median) | throughput / limit | wall (s) | runs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for spelling, runs in results.items():
        for mode in MODES:
            rows = runs[mode]
            lines.append(
                f"| {spelling} | {mode} | {statistics.median(r['429s'] for r in rows):.0f} "
                f"(of {args.n} requests) | "
                f"{statistics.median(r['fraction'] for r in rows):.2f} | "
                f"{statistics.median(r['wall'] for r in rows):.1f} | {len(rows)} |"
            )
    return "\n".join(lines)


def write(text: str, args: argparse.Namespace) -> None:
    command = (
        f".venv/bin/python benchmarks/learned_limits.py --n {args.n} --rpm {args.rpm} "
        f"--window-s {args.window_s:g} --in-flight {args.in_flight} --latency-ms "
        f"{args.latency_ms:g} --repeats {args.repeats}"
        + (" --anthropic" if args.anthropic else "")
        + " --write"
    )
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    section = (
        f"{SECTION}\n\n"
        f"A fake server enforces {args.rpm} requests/min in {args.window_s:g}-second windows "
        f"({args.rpm * args.window_s / 60:g} requests each) and states it on every reply; "
        f"plait's alias is told no limit. One LLM call per input, {args.n} inputs, at most "
        f"{args.in_flight} in flight, server latency {args.latency_ms:g} ms (OpenAI's "
        "spelling; the fake Anthropic server answers at once). Throughput is requests "
        "answered per second over the limit per second; 429s are the server's own count. "
        f"Median of {args.repeats} runs per row, modes interleaved ({today}, 2 cores, "
        "other benchmarks running on the machine):\n\n"
        f"```\n{command}\n```\n\n{text}\n"
    )
    current = RESULTS.read_text(encoding="utf-8")
    if SECTION in current:
        before, _, rest = current.partition(SECTION)
        after = rest.split("\n## ", 1)
        # Subsections written by hand (the CPU a call pays for the headers) stay.
        kept = after[0].partition("\n### ")
        section += f"\n### {kept[2].rstrip()}\n" if kept[1] else ""
        current = before + section + ("\n## " + after[1] if len(after) > 1 else "")
    else:
        current = current.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(current, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150, help="inputs per run (one call each)")
    parser.add_argument("--rpm", type=int, default=600, help="the server's requests/min")
    parser.add_argument("--window-s", type=float, default=1.0, help="the server's window")
    parser.add_argument("--in-flight", type=int, default=16, help="the alias's max_concurrent")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the OpenAI fake's")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--anthropic", action="store_true", help="Anthropic's spelling too")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    logging.getLogger("plait").setLevel(logging.ERROR)
    results = {"openai": measure("openai", args)}
    if args.anthropic:
        results["anthropic"] = measure("anthropic", args)
    text = table(results, args)
    print(text)
    if args.write:
        write(text, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
