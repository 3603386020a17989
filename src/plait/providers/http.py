"""One aiohttp session per event loop, closed when that loop shuts down.

Keeping the session for the life of the loop reuses connections across calls
(a TLS handshake per call would dominate latency against real APIs); `run_sync`
uses plait's long-lived runtime loop, so its connections outlive each call.  A
loop has no close hook, but `asyncio.run` and the runtime loop both finalize
async generators on shutdown, so a parked generator closes the session then.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator

import aiohttp

__all__ = ["close_session", "current_session", "get_session"]

_sessions: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncGenerator[None, None]]
] = weakref.WeakKeyDictionary()


async def _keeper(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await session.close()


#: The session last looked up, and its loop (weakly): most processes run their calls
#: on one loop, which then finds its session without a weak-keyed lookup per call.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], aiohttp.ClientSession] | None = None


def current_session() -> aiohttp.ClientSession | None:
    """This loop's open session, or None (then `get_session` makes one): a plain call,
    so the call path creates no coroutine for a session that exists."""
    global _last
    loop = asyncio.get_running_loop()
    last = _last
    if last is not None and last[0]() is loop and not last[1].closed:
        return last[1]
    entry = _sessions.get(loop)
    if entry is None or entry[0].closed:
        return None
    _last = (weakref.ref(loop), entry[0])
    return entry[0]


async def get_session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    entry = _sessions.get(loop)
    if entry is not None and not entry[0].closed:
        return entry[0]
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    session = aiohttp.ClientSession(connector=connector, trust_env=False)
    keeper = _keeper(session)
    await keeper.__anext__()
    _sessions[loop] = (session, keeper)
    return session


async def close_session() -> None:
    """Close this loop's session now (plait does this at the end of `run_sync`)."""
    global _last
    entry = _sessions.pop(asyncio.get_running_loop(), None)
    if entry is not None:
        if _last is not None and _last[1] is entry[0]:
            _last = None  # no call finds it while it closes
        await entry[1].aclose()
