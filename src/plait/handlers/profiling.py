"""Where a run's time went: a handler that records every call and writes a Perfetto trace.

``with profile("run.json") as prof: pipeline.run_sync(inputs)`` records each run-time
``"llm"`` and ``"module"`` message from the moment the profiler's ``process`` sees it
to the moment its ``postprocess`` does, together with the `CallTiming` spans the
endpoint filled in (queue, rate wait, each attempt, backoff).  On leaving the block
the trace is written in Chrome's Trace Event Format, which Perfetto and
``chrome://tracing`` open; `Profiler.summary` and `Profiler.table` answer the usual
questions without a viewer: how busy each endpoint was, which calls were slowest,
and which chain of calls decided the wall time.

An input whose output a checkpoint already holds makes no call: a rerun of a
finished run is told each one (`Profiler.note_restored`), with the calls the log
says made it, and draws it as an instant on a "checkpoint" track, its calls beside
it as spans marked restored (as long as they took when they were made, laid out as
they ran), so its trace says where the outputs came from and what they took
instead of being empty.

The hooks run on plait's runtime loop thread while the ``with`` block is left on
the caller's, so every read and write of the records holds one lock.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from rich.table import Table

from plait._secrets import scrub
from plait.effects import Handler, Message
from plait.handlers.llm import call_outcome
from plait.resources.endpoint import CallTiming, Span

__all__ = [
    "AliasProfile",
    "CacheAdvice",
    "NodeProfile",
    "PathLink",
    "ProfileSummary",
    "Profiler",
    "profile",
]

#: Track group for calls that have no alias (plain and async-forward module calls).
MODULES_TRACK = "modules"
#: Track group for llm messages that carry no request (built by hand, not by the engine).
_NO_ALIAS = "(no alias)"
#: Track groups of a Ray worker's calls are named by this and the worker's name.
_WORKER_PREFIX = "worker "
#: Queue spans shorter than this only took an uncontended lock: left out of the trace
#: (they would bury the real waits), still counted in the totals.
_MIN_QUEUE_S = 5e-5
#: Tolerance when matching an upstream call that must have finished before its dependent.
_EPSILON_S = 1e-6
_PHASE_NAMES = {"rate_wait": "rate wait", "backoff": "backoff"}
#: Prompts kept per call site to find fixed text after varying text (`cache_advice`).
_PROMPTS_KEPT = 8
_log = logging.getLogger("plait")


def profile(path: str | os.PathLike[str] | None = None) -> Profiler:
    """Record where a run's time went, and write a Perfetto trace when the block exits.

    The trace (Chrome's Trace Event Format, which Perfetto and ``chrome://tracing``
    open) draws each LLM call with its phases: queue, rate-limit wait, each
    attempt, backoff.  `Profiler.summary` and `Profiler.table` answer the usual
    questions without a viewer: how busy each endpoint was, which calls were
    slowest, and which chain of calls decided the wall time.

    Args:
        path: Where to write the trace as the block exits; None writes nothing.

    Returns:
        The `Profiler` handler: enter it with ``with``.

    Examples:
        ```python
        import json
        from pathlib import Path

        import plait
        from plait.handlers import profile

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)

        with profile("trace.json") as prof:
            summarize.run_sync(["First text.", "Second text."])
        summary = prof.summary()
        print(summary.calls, summary.aliases["fast"].calls)
        print("traceEvents" in json.loads(Path("trace.json").read_text()))
        ```
    """
    return Profiler(path)


@dataclass(slots=True, eq=False)
class _Record:
    type: str
    name: str
    node_id: str | None
    input_index: int | None
    alias: str | None
    upstream: tuple[str, ...]
    start: float
    end: float | None = None
    outcome: str = "unfinished"
    error: str | None = None
    spans: list[Span] = field(default_factory=list)
    #: The call's live timing while it runs, so a trace taken meanwhile shows its phases.
    timing: CallTiming | None = None
    #: The Ray worker that made the call (`plait.ray`); None in the profiler's own process.
    worker: str | None = None

    def finish_time(self) -> float:
        """Where an unfinished call (cancelled, or still running) is drawn to end."""
        if self.end is not None:
            return self.end
        return max([self.start, *(s.end for s in self.spans)])


@dataclass(slots=True)
class AliasProfile:
    """One endpoint alias over the run.

    ``busy_fraction`` is the share of the wall time in which at least one request
    was at the provider (the union of request spans); ``mean_concurrency`` is the
    total request time over the wall time, i.e. how many requests were in flight
    on average.  Their ratio is how parallel the alias was while it was busy.
    """

    alias: str
    calls: int = 0
    errors: int = 0
    answered: int = 0
    attempts: int = 0
    retries: int = 0
    failed_attempts: int = 0
    busy_s: float = 0.0
    busy_fraction: float = 0.0
    mean_concurrency: float = 0.0
    queue_s: float = 0.0
    rate_wait_s: float = 0.0
    request_s: float = 0.0
    backoff_s: float = 0.0


@dataclass(slots=True)
class NodeProfile:
    """One recorded call; times are seconds from the first recorded call's start."""

    type: str
    name: str
    node_id: str | None
    input_index: int | None
    alias: str | None
    outcome: str
    start_s: float
    end_s: float
    duration_s: float


