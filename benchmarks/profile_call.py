"""Where one LLM call's client CPU goes at zero latency, by plait component.

Scenario 4 of ``run.py`` (extract-and-compare, latency 0) is bound by the client's
CPU, so its cost per call is plait's overhead plus the HTTP client's.  This script
measures it two ways, against the loopback fake OpenAI server:

1. unprofiled: process CPU per call of plait and of ``run.py``'s hand-written
   aiohttp baseline over the same inputs (median of ``--repeats`` interleaved
   runs), the numbers the issue's 1.3x target is about;
2. cProfile of one run of ``--n`` inputs (3 calls each) of plait and then of the
   baseline, on the main thread's ``asyncio.run`` (cProfile sees one thread;
   ``run_sync`` would run the pipeline on plait's runtime thread), timed by the
   thread's CPU clock so other processes on the machine do not count; summarised by
   component (self time of each function grouped by where it lives, C builtins
   charged to the component of the Python code that called them), side by side
   with the baseline's, then plait's largest self times and the cumulative time per
   call of its call path's landmarks.

cProfile inflates everything (about 2x here) and small functions most; compare
shares, and this script's output with an earlier run of itself.

``--fresh K`` measures the unprofiled ratio another way: K rounds, each one plait
process and one baseline process of their own (which goes first alternates), each
warmed up by one run and then timed over ``--repeats`` runs against the same
server.  It reports the median of the K per-round ratios and their spread.  One
process running both sides shares its heap, its allocator and its caches between
them, and the order of the runs inside it; separate processes share only the
machine, which then moves both sides of a round alike.

    .venv/bin/python benchmarks/profile_call.py [--n 2000] [--repeats 5] [--top 25] [--no-profile]
    .venv/bin/python benchmarks/profile_call.py --fresh 9 [--n 1000] [--repeats 3]

``--rate-limit-headers`` has the server state a limit on every reply, too large to
bind, as real providers do: plait then reads the headers and paces by what they say
on every call (issue 25), which this measures.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from run import (  # beside this file (run as a script, its folder is on the path)
    Baseline,
    FanOutFanIn,
    bound_pipeline,
    pin_apart,
)

from plait.testing import FakeOpenAIServer

#: Calls per input of the profiled pipeline (`FanOutFanIn`).
CALLS_PER_INPUT = 3

#: Where a file's code belongs, first match wins: (component, path fragments).
COMPONENTS: list[tuple[str, tuple[str, ...]]] = [
    (
        "module call / tracing",
        (
            "/plait/module.py",
            "/plait/inference.py",
            "/plait/tracing/",
            "/plait/_tracing_hook.py",  # before issue 21
            "/plait/parameter.py",
        ),
    ),
    (
        "handler stack",
        ("/plait/effects.py", "/plait/handlers/stack.py", "/plait/_entries.py"),
    ),
    ("seeds / keys", ("/plait/sampling.py", "/plait/_digest.py", "/plait/handlers/llm.py")),
    (
        "llm call path (execution.calls; functional._invoke before issue 21)",
        ("/plait/execution/calls.py", "/plait/functional.py"),
    ),
    ("engine / graph run", ("/plait/execution/", "/plait/values.py")),
    (
        "limits / endpoint / rate governor",
        ("/plait/resources/",),
    ),
    (
        "provider request building",
        ("/plait/providers/", "/plait/structured.py", "/plait/_secrets.py"),
    ),
    ("other plait", ("/plait/",)),
    ("aiohttp / yarl / multidict", ("/aiohttp/", "/yarl/", "/multidict/")),
    ("json", ("/json/",)),
    ("asyncio", ("/asyncio/",)),
]

#: C functions whose own time is theirs, whoever called them.
BUILTIN_COMPONENTS: list[tuple[str, str]] = [
    ("'_contextvars.ContextVar'", "ContextVars (C)"),
    ("'_contextvars.Context'", "asyncio"),  # Context.run: the loop running a callback
    ("'_socket.socket'", "socket I/O (C)"),
    ("select.epoll", "socket I/O (C)"),
    ("orjson", "json"),
    ("_json", "json"),
    ("_hashlib", "seeds / keys"),
]

#: The call path's landmarks, whose cumulative time per call is shown.
LANDMARKS: list[tuple[str, str]] = [
    ("execution/engine.py", "run_input"),
    ("tracing/tracer.py", "trace"),
    ("tracing/tracer.py", "record_module"),
    ("execution/engine.py", "_run_node"),
    ("execution/engine.py", "_run_llm"),
    ("execution/calls.py", "invoke"),
    ("effects.py", "apply_stack"),
    ("execution/calls.py", "send"),
    ("resources/endpoint.py", "complete"),
    ("resources/endpoint.py", "_send_with_retries"),
    ("providers/openai.py", "send"),
    ("providers/openai.py", "_payload"),
    ("providers/openai.py", "_post"),
    ("aiohttp/client.py", "_request"),
]


def component(file: str, name: str) -> str | None:
    """The component of a Python function, or of a C builtin that is its own (None: a
    builtin to charge to its callers)."""
    if file == "~":
        for marker, group in BUILTIN_COMPONENTS:
            if marker in name:
                return group
        return None
    for group, fragments in COMPONENTS:
        if any(fragment in file for fragment in fragments):
            return group
    return "other"


def short(file: str) -> str:
    for marker in ("/plait/", "/site-packages/", "/lib/python3.11/", "/lib/python3.12/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def by_component(stats: dict[Any, Any]) -> dict[str, float]:
    """Self time per component; a C builtin's is split among its callers by what each
    caller's calls to it cost (a caller that is a builtin too goes to "other C")."""
    groups: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, tt, _ct, callers) in stats.items():
        group = component(file, name)
        if group is not None:
            groups[group] = groups.get(group, 0.0) + tt
            continue
        edges = {caller: edge[2] for caller, edge in callers.items()}
        total = sum(edges.values())
        if not total:
            groups["other C"] = groups.get("other C", 0.0) + tt
            continue
        for (cfile, _cline, cname), share in edges.items():
            owner = component(cfile, cname) or "other C"
            groups[owner] = groups.get(owner, 0.0) + tt * share / total
    return groups


