"""A concurrency limiter that serves waiters by priority.

plait orders waiters by input index, so when a batch saturates an endpoint the
oldest inputs finish first: the window of inputs in flight keeps moving and no
input starves behind newer ones.  Once a batch has no inputs left to admit, the
engine switches its waiters to critical-path order (see `Priority`) so the last
wave is not stretched by a dependency chain.  Slots are handed directly to the
next waiter on release (no thundering herd), and the limiter works across event
loops and threads, since its limits are shared by the whole process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from typing import Any, ClassVar

__all__ = ["Priority", "PriorityLimiter"]

#: A waiter's rank: lower goes first; compared as a plain tuple.
Key = tuple[float, ...]


class Priority:
    """A waiter's rank that may change while it waits (see `PriorityLimiter.reorder`)."""

    __slots__ = ()

    def key(self) -> Key:
        raise NotImplementedError


class PriorityLimiter:
    """A concurrency limit whose waiters go in priority order, so the oldest inputs finish first.

    At most ``limit`` holders at once; waiters with the lowest priority go first
    (first come, first served on ties).  A released slot is handed directly to
    the next waiter.  It works across event loops and threads: an endpoint's
    limit is shared by the whole process.  ``async with limiter:`` holds a slot
    for the block.

    Args:
        limit: The most holders at once, at least 1.

    Raises:
        ValueError: ``limit`` is below the minimum.

    Examples:
        ```python
        import asyncio

        from plait.resources import PriorityLimiter


        async def main() -> None:
            limiter = PriorityLimiter(1)
            served: list[int] = []

            async def job(priority: int) -> None:
                await limiter.acquire(priority)
                served.append(priority)
                limiter.release()

            await limiter.acquire()  # hold the only slot while three jobs queue up
            jobs = [asyncio.create_task(job(priority)) for priority in (3, 1, 2)]
            while limiter.waiting < 3:
                await asyncio.sleep(0)
            limiter.release()
            await asyncio.gather(*jobs)
            print(served)


        asyncio.run(main())
        ```
    """

    #: The least limit allowed (a leased limiter starts with none: `plait.ray`).
    minimum = 1
    #: Whether `try_acquire` may stand in for `acquire`: not in a subclass that overrides
    #: ``acquire``, whose slots may need more than a free one (a lease, `plait.ray`).
    takes_free_slots: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "acquire" in cls.__dict__:
            cls.takes_free_slots = False

    def __init__(self, limit: int) -> None:
        if limit < self.minimum:
            raise ValueError(f"a concurrency limit must be at least {self.minimum}, got {limit}")
        self._limit = limit
        self._held = 0
        self._waiters: list[tuple[Key, int, asyncio.Future[None], Priority | None]] = []
        self._granted: set[asyncio.Future[None]] = set()
        self._seq = itertools.count()
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """The most holders at once."""
        return self._limit

    @property
    def held(self) -> int:
        """The slots held now."""
        return self._held

    @property
    def waiting(self) -> int:
        """The callers waiting for a slot now."""
        return len(self._waiters)

    def set_limit(self, limit: int) -> None:
        """Change the limit: a raise admits waiters at once, a cut takes effect as holders leave.

        Args:
            limit: The new limit, at least the minimum.

        Raises:
            ValueError: ``limit`` is below the minimum.
        """
        if limit < self.minimum:
            raise ValueError(f"a concurrency limit must be at least {self.minimum}, got {limit}")
        with self._lock:
            self._limit = limit
            woken = self._admit_locked()
        _wake(woken)

    def try_acquire(self) -> bool:
        """Take a slot without waiting, if one is free and nobody waits.

        A plain call: the call path creates no coroutine for a limit that is not full.

        Returns:
            True when a slot was taken (release it later); False when the caller
                must await `acquire`.
        """
        if not self.takes_free_slots:
            return False
        with self._lock:
            if self._held < self._limit and not self._waiters:
                self._held += 1
                return True
        return False

    async def acquire(self, priority: float | Priority = 0.0) -> None:
        """Wait for a slot; lower priorities are served first.

        A caller cancelled while waiting gives up its place (or passes on a slot
        handed to it at that moment).

        Args:
            priority: A number (lower goes first), or a `Priority` whose rank may
                change while it waits.
        """
        with self._lock:
            if self._held < self._limit and not self._waiters:
                self._held += 1
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if isinstance(priority, Priority):
                key, ranked = priority.key(), priority
            else:
                key, ranked = (priority,), None
            heapq.heappush(self._waiters, (key, next(self._seq), fut, ranked))
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                if fut in self._granted:
                    # The slot was handed over just as we were cancelled: pass it on.
                    self._granted.discard(fut)
                    self._held -= 1
                    woken = self._admit_locked()
                else:
                    self._waiters = [w for w in self._waiters if w[2] is not fut]
                    heapq.heapify(self._waiters)
                    woken = []
            _wake(woken)
            raise
        with self._lock:
            self._granted.discard(fut)

    def reorder(self) -> None:
        """Re-rank waiters whose `Priority` has changed its key since they queued."""
        with self._lock:
            self._waiters = [
                (p.key() if p is not None else key, seq, fut, p)
                for key, seq, fut, p in self._waiters
            ]
            heapq.heapify(self._waiters)

    def release(self) -> None:
        """Give back a slot taken with `acquire` or `try_acquire`, waking the next waiter."""
        with self._lock:
            self._held -= 1
            if not self._waiters:
                return
            woken = self._admit_locked()
        _wake(woken)

    def _admit_locked(self) -> list[asyncio.Future[None]]:
        woken = []
        while self._waiters and self._held < self._limit:
            fut = heapq.heappop(self._waiters)[2]
            if fut.done():
                continue
            self._held += 1
            self._granted.add(fut)
            woken.append(fut)
        return woken

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        loop = fut.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            if not fut.done():
                fut.set_result(None)
        else:
            loop.call_soon_threadsafe(_set_if_pending, fut)


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
