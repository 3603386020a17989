"""The floor of the 50 ms scenarios: how near its bound this machine lets any client get.

``run.py`` judges each 50 ms scenario by its ratio to ``max(k*L, ceil(N*c/C)*L)``.
That bound counts no CPU at all: neither the client's, nor the endpoint's, nor the
time a woken process waits for a core.  On a fast machine those costs are a few
per cent of L; on a slow one they are not, and no client can hide them.  This
script measures what is left when everything that could be plait's is taken away:

* the endpoint is the least an OpenAI-compatible server can be: an aiohttp app on
  uvloop (when installed) that reads the request, sleeps L from the handler's start
  and answers with a fixed reply; no statistics, no directives, no fault injection
  (``plait.testing.FakeOpenAIServer`` does all of that on every request);
* the client is ``run.py``'s hand-written baseline (asyncio + aiohttp + a semaphore),
  on the default event loop and on uvloop.

Both run in their own processes, the server pinned to a CPU of its own as in
``run.py``.  plait runs against the same server, interleaved with them, and
``asyncio.sleep(L)``'s own lateness is printed as the timer's share.  If the
hand-written baseline against this server stays above a target, the target is out
of reach on this machine for any client: the distance is the machine's.

    .venv/bin/python benchmarks/floor.py [--repeats 5] [--scenarios 1,2,3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (beside this file)


def serve(port: int, latency_ms: float) -> None:
    """The least OpenAI-compatible endpoint: read, sleep ``latency_ms``, answer."""
    import orjson
    from aiohttp import web

    latency = latency_ms / 1000

    async def complete(request: web.Request) -> web.Response:
        started = time.monotonic()
        body = orjson.loads(await request.read())
        left = latency - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)
        reply = {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        }
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    loop_factory = None
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        loop_factory = uvloop.new_event_loop
    loop = loop_factory() if loop_factory else asyncio.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop)


def start_server(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, __file__, "--serve", str(port), "--latency-ms", str(latency_ms)]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the floor server did not start") from None
            time.sleep(0.05)  # polling a child's port, not synchronising a test
    return proc, f"http://127.0.0.1:{port}/v1"


def timer_lateness_ms(latency_s: float, times: int = 20) -> float:
    """Median lateness of ``asyncio.sleep(latency_s)`` on this machine, in ms."""

    async def late() -> list[float]:
        out = []
        for _ in range(times):
            t = time.perf_counter()
            await asyncio.sleep(latency_s)
            out.append(time.perf_counter() - t - latency_s)
        return out

    return statistics.median(asyncio.run(late())) * 1000


def measure(repeats: int, wanted: set[str]) -> list[dict[str, Any]]:
    scenarios = [
        run.Scenario("1. extract-and-compare", run.FanOutFanIn, "fan", 200, 50.0, 32, 3, 2),
        run.Scenario(f"2. chain of {run.CHAIN}", run.Chain, "chain", 200, 50.0, 32, run.CHAIN, 5),
        run.Scenario(
            f"3. fan-out {run.WIDTH} then fan-in", run.Wide, "wide", 50, 50.0, 32, run.WIDTH + 1, 2
        ),
    ]
    loops: dict[str, asyncio.AbstractEventLoop] = {"asyncio": asyncio.new_event_loop()}
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        loops["uvloop"] = uvloop.new_event_loop()
    proc, base_url = start_server(50.0)
    results = []
    try:
        run.pin_apart(proc.pid)
        for sc in scenarios:
            if sc.name.split(".", 1)[0] not in wanted:
                continue
            inputs = [f"document number {i}" for i in range(sc.n)]
            pipeline = run.bound_pipeline(sc.pipeline, base_url, sc.in_flight)
            clients = {name: run.Baseline(base_url, sc.in_flight) for name in loops}
            walls: dict[str, list[float]] = {"plait": [], **{f"baseline on {n}": [] for n in loops}}
            for round_ in range(repeats + 1):  # the first round warms up and is not kept
                t = time.perf_counter()
                outputs = pipeline.run_sync(inputs)
                took = {"plait": time.perf_counter() - t}
                assert len(outputs) == sc.n and all(isinstance(o, str) for o in outputs)
                for name, loop in loops.items():
                    client = clients[name]
                    t = time.perf_counter()
                    loop.run_until_complete(client.run(getattr(client, sc.baseline), inputs))
                    took[f"baseline on {name}"] = time.perf_counter() - t
                if round_:
                    for key, wall in took.items():
                        walls[key].append(wall)
            for name, loop in loops.items():
                loop.run_until_complete(clients[name].close())
            bound = sc.bound()
            row = {"scenario": sc.name, "bound": bound}
            row.update({key: statistics.median(w) / bound for key, w in walls.items()})
            results.append(row)
            cells = ", ".join(
                f"{k} {v:.3f}" for k, v in row.items() if k not in ("scenario", "bound")
            )
            print(f"{sc.name}: ratio to bound {bound:.3f} s: {cells}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for loop in loops.values():
            loop.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scenarios", default="1,2,3", help="comma-separated: 1,2,3")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--latency-ms", type=float, default=50.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.latency_ms)
        return 0
    print(f"asyncio.sleep(0.05) wakes {timer_lateness_ms(0.05):.2f} ms late (median)")
    wanted = {part.strip() for part in args.scenarios.split(",") if part.strip()}
    measure(args.repeats, wanted)
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
