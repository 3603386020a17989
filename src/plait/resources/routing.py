"""Where a call goes when its alias cannot answer: failure kinds and circuit breakers.

An alias with ``fallbacks`` hands a call on to the next alias of its chain
(`plait.resources.config.fallback_chain`) when the call fails in a way another
endpoint may not (`failure_kind`, matched against the alias's ``fallback_on``).
Each endpoint of a chain has a `CircuitBreaker`: after ``breaker_failures``
failed requests in a row it opens, and calls skip that endpoint for
``breaker_cooldown_s`` instead of each paying its retries there; then one call
probes it, and its outcome closes the breaker or opens it again.

Breakers belong to the remote endpoint, as its limits do: every run of the process
that reaches the same endpoint shares one (`breaker_for`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from plait.providers.base import ProviderError, ReplyFormatError
from plait.resources.config import EndpointConfig, FailureKind

__all__ = [
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "breaker_for",
    "failure_kind",
    "reset_breakers",
    "use_breakers",
]

BreakerState = Literal["closed", "open", "half-open"]


class CircuitOpen(ProviderError):
    """A call reached an endpoint of its chain whose circuit breaker is open (it opened
    while the call waited for a slot): it moves on to the next alias unsent."""


def failure_kind(failure: ProviderError) -> FailureKind | None:
    """What kind of failure ``failure`` is, in the words ``fallback_on`` uses.

    Args:
        failure: A request's failure, after its alias's retries.

    Returns:
        ``"server_error"``, ``"connection"``, ``"timeout"``, ``"rate_limit"``,
        ``"not_found"`` or ``"auth"``; None for a failure that another endpoint
        would meet too (a 400, a reply not in the format asked for).
    """
    if isinstance(failure, ReplyFormatError):
        return None
    status = failure.status
    if status is None:
        if failure.transport == "timeout":
            return "timeout"
        if failure.transport == "connection":
            return "connection"
        return None
    if status == 429:
        return "rate_limit"
    if status >= 500 or status == 408:
        return "server_error"
    if status == 404:
        return "not_found"
    if status in (401, 403):
        return "auth"
    return None


class CircuitBreaker:
    """An endpoint's health as its chains see it: closed, open or half-open.

    Closed, calls go to the endpoint.  ``failures`` failed requests in a row open
    it: calls skip the endpoint until ``cooldown_s`` has passed.  Then it is
    half-open: one call at a time may probe it; a reply closes the breaker, a
    failure opens it for another cooldown.  Thread-safe (Ray workers run several
    event loops in one process).

    Args:
        failures: Failed requests in a row that open the breaker.
        cooldown_s: How long it stays open before a probe.
        clock: The time source (`time.monotonic`).
    """

    def __init__(
        self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._opened_at: float | None = None
        self._probing = False
        #: How many times it opened, for `plait check` and the usage report.
        self.opened = 0

    @property
    def state(self) -> BreakerState:
        """``"closed"``, ``"open"`` (calls skip the endpoint) or ``"half-open"`` (its
        cooldown has passed: the next call probes it)."""
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if self.clock() - self._opened_at < self.cooldown_s:
            return "open"
        return "half-open"

    def admit(self) -> bool | None:
        """Whether a call may go to the endpoint now.

        Returns:
            True (closed), None (half-open: this call is the probe, and must be
            followed by `succeeded`, `failed` or `abandoned`), or False (open, or
            another call is probing).
        """
        with self._lock:
            state = self._state()
            if state == "closed":
                return True
            if state == "open" or self._probing:
                return False
            self._probing = True
            return None

    def succeeded(self) -> None:
        """A request to the endpoint got a reply: the breaker closes."""
        with self._lock:
            self._in_a_row = 0
            self._opened_at = None
            self._probing = False

    def failed(self) -> None:
        """A request failed in a way that moves calls on: one more in a row, which
        may open the breaker (a failed probe opens it again at once)."""
        with self._lock:
            self._in_a_row += 1
            probe = self._probing
            self._probing = False
            if probe or (self._opened_at is None and self._in_a_row >= self.failures):
                self._opened_at = self.clock()
                self.opened += 1

    def abandoned(self) -> None:
        """A probe ended with no verdict (its call was cancelled, or failed in a way
        that says nothing of the endpoint): another call may probe."""
        with self._lock:
            self._probing = False

    def is_open(self) -> bool:
        """Whether calls skip the endpoint now (open, cooldown not over)."""
        with self._lock:
            return self._state() == "open"


_lock = threading.Lock()
_breakers: dict[tuple[str, str, str], CircuitBreaker] = {}
_factory: list[Callable[[EndpointConfig], CircuitBreaker]] = []


def use_breakers(factory: Callable[[EndpointConfig], CircuitBreaker] | None) -> None:
    """Make this process's breakers with ``factory`` (None: local ones).

    A Ray worker (`plait.ray`) installs breakers that share their state through the
    cluster's broker, so an endpoint one worker found failing is skipped by all.

    Args:
        factory: Makes the breaker of an endpoint from its configuration.
    """
    with _lock:
        _factory[:] = [factory] if factory is not None else []
        _breakers.clear()


def breaker_for(config: EndpointConfig) -> CircuitBreaker:
    """The process-wide breaker of ``config``'s remote endpoint, following its settings.

    Args:
        config: An alias's configuration.

    Returns:
        The breaker every chain through that endpoint shares.
    """
    key = config.endpoint_key()
    with _lock:
        breaker = _breakers.get(key)
        if breaker is None:
            make = _factory[0] if _factory else _local_breaker
            breaker = _breakers[key] = make(config)
        else:
            breaker.failures = config.breaker_failures
            breaker.cooldown_s = config.breaker_cooldown_s
        return breaker


def _local_breaker(config: EndpointConfig) -> CircuitBreaker:
    return CircuitBreaker(config.breaker_failures, config.breaker_cooldown_s)


def reset_breakers() -> None:
    """Forget every breaker's state (they close; tests and long-lived services)."""
    with _lock:
        _breakers.clear()
