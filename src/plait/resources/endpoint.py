"""One alias, live: the path every LLM call takes to its provider.

`Endpoint.complete` is the same for every provider: a concurrency slot from the
endpoint's process-wide limiter, the call's admission gates (a `budget` reserves
the call's estimated tokens and cost there, see `AdmissionGate`), the rate
governor (RPM, TPM, Retry-After, and the limits replies state, which it learns),
one attempt by the provider, and on failure a retry with exponential backoff and
jitter, or after a 429 exactly as long as the server said (the slot is given back
while waiting).
A retry re-sends this one request; it never re-runs upstream work.  A reply the
request checks (its ``response_format``, its ``validate``) that fails is sent back
with the error, up to the request's ``max_reasks`` and within its
``max_tokens_per_call``.  An alias with ``fallbacks`` walks its chain here too
(`plait.resources.routing`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol, TypeVar

from plait._secrets import scrub
from plait.providers.base import (
    LLMRequest,
    LLMResponse,
    Provider,
    ProviderError,
    ReplyFormatError,
    Usage,
)
from plait.providers.ratelimits import ReportedLimits
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.resources.hedging import (
    UNKNOWN_DELAY_POLL_S,
    Hedging,
    NotNow,
    close_wait,
    drop,
    first_reply,
)
from plait.resources.limits import Priority, PriorityLimiter
from plait.resources.rate import RateGovernor
from plait.resources.routing import CircuitBreaker, CircuitOpen, failure_kind
from plait.resources.usage import AliasUsage
from plait.structured import parse_reply, reask_instruction

__all__ = [
    "UNSEEN_TIMING",
    "AdmissionGate",
    "CallTiming",
    "Endpoint",
    "Span",
    "UnseenTiming",
    "backoff_delay",
    "estimate_tokens",
    "estimate_usage",
]

#: Completion tokens assumed for a request without ``max_tokens`` (corrected later).
_DEFAULT_COMPLETION_ESTIMATE = 256
_BACKOFF_BASE_S = 0.25
_BACKOFF_CAP_S = 20.0
#: A wait a server asks for (a Retry-After, a reported reset) longer than this is
#: logged, once per stall: a run that sits still for longer says why.
_LONG_WAIT_S = 5.0

_log = logging.getLogger("plait")


def estimate_usage(request: LLMRequest) -> Usage:
    """Prompt characters / 4, and the completion budget: an upper-leaning guess, split so
    each part can be priced (a budget's reservation) or added up (the TPM limit)."""
    chars = sum(len(str(m.get("content", ""))) for m in request.messages)
    completion = request.max_tokens or _DEFAULT_COMPLETION_ESTIMATE
    return Usage(chars // 4 + 1, completion)


def estimate_tokens(request: LLMRequest) -> int:
    """`estimate_usage`, in total."""
    return estimate_usage(request).total_tokens


def backoff_delay(attempt: int, retry_after: float | None, cap: float = _BACKOFF_CAP_S) -> float:
    """Full-jitter exponential backoff, never shorter than the server's Retry-After
    and never longer than ``cap`` (the endpoint's ``max_retry_after_s``)."""
    ceiling = min(_BACKOFF_CAP_S, cap, _BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    delay = random.uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


def _asked(asked: tuple[float, str] | None, cap: float) -> str:
    """Why giving up was right when the server asked for longer pauses than allowed."""
    if asked is None or asked[0] <= cap:
        return ""
    wanted, header = asked
    return (
        f"; the server asked to wait {wanted:g} s ({header} header), more than this "
        f"alias's max_retry_after_s={cap:g}: raise it to wait that long, or try again later"
    )


@dataclass(slots=True)
class Span:
    """One stage of a call: ``queue`` (waiting for a concurrency slot), ``rate_wait``
    (RPM/TPM pacing or a Retry-After pause), ``request`` (one attempt at the
    provider), ``batch`` (the provider's batch that answered it, from its submission
    to its end) or ``backoff`` (sleeping before a retry); times are `time.monotonic`."""

    kind: str
    start: float
    end: float
    info: dict[str, Any] = field(default_factory=dict)


class AdmissionGate(Protocol):
    """Told when a call's request is admitted to the endpoint and when it is settled.

    Admission is the moment a request holds its concurrency slot and is about to be
    sent, after every handler has had its chance to answer the call: a `budget`
    reserves the request's estimated usage there (one checked when the call is
    created would let a whole window of calls pass before any had spent anything),
    and the reply's usage replaces the reservation.  A retry and a structured
    output's re-ask are admitted again.
    """

    async def admit(
        self, endpoint: Endpoint, request: LLMRequest, estimate: Usage
    ) -> Awaitable[Any] | None:
        """Reserve ``estimate`` and return None; raise to refuse the call; or return
        something to await (having reserved nothing) before asking again."""
        ...

    def settle(self, usage: Usage | None) -> None:
        """The admitted request was sent: ``usage`` is the reply's (None: it failed)."""
        ...

    def withdraw(self) -> None:
        """The admitted request was not sent after all (another gate refused it)."""
        ...


G = TypeVar("G", bound=AdmissionGate)


@dataclass(slots=True)
class CallTiming:
    """Where one call's time went, filled in as it happens; profilers read it.

    It is the one object that travels with a call from its message to the endpoint,
    so it also carries the call's ``gates`` (`AdmissionGate`), which handlers add.
    """

    #: Whether `add` keeps spans: the call path skips building a span's arguments (a
    #: keyword dict, a clock read) for a timing that would drop them (`UnseenTiming`).
    records: ClassVar[bool] = True

    spans: list[Span] = field(default_factory=list)
    gates: list[AdmissionGate] = field(default_factory=list)
    #: The handlers that have a gate here (held, not by id: one cannot be mistaken
    #: for another that reused a collected one's id).
    owners: list[object] = field(default_factory=list)

    def add(self, kind: str, start: float, end: float, **info: Any) -> None:
        self.spans.append(Span(kind, start, end, info))

    def add_gate(self, owner: object, make: Callable[[], G]) -> G | None:
        """Give ``owner`` (a handler) its gate on this call, once.

        A handler entered twice around one call (the same budget in nested scopes)
        must count the call once, so a second ask adds nothing.

        Args:
            owner: The handler the gate reports to.
            make: Makes the gate; called only when ``owner`` has none here yet.

        Returns:
            The new gate, or None when ``owner`` already has one on this call.
        """
        if any(held is owner for held in self.owners):
            return None
        gate = make()
        self.owners.append(owner)
        self.gates.append(gate)
        return gate


class _CallMessage(Protocol):
    """What `attach_gate` reads of an LLM call's message (`plait.effects.Message`)."""

    @property
    def done(self) -> bool: ...

    @property
    def fn(self) -> object: ...

    @property
    def meta(self) -> MutableMapping[str, Any]: ...


def attach_gate(msg: _CallMessage, owner: object, make: Callable[[], G]) -> G | None:
    """Give a handler its `AdmissionGate` on a call that may still be sent, once.

    The one way a handler (a budget, a spend ledger) watches a call's requests: a
    call already answered (done, or a cache hit) sends nothing, and one whose
    message carries no `CallTiming` never reaches an endpoint that reads gates.

    Args:
        msg: The LLM call's message.
        owner: The handler the gate reports to.
        make: Makes the gate; called only when one is attached.

    Returns:
        The attached gate, or None when the call will not be sent or ``owner``
        already watches it.
    """
    if msg.done or msg.fn is None or msg.meta.get("cache") == "hit":
        return None
    timing = msg.meta.get("timing")
    if not isinstance(timing, CallTiming):
        return None
    return timing.add_gate(owner, make)


class UnseenTiming(CallTiming):
    """The timing of a call that nothing will read (no handler saw its message, and its
    caller does not ask who answered it): spans are not kept, gates never added.

    It holds nothing, so every such call shares one (`UNSEEN_TIMING`) instead of
    allocating a timing and its three lists per call.
    """

    __slots__ = ()

    records: ClassVar[bool] = False

    def add(self, kind: str, start: float, end: float, **info: Any) -> None:
        return None

    def add_gate(self, owner: object, make: Callable[[], G]) -> G | None:
        """No gate: no handler saw the call, so none can watch it (and the one shared
        instance must never carry one call's gate to the next)."""
        return None


#: The timing of every call nothing reads (see `UnseenTiming`).
UNSEEN_TIMING = UnseenTiming()


@dataclass(slots=True)
class Endpoint:
    """One alias, live: the path every LLM call takes to its provider, the same for every provider.

    A `ResourceManager` makes it (``manager.endpoint(alias)``); `complete` takes a
    concurrency slot, passes the rate governor (requests and tokens per minute,
    Retry-After, the limits replies state), makes one attempt by the provider and
    retries failures with backoff, counting usage for the report.

    Args:
        alias: The alias it serves.
        config: The alias's configuration.
        limiter: The concurrency limit, shared by every endpoint of the same
            remote endpoint in the process.
        governor: The pacing by requests and tokens per minute.
        provider: The wire protocol.
        usage: Where its requests, tokens and errors are counted.
        tier: How its requests are served, and so priced: ``"standard"``,
            ``"flex"`` (the provider's flex tier) or ``"batch"`` (its batch API).
        fallbacks: The endpoints a call moves on to, in order, when this one cannot
            answer it (the alias's chain after itself, `fallback_chain`).
        breaker: The circuit breaker of its remote endpoint, when it is part of a
            chain of fallbacks (its own, or another alias's).
        hedging: When the alias hedges slow requests (``hedge_after``): when to
            send a second copy, and how many have gone.
        deployments: For an alias with ``deployments``, one endpoint per deployment
            (each with its own limits); this one then only chooses among them.
        label: A deployment's name in the usage report (``provider/model @ host``).
        siblings: A deployment's fellow deployments of its alias, where a hedged
            copy of its slow request goes.
    """

    alias: str
    config: EndpointConfig
    limiter: PriorityLimiter
    governor: RateGovernor
    provider: Provider
    usage: AliasUsage
    tier: str = "standard"
    fallbacks: tuple[Endpoint, ...] = ()
    breaker: CircuitBreaker | None = None
    hedging: Hedging | None = None
    deployments: tuple[Endpoint, ...] = ()
    label: str = ""
    siblings: tuple[Endpoint, ...] = ()

    def complete(
        self,
        request: LLMRequest,
        priority: float | Priority = 0.0,
        timing: CallTiming | None = None,
    ) -> Coroutine[Any, Any, LLMResponse]:
        """Send ``request`` with limits, retries, re-asks and fallbacks.

        For a request with a ``response_format`` the reply is parsed (its
        ``parsed``) and with a ``validate`` checked; one that fails is re-asked
        with the error, up to ``max_reasks`` times.  An alias with ``fallbacks``
        moves the call on along its chain when this endpoint cannot answer it.

        Args:
            request: The request.
            priority: Its place among the requests waiting for a slot (lower first).
            timing: Where the call's spans (queue, rate wait, attempts) are kept.

        Returns:
            The coroutine to await for the reply; for a request without a schema it
                is the sending itself, so a plain call's await chain has no frame here.

        Raises:
            ProviderError: When awaited: the endpoint refused or failed the request
                after its retries.
            ReplyFormatError: When awaited: the reply is not of the
                ``response_format`` asked for, or ``validate`` rejects it, even
                after the re-asks.
            ConfigurationError: When awaited: an embedding request to a provider
                without embeddings.
        """
        timing = timing if timing is not None else CallTiming()
        if self.fallbacks:
            return self._complete_routed(request, priority, timing)
        return self._complete_here(request, priority, timing, None)

    def _complete_here(
        self,
        request: LLMRequest,
        priority: float | Priority,
        timing: CallTiming,
        route: _Route | None,
    ) -> Coroutine[Any, Any, LLMResponse]:
        """`complete` at this endpoint alone; ``route`` when it is one stop of a chain."""
        if self.deployments:
            return self._complete_pooled(request, priority, timing, route)
        if request.embed and not getattr(self.provider, "embeds", False):
            return _refused(self._no_embeddings())
        if request.response_format is None and request.validate is None:
            return self._send_with_retries(request, priority, timing, route)
        return self._complete_checked(request, priority, timing, route)

    async def _complete_pooled(
        self,
        request: LLMRequest,
        priority: float | Priority,
        timing: CallTiming,
        route: _Route | None,
    ) -> LLMResponse:
        """`complete` for an alias with ``deployments``: at the deployment that would
        send it soonest (`_soonest`), and on to the next when one fails in a way
        ``fallback_on`` names or its breaker sends the call on.  The last deployment
        tried keeps its retries whole unless the alias has fallbacks after it."""
        left = list(self.deployments)
        tried: list[str] = []
        failure: ProviderError | None = None
        while left:
            member = _soonest(left, request, self.usage.requests)
            left.remove(member)
            last = not left and (route is None or route.last)
            outcome = await member._try_stop(
                request, priority, timing, last, member.label, "deployment"
            )
            if isinstance(outcome, LLMResponse):
                self.usage.count_deployment(member.label)
                return outcome
            tried.append(outcome.note)
            failure = outcome.failure or failure
        if failure is None:
            raise CircuitOpen(f"alias {self.alias!r}: every deployment's circuit breaker is open")
        raise _after(failure, tried[:-1], exhausted=True) from failure

    async def _complete_routed(
        self, request: LLMRequest, priority: float | Priority, timing: CallTiming
    ) -> LLMResponse:
        """`complete` along the alias's chain: each endpoint in turn, skipping one whose
        breaker is open (unless it is the last), until one answers or a failure that
        would fail anywhere ends the call."""
        chain = (self, *self.fallbacks)
        tried: list[str] = []
        last = len(chain) - 1
        tag = "alias" if last else None  # spans name the alias only where there are two
        for position, endpoint in enumerate(chain):
            sent = request if endpoint is self else replace(request, alias=endpoint.alias)
            try:
                outcome = await endpoint._try_stop(
                    sent, priority, timing, position == last, endpoint.alias, tag
                )
            except ProviderError as failure:
                if not tried:
                    raise
                raise _after(failure, tried) from failure
            if isinstance(outcome, LLMResponse):
                if endpoint is not self:
                    outcome.fallback = endpoint.alias
                return outcome
            tried.append(outcome.note)
            if position == last:
                assert outcome.failure is not None  # the last stop is always tried
                raise _after(outcome.failure, tried[:-1], exhausted=True) from outcome.failure
            endpoint.usage.moved_on += 1
        raise AssertionError("unreachable: the last endpoint of a chain is always tried")

    async def _try_stop(
        self,
        request: LLMRequest,
        priority: float | Priority,
        timing: CallTiming,
        last: bool,
        name: str,
        tag: str | None,
    ) -> LLMResponse | _MovedOn:
        """One stop of a chain of fallbacks or of a pool of deployments: this endpoint,
        unless its breaker sends the call on (never at the ``last`` stop).

        Returns the reply, or why the call moved on (`_MovedOn`, with the failure when
        one was met); a failure ``fallback_on`` does not name is raised.  The spans of
        the attempts here are marked ``tag: name``.
        """
        breaker = self.breaker
        verdict = breaker.admit() if breaker is not None else True
        if verdict is False and not last:
            return _MovedOn(f"{name}: circuit breaker open")
        first = len(timing.spans)
        try:
            return await self._complete_here(
                request, priority, timing, _Route(breaker, self.config.fallback_on, last)
            )
        except CircuitOpen:
            return _MovedOn(f"{name}: circuit breaker open")
        except ProviderError as failure:
            if failure_kind(failure) in self.config.fallback_on:
                return _MovedOn(f"{name}: {failure}", failure)
            if breaker is not None and verdict is None:
                breaker.abandoned()  # a probe that says nothing of the endpoint
            raise
        except BaseException:
            if breaker is not None and verdict is None:
                breaker.abandoned()
            raise
        finally:
            if tag is not None:
                for span in timing.spans[first:]:
                    span.info[tag] = name

    def _no_embeddings(self) -> ConfigurationError:
        return ConfigurationError(
            f"alias {self.alias!r} gives no embeddings (provider {self.config.provider!r}): "
            "point the embedding "
            "alias at an OpenAI-compatible endpoint with an embedding model (provider = "
            '"openai", model = "text-embedding-3-small", or a local server\'s), or leave '
            "embed= out to rank demonstrations by BM25, which needs no model"
        )

    async def _complete_checked(
        self,
        request: LLMRequest,
        priority: float | Priority,
        timing: CallTiming,
        route: _Route | None = None,
    ) -> LLMResponse:
        """`complete` for a request whose reply is checked: parsed into its
        ``response_format``, then passed to its ``validate``.  A reply that fails is
        sent back with the error for another answer, up to ``max_reasks`` times and
        within ``max_tokens_per_call``.  Each re-ask holds the original messages and
        the last answer only, so its cost does not grow with the attempts before it.
        Every attempt is a request of its own: counted in usage, and admitted by the
        call's gates (a budget), as it is sent."""
        attempt = request
        spent = 0
        reasks = 0
        attempts = 0
        while True:
            response = await self._send_with_retries(attempt, priority, timing, route)
            attempts += response.attempts
            response.attempts = attempts
            spent += response.usage.total_tokens
            try:
                if request.response_format is not None:
                    response.parsed = parse_reply(request.response_format, response.text)
                if request.validate is not None:
                    _validate(request.validate, response.payload)
                return response
            except (ValueError, AssertionError) as exc:
                error = _reason(exc)
            if reasks >= request.max_reasks:
                tried = "" if reasks == 0 else f" (also after re-asking {_times(reasks)})"
                raise ReplyFormatError(f"{error}{tried}")
            attempt = replace(
                request,
                messages=[
                    *request.messages,
                    {"role": "assistant", "content": response.text},
                    {"role": "user", "content": _reask_text(request, error)},
                ],
            )
            bound = request.max_tokens_per_call
            if bound is not None:
                prompt = estimate_usage(attempt).prompt_tokens
                room = bound - spent - prompt
                if room < 1:
                    raise ReplyFormatError(
                        f"{error} (no re-ask: the call's attempts spent {spent} tokens and "
                        f"another needs about {prompt} for its prompt, over "
                        f"max_tokens_per_call={bound})"
                    )
                attempt.max_tokens = min(attempt.max_tokens or room, room)
            reasks += 1
            self.usage.reasks += 1

    async def _send_with_retries(
        self,
        request: LLMRequest,
        priority: float | Priority,
        timing: CallTiming,
        route: _Route | None = None,
    ) -> LLMResponse:
        usage, governor, limiter, gates = self.usage, self.governor, self.limiter, timing.gates
        records = timing.records
        # Estimated only when something takes it: a gate's reservation, a TPM limit, a
        # lease; an endpoint with none (and a free slot) costs its calls no coroutine
        # beyond the provider's.
        expected: Usage | None = None
        estimate = 0
        attempt = 0
        while True:
            attempt += 1
            queued = time.monotonic()
            if not limiter.try_acquire():
                await limiter.acquire(priority)
            admitted: list[AdmissionGate] = []
            sent = False
            try:
                slot = time.monotonic()
                if records:
                    timing.add("queue", queued, slot)
                if route is not None and route.closed():
                    # Its breaker opened while this call waited for the slot.
                    raise CircuitOpen(f"alias {self.alias!r}: circuit breaker open")
                if gates or not governor.open_at(slot):
                    if expected is None:
                        expected = estimate_usage(request)
                        estimate = expected.total_tokens
                    if gates:
                        admitted = await self._admit(gates, request, expected)
                    if not governor.paces_locally or governor.wait_time(estimate) > 0:
                        if governor.paces_locally:
                            self._say_why_held(estimate)
                        await governor.admit(estimate)
                started = time.monotonic()
                if started - slot > 1e-4 and records:
                    timing.add("rate_wait", slot, started)
                usage.requests += 1
                sent = True
                try:
                    if self.hedging is None:
                        response = await self.provider.send(request)
                    else:
                        response = await self._send_hedged(request, timing, estimate, attempt)
                except ProviderError as exc:
                    failure: ProviderError = exc
                    timing.add(
                        "request", started, time.monotonic(), attempt=attempt, error=scrub(str(exc))
                    )
                else:
                    ended = time.monotonic()
                    if records:
                        timing.add("request", started, ended, attempt=attempt, status="ok")
                    if response.batch is not None:
                        batch_id, submitted, finished = response.batch
                        timing.add("batch", submitted, finished, batch=batch_id)
                    for gate in admitted:
                        gate.settle(response.usage)
                    admitted = []
                    usage.succeeded += 1
                    usage.add_reply(response.usage, response.tier, ended - started)
                    reported = response.usage.total_tokens
                    governor.settle(estimate, reported or None)
                    if response.limits is not None:
                        self._learn(response.limits, estimate)
                    if route is not None and route.breaker is not None:
                        route.breaker.succeeded()
                    response.attempts = attempt
                    return response
                if failure.limits is not None:
                    self._learn(failure.limits, estimate)
            finally:
                for gate in admitted:  # failed, or cancelled: nothing known was spent
                    if sent:
                        gate.settle(None)
                    else:
                        gate.withdraw()
                limiter.release()
            cap = self.config.max_retry_after_s
            asked: tuple[float, str] | None = None
            if failure.unavailable:
                usage.unavailable += 1  # the tier's capacity, not this client's pace
            elif failure.status == 429:
                usage.rate_limited += 1
                asked = self._asked_wait(failure)
                governor.rate_limited(None if asked is None else self._server_wait(*asked))
            if route is not None and route.moves_on(failure, asked, cap):
                usage.failed += 1
                raise failure
            if not failure.retryable or attempt > self.config.max_retries:
                usage.failed += 1
                if failure.retryable:
                    raise ProviderError(
                        f"{failure} (gave up after {attempt} attempts{_asked(asked, cap)})",
                        status=failure.status,
                        retryable=False,
                        transport=failure.transport,
                    ) from failure
                raise failure
            usage.retries += 1
            pause = time.monotonic()
            if asked is not None and self.config.learn_limits:
                # The server said when: wait exactly that (capped), no guessing on top.
                delay = min(asked[0], cap)
            else:
                delay = backoff_delay(attempt, failure.retry_after, cap)
            await asyncio.sleep(delay)
            timing.add("backoff", pause, time.monotonic(), attempt=attempt)

    async def _send_hedged(
        self, request: LLMRequest, timing: CallTiming, estimate: int, attempt: int
    ) -> LLMResponse:
        """One attempt of ``request``, with a second copy sent if the first has had no
        reply after the alias's ``hedge_after`` (`plait.resources.hedging`): the first
        reply of either wins and the other is cancelled.  The copy takes the next free
        concurrency slot before any waiting call, and goes only if nothing else would
        hold it (the rate limits, a gate) and within ``max_hedge_fraction``; else the
        call waits for its first copy.  A quantile not known yet when the attempt was
        sent (too few replies) is read again while it waits.
        """
        hedging = self.hedging
        assert hedging is not None
        hedging.calls += 1
        sent = time.monotonic()
        first = asyncio.ensure_future(self.provider.send(request))
        try:
            while True:
                delay = hedging.delay(self.usage)
                left = UNKNOWN_DELAY_POLL_S if delay is None else sent + delay - time.monotonic()
                if left > 0:
                    done, _ = await asyncio.wait({first}, timeout=left)
                    if done:
                        return first.result()
                if delay is not None and time.monotonic() >= sent + delay:
                    break
            if not hedging.may_copy():
                return await first
            # A deployment's copy goes to the fellow deployment that would send it
            # soonest: the slow one may well be this one.
            target = _soonest(self.siblings, request, hedging.copies) if self.siblings else self
            held = await target._hold_copy(request, timing, estimate, first)
            if held is None:
                return await first
            gates, paced = held
            hedging.copies += 1
            self.usage.requests += 1
            self.usage.hedged += 1
            started = time.monotonic()
            second = asyncio.ensure_future(target.provider.send(request))
            won = False
            try:
                response = await first_reply(first, second)
                won = second.done() and not second.cancelled() and second.exception() is None
                return response
            finally:
                drop(second)
                timing.add(
                    "request",
                    started,
                    time.monotonic(),
                    attempt=attempt,
                    hedge=True,
                    status="won" if won else "lost",
                    copy_to=target.label if target is not self else None,
                )
                target.limiter.release()
                for gate in gates:
                    gate.settle(None)  # the copy's own usage is unknown once one is cancelled
                if paced:
                    target.governor.settle(paced, None)
        finally:
            drop(first)

    async def _hold_copy(
        self,
        request: LLMRequest,
        timing: CallTiming,
        estimate: int,
        first: asyncio.Future[LLMResponse],
    ) -> tuple[list[AdmissionGate], int] | None:
        """What a hedged copy holds once it may go: a concurrency slot (the next one
        free, ahead of every waiting call), the gates that admitted it, and the tokens
        the rate governor drew for it (0: none).  None when the first copy replied
        meanwhile, or the copy would have to wait under the rate limits or at a gate."""
        governor = self.governor
        paced = 0
        if not governor.open_at(time.monotonic()):
            paced = estimate or estimate_tokens(request)
            # wait_time takes the request's share when it may go now (put back below
            # if the copy does not go after all).
            if not governor.paces_locally or governor.wait_time(paced) > 0:
                return None
        if not self.limiter.try_acquire():
            slot = asyncio.ensure_future(self.limiter.acquire(-math.inf))
            racing: set[asyncio.Future[Any]] = {first, slot}
            try:
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the call was cancelled: the slot, if it comes, goes back
                slot.add_done_callback(self._give_back_slot)
                slot.cancel()
                if paced:
                    governor.put_back(paced)
                raise
            if not slot.done():
                slot.cancel()  # the first copy replied: no slot needed
                await asyncio.wait({slot})
            if slot.cancelled() or first.done():
                if not slot.cancelled():
                    self.limiter.release()
                if paced:
                    governor.put_back(paced)
                return None
        admitted: list[AdmissionGate] = []
        try:
            for gate in timing.gates:
                wait = await gate.admit(self, request, estimate_usage(request))
                if wait is not None:
                    close_wait(wait)
                    raise NotNow
                admitted.append(gate)
        except BaseException:  # a refusal, a wait, or the call cancelled meanwhile
            for gate in admitted:
                gate.withdraw()
            self.limiter.release()
            if paced:
                governor.put_back(paced)
            return None
        return admitted, paced

    def _give_back_slot(self, slot: asyncio.Future[None]) -> None:
        """A slot acquired for a copy that will not be sent goes back."""
        if not slot.cancelled() and slot.exception() is None:
            self.limiter.release()

    def _learn(self, limits: ReportedLimits, estimate: int) -> None:
        """A reply stated its endpoint's limits: the governor paces by them (unless this
        alias says ``learn_limits = false``) and the usage report shows them.  Called
        while the reply's call still holds its slot, so the others in flight are the
        limiter's holders but one, each taken to need as many tokens as this call's
        ``estimate``."""
        if self.config.learn_limits:
            others = max(0, self.limiter.held - 1)
            self.governor.learn(limits, others, others * estimate, self.config.max_retry_after_s)
        self.usage.note_limits(limits, self.governor.configured, self.governor.effective())

    def _asked_wait(self, failure: ProviderError) -> tuple[float, str] | None:
        """How long a 429 asked to wait and the header that said so: its Retry-After,
        else (when this alias learns limits) the reset of the budget it says is spent."""
        limits = failure.limits
        if failure.retry_after is not None:
            header = "retry-after"
            if limits is not None and limits.retry_after_s is not None:
                header = limits.retry_after_header  # or retry-after-ms
            return failure.retry_after, header
        if limits is not None and self.config.learn_limits:
            return limits.wait()
        return None

    def _server_wait(self, asked: float, header: str) -> float:
        """The wait a server asked for in ``header``, bounded as every such wait is (by
        ``max_retry_after_s``); one longer than a few seconds is logged, once a stall."""
        waited = min(asked, self.config.max_retry_after_s)
        self._announce_wait(asked, waited, header)
        return waited

    def _say_why_held(self, estimate: int) -> None:
        """A request is about to wait: when what holds it is a reply's reported reset
        (bounded when the governor learned it), that wait is logged as a Retry-After's."""
        held = self.governor.held_by(estimate)
        if held is not None:
            waited, asked, header = held
            self._announce_wait(asked, waited, header)

    def _announce_wait(self, asked: float, waited: float, header: str) -> None:
        """Log a wait of ``waited`` seconds for a server that asked for ``asked`` in
        ``header``, when that is longer than a few seconds and news (`RateGovernor.announce`)."""
        if asked <= _LONG_WAIT_S:
            return
        if not self.governor.announce(time.monotonic() + waited, _LONG_WAIT_S):
            return
        cap = self.config.max_retry_after_s
        bounded = (
            f"; max_retry_after_s={cap:g} bounds the wait, then the request goes (raise it "
            "to wait longer)"
            if asked > cap
            else ""
        )
        _log.warning(
            "plait: alias %r waits %.3g s before its next request: the provider's %s header "
            "says to wait %g s%s",
            self.alias,
            waited,
            header,
            asked,
            bounded,
        )

    async def _admit(
        self, gates: list[AdmissionGate], request: LLMRequest, estimate: Usage
    ) -> list[AdmissionGate]:
        """Pass every gate, or none: a gate that asks to wait is waited for holding no
        reservation of the others (two calls each holding what the other waits for
        would wait forever), then every gate is asked again."""
        while True:
            admitted: list[AdmissionGate] = []
            wait: Awaitable[Any] | None = None
            try:
                for gate in gates:
                    wait = await gate.admit(self, request, estimate)
                    if wait is not None:
                        break
                    admitted.append(gate)
            except BaseException:
                for gate in admitted:
                    gate.withdraw()
                raise
            if wait is None:
                return admitted
            for gate in admitted:
                gate.withdraw()
            await wait


def _soonest(members: Sequence[Endpoint], request: LLMRequest, turn: int) -> Endpoint:
    """The endpoint that would send ``request`` soonest: the wait under its rate limits
    plus the calls already queued there at its rate (or, unpaced, whether a slot is
    free), then the fewest calls per slot; ties go round by ``turn``."""
    now = time.monotonic()
    estimate = 0
    best: Endpoint | None = None
    best_key: tuple[float, float, int] | None = None
    for index, member in enumerate(members):
        governor, limiter = member.governor, member.limiter
        queued = limiter.held + limiter.waiting
        per_minute = None
        wait = 0.0
        if not governor.open_at(now) and governor.paces_locally:
            estimate = estimate or estimate_tokens(request)
            wait = governor.peek(estimate)
            per_minute = governor.effective()[0]
        if per_minute:
            soonest = wait + queued * 60.0 / per_minute
        else:  # in rounds of its slots: none while one is free
            soonest = wait + max(0, queued - limiter.limit + 1) / max(limiter.limit, 1)
        key = (soonest, queued / max(limiter.limit, 1), (index - turn) % len(members))
        if best_key is None or key < best_key:
            best, best_key = member, key
    assert best is not None
    return best


def _validate(check: Callable[[Any], Any], payload: Any) -> None:
    """Run a request's ``validate`` on a reply's payload; False rejects it too."""
    if check(payload) is False:
        name = getattr(check, "__name__", type(check).__name__)
        raise ValueError(f"the reply was rejected by {name}")


def _reason(exc: BaseException) -> str:
    """What was wrong with a reply, as the re-ask and the final error say it."""
    text = str(exc)
    if isinstance(exc, AssertionError):
        return f"the reply failed a check: {text}" if text else "the reply failed a check"
    return text if text.strip() else type(exc).__name__


def _reask_text(request: LLMRequest, error: str) -> str:
    text = f"That reply is not valid: {error}."
    if request.response_format is not None:
        return f"{text} {reask_instruction(request.response_format)}"
    return f"{text} Answer again, correcting it."


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


@dataclass(slots=True)
class _MovedOn:
    """Why a call left a stop of a chain or a pool: a note for the final error, and the
    failure it met there (None: the stop's breaker sent it on unsent)."""

    note: str
    failure: ProviderError | None = None


@dataclass(slots=True)
class _Route:
    """One stop of a chain of fallbacks: the endpoint's breaker, the failures that move a
    call on from it, and whether it is the last stop (which keeps its retries whole)."""

    breaker: CircuitBreaker | None
    fallback_on: tuple[str, ...]
    last: bool

    def closed(self) -> bool:
        """Whether the endpoint's breaker is open and another stop follows: a call
        still waiting to be sent here moves on instead."""
        return not self.last and self.breaker is not None and self.breaker.is_open()

    def moves_on(self, failure: ProviderError, asked: tuple[float, str] | None, cap: float) -> bool:
        """Count a failed request against the breaker, and say whether the call should
        leave this endpoint now rather than retry here: its breaker just opened, or a
        429 asks to wait longer than the alias allows."""
        kind = failure_kind(failure)
        if kind is None or kind not in self.fallback_on:
            return False
        if self.breaker is not None:
            self.breaker.failed()
        if self.last:
            return False
        if kind == "rate_limit" and asked is not None and asked[0] > cap:
            return True
        return self.breaker is not None and self.breaker.is_open()


def _after(failure: ProviderError, tried: list[str], exhausted: bool = False) -> ProviderError:
    """``failure``, saying which aliases the call tried before it (raised from it)."""
    before = "; ".join(tried)
    if exhausted:
        message = f"{failure} (every alias of the chain failed; before it: {before})"
    else:
        message = f"{failure} (after falling back from: {before})"
    return type(failure)(
        message,
        status=failure.status,
        retry_after=failure.retry_after,
        unavailable=failure.unavailable,
        limits=failure.limits,
        transport=failure.transport,
    )


async def _refused(error: Exception) -> LLMResponse:
    raise error
