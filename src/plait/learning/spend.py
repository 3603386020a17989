"""What a training run spends its calls on: the phase each call is made in.

A run's calls serve different ends: running the minibatch, proposing new values
(an instruction rewriter, a reflection), evaluating candidates on examples, and
scoring the held-out test set once training ends.  Optimizers and the `Trainer`
mark each stretch of work with `phase`, so what was spent can be told apart per
step and per optimizer; `current_phase` is what a call made now belongs to.

`SpendLedger` counts what was paid: a handler the `Trainer` keeps on the stack for
its run, told by each call's endpoint of every request really sent and of what its
reply used, filed under the call's phase and the account (step, optimizer) the
trainer set around it.  Why a handler and not usage read before and after each
phase: the phase travels with each call (context variables follow it into every
task it starts), so calls of different phases that run at the same time are told
apart exactly, and a call a cache, a mock or a checkpoint's log answers never
reaches an endpoint, so it is never counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plait.effects import Handler, Message
from plait.resources.endpoint import attach_gate

if TYPE_CHECKING:
    from plait.providers.base import LLMRequest, Usage
    from plait.resources.endpoint import Endpoint
    from plait.resources.pricing import Prices

__all__ = ["PHASES", "Spend", "SpendLedger", "current_phase", "phase", "total"]

#: The phases a training run's calls are counted under.
PHASES = ("training", "proposing", "evaluating", "testing")

_CURRENT: ContextVar[str | None] = ContextVar("plait_training_phase", default=None)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the calls made inside the block (and the tasks it starts) under ``name``.

    Phases nest: the innermost one is the phase of a call.

    Args:
        name: One of `PHASES`.

    Yields:
        Nothing; the block runs in the phase.

    Raises:
        ValueError: ``name`` is not one of `PHASES`.
    """
    if name not in PHASES:
        raise ValueError(f"unknown training phase {name!r}: use one of {', '.join(PHASES)}")
    token = _CURRENT.set(name)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_phase() -> str | None:
    """The phase a call made now is counted under (None outside every `phase` block).

    Returns:
        The innermost enclosing phase's name, or None.
    """
    return _CURRENT.get()


# -- what was paid: the ledger -----------------------------------------------------------------
#: What a call is made for, set by the `Trainer` around each stretch of its work: a
#: tuple such as ``("step", 3, 0)`` (step 3, its first optimizer).  The ledger files
#: each request under it and the call's phase.
_ACCOUNT: ContextVar[tuple[Any, ...] | None] = ContextVar("plait_spend_account", default=None)


@dataclass(slots=True)
class Spend:
    """What some requests cost: how many were sent, their tokens and their dollars.

    Only requests that reached an endpoint count: a call answered by a cache, a mock
    or a checkpoint's log costs nothing.  A retry and a structured output's re-ask
    are requests of their own, as the endpoint's usage counts them.

    Attributes:
        requests: Requests sent to an endpoint (a failed one included).
        input_tokens: Prompt tokens of their replies.
        output_tokens: Completion tokens of their replies.
        dollars: Their cost at the endpoints' configured prices; None when some
            request went to an endpoint with no price configured (its cost is not
            known), 0 for one priced at zero.
    """

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dollars: float | None = 0.0

    def add(self, other: Spend) -> None:
        """Add ``other`` in (an unknown cost makes the sum's cost unknown).

        Args:
            other: The spend to add.
        """
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        if self.dollars is None or other.dollars is None:
            self.dollars = None
        else:
            self.dollars += other.dollars

    def minus(self, other: Spend) -> Spend:
        """What this spend has beyond ``other``, an earlier count of the same requests.

        Args:
            other: The earlier count.

        Returns:
            The difference (an unknown cost stays unknown).
        """
        dollars = (
            None if self.dollars is None or other.dollars is None else self.dollars - other.dollars
        )
        return Spend(
            self.requests - other.requests,
            self.input_tokens - other.input_tokens,
            self.output_tokens - other.output_tokens,
            dollars,
        )

    @property
    def tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        """The spend as plain data (``dollars`` null when unknown).

        Dollars are rounded to 12 decimals: they are a sum of floats added in the
        order the replies came back, and the same requests must give the same
        account whatever that order (0.109, not 0.10900000000000001 on one run).

        Returns:
            Its fields, by name.
        """
        data = asdict(self)
        if self.dollars is not None:
            data["dollars"] = round(self.dollars, 12)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spend:
        """Read what `to_json` wrote.

        Args:
            data: The spend as plain data.

        Returns:
            The spend.
        """
        dollars = data.get("dollars", 0.0)
        return cls(
            int(data.get("requests", 0)),
            int(data.get("input_tokens", 0)),
            int(data.get("output_tokens", 0)),
            None if dollars is None else float(dollars),
        )


