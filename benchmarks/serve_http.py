"""What serving a pipeline over HTTP costs: ``plait serve`` against the same batch in-process.

One single-call pipeline on the loopback fake server (fixed latency L, the alias's
``max_concurrent`` C), N inputs, four ways: ``run_sync(list)`` in this process (the
reference), one ``POST /batch``, one ``POST /stream`` (until its summary event), and N
``POST /invoke`` from K concurrent clients.  Each wall time is a ratio to the lower
bound ``ceil(N / C) * L`` and to the in-process run; medians of R runs, interleaved.
The server is ``plait serve`` in a process of its own, started once.

    PYTHONPATH=src .venv/bin/python benchmarks/serve_http.py [--n 400] [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

import plait
from plait.testing import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tests/serve_targets.py:Answer"


async def ready(proc: subprocess.Popen[bytes], log: Path) -> str:
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"plait serve exited:\n{log.read_text()}")
        text = log.read_text()
        if " on http://" in text:
            url = "http://" + text.split(" on http://", 1)[1].split()[0]
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{url}/health") as response,
                ):
                    if response.status == 200:
                        return url
            except aiohttp.ClientConnectionError:
                pass
        await asyncio.sleep(0.05)


async def by_batch(url: str, inputs: list[dict[str, str]]) -> float:
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        async with session.post(f"{url}/batch", json={"inputs": inputs}) as response:
            rows = (await response.json())["rows"]
        elapsed = time.perf_counter() - started
    assert len(rows) == len(inputs) and all("output" in row for row in rows)
    return elapsed


async def by_stream(url: str, inputs: list[dict[str, str]]) -> float:
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        async with session.post(f"{url}/stream", json={"inputs": inputs}) as response:
            rows = 0
            async for line in response.content:
                if line.startswith(b"event: row"):
                    rows += 1
                elif line.startswith(b"event: summary"):
                    break
        elapsed = time.perf_counter() - started
    assert rows == len(inputs)
    return elapsed


async def by_invoke(url: str, inputs: list[dict[str, str]], clients: int) -> float:
    queue = list(reversed(inputs))
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while queue:
                body = queue.pop()
                async with session.post(f"{url}/invoke", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrent", type=int, default=32, help="the alias's max_concurrent")
    parser.add_argument("--clients", type=int, default=64, help="concurrent /invoke clients")
    parser.add_argument("--runs", type=int, default=3)
    ns = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.serve_targets import Answer

    bound = math.ceil(ns.n / ns.concurrent) * ns.latency_ms / 1000
    times: dict[str, list[float]] = {"in-process run_sync": [], "/batch": [], "/stream": []}
    times[f"/invoke x{ns.n}, {ns.clients} clients"] = []
    with FakeOpenAIServer(api_key="sk-test") as fake, tempfile.TemporaryDirectory() as tmp:
        fake.configure(latency_ms=ns.latency_ms)
        settings = {
            "provider": "openai",
            "model": "m",
            "base_url": fake.base_url,
            "api_key": "sk-test",
            "max_concurrent": ns.concurrent,
        }
        resources = Path(tmp) / "resources.toml"
        resources.write_text(
            "[resources.fast]\n"
            + "".join(f"{k} = {v!r}\n" for k, v in settings.items()).replace("'", '"')
        )
        log = Path(tmp) / "serve.log"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "plait.cli", "serve", TARGET, "--resources",
                 str(resources), "--port", "0", "--log-level", "warning"],
                cwd=ROOT, stderr=err, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            url = asyncio.run(ready(proc, log))
            pipeline = Answer().bind(resources=plait.ResourceConfig({"fast": settings}))
            questions = [f"question {i}" for i in range(ns.n)]
            inputs = [{"question": q} for q in questions]
            pipeline.run_sync(questions[:8])  # warm: connections, imports
            asyncio.run(by_batch(url, inputs[:8]))
            peaks = []
            server_cpu: list[float] = []
            for _ in range(ns.runs):
                fake.reset()
                started = time.perf_counter()
                pipeline.run_sync(questions)
                times["in-process run_sync"].append(time.perf_counter() - started)
                fake.reset()
                times["/batch"].append(asyncio.run(by_batch(url, inputs)))
                peaks.append(fake.stats()["max_in_flight"])
                fake.reset()
                times["/stream"].append(asyncio.run(by_stream(url, inputs)))
                fake.reset()
                key = f"/invoke x{ns.n}, {ns.clients} clients"
                cpu = cpu_seconds(proc.pid)
                times[key].append(asyncio.run(by_invoke(url, inputs, ns.clients)))
                server_cpu.append((cpu_seconds(proc.pid) - cpu) / ns.n * 1000)
                peaks.append(fake.stats()["max_in_flight"])
        finally:
            proc.terminate()
            proc.wait(60)
    reference = statistics.median(times["in-process run_sync"])
    print(f"N={ns.n}, L={ns.latency_ms:g} ms, C={ns.concurrent}; bound {bound:.3f} s; "
          f"median of {ns.runs}; fake's max in flight over HTTP runs: {max(peaks)}")  # fmt: skip
    print(f"server CPU per /invoke: {statistics.median(server_cpu):.2f} ms")
    print("| way | median s | ratio to bound | ratio to in-process |")
    print("|---|---:|---:|---:|")
    for way, samples in times.items():
        median = statistics.median(samples)
        print(f"| {way} | {median:.3f} | {median / bound:.3f} | {median / reference:.3f} |")


if __name__ == "__main__":
    main()