def summary(plait: cProfile.Profile, baseline: cProfile.Profile, calls: int, top: int) -> str:
    """The profiles as tables: components side by side, plait's top functions, landmarks."""
    stats: dict[Any, Any] = pstats.Stats(plait).stats  # type: ignore[attr-defined]
    base: dict[Any, Any] = pstats.Stats(baseline).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    base_total = sum(v[2] for v in base.values())
    mine, theirs = by_component(stats), by_component(base)
    lines = [
        f"cProfile (this thread's CPU time): plait {total / calls * 1e6:.1f} us per call, "
        f"baseline {base_total / calls * 1e6:.1f} us per call, over {calls} calls each "
        "(inflated by the profiler, small functions most).",
        "",
        "Self time by component (C builtins charged to their Python callers), us per call:",
        "",
        "| component | plait | share of plait | baseline | plait - baseline |",
        "|---|---:|---:|---:|---:|",
    ]
    for group in sorted(set(mine) | set(theirs), key=lambda g: -mine.get(g, 0.0)):
        ours, other = mine.get(group, 0.0), theirs.get(group, 0.0)
        lines.append(
            f"| {group} | {ours / calls * 1e6:.1f} | {ours / total:.1%} | "
            f"{other / calls * 1e6:.1f} | {(ours - other) / calls * 1e6:+.1f} |"
        )
    lines.append(
        f"| total | {total / calls * 1e6:.1f} | 100% | {base_total / calls * 1e6:.1f} | "
        f"{(total - base_total) / calls * 1e6:+.1f} |"
    )
    rows = sorted(
        ((v[2], v[1], key) for key, v in stats.items()), key=lambda row: row[0], reverse=True
    )
    lines += [
        "",
        f"plait's top {top} functions by self time:",
        "",
        "| us per call | calls per call | component | function |",
        "|---:|---:|---|---|",
    ]
    for tt, nc, (file, line, name) in rows[:top]:
        group = component(file, name) or "C (charged to callers)"
        lines.append(
            f"| {tt / calls * 1e6:.1f} | {nc / calls:.2f} | {group} | "
            f"`{short(file)}:{line}({name})` |"
        )
    lines += [
        "",
        "Cumulative time per call of plait's call path, outermost first (a coroutine's "
        "includes what it awaited inside each of its steps):",
        "",
        "| us per call | function |",
        "|---:|---|",
    ]
    for fragment, wanted in LANDMARKS:
        found = [
            (v[3], key)
            for key, v in stats.items()
            if key[2] == wanted and key[0].endswith(fragment)
        ]
        for ct, (file, line, name) in found:
            lines.append(f"| {ct / calls * 1e6:.1f} | `{short(file)}:{line}({name})` |")
    return "\n".join(lines)


