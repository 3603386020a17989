"""plait against its lower bound and a hand-written asyncio baseline (issue 7).

Starts the loopback fake OpenAI server (on a CPU of its own; ``--no-pin`` to share),
runs each scenario several times with plait and with a baseline written by hand
(asyncio + aiohttp, the HTTP client plait uses, + an ``asyncio.Semaphore(C)``, the
same request JSON and headers and the same dependency structure, no framework),
and writes ``benchmarks/RESULTS.md``.  Lower bound: ``max(k*L, ceil(N*c/C)*L)``
with k levels on the critical path, c calls per input, C requests in flight.

Targets: every 50 ms scenario within 1.10x of its bound; framework + client CPU
at most 0.5 ms per call (zero-latency scenario); peak RSS at 100,000 inputs no
more than 1.5x that at 10,000 (each in a fresh subprocess, plait streaming the
results and dropping them); one alias at C=4 under a larger run cap kept at its
limit at least 0.75 of the time the server is busy (scenario 6; "time at limit" is
the server's time with exactly C requests in flight / its time with any); a
checkpointed `plait run` at most 1.2x the time of the same run without one
(scenario 7, `checkpoint_cost.py`); a run on Ray workers never waiting for slots
an earlier run left held (scenario 8, `scale_out.py`, which also reports throughput
with 1, 2 and 4 workers, the broker's cost and start-up).  Exits non-zero, naming
it, when a target is missed.

    .venv/bin/python benchmarks/run.py [--repeats 7] [--quick] [--no-pin]

``--scenarios 1,4`` runs only those scenarios of the table and prints their rows
(nothing is written, no other section is measured): a quick before/after of a change.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import json
import math
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

import plait
from plait.testing import FakeOpenAIServer

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
MODEL = "bench"
API_KEY = "sk-bench"
RATIO_TARGET = 1.10
CPU_TARGET_MS = 0.5
RSS_TARGET = 1.5
SATURATION_TARGET = 0.75
WIDTH = 20
CHAIN = 5


# -- plait pipelines -------------------------------------------------------------------
class FanOutFanIn(plait.Module):
    """Extract-and-compare: 2 parallel calls, then 1 combining them."""

    def __init__(self) -> None:
        super().__init__()
        self.left = plait.LLMInference("llm", system_prompt="Extract the facts.")
        self.right = plait.LLMInference("llm", system_prompt="Extract the risks.")
        self.combine = plait.LLMInference("llm", system_prompt="Compare.")

    def forward(self, doc: str) -> Any:
        return self.combine(f"Facts: {self.left(doc)}\nRisks: {self.right(doc)}")


class Chain(plait.Module):
    """CHAIN sequential calls, each on the previous one's output."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(CHAIN):
            setattr(self, f"step{i}", plait.LLMInference("llm", system_prompt=f"Step {i}."))

    def forward(self, doc: str) -> Any:
        text: Any = doc
        for i in range(CHAIN):
            text = getattr(self, f"step{i}")(text)
        return text


class Wide(plait.Module):
    """WIDTH parallel calls, then 1 combining them all."""

    def __init__(self) -> None:
        super().__init__()
        for j in range(WIDTH):
            setattr(self, f"aspect{j}", plait.LLMInference("llm", system_prompt=f"Aspect {j}."))
        self.combine = plait.LLMInference("llm", system_prompt="Combine.")

    def forward(self, doc: str) -> Any:
        parts = [getattr(self, f"aspect{j}")(doc) for j in range(WIDTH)]
        return self.combine("\n".join(["{}"] * WIDTH).format(*parts))


