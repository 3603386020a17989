"""Blocks entered per context, not per object: what makes a handler or an
`ExecutionSettings` re-entrant.

One object may be entered by many tasks at once (a handler decorating an ``async
def`` that is gathered twice, a Ray worker running several batches under the same
handlers).  A `contextvars.Token` kept on the object belongs to whichever task
entered last, so the others' exits would reset a variable with a token made in
another context.  Instead each context's variable holds the entries themselves,
and leaving removes the owner's innermost entry from the context it is left in.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

__all__ = ["leave"]

E = TypeVar("E")


def leave(
    entries: ContextVar[tuple[E, ...]], owner: object, owner_of: Callable[[E], object]
) -> None:
    """Remove ``owner``'s innermost entry from ``entries`` as this context sees it."""
    current = entries.get()
    for position in range(len(current) - 1, -1, -1):
        if owner_of(current[position]) is owner:
            entries.set(current[:position] + current[position + 1 :])
            return
    raise RuntimeError(
        f"{type(owner).__name__} is left where it was not entered: enter and leave it in "
        "the same task (a `with`/`async with` block, or the function it decorates)"
    )
