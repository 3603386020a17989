"""`BatchResult`: one streamed result of a batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BatchResult"]


@dataclass(slots=True)
class BatchResult:
    """The outcome of input number ``index`` of a streamed batch (`Module.stream`).

    Attributes:
        index: The input's position in the batch.
        input: The input itself.
        output: Its output (None when it failed).
        error: None, or the `ExecutionError` that stopped it: its ``.value`` is the
            Value(ERROR) with the module path, exception type, message and traceback.
    """

    index: int
    input: Any
    output: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the input finished without an error."""
        return self.error is None
