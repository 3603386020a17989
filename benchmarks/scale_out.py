"""One pipeline on N Ray worker processes (issue 12): throughput, lease cost, start-up.

Three measurements against the loopback fake server at zero latency:

1. Throughput of the same batch (`FanOutFanIn` of ``run.py``, three calls per input,
   one alias at ``max_concurrent = 64``) run in one process and with
   ``run_sync(inputs, workers=k)`` for k = 1, 2, 4 on one local Ray started once by
   this process.  Reported twice: end to end (the call to ``run_sync``, which starts
   and stops its k worker processes every time) and steady (the server's first
   request to its last reply).
2. What a lease costs: the workers' round trips to the `LimitBroker` per call and
   their mean duration (`PipelineWorker.lease_stats`, read as the run ends), and the
   broker actor timed directly: one ``sync`` at a time, many in flight at once, and
   its Python body without Ray.  From these, what 100 workers would ask of it.
3. Start-up: a fresh ``plait run ... --workers N`` process (Ray started by the run
   itself) until the server sees its first request, for N = 1 and 4.

The machine's CPUs are shared by everything here (server, driver, Ray's own
processes, workers): the server is not given a core of its own as in the other
scenarios, since pinning it would leave the workers a single core between them.
On a machine with few cores the workers compete with the server and with each
other for CPU, so more workers cannot bring more throughput there; the scenario
shows what distribution costs, not what it gains on many machines.

Target: no worker run waits for capacity a previous run left held in the broker
(its first request within `LEASE_TTL_S` of the call; that wait was a bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plait.testing import FakeOpenAIServer

HERE = Path(__file__).resolve().parent
IN_FLIGHT = 64
WORKER_COUNTS = (1, 2, 4)
STARTUP_WORKERS = (1, 4)
STARTUP_INPUTS = 200
LEASE_CALLS = 2_000
FLEET = 100


# -- CPU affinity: share every CPU for this scenario -------------------------------------
@contextlib.contextmanager
def _sharing_cpus(server_pid: int) -> Iterator[bool]:
    """Let the server and every thread of this process (and what they start) use every
    CPU; put back the affinities found (``run.py`` pins the server apart)."""
    if not hasattr(os, "sched_setaffinity"):
        yield False
        return
    everything = set(range(os.cpu_count() or 1))
    tids = [server_pid] + [int(t) for t in os.listdir("/proc/self/task")]
    before = {}
    for tid in tids:
        with contextlib.suppress(OSError):
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, everything)
    try:
        yield any(cpus != everything for cpus in before.values())
    finally:
        for tid, cpus in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)


# -- 3. start-up of `plait run --workers N` ----------------------------------------------
def _startup_once(server: FakeOpenAIServer, workdir: Path, workers: int) -> dict[str, float]:
    out = workdir / "out.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "plait.cli", "run", f"{HERE / 'run.py'}:Single"]
    cmd += ["--input", str(workdir / "in.jsonl"), "--output", str(out)]
    cmd += ["--resources", str(workdir / "resources.toml"), "--workers", str(workers)]
    cmd += ["--no-checkpoint", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["PLAIT_BENCH_KEY"] = "sk-bench"
    server.reset()
    launched = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ended = time.monotonic()
    if proc.returncode != 0:
        raise RuntimeError(f"plait run failed ({proc.returncode}): {proc.stderr[-2000:]!r}")
    stats = server.stats()
    rows = sum(1 for _ in out.open())
    assert rows == STARTUP_INPUTS and stats["requests_total"] == STARTUP_INPUTS, (rows, stats)
    first = stats["t0_monotonic"] + min(r["t_start"] for r in stats["requests"])
    return {"first_request": first - launched, "total": ended - launched}


def _startup(server: FakeOpenAIServer, repeats: int) -> dict[int, dict[str, Any]]:
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in STARTUP_WORKERS}
    with tempfile.TemporaryDirectory(prefix="plait-bench-scale-") as tmp:
        workdir = Path(tmp)
        with (workdir / "in.jsonl").open("w") as fh:
            for i in range(STARTUP_INPUTS):
                fh.write(json.dumps({"doc": f"document {i}"}) + "\n")
        (workdir / "resources.toml").write_text(
            f'[llm]\nprovider = "openai"\nmodel = "bench"\nbase_url = "{server.base_url}"\n'
            f'api_key_env = "PLAIT_BENCH_KEY"\nmax_concurrent = {IN_FLIGHT}\n'
        )
        for _ in range(repeats):  # interleaved, so drift hits every N alike
            for workers in STARTUP_WORKERS:
                runs[workers].append(_startup_once(server, workdir, workers))
    result = {}
    for workers, rs in runs.items():
        firsts = [r["first_request"] for r in rs]
        result[workers] = {
            "first_request": statistics.median(firsts),
            "all": sorted(firsts),
            "total": statistics.median(r["total"] for r in rs),
        }
        print(
            f"8c. plait run --workers {workers}: first request after "
            f"{result[workers]['first_request']:.2f} s (median of {repeats}; "
            + ", ".join(f"{x:.2f}" for x in sorted(firsts))
            + f"), whole run {result[workers]['total']:.2f} s",
            flush=True,
        )
    return result


# -- 1. throughput, with the workers' lease counters ---------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux; else 0)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        values = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


@contextlib.contextmanager
def _lease_stats(into: list[dict[str, Any]]) -> Iterator[None]:
    """Each worker's `lease_stats()` and CPU time, read just before the run closes it;
    its CPU is counted from the moment it was ready (its start-up is kept apart)."""
    from plait.ray import runner

    init, close = runner.Dispatch.__init__, runner.Dispatch.close
    ready_cpu: dict[int, float] = {}

    def starting(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for worker in self.workers:
            ready_cpu[worker.pid] = _proc_cpu(worker.pid)

    def reading(self: Any) -> None:
        with contextlib.suppress(Exception):
            stats = self.ray.get([w.actor.lease_stats.remote() for w in self.workers])
            for worker, stat in zip(self.workers, stats, strict=True):
                start = ready_cpu.get(worker.pid, 0.0)
                cpu = _proc_cpu(worker.pid) - start
                into.append({**stat, "cpu": cpu, "startup_cpu": start})
        close(self)

    runner.Dispatch.__init__ = starting  # type: ignore[method-assign]
    runner.Dispatch.close = reading  # type: ignore[method-assign]
    try:
        yield
    finally:
        runner.Dispatch.__init__ = init  # type: ignore[method-assign]
        runner.Dispatch.close = close  # type: ignore[method-assign]


def _timed_run(
    server: FakeOpenAIServer, pipeline: Any, inputs: list[str], workers: int | None
) -> dict[str, Any]:
    leases: list[dict[str, Any]] = []
    server.reset()
    server_cpu, driver_cpu, machine = _proc_cpu(server.pid), time.process_time(), _machine_busy()
    with _lease_stats(leases):
        started = time.monotonic()
        outputs = (
            pipeline.run_sync(inputs, workers=workers) if workers else pipeline.run_sync(inputs)
        )
        wall = time.monotonic() - started
    server_cpu = _proc_cpu(server.pid) - server_cpu
    driver_cpu = time.process_time() - driver_cpu
    busy, total = (b - a for a, b in zip(machine, _machine_busy(), strict=True))
    stats = server.stats()
    calls = 3 * len(inputs)
    assert len(outputs) == len(inputs) and all(isinstance(o, str) for o in outputs), "lost outputs"
    assert stats["requests_total"] == calls, (workers, stats["requests_total"], calls)
    records = stats["requests"]
    first = min(r["t_start"] for r in records)
    window = max(r["t_end"] for r in records) - first
    return {
        "wall": wall,
        "window": window,
        "first_request": stats["t0_monotonic"] + first - started,
        "calls": calls,
        "syncs": sum(s["syncs"] for s in leases),
        "sync_seconds": sum(s["sync_seconds"] for s in leases),
        "max_in_flight": stats["max_in_flight"],
        "server_cpu": server_cpu,
        "driver_cpu": driver_cpu,
        "workers_cpu": sum(s["cpu"] for s in leases),
        "workers_startup_cpu": sum(s["startup_cpu"] for s in leases),
        # Cores the whole machine kept busy (this run, Ray's own processes, and anything
        # else running): busy share of all CPU time x the number of CPUs.
        "machine_cores": busy / total * (os.cpu_count() or 1) if total else 0.0,
    }


def _throughput(server: FakeOpenAIServer, n: int, repeats: int) -> dict[Any, dict[str, Any]]:
    import run  # beside this file: the pipelines of the suite

    server.configure(latency_ms=0.0)
    pipeline = run.bound_pipeline(run.FanOutFanIn, server.base_url, IN_FLIGHT)
    inputs = [f"document number {i}" for i in range(n)]
    pipeline.run_sync(inputs[:100])  # warm: imports, connections
    configs: list[int | None] = [None, *WORKER_COUNTS]
    runs: dict[int | None, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(repeats):  # interleaved
        for workers in configs:
            runs[workers].append(_timed_run(server, pipeline, inputs, workers))
    result: dict[Any, dict[str, Any]] = {}
    for workers, rs in runs.items():
        med = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        med["calls_per_s"] = med["calls"] / med["wall"]
        med["steady_calls_per_s"] = med["calls"] / med["window"]
        med["worst_first_request"] = max(r["first_request"] for r in rs)
        result[workers] = med
    one = result[None]
    for workers, med in result.items():
        med["ratio"] = med["calls_per_s"] / one["calls_per_s"]
        med["steady_ratio"] = med["steady_calls_per_s"] / one["steady_calls_per_s"]
        label = "one process" if workers is None else f"{workers} worker(s)"
        print(
            f"8a. {label}, N={n}, latency 0: {med['calls_per_s']:.0f} calls/s end to end "
            f"(x{med['ratio']:.2f}), {med['steady_calls_per_s']:.0f} steady "
            f"(x{med['steady_ratio']:.2f}); first request after {med['first_request']:.2f} s; "
            f"{med['syncs']:.0f} broker round trips",
            flush=True,
        )
    return result


# -- 2. the broker, timed directly -----------------------------------------------------------
def _broker_direct(calls: int) -> dict[str, float]:
    import ray

    from plait.ray.broker import AliasLimits, LimitBroker, Report
    from plait.ray.cluster import broker

    actor = broker()
    limits = AliasLimits(IN_FLIGHT)
    key, worker = "bench|direct", "bench-direct"

    def report() -> Report:
        return Report(slots_kept=1, slots_wanted=1, successes=1)

    ray.get(actor.sync.remote(worker, key, limits, report()))
    started = time.perf_counter()
    for _ in range(calls):
        ray.get(actor.sync.remote(worker, key, limits, report()))
    one_at_a_time = (time.perf_counter() - started) / calls
    started = time.perf_counter()
    ray.get([actor.sync.remote(worker, key, limits, report()) for _ in range(calls)])
    pipelined = calls / (time.perf_counter() - started)
    ray.get(actor.forget.remote(worker))

    plain = LimitBroker()  # the same method without Ray: its Python cost alone

    async def body() -> float:
        started = time.perf_counter()
        for _ in range(calls):
            await plain.sync(worker, key, limits, report())
        return (time.perf_counter() - started) / calls

    python = asyncio.run(body())
    result = {"round_trip": one_at_a_time, "pipelined_per_s": pipelined, "python": python}
    print(
        f"8b. broker sync timed directly ({calls} calls): {one_at_a_time * 1000:.3f} ms a round "
        f"trip one at a time, {pipelined:.0f}/s with all in flight, "
        f"{python * 1e6:.1f} us of Python per sync",
        flush=True,
    )
    return result


# -- the scenario ------------------------------------------------------------------------------
def measure(
    server: FakeOpenAIServer, n: int = 3_000, repeats: int = 2, startup_repeats: int = 3
) -> dict[str, Any]:
    from plait.ray.cluster import ensure_ray, shutdown_if_started

    started = time.perf_counter()
    with _sharing_cpus(server.pid) as unpinned:
        server.configure(latency_ms=0.0)
        startup = _startup(server, startup_repeats)  # before this process starts a Ray
        ray_started = time.perf_counter()
        ensure_ray(None, max(WORKER_COUNTS))
        ray_init = time.perf_counter() - ray_started
        try:
            throughput = _throughput(server, n, repeats)
            direct = _broker_direct(LEASE_CALLS)
        finally:
            shutdown_if_started()
    return {
        "n": n,
        "repeats": repeats,
        "startup_repeats": startup_repeats,
        "unpinned": unpinned,
        "cpus": os.cpu_count(),
        "ray_init": ray_init,
        "startup": startup,
        "throughput": throughput,
        "direct": direct,
        "seconds": time.perf_counter() - started,
    }


def missed(result: dict[str, Any]) -> list[str]:
    from plait.ray.broker import LEASE_TTL_S

    return [
        f"scale-out, {workers} worker(s): a run's first request came "
        f"{r['worst_first_request']:.1f} s after the call (>= LEASE_TTL_S = {LEASE_TTL_S:g} s: "
        "waiting for slots an earlier run left held in the broker)"
        for workers, r in result["throughput"].items()
        if workers is not None and r["worst_first_request"] >= LEASE_TTL_S
    ]


def section(result: dict[str, Any]) -> list[str]:
    from plait.ray.broker import SYNC_INTERVAL_S

    n, tp, direct = result["n"], result["throughput"], result["direct"]
    one = tp[None]
    out = [
        "## 8. Scale-out on Ray workers",
        "",
        f"`FanOutFanIn` over {n:,} inputs ({3 * n:,} calls), latency 0, one alias at "
        f"`max_concurrent = {IN_FLIGHT}`, `run_sync(inputs)` in one process against "
        "`run_sync(inputs, workers=k)` on one local Ray this process started once "
        f"({result['ray_init']:.1f} s, not counted); median of {result['repeats']} runs, "
        "interleaved. End to end = calls / the `run_sync` call, which starts its k worker "
        "processes and stops them every time; steady = calls / the server's first request "
        "to its last reply. Machine cores busy = the whole machine's busy share of CPU "
        "time over the run x its CPUs (anything else running on the machine counts too). "
        f"{result['cpus']} CPUs shared by everything (server, driver, "
        "Ray's processes, workers)"
        + (
            "; the server's own CPU of the other scenarios is given up here."
            if result["unpinned"]
            else "."
        ),
        "",
        "| run | calls/s end to end | ratio to one process | calls/s steady | ratio "
        "| first request after s | CPU ms per call: server / driver / workers "
        "| workers' start-up CPU s "
        "| machine cores busy | broker round trips | per call | mean round trip ms |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for workers, r in tp.items():
        label = (
            "one process" if workers is None else f"{workers} worker{'s' if workers > 1 else ''}"
        )
        startup = "–" if workers is None else f"{r['workers_startup_cpu']:.2f}"
        if workers is None:
            lease = "– | – | –"
        else:
            mean = r["sync_seconds"] / r["syncs"] * 1000 if r["syncs"] else 0.0
            lease = f"{r['syncs']:.0f} | {r['syncs'] / r['calls']:.4f} | {mean:.2f}"
        cpu = " / ".join(
            f"{r[k] / r['calls'] * 1000:.3f}" for k in ("server_cpu", "driver_cpu", "workers_cpu")
        )
        out.append(
            f"| {label} | {r['calls_per_s']:.0f} | {r['ratio']:.2f} | "
            f"{r['steady_calls_per_s']:.0f} | {r['steady_ratio']:.2f} | "
            f"{r['first_request']:.2f} | {cpu} | {startup} | "
            f"{r['machine_cores']:.2f} | {lease} |"
        )
    workers_only = [w for w in tp if w is not None]
    most_syncs = max(tp[w]["syncs"] / tp[w]["calls"] for w in workers_only)
    best = max(workers_only, key=lambda w: tp[w]["steady_calls_per_s"])
    top = max(workers_only)
    client = (one["driver_cpu"] + one["server_cpu"]) / one["calls"] * 1000
    spread = (tp[top]["driver_cpu"] + tp[top]["workers_cpu"] + tp[top]["server_cpu"]) / tp[top][
        "calls"
    ]
    out += [
        "",
        f"One process: {one['calls_per_s']:.0f} calls/s, the server never holding more than "
        f"{one['max_in_flight']:.0f} request(s): at zero latency the run is bound by CPU "
        f"(client and server together {client:.3f} ms per call), not by the alias's limit. "
        "With workers the driver only hands out batches and collects rows, the server's "
        "share is unchanged, and each call costs a worker (counted from the moment it is "
        "ready) what it costs one process plus Ray's pickling of batches and rows, and "
        "more the more processes contend for the cores. On "
        f"{result['cpus']} cores every process takes its CPU from the others: with {top} "
        f"workers the run spent {spread * 1000:.3f} ms of CPU per call and the machine kept "
        f"{tp[top]['machine_cores']:.2f} of {result['cpus']} cores busy. So the steady rate "
        f"is best at {best} worker(s), {tp[best]['steady_ratio']:.2f}x one process, and "
        f"{top} workers bring no more: the limit is this machine's {result['cpus']} cores, "
        "shared by the server, the workers and Ray, not plait's broker "
        f"({most_syncs * 100:.1f} round trips per hundred calls at most). End to end also "
        "pays each run's worker start-up (the first request column: starting the worker "
        "processes, which import plait and Ray and unpickle the pipeline; their CPU is "
        "the start-up column), which a long batch amortises. "
        "Workers pay off where the cores or machines exist and the endpoints' latency, "
        "not the client's CPU, bounds a run.",
        "",
    ]
    per_worker = [
        r["syncs"] / (w * r["window"]) for w, r in tp.items() if w is not None and r["window"]
    ]
    rate = max(per_worker) if per_worker else 0.0
    floor = 1 / SYNC_INTERVAL_S
    need = FLEET * max(rate, floor)
    out += [
        f"Lease cost. The broker's `sync`, timed from the driver over {LEASE_CALLS:,} calls: "
        f"**{direct['round_trip'] * 1000:.2f} ms** a round trip one at a time, "
        f"**{direct['pipelined_per_s']:.0f}/s** with all of them in flight at once (the "
        "one actor's throughput, or the driver's ability to send, whichever is lower), of "
        f"which {direct['python'] * 1e6:.0f} us is the broker's Python (`LimitBroker.sync` "
        "without Ray). Inside the runs above a worker's round trips average the figures in "
        "the table: longer, since they share the CPU with the calls and a sync that asks "
        "for slots nobody has free is held (long poll) until some are.",
        "",
        f"A busy worker syncs every `SYNC_INTERVAL_S` = {SYNC_INTERVAL_S:g} s per endpoint "
        f"({floor:.0f}/s), and at once only while the broker may still give it slots; here each "
        f"worker made at most {rate:.1f} round trips a second. {FLEET} workers on one "
        f"endpoint would ask the one broker actor for about {need:.0f} syncs/s, "
        + (
            f"{need / direct['pipelined_per_s']:.0%} of the {direct['pipelined_per_s']:.0f}/s "
            "it served here"
            if direct["pipelined_per_s"]
            else "(not measured)"
        )
        + f"; the broker's Python alone would cap it near {1 / direct['python']:,.0f}/s on one "
        "core. Each further endpoint multiplies the syncs (one lease task per endpoint per "
        "worker).",
        "",
        f"Start-up: a fresh `plait run --workers N` process over {STARTUP_INPUTS} inputs "
        "(`Single`), Ray started by the run itself, no cluster running; time from launching "
        f"the command to the server's first request, median of {result['startup_repeats']}. "
        f"It includes starting Python and importing plait, starting Ray (about "
        f"{result['ray_init']:.1f} s, timed in this process), the broker actor and the "
        "worker processes, each building the pipeline.",
        "",
        "| N | first request after s (median) | each run | whole run s |",
        "|---:|---:|---|---:|",
    ]
    for workers, r in result["startup"].items():
        each = ", ".join(f"{x:.2f}" for x in r["all"])
        out.append(f"| {workers} | {r['first_request']:.2f} | {each} | {r['total']:.2f} |")
    out.append("")
    return out


def main() -> int:
    with FakeOpenAIServer() as server:
        result = measure(server)
    print()
    print("\n".join(section(result)))
    for m in missed(result):
        print(f"TARGET MISSED: {m}")
    print(f"({result['seconds']:.0f} s)")
    return 1 if missed(result) else 0


if __name__ == "__main__":
    sys.exit(main())
