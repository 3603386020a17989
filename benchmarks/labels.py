"""Which way of answering with a label is most accurate on the embedded model?

The classification task of the learning benchmark (``benchmarks/data/learning/
classify``: support messages, four labels) on SmolLM2-135M-Instruct at temperature
0, answered four ways:

* ``free text``: no ``response_format``; the reply must be the label exactly (what
  plait did before labels existed);
* ``grammar``: ``response_format=Literal[...]``, decoding constrained to the labels;
* ``logprob``: each label scored by the probability of the reply starting with it;
* ``calibrated``: ``logprob`` less the label prior of the content-free input "N/A".

each with no demonstrations, with four (one per label, the first of each in the
training split) and with four chosen per input from the whole training split
(``knn_demos(k=4)``: the most similar, every label covered; ``knn-nocover``: the
four most similar whatever their labels), on the validation and test splits
together (80 messages).
Reported: accuracy, the share of replies that are a label, requests and wall time.

    .venv/bin/python benchmarks/labels.py [--demos 0,4,knn,knn-nocover] [--methods ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import plait
from plait.resources.usage import usage

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "learning" / "classify"
LABELS = ("billing", "shipping", "technical", "account")
Topic = Literal["billing", "shipping", "technical", "account"]
INSTRUCTION = "Classify the customer's message: billing, shipping, technical or account."
METHODS = ("free text", "grammar", "logprob", "calibrated")


def load(split: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()]


def one_per_label(train: list[dict[str, str]]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for row in train:
        seen.setdefault(row["target"], row["input"])
    return [(seen[label], label) for label in LABELS]


class Classifier(plait.Module):
    def __init__(self, method: str, demos: Any) -> None:
        super().__init__()
        labelled = method != "free text"
        self.classify = plait.LLMInference(
            "local",
            INSTRUCTION,
            temperature=0,
            max_tokens=8,
            response_format=Topic if labelled else None,
            label_method=method if labelled else None,  # type: ignore[arg-type]
            demos=demos,
        )

    def forward(self, message: str) -> Any:
        return self.classify(message)


def requests_so_far() -> int:
    return sum(int(row["requests"]) for row in usage().as_dict().values())


def measure(method: str, demos: Any, rows: list[dict[str, str]]) -> dict[str, Any]:
    model = Classifier(method, demos)
    sent, started = requests_so_far(), time.perf_counter()
    outputs = model.run_sync([row["input"] for row in rows])
    wall = time.perf_counter() - started
    right = sum(o == row["target"] for o, row in zip(outputs, rows, strict=True))
    labels = sum(isinstance(o, str) and o in LABELS for o in outputs)
    return {
        "method": method,
        "demos": (
            ("knn 4" if demos["cover_labels"] else "knn 4, no cover")
            if isinstance(demos, dict)
            else len(demos)
        ),
        "accuracy": right / len(rows),
        "labels": labels / len(rows),
        "requests": requests_so_far() - sent,
        "wall": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", default="0,4,knn,knn-nocover")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    rows = load("val") + load("test")
    fixed = one_per_label(load("train"))
    results = []
    pool = [(row["input"], row["target"]) for row in load("train")]
    for count in args.demos.split(","):
        if count.startswith("knn"):  # "knn": every label shown; "knn-nocover": the 4 nearest
            demos: Any = plait.knn_demos(k=4, pool=pool, cover_labels=count == "knn")
        else:
            demos = fixed[: int(count)]
        for method in args.methods.split(","):
            result = measure(method, demos, rows)
            results.append(result)
            print(
                f"| {result['method']} | {result['demos']} | {result['accuracy']:.0%} | "
                f"{result['labels']:.0%} | {result['requests']} | {result['wall']:.1f} |",
                flush=True,
            )
    best = max(results, key=lambda r: r["accuracy"])
    print(f"most accurate: {best['method']} with {best['demos']} demonstrations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
