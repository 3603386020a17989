"""Ray workers as a backend (`plait.execution.backends`): a batch spread over worker
processes that share the cluster's limits, with the same results, in the same order,
as in one process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from plait.effects import run_scope
from plait.execution.backends import PassLog
from plait.execution.checkpoint import Checkpoint
from plait.execution.runtime import Deliver, counting_rows, run_message, traced_first
from plait.module import llm_aliases
from plait.ray.cluster import import_ray, shutdown_if_started
from plait.ray.runner import WorkerPool, run_distributed
from plait.ray.spec import make_spec
from plait.resources.manager import ResourceManager, say_embedded
from plait.sampling import run_seed
from plait.values import Value, ValueKind

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["RayBackend"]

#: The workers kept for the passes of the `RayBackend.session` this code runs in.
_session_pool: ContextVar[WorkerPool | None] = ContextVar("plait_ray_worker_pool", default=None)


class RayBackend:
    """Runs a batch, or a trainer's passes, on Ray workers (``workers=N`` or
    ``ray_address=...``)."""

    async def run_steps(
        self,
        step: Module,
        examples: list[tuple[Any, Any]],
        opts: dict[str, Any],
        *,
        train: bool,
        call_log: PassLog | None = None,
        feedback: bool = True,
    ) -> list[Value]:
        """The trainer's pass on the workers (`plait.execution.backends.TrainingBackend`):
        the step is pickled now, with the parameter values and mode it has, and runs
        with one seed drawn here from its Rng for the pass, as a batch run draws it.
        The workers always make the backward pass's feedback."""
        seed, _ = run_seed(step, opts.get("seed"))
        opts = {**opts, "seed": seed}
        checkpoint = call_log.checkpoint if call_log is not None else None
        spec = make_spec(step, opts["resources"], opts, checkpoint)
        if call_log is not None:
            work = ("train_batch" if train else "run_batch", examples)
            spec.log_index_offset = call_log.pass_offset(work, step.state_dict(), seed)
        results: dict[int, Value] = {}

        def prepare(example: tuple[Any, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (example[0],), {"target": example[1]}

        def deliver(index: int, example: tuple[Any, Any], value: Value) -> None:
            results[index] = value

        await asyncio.to_thread(
            run_distributed,
            spec,
            examples,
            prepare,
            deliver,
            workers=opts["workers"] or 1,
            address=opts["ray_address"],
            method="train_batch" if train else "run_batch",
            pool=_session_pool.get(),
        )
        return [results[index] for index in range(len(examples))]

    def deliver_rows(
        self,
        module: Module,
        resources: ResourceManager,
        items: Iterable[Any],
        prepare: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]] | Value],
        deliver: Deliver,
        opts: dict[str, Any],
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """Run each item on the workers, calling ``deliver(index, item, value)`` as each
        row arrives (`plait.execution.backends.RowBackend`; blocks the calling thread).
        ``prepare(item)`` gives an input's ``(args, kwargs)``, or the ERROR `Value` to
        deliver without running it; it is called once per item, as the item is taken
        for a worker (a caller counts what is in flight there).  The first input is
        traced here first, so a mistake in the pipeline's code stops the run once,
        before any worker is paid for; its preparation is kept for its worker.  A
        ``deliver`` that raises stops the run, and its exception is raised here.  With
        ``opts["preserve_order"]`` the rows are handed over in input order: a row that
        finished before an earlier one waits here for it (the workers keep running)."""
        ordered = _InputOrder(deliver) if opts.get("preserve_order") else None
        if ordered is not None:
            deliver = ordered
        kept: list[tuple[Any, Any]] = []  # the first item, prepared to be traced

        def prepare_to_trace(item: Any) -> Any:
            prepared = prepare(item)
            kept.append((item, prepared))
            return prepared

        def prepare_once(item: Any) -> Any:
            if kept:  # the runner's first call is the first item, traced already
                first, prepared = kept.pop()
                if first is item:
                    return prepared
            return prepare(item)

        workers = opts["workers"] or 1
        # One run for the handlers that hook runs; the workers' shares of it nest inside
        # (a handler's copy sent to them is made within it, `distribute`).
        msg = run_message(module, backend="ray", workers=workers, seed=opts.get("seed"))
        with run_scope(msg):
            run_distributed(
                make_spec(module, resources, opts, checkpoint),
                traced_first(module, items, prepare_to_trace),
                prepare_once,
                counting_rows(deliver, msg),
                workers=workers,
                address=opts["ray_address"],
                checkpoint=checkpoint,
            )
        if ordered is not None:
            ordered.finish()

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The run's passes share their worker processes (each pass loads its own
        pipeline into them), which are stopped when the session ends; a local Ray
        started for the run is stopped then too, one that was running already (or a
        joined cluster) is left as it was."""
        owned = not import_ray().is_initialized()
        pool = WorkerPool()
        token = _session_pool.set(pool)
        try:
            yield
        finally:
            _session_pool.reset(token)
            try:
                pool.close()
            finally:
                if owned:
                    shutdown_if_started()

    async def run_batch(
        self,
        module: Module,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        """A batch on Ray workers (`plait.ray`): the same results, in the same order."""
        if module.training:
            raise ValueError(
                "a module in train() mode records its graph for backward() in this process; "
                "run training batches without workers (Trainer(workers=N) scores on workers)"
            )
        resources = ResourceManager.coerce(opts["resources"])
        if not resources.config:
            # The workers resolve the aliases, and they leave this notice to the driver.
            aliases = sorted(llm_aliases(module))
            if aliases:
                say_embedded(aliases[0])
        # Drawn here, once: the workers run with this seed, not draws of their own.
        seed, give_back = run_seed(module, opts.get("seed"))
        opts = {**opts, "seed": seed}
        checkpoint = None
        if opts["checkpoint_dir"] is not None:
            try:
                checkpoint = Checkpoint.of_run(
                    opts["checkpoint_dir"], module, resources, seed
                ).open()
            except BaseException:
                give_back()
                raise
        outputs: dict[int, Any] = {}

        def deliver(index: int, item: Any, value: Value) -> None:
            outputs[index] = value if value.kind is ValueKind.ERROR else value.payload

        def prepare(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (item, *extra), kwargs

        try:
            await asyncio.to_thread(
                self.deliver_rows, module, resources, items, prepare, deliver, opts, checkpoint
            )
        except BaseException:
            give_back()
            raise
        finally:
            if checkpoint is not None:
                checkpoint.close()
        return [outputs[i] for i in range(len(outputs))]


class _InputOrder:
    """A ``deliver`` that hands rows on in input order whatever order they come in."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._waiting: dict[int, tuple[Any, Value]] = {}
        self._following = 0

    def __call__(self, index: int, item: Any, value: Value) -> None:
        waiting = self._waiting
        waiting[index] = (item, value)
        while self._following in waiting:
            self._deliver(self._following, *waiting.pop(self._following))
            self._following += 1

    def finish(self) -> None:
        """Refuse to end with rows still held: they wait for a row that never came, and
        would be lost without a word."""
        if self._waiting:
            raise RuntimeError(
                f"the run ended without a row for input {self._following}, so the "
                f"{len(self._waiting)} row(s) after it were held back; this is a bug in "
                "plait's Ray runner, which owes every input one row"
            )
