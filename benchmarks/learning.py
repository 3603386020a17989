"""Learning on the embedded model (issue 13 point 6): does training leave a pipeline better?

Two small tasks with exact answers, bundled in ``benchmarks/data/learning/<task>/``
(``train``, ``val`` and a held-out ``test`` split, made by ``make_data.py``).  The
pipeline is one `LLMInference` on the embedded SmolLM2-135M-Instruct (temperature 0)
with a learnable instruction and learnable demonstrations (``demos=[]``).  Each
optimizer trains a fresh copy with `Trainer` (ExactMatch loss, the validation gate,
``test_data`` scored before the first update and after the last); the optimizers'
own rewrites run on the same embedded model, as a first `plait train` with no
key would.

Reported per task and optimizer: held-out exact-match accuracy at the start and at
the end, validation at the start and the end, the steps kept, the requests sent
and the wall time.  Targets: on the extraction task the bootstrap optimizer ends
at 90% or more held-out accuracy; no optimizer ends below its start.

    .venv/bin/python benchmarks/learning.py [--tasks extract,classify] [--optimizers ...]

The section it writes goes into ``benchmarks/RESULTS.md`` between the markers
``<!-- learning -->`` and ``<!-- /learning -->`` (``run.py`` keeps it when it
rewrites the rest of the file).  Exits non-zero, naming it, when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import plait
from plait.learning import BootstrapFewShot, SFAOptimizer, TextGradOptimizer
from plait.learning.losses import ExactMatch
from plait.learning.trainer import Trainer, load_examples
from plait.resources.usage import usage

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "learning"
RESULTS = HERE / "RESULTS.md"
START, END = "<!-- learning -->", "<!-- /learning -->"
TARGET_EXTRACT = 0.90

#: Each task's starting instruction and what the instruction is for.
TASKS: dict[str, dict[str, str]] = {
    "extract": {
        "instruction": "Extract the order number from the customer's message.",
        "description": "The task instruction: what to extract from the message and how to answer.",
    },
    "classify": {
        "instruction": "Classify the customer's message.",
        "description": "The task instruction: which label to give a message and how to answer.",
    },
}

OPTIMIZERS = ("bootstrap", "sfa", "textgrad", "bootstrap+sfa")


class Student(plait.Module):
    """One call on the embedded model with a learnable instruction and demonstrations."""

    def __init__(self, instruction: str, description: str) -> None:
        super().__init__()
        self.answer = plait.LLMInference(
            "student",
            system_prompt=plait.Parameter(instruction, description=description),
            demos=[],
            temperature=0,
            max_tokens=24,
        )

    def forward(self, message: str) -> Any:
        return self.answer(message)


def make_optimizers(name: str, model: Student) -> list[Any]:
    made: list[Any] = []
    for part in name.split("+"):
        if part == "bootstrap":
            made.append(BootstrapFewShot(model.parameters(), max_demos=4, candidates=3))
        elif part == "sfa":
            made.append(SFAOptimizer(model.parameters(), alias="optimizer"))
        elif part == "textgrad":
            made.append(TextGradOptimizer(model.parameters(), alias="optimizer"))
        else:
            raise SystemExit(f"unknown optimizer {part!r}; known: {', '.join(OPTIMIZERS)}")
    return made


def requests_so_far() -> int:
    return sum(int(row["requests"]) for row in usage().as_dict().values())


def train_one(task: str, optimizer: str, steps: int, batch_size: int) -> dict[str, Any]:
    spec = TASKS[task]
    folder = DATA / task
    model = Student(spec["instruction"], spec["description"])
    trainer = Trainer(
        model,
        ExactMatch(),
        make_optimizers(optimizer, model),
        folder / "train.jsonl",
        folder / "val.jsonl",
        test_data=folder / "test.jsonl",
        batch_size=batch_size,
        max_steps=steps,
        seed=0,
    )
    sent = requests_so_far()
    started = time.perf_counter()
    history = trainer.fit_sync()
    wall = time.perf_counter() - started
    kept = sum(1 for record in history.steps for trial in record.trials if trial["kept"])
    tried = sum(1 for record in history.steps for trial in record.trials if trial["tried"])
    return {
        "task": task,
        "optimizer": optimizer,
        "test_start": history.initial_test_score,
        "test_end": history.final_test_score,
        "val_start": history.initial_val_score,
        "val_end": history.best_val_score,
        "steps": len(history.steps),
        "kept": kept,
        "tried": tried,
        "requests": requests_so_far() - sent,
        "wall": wall,
        "demos": len(model.answer.demos.value) if model.answer.demos is not None else 0,
        "instruction": model.answer.system_prompt.value if model.answer.system_prompt else "",
        "sizes": [len(load_examples(folder / f"{s}.jsonl")) for s in ("train", "val", "test")],
    }


def missed(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        if row["test_end"] < row["test_start"]:
            out.append(
                f"{row['task']}/{row['optimizer']}: held-out accuracy fell from "
                f"{row['test_start']:.0%} to {row['test_end']:.0%}"
            )
        target = row["task"] == "extract" and row["optimizer"] == "bootstrap"
        if target and row["test_end"] < TARGET_EXTRACT:
            out.append(
                f"extract/bootstrap: held-out accuracy {row['test_end']:.0%} < {TARGET_EXTRACT:.0%}"
            )
    return out


def section(rows: list[dict[str, Any]], args: argparse.Namespace, elapsed: float) -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        START,
        "## 9. Learning on the embedded model",
        "",
        f"Generated by `.venv/bin/python benchmarks/learning.py` on {stamp} in {elapsed:.0f} s.",
        "",
        "One `LLMInference` on the embedded SmolLM2-135M-Instruct (temperature 0, "
        "`max_tokens=24`) with a learnable instruction and `demos=[]`; `Trainer` with "
        f"`ExactMatch`, batch size {args.batch_size}, at most {args.steps} steps, the "
        "validation gate (strictly better), and the held-out test split scored before the "
        "first update and after the last. The rewriters (`sfa`, `textgrad`) run on the same "
        "embedded model (alias `optimizer`). `bootstrap` = `BootstrapFewShot(max_demos=4, "
        "candidates=3)`; `bootstrap+sfa` = both in one run, each update gated on its own. "
        "Requests = every request sent (minibatches, rewrites, candidate and gate "
        "validation, test passes).",
        "",
        "| task (train/val/test) | optimizer | test start | test end | val start | val end "
        "| updates kept / tried | demos | requests | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        sizes = "/".join(map(str, row["sizes"]))
        lines.append(
            f"| {row['task']} ({sizes}) | {row['optimizer']} | {row['test_start']:.0%} | "
            f"{row['test_end']:.0%} | {row['val_start']:.0%} | {row['val_end']:.0%} | "
            f"{row['kept']} / {row['tried']} | {row['demos']} | {row['requests']} | "
            f"{row['wall']:.0f} |"
        )
    lines += ["", "Final instructions:", ""]
    for row in rows:
        lines.append(f"- {row['task']}/{row['optimizer']}: {json.dumps(row['instruction'])}")
    failures = missed(rows)
    lines += [
        "",
        f"Targets: extract/bootstrap held-out accuracy >= {TARGET_EXTRACT:.0%}; no "
        "optimizer ends below its start: "
        + ("**met**." if not failures else "**missed**: " + "; ".join(failures) + "."),
        END,
    ]
    return "\n".join(lines) + "\n"


def splice(text: str, block: str) -> str:
    """``text`` with its learning section replaced by ``block`` (appended if absent)."""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        return head + block + tail
    return text.rstrip("\n") + "\n\n" + block


def keep_section(path: Path, text: str) -> str:
    """``text`` with the learning section ``path`` already holds, if it holds one."""
    old = path.read_text() if path.exists() else ""
    if START not in old or END not in old:
        return text
    block = old[old.index(START) : old.index(END) + len(END)] + "\n"
    return splice(text, block)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--steps", type=int, default=4, help="max optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for task in args.tasks.split(","):
        for optimizer in args.optimizers.split(","):
            row = train_one(task, optimizer, args.steps, args.batch_size)
            rows.append(row)
            print(
                f"{task}/{optimizer}: test {row['test_start']:.0%} -> {row['test_end']:.0%}, "
                f"val {row['val_start']:.0%} -> {row['val_end']:.0%}, kept "
                f"{row['kept']}/{row['tried']}, {row['requests']} requests, "
                f"{row['wall']:.0f} s",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    block = section(rows, args, elapsed)
    current = args.output.read_text() if args.output.exists() else "# plait benchmarks\n"
    args.output.write_text(splice(current, block))
    print(f"wrote the learning section of {args.output} ({elapsed:.0f} s)")
    failures = missed(rows)
    for failure in failures:
        print(f"TARGET MISSED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
