"""One Ray worker process of a run: the pipeline, its limits leased from the broker.

A `PipelineWorker` is built once per worker process from a `PipelineSpec` (the
module, pickled by value, and the resources by reference: keys are read from the
worker's own environment, never shipped).  It runs the batches of inputs the
driver sends it, all inputs of a batch (and of the batches it holds at once)
concurrently on its event loop, on the same engine, handlers and checkpoint code
as one process: only its endpoints' limits come from the cluster's broker
(`LeasedGovernor`).  Completed calls are logged to the run's checkpoint directory
in a file of the worker's own, so when the process dies the inputs it had not
finished are rerun elsewhere without paying again for the calls it had completed.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from plait.values import Value, ValueKind

__all__ = [
    "PipelineSpec",
    "PipelineWorker",
    "Row",
    "Unsendable",
    "is_plain",
    "pickling_problem",
    "row_of",
    "value_of",
]


@dataclass
class PipelineSpec:
    """What every worker builds: the module and how it runs."""

    module_bytes: bytes
    resources: Any  # a ResourceConfig (or None: the embedded model)
    options: dict[str, Any]
    pipeline: str
    producer: dict[str, Any] | None
    checkpoint_dir: str | None = None
    #: Added to input indexes in the checkpoint's call keys (`CheckpointHandler`).
    log_index_offset: int = 0
    handlers: list[Any] = field(default_factory=list)
    #: The environment variables the resources name (``api_key_env``), as the driver has
    #: them: a worker on a cluster joined with ``ray_address`` does not share the
    #: driver's environment.  Held in memory only (never a runtime_env, log or file).
    secrets: dict[str, Any] = field(default_factory=dict, repr=False)


#: One input's result as it travels back: (index, ok, payload or error meta, meta).
Row = tuple[int, bool, Any, dict[str, Any]]


def row_of(index: int, value: Value) -> Row:
    """A result in a form that survives pickling (an exception may not)."""
    if value.kind is ValueKind.ERROR:
        meta = {
            key: value.meta.get(key)
            for key in ("error_type", "message", "traceback", "module_path")
        }
        if not meta["error_type"]:
            meta["error_type"] = type(value.payload).__name__
        if meta["message"] is None:
            meta["message"] = str(value.payload)
        return (index, False, None, meta)
    keep = {k: v for k, v in value.meta.items() if k in ("checkpoint",)}
    return (index, True, value.payload, keep)


class Unsendable(TypeError):
    """A value that cannot travel between the driver and a worker: it cannot be pickled.

    It fails the one input it belongs to (its error row); the rest of its batch, and
    of the run, are delivered.
    """


_PLAIN_LEAVES = (str, int, float, bool, bytes, type(None))


def is_plain(value: Any) -> bool:
    """Whether ``value`` is JSON-like data (text, numbers, lists, tuples, dicts of them),
    which pickles and unpickles anywhere: such values need no trial round trip."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_LEAVES:
            continue
        if kind is list or kind is tuple:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            return False
    return True


def pickling_problem(value: Any) -> str | None:
    """Why ``value`` cannot be sent to or from a Ray worker, or None if it can.

    Sent means pickled here *and* rebuilt on the other side: an exception whose
    ``__init__`` takes other arguments than its ``args`` pickles but cannot be rebuilt,
    and would fail every row travelling with it.  So anything but plain data is tried
    both ways; plain data (the common case) costs only a walk over it.
    """
    if is_plain(value):
        return None
    from ray import cloudpickle

    try:
        data = cloudpickle.dumps(value)
    except Exception as exc:
        return f"pickling it failed ({type(exc).__name__}: {exc})"
    try:
        cloudpickle.loads(data)
    except Exception as exc:
        return f"it pickles but cannot be rebuilt from its pickle ({type(exc).__name__}: {exc})"
    return None