class Single(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("llm", system_prompt="Summarise.")

    def forward(self, doc: str) -> Any:
        return self.llm(doc)


def bound_pipeline(cls: type[plait.Module], base_url: str, in_flight: int) -> plait.Module:
    resources = plait.ResourceConfig(
        {
            "llm": {
                "provider": "openai",
                "model": MODEL,
                "base_url": base_url,
                "api_key": API_KEY,
                "max_concurrent": in_flight,
            }
        }
    )
    return cls().bind(resources=resources, max_concurrent=in_flight * 4)


# -- the hand-written baseline ---------------------------------------------------------
class Baseline:
    """asyncio + aiohttp + a semaphore: what one would write without a framework."""

    def __init__(self, base_url: str, in_flight: int) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
        self.timeout = aiohttp.ClientTimeout(total=600)
        self.in_flight = in_flight
        self.session: aiohttp.ClientSession | None = None
        self.sem: asyncio.Semaphore | None = None

    async def call(self, system: str, user: str) -> str:
        assert self.session is not None and self.sem is not None
        body = {
            "model": MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }
        data = json.dumps(body).encode()
        async with (
            self.sem,
            self.session.post(
                self.url, data=data, headers=self.headers, timeout=self.timeout
            ) as resp,
        ):
            raw = await resp.read()
            resp.raise_for_status()
        return json.loads(raw)["choices"][0]["message"]["content"] or ""

    async def fan(self, doc: str) -> str:
        facts, risks = await asyncio.gather(
            self.call("Extract the facts.", doc), self.call("Extract the risks.", doc)
        )
        return await self.call("Compare.", f"Facts: {facts}\nRisks: {risks}")

    async def chain(self, doc: str) -> str:
        text = doc
        for i in range(CHAIN):
            text = await self.call(f"Step {i}.", text)
        return text

    async def single(self, doc: str) -> str:
        return await self.call("Summarise.", doc)

    async def wide(self, doc: str) -> str:
        parts = await asyncio.gather(*(self.call(f"Aspect {j}.", doc) for j in range(WIDTH)))
        return await self.call("Combine.", "\n".join(parts))

    async def run(self, per_input: Callable[[str], Awaitable[str]], inputs: list[str]) -> list[str]:
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            self.session = aiohttp.ClientSession(connector=connector, trust_env=False)
            self.sem = asyncio.Semaphore(self.in_flight)
        return list(await asyncio.gather(*(per_input(doc) for doc in inputs)))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


# -- scenarios -------------------------------------------------------------------------
@dataclass
class Scenario:
    name: str
    pipeline: type[plait.Module]
    baseline: str  # name of the Baseline method
    n: int
    latency_ms: float
    in_flight: int
    calls_per_input: int
    levels: int

    def bound(self) -> float:
        calls = self.n * self.calls_per_input
        per = self.latency_ms / 1000
        return max(self.levels * per, math.ceil(calls / self.in_flight) * per)


def time_at_limit(stats: dict[str, Any], limit: int) -> float:
    """Share of the server's busy time with exactly ``limit`` requests in flight."""
    busy = stats["busy_time_s"]
    return stats["time_at_level_s"].get(str(limit), 0.0) / busy if busy else 0.0


def timed(fn: Callable[[], list[Any]], server: FakeOpenAIServer, sc: Scenario) -> dict[str, Any]:
    server.reset()
    cpu0, t0 = time.process_time(), time.perf_counter()
    outputs = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stats = server.stats()
    calls = sc.n * sc.calls_per_input
    assert len(outputs) == sc.n and all(isinstance(o, str) for o in outputs), "lost outputs"
    assert stats["requests_total"] == calls, (sc.name, stats["requests_total"], calls)
    return {
        "wall": wall,
        "cpu_per_call_ms": cpu / calls * 1000,
        "max_in_flight": stats["max_in_flight"],
        "requests": stats["requests_total"],
        "at_limit": time_at_limit(stats, sc.in_flight),
    }


def run_scenario(
    server: FakeOpenAIServer, loop: asyncio.AbstractEventLoop, sc: Scenario, repeats: int
) -> dict[str, Any]:
    server.configure(latency_ms=sc.latency_ms)
    inputs = [f"document number {i}" for i in range(sc.n)]
    pipeline = bound_pipeline(sc.pipeline, server.base_url, sc.in_flight)
    base = Baseline(server.base_url, sc.in_flight)
    per_input = getattr(base, sc.baseline)

    def plait_once() -> list[Any]:
        return pipeline.run_sync(inputs)

    def base_once() -> list[Any]:
        return loop.run_until_complete(base.run(per_input, inputs))

    cold = timed(plait_once, server, sc)  # warm-up (the cold first run)
    timed(base_once, server, sc)  # baseline warm-up
    plait_runs, base_runs = [], []
    for _ in range(repeats):  # interleaved, so drift hits both alike
        plait_runs.append(timed(plait_once, server, sc))
        base_runs.append(timed(base_once, server, sc))
    loop.run_until_complete(base.close())

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    bound = sc.bound()
    return {
        "scenario": sc,
        "bound": bound,
        "cold": cold["wall"],
        "wall": med(plait_runs, "wall"),
        "wall_min": min(r["wall"] for r in plait_runs),
        "wall_max": max(r["wall"] for r in plait_runs),
        "base_wall": med(base_runs, "wall"),
        "cpu": med(plait_runs, "cpu_per_call_ms"),
        "base_cpu": med(base_runs, "cpu_per_call_ms"),
        "max_in_flight": max(r["max_in_flight"] for r in plait_runs),
        "base_max_in_flight": max(r["max_in_flight"] for r in base_runs),
        "at_limit": med(plait_runs, "at_limit"),
        "base_at_limit": med(base_runs, "at_limit"),
        "requests": plait_runs[0]["requests"],
        "expected": sc.n * sc.calls_per_input,
    }


# -- peak RSS: one fresh process per size ----------------------------------------------
def rss_child(base_url: str, n: int, in_flight: int) -> None:
    pipeline = bound_pipeline(Single, base_url, in_flight)

    async def consume() -> tuple[int, int]:
        count = bad = 0
        async for result in pipeline.stream(f"document number {i}" for i in range(n)):
            count += 1  # the result is dropped: only the framework's memory is measured
            bad += not result.ok
        return count, bad

    cpu0, t0 = time.process_time(), time.perf_counter()
    count, bad = asyncio.run(consume())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"n": count, "errors": bad, "wall": wall, "cpu": cpu, "maxrss_kb": rss_kb}))