def total(spends: Iterable[Spend]) -> Spend:
    """The sum of ``spends``.

    Args:
        spends: What to add up.

    Returns:
        Their sum (zero for none).
    """
    summed = Spend()
    for spend in spends:
        summed.add(spend)
    return summed


@contextlib.contextmanager
def account(key: tuple[Any, ...]) -> Iterator[None]:
    """File the requests made inside the block (and the tasks it starts) under ``key``."""
    token = _ACCOUNT.set(key)
    try:
        yield
    finally:
        _ACCOUNT.reset(token)


#: A ledger's entries are kept by (account, phase).
Label = tuple[tuple[Any, ...] | None, str | None]


class _Gate:
    """One call a ledger watches, told by its endpoint of every request it sends
    (`plait.resources.endpoint.AdmissionGate`): admission (the request is about to be
    sent) counts the request, so one in flight when the process is killed is counted
    too; settlement adds what its reply used, at the endpoint's prices."""

    __slots__ = ("label", "ledger", "prices", "tier")

    def __init__(self, ledger: SpendLedger, label: Label) -> None:
        self.ledger = ledger
        self.label = label
        self.prices: Prices | None = None
        self.tier = "standard"

    async def admit(self, endpoint: Endpoint, request: LLMRequest, estimate: Usage) -> None:
        prices = self.prices = endpoint.usage.prices
        self.tier = endpoint.tier
        self.ledger.add(self.label, Spend(1, dollars=0.0 if prices.known else None))

    def settle(self, usage: Usage | None) -> None:
        if usage is None:  # it failed: the request was counted, nothing more is known
            return
        prices = self.prices
        dollars = prices.cost(usage, self.tier) if prices is not None and prices.known else None
        self.ledger.add(self.label, Spend(0, usage.prompt_tokens, usage.completion_tokens, dollars))

    def withdraw(self) -> None:
        # Admitted, then not sent after all (another gate refused it, or it was cancelled).
        self.ledger.add(self.label, Spend(-1))


