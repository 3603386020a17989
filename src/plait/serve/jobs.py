"""Background jobs: a batch submitted over HTTP, run in the background on a checkpoint.

Each job is a directory under the jobs directory:

```text
<id>/job.json        what it is: inputs count, run seed, state, counts when it ended
<id>/inputs.jsonl    the inputs as the client sent them, one per line
<id>/checkpoint/     a plait checkpoint (plait.execution.checkpoint)
<id>/results.jsonl   once the job has ended: the row of each input that finished, in
                     input order (every input's, for a job that is done)
```

A job runs as ``plait run`` runs a file: its inputs numbered from 0 on a run of its own
with its checkpoint, so every LLM call and every finished output is logged as it
happens; its calls take slots of the server's run-wide limit (``--max-concurrent``)
and the endpoints', queued behind the interactive requests'.  A server stopped
mid-job (SIGTERM, a crash) leaves the job ``running`` on disk; the next server on the
same jobs directory resumes it (and logs that it did), answering finished inputs and
calls from the checkpoint, so nothing finished is paid for again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait._files import write_atomic
from plait._secrets import scrub
from plait.effects import Handler, Message
from plait.execution.checkpoint import Checkpoint, CheckpointBusy, CheckpointError
from plait.execution.runtime import Prepared, Run
from plait.sampling import run_seed
from plait.serve.service import Service
from plait.serve.strict import printable
from plait.values import Value

__all__ = ["Job", "JobStore", "UnknownJob"]

log = logging.getLogger("plait.serve")

#: A job's states: ``running`` (or waiting to be resumed), then one of the others.
RUNNING, DONE, CANCELLED, FAILED = "running", "done", "cancelled", "failed"
#: A job's run's `Engine.rank`: its calls wait behind the interactive requests' (rank 0).
BACKGROUND = 1


class UnknownJob(LookupError):
    """No job has this id (never submitted, or deleted)."""


class CallProgress(Handler):
    """Counts one job's LLM calls as they start and end, so its status moves while
    inputs that make many calls are still running.  One instance per job, entered
    only around that job's run: its counts are that job's."""

    def __init__(self) -> None:
        self.done = 0
        self.failed = 0
        self.in_flight = 0

    def process_llm(self, msg: Message) -> None:
        self.in_flight += 1

    def postprocess_llm(self, msg: Message) -> None:
        self.in_flight -= 1
        if msg.error is None:
            self.done += 1
        else:
            self.failed += 1

    def counts(self) -> dict[str, int]:
        return {"done": self.done, "failed": self.failed, "in_flight": self.in_flight}


@dataclass
class Job:
    id: str
    directory: Path
    total: int
    seed: int | None
    created: float
    state: str = RUNNING
    #: Why the job could not run (state ``failed``), or why it is not running now.
    error: str | None = None
    #: Rows delivered so far by position (a running job's; a finished one reads its file).
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    done: int = 0
    failed: int = 0
    task: asyncio.Task[None] | None = None
    #: Its LLM calls on this server (a resumed job counts again from 0).
    calls: CallProgress = field(default_factory=CallProgress)
    #: Whether this server resumed it (a stopped server left it running).
    resumed: bool = False

    @property
    def pending(self) -> int:
        return self.total - self.done - self.failed

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "counts": {
                "total": self.total,
                "done": self.done,
                "failed": self.failed,
                "pending": self.pending,
            },
            "calls": self.calls.counts(),
            "created": self.created,
            "error": self.error,
        }

    def save(self) -> None:
        record = {
            "id": self.id,
            "total": self.total,
            "seed": self.seed,
            "created": self.created,
            "state": self.state,
            "error": self.error,
            "done": self.done,
            "failed": self.failed,
        }
        write_atomic(self.directory / "job.json", json.dumps(record))

    def results(self) -> list[dict[str, Any]]:
        """The rows of an ended job, in input order: every input's once it is done, the
        finished ones' once it was cancelled or failed (none for a job that ended before
        its results were kept)."""
        path = self.directory / "results.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class JobStore:
    """The jobs of one server, kept under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], service: Service) -> None:
        self.directory = Path(directory)
        self.service = service
        self.jobs: dict[str, Job] = {}
        self.started = False

    # -- life ------------------------------------------------------------------------
    def start(self) -> None:
        """Load every job on disk; resume those a stopped server left running (once: at
        the app's startup, or at the first jobs request of an app mounted in another
        whose lifespan does not reach it)."""
        if self.started:
            return
        self.started = True
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.iterdir()):
            meta = path / "job.json"
            if not meta.is_file():
                continue
            try:
                record = json.loads(meta.read_text(encoding="utf-8"))
                job = Job(
                    id=record["id"],
                    directory=path,
                    total=int(record["total"]),
                    seed=record.get("seed"),
                    created=float(record["created"]),
                    state=record["state"],
                    error=record.get("error"),
                    done=int(record.get("done", 0)),
                    failed=int(record.get("failed", 0)),
                )
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("plait serve: skipping %s: unreadable job.json (%s)", path, exc)
                continue
            self.jobs[job.id] = job
            if job.state == RUNNING:
                job.done = job.failed = 0  # counted again as the resumed run delivers
                job.resumed = True
                self._launch(job)

    async def stop(self) -> None:
        """Stop every running job where it is: what finished is in its checkpoint, and the
        job stays ``running`` on disk for the next server to resume."""
        running = [job.task for job in self.jobs.values() if job.task is not None]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)

    # -- requests --------------------------------------------------------------------
    def submit(self, inputs: list[Any]) -> Job:
        """Write a new job's inputs to disk, then start it."""
        self.start()
        job_id = os.urandom(8).hex()
        directory = self.directory / job_id
        directory.mkdir(parents=True)
        # Drawn now and kept: a resumed job must run with the seed it started with.
        seed, _ = run_seed(self.service.module, self.service.opts.get("seed"))
        job = Job(job_id, directory, len(inputs), seed, time.time())
        lines = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in inputs)
        write_atomic(directory / "inputs.jsonl", lines)
        job.save()
        self.jobs[job_id] = job
        self._launch(job)
        return job

    def get(self, job_id: str) -> Job:
        self.start()
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(
                f"no job {job_id!r} on this server (GET /jobs lists them; a deleted job is gone)"
            )
        return job

    async def cancel(self, job_id: str) -> Job:
        """Stop a running job (its finished rows stay readable in its checkpoint)."""
        job = self.get(job_id)
        if job.task is not None:
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task
        if job.state == RUNNING:
            self._end(job, CANCELLED, None)  # its finished rows stay readable
        return job

    def delete(self, job_id: str) -> None:
        """Forget an ended job and remove its directory."""
        job = self.get(job_id)
        del self.jobs[job_id]
        shutil.rmtree(job.directory, ignore_errors=True)

    # -- running ---------------------------------------------------------------------
    def _launch(self, job: Job) -> None:
        job.task = asyncio.get_running_loop().create_task(self._run(job))

    async def _run(self, job: Job) -> None:
        service = self.service
        try:
            raw = [
                json.loads(line)
                for line in (job.directory / "inputs.jsonl").read_text("utf-8").splitlines()
            ]
            model = service.schemas.input
            inputs = [service.arguments(model.model_validate(item)) for item in raw]
            checkpoint = Checkpoint.of_run(
                job.directory / "checkpoint", service.module, service.resources, job.seed
            ).open()
        except CheckpointBusy as exc:
            job.error = str(exc)  # another server runs it: leave it to that one
            job.task = None
            log.warning("plait serve: not running job %s: %s", job.id, exc)
            return
        except (OSError, ValueError, CheckpointError) as exc:
            self._end(job, FAILED, f"{type(exc).__name__}: {exc}")
            return
        if job.resumed:
            log.info(
                "plait serve: resuming job %s: %d inputs, %d finished and %d calls kept in "
                "its checkpoint",
                job.id,
                job.total,
                len(checkpoint.outputs),
                len(checkpoint.calls),
            )

        def prepare(position: int) -> Prepared:
            return inputs[position]

        def deliver(position: int, item: Any, value: Value) -> None:
            row = service.row(position, value)
            job.rows[position] = row
            if "error" in row:
                job.failed += 1
            else:
                job.done += 1

        opts = {**service.opts, "seed": job.seed}
        finished = False
        try:
            # A batch run on the job's checkpoint, as `plait run` drives one (through the
            # local backend), except that its calls queue behind the requests' for the
            # endpoints' slots: a client waiting on /invoke is not starved by a big job.
            run = Run(service.module, opts, batch=True, checkpoint=checkpoint)
            run.engine.rank = BACKGROUND
            # One run-wide limit for the whole server: the job's calls take its slots.
            run.engine.limiter = service.limiter
            try:
                with service.scope(), job.calls:
                    await run.drive(range(job.total), prepare, deliver)
                finished = True
            finally:
                run.close(finished)
        except Exception as exc:
            # The pipeline's code (a TracingError), a checkpoint that cannot go on, or
            # anything else that ended the run: the job says so.  Left to the task, it
            # would stay "running" for ever, its error logged once as never retrieved.
            # (A cancellation is no failure: a stopped server's job resumes.)
            self._end(job, FAILED, scrub(f"{type(exc).__name__}: {exc}"))
            return
        finally:
            checkpoint.close()
        self._end(job, DONE, None)

    def _end(self, job: Job, state: str, error: str | None) -> None:
        """The job has ended: its rows delivered (all of them, for a job that is done)
        written in input order, then its state, on disk."""
        rows = "".join(json.dumps(job.rows[i]) + "\n" for i in sorted(job.rows))
        write_atomic(job.directory / "results.jsonl", rows)
        job.rows.clear()
        job.calls.in_flight = 0  # calls cancelled with the job are answered by nobody
        job.state, job.error, job.task = state, None if error is None else printable(error), None
        job.save()