def measure_rss(server: FakeOpenAIServer, n: int, in_flight: int) -> dict[str, Any]:
    server.configure(latency_ms=1.0)
    server.reset()
    cmd = [sys.executable, __file__, "--rss-child", str(n), "--base-url", server.base_url]
    cmd += ["--in-flight", str(in_flight)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    child = json.loads(out.strip().splitlines()[-1])
    stats = server.stats()
    assert child["n"] == n and child["errors"] == 0, child
    assert stats["requests_total"] == n, (stats["requests_total"], n)
    child["max_in_flight"] = stats["max_in_flight"]
    child["requests"] = stats["requests_total"]
    child["calls_per_s"] = n / child["wall"]
    child["cpu_per_call_ms"] = child["cpu"] / n * 1000
    child["bound"] = max(1.0, math.ceil(n / in_flight) * 1.0) / 1000
    return child


# -- profile of plait's side at zero latency --------------------------------------------
def profile_plait(server: FakeOpenAIServer, n: int, top: int = 15) -> str:
    """cProfile plait's zero-latency run on this thread (run_sync would use another)."""
    server.configure(latency_ms=0.0)
    pipeline = bound_pipeline(FanOutFanIn, server.base_url, 32)
    inputs = [f"document number {i}" for i in range(n)]

    async def go() -> Any:
        await pipeline(inputs[:50])  # warm: imports, connections
        prof.enable()
        out = await pipeline(inputs)
        prof.disable()
        return out

    prof = cProfile.Profile()
    asyncio.run(go())
    st = pstats.Stats(prof)
    calls = 3 * n
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    groups: dict[str, float] = {}
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        group = classify(file)
        groups[group] = groups.get(group, 0.0) + tt
        rows.append((tt, nc, f"{short(file)}:{line}({func})"))
    rows.sort(reverse=True)
    lines = [
        f"cProfile of plait, extract-and-compare N={n}, latency 0 ({calls} calls): "
        f"{total:.2f} s profiled tottime, {total / calls * 1000:.3f} ms per call "
        "(cProfile inflates this ~2x; shares are what matter).",
        "",
        "By package (share of tottime):",
        "",
    ]
    for group, tt in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"- {group}: {tt / total:.0%} ({tt / calls * 1e6:.0f} us per call)")
    lines += ["", f"Top {top} functions by tottime:", "", "| tottime s | calls | function |"]
    lines.append("|---:|---:|---|")
    for tt, nc, name in rows[:top]:
        lines.append(f"| {tt:.3f} | {nc} | `{name}` |")
    return "\n".join(lines)