def sendable_rows(rows: list[Row], pipeline: str) -> list[Row]:
    """``rows``, with each one Ray could not send replaced by its input's error row.

    Ray pickles a batch's rows together, and the driver unpickles them together, so
    one output that fails either way (a lock, a connection, an exception that cannot
    be rebuilt) would fail the whole batch, again on every rerun.
    """
    from plait.values import error_value

    checked = []
    for row in rows:
        problem = pickling_problem(row)
        if problem is not None:
            index, payload = row[0], row[2]
            error = Unsendable(
                f"the output of input {index} (a {type(payload).__name__}) cannot be sent "
                f"back from its Ray worker: {problem}. Return plain data from forward "
                "(text, numbers, lists, dicts, dataclasses), not live objects such as "
                "locks, connections, open files or exceptions"
            )
            row = row_of(index, error_value(error, module_path=f"{pipeline} (input {index})"))
        checked.append(row)
    return checked


class RemoteError(Exception):
    """A failure inside a worker, as it reached the driver: its type, message, trace."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


def value_of(row: Row) -> Value:
    """The driver's `Value` for a row (an ERROR value keeps type, message, traceback)."""
    from plait.values import kind_of

    _, ok, payload, meta = row
    if ok:
        return Value(kind_of(payload), payload, meta=dict(meta))
    error = RemoteError(meta["error_type"], meta["message"])
    return Value(ValueKind.ERROR, error, meta=dict(meta))


