"""The driver's handlers, on the workers: every handler means the same thing on Ray.

A run on workers takes the handler stack active where it was started and rebuilds
it in every worker, in the same order, so each call passes through the same
handlers as in one process.  Handlers that count or collect are made whole again:

- `budget`: one limit for the cluster.  Workers lease calls from the broker in
  small blocks and report tokens and cost as they spend them; a call is started
  only with a leased allowance, so ``max_calls`` is a hard stop across workers
  (tokens and cost stop new calls once reached; calls in flight finish, as in one
  process).  The driver's `Budget` ends with the cluster's totals.
- `profile`: each worker records its calls; the driver's profiler receives them
  with each batch and draws one trace with a process per worker.
- usage (`plait.usage()`, ``plait run``'s table): each worker's counters reach the
  driver with each batch and are added up.
- `record`: every worker appends to the same recording file (one machine, or a
  shared file system), so a replay reproduces the whole run.
- `cache`: each worker opens the same SQLite file (one machine: shared, WAL; many
  machines: a cache per machine unless the path is on a shared file system, and
  SQLite over network file systems is not safe: give each machine its own).

Any other handler (override, mock, replay, a user's own) is sent pickled and runs
in each worker as it is; whatever state it keeps stays in that worker.  A handler
that cannot be pickled (one holding a lock or a connection) is refused before the
run starts, with the reason: a hook that silently never ran would be worse.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from plait.handlers.stack import Handler

__all__ = ["WorkerParts", "distribute"]


@dataclass
class WorkerParts:
    """What the driver sends (``specs``) and how it takes the workers' reports back."""

    specs: list[Any] = field(default_factory=list)
    #: Each takes (worker name, worker id, report); the id is unique across runs.
    collectors: list[Callable[[str, str, Any], None]] = field(default_factory=list)

    def collect(self, name: str, worker_id: str, reports: list[Any]) -> None:
        for collector, report in zip(self.collectors, reports, strict=False):
            collector(name, worker_id, report)


def distribute(stack: tuple[Handler, ...]) -> WorkerParts:
    """Specs for ``stack`` (outermost first, as `current_stack` gives it), plus usage."""
    from plait.handlers.budgeting import Budget
    from plait.handlers.caching import Cache
    from plait.handlers.profiling import Profiler
    from plait.handlers.recording import Recorder, Replayer

    parts = WorkerParts()
    usage = _UsageCollector()
    parts.specs.append(_UsageSpec())
    parts.collectors.append(usage)
    for handler in stack:
        if isinstance(handler, Profiler):
            parts.specs.append(_ProfileSpec())
            parts.collectors.append(_ProfileCollector(handler))
        elif isinstance(handler, Budget):
            spec = _BudgetSpec(
                uuid.uuid4().hex,
                handler.max_calls,
                handler.max_tokens,
                handler.max_cost,
                handler.calls,
                handler.tokens,
                handler.cost,
            )
            parts.specs.append(spec)
            parts.collectors.append(_BudgetCollector(handler))
        elif isinstance(handler, Cache):
            parts.specs.append(_CacheSpec(str(handler.path), handler.namespace))
            parts.collectors.append(_ignore)
        elif isinstance(handler, Replayer):
            parts.specs.append(_ReplaySpec(str(handler.path)))
            parts.collectors.append(_ignore)
        elif isinstance(handler, Recorder):
            parts.specs.append(_RecordSpec(str(handler.path)))
            parts.collectors.append(_RecordCollector(handler))
        else:
            parts.specs.append(_PickledSpec(_pickled(handler)))
            parts.collectors.append(_ignore)
    return parts


def _ignore(name: str, worker_id: str, report: Any) -> None:
    return None


def _pickled(handler: Handler) -> bytes:
    from ray import cloudpickle

    try:
        return bytes(cloudpickle.dumps(handler))
    except Exception as exc:
        raise TypeError(
            f"the handler {type(handler).__name__} is active but cannot run on Ray workers: "
            f"pickling it failed ({type(exc).__name__}: {exc}). Run without workers, or "
            "leave it out of this run"
        ) from None


