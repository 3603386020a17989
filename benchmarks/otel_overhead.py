"""What ``otel()`` costs a run: client CPU per LLM call with and without it (issue 25).

Runs ``run.py``'s extract-and-compare pipeline (3 calls per input) over ``--n``
inputs against the loopback fake OpenAI server at zero latency, where a run is bound
by the client's CPU, so any cost the handler adds shows.  Three ways, interleaved,
``--repeats`` times each, in this one process:

* ``none``: no handler;
* ``otel``: ``otel()`` exporting over OTLP/HTTP (protobuf) to a receiver in a process
  of its own on 127.0.0.1 (it answers 200 and keeps nothing), as a deployment sends
  to a collector: its spans built on the run's thread, encoded and sent on the SDK's
  export thread, both charged to this process's CPU;
* ``profile``: the Perfetto ``profile()`` handler, the existing handler closest in
  what it records, for scale.

Reports the median process CPU per call of each and the ratios to ``none``: speed
belongs here, as ratios, never in a test.

    .venv/bin/python benchmarks/otel_overhead.py [--n 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from run import FanOutFanIn, bound_pipeline  # beside this file

from plait.handlers import otel, profile
from plait.testing import FakeOpenAIServer

CALLS_PER_INPUT = 3
RECEIVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def cpu_per_call(pipeline: Any, inputs: list[str], scope: Callable[[], Any]) -> float:
    """Process CPU seconds per LLM call of one run of ``inputs`` inside ``scope()``."""
    start = time.process_time()
    with scope():
        outputs = pipeline.run_sync(inputs)
    spent = time.process_time() - start
    assert len(outputs) == len(inputs) and all(isinstance(o, str) for o in outputs)
    return spent / (len(inputs) * CALLS_PER_INPUT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="inputs per run (1000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each way (5)")
    args = parser.parse_args()

    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        os.environ["OTEL_SERVICE_NAME"] = "plait-bench"
        with FakeOpenAIServer(api_key="sk-bench") as server:
            pipeline = bound_pipeline(FanOutFanIn, server.base_url, 64)
            inputs = [f"document {i}: " + "words " * 20 for i in range(args.n)]
            ways: dict[str, Callable[[], Any]] = {
                "none": _nothing,
                "otel": otel,
                "profile": profile,
            }
            cpu_per_call(pipeline, inputs[:50], _nothing)  # warm: connections, imports
            cpu_per_call(pipeline, inputs[:50], otel)
            seen: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.repeats):
                for name, scope in ways.items():
                    seen[name].append(cpu_per_call(pipeline, inputs, scope))
    finally:
        receiver.kill()
        receiver.wait()

    base = statistics.median(seen["none"])
    print(f"{args.n} inputs x {CALLS_PER_INPUT} calls, {args.repeats} runs of each, interleaved")
    print(f"{'handler':<10}{'CPU us/call (median)':>22}{'runs':>40}{'ratio':>8}")
    for name, values in seen.items():
        median = statistics.median(values)
        runs = " ".join(f"{v * 1e6:.0f}" for v in values)
        print(f"{name:<10}{median * 1e6:>22.0f}{runs:>40}{median / base:>8.2f}")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