class PipelineWorker:
    """Runs batches of a pipeline in one Ray worker process (made an actor by the driver)."""

    def __init__(self, spec: PipelineSpec, name: str) -> None:
        from plait.ray.cluster import broker
        from plait.ray.governor import LeasedGovernor
        from plait.resources.manager import use_governors

        self.name = name
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}:{uuid.uuid4().hex[:6]}"
        self.broker = broker()
        worker_id, limits = self.worker_id, self.broker

        def governor(config: Any) -> Any:
            return LeasedGovernor(config, limits, worker_id)

        use_governors(governor)
        from plait.ray.breakers import SharedBreaker
        from plait.resources.routing import use_breakers

        use_breakers(lambda config: SharedBreaker(config, limits))
        self._state: Any = None
        self.load(spec)

    def load(self, spec: PipelineSpec) -> None:
        """Build the pipeline, its resources and handlers from ``spec``: at the start,
        and again for each pass a `WorkerPool` hands this worker (the run before is
        closed first, so its call log is complete)."""
        from ray import cloudpickle

        from plait._secrets import register
        from plait.resources.manager import ResourceManager

        self.close()
        for name, value in spec.secrets.items():
            os.environ[name] = value.get_secret_value()
            register(value.get_secret_value())
        self.spec = spec
        self.module = cloudpickle.loads(spec.module_bytes)
        self.resources = ResourceManager.coerce(spec.resources)
        self.handlers = [h.build(self) for h in spec.handlers]
        self._run_state()  # the checkpoint opens now: a bad one fails the start, not a batch

    def _run_state(self) -> Any:
        if self._state is None:
            from plait.execution.checkpoint import Checkpoint
            from plait.execution.runtime import Run

            opts = dict(self.spec.options, resources=self.resources, checkpoint_dir=None)
            state = Run(self.module, opts, batch=True)
            if self.spec.checkpoint_dir is not None:
                state.checkpoint = Checkpoint(
                    self.spec.checkpoint_dir, self.spec.pipeline, self.spec.producer
                ).open_for_worker(self.name)
            self._state = state
        return self._state

    def ready(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "pid": os.getpid(), "python": sys.version}

    async def run_batch(
        self, items: list[tuple[int, tuple[Any, ...], dict[str, Any]]], rerun: bool = False
    ) -> Any:
        """Run ``items`` (index, args, kwargs) concurrently; one `Row` per item.

        ``rerun``: some were a dead worker's; read the calls it logged before it died.
        """
        state = self._run_state()

        async def one(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Row:
            return row_of(index, await state.one(index, args, kwargs))

        return await self._batch(items, rerun, one)

    async def train_batch(
        self, items: list[tuple[int, tuple[Any, ...], dict[str, Any]]], rerun: bool = False
    ) -> Any:
        """Run ``items`` in ``train()`` mode and each one's backward pass; one `Row` per item.

        The pipeline must have been sent in ``train()`` mode (a `TrainingStep`, say).
        A row's payload is the plain data `plait.learning.passes.train_row` makes, as in
        one process: the loss's output, the feedback each parameter received (named by
        the pipeline's ``state_dict()`` names, which the driver gives to its own
        parameters) and the run's trace, so the driver never reruns an example it
        already paid for here.  An input whose forward or backward failed is its error
        row.
        """
        from plait.learning.passes import parameter_names, train_row

        state = self._run_state()
        if not state.training:
            raise RuntimeError(
                "train_batch needs the pipeline sent in train() mode: call .train() on it "
                "before make_spec"
            )
        names = parameter_names(self.module)

        async def one(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Row:
            value = await train_row(self.module, lambda: state.one(index, args, kwargs), names)
            if value.kind is ValueKind.ERROR:
                return row_of(index, value)
            return (index, True, value.payload, {})

        return await self._batch(items, rerun, one)

    async def _batch(
        self,
        items: list[tuple[int, tuple[Any, ...], dict[str, Any]]],
        rerun: bool,
        run: Callable[[int, tuple[Any, ...], dict[str, Any]], Awaitable[Row]],
    ) -> Any:
        """``run`` each item concurrently inside the run's handlers; rows and reports."""
        import contextlib

        from plait.effects import run_scope
        from plait.execution.checkpoint import CheckpointHandler
        from plait.execution.runtime import run_message
        from plait.values import error_value

        state = self._run_state()
        if rerun and state.checkpoint is not None:
            state.checkpoint.refresh()

        async def one(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Row:
            try:
                return await run(index, args, kwargs)
            except BaseException as exc:  # never lose an input: it becomes its error row
                from plait.execution.engine import as_input_failure

                failure = as_input_failure(exc)
                if failure is None:
                    raise
                where = f"{type(self.module).__name__} (input {index})"
                value = error_value(failure, module_path=where)
            return row_of(index, value)

        with contextlib.ExitStack() as stack:
            for handler in self.handlers:
                stack.enter_context(handler.scope())
            if state.checkpoint is not None:
                handler = CheckpointHandler(state.checkpoint, self.spec.log_index_offset)
                stack.enter_context(handler.outermost())
            share = run_message(self.module, backend="ray worker", worker=self.name)
            with run_scope(share):
                rows = await asyncio.gather(*(one(i, a, k) for i, a, k in items))
                share.meta["inputs"] = len(rows)
                share.meta["failed"] = sum(1 for row in rows if not row[1])
        rows = sendable_rows(rows, type(self.module).__name__)
        for part in self.handlers:
            back = getattr(part.handler, "give_back", None)
            if back is not None:
                pending = back()
                if pending is not None:
                    await pending
        return {"rows": rows, "reports": [h.report() for h in self.handlers]}

    def draining(self) -> None:
        """The driver has no inputs left to hand out: serve the tallest chains first."""
        if self._state is not None:
            self._state.engine.start_draining()

    def lease_stats(self) -> dict[str, Any]:
        from plait.ray.governor import LeasedGovernor
        from plait.resources import manager

        governors = [g for g in manager._governors.values() if isinstance(g, LeasedGovernor)]
        return {
            "syncs": sum(g.syncs for g in governors),
            "sync_seconds": sum(g.sync_seconds for g in governors),
        }

    def close(self) -> None:
        """End the run; its call log, which this worker opened, is closed with it."""
        if self._state is not None:
            state, self._state = self._state, None
            state.close()
            if state.checkpoint is not None:
                state.checkpoint.close()
