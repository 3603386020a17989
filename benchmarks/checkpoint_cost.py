"""What a checkpoint costs a `plait run` (issue 11): the same command with and without.

Each run is a fresh ``plait run`` process over the same JSONL file of N inputs of
about 2 KB, against the loopback fake server at 1 ms latency, so the run is bound
by plait's own CPU: the worst case for the checkpoint's share (against a real
endpoint's latency it all but disappears).  Runs alternate between the two modes;
wall time, CPU time and peak RSS come from ``os.wait4`` on each child.

Target: a checkpointed run takes at most 1.2x the time of the same run without
one, and its peak RSS stays flat (the checkpoint keeps an index, not the data).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from plait.testing import FakeOpenAIServer

HERE = Path(__file__).resolve().parent
TIME_TARGET = 1.2
PIPELINES = ("Single", "FanOutFanIn")  # classes of benchmarks/run.py: 1 call, 3 calls
DOC_CHARS = 2000


#: Runs the command given as its arguments and prints the child's peak RSS and CPU.
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print('USAGE', u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _one_run(workdir: Path, pipeline: str, checkpoint: bool) -> dict[str, float]:
    out = workdir / "out.jsonl"
    out.unlink(missing_ok=True)
    shutil.rmtree(workdir / "out.jsonl.checkpoint", ignore_errors=True)
    cmd = [sys.executable, "-m", "plait.cli", "run", f"{HERE / 'run.py'}:{pipeline}"]
    cmd += ["--input", str(workdir / "in.jsonl"), "--output", str(out)]
    cmd += ["--resources", str(workdir / "resources.toml"), "-q"]
    if not checkpoint:
        cmd.append("--no-checkpoint")
    env = dict(os.environ, PLAIT_BENCH_KEY="sk-bench")
    started = time.perf_counter()
    # Started from a small wrapper process: a child forked from this (large) process
    # would report this process's peak RSS as its own (Linux keeps ru_maxrss across exec).
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *cmd],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - started
    *_, last = proc.stderr.strip().splitlines() or [""]
    if proc.returncode != 0 or not last.startswith("USAGE "):
        raise RuntimeError(f"plait run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    maxrss_kb, cpu = last.split()[1:3]
    rows = sum(1 for _ in out.open())
    return {
        "wall": wall,
        "cpu": float(cpu),
        "maxrss_mib": int(maxrss_kb) / 1024,
        "rows": rows,
    }


def measure(server: FakeOpenAIServer, n: int, repeats: int) -> list[dict[str, Any]]:
    server.configure(latency_ms=1.0)
    results = []
    with tempfile.TemporaryDirectory(prefix="plait-bench-ckpt-") as tmp:
        workdir = Path(tmp)
        with (workdir / "in.jsonl").open("w") as fh:
            for i in range(n):
                fh.write(json.dumps({"doc": f"document {i} " + "x" * DOC_CHARS}) + "\n")
        (workdir / "resources.toml").write_text(
            f'[llm]\nprovider = "openai"\nmodel = "bench"\nbase_url = "{server.base_url}"\n'
            'api_key_env = "PLAIT_BENCH_KEY"\nmax_concurrent = 64\n'
        )
        for pipeline in PIPELINES:
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(repeats):
                for checkpoint in (False, True):
                    server.reset()
                    run = _one_run(workdir, pipeline, checkpoint)
                    assert run["rows"] == n, (pipeline, checkpoint, run)
                    runs[checkpoint].append(run)
            med = {
                mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                for mode, rs in runs.items()
            }
            result = {
                "pipeline": pipeline,
                "n": n,
                "repeats": repeats,
                "plain": med[False],
                "checkpointed": med[True],
                "time_ratio": med[True]["wall"] / med[False]["wall"],
                "cpu_ratio": med[True]["cpu"] / med[False]["cpu"],
                "ratios": sorted(
                    c["wall"] / p["wall"] for p, c in zip(runs[False], runs[True], strict=True)
                ),
            }
            results.append(result)
            print(
                f"7. checkpoint cost, {pipeline}, N={n}: {med[False]['wall']:.2f} s without, "
                f"{med[True]['wall']:.2f} s with (x{result['time_ratio']:.3f}); peak RSS "
                f"{med[False]['maxrss_mib']:.0f} / {med[True]['maxrss_mib']:.0f} MiB",
                flush=True,
            )
    return results


def missed(results: list[dict[str, Any]]) -> list[str]:
    return [
        f"checkpoint cost ({r['pipeline']}): a checkpointed run takes {r['time_ratio']:.3f}x "
        f"the time of the same run without one (> {TIME_TARGET})"
        for r in results
        if r["time_ratio"] > TIME_TARGET
    ]


def section(results: list[dict[str, Any]]) -> list[str]:
    n = results[0]["n"]
    out = [
        "## 7. What a checkpoint costs a `plait run`",
        "",
        f"`plait run` over {n:,} JSONL inputs of ~{DOC_CHARS:,} characters, 1 ms latency, "
        "`max_concurrent = 64`, each run a fresh process (`--no-checkpoint` against the "
        f"default checkpoint next to the output), alternating, median of {results[0]['repeats']}"
        ". At 1 ms latency plait's own CPU is the bottleneck, so this is the checkpoint's "
        "largest share of a run. `Single` is one call per input; `FanOutFanIn` three. "
        f"Target: at most **{TIME_TARGET}x** the time without.",
        "",
        "| pipeline | wall s without | wall s with | time ratio (target) | each pair's ratio "
        "| CPU ratio | peak RSS MiB without / with |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        ok = "ok" if r["time_ratio"] <= TIME_TARGET else "MISSED"
        pairs = ", ".join(f"{x:.3f}" for x in r["ratios"])
        out.append(
            f"| {r['pipeline']} | {r['plain']['wall']:.2f} | {r['checkpointed']['wall']:.2f} | "
            f"{r['time_ratio']:.3f} (<= {TIME_TARGET}, {ok}) | {pairs} | {r['cpu_ratio']:.3f} | "
            f"{r['plain']['maxrss_mib']:.0f} / {r['checkpointed']['maxrss_mib']:.0f} |"
        )
    out.append("")
    return out