def cpu_per_call(fn: Callable[[], Any], calls: int) -> float:
    """Process CPU milliseconds per call of one run of ``fn``."""
    cpu0 = time.process_time()
    fn()
    return (time.process_time() - cpu0) / calls * 1000


def measure_side(side: str, base_url: str, n: int, repeats: int) -> list[float]:
    """CPU ms per call of ``repeats`` runs of one side, in this process, after a
    warm-up run (imports, connections)."""
    inputs = [f"document number {i}" for i in range(n)]
    calls = CALLS_PER_INPUT * n
    if side == "plait":
        pipeline = bound_pipeline(FanOutFanIn, base_url, 32)

        def once() -> Any:
            return pipeline.run_sync(inputs)

        once()
        return [cpu_per_call(once, calls) for _ in range(repeats)]
    base = Baseline(base_url, 32)
    loop = asyncio.new_event_loop()

    def base_once() -> Any:
        return loop.run_until_complete(base.run(base.fan, inputs))

    base_once()
    try:
        return [cpu_per_call(base_once, calls) for _ in range(repeats)]
    finally:
        loop.run_until_complete(base.close())
        loop.close()


def fresh_rounds(base_url: str, rounds: int, n: int, repeats: int) -> list[tuple[float, float]]:
    """``rounds`` pairs of (plait, baseline) CPU ms per call, each side measured in a
    process of its own (the median of its ``repeats`` runs), which side goes first
    alternating from round to round."""
    pairs = []
    for k in range(rounds):
        order = ("plait", "baseline") if k % 2 == 0 else ("baseline", "plait")
        got: dict[str, float] = {}
        for side in order:
            argv = ["--child", side, "--url", base_url, "--n", str(n), "--repeats", str(repeats)]
            done = subprocess.run(
                [sys.executable, __file__, *argv],
                capture_output=True,
                text=True,
                check=True,
            )
            got[side] = statistics.median(json.loads(done.stdout.splitlines()[-1]))
        pairs.append((got["plait"], got["baseline"]))
    return pairs


