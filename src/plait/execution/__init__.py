"""Running traced graphs: the engine, batches, streaming, settings and checkpoints."""

from plait.execution.batch import BatchResult
from plait.execution.checkpoint import CheckpointError
from plait.execution.runtime import run, run_blocking
from plait.execution.settings import ExecutionSettings, get_execution_settings

__all__ = [
    "BatchResult",
    "CheckpointError",
    "ExecutionSettings",
    "get_execution_settings",
    "run",
    "run_blocking",
]
