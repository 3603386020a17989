"""The effect-handler stack every module call and LLM call passes through (seed 004).

A call builds a `Message` and hands it to `apply_stack`.  Each active `Handler`
sees it in ``process`` from the innermost ``with`` block outwards; then, unless a
handler marked it ``done``, the default action runs (the real call); then the
handlers see it again in ``postprocess``, from the outermost inwards.  A handler
that sets ``stop`` hides the message from the handlers outside it.  The stack
lives in a ContextVar, so concurrent runs and tasks never see each other's
handlers, and the handlers around ``pipeline.run_sync(...)`` follow the run onto
plait's runtime loop.

Every module call is a message: a leaf's call is a ``"module"`` message (an
`LLMInference`'s is its ``"llm"`` message), and a composite's call (one traced
through into the calls inside it, the root's included) is a ``"module"`` message
with ``meta["composite"] = True`` whose ``process`` runs once its arguments exist
and whose ``postprocess`` runs once its output does, with real values in
``msg.args`` and ``msg.value``.  A handler may rewrite a composite's arguments in
``process`` (the calls inside see them), answer it there by setting ``msg.value``
and ``msg.done`` (the calls inside are then skipped), rewrite its output in
``postprocess`` (its callers see that), or recover from a failure inside it by
clearing ``msg.error`` and setting ``msg.value``.

Order matters when handlers change a call: the innermost one acts first.  Put an
`override` inside a `cache` so the cache keys on the overridden request, and a
`budget` outside a `cache` so cache hits cost nothing::

    with profile("trace.json"), budget(max_cost=5.0), cache("calls.db"):
        pipeline.run_sync(inputs)

A handler of your own is a subclass with one or two hooks, named for the messages it
acts on (``process_llm``/``postprocess_llm``, ``process_module``/``postprocess_module``;
plain ``process``/``postprocess`` see every message)::

    class CountCalls(Handler):
        def __init__(self) -> None:
            self.by_module: dict[str, int] = {}

        def postprocess_llm(self, msg: Message) -> None:
            if msg.error is None:
                self.by_module[msg.name] = self.by_module.get(msg.name, 0) + 1

    with CountCalls() as counts:
        pipeline.run_sync(inputs)

The catalogue: `cache` (persistent, content-addressed), `record`/`replay`
(offline, deterministic runs), `mock` (substitute replies), `override` (change
call parameters), `budget` (stop starting calls past a limit), `profile`
(a Perfetto trace and a summary) and `otel` (OpenTelemetry spans and GenAI metrics,
with ``pip install 'plait[otel]'``).  See `plait.handlers.llm` for what an ``"llm"``
message carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait._lazy import lazy_exports
from plait.effects import (
    Handler,
    Message,
    apply_stack,
    apply_stack_sync,
    current_stack,
)

if TYPE_CHECKING:  # what _CATALOGUE loads, for type checkers and the API reference
    from plait.handlers.budgeting import Budget, BudgetExceeded, budget
    from plait.handlers.caching import Cache, CacheError, cache
    from plait.handlers.calls import CallLog, CallRecord, log_calls
    from plait.handlers.mocking import Mock, UnmockedCallError, mock
    from plait.handlers.overriding import Override, override
    from plait.handlers.profiling import Profiler, profile
    from plait.handlers.recording import (
        NotRecordedError,
        Recorder,
        RecordingError,
        Replayer,
        record,
        replay,
    )
    from plait.handlers.telemetry import Telemetry, otel

#: The catalogue, imported on first use so `import plait` stays fast.  The modules'
#: names differ from the factories' (``caching`` holds ``cache``) so that importing a
#: module never shadows a factory of the same name on this package.
_CATALOGUE = {
    "cache": "plait.handlers.caching",
    "log_calls": "plait.handlers.calls",
    "CallLog": "plait.handlers.calls",
    "CallRecord": "plait.handlers.calls",
    "Cache": "plait.handlers.caching",
    "CacheError": "plait.handlers.caching",
    "record": "plait.handlers.recording",
    "replay": "plait.handlers.recording",
    "Recorder": "plait.handlers.recording",
    "Replayer": "plait.handlers.recording",
    "RecordingError": "plait.handlers.recording",
    "NotRecordedError": "plait.handlers.recording",
    "mock": "plait.handlers.mocking",
    "Mock": "plait.handlers.mocking",
    "UnmockedCallError": "plait.handlers.mocking",
    "override": "plait.handlers.overriding",
    "Override": "plait.handlers.overriding",
    "budget": "plait.handlers.budgeting",
    "Budget": "plait.handlers.budgeting",
    "BudgetExceeded": "plait.handlers.budgeting",
    "profile": "plait.handlers.profiling",
    "Profiler": "plait.handlers.profiling",
    "otel": "plait.handlers.telemetry",
    "Telemetry": "plait.handlers.telemetry",
}


__getattr__ = lazy_exports(__name__, _CATALOGUE)


__all__ = [
    "Budget",
    "BudgetExceeded",
    "Cache",
    "CacheError",
    "CallLog",
    "CallRecord",
    "Handler",
    "Message",
    "Mock",
    "NotRecordedError",
    "Override",
    "Profiler",
    "Recorder",
    "RecordingError",
    "Replayer",
    "Telemetry",
    "UnmockedCallError",
    "apply_stack",
    "apply_stack_sync",
    "budget",
    "cache",
    "current_stack",
    "log_calls",
    "mock",
    "otel",
    "override",
    "profile",
    "record",
    "replay",
]
