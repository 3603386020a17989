"""``plait status CHECKPOINT``: what a run's checkpoint holds, without running anything.

For any run: the pipeline, the inputs finished and the calls kept.  For a batch-API
run (``plait run --batch-api``) also its batches from ``batches.jsonl``: submitted
and still pending (with their ids, to look up at the provider), ended, and the calls
in them by outcome.  It only reads: a run may be going on in the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plait._jsonl import loads

__all__ = ["main", "status_of"]


def status_of(directory: Path) -> dict[str, Any]:
    """What ``directory`` (a run's checkpoint) records, as data."""
    from plait.execution.batch_api import LEDGER_NAME
    from plait.resources.batching import BatchLedger

    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{directory} is not a plait checkpoint (it has no manifest.json); give the "
            "directory a run was started with (plait run's --checkpoint, by default "
            "OUTPUT.checkpoint)"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    finished: set[int] = set()
    calls = 0
    log = directory / "log.jsonl"
    if log.is_file():
        # Read without cutting a torn last line: a run may be writing it.
        raw = log.read_bytes()
        for line in raw[: raw.rfind(b"\n") + 1].splitlines():
            record = loads(line)
            if record.get("t") == "out":
                finished.add(int(record["i"]))
            elif record.get("t") == "call":
                calls += 1
    status: dict[str, Any] = {
        "checkpoint": str(directory),
        "pipeline": manifest.get("pipeline"),
        "finished_inputs": len(finished),
        "calls_kept": calls,
    }
    ledger_path = directory / LEDGER_NAME
    if ledger_path.is_file():
        status["batch_api"] = BatchLedger(ledger_path).load().summary()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="plait status",
        description="show what a run's checkpoint holds: finished inputs, kept calls, and "
        "for a --batch-api run its batches (submitted, pending, ended) and their calls",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="the run's checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    ns = parser.parse_args(list(argv) if argv is not None else None)
    try:
        status = status_of(Path(ns.checkpoint))
    except (OSError, ValueError) as exc:
        print(f"plait status: error: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"checkpoint {status['checkpoint']} ({status['pipeline']})")
    print(f"  inputs finished: {status['finished_inputs']:,}; calls kept: {status['calls_kept']:,}")
    batch = status.get("batch_api")
    if batch is not None:
        b, c = batch["batches"], batch["calls"]
        print(
            f"  batches: {b['pending']} pending, {b['submitting']} being submitted, "
            f"{b['ended']} ended, {b['abandoned']} never submitted"
        )
        print(
            f"  calls in batches: {c['pending']:,} pending, {c['succeeded']:,} succeeded, "
            f"{c['failed']:,} failed (a failed call is retried in a later batch)"
        )
        for batch_id in batch["unfinished"]:
            print(f"    pending: {batch_id}")
    return 0
