"""`budget`: a hard limit on what a run may spend on LLM calls.

A batch that goes wrong (a prompt that makes every reply long, a loop that calls
far more than planned, a model that costs more than assumed) should cost a known
amount, not whatever the whole batch would have cost.  A budget counts what
reaches the endpoints: calls, tokens (prompt + completion, from each reply's
usage) and cost (from the prices of the alias's `EndpointConfig`).  Once a limit
is reached no new call is sent: the call raises `BudgetExceeded`, which the engine
turns into that node's ``Value(ERROR)`` (its dependents short-circuit, other
inputs of a batch go on, and each refused input comes back as an error naming the
limit, what was spent and the limit).

The limit is applied when a request is admitted to its endpoint (it holds its
concurrency slot and is about to be sent, `AdmissionGate`), not when the call is
created: a check at creation lets a whole window of queued calls through before
any of them has spent anything.  Admission reserves the request's estimated usage
(the prompt's estimated tokens plus its ``max_tokens``, or 256, the estimate the
TPM limit uses, priced with the alias's prices) and the reply's reported usage
replaces the reservation.  A request is admitted only while what was spent plus
what is reserved is below every limit; when the reservations of calls in flight
fill what is left, it waits for them to settle (they usually spend less than
their estimate) and is refused only once what was really spent reaches the
limit.  So no call is sent past a limit, and what is spent can end above it by
less than one request's estimate (more only if a reply uses more than its
estimate: a prompt that tokenizes worse than 4 characters a token, a reply longer
than the 256 tokens assumed when a call sets no ``max_tokens``).

Only calls that are really sent are counted: a call answered by a cache, a mock,
a replay or the checkpoint of an earlier run never reaches its endpoint, so it is
neither counted nor refused, wherever those handlers sit relative to the budget.
So a checkpointed batch stopped by a small budget can be resumed under a larger
one, and pays only for the calls it had not made.  A retry, and a structured
output's re-ask, is admitted again (it spends again); ``max_calls`` counts calls,
not attempts.
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import TYPE_CHECKING

from plait.effects import Handler, Message, current_run
from plait.resources.endpoint import attach_gate
from plait.resources.limits import _wake
from plait.resources.pricing import Prices

if TYPE_CHECKING:
    from plait.providers.base import LLMRequest, Usage
    from plait.resources.config import EndpointConfig
    from plait.resources.endpoint import Endpoint

__all__ = ["Budget", "BudgetExceeded", "budget"]


class BudgetExceeded(RuntimeError):
    """A call was not started because a `Budget` limit had been reached.

    The engine turns it into that input's ERROR `Value`; the message says which
    limit, what was spent and where the call was.

    Args:
        limit: ``"max_calls"``, ``"max_tokens"`` or ``"max_cost"``.
        used: What had been used when the call was refused.
        maximum: The limit.
        module_path: The module path of the call refused.
    """

    def __init__(self, limit: str, used: float, maximum: float, module_path: str) -> None:
        self.limit = limit
        self.used = used
        self.maximum = maximum
        self.module_path = module_path
        if limit == "max_cost":
            amount = f"${used:.6g} spent of max_cost=${maximum:.6g}"
        elif limit == "max_tokens":
            amount = f"{_count(used, 'token')} used of max_tokens={int(maximum)}"
        else:
            amount = f"{_count(used, 'call')} made of max_calls={int(maximum)}"
        super().__init__(
            f"budget exceeded: {amount}; the LLM call at {module_path!r} was not started"
        )


def _count(amount: float, noun: str) -> str:
    return f"{int(amount)} {noun}{'' if int(amount) == 1 else 's'}"


class _Ticket:
    """One call this budget watches: its `AdmissionGate` at the endpoint."""

    __slots__ = ("budget", "config", "counted", "name", "new", "reserved", "tier")

    def __init__(self, budget: Budget, name: str) -> None:
        self.budget = budget
        self.name = name
        self.config: EndpointConfig | None = None
        #: How the endpoint that admitted it serves it ("batch": at the batch price).
        self.tier = "standard"
        #: The call is counted in ``calls`` (at its first admission; ``new`` while that
        #: admission may still be withdrawn).
        self.counted = False
        self.new = False
        #: Tokens and dollars reserved for the request in flight.
        self.reserved: tuple[int, float] | None = None

    async def admit(
        self, endpoint: Endpoint, request: LLMRequest, estimate: Usage
    ) -> asyncio.Future[None] | None:
        return self.budget._admit(self, endpoint, estimate)

    def settle(self, usage: Usage | None) -> None:
        self.budget._settle(self, usage)

    def withdraw(self) -> None:
        self.budget._withdraw(self)


class Budget(Handler):
    """Counts calls, tokens and cost, and refuses new calls past any limit (see `budget`).

    Args:
        max_calls: The most LLM calls to send; None for no limit.
        max_tokens: The most prompt plus completion tokens to spend; None for no limit.
        max_cost: The most dollars to spend, by the prices of each call's alias;
            None for no limit.

    Raises:
        ValueError: When a limit is negative or not a number.
    """

    def __init__(
        self,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> None:
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"budget({name}=...) must be an integer >= 0, got {value!r}")
        if max_cost is not None and (
            isinstance(max_cost, bool)
            or not isinstance(max_cost, int | float)
            or not math.isfinite(max_cost)
            or max_cost < 0
        ):
            raise ValueError(f"budget(max_cost=...) must be a number >= 0, got {max_cost!r}")
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        # Hooks run on plait's loop, but one budget may serve runs started from several
        # threads: the check-and-reserve must be one step.
        self._lock = threading.Lock()
        self._calls = 0
        self._token_count = 0
        self._cost = 0.0
        self._refused = 0
        # Estimates of the requests admitted and not settled yet, and how many hold one
        # (at none, both are exactly 0: float sums must not leave a phantom reservation
        # that requests would wait on forever).
        self._reserved_tokens = 0
        self._reserved_cost = 0.0
        self._holders = 0
        # Admissions waiting for those to settle (any loop, any thread).
        self._waiters: list[asyncio.Future[None]] = []

    def __enter__(self) -> Budget:
        # Typed for ``with budget(...) as spent:``, so ``spent.cost`` needs no cast.
        super().__enter__()
        return self

    def forward_refusal(self) -> str | None:
        """Why this budget cannot be entered inside a ``forward`` here, or None.

        Inside a forward a budget limits the calls made in its block, except in a
        run on Ray workers: each worker would hold a copy of it with limits of its
        own (a budget around the run is one limit for the whole cluster).

        Returns:
            The reason in a run on Ray workers, else None.
        """
        run = current_run()
        if run is not None and ("workers" in run.meta or "worker" in run.meta):
            return (
                "this run is on Ray workers, where each worker would hold a copy of it "
                "with limits of its own: enter it around the run (`with "
                "plait.handlers.budget(...): pipeline.run_sync(..., workers=N)`), where "
                "its limits hold for the whole cluster"
            )
        return None

    @property
    def calls(self) -> int:
        """Calls sent to an endpoint, those still in flight included."""
        return self._calls

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens of the replies received so far."""
        return self._token_count

    @property
    def cost(self) -> float:
        """Dollars spent so far, by the prices of each call's alias (unpriced calls add 0)."""
        return self._cost

    @property
    def refused(self) -> int:
        """Calls not started because a limit had been reached."""
        return self._refused

    def __repr__(self) -> str:
        limits = ", ".join(
            f"{name}={value!r}"
            for name, value in (
                ("max_calls", self.max_calls),
                ("max_tokens", self.max_tokens),
                ("max_cost", self.max_cost),
            )
            if value is not None
        )
        return (
            f"Budget({limits}; calls={self._calls}, tokens={self._token_count}, "
            f"cost={self._cost:.6g}, refused={self._refused})"
        )

    def absorb_totals(self, calls: int, tokens: int, cost: float, refused: int) -> None:
        """Take the totals of a run on Ray workers, where this budget held cluster-wide.

        Args:
            calls: The calls sent.
            tokens: The tokens spent.
            cost: The dollars spent.
            refused: The calls refused.
        """
        with self._lock:
            self._calls, self._token_count, self._cost, self._refused = (
                calls,
                tokens,
                cost,
                refused,
            )

    def process_llm(self, msg: Message) -> None:
        """Watch a call that will be sent: it is admitted only while the limits allow.

        Args:
            msg: The LLM call's message.
        """
        # Nothing is checked here: a handler outside this one may still answer the call
        # (then it costs nothing), and a call created now may wait a long time for its
        # slot.  The endpoint asks the ticket when it admits the request.
        attach_gate(msg, self, lambda: _Ticket(self, msg.name))

    def _admit(
        self, ticket: _Ticket, endpoint: Endpoint, estimate: Usage
    ) -> asyncio.Future[None] | None:
        if self.max_cost is not None:
            _check_prices(endpoint.config, endpoint.alias, ticket.name)
        tokens, cost = estimate.total_tokens, _cost(endpoint.config, estimate, endpoint.tier)
        with self._lock:
            reached = self._reached(first=not ticket.counted)
            if reached is None:
                if not ticket.counted:
                    self._calls += 1
                    ticket.counted = ticket.new = True
                self._reserved_tokens += tokens
                self._reserved_cost += cost
                self._holders += 1
                ticket.reserved, ticket.config = (tokens, cost), endpoint.config
                ticket.tier = endpoint.tier
                return None
            if isinstance(reached, str):  # "wait"
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                return waiter
            self._refused += 1
        raise BudgetExceeded(*reached, module_path=ticket.name)

    def _reached(self, first: bool) -> tuple[str, float, float] | str | None:
        """The limit that refuses a request now, ``"wait"`` if requests in flight hold
        what is left (they may settle below it), or None: admit it."""
        if first and self.max_calls is not None and self._calls >= self.max_calls:
            return "max_calls", self._calls, self.max_calls
        return spend_verdict(
            ("max_tokens", self._token_count, self._reserved_tokens, self.max_tokens),
            ("max_cost", self._cost, self._reserved_cost, self.max_cost),
        )

    def _release(self, ticket: _Ticket) -> list[asyncio.Future[None]]:
        """Give back ``ticket``'s reservation (lock held); the admissions to wake."""
        if ticket.reserved is not None:
            tokens, cost = ticket.reserved
            self._holders -= 1
            self._reserved_tokens -= tokens
            self._reserved_cost = self._reserved_cost - cost if self._holders else 0.0
            ticket.reserved = None
        waiters, self._waiters = self._waiters, []
        return waiters

    def _settle(self, ticket: _Ticket, usage: Usage | None) -> None:
        with self._lock:
            ticket.new = False
            if usage is not None and ticket.config is not None:
                self._token_count += usage.total_tokens
                self._cost += _cost(ticket.config, usage, ticket.tier)
            waiters = self._release(ticket)
        _wake_pending(waiters)

    def _withdraw(self, ticket: _Ticket) -> None:
        with self._lock:
            if ticket.new:  # its first admission: the call was not made after all
                self._calls -= 1
                ticket.counted = ticket.new = False
            waiters = self._release(ticket)
        _wake_pending(waiters)