def classify(file: str) -> str:
    if "/plait/" in file:
        return "plait"
    for pkg in ("aiohttp", "yarl", "multidict", "asyncio", "json"):
        if f"/{pkg}/" in file:
            return pkg
    if file == "~":
        return "builtins (C)"
    return "other"


def short(file: str) -> str:
    for marker in ("/plait/", "/site-packages/", "/lib/python3.11/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


# -- driver ----------------------------------------------------------------------------
def pin_apart(server_pid: int) -> bool:
    """Give the fake server a CPU of its own and this process the others.

    The server stands in for a remote endpoint, which would not compete with the
    client for its cores; sharing them adds scheduler noise (migrations, a busy
    server delaying plait's loop) that no real deployment has.  Called before the
    first run, so plait's runtime thread (and the RSS children) inherit the affinity.
    """
    if not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return False
    os.sched_setaffinity(server_pid, {cpus[-1]})
    os.sched_setaffinity(0, set(cpus[:-1]))
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="short smoke run (not the targets)")
    parser.add_argument(
        "--no-pin", action="store_true", help="let the server and plait share every CPU"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--scenarios",
        help="comma-separated scenario numbers (1,2,3,4,6) to run alone: their table rows "
        "are printed, RESULTS.md is left as it is",
    )
    parser.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, default=256, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        rss_child(args.base_url, args.rss_child, args.in_flight)
        return 0

    started = time.perf_counter()
    repeats = 2 if args.quick else args.repeats
    scenarios = [
        Scenario("1. extract-and-compare (2 ∥ then 1)", FanOutFanIn, "fan", 200, 50.0, 32, 3, 2),
        Scenario(f"2. chain of {CHAIN}", Chain, "chain", 200, 50.0, 32, CHAIN, CHAIN),
        Scenario(f"3. fan-out {WIDTH} then fan-in", Wide, "wide", 50, 50.0, 32, WIDTH + 1, 2),
        Scenario("4. zero latency (extract-and-compare)", FanOutFanIn, "fan", 2000, 0.0, 32, 3, 2),
        # Was a test (issue 10): one alias's limit kept full across a whole batch.
        Scenario("6. one alias at C=4, run cap 16", Single, "single", 400, 20.0, 4, 1, 1),
    ]
    chosen = scenarios
    if args.scenarios:
        wanted = {part.strip() for part in args.scenarios.split(",") if part.strip()}
        chosen = [sc for sc in scenarios if sc.name.split(".", 1)[0] in wanted]
        if len(chosen) != len(wanted):
            known = ", ".join(sc.name.split(".", 1)[0] for sc in scenarios)
            parser.error(f"--scenarios {args.scenarios!r}: the scenarios are {known}")
    small, large = (2_000, 20_000) if args.quick else (10_000, 100_000)
    with FakeOpenAIServer() as server:
        pinned = not args.no_pin and pin_apart(server.pid)
        where = "server on its own CPU" if pinned else "server sharing the CPUs"
        print(f"({where}; the client process on the rest)", flush=True)
        loop = asyncio.new_event_loop()
        results = []
        for sc in chosen:
            r = run_scenario(server, loop, sc, repeats)
            results.append(r)
            print_result(r, repeats)
        loop.close()
        if chosen is not scenarios:
            print("\n".join(["", *table_rows(results)]))
            print(f"({time.perf_counter() - started:.0f} s; RESULTS.md not written)")
            return 0
        rss = {}
        for n in (small, large):
            rss[n] = measure_rss(server, n, 256)
            c = rss[n]
            print(
                f"5. single call streamed, N={n}, L=1 ms, C=256: peak RSS "
                f"{c['maxrss_kb'] / 1024:.1f} MiB, {c['calls_per_s']:.0f} calls/s, wall "
                f"{c['wall']:.2f} s, CPU/call {c['cpu_per_call_ms']:.3f} ms, server max in "
                f"flight {c['max_in_flight']}",
                flush=True,
            )
        profile = profile_plait(server, 2000)
        import checkpoint_cost  # beside this file (run as a script, its folder is on the path)

        ckpt = checkpoint_cost.measure(
            server, 2_000 if args.quick else 20_000, 1 if args.quick else 3
        )
        import scale_out  # beside this file, as checkpoint_cost

        scale = scale_out.measure(
            server, 1_000 if args.quick else 3_000, 1 if args.quick else 2, 1 if args.quick else 3
        )

    missed = []
    for r in results:
        sc = r["scenario"]
        ratio = r["wall"] / r["bound"] if r["bound"] else math.inf
        if sc.latency_ms == 50.0 and ratio > RATIO_TARGET:
            missed.append(
                f"{sc.name}: ratio to bound {ratio:.3f} > {RATIO_TARGET} (hand-written "
                f"baseline {r['base_wall'] / r['bound']:.3f}, plait / baseline "
                f"{r['wall'] / r['base_wall']:.3f})"
            )
    zero = results[3]
    if zero["cpu"] > CPU_TARGET_MS:
        missed.append(f"zero-latency client CPU per call {zero['cpu']:.3f} ms > {CPU_TARGET_MS} ms")
    held = results[4]
    if held["at_limit"] < SATURATION_TARGET:
        missed.append(
            f"{held['scenario'].name}: time at limit {held['at_limit']:.3f} < "
            f"{SATURATION_TARGET} (hand-written baseline {held['base_at_limit']:.3f})"
        )
    rss_ratio = rss[large]["maxrss_kb"] / rss[small]["maxrss_kb"]
    if rss_ratio > RSS_TARGET:
        missed.append(f"peak RSS N={large} / N={small} = {rss_ratio:.2f} > {RSS_TARGET}")
    missed += checkpoint_cost.missed(ckpt)
    missed += scale_out.missed(scale)
    elapsed = time.perf_counter() - started
    text = report(args, results, rss, small, large, missed, profile, pinned, elapsed, repeats)
    notes = text.index("## Notes")
    spliced = checkpoint_cost.section(ckpt) + scale_out.section(scale)
    text = text[:notes] + "\n".join(spliced) + "\n" + text[notes:]
    import learning  # beside this file: its section (measured on its own, slowly) is kept

    args.output.write_text(learning.keep_section(args.output, text))
    print(f"wrote {args.output} ({elapsed:.0f} s)")
    for m in missed:
        print(f"TARGET MISSED: {m}")
    return 1 if missed else 0