# -- the worker's side: each spec builds a part with a scope and a report ----------------
class _Part:
    handler: Handler | None = None

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        if self.handler is None:
            yield
        else:
            with self.handler:
                yield

    def report(self) -> Any:
        from plait.handlers.recording import Recorder

        if isinstance(self.handler, Recorder):
            return self.handler.calls
        report = getattr(self.handler, "report", None)
        return report() if callable(report) else None


class _UsageSpec:
    def build(self, worker: Any) -> _Part:
        return _UsagePart()


class _UsagePart(_Part):
    def report(self) -> Any:
        from plait.resources.usage import snapshot_records

        return snapshot_records()


class _UsageCollector:
    def __call__(self, name: str, worker_id: str, report: Any) -> None:
        from plait.resources.usage import absorb_remote

        if report is not None:
            absorb_remote(worker_id, report)


@dataclass
class _PickledSpec:
    data: bytes

    def build(self, worker: Any) -> _Part:
        from ray import cloudpickle

        part = _Part()
        part.handler = cloudpickle.loads(self.data)
        return part


@dataclass
class _CacheSpec:
    path: str
    namespace: str

    def build(self, worker: Any) -> _Part:
        from plait.handlers.caching import cache

        part = _Part()
        part.handler = cache(self.path, self.namespace)
        return part


@dataclass
class _RecordSpec:
    """Every worker appends to the same recording (one ``write`` per call on an
    ``O_APPEND`` descriptor, so lines from several processes never interleave)."""

    path: str

    def build(self, worker: Any) -> _Part:
        from plait.handlers.recording import record

        part = _Part()
        part.handler = record(self.path, append=True)
        return part


@dataclass
class _ReplaySpec:
    """Every worker reads the recording itself (one machine, or a shared file system)."""

    path: str

    def build(self, worker: Any) -> _Part:
        from plait.handlers.recording import replay

        part = _Part()
        part.handler = replay(self.path)
        return part


class _RecordCollector:
    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.base = recorder.calls
        self.latest: dict[str, int] = {}

    def __call__(self, name: str, worker_id: str, report: Any) -> None:
        if report is not None:
            self.latest[worker_id] = int(report)
            self.recorder.calls = self.base + sum(self.latest.values())


class _ProfileSpec:
    def build(self, worker: Any) -> _Part:
        return _ProfilePart(worker.name)


class _ProfilePart(_Part):
    def __init__(self, name: str) -> None:
        from plait.handlers.profiling import Profiler

        self.handler = self.profiler = Profiler()
        self.name = name

    def report(self) -> Any:
        return self.profiler.drain_finished()


class _ProfileCollector:
    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler

    def __call__(self, name: str, worker_id: str, report: Any) -> None:
        if report:
            self.profiler.absorb(report, worker=name)


@dataclass
class _BudgetSpec:
    budget_id: str
    max_calls: int | None
    max_tokens: int | None
    max_cost: float | None
    calls: int
    tokens: int
    cost: float

    def build(self, worker: Any) -> _Part:
        part = _Part()
        part.handler = LeasedBudget(self, worker.broker, worker.worker_id)
        return part


class _BudgetCollector:
    def __init__(self, budget: Any) -> None:
        self.budget = budget
        self.base = (budget.calls, budget.tokens, budget.cost, budget.refused)
        self.latest: dict[str, tuple[int, int, float, int]] = {}

    def __call__(self, name: str, worker_id: str, report: Any) -> None:
        if report is None:
            return
        self.latest[worker_id] = report
        calls, tokens, cost, refused = self.base
        for c, t, k, r in self.latest.values():
            calls, tokens, cost, refused = calls + c, tokens + t, cost + k, refused + r
        self.budget.absorb_totals(calls, tokens, cost, refused)


