"""Another import path for the execution settings: ``plait.execution.context``.

The settings live in `plait.execution.settings`; this module keeps the import
``from plait.execution.context import get_execution_settings`` working.
"""

from plait.execution.settings import ExecutionSettings, get_execution_settings

__all__ = ["ExecutionSettings", "get_execution_settings"]
