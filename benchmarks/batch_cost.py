"""What a pipeline over many records costs online, on flex, in batches, with caching (issue 22).

A 3-call extract-and-compare pipeline (two extractions of each record, then one call
comparing them), each call site with the same 2,000-token system prompt of house
rules and replies of at most 150 tokens, runs over N records (10,000 by default)
against plait's fake servers:

* **online**: the fake Anthropic server's Messages API, prompt caching off;
* **flex**: the fake OpenAI server with ``service_tier = "flex"``;
* **batch**: the fake Anthropic server's Message Batches, caching off;
* **batch + caching**: the same with plait's prompt caching (on by default): each call
  site's system prompt marked for the cache, with a one-hour TTL;
* **online + caching**, for reference.

Every run is priced by plait itself (`plait.usage()`, `plait.resources.pricing`) from
the tokens the fakes report (both count a token per 4 characters), at one price
table, written below and in the report: a model at $3 per million input tokens and
$15 per million output tokens, the batch API and flex at half, cache reads at 0.1x,
cache writes at 1.25x (5 minutes) and 2x (an hour).  Those are Anthropic's published
factors for its Sonnet models and OpenAI's for flex and batches, as of 2026.

The fakes end a batch in ``--turnaround`` seconds (0.5); the wall time "with a
10-minute turnaround" counts each round of batches on the run's critical path at 10
minutes instead, plus what the run spent besides waiting (measured).

Then ``--kills`` (3) kill-and-resume runs of ``plait run --batch-api`` on
``--kill-records`` records: SIGKILL while a batch is being submitted, while one is
pending and while results download; each time the same command resumes, and the
fake's record of every custom id submitted shows whether anything went twice.

Targets: batch + caching at most 0.35x the online cost; no call submitted twice
across the kill-and-resume runs.

    .venv/bin/python benchmarks/batch_cost.py [--records 10000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plait
from plait.handlers import profile
from plait.testing import FakeAnthropicServer, FakeOpenAIServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KEY = "sk-bench"
COST_TARGET = 0.35
#: The price table every scenario is priced at (dollars per million tokens).
PRICES = {"input_price_per_mtok": 3.0, "output_price_per_mtok": 15.0}
#: About 2,000 tokens (8,000 characters at the fakes' 4 characters a token).
RULES = ("Apply the house rules for extraction: be exact, cite the record, no guesses. " * 105)[
    :8000
]
TEN_MINUTES = 600.0


class ExtractAndCompare(plait.Module):
    """Two extractions of a record, then one call comparing them: 3 calls."""

    def __init__(self) -> None:
        super().__init__()
        # Replies of at most 150 tokens, as extractions are (the fakes echo the prompt
        # back, cut to max_tokens).
        self.facts = plait.LLMInference(
            "llm", system_prompt=RULES + "\nExtract the facts.", max_tokens=150
        )
        self.risks = plait.LLMInference(
            "llm", system_prompt=RULES + "\nExtract the risks.", max_tokens=150
        )
        self.compare = plait.LLMInference(
            "llm", system_prompt=RULES + "\nCompare them.", max_tokens=150
        )

    def forward(self, record: str) -> Any:
        return self.compare(f"Facts: {self.facts(record)}\nRisks: {self.risks(record)}")


def record_text(i: int) -> str:
    return f"record {i}: " + f"the supplier {i % 97} shipped lot {i} late; " * 8


def alias(server: FakeAnthropicServer | FakeOpenAIServer, **extra: Any) -> dict[str, Any]:
    if isinstance(server, FakeOpenAIServer):
        wire: dict[str, Any] = {"provider": "openai", "model": "m"}
    else:
        wire = {"provider": "anthropic", "model": "claude-bench"}
    return {
        **wire,
        "base_url": server.base_url,
        "api_key": KEY,
        "max_concurrent": 64,
        "batch_idle_s": 2.0,
        "batch_poll_s": 0.25,
        "batch_poll_max_s": 0.5,
        **PRICES,
        **extra,
    }


def run_scenario(
    name: str,
    server: FakeAnthropicServer | FakeOpenAIServer,
    records: list[str],
    settings: dict[str, Any],
    backend: str | None,
) -> dict[str, Any]:
    plait.reset_usage()
    server.reset()
    if isinstance(server, FakeAnthropicServer):
        server.configure(batch_turnaround_s=TURNAROUND[0])
    resources = plait.ResourceConfig({"llm": alias(server, **settings)})
    module = ExtractAndCompare().bind(resources=resources)
    module.train()  # Values: errors are counted, never dropped
    options = {"backend": backend} if backend else {}
    started = time.perf_counter()
    with profile() as prof:
        rows = module.run_sync(records, **options)
    wall = time.perf_counter() - started
    errors = sum(row.kind is plait.ValueKind.ERROR for row in rows)
    usage = plait.usage()["llm"]
    result: dict[str, Any] = {
        "name": name,
        "records": len(records),
        "errors": errors,
        "cost": usage["cost_usd"],
        "cost_per_1000": usage["cost_usd"] / len(records) * 1000,
        "requests": usage["requests"],
        "prompt_tokens": usage["prompt_tokens"],
        "cache_read": usage["cache_read_tokens"],
        "cache_write": usage["cache_write_tokens"],
        "wall": wall,
    }
    if backend == "batch" and isinstance(server, FakeAnthropicServer):
        stats = server.batches()
        batches = sorted(stats["batches"].values(), key=lambda b: b["order"])
        result["batches"] = [(b["requests"], b["bytes"]) for b in batches]
        result["twice"] = sum(1 for n in stats["custom_ids"].values() if n > 1)
        rounds = _rounds(prof.trace()["traceEvents"])
        result["rounds"] = rounds
        waited = rounds * TURNAROUND[0]
        result["wall_10min"] = rounds * TEN_MINUTES + max(0.0, wall - waited)
    return result


TURNAROUND = [0.5]


def _rounds(events: list[dict[str, Any]]) -> int:
    """Rounds of batches on the run's critical path: a batch submitted after every batch
    of the round before had ended starts a new round (the profile's batch track)."""
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "batch" and e.get("ph") == "X" and "calls" in e.get("args", {})
    )
    rounds, round_end = 0, None
    for start, end in spans:
        if round_end is None or start >= round_end:
            rounds += 1
            round_end = end
        else:
            round_end = max(round_end, end)
    return rounds


