"""LLM calls through a provider's batch API: gathered, submitted, polled, handed back.

A batch run (`backend="batch"`, ``plait run --batch-api``) runs the pipeline as any
run does: the engine starts each call the moment its inputs exist and every handler
sees it.  Only the default action's last step differs: the endpoint's provider is a
`BatchProvider`, whose ``send`` puts the request in its endpoint's `BatchQueue`
and waits for the reply.  The queue gathers the calls that are ready into batches
within the provider's limits (count and bytes), submitting one when it is full, when
no call has joined it for ``batch_idle_s`` (the stage has stopped growing) or when its
first call has waited ``batch_max_wait_s``; it polls each batch with backoff and
hands every result to its call.  The next stage's calls then become
ready and go in the next batch.  Retries, structured-output re-asks, usage, the
budget's admission: all of it is the endpoint's, as for a call sent online.

**Nothing paid twice.**  The `BatchLedger` is the batch API's half of a checkpoint
(``batches.jsonl`` in the run's checkpoint directory).  Before a batch is
submitted it records the batch's calls under a token of plait's own; the batch's
id once the provider has it; and each result as it is downloaded.  A resumed run's
calls find their requests there: a downloaded result is handed over, a submitted
call waits for its batch, and only a call found nowhere goes in a new batch.  A run
killed while submitting asks the provider for a batch carrying its token
(`BatchAPI.find`) before it submits those calls again.

A request's place in the ledger is its fingerprint and its occurrence (the n-th
identical request of the run): identical requests are interchangeable, so a
resumed run that asks them in another order still finds each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait._jsonl import loads, text_line, whole_lines
from plait.providers.base import (
    BatchAPI,
    BatchStatus,
    LLMRequest,
    LLMResponse,
    ProviderError,
    Usage,
)
from plait.resources.config import EndpointConfig
from plait.resources.endpoint import Endpoint, backoff_delay
from plait.resources.limits import PriorityLimiter
from plait.resources.manager import ResourceManager
from plait.resources.rate import RateGovernor
from plait.resources.usage import AliasUsage

__all__ = [
    "BatchLedger",
    "BatchProvider",
    "BatchQueue",
    "BatchResources",
    "BatchesInFlight",
    "batches_in_flight",
]

_log = logging.getLogger("plait")

#: Failed attempts in a row at submitting one batch, or at reading one's status, before
#: its calls are failed (a submission is asked after with `BatchAPI.find` first).
_SUBMIT_ATTEMPTS = 4
_POLL_FAILURES = 8


@dataclass(slots=True)
class _Entry:
    """One request submitted (or about to be) in a batch."""

    fingerprint: str
    token: str
    #: Its outcome once downloaded: ``{"r": reply}`` or ``{"e": error}``.
    outcome: dict[str, Any] | None = None
    delivered: bool = False


@dataclass(slots=True)
class _Batch:
    token: str
    alias: str
    at: float
    ids: list[str]
    batch_id: str | None = None
    ended: bool = False
    abandoned: bool = False
    #: When this process submitted it and saw it end (`time.monotonic`), for profiles.
    submitted_at: float | None = None
    ended_at: float | None = None


@dataclass
class BatchLedger:
    """What was submitted in which batch, and what came back (see the module docstring).

    Append-only JSON lines, each written with one ``write`` on an ``O_APPEND``
    descriptor, so a kill leaves whole records and at most a torn last line, which
    the next open drops; the records a resume depends on (a batch's calls, its id)
    are flushed to the disk before the provider is asked anything.  ``path`` None
    keeps it in memory: a run without a checkpoint cannot resume.
    """

    path: Path | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)
    batches: dict[str, _Batch] = field(default_factory=dict)
    #: fingerprint -> custom ids, in the order they were made.
    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    _fd: int | None = None

    def open(self) -> BatchLedger:
        """Read what is recorded, and append from here on."""
        if self.path is None or self._fd is not None:
            return self
        self.load(cut=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self

    def load(self, *, cut: bool = False) -> BatchLedger:
        """Read what is recorded.  With ``cut`` a torn last line is cut off the file (the
        ledger is about to be appended to); without, it is skipped (`plait status`
        reads a ledger a run may be writing)."""
        if self.path is not None and self.path.exists():
            if cut:
                raw = whole_lines(self.path)
            else:
                raw = self.path.read_bytes()
                raw = raw[: raw.rfind(b"\n") + 1]
            for number, line in enumerate(raw.splitlines(), 1):
                try:
                    self._apply(loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ProviderError(
                        f"{self.path} line {number} is corrupt ({exc}); remove that line, or "
                        "the file, to start the batches over (results not recorded are paid "
                        "for again)"
                    ) from None
        return self

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- records --------------------------------------------------------------------------
    def _write(self, record: dict[str, Any], *, sync: bool = False) -> None:
        self._apply(record)
        if self._fd is None:
            return
        data = memoryview(text_line(record))
        while data:
            data = data[os.write(self._fd, data) :]
        if sync:
            os.fsync(self._fd)

    def _apply(self, record: Any) -> None:
        """Take one record into the ledger; a record of the wrong shape (a hand edit, a
        damaged disk) is a ValueError or TypeError saying what is wrong with it."""
        if not isinstance(record, dict):
            raise TypeError(f"a record is a JSON object, not a {type(record).__name__}")
        kind = record.get("t")
        if kind == "intent":
            token, alias = _field(record, "b", str), _field(record, "alias", str)
            at = _field(record, "at", (int, float))
            calls = _field(record, "calls", list)
            if not all(_is_pair(call) for call in calls):
                raise TypeError("its 'calls' are not [custom id, fingerprint] pairs")
            self.batches[token] = _Batch(token, alias, float(at), [i for i, _ in calls])
            for custom_id, fingerprint in calls:
                self.entries[custom_id] = _Entry(fingerprint, token)
                self.by_fingerprint.setdefault(fingerprint, []).append(custom_id)
        elif kind == "submitted":
            self._batch(record).batch_id = _field(record, "id", str)
        elif kind == "result":
            outcome = _field(record, "o", dict)
            _outcome_of(outcome)  # a reply or an error that can be read back, else it raises
            entry = self.entries.get(_field(record, "id", str))
            if entry is not None:
                entry.outcome = outcome
        elif kind == "ended":
            self._batch(record).ended = True
        elif kind == "abandoned":
            batch = self._batch(record)
            batch.abandoned = True
            for custom_id in batch.ids:
                entry = self.entries.get(custom_id)
                if entry is not None and entry.outcome is None:
                    entry.outcome = {"e": {"m": "never submitted", "retry": True}}
        elif kind == "delivered":
            entry = self.entries.get(_field(record, "id", str))
            if entry is not None:
                entry.delivered = True
        else:
            raise ValueError(f"unknown record type {kind!r}")

    def _batch(self, record: dict[str, Any]) -> _Batch:
        token = _field(record, "b", str)
        batch = self.batches.get(token)
        if batch is None:
            raise ValueError(f"no batch {token!r} was recorded before it")
        return batch

    def new_id(self, fingerprint: str) -> str:
        """A custom id for another occurrence of the request ``fingerprint``."""
        return f"p{fingerprint}-{len(self.by_fingerprint.get(fingerprint, ()))}"

    def intent(self, token: str, alias: str, calls: list[tuple[str, str]]) -> None:
        record = {"t": "intent", "b": token, "alias": alias, "at": time.time(), "calls": calls}
        self._write(record, sync=True)

    def submitted(self, token: str, batch_id: str) -> None:
        self._write({"t": "submitted", "b": token, "id": batch_id}, sync=True)

    def result(self, custom_id: str, outcome: LLMResponse | ProviderError) -> None:
        self._write({"t": "result", "id": custom_id, "o": _outcome_json(outcome)})

    def ended(self, token: str) -> None:
        self._write({"t": "ended", "b": token})

    def abandoned(self, token: str) -> None:
        self._write({"t": "abandoned", "b": token}, sync=True)

    def delivered(self, custom_id: str) -> None:
        self._write({"t": "delivered", "id": custom_id})

    # -- questions -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Batches and their calls by state, for `plait status`."""
        batches = {"submitting": 0, "pending": 0, "ended": 0, "abandoned": 0}
        calls = {"pending": 0, "succeeded": 0, "failed": 0}
        pending_ids = []
        for batch in self.batches.values():
            if batch.abandoned:
                batches["abandoned"] += 1
                continue
            state = "ended" if batch.ended else "pending" if batch.batch_id else "submitting"
            batches[state] += 1
            if state != "ended":
                pending_ids.append(batch.batch_id or f"(token {batch.token})")
            for custom_id in batch.ids:
                outcome = self.entries[custom_id].outcome
                kind = "pending" if outcome is None else "succeeded" if "r" in outcome else "failed"
                calls[kind] += 1
        return {"batches": batches, "calls": calls, "unfinished": pending_ids}

    def unfinished(self) -> list[_Batch]:
        """Batches whose results are not all in: submitted (or perhaps submitted)."""
        return [b for b in self.batches.values() if not b.ended and not b.abandoned]

    def claimable(self, fingerprint: str, claimed: set[str]) -> str | None:
        """The entry a call of ``fingerprint`` should take over, if any: a result not
        handed to anyone, then a call still in a batch, then a result that was handed
        over (a run killed after handing it over, before its checkpoint kept it)."""
        ids = [i for i in self.by_fingerprint.get(fingerprint, ()) if i not in claimed]
        best = min(ids, key=lambda i: self._rank(self.entries[i]), default=None)
        return best if best is not None and self._rank(self.entries[best]) < 3 else None

    def _rank(self, entry: _Entry) -> int:
        batch = self.batches[entry.token]
        if entry.outcome is not None and "r" in entry.outcome:
            return 2 if entry.delivered else 0
        if entry.outcome is None and not batch.abandoned and not batch.ended:
            return 1
        return 3  # failed, or its batch ended without it: a new request is needed


def _field(record: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``record[name]``, which must be of ``kind`` (a bool is no number here)."""
    if name not in record:
        raise ValueError(f"its {name!r} is missing")
    value = record[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"its {name!r} is a {type(value).__name__}")
    return value


def _is_pair(call: Any) -> bool:
    """Whether a batch's call is (custom id, fingerprint): a list read back, a tuple made."""
    return isinstance(call, list | tuple) and len(call) == 2 and all(type(x) is str for x in call)


def _outcome_json(outcome: LLMResponse | ProviderError) -> dict[str, Any]:
    if isinstance(outcome, LLMResponse):
        used = outcome.usage
        return {
            "r": {
                "text": outcome.text,
                "usage": [
                    used.prompt_tokens,
                    used.completion_tokens,
                    used.cache_read_tokens,
                    used.cache_write_tokens,
                    used.cache_write_1h_tokens,
                ],
                "model": outcome.model,
                "finish": outcome.finish_reason,
            }
        }
    return {"e": {"m": str(outcome), "status": outcome.status, "retry": outcome.retryable}}


def _outcome_of(data: dict[str, Any]) -> LLMResponse | ProviderError:
    if "r" in data:
        reply = data["r"]
        return LLMResponse(
            text=str(reply["text"]),
            usage=Usage(*(int(n) for n in reply["usage"])),
            model=str(reply.get("model") or ""),
            finish_reason=reply.get("finish"),
            tier="batch",
        )
    error = data["e"]
    return ProviderError(
        str(error["m"]), status=error.get("status"), retryable=bool(error["retry"])
    )


@dataclass(slots=True)
class _Waiting:
    custom_id: str
    line: bytes
    future: asyncio.Future[LLMResponse | ProviderError]


class BatchQueue:
    """One endpoint's batch traffic in one run: the calls waiting to be submitted, the
    batches being polled, and the ledger that makes it all resumable."""

    def __init__(
        self,
        api: BatchAPI,
        ledger: BatchLedger,
        alias: str,
        config: EndpointConfig,
        usage: AliasUsage,
    ) -> None:
        self.api = api
        self.ledger = ledger
        self.alias = alias
        self.config = config
        self.usage = usage
        self._pending: list[_Waiting] = []
        self._pending_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        #: When the first and the latest of the waiting calls joined (`time.monotonic`).
        self._first_added = self._last_added = 0.0
        #: custom id -> the call waiting for it (submitted, or found in the ledger).
        self._awaiting: dict[str, asyncio.Future[LLMResponse | ProviderError]] = {}
        self._claimed: set[str] = set()
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._submissions: set[asyncio.Task[None]] = set()
        #: custom id -> fingerprint of the calls waiting to be submitted.
        self._fingerprint_of: dict[str, str] = {}
        #: token -> the question, asked once, whether a batch recorded as about to be
        #: submitted (by a run killed then) reached the provider.
        self._asking: dict[str, asyncio.Future[None]] = {}

    async def send(self, request: LLMRequest) -> LLMResponse:
        """The reply to ``request``, from a batch (one made now, or one a previous run of
        the same checkpoint submitted)."""
        fingerprint = request.fingerprint(self.config.model)
        custom_id = self.ledger.claimable(fingerprint, self._claimed)
        while custom_id is not None:
            batch = self.ledger.batches[self.ledger.entries[custom_id].token]
            if batch.batch_id is not None or batch.ended or batch.abandoned:
                break
            await self._ask_submitted(batch)  # then its entries are claimable, or not
            custom_id = self.ledger.claimable(fingerprint, self._claimed)
        loop = asyncio.get_running_loop()
        if custom_id is not None:
            self._claimed.add(custom_id)
            entry = self.ledger.entries[custom_id]
            if entry.outcome is not None and "r" in entry.outcome:
                outcome: LLMResponse | ProviderError = _outcome_of(entry.outcome)
            else:
                future = self._awaiting[custom_id] = loop.create_future()
                self._poll(self.ledger.batches[entry.token])
                outcome = await future
        else:
            custom_id = self.ledger.new_id(fingerprint)
            self._claimed.add(custom_id)
            line = self.api.line(custom_id, request)
            if len(line) > self.api.max_bytes:
                raise ProviderError(
                    f"{self.alias}: the request is {len(line):,} bytes as a batch item, more "
                    f"than a batch may hold ({self.api.max_bytes:,}); shorten it or run this "
                    "alias online"
                )
            future = loop.create_future()
            self._add(_Waiting(custom_id, line, future), fingerprint)
            outcome = await future
        self.ledger.delivered(custom_id)
        if isinstance(outcome, ProviderError):
            raise outcome
        batch = self.ledger.batches[self.ledger.entries[custom_id].token]
        if batch.batch_id and batch.submitted_at is not None and batch.ended_at is not None:
            outcome.batch = (batch.batch_id, batch.submitted_at, batch.ended_at)
        return outcome

    async def _ask_submitted(self, batch: _Batch) -> None:
        """Settle whether ``batch``, recorded as about to be submitted by a run that was
        killed, reached the provider: its id is recorded, or it is marked abandoned."""
        asked = self._asking.get(batch.token)
        if asked is None:
            asked = self._asking[batch.token] = asyncio.get_running_loop().create_future()
            try:
                found = await self._find(batch)
            except BaseException as exc:
                asked.set_exception(exc)
                raise
            if found is None:
                self.ledger.abandoned(batch.token)
            else:
                self.ledger.submitted(batch.token, found)
            asked.set_result(None)
        await asyncio.shield(asked)

    # -- gathering and submitting ------------------------------------------------------
    def _add(self, waiting: _Waiting, fingerprint: str) -> None:
        # Its fingerprint is written with the batch's intent; until then, occurrences are
        # counted here so two identical requests waiting together get two ids.
        self.ledger.by_fingerprint.setdefault(fingerprint, []).append(waiting.custom_id)
        self._fingerprint_of[waiting.custom_id] = fingerprint
        if self._pending and (
            len(self._pending) + 1 > self.api.max_requests
            or self._pending_bytes + len(waiting.line) > self.api.max_bytes
        ):
            self._flush()
        self._pending.append(waiting)
        self._pending_bytes += len(waiting.line)
        now = time.monotonic()
        self._last_added = now
        if len(self._pending) >= self.api.max_requests:
            self._flush()
        elif self._timer is None:
            self._first_added = now
            first = min(self.config.batch_idle_s, self.config.batch_max_wait_s)
            self._timer = asyncio.get_running_loop().call_later(first, self._when_due)

    def _when_due(self) -> None:
        """Submit the waiting calls if no call has joined them for ``batch_idle_s``, or
        the first has waited ``batch_max_wait_s``; else look again when one of those
        comes (one timer per batch, however many calls join it)."""
        config, now = self.config, time.monotonic()
        due = min(
            self._last_added + config.batch_idle_s, self._first_added + config.batch_max_wait_s
        )
        if now >= due:
            self._flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(due - now, self._when_due)

    def _flush(self) -> None:
        """Submit what is waiting as one batch (in the background)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        batch, self._pending, self._pending_bytes = self._pending, [], 0
        task = asyncio.get_running_loop().create_task(self._submit(batch))
        self._submissions.add(task)
        task.add_done_callback(self._submissions.discard)

    async def _submit(self, calls: list[_Waiting]) -> None:
        token = secrets.token_hex(8)
        pairs = [(w.custom_id, self._fingerprint_of.pop(w.custom_id)) for w in calls]
        for custom_id, fingerprint in pairs:  # the intent record counts them from now on
            self.ledger.by_fingerprint[fingerprint].remove(custom_id)
        self.ledger.intent(token, self.alias, pairs)
        for waiting in calls:
            self._awaiting[waiting.custom_id] = waiting.future
        record = self.ledger.batches[token]
        lines = [w.line for w in calls]
        batch_id: str | None = None
        failure: ProviderError | None = None
        for attempt in range(1, _SUBMIT_ATTEMPTS + 1):
            try:
                batch_id = await self.api.submit(lines, token)
                break
            except ProviderError as exc:
                failure = exc
            except Exception as exc:  # the wire code failed: the calls hear why, never hang
                failure = ProviderError(f"{type(exc).__name__}: {exc}")
            # The request may have reached the provider before the error did.
            batch_id = await self._find(record)
            if batch_id is not None or not failure.retryable or attempt == _SUBMIT_ATTEMPTS:
                break
            await asyncio.sleep(backoff_delay(attempt, None))
        if batch_id is None:
            self.ledger.abandoned(token)
            assert failure is not None
            error = ProviderError(
                f"{self.alias}: submitting a batch of {len(calls)} calls failed: {failure}",
                status=failure.status,
                retryable=failure.retryable,
            )
            for waiting in calls:
                self._hand_over(waiting.custom_id, error)
            return
        self.ledger.submitted(token, batch_id)
        record.submitted_at = time.monotonic()
        self.usage.batches += 1
        _log.info("plait: %s: submitted batch %s of %d calls", self.alias, batch_id, len(calls))
        self._poll(record)

    async def _find(self, batch: _Batch) -> str | None:
        """The id of ``batch`` if the provider has it (a minute's slack for clocks)."""
        try:
            return await self.api.find(batch.token, batch.at - 60, len(batch.ids))
        except Exception:  # unknown: the caller submits (or gives up) as if it were not
            return None

    # -- polling and handing back ---------------------------------------------------------
    def _poll(self, batch: _Batch) -> None:
        if batch.token in self._pollers:
            return
        task = asyncio.get_running_loop().create_task(self._follow(batch))
        self._pollers[batch.token] = task

    async def _follow(self, batch: _Batch) -> None:
        """Poll ``batch`` until it ends, then hand each result to its call."""
        try:
            status = await self._wait_for_end(batch)
            batch.ended_at = time.monotonic()
            seen: set[str] = set()
            async for custom_id, outcome in self.api.results(status):
                if custom_id not in self.ledger.entries or custom_id in seen:
                    continue
                seen.add(custom_id)
                if self.ledger.entries[custom_id].outcome is None:
                    self.ledger.result(custom_id, outcome)
                self._hand_over(custom_id, outcome)
            missing = [i for i in batch.ids if i not in seen]
            if missing:
                if status.problem is not None:
                    why = f"the batch {status.state or 'failed'}: {status.problem}"
                    retry = status.problem_retryable
                else:
                    why = f"it ended ({status.state}) without a result for the call"
                    retry = True
                for custom_id in missing:
                    error = ProviderError(f"batch {batch.batch_id}: {why}", retryable=retry)
                    if self.ledger.entries[custom_id].outcome is None:
                        self.ledger.result(custom_id, error)
                    self._hand_over(custom_id, error)
            self.ledger.ended(batch.token)
        except ProviderError as exc:
            self._fail(batch, str(exc), retry=False)
        except Exception as exc:  # a reply the wire code could not read: never a hang
            self._fail(batch, f"its results could not be read ({type(exc).__name__}: {exc})",
                       retry=False)  # fmt: skip
        finally:
            self._pollers.pop(batch.token, None)

    async def _wait_for_end(self, batch: _Batch) -> BatchStatus:
        pause, failures = self.config.batch_poll_s, 0
        assert batch.batch_id is not None
        while True:
            try:
                status = await self.api.status(batch.batch_id)
                failures = 0
            except ProviderError as exc:
                failures += 1
                if not exc.retryable or failures >= _POLL_FAILURES:
                    raise ProviderError(
                        f"reading the status of batch {batch.batch_id} failed: {exc} (the "
                        "batch is kept in the checkpoint: run again to collect it)"
                    ) from exc
                status = None
            if status is not None and status.ended:
                return status
            await asyncio.sleep(pause * random.uniform(0.8, 1.0))
            pause = min(pause * 1.5, self.config.batch_poll_max_s)

    def _fail(self, batch: _Batch, why: str, *, retry: bool) -> None:
        for custom_id in batch.ids:
            self._hand_over(
                custom_id, ProviderError(f"batch {batch.batch_id}: {why}", retryable=retry)
            )

    def _hand_over(self, custom_id: str, outcome: LLMResponse | ProviderError) -> None:
        future = self._awaiting.pop(custom_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    async def aclose(self) -> None:
        """Stop following batches nobody waits for any more, and submit nothing new."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in [*self._pollers.values(), *self._submissions]:
            task.cancel()
        for task in [*self._pollers.values(), *self._submissions]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class BatchProvider:
    """A `Provider` whose one attempt is a place in its endpoint's next batch."""

    def __init__(self, queue: BatchQueue) -> None:
        self.queue = queue

    def __repr__(self) -> str:
        return f"BatchProvider(alias={self.queue.alias!r})"

    async def send(self, request: LLMRequest) -> LLMResponse:
        return await self.queue.send(request)


#: Calls one batch endpoint lets wait at once: a batch call holds no connection, so
#: its bound is the provider's (requests per batch, batches queued), not a slot count.
_UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class BatchesInFlight:
    """Where the calls of this process's batch runs are (`batches_in_flight`)."""

    #: (alias, batch id, calls) of each batch submitted and not ended: at the provider.
    pending: list[tuple[str, str, int]]
    #: Batches being submitted (recorded, no id yet).
    submitting: int
    #: Calls gathered for a batch not submitted yet.
    waiting: int


#: The batch runs going on in this process, for `batches_in_flight`.
_RUNNING: set[BatchResources] = set()


def batches_in_flight() -> BatchesInFlight | None:
    """The batches this process's batch runs have pending at their providers, and the
    calls still gathering for one; None when no batch run is going on.  Safe to call
    from another thread than the runs' (a progress display): it only reads."""
    runs = list(_RUNNING)
    if not runs:
        return None
    pending: list[tuple[str, str, int]] = []
    submitting = waiting = 0
    ledgers = {id(run.ledger): run.ledger for run in runs}
    for ledger in ledgers.values():
        for batch in _snapshot(ledger.batches):
            if batch.ended or batch.abandoned:
                continue
            if batch.batch_id is None:
                submitting += 1
            else:
                pending.append((batch.alias, batch.batch_id, len(batch.ids)))
    for run in runs:
        waiting += sum(len(queue._pending) for queue in list(run.queues))
    return BatchesInFlight(pending, submitting, waiting)


def _snapshot(batches: dict[str, _Batch]) -> list[_Batch]:
    """The values of a dict the run's loop thread may be adding to meanwhile."""
    for _ in range(8):
        try:
            return list(batches.values())
        except RuntimeError:  # it changed size while being copied: copy again
            continue
    return []


class BatchResources(ResourceManager):
    """The aliases of ``resources``, each sending through its provider's batch API.

    Same configuration (so a checkpoint sees the same producer), other endpoints: a
    `BatchProvider` on a queue per alias, no concurrency slots or rate pacing (a batch
    holds no connection and is not paced per request), priced at the batch tier.
    """

    def __init__(self, resources: ResourceManager, ledger: BatchLedger) -> None:
        super().__init__(resources.config)
        self.ledger = ledger
        self.queues: list[BatchQueue] = []
        #: The live endpoints that embedding requests go to, by alias.
        self._online: dict[str, Endpoint] = {}
        _RUNNING.add(self)

    def endpoint_for(self, request: LLMRequest) -> Endpoint:
        """A chat call's place in its alias's next batch; an embedding request (a pool's
        demonstrations ranked by an embedding alias) goes to the alias's live endpoint,
        as a batch API takes chat completions only here."""
        if not request.embed:
            return self.endpoint(request.alias)
        found = self._online.get(request.alias)
        if found is None:
            found = self._online[request.alias] = ResourceManager._make_endpoint(
                self, request.alias, *self._settings(request.alias)
            )
        return found

    def _make_endpoint(self, alias: str, config: EndpointConfig, usage: AliasUsage) -> Endpoint:
        from plait.providers import make_batch_api

        self.ledger.open()  # here, once the run holds its checkpoint's lock
        if config.deployments:
            # A batch API has its own quota, far above a deployment's rate: the alias's
            # batches go through its first deployment.
            config = config.deployment_configs()[0]
        queue = BatchQueue(make_batch_api(config), self.ledger, alias, config, usage)
        self.queues.append(queue)
        limiter = PriorityLimiter(_UNBOUNDED)
        governor = RateGovernor(limiter, _UNBOUNDED, None, None)
        return Endpoint(alias, config, limiter, governor, BatchProvider(queue), usage, tier="batch")

    async def aclose(self) -> None:
        _RUNNING.discard(self)
        for queue in self.queues:
            await queue.aclose()