def report_fresh(pairs: list[tuple[float, float]], n: int, repeats: int, pinned: bool) -> None:
    ratios = sorted(p / b for p, b in pairs)
    quart = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    print(
        f"FanOutFanIn, N={n} ({CALLS_PER_INPUT * n} calls), latency 0, "
        f"{'server on its own CPU' if pinned else 'server sharing the CPUs'}; "
        f"{len(pairs)} rounds of one plait and one baseline process each (median of "
        f"{repeats} runs after a warm-up), first side alternating:"
    )
    print(
        f"  plait / baseline: median {statistics.median(ratios):.3f}, quartiles "
        f"{quart[0]:.3f}-{quart[2]:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}"
    )
    plait_ms = statistics.median(p for p, _ in pairs)
    base_ms = statistics.median(b for _, b in pairs)
    print(
        f"  CPU per call, median over rounds: plait {plait_ms:.4f} ms, baseline "
        f"{base_ms:.4f} ms, plait's own {(plait_ms - base_ms) * 1000:.1f} us"
    )
    for k, (p, b) in enumerate(pairs):
        print(f"  round {k + 1}: plait {p:.4f}, baseline {b:.4f}, ratio {p / b:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="inputs per run (3 calls each)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="unprofiled runs of each (0: profile only)"
    )
    parser.add_argument("--top", type=int, default=25, help="functions listed by self time")
    parser.add_argument("--no-pin", action="store_true", help="server and client share CPUs")
    parser.add_argument(
        "--no-profile", action="store_true", help="only the unprofiled CPU per call"
    )
    parser.add_argument(
        "--save", type=Path, help="also dump the raw profiles (pstats; the baseline's beside)"
    )
    parser.add_argument(
        "--fresh", type=int, default=0, help="rounds of one process per side (see above)"
    )
    parser.add_argument(
        "--rate-limit-headers",
        action="store_true",
        help="the server states a limit too large to bind on every reply (OpenAI's "
        "x-ratelimit-* headers, as real providers send them): the cost of reading them",
    )
    parser.add_argument("--child", choices=["plait", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one side of a --fresh round: its runs' CPU per call, as JSON
        print(json.dumps(measure_side(args.child, args.url, args.n, args.repeats)))
        return 0
    inputs = [f"document number {i}" for i in range(args.n)]
    calls = CALLS_PER_INPUT * args.n
    limits = {"rpm_limit": 10**9, "tpm_limit": 10**12} if args.rate_limit_headers else {}
    with FakeOpenAIServer(**limits) as server:
        pinned = not args.no_pin and pin_apart(server.pid)
        server.configure(latency_ms=0.0)
        if args.fresh:
            pairs = fresh_rounds(server.base_url, args.fresh, args.n, args.repeats)
            report_fresh(pairs, args.n, args.repeats, pinned)
            return 0
        pipeline = bound_pipeline(FanOutFanIn, server.base_url, 32)
        base = Baseline(server.base_url, 32)
        loop = asyncio.new_event_loop()

        def plait_once() -> Any:
            return pipeline.run_sync(inputs)

        def base_once() -> Any:
            return loop.run_until_complete(base.run(base.fan, inputs))

        plait_cpu, base_cpu = [], []
        if args.repeats:
            plait_once()  # warm: imports, connections
            base_once()
        for _ in range(args.repeats):
            plait_cpu.append(cpu_per_call(plait_once, calls))
            base_cpu.append(cpu_per_call(base_once, calls))
        loop.run_until_complete(base.close())
        loop.close()
        if args.repeats:
            p, b = statistics.median(plait_cpu), statistics.median(base_cpu)
            print(
                f"FanOutFanIn, N={args.n} ({calls} calls), latency 0, "
                f"{'server on its own CPU' if pinned else 'server sharing the CPUs'}; "
                f"median of {args.repeats} unprofiled runs, interleaved:"
            )
            print(
                f"  CPU per call: plait {p:.4f} ms, baseline {b:.4f} ms, plait / baseline "
                f"{p / b:.3f}, plait's own {(p - b) * 1000:.1f} us per call"
            )
            print(f"  plait runs: {', '.join(f'{x:.4f}' for x in plait_cpu)}")
            print(f"  baseline runs: {', '.join(f'{x:.4f}' for x in base_cpu)}")
            print()

        if args.no_profile:
            return 0
        # This thread's CPU time, not the wall clock: on a shared machine a wall-clock
        # profile charges whatever function was running to the time others held the CPU.
        prof = cProfile.Profile(time.thread_time)
        base_prof = cProfile.Profile(time.thread_time)
        base = Baseline(server.base_url, 32)

        async def go() -> Any:
            await pipeline(inputs[:50])  # this loop's session and connections
            await base.run(base.fan, inputs[:50])
            prof.enable()
            out = await pipeline(inputs)
            prof.disable()
            base_prof.enable()
            await base.run(base.fan, inputs)
            base_prof.disable()
            await base.close()
            return out

        outputs = asyncio.run(go())
        assert len(outputs) == args.n and all(isinstance(o, str) for o in outputs)
    if args.save is not None:
        prof.dump_stats(args.save)
        base_prof.dump_stats(args.save.with_name(args.save.stem + ".baseline.prof"))
    print(summary(prof, base_prof, calls, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