@dataclass(slots=True)
class PathLink:
    """One call on the critical path.

    ``contributed_s`` runs from the previous link's end (or the run's start) to this
    call's end, so the links add up to the last call's finish; ``waited_s`` is the
    part of it spent before the call began (scheduling, ops, a module's own code).
    """

    node: NodeProfile
    contributed_s: float
    waited_s: float


@dataclass(slots=True)
class CacheAdvice:
    """A call site whose prompts put text that varies per input before text that does
    not: the provider caches a prompt's prefix, so that fixed text is paid in full on
    every call.  Moved before the varying part (into the system prompt, say), it would
    be read from the cache at a tenth of the price."""

    site: str
    calls: int
    #: Estimated tokens of the fixed text that follows the varying part.
    fixed_tokens: int

    @property
    def tokens_saved(self) -> int:
        """Prompt tokens billed as cache reads instead, over the calls seen (all but the
        first, which writes the cache)."""
        return self.fixed_tokens * max(0, self.calls - 1)

    def message(self) -> str:
        return (
            f"plait: call site {self.site!r}: about {self.fixed_tokens:,} tokens of its prompt "
            "are the same for every input but come after text that varies, so the provider "
            "cannot cache them; put the fixed text first (in the system prompt) to have "
            f"about {self.tokens_saved:,} prompt tokens over these {self.calls} calls read "
            "from the cache instead"
        )


