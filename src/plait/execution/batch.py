"""`BatchResult`: one streamed result of a batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BatchResult"]


@dataclass(slots=True)
class BatchResult:
    """The outcome of input number ``index``: its ``output``, or the ``error`` that stopped it.

    ``error`` is an `ExecutionError` whose ``.value`` is the Value(ERROR) with the
    module path, exception type, message and traceback.
    """

    index: int
    input: Any
    output: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
