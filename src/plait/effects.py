"""The one mechanism every call passes through (seed 004): messages, handlers,
interpreters, and the `Runtime` the core hands its calls to.

A call builds a `Message` and hands it to the innermost *interpreter*, which decides
what the call means where it is made:

* `Runtime` (installed by ``plait/__init__.py``, the composition root) for a call
  made from plain code: it runs ``forward`` on the spot, or starts a run when the
  module needs one (resources bound, an `ExecutionSettings`, LLM calls in its tree);
* the tracer (`plait.tracing.tracer.Tracer`) while a ``forward`` is being recorded:
  the call becomes a node of the graph;
* the engine's node scope (`plait.execution.engine.NodeScope`) inside an ``async def
  forward`` that a run is executing: the call runs as part of that run.

Interpreters are entered like handlers (seed 004: tracing is a handler) but sit in a
slot of their own beside the handler stack, where `interpret` finds the innermost
one: whatever the order of ``with`` blocks, the handlers see a call before the
interpreter gives it its meaning.  The handlers (`Handler`) see each message that
runs in `apply_stack`: ``process`` from the innermost ``with`` block outwards, the
default action (``msg.fn``) unless one of them marked the message ``done``, then
``postprocess`` from the outermost inwards.

A handler entered while the innermost interpreter records calls instead of running
them (the tracer, inside a ``forward``) is told to it (`Interpreter.entering`): the
tracer records the block on each call made inside it, and the engine enters the
handler again around each of those calls when it runs them.

A handler opts into message types by method, as Pyro's ``_pyro_<type>``:
``process_llm``/``postprocess_llm`` for LLM requests, ``process_module``/
``postprocess_module`` for module calls (composite ones included).  The plain
``process``/``postprocess`` hooks see every message.  A handler that defines no hook
for a type is skipped for messages of that type at no cost.

A run (a batch, a stream, one input, a Ray worker's share of a run) is itself a
``"run"`` message, sent by the runtime through `run_scope` when it starts and again
when it ends: a handler that exports traces (`plait.handlers.telemetry`) roots each
run's tree there, and finds the run a call belongs to with `current_run`.  A run is
not a call, so only the hooks named for it (``process_run``/``postprocess_run``, plain
methods) see it; the plain ``process``/``postprocess`` hooks never do.

This module imports nothing else from plait but the utility layer: it is the bottom
of the core, and everything above builds on it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Self, TypeVar

from plait._entries import leave

__all__ = [
    "Handler",
    "Interpreter",
    "Message",
    "Runtime",
    "apply_stack",
    "apply_stack_sync",
    "call_eagerly",
    "current_interpreter",
    "current_run",
    "current_stack",
    "find_interpreter",
    "install_runtime",
    "interpret",
    "observes_every_call",
    "postprocess_stack",
    "process_stack",
    "run_scope",
    "runtime",
]

P = ParamSpec("P")
R = TypeVar("R")
I = TypeVar("I", bound="Interpreter")  # noqa: E741

_STACK: ContextVar[tuple[Handler, ...]] = ContextVar("plait_handler_stack", default=())
#: The interpreters entered, innermost last: a slot of their own beside the handlers.
_INTERPRETERS: ContextVar[tuple[Interpreter, ...]] = ContextVar("plait_interpreters", default=())
#: The ``"run"`` message of the run the current code belongs to (`run_scope`).
_RUN: ContextVar[Message | None] = ContextVar("plait_run", default=None)
#: Message types that are not calls: only hooks named for them see them.
_NOT_CALLS = frozenset({"run"})
#: Guards each handler's count of open blocks (threads may enter one handler at once).
_entered_lock = threading.Lock()


@dataclass(slots=True, eq=False)
class Message:
    """One effect: a module call (``type="module"``) or an LLM request (``"llm"``).

    ``fn`` is the default action, called with ``args``/``kwargs`` when no handler
    marked the message ``done``; its result lands in ``value``.  ``name`` is the
    module path.  ``node_id`` and ``input_index`` locate a message in its run's batch,
    which is what checkpoints and profilers key on.  If the default action raises,
    the exception is kept in ``error`` and every ``postprocess`` still runs (a handler
    may recover by clearing ``error`` and setting ``value``); it is raised after the
    last one.
    """

    type: str
    name: str
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    done: bool = False
    stop: bool = False
    module: Any = None
    node_id: str | None = None
    input_index: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None


# -- handlers ---------------------------------------------------------------------------
Hook = Callable[[Any, Message], Any]

#: (handler class, message type) -> (process hook, postprocess hook), unbound.
_hooks: dict[tuple[type, str], tuple[Hook | None, Hook | None]] = {}


class Handler:
    """Base class of effect handlers.

    Define ``process_<type>`` (runs before the default action, innermost handler
    first) and/or ``postprocess_<type>`` (after it, outermost handler last) for the
    message types you act on (``llm``, ``module``), or the plain ``process``/
    ``postprocess`` to see every message.  Hooks may be ``async def`` for messages
    handled by the async `apply_stack`; plain module calls made outside any run go
    through `apply_stack_sync` and need plain methods.  A handler is used as a context
    manager (``with h:``) or as a decorator, and one instance may be entered by several
    tasks or threads at once: each block is an entry of its own context's stack, not
    state of the handler.
    """

    #: A handler that must see every call of a run (a recorder) sets this: a resumed run
    #: then replays finished inputs through their calls (answered by the checkpoint)
    #: instead of answering them with their stored outputs.
    sees_every_call: bool = False

    def process(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg`` before the call; set ``msg.done`` to skip it."""
        return None

    def postprocess(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg.value`` after the call."""
        return None

    @classmethod
    def hooks_for(cls, kind: str) -> tuple[Hook | None, Hook | None]:
        """The ``(process, postprocess)`` functions this class runs for messages of
        type ``kind``: the type's own hooks, else the plain ones it overrides, else None."""
        key = (cls, kind)
        found = _hooks.get(key)
        if found is None:
            found = _hooks[key] = (_hook(cls, "process", kind), _hook(cls, "postprocess", kind))
        return found

    @classmethod
    def sees(cls, kind: str) -> bool:
        """Whether messages of type ``kind`` reach this handler at all (the engine skips
        the work of a composite call's message when no active handler sees modules)."""
        process, postprocess = cls.hooks_for(kind)
        return process is not None or postprocess is not None

    def __enter__(self) -> Self:
        interpreters = _INTERPRETERS.get()
        if interpreters:
            interpreters[-1].entering(self)  # a tracer records the block, or refuses it
        _STACK.set((*_STACK.get(), self))
        with _entered_lock:
            self.__dict__["_entered"] = self.__dict__.get("_entered", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        interpreters = _INTERPRETERS.get()
        if interpreters:
            interpreters[-1].leaving(self)
        with _entered_lock:
            self.__dict__["_entered"] = max(0, self.__dict__.get("_entered", 0) - 1)
        leave(_STACK, self, _itself)

    def forward_refusal(self) -> str | None:
        """Why this handler cannot be entered inside a traced ``forward``, or None.

        There a ``with`` block only marks the calls made inside it: the engine enters
        the handler again around each of them when it runs them, later and perhaps
        concurrently.  A handler whose block must span a whole run says why here
        (ending with where to enter it instead), and the tracer refuses it.  By
        default that is a handler that hooks runs: a forward runs inside one.
        """
        if type(self).sees("run"):
            return (
                "it hooks runs (process_run/postprocess_run), and a forward runs inside "
                "one: enter it around the run (`with handler: pipeline.run_sync(...)`)"
            )
        return None

    @property
    def entered(self) -> int:
        """How many blocks (in any task or thread) have this handler active now."""
        return int(self.__dict__.get("_entered", 0))

    def __getstate__(self) -> dict[str, Any]:
        """The handler without the blocks it is entered in here (a copy sent to another
        process, a Ray worker, is entered there afresh)."""
        state = dict(self.__dict__)
        state.pop("_entered", None)
        return state

    @contextlib.contextmanager
    def outermost(self) -> Iterator[Self]:
        """Enter below every active handler: it processes each call last and
        postprocesses it first, so it sees the call as the others left it (plait's
        checkpoints use this to key on the request after any `override`)."""
        token = _STACK.set((self, *_STACK.get()))
        try:
            yield self
        finally:
            _STACK.reset(token)

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Use the handler as a decorator: ``fn`` runs with the handler active."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return fn(*args, **kwargs)

        return run


def _hook(cls: type, stage: str, kind: str) -> Hook | None:
    """The nearest definition along the MRO of the typed hook or the plain one (the
    typed one first within a class), so a subclass overriding either wins over what
    its bases define; `Handler`'s own plain hooks do nothing and count as none."""
    typed = f"{stage}_{kind}"
    plain = stage if kind not in _NOT_CALLS else typed
    for klass in cls.__mro__:
        if klass is Handler:
            return None
        found: Hook | None = klass.__dict__.get(typed) or klass.__dict__.get(plain)
        if found is not None:
            return found
    return None


def _itself(entry: object) -> object:
    return entry


def current_stack() -> tuple[Handler, ...]:
    """The active handlers, outermost first."""
    return _STACK.get()


def observes_every_call(stack: tuple[Handler, ...]) -> bool:
    """Whether a handler of ``stack`` must see every call (see `Handler.sees_every_call`)."""
    return any(handler.sees_every_call for handler in stack)


def _plain_result(result: Any, hook: str, handler: Handler) -> None:
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            f"{type(handler).__name__}.{hook} is async, but this message is handled "
            "synchronously (a plain module call made outside any run); make the hook a "
            "plain method"
        )


def apply_stack_sync(msg: Message) -> Any:
    """Run ``msg`` through the active handlers; every hook and ``fn`` must be sync."""
    stack = _STACK.get()
    seen = _process_sync(msg, stack)
    if not msg.done and msg.fn is not None:
        try:
            msg.value = msg.fn(*msg.args, **msg.kwargs)
        except Exception as exc:
            msg.error = exc
        msg.done = True
    _postprocess_sync(msg, stack, seen)
    return _finish(msg)


def _process_sync(msg: Message, stack: tuple[Handler, ...]) -> int:
    """`process_stack` for plain hooks: ``process`` innermost first, until one stops;
    how many handlers the message passed (`_postprocess_sync` hands it back to them)."""
    seen = 0
    for handler in reversed(stack):
        seen += 1
        hook = type(handler).hooks_for(msg.type)[0]
        if hook is not None:
            _plain_result(hook(handler, msg), "process", handler)
            if msg.stop:
                break
    return seen


def _postprocess_sync(msg: Message, stack: tuple[Handler, ...], seen: int) -> None:
    """`postprocess_stack` for plain hooks: the ``seen`` innermost handlers, outermost
    first."""
    for handler in stack[len(stack) - seen :]:
        hook = type(handler).hooks_for(msg.type)[1]
        if hook is not None:
            _plain_result(hook(handler, msg), "postprocess", handler)


async def apply_stack(msg: Message) -> Any:
    """Run ``msg`` through the active handlers; hooks and ``fn`` may be async."""
    stack = _STACK.get()
    seen = await process_stack(msg, stack)
    if not msg.done and msg.fn is not None:
        try:
            result = msg.fn(*msg.args, **msg.kwargs)
            msg.value = await result if inspect.isawaitable(result) else result
        except Exception as exc:
            msg.error = exc
        msg.done = True
    return await postprocess_stack(msg, stack, seen)


async def process_stack(msg: Message, stack: tuple[Handler, ...]) -> int:
    """The first half of `apply_stack`: ``process`` innermost first, until one stops.

    Returns how many handlers the message passed; `postprocess_stack` hands it back
    to exactly those.  The engine splits a composite module's call this way: its
    handlers process the call when its arguments exist and postprocess it when the
    calls inside it have produced its output.
    """
    seen = 0
    for handler in reversed(stack):
        seen += 1
        hook = type(handler).hooks_for(msg.type)[0]
        if hook is None:
            continue
        out = hook(handler, msg)
        if out is not None and inspect.isawaitable(out):
            await out
        if msg.stop:
            break
    return seen


async def postprocess_stack(msg: Message, stack: tuple[Handler, ...], seen: int) -> Any:
    """The second half of `apply_stack`: ``postprocess`` outermost last, then the result."""
    for handler in stack[len(stack) - seen :]:
        hook = type(handler).hooks_for(msg.type)[1]
        if hook is None:
            continue
        out = hook(handler, msg)
        if out is not None and inspect.isawaitable(out):
            await out
    return _finish(msg)


def current_run() -> Message | None:
    """The ``"run"`` message of the run the calling code belongs to, or None outside
    any run.  Every task a run starts inherits it, so a handler hook finds the run of
    the call it is looking at here (and may keep that run's state in its ``meta``)."""
    return _RUN.get()


@contextlib.contextmanager
def run_scope(msg: Message) -> Iterator[Message]:
    """Run the block as the run ``msg`` (a ``"run"`` message): the active handlers
    that hook runs process it now, the block's code sees it as `current_run`, and they
    postprocess it when the block ends (with ``msg.error`` set if the block raised).

    Usable from sync and async code alike, so its hooks must be plain methods."""
    stack = _STACK.get()
    seen = _process_sync(msg, stack)
    token = _RUN.set(msg)
    try:
        yield msg
    except BaseException as exc:
        if isinstance(exc, Exception):
            msg.error = exc
        else:  # a cancellation or Ctrl-C: the run stopped without a failure of its own
            msg.meta["stopped"] = type(exc).__name__
        raise
    finally:
        _RUN.reset(token)
        msg.done = True
        _postprocess_sync(msg, stack, seen)


def _finish(msg: Message) -> Any:
    if msg.error is not None:
        raise msg.error
    return msg.value


# -- interpreters -------------------------------------------------------------------------
class Interpreter(Handler):
    """What a module call means where it is made (see the module docstring).

    Entered as a context manager (``with tracer:``) it is the innermost interpreter
    of its block; like any handler, one instance may be entered by several tasks at
    once.  It goes in the interpreters' own slot, never on the handler stack, so the
    handlers see a call before it gives the call its meaning.
    """

    #: True while code that traces a graph runs: a `Parameter` read as text then turns
    #: into a placeholder (`lift_parameter`) that keeps it in the graph.
    lift_parameters: bool = False
    #: True where a module call returns an awaitable that runs it as part of the current
    #: run (an engine's node scope): code such as a dynamic `Recurrence` needs one.
    awaits_calls: bool = False

    def call_module(self, msg: Message) -> Any:
        """The result of the module call ``msg`` (``msg.module`` called with
        ``msg.args``/``msg.kwargs``; ``msg.fn`` is its ``forward``)."""
        raise NotImplementedError

    def lift_parameter(self, param: Any) -> str:
        """A placeholder string that stands for ``param`` in the graph being recorded."""
        raise TypeError(f"{type(self).__name__} records no graph")

    def entering(self, handler: Handler) -> None:
        """``handler`` is being entered where this is the innermost interpreter (an
        interpreter that records calls records the block, or refuses it by raising)."""

    def leaving(self, handler: Handler) -> None:
        """``handler``'s block is ending where this is the innermost interpreter (an
        interpreter that records calls may refuse an exit it cannot record)."""

    def __enter__(self) -> Self:
        _INTERPRETERS.set((*_INTERPRETERS.get(), self))
        return self

    def __exit__(self, *exc: object) -> None:
        leave(_INTERPRETERS, self, _itself)


class Runtime(Interpreter):
    """What the core asks of the layers above it, supplied by the composition root.

    It is the outermost interpreter (the meaning of a call made from plain code) and
    the entry points a `Module` or a `Value` offers into the runtime and the backward
    pass, which live in layers the core never imports.
    """

    def run_sync(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``module`` to completion on ``args`` (one input or a batch)."""
        raise NotImplementedError

    def stream(self, module: Any, inputs: Any, options: dict[str, Any]) -> AsyncIterator[Any]:
        """Each input's result as it completes."""
        raise NotImplementedError

    async def backward(self, value: Any, feedback: Any) -> None:
        """Send ``feedback`` on ``value`` back to the parameters that shaped it."""
        raise NotImplementedError


def call_eagerly(msg: Message) -> Any:
    """A module call run on the spot: ``forward`` as a plain function, through the
    handlers when any are active (the runtime's meaning of a call that needs no run)."""
    if _STACK.get():
        return apply_stack_sync(msg)
    return msg.fn(*msg.args, **msg.kwargs) if msg.fn is not None else None


class _Eager(Runtime):
    """The meaning of a call before the composition root installed plait's runtime."""

    def call_module(self, msg: Message) -> Any:
        return call_eagerly(msg)


_runtime: list[Runtime | Callable[[], Runtime]] = [_Eager()]


def install_runtime(found: Runtime | Callable[[], Runtime]) -> None:
    """Make ``found`` (or what it returns when first needed) the process's `Runtime`."""
    _runtime[0] = found


def runtime() -> Runtime:
    """The process's `Runtime` (loading it on first use when it was installed lazily)."""
    found = _runtime[0]
    if not isinstance(found, Runtime):
        found = _runtime[0] = found()
    return found


def current_interpreter() -> Interpreter:
    """The innermost interpreter: the one that gives a call made here its meaning."""
    interpreters = _INTERPRETERS.get()
    return interpreters[-1] if interpreters else runtime()


def find_interpreter(kind: type[I]) -> I | None:
    """The innermost active interpreter of type ``kind`` (an engine's node scope under a
    tracer recording a leaf's calls, say), or None."""
    for entered in reversed(_INTERPRETERS.get()):
        if isinstance(entered, kind):
            return entered
    return None


def interpret(msg: Message) -> Any:
    """Give the call ``msg`` its meaning here (see `Interpreter`)."""
    return current_interpreter().call_module(msg)
