"""A batch run for the kill -9 test: prints each finished index, then all outputs as JSON."""

from __future__ import annotations

import asyncio
import json
import sys

import plait
from tests.pipelines import FanOutFanIn


async def main(base_url: str, checkpoint_dir: str, count: int) -> None:
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
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=checkpoint_dir)
    outputs: dict[int, str] = {}
    async for result in pipeline.stream([f"item {i}" for i in range(count)]):
        if not result.ok:
            raise SystemExit(f"input {result.index} failed: {result.error}")
        outputs[result.index] = result.output
        print(f"done {result.index}", flush=True)
    print("OUTPUTS " + json.dumps([outputs[i] for i in range(count)]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
