"""A batch run for the interruption tests; prints progress, then all outputs as JSON.

``stream`` mode prints ``done <index>`` per finished input; ``sync`` mode runs the
batch with `run_sync` (the path Ctrl-C interrupts) and prints ``call`` per LLM call.
With a gate N, the child stops its event loop after the N-th line until stdin has a
line (or closes): the test interrupts it exactly there, however loaded the machine.
"""

from __future__ import annotations

import asyncio
import json
import sys

import plait
from plait.handlers import Handler, Message
from tests.pipelines import FanOutFanIn

GATE = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def report(line: str, seen: int) -> None:
    print(line, flush=True)
    if seen == GATE:
        sys.stdin.readline()  # hold the loop: the parent interrupts us here


class Progress(Handler):
    calls = 0

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm":
            Progress.calls += 1
            report("call", Progress.calls)


def make_pipeline(base_url: str, checkpoint_dir: str) -> FanOutFanIn:
    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": base_url,
                "api_key": "sk-test",
                "max_concurrent": 4,
            }
        }
    )
    return FanOutFanIn().bind(resources=resources, checkpoint_dir=checkpoint_dir)


async def main(base_url: str, checkpoint_dir: str, count: int) -> None:
    pipeline = make_pipeline(base_url, checkpoint_dir)
    outputs: dict[int, str] = {}
    async for result in pipeline.stream([f"item {i}" for i in range(count)]):
        if not result.ok:
            raise SystemExit(f"input {result.index} failed: {result.error}")
        outputs[result.index] = result.output
        report(f"done {result.index}", len(outputs))
    print("OUTPUTS " + json.dumps([outputs[i] for i in range(count)]), flush=True)


def main_sync(base_url: str, checkpoint_dir: str, count: int) -> None:
    pipeline = make_pipeline(base_url, checkpoint_dir)
    with Progress():
        outputs = pipeline.run_sync([f"item {i}" for i in range(count)])
    print("OUTPUTS " + json.dumps(outputs), flush=True)


if __name__ == "__main__":
    url, directory, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if len(sys.argv) > 4 and sys.argv[4] == "sync":
        main_sync(url, directory, n)
    else:
        asyncio.run(main(url, directory, n))
