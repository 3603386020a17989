"""Circuit breakers a Ray run's workers share through the cluster's broker.

A breaker (`plait.resources.routing.CircuitBreaker`) opens in the worker whose calls
met the failures; its peers would otherwise each pay ``breaker_failures`` failed
requests of their own before skipping a dead endpoint.  A `SharedBreaker` tells the
broker when it opens and when a probe closes it, and reads what the others said
(every half second while calls ask it, without waiting for the answer; once, waiting,
when it is made), so an endpoint one worker found failing is skipped by all until
its cooldown ends, when one call probes it again.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from plait.resources.config import EndpointConfig
from plait.resources.routing import CircuitBreaker

__all__ = ["SharedBreaker", "breaker_key"]

#: How often a breaker asks the broker what the other workers said.
REFRESH_S = 0.5
#: How long a new breaker waits for the broker's first answer.
FIRST_ANSWER_S = 5.0


def breaker_key(config: EndpointConfig) -> str:
    """The broker's name for an endpoint's breaker: its provider, URL and model."""
    provider, base_url, model = config.endpoint_key()
    return f"{provider}|{base_url}|{model}"


class SharedBreaker(CircuitBreaker):
    """A worker's breaker of one endpoint, kept in step with the broker's.

    Args:
        config: The endpoint's configuration (its breaker settings).
        broker: The cluster's `LimitBroker` actor.
    """

    def __init__(self, config: EndpointConfig, broker: Any) -> None:
        super().__init__(config.breaker_failures, config.breaker_cooldown_s)
        self.key = breaker_key(config)
        self.broker = broker
        self._asked = 0.0
        self._pending: Any = None
        try:
            import ray

            first = broker.breakers.remote()
            ready, _ = ray.wait([first], timeout=FIRST_ANSWER_S)
            if ready:
                self._adopt(ray.get(first))
        except Exception:  # a broker out of reach leaves the breaker local
            pass

    def admit(self) -> bool | None:
        self._refresh()
        return super().admit()

    def is_open(self) -> bool:
        self._refresh()
        return super().is_open()

    def failed(self) -> None:
        before = self._opened_at
        super().failed()
        opened = self._opened_at
        if opened is not None and opened != before:
            self._tell("breaker_opened", self.key, self.cooldown_s)

    def succeeded(self) -> None:
        was_open = self._opened_at is not None
        super().succeeded()
        if was_open:
            self._tell("breaker_closed", self.key)

    def _tell(self, method: str, *args: Any) -> None:
        # Not awaited: nothing to wait for.  A broker out of reach leaves the breaker
        # local (this worker still skips what it saw fail), as it was before sharing.
        with contextlib.suppress(Exception):
            getattr(self.broker, method).remote(*args)

    def _refresh(self) -> None:
        """Take the broker's latest answer if it has come, and ask again if it is time."""
        now = time.monotonic()
        pending = self._pending
        if pending is not None:
            import ray

            ready, _ = ray.wait([pending], timeout=0)
            if not ready:
                return
            self._pending = None
            with contextlib.suppress(Exception):  # the broker out of reach: stay local
                self._adopt(ray.get(pending))
        if now - self._asked >= REFRESH_S:
            self._asked = now
            try:
                self._pending = self.broker.breakers.remote()
            except Exception:
                self._pending = None

    def _adopt(self, open_for: dict[str, float]) -> None:
        """Open the breaker for as long as the broker says another worker opened it."""
        left = open_for.get(self.key, 0.0)
        if left <= 0:
            return
        with self._lock:
            now = self.clock()
            until = now + left
            mine = None if self._opened_at is None else self._opened_at + self.cooldown_s
            if mine is None or mine < until:
                self._opened_at = until - self.cooldown_s
                self._probing = False
