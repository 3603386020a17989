"""Which llama.cpp settings keep the embedded model's answers reproducible (issue 23).

The same 24 chat requests at temperature 0 (an instruction, 0, 2 or 4 worked examples,
a message) go to llama.cpp's server (xllamacpp, in-process, 4 slots) several ways: one
by one with every prompt computed whole (the reference), then shuffled and 4 at a
time, and with prompt reuse one by one, shuffled, and shuffled 4 at a time.  Reported
for each: how many replies differ from the reference in their text and in the
log-probabilities of their first tokens, with flash attention off and on.

It explains two settings of `plait.providers.local`: flash attention is off, and
``prompt_caching = false`` is what an alias sets for answers reproducible to the bit.

    .venv/bin/python benchmarks/local_reproducible.py
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from typing import Any

DEMOS = [
    ("Where is my package? Order ORD-1187 was due Monday.", "ORD-1187"),
    ("Refund please for order 40291, it came broken.", "40291"),
    ("The parcel for #B-7702 is missing an item.", "B-7702"),
    ("Can you update the address on order ORD-9034?", "ORD-9034"),
]
MESSAGES = [
    "Hi, my order ORD-5521 never arrived, can you check?",
    "Order number 88213 was charged twice.",
    "I'm writing about #A-3310: the box was damaged.",
    "Name a fruit.",
    "Tell me about order 7781 please",
    "Where is parcel Z-1?",
    "Write a haiku about rain.",
    "What is 2+2?",
]
SLOTS = 4


def measure(flash_attention: bool) -> None:
    import xllamacpp  # type: ignore[import-untyped]

    from plait.providers.local import find_packaged_model

    params = xllamacpp.CommonParams()
    params.model.path = str(find_packaged_model())
    params.n_parallel = SLOTS
    params.n_ctx = 2048 * SLOTS
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 1
    params.warmup = False
    params.verbosity = -1
    params.flash_attn_type = 1 if flash_attention else 0
    server = xllamacpp.Server(params)
    jobs = [(m, n) for m in MESSAGES for n in (0, 2, 4)]

    def body(job: tuple[str, int], reuse: bool) -> dict[str, Any]:
        messages = [{"role": "system", "content": "Extract the order number from the message."}]
        for question, answer in DEMOS[: job[1]]:
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
        messages.append({"role": "user", "content": job[0]})
        return {
            "messages": messages,
            "max_tokens": 24,
            "temperature": 0,
            "cache_prompt": reuse,
            "logprobs": True,
        }

    def run(order: list[tuple[str, int]], reuse: bool, together: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}

        def one(job: tuple[str, int]) -> None:
            choice = server.handle_chat_completions(body(job, reuse))["choices"][0]
            logprobs = [t["logprob"] for t in choice["logprobs"]["content"][:3]]
            out[job] = (choice["message"]["content"], logprobs)

        def each(chunk: list[tuple[str, int]]) -> None:
            for job in chunk:
                one(job)

        chunks = [order[k::together] for k in range(together)]
        threads = [threading.Thread(target=each, args=(chunk,)) for chunk in chunks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return out

    reference = run(jobs, reuse=False, together=1)
    ways = {
        "whole prompts, shuffled, 4 at a time": (False, 1, SLOTS),
        "prompt reuse, one by one": (True, 0, 1),
        "prompt reuse, shuffled": (True, 2, 1),
        "prompt reuse, shuffled, 4 at a time": (True, 3, SLOTS),
    }
    for name, (reuse, seed, together) in ways.items():
        order = list(jobs)
        if seed:
            random.Random(seed).shuffle(order)
        got = run(order, reuse, together)
        text = sum(got[j][0] != reference[j][0] for j in jobs)
        bits = sum(got[j][1] != reference[j][1] for j in jobs)
        fa = "on" if flash_attention else "off"
        print(
            f"| {fa} | {name} | {text} / {len(jobs)} | {bits} / {len(jobs)} |",
            flush=True,
        )


def main() -> int:
    if len(sys.argv) > 1:
        measure(sys.argv[1] == "on")
        return 0
    print("| flash attention | how | replies whose text differs | whose log-probabilities differ |")
    print("|---|---|---:|---:|")
    for setting in ("off", "on"):  # a process each: the runtime is configured at load
        subprocess.run([sys.executable, __file__, setting], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