def ratio_s(wall: float, bound: float) -> str:
    return f"{wall / bound:.3f}" if bound else "n/a (bound 0)"


def print_result(r: dict[str, Any], repeats: int) -> None:
    sc = r["scenario"]
    b = r["bound"]
    print(f"{sc.name}: N={sc.n}, L={sc.latency_ms:g} ms, C={sc.in_flight}", flush=True)
    if sc.name.startswith("1."):
        print(f"  cold first run {r['cold']:.3f} s (ratio {r['cold'] / b:.3f})")
    print(
        f"  warm: median wall {r['wall']:.3f} s over {repeats} runs (min {r['wall_min']:.3f}, "
        f"max {r['wall_max']:.3f}), lower bound {b:.3f} s, ratio {ratio_s(r['wall'], b)}; "
        f"baseline {r['base_wall']:.3f} s, plait/baseline {r['wall'] / r['base_wall']:.3f}"
    )
    print(
        f"  client CPU per call {r['cpu']:.3f} ms (baseline {r['base_cpu']:.3f}); server max "
        f"in flight {r['max_in_flight']} (baseline {r['base_max_in_flight']}), time at "
        f"limit {r['at_limit']:.3f} (baseline {r['base_at_limit']:.3f}); requests "
        f"{r['requests']} (expected {r['expected']})",
        flush=True,
    )


