"""Messages, handlers and the two-pass `apply_stack` of seed 004."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, ParamSpec, Self, TypeVar

from plait._entries import leave

__all__ = [
    "Handler",
    "Message",
    "apply_stack",
    "apply_stack_sync",
    "current_stack",
    "postprocess_stack",
    "process_stack",
]

P = ParamSpec("P")
R = TypeVar("R")

_STACK: ContextVar[tuple[Handler, ...]] = ContextVar("plait_handler_stack", default=())
#: Guards each handler's count of open blocks (threads may enter one handler at once).
_entered_lock = threading.Lock()


@dataclass(slots=True, eq=False)
class Message:
    """One effect: a module call (``type="module"``) or an LLM request (``"llm"``).

    ``fn`` is the default action, called with ``args``/``kwargs`` when no handler
    marked the message ``done``; its result lands in ``value``.  ``name`` is the
    module path.  ``phase`` is ``"trace"`` while a graph is being recorded and
    ``"run"`` when a node executes.  ``node_id`` and ``input_index`` locate a
    run-time message in the batch, which is what checkpoints and profilers key on.
    If the default action raises, the exception is kept in ``error`` and every
    ``postprocess`` still runs (a handler may recover by clearing ``error`` and
    setting ``value``); it is raised after the last one.  ``continuation`` is
    called last, after every ``postprocess``.
    """

    type: str
    name: str
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    value: Any = None
    done: bool = False
    stop: bool = False
    phase: str = "run"
    module: Any = None
    node_id: str | None = None
    input_index: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None
    continuation: Callable[[Message], None] | None = None


class Handler:
    """Base class of effect handlers.

    Override ``process`` (runs before the default action, innermost handler first)
    and/or ``postprocess`` (runs after it, outermost handler last).  Either may be
    ``async def`` for messages handled by the async `apply_stack`; module calls
    recorded at trace time go through `apply_stack_sync` and need plain methods.
    A handler is used as a context manager (``with h:``) or as a decorator, and one
    instance may be entered by several tasks or threads at once: each block is an
    entry of its own context's stack, not state of the handler.
    """

    #: Whether this handler is shown composite module calls (``meta["composite"]``).
    #: plait's own handlers act on LLM calls only and clear it, so a run under them
    #: brackets its composite calls without any message work; your handlers see them.
    sees_composite_calls: ClassVar[bool] = True

    def process(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg`` before the call; set ``msg.done`` to skip it."""
        return None

    def postprocess(self, msg: Message) -> Any:
        """Inspect or rewrite ``msg.value`` after the call."""
        return None

    def __enter__(self) -> Self:
        _STACK.set((*_STACK.get(), self))
        with _entered_lock:
            self.__dict__["_entered"] = self.__dict__.get("_entered", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _entered_lock:
            self.__dict__["_entered"] = max(0, self.__dict__.get("_entered", 0) - 1)
        leave(_STACK, self, lambda handler: handler)

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


def current_stack() -> tuple[Handler, ...]:
    """The active handlers, outermost first."""
    return _STACK.get()


def _plain_result(result: Any, hook: str, handler: Handler) -> None:
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            f"{type(handler).__name__}.{hook} is async, but this message is handled "
            "synchronously (module calls while tracing); make the hook a plain method "
            "or skip messages with msg.phase == 'trace'"
        )


def apply_stack_sync(msg: Message) -> Any:
    """Run ``msg`` through the active handlers; every hook and ``fn`` must be sync."""
    stack = _STACK.get()
    seen = 0
    for handler in reversed(stack):
        seen += 1
        _plain_result(handler.process(msg), "process", handler)
        if msg.stop:
            break
    if not msg.done and msg.fn is not None:
        try:
            msg.value = msg.fn(*msg.args, **msg.kwargs)
        except Exception as exc:
            msg.error = exc
        msg.done = True
    for handler in stack[len(stack) - seen :]:
        _plain_result(handler.postprocess(msg), "postprocess", handler)
    return _finish(msg)


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

    Returns how many handlers saw the message; `postprocess_stack` hands it back to
    exactly those.  The engine splits a composite module's call this way: its
    handlers process the call when its arguments exist and postprocess it when the
    calls inside it have produced its output.
    """
    seen = 0
    for handler in reversed(stack):
        seen += 1
        out = handler.process(msg)
        if out is not None and inspect.isawaitable(out):
            await out
        if msg.stop:
            break
    return seen


async def postprocess_stack(msg: Message, stack: tuple[Handler, ...], seen: int) -> Any:
    """The second half of `apply_stack`: ``postprocess`` outermost last, then the result."""
    for handler in stack[len(stack) - seen :]:
        out = handler.postprocess(msg)
        if out is not None and inspect.isawaitable(out):
            await out
    return _finish(msg)


def _finish(msg: Message) -> Any:
    if msg.continuation is not None:
        msg.continuation(msg)
    if msg.error is not None:
        raise msg.error
    return msg.value
