"""Effect handlers: the one mechanism every module call and LLM call passes through.

This module holds the messages, the handlers that see them, the interpreters that
give a call its meaning, and the `Runtime` the core hands its calls to.  As in
Pyro, each call is a message that a stack of handlers may inspect, change or
answer before and after the real call runs.

A call builds a `Message` and hands it to the innermost *interpreter*, which decides
what the call means where it is made:

* `Runtime` (installed by ``plait/__init__.py``, the composition root) for a call
  made from plain code: it runs ``forward`` on the spot, or starts a run when the
  module needs one (resources bound, an `ExecutionSettings`, LLM calls in its tree);
* the tracer (`plait.tracing.tracer.Tracer`) while a ``forward`` is being recorded:
  the call becomes a node of the graph;
* the engine's node scope (`plait.execution.engine.NodeScope`) inside an ``async def
  forward`` that a run is executing: the call runs as part of that run.

Interpreters are entered like handlers (tracing is itself a handler) but sit in a
slot of their own beside the handler stack, where `interpret_call` finds the innermost
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
    "interpret_call",
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
    """One effect: a module call (``type="module"``), an LLM request (``"llm"``) or a run.

    Handlers receive messages in their hooks and may read or change any field.  If
    the default action raises, the exception is kept in ``error`` and every
    ``postprocess`` still runs (a handler may recover by clearing ``error`` and
    setting ``value``); it is raised after the last one.  What an ``"llm"`` message
    carries is described in `plait.handlers.llm`.

    Attributes:
        type: The kind of effect: ``"module"``, ``"llm"`` or ``"run"``; a handler's
            ``process_<type>``/``postprocess_<type>`` hooks see it.
        name: The module path of the call (for an LLM call, the `LLMInference`'s path).
        fn: The default action, called with ``args``/``kwargs`` unless a handler set
            ``done``.
        args: Positional arguments of the call (an LLM call's one `LLMRequest`).
        kwargs: Keyword arguments of the call.
        value: The result: set by the default action, or by a handler that answers.
        done: Set by a handler that answered the call in ``process``: the default
            action is skipped.
        stop: Set by a handler to hide the message from the handlers outside it.
        module: The module being called, when there is one.
        node_id: The call's node in its run's graph (what checkpoints key on).
        input_index: Which input of the run's batch the call serves.
        meta: Free-form information (``meta["composite"]`` marks a composite module's
            call, ``meta["scope"]`` names the call it was made inside).
        error: The exception the default action raised, if any.
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
    """Base class of effect handlers: code that sees, changes or answers calls.

    Define ``process_<type>`` (runs before the default action, innermost handler
    first) and/or ``postprocess_<type>`` (after it, outermost handler last) for the
    message types you act on (``llm``, ``module``), or the plain ``process``/
    ``postprocess`` to see every message.  Hooks may be ``async def`` for messages
    handled by the async `apply_stack`; plain module calls made outside any run go
    through `apply_stack_sync` and need plain methods.  A handler is used as a context
    manager (``with h:``) or as a decorator, and one instance may be entered by several
    tasks or threads at once: each block is an entry of its own context's stack, not
    state of the handler.

    Examples:
        A handler that counts the LLM calls each module makes, around a pipeline that
        runs on canned replies (`plait.handlers.mock`):

        ```python
        import plait
        from plait.handlers import Handler, Message, mock


        class CountCalls(Handler):
            def __init__(self) -> None:
                self.by_module: dict[str, int] = {}

            def postprocess_llm(self, msg: Message) -> None:
                if msg.error is None:
                    self.by_module[msg.name] = self.by_module.get(msg.name, 0) + 1


        class Summarize(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.summary = plait.LLMInference("fast", system_prompt="Summarize.")

            def forward(self, text: str) -> str:
                return self.summary(text)


        with CountCalls() as counts, mock({"fast": "A short summary."}):
            Summarize().run_sync(["first text", "second text"])
        print(counts.by_module)
        ```
    """

    #: A handler that must see every call of a run (a recorder) sets this: a resumed run
    #: then replays finished inputs through their calls (answered by the checkpoint)
    #: instead of answering them with their stored outputs.
    sees_every_call: bool = False

    def process(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg`` before the call; set ``msg.done`` to skip it.

        Args:
            msg: The call's message; set ``msg.value`` and ``msg.done`` to answer it.

        Returns:
            Nothing that is used (an ``async def`` hook's awaitable is awaited).
        """
        return None

    def postprocess(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg.value`` after the call.

        Args:
            msg: The call's message, with ``value`` (or ``error``) set.

        Returns:
            Nothing that is used (an ``async def`` hook's awaitable is awaited).
        """
        return None

    @classmethod
    def hooks_for(cls, kind: str) -> tuple[Hook | None, Hook | None]:
        """The ``(process, postprocess)`` functions this class runs for one message type.

        Args:
            kind: A message type (``"llm"``, ``"module"``, ``"run"``).

        Returns:
            The type's own hooks (``process_<kind>``), else the plain ones the class
            overrides, each None where the class defines neither.
        """
        key = (cls, kind)
        found = _hooks.get(key)
        if found is None:
            found = _hooks[key] = (_hook(cls, "process", kind), _hook(cls, "postprocess", kind))
        return found

    @classmethod
    def sees(cls, kind: str) -> bool:
        """Whether messages of one type reach this handler at all.

        The engine skips building a composite call's message when no active handler
        sees modules.

        Args:
            kind: A message type (``"llm"``, ``"module"``, ``"run"``).

        Returns:
            True when the class defines a hook for ``kind`` (or a plain one).
        """
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

        Returns:
            The reason, ending with where to enter the handler instead; None when it
            may be entered inside a ``forward``.
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
        """Enter this handler below every active one, for the ``with`` block.

        It processes each call last and postprocesses it first, so it sees the call
        as the others left it (plait's checkpoints use this to key on the request
        after any `override`).

        Returns:
            A context manager that yields this handler.
        """
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
        """Use the handler as a decorator: ``fn`` runs with the handler active.

        Args:
            fn: A function or ``async def`` function.

        Returns:
            A function that calls ``fn`` inside ``with self:``.
        """
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
    """The handlers active in the calling context.

    Returns:
        The active handlers, outermost first.
    """
    return _STACK.get()


def observes_every_call(stack: tuple[Handler, ...]) -> bool:
    """Whether a handler of ``stack`` must see every call (see `Handler.sees_every_call`).

    Args:
        stack: Handlers, as `current_stack` returns them.

    Returns:
        True when one of them sets ``sees_every_call``.
    """
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
    """Run ``msg`` through the active handlers, synchronously.

    Args:
        msg: The call; its hooks and ``fn`` must be plain (not ``async``) functions.

    Returns:
        The call's value, as the handlers left it.

    Raises:
        TypeError: When a hook is ``async def`` (make it a plain method).
        Exception: The call's ``error``, when no handler recovered from it.
    """
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
    """Run ``msg`` through the active handlers: process, the default action, postprocess.

    Args:
        msg: The call; its hooks and ``fn`` may be ``async``.

    Returns:
        The call's value, as the handlers left it.

    Raises:
        Exception: The call's ``error``, when no handler recovered from it.
    """
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

    The engine splits a composite module's call this way: its handlers process the
    call when its arguments exist and postprocess it when the calls inside it have
    produced its output.

    Args:
        msg: The call.
        stack: The handlers, outermost first (`current_stack`).

    Returns:
        How many handlers the message passed; `postprocess_stack` hands it back to
        exactly those.
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
    """The second half of `apply_stack`: ``postprocess`` outermost last, then the result.

    Args:
        msg: The call, its default action done (or answered by a handler).
        stack: The same handlers `process_stack` was given.
        seen: What `process_stack` returned.

    Returns:
        The call's value, as the handlers left it.

    Raises:
        Exception: The call's ``error``, when no handler recovered from it.
    """
    for handler in stack[len(stack) - seen :]:
        hook = type(handler).hooks_for(msg.type)[1]
        if hook is None:
            continue
        out = hook(handler, msg)
        if out is not None and inspect.isawaitable(out):
            await out
    return _finish(msg)


def current_run() -> Message | None:
    """The ``"run"`` message of the run the calling code belongs to.

    Every task a run starts inherits it, so a handler hook finds the run of the call
    it is looking at here (and may keep that run's state in its ``meta``).

    Returns:
        The run's message, or None outside any run.
    """
    return _RUN.get()


@contextlib.contextmanager
def run_scope(msg: Message) -> Iterator[Message]:
    """Run the ``with`` block as one run, announced to the handlers that hook runs.

    The active handlers that hook runs process ``msg`` now, the block's code sees
    it as `current_run`, and they postprocess it when the block ends (with
    ``msg.error`` set if the block raised).  Usable from sync and async code alike,
    so its hooks must be plain methods.

    Args:
        msg: A ``"run"`` message.

    Returns:
        A context manager that yields ``msg``.
    """
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
    """What a module call means where it is made: run it, record it, or run it in a run.

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
        """Give the module call ``msg`` its meaning here.

        Args:
            msg: The call: ``msg.module`` called with ``msg.args``/``msg.kwargs``;
                ``msg.fn`` is its ``forward``.

        Returns:
            The call's result (an awaitable where the call starts a run).
        """
        raise NotImplementedError

    def call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call ``module(*args, **kwargs)`` made here: `call_module` of its message.

        An interpreter that reads only the module and its arguments overrides this to
        skip building a message no handler would see: the `Tracer`, at every module
        call of every input's trace (handlers see a traced call when it runs).

        Args:
            module: The module called.
            args: Its positional arguments.
            kwargs: Its keyword arguments.

        Returns:
            The call's result (see `call_module`).
        """
        return self.call_module(
            Message(
                type="module",
                name=type(module).__name__,
                fn=module.forward,
                args=args,
                kwargs=kwargs,
                module=module,
            )
        )

    def lift_parameter(self, param: Any) -> str:
        """A placeholder string that stands for ``param`` in the graph being recorded.

        Args:
            param: A `Parameter` read as text inside a traced ``forward``.

        Returns:
            The placeholder.

        Raises:
            TypeError: When this interpreter records no graph.
        """
        raise TypeError(f"{type(self).__name__} records no graph")

    def entering(self, handler: Handler) -> None:
        """Note that ``handler`` is being entered where this is the innermost interpreter.

        An interpreter that records calls records the block, or refuses it by raising.

        Args:
            handler: The handler being entered.
        """

    def leaving(self, handler: Handler) -> None:
        """Note that ``handler``'s block is ending where this is the innermost interpreter.

        An interpreter that records calls may refuse an exit it cannot record.

        Args:
            handler: The handler whose block ends.
        """

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
        """Run ``module`` to completion on one input or a batch (`Module.run_sync`).

        Args:
            module: The module to run.
            args: Its positional arguments (one input, or one batch).
            kwargs: Its keyword arguments and per-call options.

        Returns:
            The output (a list of outputs for a batch).
        """
        raise NotImplementedError

    def stream(self, module: Any, inputs: Any, options: dict[str, Any]) -> AsyncIterator[Any]:
        """Each input's result as it completes (`Module.stream`).

        Args:
            module: The module to run.
            inputs: The batch: a list or any iterable of inputs.
            options: Per-call options (``preserve_order``, ``resources``...).

        Returns:
            An async iterator of `BatchResult`s.
        """
        raise NotImplementedError

    async def backward(self, value: Any, feedback: Any) -> None:
        """Send ``feedback`` on ``value`` back to the parameters that shaped it.

        Args:
            value: An output of a module in training mode.
            feedback: What to send back (a loss's feedback).
        """
        raise NotImplementedError


def call_eagerly(msg: Message) -> Any:
    """Run a module call on the spot: ``forward`` as a plain function.

    This is the runtime's meaning of a call that needs no run; the call goes
    through the handlers when any are active.

    Args:
        msg: The module call.

    Returns:
        What ``forward`` returned (as the handlers left it).
    """
    if _STACK.get():
        return apply_stack_sync(msg)
    return msg.fn(*msg.args, **msg.kwargs) if msg.fn is not None else None


class _Eager(Runtime):
    """The meaning of a call before the composition root installed plait's runtime."""

    def call_module(self, msg: Message) -> Any:
        return call_eagerly(msg)


_runtime: list[Runtime | Callable[[], Runtime]] = [_Eager()]


def install_runtime(found: Runtime | Callable[[], Runtime]) -> None:
    """Make ``found`` the process's `Runtime` (the composition root does this).

    Args:
        found: The runtime, or a function that makes it when it is first needed.
    """
    _runtime[0] = found


def runtime() -> Runtime:
    """The process's `Runtime`, made on first use when it was installed lazily.

    Returns:
        The runtime.
    """
    found = _runtime[0]
    if not isinstance(found, Runtime):
        found = _runtime[0] = found()
    return found


def current_interpreter() -> Interpreter:
    """The innermost interpreter: the one that gives a call made here its meaning.

    Returns:
        The innermost entered interpreter, else the process's `Runtime`.
    """
    interpreters = _INTERPRETERS.get()
    return interpreters[-1] if interpreters else runtime()


def find_interpreter(kind: type[I]) -> I | None:
    """The innermost active interpreter of a given type.

    Args:
        kind: The interpreter class to look for (an engine's node scope under a
            tracer recording a leaf's calls, say).

    Returns:
        The innermost entered interpreter of that type, or None.
    """
    for entered in reversed(_INTERPRETERS.get()):
        if isinstance(entered, kind):
            return entered
    return None


def interpret_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Give the call ``module(*args, **kwargs)`` its meaning here (`Interpreter.call`).

    What `Module.__call__` does: the innermost interpreter (`current_interpreter`)
    makes the call its ``"module"`` message, unless it needs none (the tracer).

    Args:
        module: The module called.
        args: Its positional arguments.
        kwargs: Its keyword arguments.

    Returns:
        The current interpreter's result for it.
    """
    return current_interpreter().call(module, args, kwargs)
