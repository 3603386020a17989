"""The sync veneer's event loop: one long-lived loop on a daemon thread per process.

`run_sync` (and a sync call of a bound module) hands its coroutine to this loop
and blocks until it finishes.  A loop that outlives the call keeps the HTTP
session and its warm keep-alive connections (a TLS handshake each against real
APIs), so the second `run_sync` starts sending at once; and because the caller's
thread never runs a loop itself, it works the same from plain scripts and from
inside a running loop (Jupyter, an async web handler).

The caller's context (handlers, `ExecutionSettings`) travels with the coroutine,
Ctrl-C cancels the run cleanly (checkpoint records written so far stay valid),
and a forked child starts its own loop instead of inheriting a dead thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import os
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["RuntimeLoop", "Submission", "run_blocking", "runtime_loop"]

T = TypeVar("T")

#: How long interpreter exit waits for open connections to close.
_SHUTDOWN_TIMEOUT_S = 5.0


class RuntimeLoop:
    """An event loop running forever on its own daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="plait-runtime", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self._cancel_pending()
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def _cancel_pending(self) -> None:
        """Cancel the tasks still on the loop and let them unwind, as `asyncio.run` does.

        Background tasks outlive the runs that started them (a Ray lease task reports
        to its broker for as long as the process leases); closed under them, the loop
        would leave each to be garbage-collected with a "Task was destroyed but it is
        pending" warning at exit, and their ``finally`` blocks would never run.
        """
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending, timeout=_SHUTDOWN_TIMEOUT_S))

    def submit(self, coro: Coroutine[Any, Any, T], context: contextvars.Context) -> Submission[T]:
        """Start ``coro`` as a task on the loop, inside ``context``."""
        submission: Submission[T] = Submission()

        def start() -> None:
            if submission.cancel_requested:
                coro.close()
                submission.unwound.set()
                submission.future.cancel()
                return
            task = self.loop.create_task(coro, context=context)
            submission.task = task
            task.add_done_callback(submission.settle)

        self.loop.call_soon_threadsafe(start)
        return submission

    def stop(self) -> None:
        """Close this loop's HTTP session and stop the thread (interpreter exit)."""
        if not self.thread.is_alive() or self.pid != os.getpid():
            return
        from plait.providers.http import close_session

        with contextlib.suppress(Exception):
            submission = self.submit(close_session(), contextvars.Context())
            submission.future.result(_SHUTDOWN_TIMEOUT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_SHUTDOWN_TIMEOUT_S)


class Submission(Generic[T]):
    """A coroutine handed to the runtime loop: its outcome, and a way to cancel it."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.task: asyncio.Task[T] | None = None
        self.cancel_requested = False
        #: Set once the task has finished unwinding, whatever its outcome.
        self.unwound = threading.Event()

    def settle(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.future.cancel()
        elif (exc := task.exception()) is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(task.result())
        self.unwound.set()

    def cancel_and_wait(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Cancel the task from another thread and wait until it has unwound."""
        self.cancel_requested = True

        def cancel() -> None:
            if self.task is not None:
                self.task.cancel()

        loop.call_soon_threadsafe(cancel)
        self.unwound.wait(timeout)


_runtime: RuntimeLoop | None = None
_runtime_lock = threading.Lock()


def runtime_loop() -> RuntimeLoop:
    """This process's runtime loop, started on first use (and again after a fork)."""
    global _runtime
    current = _runtime
    if current is not None and current.pid == os.getpid() and current.thread.is_alive():
        return current
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid() or not _runtime.thread.is_alive():
            _runtime = RuntimeLoop()
            atexit.register(_runtime.stop)
        return _runtime


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on the runtime loop and return its result.

    Raises a clear error when called on the runtime loop's own thread (from an
    ``async def forward`` or a handler), where blocking would deadlock: ``await``
    the module call there instead.
    """
    runtime = runtime_loop()
    if threading.current_thread() is runtime.thread:
        coro.close()
        raise RuntimeError(
            "run_sync() was called from code already running on plait's event loop "
            "(an `async def forward` or a handler); use `await module(...)` there instead"
        )
    submission = runtime.submit(coro, contextvars.copy_context())
    try:
        return submission.future.result()
    except KeyboardInterrupt:
        # Ctrl-C: cancel the run and let it unwind (tasks cancelled, checkpoint closed)
        # before the interrupt reaches the caller.
        submission.cancel_and_wait(runtime.loop, _SHUTDOWN_TIMEOUT_S)
        raise
