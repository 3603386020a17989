"""``plait status CHECKPOINT``: what a run's checkpoint holds, without running anything.

For any run: the pipeline (as the command named it, ``review.py:Review``), the
inputs finished and the calls kept (its Ray workers' too).  For a batch-API run
(``plait run --batch-api``) also its batches from ``batches.jsonl``: submitted and
still pending (with their ids, to look up at the provider), ended, and the calls in
them by outcome.  It only reads: a run may be going on in the checkpoint.  A damaged
file is one line naming the file and the line, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from plait._jsonl import loads
from plait.execution.checkpoint import shown_pipeline

__all__ = ["build_parser", "main", "status_of"]


class StatusError(ValueError):
    """A checkpoint file that cannot be read; the message names the file (and line)."""


def status_of(directory: Path) -> dict[str, Any]:
    """What ``directory`` (a run's checkpoint) records, as data.

    Raises:
        FileNotFoundError: ``directory`` is no checkpoint.
        StatusError: one of its files is damaged (the message names it, and the line).
    """
    from plait.execution.batch_api import LEDGER_NAME
    from plait.providers.base import ProviderError
    from plait.resources.batching import BatchLedger

    manifest = _manifest(directory / "manifest.json", directory)
    finished: set[int] = set()
    calls = 0
    for path in [directory / "log.jsonl", *sorted((directory / "workers").glob("*.jsonl"))]:
        for kind, index in _log_records(path):
            if kind == "out" and index is not None and path.parent == directory:
                finished.add(index)
            elif kind == "call":
                calls += 1
    status: dict[str, Any] = {
        "checkpoint": str(directory),
        "pipeline": shown_pipeline(manifest["pipeline"], manifest.get("target")),
        "finished_inputs": len(finished),
        "calls_kept": calls,
    }
    ledger_path = directory / LEDGER_NAME
    if ledger_path.is_file():
        try:
            status["batch_api"] = BatchLedger(ledger_path).load().summary()
        except ProviderError as exc:  # a damaged line: the message names the file and line
            raise StatusError(str(exc)) from None
    return status


def _manifest(path: Path, directory: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{directory} is not a plait checkpoint (it has no manifest.json); give the "
            "directory a run was started with (plait run's --checkpoint, by default "
            "OUTPUT.checkpoint)"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise StatusError(f"{path} is not valid JSON ({exc}): the checkpoint is damaged") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("pipeline"), str):
        raise StatusError(
            f"{path} is not a checkpoint's manifest (a JSON object naming its pipeline): "
            "the checkpoint is damaged"
        )
    return manifest


def _log_records(path: Path) -> Iterator[tuple[str, int | None]]:
    """(type, input index: None for a ``code`` record) of each whole record of a
    checkpoint log, checked as a resume checks it; a torn last line is skipped (a
    run may be writing it)."""
    if not path.is_file():
        return
    raw = path.read_bytes()
    for number, line in enumerate(raw[: raw.rfind(b"\n") + 1].splitlines(), start=1):
        try:
            record = loads(line)
            if not isinstance(record, dict):
                raise TypeError(f"a record is a JSON object, not a {type(record).__name__}")
            kind = record.get("t")
            if kind not in ("call", "out", "code"):
                raise ValueError(f"unknown record type {kind!r}")
            index = record.get("i")
            if kind != "code" and (not isinstance(index, int) or isinstance(index, bool)):
                raise TypeError(f"its input index is {index!r}, not a whole number")
        except (ValueError, TypeError) as exc:
            raise StatusError(f"{path} line {number} is corrupt ({exc})") from None
        yield kind, index


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plait status",
        description="show what a run's checkpoint holds: finished inputs, kept calls, and "
        "for a --batch-api run its batches (submitted, pending, ended) and their calls",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="the run's checkpoint directory")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(list(argv) if argv is not None else None)
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
