"""Calling a module for real: single inputs, batches, streams, and the sync veneer."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from plait.execution.batch import BatchResult
from plait.execution.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointHandler,
    producer_of,
    restored_output,
)
from plait.execution.codec import fingerprint
from plait.execution.engine import Engine, as_input_failure, current_engine
from plait.execution.loop import run_blocking
from plait.execution.settings import SETTING_NAMES, resolve_options
from plait.execution.tape import Tape
from plait.handlers.stack import current_stack
from plait.resources.manager import ResourceManager, say_embedded
from plait.sampling import run_seed
from plait.tracing.tracer import TracingError, module_paths, trace
from plait.values import ExecutionError, Value, ValueKind, error_value

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["call_bound", "current_engine", "is_batch", "run", "run_blocking", "stream_bound"]

T = TypeVar("T")


def is_batch(obj: Any) -> bool:
    """A list, or any iterator (a generator, ``iter(...)``, a file's lines), is a batch."""
    return isinstance(obj, list) or (
        isinstance(obj, Iterator) and not isinstance(obj, str | bytes | dict)
    )


_accepts: dict[type, frozenset[str] | None] = {}


def _forward_accepts(cls: type[Module]) -> frozenset[str] | None:
    """Keyword names ``forward`` accepts, or None when it takes ``**kwargs``."""
    if cls in _accepts:
        return _accepts[cls]
    params = inspect.signature(cls.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        _accepts[cls] = None
    else:
        _accepts[cls] = frozenset(p.name for p in params)
    return _accepts[cls]


def split_kwargs(module: Module, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate execution options from the forward's own keyword arguments."""
    if not kwargs:
        return {}, {}
    accepted = _forward_accepts(type(module))
    forward_kwargs, options = {}, {}
    for name, value in kwargs.items():
        if name in SETTING_NAMES and (accepted is None or name not in accepted):
            options[name] = value
        else:
            forward_kwargs[name] = value
    return forward_kwargs, options


def call_bound(
    module: Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    streaming: bool | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """What a module call returns when it must run: an awaitable, or an async iterator."""
    forward_kwargs, call_options = split_kwargs(module, kwargs)
    call_options.update(options or {})
    bound_resources, bound_config = module._binding()
    opts = resolve_options(call_options, bound_config, bound_resources)
    if args and is_batch(args[0]):
        if streaming if streaming is not None else opts["streaming"]:
            _refuse_streaming_on_workers(opts)
            return _stream(module, args[0], args[1:], forward_kwargs, opts)
        if opts["workers"] or opts["ray_address"] is not None:
            return _run_distributed(module, args[0], args[1:], forward_kwargs, opts)
        return _run_batch(module, args[0], args[1:], forward_kwargs, opts)
    return _run_single(module, args, forward_kwargs, opts)


def call_single(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`call_bound` for exactly one input, even one that is a list (a sequence to scan,
    a dataset example whose input is a list): never run as a batch."""
    forward_kwargs, call_options = split_kwargs(module, kwargs)
    bound_resources, bound_config = module._binding()
    opts = resolve_options(call_options, bound_config, bound_resources)
    return _run_single(module, args, forward_kwargs, opts)


def stream_bound(module: Module, inputs: Any, options: dict[str, Any]) -> AsyncIterator[Any]:
    if not is_batch(inputs) and not isinstance(inputs, Iterable):
        raise TypeError(f"stream() takes a list or iterable of inputs, got {type(inputs).__name__}")
    bound_resources, bound_config = module._binding()
    opts = resolve_options(options, bound_config, bound_resources)
    _refuse_streaming_on_workers(opts)
    return _stream(module, iter(inputs), (), {}, opts)


def _refuse_streaming_on_workers(opts: dict[str, Any]) -> None:
    """Streaming runs in this process only: ``workers`` (or an address) is refused,
    never ignored, so a run the caller meant to spread never silently runs here."""
    if opts["workers"] or opts["ray_address"] is not None:
        raise ValueError(
            "streaming a batch on Ray workers is not supported: call run_sync (or "
            "await the module) with workers=..., or stream in one process (without "
            "workers or ray_address)"
        )


async def run(module: Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``module`` on one input (or a batch: a list or iterator) with per-call options.

    Options (``resources``, ``max_concurrent``, ``checkpoint_dir``, ...) rank above
    `bind()` and `ExecutionSettings`; other keyword arguments go to ``forward``.
    """
    result = call_bound(module, args, kwargs, streaming=False)
    return await result


def _every_call_observed() -> bool:
    """A handler (a recorder) must see every call: run finished inputs through their
    calls, which the checkpoint answers, rather than answering with the stored output."""
    return any(getattr(handler, "sees_every_call", False) for handler in current_stack())


# -- the drivers -------------------------------------------------------------------------
class _Run:
    """Per-call state: the engine, optional checkpoint, and how to shape results."""

    def __init__(self, module: Module, opts: dict[str, Any], batch: bool = False) -> None:
        self.module = module
        self.training = module.training
        seed, self.give_back_seed = run_seed(module, opts.get("seed"))
        try:
            self.engine = Engine(
                module,
                ResourceManager.coerce(opts["resources"]),
                opts["max_concurrent"],
                draining=not batch,
                seed=seed,
            )
            self.window = opts["max_inputs_in_flight"] or max(64, 2 * opts["max_concurrent"])
            self.checkpoint: Checkpoint | None = None
            if opts["checkpoint_dir"] is not None:
                pipeline = f"{type(module).__module__}.{type(module).__qualname__}"
                producer = producer_of(module, self.engine.resources, seed)
                self.checkpoint = Checkpoint(opts["checkpoint_dir"], pipeline, producer).open()
        except BaseException:
            self.give_back_seed()
            raise

    def close(self, finished: bool = True) -> None:
        """End the run; one that did not finish gives its `Rng` draw back, so running
        it again (resuming its checkpoint) draws the same seeds."""
        if not finished:
            self.give_back_seed()
        if self.checkpoint is not None:
            self.checkpoint.close()

    async def one(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        key = ""
        if self.checkpoint is not None:
            key = fingerprint([list(args), kwargs])
            found, payload = self.checkpoint.finished_output(index, key)
            if found and not _every_call_observed():
                return restored_output(index, payload)
        try:
            value, graph, results = await self.engine.run_input(index, args, kwargs)
        except BaseException:
            if self.checkpoint is not None:
                self.checkpoint.forget(index)
            raise
        if value.kind is ValueKind.ERROR:
            if self.checkpoint is not None:
                self.checkpoint.forget(index)
        else:
            if self.checkpoint is not None:
                try:
                    self.checkpoint.record_output(index, key, value.payload)
                except (TypeError, ValueError) as exc:
                    # The output exists, it just has no JSON form: deliver it, and say so.
                    # A resume runs this input again; its calls are answered from the
                    # checkpoint, so nothing is paid twice.
                    value.meta["checkpoint"] = "not stored"
                    value.meta["checkpoint_error"] = f"{type(exc).__name__}: {exc}"
            if self.training and graph is not None:
                tape = Tape(graph, results, self.module, index, engine=self.engine)
                value.meta["_tape_ids"] = [tape.id]
                value.meta["_tape"] = tape
        return value

    def shape(self, value: Value) -> Any:
        """What the caller gets: the raw output, or a Value in training mode."""
        if self.training:
            return value
        return value.payload

    async def drive(
        self,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        deliver: Callable[[int, Any, Value], None],
        slots: asyncio.Semaphore,
        release_on_done: bool,
    ) -> None:
        """Feed inputs lazily: a new one is pulled only when a slot of the window frees up."""
        tasks: set[asyncio.Task[None]] = set()
        handler = CheckpointHandler(self.checkpoint) if self.checkpoint is not None else None

        code_error = self.engine.code_error_of

        async def one(index: int, item: Any) -> None:
            try:
                value = await self.one(index, (item, *extra), kwargs)
                code_error()
            except (CheckpointError, TracingError):
                raise  # about the run, not this input: the run stops and says why
            except BaseException as exc:
                # Never lose an input: whatever went wrong is this input's error, unless
                # it is about the run (a real cancellation, Ctrl-C).
                failure = as_input_failure(exc)
                if failure is None:
                    raise
                value = error_value(
                    failure, module_path=f"{type(self.module).__name__} (input {index})"
                )
            finally:
                if release_on_done:
                    slots.release()
            deliver(index, item, value)

        scope = handler.outermost() if handler is not None else contextlib.nullcontext()
        try:
            scope.__enter__()
            for index, item in enumerate(items):
                await slots.acquire()
                task = asyncio.create_task(one(index, item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                # Let the new input trace and send its first requests before the next one
                # is traced: the endpoint starts working at once instead of after the
                # whole window has been traced.
                await asyncio.sleep(0)
                code_error()  # the first input traced failed: no other input starts
            self.engine.start_draining()
            while tasks:
                await asyncio.gather(*list(tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        finally:
            scope.__exit__(None, None, None)


async def _run_single(
    module: Module, args: tuple[Any, ...], kwargs: dict[str, Any], opts: dict[str, Any]
) -> Any:
    state = _Run(module, opts)
    try:
        if state.checkpoint is not None:
            with CheckpointHandler(state.checkpoint).outermost():
                value = await state.one(0, args, kwargs)
        else:
            value = await state.one(0, args, kwargs)
    except BaseException:
        state.close(finished=False)
        raise
    state.close()
    if value.kind is ValueKind.ERROR:
        raise ExecutionError(value)
    return state.shape(value)


async def _run_batch(
    module: Module,
    items: Iterable[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
) -> list[Any]:
    state = _Run(module, opts, batch=True)
    outputs: dict[int, Any] = {}

    def deliver(index: int, item: Any, value: Value) -> None:
        outputs[index] = value if value.kind is ValueKind.ERROR else state.shape(value)

    try:
        await state.drive(items, extra, kwargs, deliver, asyncio.Semaphore(state.window), True)
    except BaseException:
        state.close(finished=False)
        raise
    state.close()
    return [outputs[i] for i in range(len(outputs))]


def traced_first(
    module: Module, items: Iterable[Any], prepare: Callable[[Any], Any]
) -> Iterator[Any]:
    """``items``, once the first has been traced here, before any worker starts.

    A `TracingError` on the first input is a mistake in the pipeline's code: it is
    raised for the whole run, as a batch in one process does (`Engine.code_error`),
    instead of coming back as one error row per input from the workers. Any other
    failure is left to that input's worker, which reports it as its error row.
    """
    iterator = iter(items)
    for first in iterator:
        prepared = prepare(first)
        if isinstance(prepared, tuple):
            args, kwargs = prepared
            try:
                trace(module, args, kwargs, module_paths(module))
            except TracingError:
                raise
            except Exception:  # the input's own failure: its worker reports it as its row
                pass
        return itertools.chain([first], iterator)
    return iter(())


async def _run_distributed(
    module: Module,
    items: Iterable[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
) -> list[Any]:
    """A batch on Ray workers (`plait.ray`): the same results, in the same order."""
    from plait.ray.runner import run_distributed
    from plait.ray.spec import make_spec

    if module.training:
        raise ValueError(
            "a module in train() mode records its graph for backward() in this process; "
            "run training batches without workers (Trainer(workers=N) scores on workers)"
        )
    resources = ResourceManager.coerce(opts["resources"])
    if not resources.config:
        # The workers resolve the aliases, and they leave this notice to the driver.
        aliases = sorted({m.alias for m in module.modules() if m._calls_llm})  # type: ignore[attr-defined]
        if aliases:
            say_embedded(aliases[0])
    # Drawn here, once: the workers run with this seed, not draws of their own.
    seed, give_back = run_seed(module, opts.get("seed"))
    opts = {**opts, "seed": seed}
    checkpoint = None
    if opts["checkpoint_dir"] is not None:
        pipeline = f"{type(module).__module__}.{type(module).__qualname__}"
        try:
            checkpoint = Checkpoint(
                opts["checkpoint_dir"], pipeline, producer_of(module, resources, seed)
            ).open()
        except BaseException:
            give_back()
            raise
    outputs: dict[int, Any] = {}

    def deliver(index: int, item: Any, value: Value) -> None:
        outputs[index] = value if value.kind is ValueKind.ERROR else value.payload

    def prepare(item: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (item, *extra), kwargs

    def drive() -> None:
        run_distributed(
            make_spec(module, resources, opts, checkpoint),
            traced_first(module, items, prepare),
            prepare,
            deliver,
            workers=opts["workers"] or 1,
            address=opts["ray_address"],
            checkpoint=checkpoint,
        )

    try:
        await asyncio.to_thread(drive)
    except BaseException:
        give_back()
        raise
    finally:
        if checkpoint is not None:
            checkpoint.close()
    return [outputs[i] for i in range(len(outputs))]


async def _stream(
    module: Module,
    items: Iterable[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
) -> AsyncIterator[BatchResult]:
    state = _Run(module, opts, batch=True)
    preserve = bool(opts["preserve_order"])
    slots = asyncio.Semaphore(state.window)
    queue: asyncio.Queue[BatchResult | BaseException | None] = asyncio.Queue()

    def deliver(index: int, item: Any, value: Value) -> None:
        if value.kind is ValueKind.ERROR:
            queue.put_nowait(BatchResult(index, item, None, ExecutionError(value)))
        else:
            queue.put_nowait(BatchResult(index, item, state.shape(value), None))

    async def produce() -> None:
        try:
            await state.drive(items, extra, kwargs, deliver, slots, False)
        except BaseException as exc:  # surfaced to the consumer below
            queue.put_nowait(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            queue.put_nowait(None)

    producer = asyncio.create_task(produce())
    pending: dict[int, BatchResult] = {}
    next_index = 0
    finished = False
    try:
        while True:
            item = await queue.get()
            if item is None:
                finished = True
                break
            if isinstance(item, BaseException):
                raise item
            if not preserve:
                slots.release()
                yield item
                continue
            pending[item.index] = item
            while next_index in pending:
                ready = pending.pop(next_index)
                next_index += 1
                slots.release()
                yield ready
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(BaseException):
                await producer
        state.close(finished)
