"""The driver's handlers, on the workers: every handler means the same thing on Ray.

A run on workers takes the handler stack active where it was started and rebuilds
it in every worker, in the same order, so each call passes through the same
handlers as in one process.  Handlers that count or collect are made whole again:

- `budget`: one limit for the cluster.  Each request is admitted by the broker's
  ledger when its endpoint admits it (a new call counts against ``max_calls``, the
  request reserves its estimated tokens and cost) and its reply's usage replaces
  the reservation there: the rule of `plait.handlers.budgeting` in one process,
  with one ledger for every worker, so each limit is as hard across workers.  The
  driver's `Budget` ends with the cluster's totals.
- `profile`: each worker records its calls; the driver's profiler receives them
  with each batch and draws one trace with a process per worker.
- usage (`plait.usage()`, ``plait run``'s table): each worker's counters reach the
  driver with each batch and are added up.
- a trainer's spending ledger (`plait.learning.spend.SpendLedger`): each worker
  counts what its share of a pass paid, filed under the account and phase the pass
  was sent in, and its count reaches the driver with each batch.
- `record`: every worker appends to the same recording file (one machine, or a
  shared file system), so a replay reproduces the whole run.
- `cache`: each worker opens the same SQLite file (one machine: shared, WAL; many
  machines: a cache per machine unless the path is on a shared file system, and
  SQLite over network file systems is not safe: give each machine its own).

- `otel`: sent pickled with the W3C ``traceparent`` of the driver's run span and the
  driver's ``OTEL_*`` settings (`plait.handlers.telemetry.Telemetry.__getstate__`):
  each worker exports its own spans, in the driver's trace, flushed as each batch ends.

Any other handler (override, mock, replay, a user's own) is sent pickled and runs
in each worker as it is; whatever state it keeps stays in that worker.  A handler
that cannot be pickled (one holding a lock or a connection) is refused before the
run starts, with the reason: a hook that silently never ran would be worse.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from plait.effects import Handler

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
    from plait.execution.checkpoint import CheckpointHandler
    from plait.handlers.budgeting import Budget
    from plait.handlers.caching import Cache
    from plait.handlers.profiling import Profiler
    from plait.handlers.recording import Recorder, Replayer
    from plait.learning.spend import SpendLedger, WorkerSpend

    parts = WorkerParts()
    usage = _UsageCollector()
    parts.specs.append(_UsageSpec())
    parts.collectors.append(usage)
    for handler in stack:
        if isinstance(handler, CheckpointHandler):
            # The driver's log (a trainer's call log) stays here: a worker logs to its
            # own file of that checkpoint (`PipelineSpec.checkpoint_dir`).  Pickled, the
            # handler took the driver's raw file descriptor along, and the worker wrote
            # log records into whatever that number was there: an HTTP connection.
            continue
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
        elif isinstance(handler, SpendLedger):
            # Context variables do not travel to a worker: its calls are filed under the
            # account and phase in force here, where the pass is sent.
            label = handler.label()
            parts.specs.append(_SpendSpec(label))
            parts.collectors.append(WorkerSpend(handler, label))
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
class _SpendSpec:
    """A trainer's `SpendLedger` on a worker: what the pass pays, under one label."""

    label: Any

    def build(self, worker: Any) -> _Part:
        from plait.learning.spend import SpendLedger

        part = _Part()
        part.handler = SpendLedger(self.label)
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
    """A worker's view of a cluster-wide `Budget`: each request is admitted by the
    broker's ledger when its endpoint admits it (a new call counts against
    ``max_calls``, the request reserves its estimated tokens and cost), and its
    reply's usage replaces the reservation there: the rule of a `Budget` in one
    process, with one ledger for every worker."""

    def __init__(self, spec: _BudgetSpec, broker: Any, worker: str) -> None:
        from plait.handlers.budgeting import Budget

        self.spec = spec
        self.broker = broker
        self.worker = worker
        # The local counters are a plain Budget's (what this worker spent, for the
        # driver's totals); the limits are the cluster's, in the broker.
        self.local = Budget()
        self._lock = threading.Lock()
        # Settlements sent to the broker, awaited before the batch returns.
        self._settling: list[Any] = []

    @property
    def limited(self) -> bool:
        """Whether requests need the broker's admission (a budget only counting does not)."""
        spec = self.spec
        return any(v is not None for v in (spec.max_calls, spec.max_tokens, spec.max_cost))

    def process_llm(self, msg: Any) -> None:
        from plait.resources.endpoint import attach_gate

        attach_gate(msg, self, lambda: _LeasedTicket(self, msg.name))

    def report(self) -> tuple[int, int, float, int]:
        local = self.local
        return (local.calls, local.tokens, local.cost, local.refused)

    async def give_back(self) -> None:
        """Wait for the settlements sent to the broker (at the end of a batch)."""
        settling, self._settling = self._settling, []
        for pending in settling:
            await pending


class _LeasedTicket:
    """One call under a `LeasedBudget`: its `AdmissionGate` at the endpoint."""

    def __init__(self, budget: LeasedBudget, name: str) -> None:
        self.budget = budget
        self.name = name
        self.config: Any = None
        self.counted = False  # counted in ``calls`` (at its first admission)
        self.new = False  # ... by an admission that may still be withdrawn
        self.reserved: tuple[float, float] | None = None  # held in the broker's ledger
        self.tier = "standard"  # how the admitting endpoint serves it (its price)

    async def admit(self, endpoint: Any, request: Any, estimate: Any) -> Any:

        from plait.handlers.budgeting import BudgetExceeded, _check_prices, _cost

        budget, spec = self.budget, self.budget.spec
        if spec.max_cost is not None:
            _check_prices(endpoint.config, endpoint.alias, self.name)
        if budget.limited:
            tokens = float(estimate.total_tokens)
            cost = _cost(endpoint.config, estimate, endpoint.tier)
            call = not self.counted
            reply = await budget.broker.budget_reserve.remote(
                spec, budget.worker, call, tokens, cost
            )
            if reply["reached"]:
                with budget._lock:
                    budget.local._refused += 1
                limit, spent, maximum = reply["reached"]
                raise BudgetExceeded(limit, spent, maximum, module_path=self.name)
            if not reply["reserved"]:
                return asyncio.sleep(0)  # the broker has waited already: ask again
            self.reserved = (tokens, cost)
        self.config, self.tier = endpoint.config, endpoint.tier
        if not self.counted:
            with budget._lock:
                budget.local._calls += 1
            self.counted = self.new = True
        return None

    def settle(self, usage: Any) -> None:
        from plait.handlers.budgeting import _cost

        budget = self.budget
        self.new = False
        tokens = usage.total_tokens if usage is not None else 0
        cost = _cost(self.config, usage, self.tier) if usage is not None and self.config else 0.0
        with budget._lock:
            budget.local._token_count += tokens
            budget.local._cost += cost
        self._release((tokens, cost), unsent_call=False)

    def withdraw(self) -> None:
        unsent = self.new
        if unsent:
            with self.budget._lock:
                self.budget.local._calls -= 1
            self.counted = self.new = False
        self._release((0, 0.0), unsent_call=unsent)

    def _release(self, spent: tuple[float, float], unsent_call: bool) -> None:
        if self.reserved is None:
            return
        budget, held = self.budget, self.reserved
        self.reserved = None
        budget._settling.append(
            budget.broker.budget_settle.remote(budget.spec, budget.worker, held, spent, unsent_call)
        )