def _wake_pending(waiters: list[asyncio.Future[None]]) -> None:
    """Wake the admissions still waiting (one whose run was cancelled, its loop perhaps
    closed since, is skipped)."""
    _wake([w for w in waiters if not w.done() and not w.get_loop().is_closed()])


def spend_verdict(
    *limits: tuple[str, float, float, float | None],
) -> tuple[str, float, float] | str | None:
    """Whether a request may reserve its estimate against ``limits`` (each: name, spent,
    reserved, maximum or None): None if so; ``"wait"`` if only reservations of requests
    in flight stand in the way (they may settle below their estimates); else the limit
    reached, with what was spent.  One rule for a budget in one process and the
    cluster's ledger of one on Ray workers."""
    held = False
    for limit, spent, reserved, maximum in limits:
        if maximum is None or spent + reserved < maximum:
            continue
        if spent >= maximum or reserved <= 0:
            return limit, spent, maximum
        held = True
    return "wait" if held else None


def _check_prices(config: EndpointConfig, alias: str, where: str) -> None:
    input_price, output_price = config.input_price_per_mtok, config.output_price_per_mtok
    if input_price is None or output_price is None:
        from plait.resources.config import ConfigurationError

        missing = " and ".join(
            name
            for name, price in (
                ("input_price_per_mtok", input_price),
                ("output_price_per_mtok", output_price),
            )
            if price is None
        )
        raise ConfigurationError(
            f"budget(max_cost=...) cannot price the call at {where!r}: alias {alias!r} has "
            f"no {missing}; set the prices (dollars per million tokens) in its resource "
            "configuration, or budget by max_calls/max_tokens instead"
        )