@dataclass(slots=True)
class ProfileSummary:
    """What `Profiler.summary` reports; `to_dict` gives it as plain JSON-ready data.

    ``wall_s`` runs from the first recorded call's start to the last one's end, not
    over the ``with`` block, so that setup, tracing or idle time around the run
    doesn't dilute the busy fractions.
    """

    wall_s: float
    calls: int
    aliases: dict[str, AliasProfile]
    slowest: list[NodeProfile]
    critical_path: list[PathLink]
    cache_advice: list[CacheAdvice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Profiler(Handler):
    """Records calls as they pass through the handler stack (see `profile`).

    LLM calls and leaf module calls are drawn; a composite call's time is the time of
    the calls inside it, drawn already.  A profiler kept across several ``with``
    blocks or runs keeps adding to the same records.

    Args:
        path: Where to write the trace as each block exits; None writes nothing.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._records: list[_Record] = []
        # Inputs answered from a checkpoint (index, when, the logged calls that made it):
        # outputs that made no call now.
        self._restored: list[tuple[int | None, float, list[dict[str, Any]]]] = []
        # Keyed by id(msg): the message is alive (in flight) for as long as it is here.
        self._open: dict[int, _Record] = {}
        # Per call site: its calls, and the prompts of the first few (`cache_advice`).
        self._prompts: dict[str, tuple[int, list[str]]] = {}
        self._advised: set[str] = set()

    # -- recording -----------------------------------------------------------------------
    def process_module(self, msg: Message) -> None:
        """Start recording a leaf module call.

        Args:
            msg: The call's message.
        """
        if not msg.meta.get("composite"):
            self.process_llm(msg)

    def postprocess_module(self, msg: Message) -> None:
        """Finish recording a leaf module call.

        Args:
            msg: The call's message.
        """
        if not msg.meta.get("composite"):
            self.postprocess_llm(msg)

    def process_llm(self, msg: Message) -> None:
        """Start recording a call.

        Args:
            msg: The call's message.
        """
        timing = msg.meta.get("timing")
        record = _Record(
            type=msg.type,
            name=msg.name,
            node_id=msg.node_id,
            input_index=msg.input_index,
            alias=_alias_of(msg),
            upstream=tuple(msg.meta.get("upstream") or ()),
            start=time.monotonic(),
            timing=timing if isinstance(timing, CallTiming) else None,
        )
        prompt = _prompt_of(msg)
        with self._lock:
            if id(msg) in self._open:  # the same profiler entered twice: count the call once
                return
            self._open[id(msg)] = record
            self._records.append(record)
            if prompt is not None:
                calls, kept = self._prompts.get(msg.name, (0, []))
                if len(kept) < _PROMPTS_KEPT:
                    kept.append(prompt)
                self._prompts[msg.name] = (calls + 1, kept)

    def postprocess_llm(self, msg: Message) -> None:
        """Finish recording a call, with its phases and outcome.

        Args:
            msg: The call's message.
        """
        end = time.monotonic()
        timing = msg.meta.get("timing")
        spans = list(timing.spans) if isinstance(timing, CallTiming) else []
        outcome = call_outcome(msg, spans)
        error = None if msg.error is None else scrub(f"{type(msg.error).__name__}: {msg.error}")
        with self._lock:
            record = self._open.pop(id(msg), None)
            if record is None:
                return
            # The alias actually used: a handler inside this one may have rewritten it.
            record.alias = _alias_of(msg)
            record.spans, record.timing = spans, None
            record.outcome, record.error, record.end = outcome, error, end

    def __enter__(self) -> Self:
        super().__enter__()
        return self

    def forward_refusal(self) -> str | None:
        """Why a profile cannot be entered inside a ``forward``.

        A profile draws whole runs and writes its trace as its block ends, so it
        cannot be entered again around each call inside a forward.

        Returns:
            The reason, and where to enter it instead.
        """
        return (
            "a profile draws whole runs and writes its trace when its block ends: enter "
            "it around the run (`with plait.handlers.profile(path): pipeline.run_sync(...)`)"
            " and read one stage's calls from the trace by their module path"
        )

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        # Written even when the block raised: a failed run is the one worth looking at.
        if self.path is not None:
            self.write(self.path)
        for advice in self.cache_advice():
            if advice.site not in self._advised:  # once per call site
                self._advised.add(advice.site)
                _log.warning("%s", advice.message())

    def cache_advice(self, min_tokens: int = 1024) -> list[CacheAdvice]:
        """The call sites whose fixed prompt text comes after their varying text.

        The provider caches a prompt's prefix, so fixed text after varying text is
        paid in full on every call (see `CacheAdvice`).

        Args:
            min_tokens: The least fixed text worth reporting, in estimated tokens
                (the providers cache nothing shorter).

        Returns:
            One piece of advice per such call site.
        """
        with self._lock:
            sites = {name: (calls, list(kept)) for name, (calls, kept) in self._prompts.items()}
        found = []
        for site, (calls, prompts) in sorted(sites.items()):
            if len(set(prompts)) < 2:
                continue
            head = _shared_start(prompts)
            fixed_after = _shared_start([p[head:][::-1] for p in prompts]) // 4
            if fixed_after >= min_tokens:
                found.append(CacheAdvice(site, calls, fixed_after))
        return found

    def drain_finished(self) -> list[_Record]:
        """Hand over the finished calls recorded so far, and forget them here.

        A Ray worker sends them to the driver's profiler with each batch.

        Returns:
            The finished calls' records.
        """
        with self._lock:
            done = [r for r in self._records if r.end is not None]
            self._records = [r for r in self._records if r.end is None]
        return done

    def absorb(self, records: list[_Record], worker: str) -> None:
        """Add calls another process recorded (a Ray worker's).

        Each worker is drawn as a process of its own in the trace.  Times are the
        machine's monotonic clock, shared by every process of one machine.

        Args:
            records: What the worker's `drain_finished` returned.
            worker: The worker's name.
        """
        for record in records:
            record.worker = worker
        with self._lock:
            self._records.extend(records)

    def _snapshot(self) -> list[_Record]:
        with self._lock:
            return [_copy(r) for r in self._records]

    def note_restored(self, index: int | None, calls: list[dict[str, Any]] | None = None) -> None:
        """Note that an input was answered with its output from a checkpoint (no call).

        Args:
            index: The input's index in its batch.
            calls: The calls an earlier run made for it, as the checkpoint logged them.
        """
        with self._lock:
            self._restored.append((index, time.monotonic(), list(calls or ())))

    @property
    def restored(self) -> int:
        """Inputs answered from a checkpoint while this profiler was active."""
        return len(self._restored)

    # -- the trace -----------------------------------------------------------------------
    def trace(self) -> dict[str, Any]:
        """The recorded calls as a Trace Event Format document (a JSON object).

        One process per alias (plus one for module calls), one thread per lane:
        calls that overlap in time go to different lanes, because complete events
        on one thread must nest.  A call's phases are drawn inside its own span.

        Returns:
            ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.
        """
        records = self._snapshot()
        with self._lock:
            restored = list(self._restored)
        origin = min([_origin(records)] if records else [], default=0.0)
        origin = min([origin] + [t for _, t, _ in restored]) if restored else origin
        events: list[dict[str, Any]] = []
        groups = _groups(records)
        for pid, (group, members) in enumerate(groups, start=1):
            label = f"llm {group}" if group != MODULES_TRACK else "module calls"
            if members[0].worker is not None:
                label = f"worker {members[0].worker}"
            events.append(_meta("process_name", pid, None, {"name": label}))
            events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
            lanes = _assign_lanes(members, origin)
            for lane in range(max(lanes.values(), default=-1) + 1):
                tid = lane + 1
                lane_name = f"{group.removeprefix(_WORKER_PREFIX)} lane {tid}"
                events.append(_meta("thread_name", pid, tid, {"name": lane_name}))
                events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
            for record in members:
                tid = lanes[id(record)] + 1
                events.extend(_call_events(record, pid, tid, origin))
        pid = len(groups)
        batches = _batches(records)
        if batches:
            pid += 1
            events.append(_meta("process_name", pid, None, {"name": "batches"}))
            events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
            for tid, (batch_id, (start, end, calls, alias)) in enumerate(batches.items(), 1):
                events.append(_meta("thread_name", pid, tid, {"name": f"batch {batch_id}"}))
                events.append(
                    {
                        "name": f"batch {batch_id} ({calls} calls)",
                        "cat": "batch",
                        "ph": "X",
                        "ts": _us(start, origin),
                        "dur": _us(end, origin) - _us(start, origin),
                        "pid": pid,
                        "tid": tid,
                        "args": {"batch_id": batch_id, "calls": calls, "alias": alias},
                    }
                )
        if restored:
            pid += 1
            made = sum(len(calls) for _, _, calls in restored)
            label = f"checkpoint: {len(restored)} output(s) restored, 0 calls"
            if made:
                label += f" sent; the {made} earlier call(s) that made them drawn from its log"
            events.append(_meta("process_name", pid, None, {"name": label}))
            events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
            events.append(_meta("thread_name", pid, 1, {"name": "outputs from the checkpoint"}))
            events.extend(_restored_calls(restored, pid, origin))
            for index, at, _ in restored:
                events.append(
                    {
                        "name": f"input {index}: output from the checkpoint",
                        "cat": "checkpoint",
                        "ph": "i",
                        "s": "t",
                        "pid": pid,
                        "tid": 1,
                        "ts": _us(at, origin),
                        "args": {"input_index": index, "calls": 0, "outcome": "restored"},
                    }
                )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the trace as JSON to ``path`` (credentials scrubbed).

        Args:
            path: The file to write.

        Returns:
            The path written.
        """
        target = Path(path)
        text = scrub(json.dumps(self.trace(), separators=(",", ":")))
        target.write_text(text, encoding="utf-8")
        return target

    # -- the summary ---------------------------------------------------------------------
    def summary(self, top: int = 10) -> ProfileSummary:
        """Wall time, per-alias totals, the slowest calls and the critical path.

        Args:
            top: How many of the slowest calls to list.

        Returns:
            The summary.
        """
        records = self._snapshot()
        origin = _origin(records)
        wall = max((r.finish_time() for r in records), default=origin) - origin
        aliases: dict[str, AliasProfile] = {}
        for record in records:
            if record.type == "llm" and record.alias is not None:
                _add_call(aliases.setdefault(record.alias, AliasProfile(record.alias)), record)
        for alias, stats in aliases.items():
            requests = [
                (s.start, s.end)
                for r in records
                if r.type == "llm" and r.alias == alias
                for s in r.spans
                if s.kind == "request"
            ]
            stats.busy_s = _union_length(requests)
            if wall > 0:
                stats.busy_fraction = stats.busy_s / wall
                stats.mean_concurrency = stats.request_s / wall
        nodes = sorted(records, key=lambda r: r.finish_time() - r.start, reverse=True)
        return ProfileSummary(
            wall_s=wall,
            calls=len(records),
            aliases=dict(sorted(aliases.items())),
            slowest=[_node(r, origin) for r in nodes[:top]],
            critical_path=_critical_path(records, origin),
            cache_advice=self.cache_advice(),
        )

    def table(self, top: int = 10) -> Table:
        """The summary as one rich table (per alias, slowest calls, critical path).

        Args:
            top: How many of the slowest calls to list.

        Returns:
            A ``rich`` table, to print with ``rich.print``.
        """
        summary = self.summary(top)
        outer = Table(
            title=f"plait profile: {summary.calls} calls in {summary.wall_s:.3f} s",
            show_header=False,
            box=None,
        )
        outer.add_column()

        per_alias = Table(title="Endpoints", title_justify="left")
        per_alias.add_column("alias")
        for column in (
            *("calls", "busy", "mean conc.", "queue s", "rate wait s", "request s"),
            *("backoff s", "retries", "errors", "answered"),
        ):
            per_alias.add_column(column, justify="right")
        for a in summary.aliases.values():
            per_alias.add_row(
                a.alias,
                str(a.calls),
                f"{a.busy_fraction:.0%}",
                f"{a.mean_concurrency:.2f}",
                f"{a.queue_s:.3f}",
                f"{a.rate_wait_s:.3f}",
                f"{a.request_s:.3f}",
                f"{a.backoff_s:.3f}",
                str(a.retries),
                str(a.errors),
                str(a.answered),
            )

        slowest = Table(title=f"Slowest calls (top {top})", title_justify="left")
        for column in ("module", "input", "alias", "outcome", "start s", "duration s"):
            slowest.add_column(column, justify="right" if column.endswith(" s") else "left")
        for n in summary.slowest:
            slowest.add_row(
                n.name,
                _text(n.input_index),
                n.alias or "-",
                n.outcome,
                f"{n.start_s:.3f}",
                f"{n.duration_s:.3f}",
            )

        path = Table(title="Critical path", title_justify="left")
        for column in ("#", "module", "input", "alias", "start s", "end s", "waited s"):
            path.add_column(column, justify="left" if column in ("module", "alias") else "right")
        path.add_column("contributed s", justify="right")
        for i, link in enumerate(summary.critical_path, start=1):
            path.add_row(
                str(i),
                link.node.name,
                _text(link.node.input_index),
                link.node.alias or "-",
                f"{link.node.start_s:.3f}",
                f"{link.node.end_s:.3f}",
                f"{link.waited_s:.3f}",
                f"{link.contributed_s:.3f}",
            )

        outer.add_row(per_alias)
        outer.add_row(slowest)
        outer.add_row(path)
        return outer


# -- recording helpers ---------------------------------------------------------------------
def _shared_start(texts: list[str]) -> int:
    """How many leading characters every one of ``texts`` has in common."""
    shortest = min(texts, key=len)
    for position, char in enumerate(shortest):
        if any(text[position] != char for text in texts):
            return position
    return len(shortest)


def _prompt_of(msg: Message) -> str | None:
    """An LLM call's whole prompt as one text, for `Profiler.cache_advice`."""
    request = msg.kwargs.get("request")
    messages = getattr(request, "messages", None)
    if msg.type != "llm" or not isinstance(messages, list):
        return None
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def _alias_of(msg: Message) -> str | None:
    """The request's alias; None for module calls (and llm messages built without one)."""
    alias = getattr(msg.kwargs.get("request"), "alias", None)
    return alias if isinstance(alias, str) else None


def _copy(record: _Record) -> _Record:
    """A record detached from the hooks: an open call may still gain spans meanwhile."""
    spans = record.timing.spans if record.timing is not None else record.spans
    return _Record(
        record.type,
        record.name,
        record.node_id,
        record.input_index,
        record.alias,
        record.upstream,
        record.start,
        record.end,
        record.outcome,
        record.error,
        list(spans),
        worker=record.worker,
    )


def _origin(records: list[_Record]) -> float:
    """The first call's start: what came before it (tracing, setup) is not the run's time."""
    return min((r.start for r in records), default=0.0)


# -- trace helpers -------------------------------------------------------------------------
def _us(t: float, origin: float) -> int:
    """Whole microseconds from the origin, rounded one way for every timestamp.

    Durations are differences of rounded ends, never rounded themselves, and
    integers add up exactly, so a span that nests (or touches) in real time still
    does in the file, where viewers check it as ``ts + dur``.
    """
    return round(max(t - origin, 0.0) * 1e6)


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _groups(records: list[_Record]) -> list[tuple[str, list[_Record]]]:
    by_group: dict[str, list[_Record]] = {}
    for record in records:
        if record.worker is not None:  # a Ray worker's calls: one process per worker
            by_group.setdefault(f"{_WORKER_PREFIX}{record.worker}", []).append(record)
            continue
        group = record.alias or (MODULES_TRACK if record.type == "module" else _NO_ALIAS)
        by_group.setdefault(group, []).append(record)
    last = (_NO_ALIAS, MODULES_TRACK)
    names = sorted(g for g in by_group if g not in last) + [g for g in last if g in by_group]
    return [(name, by_group[name]) for name in names]


def _assign_lanes(records: list[_Record], origin: float) -> dict[int, int]:
    """Lane per record (by id), first fit in start order: overlapping calls never share one.

    Compared in rounded microseconds, the units the viewer checks nesting in.
    """
    lane_ends: list[int] = []
    lanes: dict[int, int] = {}
    for record in sorted(records, key=lambda r: (r.start, -r.finish_time())):
        start, end = _us(record.start, origin), _us(record.finish_time(), origin)
        for lane, lane_end in enumerate(lane_ends):
            if lane_end <= start:
                lane_ends[lane] = end
                lanes[id(record)] = lane
                break
        else:
            lanes[id(record)] = len(lane_ends)
            lane_ends.append(end)
    return lanes


def _call_events(record: _Record, pid: int, tid: int, origin: float) -> list[dict[str, Any]]:
    start, end = record.start, record.finish_time()
    ts = _us(start, origin)
    args: dict[str, Any] = {
        "node_id": record.node_id,
        "input_index": record.input_index,
        "outcome": record.outcome,
        "upstream": list(record.upstream),
    }
    if record.alias is not None:
        args["alias"] = record.alias
    if record.error is not None:
        args["error"] = record.error
    call: dict[str, Any] = {
        "name": record.name,
        "cat": record.type,
        "ph": "X",
        "ts": ts,
        "dur": _us(end, origin) - ts,
        "pid": pid,
        "tid": tid,
        "args": args,
    }
    if record.outcome in ("error", "unfinished"):
        call["cname"] = "terrible"
    events = [call]
    for span in record.spans:
        # Clamped into the call, so a span reported by a handler inside this one can't
        # break the nesting the format requires.
        s_start, s_end = max(span.start, start), min(span.end, end)
        if s_end < s_start or (span.kind == "queue" and s_end - s_start < _MIN_QUEUE_S):
            continue
        s_ts = _us(s_start, origin)
        event: dict[str, Any] = {
            "cat": span.kind,
            "ph": "X",
            "ts": s_ts,
            "dur": _us(s_end, origin) - s_ts,
            "pid": pid,
            "tid": tid,
            "args": {
                "node_id": record.node_id,
                "input_index": record.input_index,
                **{k: _jsonable(v) for k, v in span.info.items()},
            },
        }
        if span.kind == "request":
            failed = "error" in span.info
            event["name"] = "request failed" if failed else "request"
            event["args"]["status"] = "error" if failed else span.info.get("status", "ok")
            if failed:
                event["cname"] = "bad"
        elif span.kind == "batch":
            event["name"] = f"in batch {span.info.get('batch')}"
        elif span.kind == "queue":
            run_limit = span.info.get("limit") == "run"
            event["name"] = "queue (run limit)" if run_limit else "queue (endpoint)"
        else:
            event["name"] = _PHASE_NAMES.get(span.kind, span.kind)
        events.append(event)
    return events


def _restored_calls(
    restored: list[tuple[int | None, float, list[dict[str, Any]]]], pid: int, origin: float
) -> list[dict[str, Any]]:
    """The logged calls behind restored outputs, as spans on the checkpoint track (lanes
    from 2): each as long as it took when it was made, laid out as the earlier run ran
    them, its first call drawn where the first output was restored."""
    first = min(at for _, at, _ in restored)
    starts = [c["at"] for _, _, calls in restored for c in calls if isinstance(c.get("at"), int)]
    earliest = min(starts, default=0)
    records: list[_Record] = []
    made: dict[int, dict[str, Any]] = {}
    for index, at, calls in restored:
        for call in calls:
            logged = call.get("at")
            start = first + (logged - earliest) / 1e6 if isinstance(logged, int) else at
            took = call.get("us")
            end = start + (took / 1e6 if isinstance(took, int) and took > 0 else 0.0)
            node = str(call.get("node"))
            record = _Record(
                "llm", node.partition(":")[2] or node, node, index, None, (), start, end,
                outcome="restored",
            )  # fmt: skip
            records.append(record)
            made[id(record)] = call
    lanes = _assign_lanes(records, origin)
    events: list[dict[str, Any]] = []
    for lane in sorted(set(lanes.values())):
        name = f"calls that made them, lane {lane + 1}"
        events.append(_meta("thread_name", pid, lane + 2, {"name": name}))
    for record in records:
        call = made[id(record)]
        ts = _us(record.start, origin)
        args: dict[str, Any] = {
            "node_id": record.node_id,
            "input_index": record.input_index,
            "outcome": "restored",
            "restored": "from the checkpoint: made by an earlier run, not sent again",
        }
        if isinstance(call.get("at"), int):
            args["made_at"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(call["at"] / 1e6))
        if isinstance(call.get("usage"), list):
            args["tokens"] = call["usage"]
        if call.get("model"):
            args["model"] = call["model"]
        events.append(
            {
                "name": f"{record.name} (restored)",
                "cat": "checkpoint",
                "ph": "X",
                "ts": ts,
                "dur": _us(record.finish_time(), origin) - ts,
                "pid": pid,
                "tid": lanes[id(record)] + 2,
                "args": args,
            }
        )
    return events


def _batches(records: list[_Record]) -> dict[str, tuple[float, float, int, str | None]]:
    """Each provider batch that answered a recorded call: its submission, its end, how
    many of the calls it answered, and their alias."""
    found: dict[str, tuple[float, float, int, str | None]] = {}
    for record in records:
        for span in record.spans:
            if span.kind != "batch":
                continue
            batch_id = str(span.info.get("batch"))
            seen = found.get(batch_id)
            if seen is None:
                found[batch_id] = (span.start, span.end, 1, record.alias)
            else:
                found[batch_id] = (
                    min(seen[0], span.start),
                    max(seen[1], span.end),
                    seen[2] + 1,
                    seen[3],
                )
    return found


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


# -- summary helpers -----------------------------------------------------------------------
def _add_call(stats: AliasProfile, record: _Record) -> None:
    stats.calls += 1
    if record.outcome == "error":
        stats.errors += 1
    elif record.outcome not in ("ok", "unfinished"):
        stats.answered += 1
    for span in record.spans:
        length = max(span.end - span.start, 0.0)
        if span.kind == "queue":
            stats.queue_s += length
        elif span.kind == "rate_wait":
            stats.rate_wait_s += length
        elif span.kind == "backoff":
            stats.backoff_s += length
        elif span.kind == "request":
            stats.request_s += length
            stats.attempts += 1
            if "error" in span.info:
                stats.failed_attempts += 1
            # Attempt numbers restart for a structured re-ask, which is not a retry.
            if int(span.info.get("attempt", 1)) > 1:
                stats.retries += 1


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _node(record: _Record, origin: float) -> NodeProfile:
    end = record.finish_time()
    return NodeProfile(
        type=record.type,
        name=record.name,
        node_id=record.node_id,
        input_index=record.input_index,
        alias=record.alias,
        outcome=record.outcome,
        start_s=record.start - origin,
        end_s=end - origin,
        duration_s=end - record.start,
    )


def _critical_path(records: list[_Record], origin: float) -> list[PathLink]:
    """The chain of calls that ends at the last one to finish.

    Each step goes back to the upstream call (same input, same node id) that
    finished last; when several runs reused those ids, the one that finished
    before this call started.  Calls made inside an ``async def forward`` know no
    upstream within their own small graph, but they ran in program order: such a
    call waited on the sibling that finished last before it began, or, if it was
    the first, on whatever its enclosing module waited on.  A module whose forward
    made calls of its own is replaced by the last of them, where its time went.
    """
    walk = _Walk([r for r in records if r.node_id is not None])
    if not walk.located:
        return []
    chain: list[_Record] = []
    seen: set[int] = set()
    current: _Record | None = walk.innermost(max(walk.located, key=_Record.finish_time))
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        previous = walk.waited_on(current)
        current = walk.innermost(previous) if previous is not None else None
    chain.reverse()

    links: list[PathLink] = []
    previous_end = origin
    for record in chain:
        end = record.finish_time()
        links.append(
            PathLink(
                node=_node(record, origin),
                contributed_s=end - previous_end,
                waited_s=max(record.start - previous_end, 0.0),
            )
        )
        previous_end = end
    return links


class _Walk:
    """Lookups for `_critical_path`, over the records that have a node id."""

    def __init__(self, located: list[_Record]) -> None:
        self.located = located
        self.by_key: dict[tuple[int | None, str], list[_Record]] = {}
        self.by_parent: dict[tuple[int | None, str], list[_Record]] = {}
        for record in located:
            assert record.node_id is not None
            self.by_key.setdefault((record.input_index, record.node_id), []).append(record)
            if "/" in record.node_id:
                parent_id = record.node_id.rsplit("/", 1)[0]
                self.by_parent.setdefault((record.input_index, parent_id), []).append(record)

    def children(self, parent: _Record) -> list[_Record]:
        """Calls made by ``parent``'s forward (its node id, this run: inside its span)."""
        assert parent.node_id is not None
        return [
            r
            for r in self.by_parent.get((parent.input_index, parent.node_id), [])
            if r.start >= parent.start - _EPSILON_S
            and r.finish_time() <= parent.finish_time() + _EPSILON_S
        ]

    def enclosing(self, record: _Record) -> _Record | None:
        """The async-forward module call whose forward made ``record`` (None at top level)."""
        assert record.node_id is not None
        if "/" not in record.node_id:
            return None
        parent_id = record.node_id.rsplit("/", 1)[0]
        around = [
            r
            for r in self.by_key.get((record.input_index, parent_id), [])
            if r.start <= record.start + _EPSILON_S
            and r.finish_time() >= record.finish_time() - _EPSILON_S
        ]
        return max(around, key=lambda r: r.start) if around else None

    def innermost(self, record: _Record) -> _Record:
        inner = self.children(record)
        while inner:
            record = max(inner, key=_Record.finish_time)
            inner = self.children(record)
        return record

    def waited_on(self, record: _Record) -> _Record | None:
        """The call ``record`` was last waiting for before it could start."""
        current: _Record | None = record
        while current is not None:
            if current.upstream:
                return _latest_before(
                    [
                        r
                        for node_id in current.upstream
                        for r in self.by_key.get((current.input_index, node_id), [])
                    ],
                    current.start,
                )
            parent = self.enclosing(current)
            if parent is None:
                return None
            earlier = _latest_before(
                [r for r in self.children(parent) if r is not current], current.start
            )
            if earlier is not None:
                return earlier
            current = parent
        return None


def _latest_before(candidates: list[_Record], start: float) -> _Record | None:
    done = [r for r in candidates if r.finish_time() <= start + _EPSILON_S]
    return max(done, key=_Record.finish_time) if done else None


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)