def table_rows(results: list[dict[str, Any]]) -> list[str]:
    """The scenarios' table (header included), as RESULTS.md and ``--scenarios`` show it."""
    out = [
        "| scenario | N | L ms | C | calls | bound s | plait median s | ratio to bound "
        "(target) | baseline s | baseline ratio to bound | plait / baseline "
        "| plait CPU/call ms | baseline CPU/call ms "
        "| server max in flight (plait / baseline) | time at limit (plait / baseline) "
        "| requests (expected) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        sc = r["scenario"]
        ratio = r["wall"] / r["bound"] if r["bound"] else math.inf
        if sc.latency_ms == 50.0:
            ok = "ok" if ratio <= RATIO_TARGET else "MISSED"
            target = f"{ratio:.3f} (<= {RATIO_TARGET}, {ok})"
        else:
            target = "n/a (bound 0)" if not r["bound"] else f"{ratio:.1f} (no target)"
        cpu = f"{r['cpu']:.3f}"
        at_limit = f"{r['at_limit']:.3f} / {r['base_at_limit']:.3f}"
        if sc.name.startswith("6."):
            ok = "ok" if r["at_limit"] >= SATURATION_TARGET else "MISSED"
            at_limit += f" (>= {SATURATION_TARGET}, {ok})"
        if sc.latency_ms == 0.0:
            cpu += f" (<= {CPU_TARGET_MS}, {'ok' if r['cpu'] <= CPU_TARGET_MS else 'MISSED'})"
        out.append(
            f"| {sc.name} | {sc.n} | {sc.latency_ms:g} | {sc.in_flight} | {r['expected']} | "
            f"{r['bound']:.3f} | {r['wall']:.3f} | {target} | {r['base_wall']:.3f} | "
            f"{ratio_s(r['base_wall'], r['bound'])} | {r['wall'] / r['base_wall']:.3f} | "
            f"{cpu} | {r['base_cpu']:.3f} | "
            f"{r['max_in_flight']} / {r['base_max_in_flight']} | {at_limit} | "
            f"{r['requests']} ({r['expected']}) |"
        )
    return out


def report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    rss: dict[int, dict[str, Any]],
    small: int,
    large: int,
    missed: list[str],
    profile: str,
    pinned: bool,
    elapsed: float,
    repeats: int,
) -> str:
    cmd = ".venv/bin/python benchmarks/run.py" + (" --quick" if args.quick else "")
    if not args.quick and args.repeats != 7:
        cmd += f" --repeats {args.repeats}"
    if args.no_pin:
        cmd += " --no-pin"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpus = os.cpu_count()
    out = [
        "# plait benchmarks",
        "",
        f"Generated by `{cmd}` on {now} in {elapsed:.0f} s.",
        "",
        f"Machine: {cpus} CPUs ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}; "
        + (
            "the fake server pinned to a CPU of its own, the client on the rest."
            if pinned
            else "server and client sharing every CPU."
        ),
        "",
        "Loopback fake OpenAI server (`plait.testing.FakeOpenAIServer`), fixed latency L. "
        "Lower bound `max(k*L, ceil(N*c/C)*L)`. Baseline: asyncio + aiohttp + "
        "`asyncio.Semaphore(C)`, the same request JSON and headers, the same dependency "
        "structure via `asyncio.gather`. plait: `LLMInference` modules on one alias "
        "(`max_concurrent=C`), `bind(max_concurrent=4*C)`, `run_sync(list)`. "
        f"Median of {repeats} warm runs each (plait and baseline interleaved), after one "
        "warm-up run each. CPU per call = process CPU time / calls (includes HTTP and JSON). "
        "Time at limit = the server's time with exactly C requests in flight / its time "
        "with any (median).",
        "",
        "Targets: every 50 ms scenario within **1.10x** of its bound; client CPU at most "
        f"**{CPU_TARGET_MS} ms** per call (scenario 4); peak RSS at 100,000 inputs at most "
        f"**{RSS_TARGET}x** that at 10,000; time at limit at least **{SATURATION_TARGET}** in "
        "scenario 6 (one alias's limit kept full across a whole batch; formerly a test).",
        "",
    ]
    out += table_rows(results)
    first = results[0]
    out += [
        "",
        f"Scenario 1 cold first run (imports, connections): {first['cold']:.3f} s, "
        f"ratio {first['cold'] / first['bound']:.3f}. Warm plait range "
        f"{first['wall_min']:.3f}–{first['wall_max']:.3f} s.",
        "",
        "## 5. Peak RSS and throughput",
        "",
        "Single-call pipeline, L = 1 ms, C = 256, `bind(max_concurrent=1024)`; each size in a "
        "fresh subprocess (`run.py --rss-child N`) that consumes `pipeline.stream(generator)` "
        "and drops every result, so the list of outputs `run_sync` would return (which grows "
        "with N by design) is not counted; peak RSS is `ru_maxrss` at the end (includes "
        "the interpreter and imports).",
        "",
        "| N | peak RSS MiB | wall s | calls/s | CPU/call ms | bound s | server max in flight "
        "| requests |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (small, large):
        c = rss[n]
        out.append(
            f"| {n} | {c['maxrss_kb'] / 1024:.1f} | {c['wall']:.2f} | {c['calls_per_s']:.0f} | "
            f"{c['cpu_per_call_ms']:.3f} | {c['bound']:.3f} | {c['max_in_flight']} | "
            f"{c['requests']} |"
        )
    rss_ratio = rss[large]["maxrss_kb"] / rss[small]["maxrss_kb"]
    ok = "ok" if rss_ratio <= RSS_TARGET else "MISSED"
    out += [
        "",
        f"Peak RSS ratio N={large} / N={small}: **{rss_ratio:.2f}** (target <= {RSS_TARGET}, "
        f"{ok}).",
        "",
        "## Notes",
        "",
    ]
    if args.quick:
        out += ["This was a `--quick` smoke run (2 repeats, 2,000 vs 20,000 for RSS).", ""]
    if missed:
        out += ["Targets missed:", ""] + [f"- {m}" for m in missed] + [""]
    else:
        out += ["All targets met.", ""]
    for r in results:
        sc, b = r["scenario"], r["bound"]
        if sc.latency_ms == 50.0 and abs(r["wall"] / b - RATIO_TARGET) < 0.05:
            out += [
                f"{sc.name} is within 0.05 of the {RATIO_TARGET} target, so whole runs can "
                f"land on either side of it: plait's warm runs ranged {r['wall_min'] / b:.3f}"
                f"–{r['wall_max'] / b:.3f} of the bound here, and the hand-written baseline's "
                f"median is {r['base_wall'] / b:.3f} of it (plait / baseline "
                f"{r['wall'] / r['base_wall']:.3f}): the gap to the bound is shared with "
                "plain asyncio + aiohttp on this machine rather than added by plait.",
                "",
            ]
    heavy = [r for r in results if r["cpu"] > CPU_TARGET_MS]
    if heavy:
        names = ", ".join(f"{r['scenario'].name} {r['cpu']:.3f} ms" for r in heavy)
        out += [
            "The CPU target is judged on scenario 4 (pure framework overhead, as the issue "
            f"asks), but plait's client CPU per call exceeds {CPU_TARGET_MS} ms in: {names} "
            "(the baseline's stays below it in every scenario).",
            "",
        ]
    zero = results[3]
    calls = zero["expected"]
    out += [
        f"Scenario 4 (zero latency) is bound by the client's one CPU, not the server: plait's "
        f"CPU per call x calls = {zero['cpu'] * calls / 1000:.2f} s against a median wall of "
        f"{zero['wall']:.2f} s (baseline {zero['base_cpu'] * calls / 1000:.2f} s against "
        f"{zero['base_wall']:.2f} s), and the server never holds more than "
        f"{zero['max_in_flight']} request(s), so its wall-time ratio plait / baseline is the "
        "CPU ratio.",
        "",
    ]
    out += [
        "Where plait's client time goes (run every time, whether or not a target is missed; "
        "cProfile sees one thread only, so this awaits the pipeline on the main thread's "
        "`asyncio.run` instead of `run_sync`'s runtime thread):",
        "",
        profile,
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
