"""`ReflectiveSearch` on the embedded model: one run per task, measured as `learning.py` measures.

The pipelines, data and resources are `benchmarks/learning.py`'s (SmolLM2-135M-Instruct,
temperature 0, ExactMatch, the held-out test split scored before the first update and
after the last); the rewriter is the same embedded model (alias ``optimizer``).  Only the
instructions are searched: the demonstrations stay an empty list.  Identical requests are
answered once per invocation (plait's `cache`), as in `learning.py`.

    .venv/bin/python benchmarks/reflective_learning.py --tasks extract,classify \\
        --seed 0 --budget 300 --batch-size 4

Writes one row per task to ``benchmarks/results/reflective_learning.json``: held-out
test at the start and the end, validation likewise, metric calls used, the candidates
found, the calls asked and sent, the wall time and the installed instruction.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from learning import DATA, build, embedded, requests_sent

from plait.handlers import cache
from plait.learning import ReflectiveSearch
from plait.learning.losses import ExactMatch
from plait.learning.trainer import Trainer

HERE = Path(__file__).resolve().parent
JSON_RESULTS = HERE / "results" / "reflective_learning.json"


def run(task: str, features: set[str], seed: int, budget: int, batch_size: int, calls: Any,
        timeout: float) -> dict[str, Any]:  # fmt: skip
    model, _ = build(task, features)
    folder = DATA / task
    search = ReflectiveSearch(
        model.parameters(), rewriter="optimizer", max_metric_calls=budget, seed=seed
    )
    trainer = Trainer(
        model,
        ExactMatch(),
        search,
        folder / "train.jsonl",
        folder / "val.jsonl",
        test_data=folder / "test.jsonl",
        batch_size=batch_size,
        epochs=100,  # the budget ends the run
        seed=seed,
        resources=embedded(timeout),
    )
    sent = requests_sent()
    asked = calls.hits + calls.misses
    started = time.perf_counter()
    history = trainer.fit_sync()
    wall = time.perf_counter() - started
    report = history.steps[-1].trials[0]["search"] if history.steps else {}
    pool = report.get("pool", [])
    return {
        "task": task,
        "config": "+".join(sorted(features | {"reflective"})),
        "seed": seed,
        "budget": budget,
        "batch_size": batch_size,
        "test_start": history.initial_test_score,
        "test_end": history.final_test_score,
        "val_start": history.initial_val_score,
        "val_end": history.best_val_score,
        "stopped": history.stopped,
        "steps": len(history.steps),
        "metric_calls": report.get("metric_calls"),
        "candidates": len(pool),
        "accepted": sum(1 for c in pool if c["origin"] != "seed"),
        "calls": calls.hits + calls.misses - asked,
        "sent": requests_sent() - sent,
        "wall": wall,
        "instruction": {name: value for name, value in model.state_dict().items()
                        if name.endswith("system_prompt")},
        "pool": [{"id": c["id"], "mean": c["mean"], "parents": c["parents"],
                  "values": c["values"]} for c in pool],
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="extract,classify")
    parser.add_argument("--features", default="", help="e.g. labels (learning.py's names)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=JSON_RESULTS)
    args = parser.parse_args()
    features = {f for f in args.features.split(",") if f}
    rows = json.loads(args.json.read_text()) if args.json.exists() else []
    with tempfile.TemporaryDirectory() as scratch, cache(Path(scratch) / "calls.db") as calls:
        for task in args.tasks.split(","):
            row = run(task, features, args.seed, args.budget, args.batch_size, calls, args.timeout)
            rows = [r for r in rows if (r["task"], r["config"], r["seed"]) !=
                    (row["task"], row["config"], row["seed"])] + [row]  # fmt: skip
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
            print(
                f"{task}/{row['config']}/seed {args.seed}: test {row['test_start']:.0%} -> "
                f"{row['test_end']:.0%}, val {row['val_start']:.0%} -> {row['val_end']:.0%}, "
                f"{row['metric_calls']} metric calls, {row['candidates']} candidates, "
                f"{row['calls']} calls, {row['sent']} sent, {row['wall']:.0f} s, "
                f"stopped {row['stopped']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
