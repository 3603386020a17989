"""The driver of a multi-process run: hands batches of inputs to Ray workers, collects rows.

The driver reads the inputs lazily, keeps every worker a few small batches ahead
(enough inputs in flight per worker to fill its endpoints' leases), and delivers
each row the moment it arrives.  It alone owns the checkpoint's lock, manifest
and outputs: finished inputs are answered from it without reaching a worker, and
each output is recorded before it is delivered.  The workers log the calls they
complete beside it (see `Checkpoint.open_for_worker`), which makes faults cheap:

- a worker process that dies (killed, out of memory, its machine gone) fails the
  batches it held; the driver tells the broker to take back its slots, starts a
  replacement, and hands those inputs out again, first in line.  Calls the dead
  worker had completed are answered from its log, so nothing is paid twice and
  every input is delivered exactly once;
- a driver that dies leaves the checkpoint (outputs, and every worker's calls);
  the same command started again resumes from it.

The checkpoint directory must be one path every worker can write: on one machine
any directory; across machines a shared file system (NFS, a mounted bucket).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from plait.execution.checkpoint import Checkpoint
from plait.execution.codec import fingerprint
from plait.ray.worker import (
    PipelineSpec,
    PipelineWorker,
    Unsendable,
    is_plain,
    pickling_problem,
    row_of,
    value_of,
)
from plait.values import Value, ValueKind, error_value

__all__ = [
    "MAX_LOSSES",
    "Dispatch",
    "WorkItem",
    "WorkerDied",
    "WorkerPool",
    "run_distributed",
]

#: How many worker deaths one input may see before it becomes its error row.
MAX_LOSSES = 3


class WorkerDied(RuntimeError):
    """The worker processes running an input kept dying (see `MAX_LOSSES`)."""


#: What the driver hands a worker per input: (index, args, kwargs).
WorkItem = tuple[int, tuple[Any, ...], dict[str, Any]]


@dataclass
class _Worker:
    name: str
    actor: Any
    in_flight: int = 0
    worker_id: str = ""
    pid: int = 0
    #: Running one suspect input alone (see `run_distributed`).
    isolated: bool = False


class Dispatch:
    """Workers and the batches they hold; replaces a worker that dies."""

    def __init__(self, ray: Any, spec: PipelineSpec, workers: int) -> None:
        self.ray = ray
        self.spec = spec
        self.broker: Any = None
        self.restarts = 0
        self._names = itertools.count()
        self.workers: list[_Worker] = []
        from plait.ray.cluster import broker

        self.broker = broker()
        self._class = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1000)(PipelineWorker)
        self.workers = [self._start() for _ in range(workers)]
        # Wait for every worker to have built its pipeline: a spec that cannot be
        # unpickled or built is one clear error here, not one per batch.
        for worker, info in zip(
            self.workers, self.ray.get([w.actor.ready.remote() for w in self.workers]), strict=True
        ):
            worker.worker_id = info["worker"]
            worker.pid = info["pid"]

    def _start(self) -> _Worker:
        name = f"w{next(self._names)}"
        return _Worker(name, self._class.remote(self.spec, name))

    def load(self, spec: PipelineSpec) -> None:
        """Give the running workers another pipeline (a trainer's next pass): each
        rebuilds it from ``spec`` in place of starting a process; one that died since
        is replaced by a new worker built from ``spec``."""
        self.spec = spec
        loading = [(w, w.actor.load.remote(spec)) for w in self.workers]
        for worker, ref in loading:
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                self.replace(worker)

    def finish_pass(self) -> None:
        """Close each worker's run (its call log) and keep the processes for the next."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                self.ray.get(worker.actor.close.remote(), timeout=10)

    def replace(self, dead: _Worker) -> _Worker:
        """A new worker in place of ``dead``, whose slots the broker takes back at once."""
        if dead.worker_id:
            self.broker.forget.remote(dead.worker_id)
        self.restarts += 1
        fresh = self._start()
        info = self.ray.get(fresh.actor.ready.remote())
        fresh.worker_id, fresh.pid = info["worker"], info["pid"]
        self.workers[self.workers.index(dead)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(Exception):
                self.ray.get(worker.actor.close.remote(), timeout=10)
            self.ray.kill(worker.actor)
        # A worker gives its slots back on its next sync, a tenth of a second after its
        # last call; killed before that, it would keep them in the broker (which outlives
        # the run) until LEASE_TTL_S, and the next run on the cluster would wait for them.
        forgotten = [self.broker.forget.remote(w.worker_id) for w in self.workers if w.worker_id]
        with contextlib.suppress(Exception):
            self.ray.get(forgotten, timeout=10)


class WorkerPool:
    """Worker processes kept between the runs of one session (a `Trainer`'s passes).

    Starting a worker costs a process, ``import plait`` and a Ray actor: about three
    seconds, where a validation pass of a few dozen calls takes a fraction of one, so a
    training run on workers spent most of its time starting them.  A pass takes an idle
    set of workers (`Dispatch`), reloads it with its own pipeline, and gives it back
    when it ends; passes that run at once each get a set of their own.  `close` stops
    them all at the end of the session.
    """

    def __init__(self) -> None:
        self._idle: list[tuple[tuple[int, str | None], Dispatch]] = []
        self._lock = threading.Lock()

    def take(self, ray: Any, spec: PipelineSpec, workers: int, address: str | None) -> Dispatch:
        """An idle set of ``workers`` loaded with ``spec``, or a new one."""
        key = (workers, address)
        with self._lock:
            found = next((d for k, d in self._idle if k == key), None)
            if found is not None:
                self._idle = [(k, d) for k, d in self._idle if d is not found]
        if found is None:
            return Dispatch(ray, spec, workers)
        try:
            found.load(spec)
        except BaseException:
            found.close()
            raise
        return found

    def give_back(self, dispatch: Dispatch, workers: int, address: str | None) -> None:
        dispatch.finish_pass()
        with self._lock:
            self._idle.append(((workers, address), dispatch))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, dispatch in idle:
            dispatch.close()


def run_distributed(
    spec: PipelineSpec,
    items: Iterable[Any],
    prepare: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]] | Value],
    deliver: Callable[[int, Any, Value], None],
    *,
    workers: int,
    address: str | None = None,
    checkpoint: Checkpoint | None = None,
    batch_size: int = 16,
    per_worker: int | None = None,
    method: str = "run_batch",
    pool: WorkerPool | None = None,
) -> dict[str, Any]:
    """Run ``items`` on ``workers`` Ray worker processes; ``deliver`` each result.

    ``prepare(item)`` gives an input's ``(args, kwargs)``, or a `Value` (an ERROR) to
    deliver without running it.  ``method`` is the `PipelineWorker` method that runs
    a batch: ``"run_batch"`` (the outputs) or ``"train_batch"`` (train-mode outputs
    with the feedback their backward pass collected).  With a ``pool`` the workers
    come from it and go back to it (a run that fails stops its own).  Returns what
    happened (worker restarts, rows).
    """
    if method not in ("run_batch", "train_batch"):
        raise ValueError(f"method must be 'run_batch' or 'train_batch', got {method!r}")
    from plait.ray.cluster import ensure_ray

    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    ray = ensure_ray(address, workers)
    from plait.effects import current_stack, observes_every_call
    from plait.options import inputs_in_flight
    from plait.ray.handlers import distribute

    # Every active handler, rebuilt in each worker (interpreters sit apart from them).
    stack = current_stack()
    parts = distribute(stack)
    spec.handlers = parts.specs
    # A recorder must see every call: finished inputs run through their calls (answered
    # by the checkpoint's logs) instead of being answered with their stored outputs.
    observed = observes_every_call(stack)
    window = inputs_in_flight(spec.options)
    batch_size = max(1, min(batch_size, window))
    per_worker = per_worker or max(2, window // batch_size)
    if pool is None:
        dispatch = Dispatch(ray, spec, workers)
    else:
        dispatch = pool.take(ray, spec, workers, address)
    source: Iterator[tuple[int, Any]] = enumerate(items)
    retry: collections.deque[WorkItem] = collections.deque()
    rerun: set[int] = set()  # indices a dead worker held
    losses: collections.Counter[int] = collections.Counter()  # how often each was lost
    originals: dict[int, Any] = {}
    input_keys: dict[int, str] = {}
    held: dict[Any, tuple[_Worker, list[WorkItem]]] = {}
    delivered = 0
    exhausted = False
    started = time.monotonic()

    def finish(index: int, value: Value) -> None:
        nonlocal delivered
        item = originals.pop(index)
        key = input_keys.pop(index, None)
        if checkpoint is not None and key is not None and value.kind is not ValueKind.ERROR:
            try:
                checkpoint.record_output(index, key, value.payload)
            except (TypeError, ValueError) as exc:
                value.meta["checkpoint"] = "not stored"
                value.meta["checkpoint_error"] = f"{type(exc).__name__}: {exc}"
        delivered += 1
        deliver(index, item, value)

    def next_batch() -> list[WorkItem]:
        nonlocal exhausted
        batch: list[WorkItem] = []
        for item in [item for item in retry if losses[item[0]] < 2][:batch_size]:
            retry.remove(item)
            batch.append(item)
        while not exhausted and len(batch) < batch_size:
            try:
                index, item = next(source)
            except StopIteration:
                exhausted = True
                for worker in dispatch.workers:
                    worker.actor.draining.remote()
                break
            originals[index] = item
            prepared = prepare(item)
            if isinstance(prepared, Value):
                finish(index, prepared)
                continue
            args, kwargs = prepared
            if checkpoint is not None:
                key = input_keys[index] = fingerprint([list(args), kwargs])
                found, payload = checkpoint.finished_output(index, key)
                if found and not observed:
                    from plait.execution.checkpoint import restored_output

                    finish(index, restored_output(index, payload, checkpoint))
                    continue
            batch.append((index, args, kwargs))
        return batch

    def send(worker: _Worker, batch: list[WorkItem], again: bool) -> Any:
        """Hand ``batch`` to ``worker``; None if none of it could go.  Ray pickles a
        batch's inputs together, so an input it cannot pickle would fail the call and
        the run: it becomes its own error row and the others go."""
        if all(is_plain(item) for item in batch):
            try:
                return getattr(worker.actor, method).remote(batch, again)
            except TypeError:
                pass
        sendable = []
        for item in batch:
            problem = _unsendable_input(item)
            if problem is None:
                sendable.append(item)
            else:
                finish(item[0], error_value(problem, module_path=None))
        batch[:] = sendable
        return getattr(worker.actor, method).remote(batch, again) if batch else None

    finished = False
    try:
        while True:
            # An input lost twice with its worker runs alone on an idle worker: the
            # one that keeps killing workers is told apart from those it took along.
            for worker in dispatch.workers:
                suspect = next((item for item in retry if losses[item[0]] >= 2), None)
                if suspect is None:
                    break
                if worker.in_flight == 0:
                    retry.remove(suspect)
                    ref = getattr(worker.actor, method).remote([suspect], True)
                    held[ref] = (worker, [suspect])
                    worker.in_flight, worker.isolated = 1, True  # nothing else on it meanwhile
            # Round robin, a batch at a time: a short run still spreads over every worker.
            while True:
                hungry = [
                    w for w in dispatch.workers if w.in_flight < per_worker and not w.isolated
                ]
                batch = next_batch() if hungry else []
                if not batch:
                    break
                worker = min(hungry, key=lambda w: w.in_flight)
                again = any(item[0] in rerun for item in batch)
                ref = send(worker, batch, again)
                if ref is None:
                    continue
                held[ref] = (worker, batch)
                worker.in_flight += 1
            if not held:
                break
            ready, _ = ray.wait(list(held), num_returns=1)
            for ref in ready:
                worker, batch = held.pop(ref)
                worker.in_flight -= 1
                worker.isolated = False
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    lost = _lost(dispatch, worker, held, retry, batch)
                    rerun.update(lost)
                    losses.update(lost)
                    # An input whose worker died under it MAX_LOSSES times is taken to
                    # be what kills them (a crash in native code, memory): its error row,
                    # not an endless round of new workers.
                    for index in [i for i in lost if losses[i] >= MAX_LOSSES]:
                        for item in list(retry):
                            if item[0] == index:
                                retry.remove(item)
                        died = WorkerDied(
                            f"the worker running input {index} died {MAX_LOSSES} times "
                            f"({type(exc).__name__}); this input is taken to be the cause"
                        )
                        finish(index, error_value(died, module_path=None))
                    continue
                except Exception as exc:  # the batch as a whole failed: each input says why
                    rows = [row_of(i, error_value(exc, module_path=None)) for i, _, _ in batch]
                    result = {"rows": rows, "reports": []}
                for row in result["rows"]:
                    if row[0] in originals:  # exactly once, whatever a lost worker sent
                        finish(row[0], value_of(row))
                parts.collect(worker.name, worker.worker_id, result.get("reports", []))
        finished = True
    finally:
        if pool is not None and finished:
            pool.give_back(dispatch, workers, address)
        else:
            dispatch.close()
    return {
        "restarts": dispatch.restarts,
        "delivered": delivered,
        "seconds": time.monotonic() - started,
    }


def _unsendable_input(item: WorkItem) -> Unsendable | None:
    """Why Ray cannot send this input to a worker, naming the argument, or None."""
    index, args, kwargs = item
    if pickling_problem((args, kwargs)) is None:
        return None
    parts = [(f"argument {n + 1}", value) for n, value in enumerate(args)]
    parts += [(f"argument {name!r}", value) for name, value in kwargs.items()]
    for where, value in parts:
        problem = pickling_problem(value)
        if problem is not None:
            return Unsendable(
                f"input {index} cannot be sent to a Ray worker: its {where} (a "
                f"{type(value).__name__}) cannot travel: {problem}. Pass plain data "
                "(text, numbers, lists, dicts, dataclasses) as inputs, or run without workers"
            )
    return Unsendable(f"input {index} cannot be sent to a Ray worker: it cannot be pickled")


def _lost(
    dispatch: Dispatch,
    worker: _Worker,
    held: dict[Any, tuple[_Worker, list[WorkItem]]],
    retry: collections.deque[WorkItem],
    batch: list[WorkItem],
) -> list[int]:
    """``worker`` died: its batches go to the front of the line, a new worker takes its
    place; returns the indices it held."""
    lost = list(batch)
    for ref, (owner, other) in list(held.items()):
        if owner is worker:
            del held[ref]
            lost += other
    retry.extendleft(reversed(sorted(lost, key=lambda item: item[0])))
    if worker in dispatch.workers:
        dispatch.replace(worker)
    return [item[0] for item in lost]