class SpendLedger(Handler):
    """Counts what was paid, by account and phase: requests, tokens and dollars.

    On the handler stack it watches every LLM call and is told by the call's endpoint
    of each request it really sends and what the reply used (the `AdmissionGate` a
    `plait.handlers.budget` uses), so a call answered by a cache, a mock, a replay
    or a checkpoint's log is never counted, wherever those handlers sit.  Each
    request is filed under the account and phase (`phase`) in force where its call
    was made: context variables follow the call into every task it runs in, so
    concurrent calls of different phases are told apart exactly, which reading the
    process's usage counters before and after a stretch of work could not do.  On
    Ray workers (where context variables do not travel) each pass's calls are
    filed under the account and phase in force where the pass was sent, and each
    worker's counts come back with its results (`plait.ray.handlers`).

    Args:
        label: File every request under this (account, phase) instead of reading
            them from the context: a worker's copy, for one pass.
    """

    def __init__(self, label: Label | None = None) -> None:
        self.fixed = label
        self._lock = threading.Lock()
        self._entries: dict[Label, Spend] = {}
        #: Where each request is appended as it is paid, so a killed run's spending
        #: since its last checkpoint is not lost (`keep_log`).
        self._log: int | None = None
        #: Each label's start of a log line, made once.
        self._prefixes: dict[Label, str] = {}
        #: Reports made (a worker's copy), so the driver keeps the latest.
        self._reports = 0

    def process_llm(self, msg: Message) -> None:
        """Watch a call that may be sent: its endpoint will tell what each request cost.

        Args:
            msg: The LLM call's message.
        """
        label = self.fixed if self.fixed is not None else (_ACCOUNT.get(), current_phase())
        attach_gate(msg, self, lambda: _Gate(self, label))

    def label(self) -> Label:
        """The account and phase in force here (what a pass sent to workers is filed under).

        Returns:
            The (account, phase) of the calls made here now.
        """
        return (_ACCOUNT.get(), current_phase())

    def add(self, label: Label, spent: Spend) -> None:
        """File ``spent`` under ``label`` (and append it to the log, if one is kept).

        Args:
            label: The account and phase.
            spent: What was paid.
        """
        with self._lock:
            found = self._entries.get(label)
            if found is None:
                found = self._entries[label] = Spend()
            found.add(spent)
            if self._log is not None:
                self._append(label, spent)

    def spent(
        self,
        account: Callable[[tuple[Any, ...] | None], bool] | None = None,
    ) -> dict[str, Spend]:
        """What the accounts ``account`` accepts (all, by default) spent, by phase.

        Args:
            account: Which accounts to add up.

        Returns:
            Phase name -> its spend, in the order of `PHASES` (unmarked calls last,
                under ``"other"``); phases with no request are left out.
        """
        found: dict[str, Spend] = {}
        with self._lock:
            for (key, name), spend in self._entries.items():
                if account is None or account(key):
                    found.setdefault(name or "other", Spend()).add(spend)
        order = [*PHASES, "other"]
        return {name: found[name] for name in order if name in found}

    def entries(self) -> list[list[Any]]:
        """Every entry as plain data, for a checkpoint (`load`).

        Returns:
            ``[[account, phase], spend]`` rows.
        """
        with self._lock:
            return [[_key(label), spend.to_json()] for label, spend in self._entries.items()]

    def load(self, rows: Iterable[Any]) -> None:
        """Add in what `entries` (or the log `keep_log` writes) holds.

        Args:
            rows: ``[[account, phase], spend]`` rows.
        """
        for key, spend in rows:
            account_key, name = key
            label = (tuple(account_key) if account_key is not None else None, name)
            with self._lock:
                self._entries.setdefault(label, Spend()).add(Spend.from_json(spend))

    def keep_log(self, path: Path | None) -> None:
        """Append each request to ``path`` from now on (None: keep no log); the log
        open before is closed.

        Args:
            path: The log file.
        """
        with self._lock:
            if self._log is not None:
                os.close(self._log)
            self._log = (
                None if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            )

    def _append(self, label: Label, spent: Spend) -> None:
        """One line, ``[[account, phase], spend]``, in one unbuffered write: a run killed
        any time after it has it in the file (this runs on every request sent)."""
        assert self._log is not None
        prefix = self._prefixes.get(label)
        if prefix is None:
            prefix = self._prefixes[label] = "[" + json.dumps(_key(label)) + ', {"requests": '
        dollars = "null" if spent.dollars is None else repr(spent.dollars)
        line = (
            f'{prefix}{spent.requests}, "input_tokens": {spent.input_tokens}, '
            f'"output_tokens": {spent.output_tokens}, "dollars": {dollars}}}]\n'
        )
        os.write(self._log, line.encode())

    @property
    def logging(self) -> bool:
        """Whether each request is appended to a log (`keep_log`)."""
        return self._log is not None

    def report(self) -> tuple[int, dict[str, Any]]:
        """A worker's copy's count so far, numbered (sent back with each batch).

        Returns:
            The report's number and the spend of the pass so far.
        """
        with self._lock:
            self._reports += 1
            return self._reports, total(self._entries.values()).to_json()


class WorkerSpend:
    """The driver's side of a ledger on Ray workers: each worker's latest report (its
    pass's spend so far) is added to the ledger under the pass's label, the part not
    added yet, so a report that arrives after a later one is not counted twice."""

    def __init__(self, ledger: SpendLedger, label: Label) -> None:
        self.ledger = ledger
        self.label = label
        self.latest: dict[str, tuple[int, Spend]] = {}

    def __call__(self, name: str, worker_id: str, report: Any) -> None:
        if report is None:
            return
        number, data = report
        seen = self.latest.get(worker_id, (0, Spend()))
        if number <= seen[0]:
            return
        now = Spend.from_json(data)
        self.latest[worker_id] = (number, now)
        self.ledger.add(self.label, now.minus(seen[1]))


def _key(label: Label) -> list[Any]:
    account_key, name = label
    return [list(account_key) if account_key is not None else None, name]
