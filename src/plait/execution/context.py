"""The execution context under the name seed 000 uses: ``plait.execution.context``.

The settings live in `plait.execution.settings`; this module gives the seed's
import path (``from plait.execution.context import get_execution_settings``).
"""

from plait.execution.settings import ExecutionSettings, get_execution_settings

__all__ = ["ExecutionSettings", "get_execution_settings"]
