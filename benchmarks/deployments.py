"""Three deployments of one model behind one alias (issue 37, point 6b): throughput.

Three fake OpenAI servers each enforce ``--rps`` requests a second (windows of one
second, stated on every reply in OpenAI's rate-limit headers, a 429 beyond).  One
alias names the three as ``deployments``; ``--n`` one-call inputs run on it, in two
ways:

* ``configured``: each deployment's ``requests_per_minute`` written in the alias;
* ``learned``: no limit written; plait learns each one from the replies' headers.

The table gives each run's throughput against the sum of the deployments' limits,
the calls each deployment answered, and the 429s the servers sent.  The target
(issue 37): at least 0.9x the sum.

    .venv/bin/python benchmarks/deployments.py [--n 900] [--rps 10] [--write]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from sections import write_section  # beside this file

import plait
from plait.resources.manager import use_governors
from plait.resources.routing import reset_breakers
from plait.resources.usage import reset_usage, usage
from plait.testing import FakeOpenAIServer

SECTION = "## 19. Three deployments of one model behind one alias (issue 37)"
#: What the numbers say, kept under them in RESULTS.md.
NOTES = """\
The first version of the choice compared only each deployment's wait under its rate limit, and
sent most calls to whichever refilled first, where they queued (0.61x configured, 0.72x learned,
at `--n 300`). A deployment is now judged by when it would send the call: its wait plus the
calls already queued there at its rate.
"""


def run(servers: list[FakeOpenAIServer], args: argparse.Namespace, mode: str) -> dict[str, Any]:
    for server in servers:
        server.reset()
    reset_usage()
    reset_breakers()
    use_governors(None)  # fresh limits: nothing learned by the run before
    own: dict[str, Any] = {"requests_per_minute": args.rps * 60} if mode == "configured" else {}
    deployments = [{"base_url": server.base_url, **own} for server in servers]
    resources = plait.ResourceConfig(
        {
            "fast": {
                "model": "bench",
                "api_key": "sk-bench",
                "max_concurrent": 16,
                "max_retries": 20,
                "deployments": deployments,
            }
        }
    )
    llm = plait.LLMInference("fast", "Answer.", max_tokens=8).bind(resources=resources)
    start = time.monotonic()
    outputs = llm.run_sync([f"question {i}" for i in range(args.n)])
    wall = time.monotonic() - start
    return {
        "throughput": args.n / wall,
        "wall": wall,
        "answered": [int(s.stats()["status_counts"].get("200", 0)) for s in servers],
        "refused": sum(int(s.stats()["status_counts"].get("429", 0)) for s in servers),
        "errors": sum(1 for out in outputs if isinstance(out, plait.Value)),
        "by_deployment": usage()["fast"]["deployments"],
    }


def table(rows: list[tuple[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    total = args.rps * 3
    lines = [
        f"{args.n} calls; three deployments, each allowing {args.rps} requests a second "
        f"(the sum: {total}/s).",
        "",
        "| limits | throughput | vs the sum | calls per deployment | 429s | error rows | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows:
        lines.append(
            f"| {name} | {row['throughput']:.1f}/s | {row['throughput'] / total:.2f}x | "
            f"{' / '.join(str(n) for n in row['answered'])} | {row['refused']} | "
            f"{row['errors']} | {row['wall']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=900)
    parser.add_argument("--rps", type=int, default=10)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    limits = {"rpm_limit": args.rps * 60, "limit_window_s": 1.0}
    with (
        FakeOpenAIServer(**limits) as a,
        FakeOpenAIServer(**limits) as b,
        FakeOpenAIServer(**limits) as c,
    ):
        servers = [a, b, c]
        rows = [(mode, run(servers, args, mode)) for mode in ("configured", "learned")]
    text = table(rows, args)
    print(text)
    if args.write:
        command = f".venv/bin/python benchmarks/deployments.py --n {args.n} --rps {args.rps}"
        write_section(SECTION, command, text, NOTES)


if __name__ == "__main__":
    main()