def _cost(config: EndpointConfig, usage: Usage, tier: str) -> float:
    return Prices.of(config).cost(usage, tier)


def budget(
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Budget:
    """Refuse new LLM calls once ``max_calls``, ``max_tokens`` or ``max_cost`` (dollars) is used.

    A refused call raises `BudgetExceeded`, which becomes that input's ERROR
    `Value`; the other inputs of a batch go on.  Calls answered by a cache, a
    mock, a replay or a checkpoint cost nothing and are not refused.

    Args:
        max_calls: The most LLM calls to send; None for no limit.
        max_tokens: The most prompt plus completion tokens to spend; None for no limit.
        max_cost: The most dollars to spend, by the prices of each call's alias;
            None for no limit.

    Returns:
        The `Budget` handler: enter it with ``with``; its ``calls``, ``tokens``,
        ``cost`` and ``refused`` say what was spent.

    Raises:
        ValueError: When a limit is negative or not a number.

    Examples:
        ```python
        import plait
        from plait.handlers import budget

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.")
        summarize.bind(resources=resources, max_concurrent=1)

        with budget(max_calls=2) as spent:
            outputs = summarize.run_sync(["one", "two", "three"])
        print([isinstance(out, plait.Value) and out.is_error for out in outputs])
        print(spent.calls, spent.refused)
        ```
    """
    return Budget(max_calls, max_tokens, max_cost)
