"""The one piece of tracing state that low-level objects need to see.

`Parameter` must turn into a placeholder token when it is formatted while a graph
is being recorded, but it cannot import the tracer (the tracer imports it).  The
active tracer publishes itself here instead.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Protocol

__all__ = ["ActiveTracer", "active_tracer"]


class ActiveTracer(Protocol):
    #: False while code that has real values runs with its module calls recorded.
    lift_parameters: bool

    def lift_parameter(self, param: Any) -> str:
        """A placeholder string that stands for ``param`` in the recorded graph."""
        ...


active_tracer: ContextVar[ActiveTracer | None] = ContextVar("plait_active_tracer", default=None)