class LeasedBudget(Handler):
    """A worker's view of a cluster-wide `Budget`: calls are started on allowances
    leased from the broker, and what is spent is reported there."""

    sees_composite_calls = False

    def __init__(self, spec: _BudgetSpec, broker: Any, worker: str) -> None:
        from plait.handlers.budgeting import Budget

        self.spec = spec
        self.broker = broker
        self.worker = worker
        # The local counters and the refusal logic are a plain Budget's; only the
        # reservation asks the cluster.
        self.local = Budget()
        self.allowance = 0
        self._unreported_tokens = 0
        self._unreported_cost = 0.0
        self._lock = threading.Lock()
        self._exhausted: tuple[str, float, float] | None = None
        self._leasing: asyncio.Lock | None = None

    async def process(self, msg: Any) -> None:
        from plait.handlers.budgeting import BudgetExceeded

        if msg.type != "llm" or msg.done or msg.meta.get("cache") == "hit" or msg.fn is None:
            return
        if self.allowance < 1:
            # One lease at a time: the calls of a worker's concurrent batches that find
            # no allowance share the block it brings (each leasing its own block leased
            # the whole budget away, and the calls after them were refused).
            if self._leasing is None:
                self._leasing = asyncio.Lock()
            async with self._leasing:
                if self.allowance < 1:
                    await self._lease(msg)
        if self.allowance < 1:
            assert self._exhausted is not None
            self.local._refused += 1
            raise BudgetExceeded(*self._exhausted, module_path=msg.name)
        self.allowance -= 1
        send = msg.fn
        local = self.local

        def counted(*args: Any, **kwargs: Any) -> Any:
            local._calls += 1
            return send(*args, **kwargs)

        msg.fn = counted
        msg.meta[f"leased_budget.{id(self):x}"] = True

    def postprocess(self, msg: Any) -> None:
        from plait.handlers.budgeting import _cost
        from plait.handlers.llm import endpoint_config
        from plait.providers.base import LLMResponse

        if not msg.meta.pop(f"leased_budget.{id(self):x}", False):
            return
        reply = msg.value
        if msg.error is not None or not isinstance(reply, LLMResponse):
            return
        cost = _cost(endpoint_config(msg), reply.usage)
        with self._lock:
            self.local._token_count += reply.usage.total_tokens
            self.local._cost += cost
            self._unreported_tokens += reply.usage.total_tokens
            self._unreported_cost += cost

    async def _lease(self, msg: Any) -> None:
        with self._lock:
            tokens, cost = self._unreported_tokens, self._unreported_cost
            self._unreported_tokens, self._unreported_cost = 0, 0.0
        reply = await self.broker.budget_lease.remote(self.spec, self.worker, 1, tokens, cost, 0)
        self.allowance += int(reply["calls"])
        self._exhausted = tuple(reply["reached"]) if reply["reached"] else None

    def report(self) -> tuple[int, int, float, int]:
        local = self.local
        return (local.calls, local.tokens, local.cost, local.refused)

    def give_back(self) -> Any:
        """Return the unspent allowance and unreported spend (at the end of a batch)."""
        with self._lock:
            tokens, cost = self._unreported_tokens, self._unreported_cost
            self._unreported_tokens, self._unreported_cost = 0, 0.0
            back, self.allowance = self.allowance, 0
        if back or tokens or cost:
            return self.broker.budget_lease.remote(self.spec, self.worker, 0, tokens, cost, back)
        return None


def budget_limit_reached(
    spec: _BudgetSpec, calls: int, tokens: float, cost: float
) -> tuple[str, float, float] | None:
    """Which limit of ``spec`` the cluster's totals have reached, if any."""
    if spec.max_calls is not None and calls >= spec.max_calls:
        return ("max_calls", calls, spec.max_calls)
    if spec.max_tokens is not None and tokens >= spec.max_tokens:
        return ("max_tokens", tokens, spec.max_tokens)
    if spec.max_cost is not None and cost >= spec.max_cost:
        return ("max_cost", cost, spec.max_cost)
    return None


def budget_block(spec: _BudgetSpec, granted: int, askers: int) -> int:
    """Calls to lease at once: a small share of what is left, never more."""
    if spec.max_calls is None:
        return 8
    left = spec.max_calls - granted
    return max(0, min(left, max(1, math.floor(left / (4 * max(1, askers))))))
