"""Running traced graphs: the engine, batches, streaming, settings and checkpoints.

The names below load their modules on first use, so a light part of this layer (the
backend registry, the settings) can be imported without the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait._lazy import lazy_exports

if TYPE_CHECKING:
    from plait.execution.batch import BatchResult
    from plait.execution.checkpoint import CheckpointError
    from plait.execution.runtime import run, run_blocking
    from plait.execution.settings import ExecutionSettings, get_execution_settings

__getattr__ = lazy_exports(
    __name__,
    {
        "BatchResult": "plait.execution.batch",
        "CheckpointError": "plait.execution.checkpoint",
        "run": "plait.execution.runtime",
        "run_blocking": "plait.execution.runtime",
        "ExecutionSettings": "plait.execution.settings",
        "get_execution_settings": "plait.execution.settings",
    },
)

__all__ = [
    "BatchResult",
    "CheckpointError",
    "ExecutionSettings",
    "get_execution_settings",
    "run",
    "run_blocking",
]
