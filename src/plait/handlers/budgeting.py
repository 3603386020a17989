"""`budget`: stop starting LLM calls once a run has used what it may.

A batch that goes wrong (a prompt that makes every reply long, a loop that calls
far more than planned, a model that costs more than assumed) should cost a known
amount, not whatever the whole batch would have cost.  A budget counts what
reaches the endpoints: calls, tokens (prompt + completion, from each reply's
usage) and cost (from the prices of the alias's `EndpointConfig`).  Once a limit
is reached no new call starts: the call raises `BudgetExceeded`, which the engine
turns into that node's ``Value(ERROR)`` (its dependents short-circuit, other
inputs of a batch go on, and each refused input comes back as an error naming the
limit).  Calls already in flight are not cancelled: they finish and are counted,
so tokens and cost may end a little above their limits (calls never do).

Only calls that are really sent are counted: the limit is checked, and the call
counted, at the moment the default action starts, after every handler has had its
chance to answer.  A call answered by a cache, a mock, a replay or the checkpoint
of an earlier run is neither counted nor refused, wherever those handlers sit
relative to the budget.  So a checkpointed batch stopped by a small budget can be
resumed under a larger one, and pays only for the calls it had not made.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from plait.handlers.llm import endpoint_config, request_of
from plait.handlers.stack import Handler, Message
from plait.providers.base import LLMResponse

if TYPE_CHECKING:
    from plait.providers.base import Usage
    from plait.resources.config import EndpointConfig

__all__ = ["Budget", "BudgetExceeded", "budget"]

#: Where a message keeps the budgets watching it (handler id -> ticket).
_TICKETS = "budget_tickets"


class BudgetExceeded(RuntimeError):
    """A call was not started because a `Budget` limit had been reached.

    ``limit`` is ``"max_calls"``, ``"max_tokens"`` or ``"max_cost"``; ``used`` is what
    had been used when the call was refused and ``maximum`` the limit.
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
    """One call this budget watches; ``sent`` once it let the call start."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class Budget(Handler):
    """Counts calls, tokens and cost, and refuses new calls past any limit."""

    sees_composite_calls = False  # acts on LLM calls only

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

    def __enter__(self) -> Budget:
        # Typed for ``with budget(...) as spent:``, so ``spent.cost`` needs no cast.
        super().__enter__()
        return self

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
        """Take the totals of a run on Ray workers, where this budget held cluster-wide."""
        with self._lock:
            self._calls, self._token_count, self._cost, self._refused = (
                calls,
                tokens,
                cost,
                refused,
            )

    def _reached(self) -> tuple[str, float, float] | None:
        if self.max_calls is not None and self._calls >= self.max_calls:
            return "max_calls", self._calls, self.max_calls
        if self.max_tokens is not None and self._token_count >= self.max_tokens:
            return "max_tokens", self._token_count, self.max_tokens
        if self.max_cost is not None and self._cost >= self.max_cost:
            return "max_cost", self._cost, self.max_cost
        return None

    def process(self, msg: Message) -> None:
        if msg.type != "llm" or msg.done or msg.meta.get("cache") == "hit" or msg.fn is None:
            return
        tickets = msg.meta.setdefault(_TICKETS, {})
        if id(self) in tickets:  # the same budget entered twice: count the call once
            return
        ticket = tickets[id(self)] = _Ticket()
        send = msg.fn

        # The limit is checked as the default action starts, not here: a handler
        # outside this one may still answer the call, and then it costs nothing.  The
        # wrapper runs without awaiting, so no other call can take the last slot
        # between the check and the start.
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._reserve(msg)
            try:
                started = send(*args, **kwargs)
            except BaseException:
                self._release()
                raise
            ticket.sent = True
            return started

        msg.fn = counted

    def _reserve(self, msg: Message) -> None:
        if self.max_cost is not None:
            _check_prices(msg)
        with self._lock:
            reached = self._reached()
            if reached is None:
                self._calls += 1
                return
            self._refused += 1
        raise BudgetExceeded(*reached, module_path=msg.name)

    def _release(self) -> None:
        with self._lock:
            self._calls -= 1

    def postprocess(self, msg: Message) -> None:
        tickets = msg.meta.get(_TICKETS)
        ticket = tickets.pop(id(self), None) if tickets else None
        if ticket is None or not ticket.sent or msg.error is not None:
            return
        reply = msg.value
        if not isinstance(reply, LLMResponse):
            return
        cost = _cost(endpoint_config(msg), reply.usage)
        with self._lock:
            self._token_count += reply.usage.total_tokens
            self._cost += cost


def _check_prices(msg: Message) -> None:
    config = endpoint_config(msg)
    input_price, output_price = config.input_price_per_mtok, config.output_price_per_mtok
    if input_price is None or output_price is None:
        from plait.resources.config import ConfigurationError

        alias = request_of(msg).alias
        missing = " and ".join(
            name
            for name, price in (
                ("input_price_per_mtok", input_price),
                ("output_price_per_mtok", output_price),
            )
            if price is None
        )
        raise ConfigurationError(
            f"budget(max_cost=...) cannot price the call at {msg.name!r}: alias {alias!r} has "
            f"no {missing}; set the prices (dollars per million tokens) in its resource "
            "configuration, or budget by max_calls/max_tokens instead"
        )


def _cost(config: EndpointConfig, usage: Usage) -> float:
    input_price = config.input_price_per_mtok or 0.0
    output_price = config.output_price_per_mtok or 0.0
    return (usage.prompt_tokens * input_price + usage.completion_tokens * output_price) / 1e6


def budget(
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Budget:
    """Refuse new LLM calls once ``max_calls``, ``max_tokens`` or ``max_cost`` (dollars) is used.

    ::

        with budget(max_cost=5.0) as spent:
            results = pipeline.run_sync(inputs)   # refused inputs are Value(ERROR)
        print(spent.calls, spent.tokens, spent.cost, spent.refused)
    """
    return Budget(max_calls, max_tokens, max_cost)
