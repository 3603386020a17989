"""What a run seed costs (issue 14): plait's own CPU per LLM call, seeded and not.

One `LLMInference` over N inputs of ~500 characters against the loopback fake
server (its own process, no latency), so the run is bound by plait's CPU, the
worst case for the seed's share: a seeded run hashes each request once more to
derive the call's seed.  Modes alternate; the figure is the median of the runs'
process CPU time divided by N.

    .venv/bin/python benchmarks/sampling_cost.py [N] [REPEATS]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import plait
from plait.testing import FakeOpenAIServer


def main(count: int = 8000, repeats: int = 7) -> None:
    with FakeOpenAIServer(api_key="sk-test") as server:
        endpoint = {
            "provider": "openai",
            "model": "m",
            "base_url": server.base_url,
            "api_key": "sk-test",
            "max_concurrent": 64,
        }
        resources = plait.ResourceConfig({"fast": endpoint})
        module = plait.LLMInference("fast", temperature=0.8).bind(resources=resources)
        inputs = [f"input number {i} " + "x" * 500 for i in range(count)]
        module.run_sync(inputs[:200])  # warm: connections, imports
        cpu: dict[str, list[float]] = {"unseeded": [], "seeded": []}
        for repeat in range(repeats):
            order = ("unseeded", "seeded") if repeat % 2 else ("seeded", "unseeded")
            for mode in order:
                options: dict[str, Any] = {"seed": 7} if mode == "seeded" else {}
                started = time.process_time()
                module.run_sync(inputs, **options)
                cpu[mode].append(time.process_time() - started)
    plain, seeded = statistics.median(cpu["unseeded"]), statistics.median(cpu["seeded"])
    print(
        f"CPU per call over {count} calls, median of {repeats}: unseeded "
        f"{plain / count * 1e6:.0f} us, seeded {seeded / count * 1e6:.0f} us, "
        f"ratio {seeded / plain:.3f}"
    )


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
