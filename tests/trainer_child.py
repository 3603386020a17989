"""A Trainer run for the kill -9 test: prints each finished step, then the result as JSON.

With a gate N, the child holds after step N (its checkpoint already written) until
stdin has a line: the test kills it exactly there, however loaded the machine.
"""

from __future__ import annotations

import json
import sys

from plait.learning.trainer import TrainingEvent
from tests.conftest import make_resources
from tests.test_trainer import Calls, make_trainer, prompt_of, train

PLAN = ["Answer BAD.", "Answer GOOD.", "Answer BAD again."]


class _Server:
    """What `make_resources` reads from a server: its URL."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def main(base_url: str, directory: str, gate: int) -> None:
    resources = make_resources(_Server(base_url), ("fast", "smart"))  # type: ignore[arg-type]
    trainer = make_trainer(PLAN, resources, batch_size=2, train=6, checkpoint_dir=directory)
    resumed_at = trainer.global_step if trainer.resumed else None

    def on_event(event: TrainingEvent) -> None:
        if event.kind == "step":
            print(f"step {event.step}", flush=True)
            if event.step == gate:
                sys.stdin.readline()  # hold here: the parent kills us

    trainer.on_event = on_event
    calls = Calls()
    history = train(trainer, calls)
    result = {
        "resumed_at": resumed_at,
        "steps": [r.step for r in history.steps],
        "kept": [r.kept for r in history.steps],
        "classifier_calls": calls.classifier,
        "prompt": prompt_of(trainer),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
