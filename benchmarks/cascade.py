"""A cascade against the strong model alone (issue 37, point 6d): cost at equal accuracy.

One fake OpenAI server plays two models through model-scoped directives
(``[[top@MODEL:...]]``, the first token's log-probabilities for that model only).
Each of ``--n`` messages has a gold label, ``spam`` or ``ham`` (drawn with
``--seed``):

* ``cheap`` (priced as gpt-4o-mini) is right on ``--right`` of them (80%), with a
  label probability of about 0.95; on the others it is wrong, and torn (about 0.52);
* ``strong`` (priced as gpt-4o) is right on every one, with a probability of 0.99.

Two runs of the same classifier: the strong model alone, and a cascade from
``cheap`` escalating to ``strong`` under ``accept=0.8``.  The table gives each run's
accuracy, requests per model and dollars (at the aliases' prices, from
``plait.usage()``).  The target (issue 37): the cascade at least 40% cheaper at
equal accuracy.

    .venv/bin/python benchmarks/cascade.py [--n 1000] [--right 0.8] [--seed 0] [--write]
"""

from __future__ import annotations

import argparse
import random
from typing import Any, Literal

from sections import write_section  # beside this file

import plait
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeOpenAIServer

SECTION = "## 17. A cascade against the strong model alone (issue 37)"
LABELS = ("spam", "ham")
PRICES = {
    "fast": {"input_price_per_mtok": 0.15, "output_price_per_mtok": 0.6},
    "smart": {"input_price_per_mtok": 2.5, "output_price_per_mtok": 10.0},
}
MODELS = {"fast": "cheap", "smart": "strong"}


def messages(n: int, right: float, seed: int) -> list[tuple[str, str]]:
    """``(message, gold label)`` pairs with each model's probabilities in directives."""
    draw = random.Random(seed)
    made = []
    for i in range(n):
        gold = draw.choice(LABELS)
        other = LABELS[1 - LABELS.index(gold)]
        if draw.random() < right:
            cheap = f"{gold} -0.05|{other} -3.0"
        else:
            cheap = f"{other} -0.65|{gold} -0.75"
        strong = f"{gold} -0.01|{other} -5.0"
        made.append((f"message {i} [[top@cheap:{cheap}]] [[top@strong:{strong}]]", gold))
    return made


def classifier(cascade: bool) -> plait.LLMInference:
    settings: dict[str, Any] = {"escalate_to": "smart", "accept": 0.8} if cascade else {}
    return plait.LLMInference(
        "fast" if cascade else "smart",
        system_prompt="Is this message spam?",
        response_format=Literal["spam", "ham"],
        label_method="logprob",
        **settings,
    )


def run(server: FakeOpenAIServer, data: list[tuple[str, str]], cascade: bool) -> dict[str, Any]:
    server.reset()
    reset_usage()
    aliases = {
        alias: {"model": model, "base_url": server.base_url, "api_key": "sk-bench", **PRICES[alias]}
        for alias, model in MODELS.items()
    }
    resources = plait.ResourceConfig(aliases)
    outputs = classifier(cascade).bind(resources=resources).run_sync([m for m, _ in data])
    right = sum(1 for out, (_, gold) in zip(outputs, data, strict=True) if out == gold)
    report = usage()
    rows = {alias: report[alias] for alias in MODELS if alias in report.as_dict()}
    return {
        "accuracy": right / len(data),
        "requests": {alias: row["requests"] for alias, row in rows.items()},
        "cost": sum(row["cost_usd"] or 0.0 for row in rows.values()),
        "errors": sum(1 for out in outputs if isinstance(out, plait.Value)),
    }


def table(alone: dict[str, Any], cascade: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"{args.n} messages; `cheap` right on {args.right:.0%} (and sure of those), `strong` "
        "right on all; prices: `fast` (cheap) $0.15 / $0.60, `smart` (strong) $2.50 / $10 per "
        "million tokens in / out.",
        "",
        "| run | accuracy | requests to cheap | requests to strong | error rows | cost | vs strong "
        "alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in (("strong alone", alone), ("cascade, accept=0.8", cascade)):
        lines.append(
            f"| {name} | {row['accuracy']:.1%} | {row['requests'].get('fast', 0)} | "
            f"{row['requests'].get('smart', 0)} | {row['errors']} | ${row['cost']:.4f} | "
            f"{row['cost'] / alone['cost']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--right", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    data = messages(args.n, args.right, args.seed)
    with FakeOpenAIServer() as server:
        alone = run(server, data, cascade=False)
        cascade = run(server, data, cascade=True)
    text = table(alone, cascade, args)
    print(text)
    if args.write:
        write_section(
            SECTION,
            f".venv/bin/python benchmarks/cascade.py --n {args.n} --right {args.right:g} "
            f"--seed {args.seed}",
            text,
        )


if __name__ == "__main__":
    main()
