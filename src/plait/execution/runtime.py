"""Calling a module for real: single inputs, batches, streams, and the sync veneer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from plait._signature import forward_shape
from plait.effects import (
    Message,
    Runtime,
    call_eagerly,
    current_stack,
    observes_every_call,
    run_scope,
)
from plait.execution.backends import backend
from plait.execution.batch import BatchResult
from plait.execution.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointHandler,
    restored_output,
)
from plait.execution.codec import fingerprint
from plait.execution.engine import Engine, as_input_failure
from plait.execution.loop import run_blocking
from plait.execution.settings import SETTING_NAMES, get_execution_settings, resolve_options
from plait.execution.tape import Tape
from plait.options import inputs_in_flight
from plait.resources.manager import ResourceManager
from plait.sampling import run_seed
from plait.tracing.tracer import TracingError, module_paths, trace
from plait.values import ExecutionError, Value, ValueKind, error_value

if TYPE_CHECKING:
    from plait.module import Module

__all__ = [
    "ExecutionRuntime",
    "LocalBackend",
    "Prepared",
    "Run",
    "backend_name",
    "count_row",
    "counting_rows",
    "is_batch",
    "needs_runtime",
    "run",
    "run_blocking",
    "run_message",
    "shaped",
    "start_run",
    "stream_bound",
]

T = TypeVar("T")

#: What a driver's ``prepare(item)`` gives: the input's ``(args, kwargs)``, or the
#: ERROR `Value` that is its row without running it.
Prepared = tuple[tuple[Any, ...], dict[str, Any]] | Value

#: What a driver hands each row to: ``deliver(index, item, value)``.
Deliver = Callable[[int, Any, Value], None]


class ExecutionRuntime(Runtime):
    """plait's runtime as the core sees it (`plait.effects.Runtime`): the meaning of a
    module call made from plain code, and the entry points ``run_sync``/``stream``.

    ``backward`` is the backward pass (`plait.learning.backward.backward`), which the
    composition root hands over so that this layer never imports the one above it.
    """

    def __init__(self, backward: Callable[[Any, Any], Awaitable[None]]) -> None:
        self._backward = backward

    def call_module(self, msg: Message) -> Any:
        module = msg.module
        if needs_runtime(module):
            return start_run(module, msg.args, msg.kwargs)
        return call_eagerly(msg)

    def run_sync(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return run_blocking(start_run(module, args, kwargs, streaming=False))

    def stream(self, module: Any, inputs: Any, options: dict[str, Any]) -> AsyncIterator[Any]:
        return stream_bound(module, inputs, options)

    async def backward(self, value: Any, feedback: Any) -> None:
        await self._backward(value, feedback)


def needs_runtime(module: Module) -> bool:
    """Whether a call of ``module`` from plain code starts a run: it has resources (bound
    or from an `ExecutionSettings`), or LLM calls or an ``async def forward`` in its tree."""
    resources, config = module._binding()
    if resources is not None or config:
        return True
    settings = get_execution_settings()
    if settings is not None and settings.resources is not None:
        return True
    return any(m._calls_llm or m._has_async_forward() for m in module.modules())


def is_batch(obj: Any) -> bool:
    """A list, or any iterator (a generator, ``iter(...)``, a file's lines), is a batch."""
    return isinstance(obj, list) or (
        isinstance(obj, Iterator) and not isinstance(obj, str | bytes | dict)
    )


def split_kwargs(module: Module, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate execution options from the forward's own keyword arguments."""
    if not kwargs:
        return {}, {}
    accepted = forward_shape(type(module)).keywords
    forward_kwargs, options = {}, {}
    for name, value in kwargs.items():
        if name in SETTING_NAMES and (accepted is None or name not in accepted):
            options[name] = value
        else:
            forward_kwargs[name] = value
    return forward_kwargs, options


def start_run(
    module: Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    streaming: bool | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Start a run of ``module``: what a call returns when it must run, an awaitable (of
    one output, or of a batch's) or an async iterator when streaming."""
    forward_kwargs, call_options = split_kwargs(module, kwargs)
    call_options.update(options or {})
    bound_resources, bound_config = module._binding()
    opts = resolve_options(call_options, bound_config, bound_resources)
    if args and is_batch(args[0]):
        if streaming if streaming is not None else opts["streaming"]:
            _refuse_streaming_on_workers(opts)
            return _stream(module, args[0], args[1:], forward_kwargs, opts)
        where = backend(backend_name(opts))
        return where.run_batch(module, args[0], args[1:], forward_kwargs, opts)
    return _run_single(module, args, forward_kwargs, opts)


def call_single(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`start_run` for exactly one input, even one that is a list (a sequence to scan,
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


def backend_name(opts: dict[str, Any]) -> str:
    """The backend a batch with these options runs on: the one named by ``backend``,
    else Ray when ``workers`` or ``ray_address`` is set, else this process.  Options
    that contradict each other are refused, never resolved silently."""
    on_ray = bool(opts["workers"]) or opts["ray_address"] is not None
    named = opts.get("backend")
    if named is None:
        return "ray" if on_ray else "local"
    if named == "local" and on_ray:
        raise ValueError(
            "backend='local' runs the batch in this process, but workers= or ray_address= "
            "asks for Ray workers: drop one of them (backend='ray' is what workers= means)"
        )
    return str(named)


def _refuse_streaming_on_workers(opts: dict[str, Any]) -> None:
    """Streaming runs in this process only: ``workers`` (or an address, or another
    backend) is refused, never ignored, so a run the caller meant to spread never
    silently runs here."""
    if opts.get("backend") not in (None, "local"):
        raise ValueError(
            f"streaming runs in this process; backend={opts['backend']!r} cannot stream: "
            "call run_sync (or await the module) to run the batch there"
        )
    if opts["workers"] or opts["ray_address"] is not None:
        raise ValueError(
            "streaming a batch on Ray workers is not supported: call run_sync (or "
            "await the module) with workers=..., or stream in one process (without "
            "workers or ray_address)"
        )


async def run(module: Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``module`` on one input (or a batch: a list or iterator) with per-call options.

    ``await plait.run(module, x, seed=7)`` is ``await module(x, seed=7)`` spelled as
    a function: for code that holds a module and options apart.

    Args:
        module: The module to run.
        *args: The input, or a batch of inputs (a list or any iterator).
        **kwargs: Keyword inputs of ``forward``, and run options (``resources``,
            ``max_concurrent``, ``checkpoint_dir``, ``seed``...), which rank above
            `Module.bind` and `ExecutionSettings`.

    Returns:
        The output; for a batch, a list of outputs in input order, where an input
        that failed is a `Value` of kind ERROR.

    Raises:
        ExecutionError: When the single input's pipeline failed.
        TracingError: When ``forward`` uses an output in a way plait cannot record.

    Examples:
        ```python
        import asyncio

        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.")


        async def main() -> None:
            print(await plait.run(summarize, "One text.", resources=resources))
            print(await summarize(["Two.", "Texts."], resources=resources))


        asyncio.run(main())
        ```
    """
    result = start_run(module, args, kwargs, streaming=False)
    return await result


# -- the drivers -------------------------------------------------------------------------
class Run:
    """One run of a module (a single input, a batch, a stream): its engine, its
    checkpoint if any, the window of inputs in flight, and how results are shaped.

    The CLI (``plait run``) and a Ray worker drive their batches through a `Run` too,
    so every place a pipeline runs resumes, seeds and reports the same way.
    """

    def __init__(
        self,
        module: Module,
        opts: dict[str, Any],
        batch: bool = False,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """``checkpoint``: one the caller opened (and vetted) and closes itself, as
        ``plait run`` does; without it the run opens ``opts["checkpoint_dir"]``'s."""
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
            self.window = inputs_in_flight(opts)
            self.checkpoint: Checkpoint | None = checkpoint
            self._owns_checkpoint = False
            if checkpoint is None and opts["checkpoint_dir"] is not None:
                self.checkpoint = Checkpoint.of_run(
                    opts["checkpoint_dir"], module, self.engine.resources, seed
                ).open()
                self._owns_checkpoint = True
        except BaseException:
            self.give_back_seed()
            raise

    def close(self, finished: bool = True) -> None:
        """End the run; one that did not finish gives its `Rng` draw back, so running
        it again (resuming its checkpoint) draws the same seeds."""
        if not finished:
            self.give_back_seed()
        if self.checkpoint is not None and self._owns_checkpoint:
            self.checkpoint.close()

    async def one(
        self,
        index: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        order: int | None = None,
    ) -> Value:
        """Input ``index``'s row; ``order``: where it queues among every input this
        run's engine runs (`Engine.run_input`), when several batches share it."""
        key = ""
        if self.checkpoint is not None:
            key = fingerprint([list(args), kwargs])
            found, payload = self.checkpoint.finished_output(index, key)
            if found and not observes_every_call(current_stack()):
                return restored_output(index, payload, self.checkpoint)
        try:
            value, graph, results = await self.engine.run_input(index, args, kwargs, order)
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
        """What this run's caller gets for ``value`` (`shaped`)."""
        return shaped(value, self.training)

    def message(self, **meta: Any) -> Message:
        """This run's ``"run"`` message (`plait.effects.run_scope`), which the handlers
        that hook runs see as it starts and ends."""
        return run_message(self.module, seed=self.engine.seed, **meta)

    async def drive(
        self,
        items: Iterable[Any],
        prepare: Callable[[Any], Prepared],
        deliver: Deliver,
        slots: asyncio.Semaphore | None = None,
        in_order: bool = False,
    ) -> None:
        """`_drive`, as one run (`plait.effects.run_scope`) for the handlers."""
        msg = self.message(backend="local")
        with run_scope(msg):
            await self._drive(items, prepare, counting_rows(deliver, msg), slots, in_order)

    async def _drive(
        self,
        items: Iterable[Any],
        prepare: Callable[[Any], Prepared],
        deliver: Deliver,
        slots: asyncio.Semaphore | None,
        in_order: bool,
    ) -> None:
        """Run every item, calling ``deliver(index, item, value)`` with its row.

        Inputs are fed lazily: the next item is pulled, and ``prepare(item)`` called
        (its ``(args, kwargs)``, or an ERROR `Value` to deliver as it is), only when a
        slot of the window frees up.  ``in_order`` delivers the rows in input order, a
        finished row waiting for the ones before it.  Without ``slots`` a slot frees as
        its row is delivered, so rows waiting for their turn count against the window
        and what is buffered stays bounded; with ``slots`` (a stream's) the caller
        frees one per row it has taken.

        A problem with the run rather than an input (the checkpoint refusing an input,
        the first trace failing: the pipeline's code is wrong, ``deliver`` raising: the
        row has nowhere to go) stops it at once: the inputs in flight are cancelled and
        that exception is raised here.
        """
        own_slots = slots is None
        window = asyncio.Semaphore(self.window) if slots is None else slots
        tasks: set[asyncio.Task[None]] = set()
        handler = CheckpointHandler(self.checkpoint) if self.checkpoint is not None else None
        code_error = self.engine.code_error_of
        driver = asyncio.current_task()
        assert driver is not None  # a coroutine of a running loop
        stopped: list[Exception] = []  # why the run stopped, from an input's task
        unwinding = False
        waiting: dict[int, tuple[Any, Value]] = {}  # in order: rows before theirs are due
        due = 0

        def stop(exc: Exception) -> None:
            """Stop the run from an input's task: wake the driver with a cancellation
            it turns into ``exc``."""
            if not stopped and not unwinding:
                stopped.append(exc)
                driver.cancel()

        def hand_over(index: int, item: Any, value: Value) -> None:
            nonlocal due
            if not in_order:
                deliver(index, item, value)
                if own_slots:
                    window.release()
                return
            waiting[index] = (item, value)
            while due in waiting:
                item, value = waiting.pop(due)
                deliver(due, item, value)
                due += 1
                if own_slots:
                    window.release()

        async def one(index: int, item: Any, prepared: Prepared) -> None:
            if isinstance(prepared, Value):
                value = prepared  # refused before running (an unreadable input): its row
            else:
                args, kwargs = prepared
                try:
                    value = await self.one(index, args, kwargs)
                    code_error()
                except (CheckpointError, TracingError) as exc:
                    stop(exc)  # about the run, not this input: the run stops and says why
                    return
                except BaseException as exc:
                    # Never lose an input: whatever went wrong is this input's error,
                    # unless it is about the run (a real cancellation, Ctrl-C).
                    failure = as_input_failure(exc)
                    if failure is None:
                        raise
                    value = error_value(
                        failure, module_path=f"{type(self.module).__name__} (input {index})"
                    )
            try:
                hand_over(index, item, value)
            except Exception as exc:  # the row could not be delivered (written)
                stop(exc)

        scope = handler.outermost() if handler is not None else contextlib.nullcontext()
        try:
            scope.__enter__()
            for index, item in enumerate(items):
                await window.acquire()
                task = asyncio.create_task(one(index, item, prepare(item)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                # Let the new input trace and send its first requests before the next one
                # is traced: the endpoint starts working at once instead of after the
                # whole window has been traced.
                await asyncio.sleep(0)
                code_error()  # the first input traced failed: no other input starts
            self.engine.start_draining()
            # Every input's task exists now: wait for them all, once. Not "until the set
            # is empty": it empties through the tasks' done callbacks, and from Python
            # 3.12 on, gather over tasks that are all done returns without yielding to
            # the loop, so those callbacks never ran and the loop spun for ever.
            await asyncio.gather(*tasks)
        except BaseException as exc:
            unwinding = True
            for task in tasks:
                task.cancel()
            if tasks:  # let them unwind (and forget their checkpoint entries) first
                await asyncio.wait(list(tasks))
            if stopped and isinstance(exc, asyncio.CancelledError):
                driver.uncancel()  # the cancellation was ours, to stop the run
                raise stopped[0] from None
            raise
        finally:
            scope.__exit__(None, None, None)


async def _run_single(
    module: Module, args: tuple[Any, ...], kwargs: dict[str, Any], opts: dict[str, Any]
) -> Any:
    state = Run(module, opts)
    try:
        with run_scope(state.message(backend="local")) as msg:
            if state.checkpoint is not None:
                with CheckpointHandler(state.checkpoint).outermost():
                    value = await state.one(0, args, kwargs)
            else:
                value = await state.one(0, args, kwargs)
            count_row(msg, value.kind is ValueKind.ERROR)
    except BaseException:
        state.close(finished=False)
        raise
    state.close()
    if value.kind is ValueKind.ERROR:
        raise ExecutionError(value)
    return state.shape(value)


def run_message(module: Module, **meta: Any) -> Message:
    """The ``"run"`` message of a run of ``module`` (`plait.effects.run_scope`);
    ``meta`` says how it runs (``backend``, ``seed``, ``workers``, ...)."""
    return Message(type="run", name=type(module).__name__, module=module, meta=meta)


def count_row(msg: Message, failed: bool) -> None:
    """Count one row delivered by the run ``msg`` (its ``meta["inputs"]``, and
    ``meta["failed"]`` for an ERROR row), which the handlers see as it ends."""
    msg.meta["inputs"] = msg.meta.get("inputs", 0) + 1
    if failed:
        msg.meta["failed"] = msg.meta.get("failed", 0) + 1


def counting_rows(deliver: Deliver, msg: Message) -> Deliver:
    """``deliver``, counting each row on the run ``msg`` (`count_row`) first."""

    def counted(index: int, item: Any, value: Value) -> None:
        count_row(msg, value.kind is ValueKind.ERROR)
        deliver(index, item, value)

    return counted


class LocalBackend:
    """This process's event loop as a backend (`plait.execution.backends`): inputs are
    admitted as a window of them finishes, under the run's limits and handlers.

    A batch (`run_batch`) and rows handed over as they arrive (`deliver_rows`, what
    ``plait run`` writes) are one driver, `Run.drive`: the list is the rows collected.
    """

    async def run_batch(
        self,
        module: Module,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        training = module.training  # as the run starts
        outputs: dict[int, Any] = {}

        def prepare(item: Any) -> Prepared:
            return (item, *extra), kwargs

        def deliver(index: int, item: Any, value: Value) -> None:
            outputs[index] = value if value.kind is ValueKind.ERROR else shaped(value, training)

        # The list is in input order whatever the rows' order: waiting for a slow first
        # row would only hold the window back.
        await self.rows(
            module, opts["resources"], items, prepare, deliver, {**opts, "preserve_order": False}
        )
        return [outputs[i] for i in range(len(outputs))]

    def deliver_rows(
        self,
        module: Module,
        resources: Any,
        items: Iterable[Any],
        prepare: Callable[[Any], Prepared],
        deliver: Deliver,
        opts: dict[str, Any],
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """Run each item on this process's event loop, calling ``deliver(index, item,
        value)`` as its row arrives (`plait.execution.backends.RowBackend`; blocks the
        calling thread).  See `rows`."""
        run_blocking(self.rows(module, resources, items, prepare, deliver, opts, checkpoint))

    async def rows(
        self,
        module: Module,
        resources: Any,
        items: Iterable[Any],
        prepare: Callable[[Any], Prepared],
        deliver: Deliver,
        opts: dict[str, Any],
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """`deliver_rows` on the running loop.

        ``prepare(item)`` is called as the item is admitted to the window; an ERROR
        `Value` it gives is that item's row as it is.  ``checkpoint`` is one the caller
        opened and closes (else ``opts["checkpoint_dir"]``'s is opened and closed here).
        With ``opts["preserve_order"]`` rows are delivered in input order and a slot of
        the window frees only as its row is delivered, so the rows waiting for an
        earlier one stay within the window.  A ``deliver`` that raises stops the run at
        once, and its exception is raised here.
        """
        state = Run(module, {**opts, "resources": resources}, batch=True, checkpoint=checkpoint)
        finished = False
        try:
            await state.drive(items, prepare, deliver, in_order=bool(opts["preserve_order"]))
            finished = True
        finally:
            state.close(finished)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Nothing to keep alive: the runtime loop outlives every run of the process."""
        yield


def shaped(value: Value, training: bool) -> Any:
    """What the caller of a run gets for an input's ``value``: the raw output, or the
    `Value` itself for a module in ``train()`` mode."""
    return value if training else value.payload


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


async def _stream(
    module: Module,
    items: Iterable[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
) -> AsyncIterator[BatchResult]:
    state = Run(module, opts, batch=True)
    # A slot frees once the consumer has taken its row: a slow consumer holds the
    # window back instead of letting finished rows pile up in the queue.
    slots = asyncio.Semaphore(state.window)
    queue: asyncio.Queue[BatchResult | BaseException | None] = asyncio.Queue()

    def prepare(item: Any) -> Prepared:
        return (item, *extra), kwargs

    def deliver(index: int, item: Any, value: Value) -> None:
        if value.kind is ValueKind.ERROR:
            queue.put_nowait(BatchResult(index, item, None, ExecutionError(value)))
        else:
            queue.put_nowait(BatchResult(index, item, state.shape(value), None))

    async def produce() -> None:
        try:
            await state.drive(items, prepare, deliver, slots, in_order=bool(opts["preserve_order"]))
        except BaseException as exc:  # surfaced to the consumer below
            queue.put_nowait(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            queue.put_nowait(None)

    producer = asyncio.create_task(produce())
    finished = False
    try:
        while True:
            item = await queue.get()
            if item is None:
                finished = True
                break
            if isinstance(item, BaseException):
                raise item
            slots.release()
            yield item
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(BaseException):
                await producer
        state.close(finished)