# -- kill and resume -------------------------------------------------------------------
def kill_and_resume(server: FakeAnthropicServer, count: int, workdir: Path) -> list[dict[str, Any]]:
    """Three runs of ``plait run --batch-api`` killed at a point each, then resumed."""
    settings = alias(server)
    settings.update(batch_idle_s=0.2, batch_poll_s=0.05, batch_poll_max_s=0.2)
    lines = ["[llm]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items())]
    (workdir / "resources.toml").write_text("\n".join(lines) + "\n")
    (workdir / "in.jsonl").write_text(
        "".join(json.dumps(record_text(i)) + "\n" for i in range(count))
    )
    results = []
    points: list[tuple[str, Callable[[], None], Callable[[], bool], Callable[[], None]]] = [
        (
            "while submitting",
            lambda: server.configure(batch_create_gate_open=False),
            lambda: server.batches().get("held", {}).get("create", 0) >= 1,
            lambda: server.configure(batch_create_gate_open=True),
        ),
        (
            "while a batch is pending",
            lambda: server.configure(batch_gate_open=False),
            lambda: server.batches()["requests_total"] >= 2 * count,
            lambda: server.configure(batch_gate_open=True),
        ),
        (
            "while downloading results",
            lambda: server.configure(batch_results_gate_open=False),
            lambda: server.batches().get("held", {}).get("results", 0) >= 1,
            lambda: server.configure(batch_results_gate_open=True),
        ),
    ]
    for number, (where, hold, ready, release) in enumerate(points, 1):
        server.reset()
        server.configure(batch_turnaround_s=0.05)
        out = workdir / f"out{number}.jsonl"
        command = [
            sys.executable, "-m", "plait.cli", "run", f"{__file__}:ExtractAndCompare",
            "-i", str(workdir / "in.jsonl"), "-o", str(out),
            "--resources", str(workdir / "resources.toml"), "--batch-api", "-q",
        ]  # fmt: skip
        hold()
        first = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 300
        while not ready():
            if time.monotonic() > deadline or first.poll() is not None:
                raise RuntimeError(f"the run never got to the point {where!r}")
            time.sleep(0.05)  # polling the fake's state
        first.send_signal(signal.SIGKILL)
        first.wait()
        release()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        stats = server.batches()
        results.append(
            {
                "where": where,
                "exit": done.returncode,
                "rows": len(rows),
                "distinct_inputs": len({row["index"] for row in rows}),
                "requests": stats["requests_total"],
                "expected_requests": 3 * count,
                "twice": sum(1 for n in stats["custom_ids"].values() if n > 1),
            }
        )
    return results


# -- report ------------------------------------------------------------------------------
def report(results: list[dict[str, Any]], kills: list[dict[str, Any]], n: int) -> list[str]:
    online = next(r for r in results if r["name"] == "online")
    lines = [
        "## 11. Cutting cost: online, flex, batch, batch + caching (issue 22)",
        "",
        f"`benchmarks/batch_cost.py --records {n}`: a 3-call extract-and-compare pipeline, "
        "every call site with the same 2,000-token system prompt, over "
        f"{n:,} records against the fake servers. Prices: $3 / $15 per million input / "
        "output tokens; batch and flex at 0.5x; cache reads 0.1x, writes 1.25x (5 min) "
        "and 2x (1 h). Every figure is plait's own `usage()` accounting of the tokens the "
        "fakes reported.",
        "",
        "| scenario | cost per 1,000 records | x online | requests | cache read / write tokens "
        "| errors | wall (fakes) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['name']} | ${r['cost_per_1000']:.3f} | {r['cost'] / online['cost']:.3f} | "
            f"{r['requests']:,} | {r['cache_read']:,} / {r['cache_write']:,} | {r['errors']} | "
            f"{r['wall']:.1f} s |"
        )
    for r in results:
        if "batches" in r:
            sizes = ", ".join(f"{req:,} req / {b / 1e6:.1f} MB" for req, b in r["batches"])
            lines.append("")
            lines.append(
                f"{r['name']}: {len(r['batches'])} batches ({sizes}) in {r['rounds']} rounds; "
                f"with a 10-minute turnaround per batch the run would take "
                f"{r['wall_10min'] / 60:.1f} min ({r['rounds']} x 10 min + "
                f"{r['wall_10min'] - r['rounds'] * TEN_MINUTES:.1f} s of the run's own work); "
                f"requests submitted twice: {r['twice']}."
            )
    if kills:
        lines += [
            "",
            "Kill -9 and resume (`plait run --batch-api`, then the same command again):",
            "",
            "| killed | exit | rows (distinct inputs) | requests submitted (expected) | "
            "submitted twice |",
            "|---|---:|---:|---:|---:|",
        ]
        for k in kills:
            lines.append(
                f"| {k['where']} | {k['exit']} | {k['rows']} ({k['distinct_inputs']}) | "
                f"{k['requests']:,} ({k['expected_requests']:,}) | {k['twice']} |"
            )
    return lines


def missed(results: list[dict[str, Any]], kills: list[dict[str, Any]]) -> list[str]:
    online = next(r for r in results if r["name"] == "online")
    cached = next(r for r in results if r["name"] == "batch + caching")
    out = []
    ratio = cached["cost"] / online["cost"]
    if ratio > COST_TARGET:
        out.append(f"batch + caching costs {ratio:.3f}x online (target {COST_TARGET})")
    for r in results:
        if r["errors"]:
            out.append(f"{r['name']}: {r['errors']} records failed")
    for k in kills:
        if k["twice"] or k["requests"] != k["expected_requests"] or k["exit"] != 0:
            out.append(f"kill {k['where']}: {k}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--kill-records", type=int, default=200)
    parser.add_argument("--kills", action="store_true", default=True)
    parser.add_argument("--no-kills", dest="kills", action="store_false")
    parser.add_argument("--turnaround", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="1,000 records")
    args = parser.parse_args()
    n = 1_000 if args.quick else args.records
    TURNAROUND[0] = args.turnaround
    records = [record_text(i) for i in range(n)]
    results = []
    with FakeAnthropicServer(api_key=KEY) as anthropic, FakeOpenAIServer(api_key=KEY) as openai:
        scenarios: list[tuple[str, Any, dict[str, Any], str | None]] = [
            ("online", anthropic, {"prompt_caching": False}, None),
            ("flex", openai, {"service_tier": "flex"}, None),
            ("batch", anthropic, {"prompt_caching": False}, "batch"),
            ("batch + caching", anthropic, {}, "batch"),
            ("online + caching", anthropic, {}, None),
        ]
        for name, server, settings, backend in scenarios:
            result = run_scenario(name, server, records, settings, backend)
            results.append(result)
            print(
                f"{name}: ${result['cost_per_1000']:.3f} per 1,000 records, "
                f"{result['requests']:,} requests, {result['errors']} errors, "
                f"{result['wall']:.1f} s",
                flush=True,
            )
        kills: list[dict[str, Any]] = []
        if args.kills:
            with tempfile.TemporaryDirectory() as tmp:
                kills = kill_and_resume(anthropic, args.kill_records, Path(tmp))
            for k in kills:
                print(f"killed {k['where']}: {k}", flush=True)
    text = "\n".join(report(results, kills, n))
    print("\n" + text)
    problems = missed(results, kills)
    for problem in problems:
        print(f"MISSED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
