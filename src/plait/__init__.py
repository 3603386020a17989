"""plait: the PyTorch programming model for LLM pipelines.

Write `Module`s with a plain ``forward()``; plait traces the calls into one
dependency graph, runs it with as much concurrency as the endpoints allow, and
returns every output (or a `Value` of kind ERROR that says why not).

The execution and resource layers (and their aiohttp and pydantic imports) load
on first use, so ``import plait`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plait import handlers
from plait._lazy import lazy_exports
from plait._version import __version__
from plait.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from plait.effects import Runtime, install_runtime
from plait.execution.backends import register_backend
from plait.inference import LLMInference
from plait.module import BackwardContext, BackwardResult, Module
from plait.parameter import Parameter
from plait.tracing import TracingError
from plait.values import ExecutionError, Value, ValueKind, unwrap, valueify

if TYPE_CHECKING:
    from plait import functional
    from plait.blueprint import Blueprint, make_from_argv
    from plait.demos import knn_demos
    from plait.execution import BatchResult, CheckpointError, ExecutionSettings, run
    from plait.resources import EndpointConfig, ResourceConfig, ResourceManager
    from plait.resources.config import ConfigurationError
    from plait.resources.usage import reset_usage, usage
    from plait.sampling import Rng
    from plait.sequences import MapReduce, Recurrence, Refine, chunk_text


# -- the composition root: what the core hands its calls to ------------------------------
def _runtime() -> Runtime:
    """plait's runtime, loaded at the first call that needs it (so ``import plait``
    stays fast), with the backward pass the core's `Value.backward` reaches."""
    from plait.execution.runtime import ExecutionRuntime
    from plait.learning.backward import backward

    return ExecutionRuntime(backward)


def _local_backend() -> Any:
    """This process as a backend, with the `Trainer`'s passes (which live in the
    learning layer, above the runtime)."""
    from plait.learning.passes import LocalTrainingBackend

    return LocalTrainingBackend()


def _ray_backend() -> Any:
    from plait.ray.backend import RayBackend

    return RayBackend()


def _batch_backend() -> Any:
    from plait.execution.batch_api import BatchAPIBackend

    return BatchAPIBackend()


install_runtime(_runtime)
register_backend("local", _local_backend)
register_backend("ray", _ray_backend)
register_backend("batch", _batch_backend)

_LAZY = {
    "BatchResult": "plait.execution",
    "CheckpointError": "plait.execution",
    "ExecutionSettings": "plait.execution",
    "run": "plait.execution",
    "EndpointConfig": "plait.resources",
    "ResourceConfig": "plait.resources",
    "ResourceManager": "plait.resources",
    "ConfigurationError": "plait.resources.config",
    "usage": "plait.resources.usage",
    "reset_usage": "plait.resources.usage",
    "functional": "plait.functional",
    "Blueprint": "plait.blueprint",
    "make_from_argv": "plait.blueprint",
    "Recurrence": "plait.sequences",
    "Refine": "plait.sequences",
    "MapReduce": "plait.sequences",
    "chunk_text": "plait.sequences",
    "Rng": "plait.sampling",
    "knn_demos": "plait.demos",
    "serve": "plait.serve",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "BackwardContext",
    "BackwardResult",
    "BatchResult",
    "Blueprint",
    "CheckpointError",
    "ConfigurationError",
    "EndpointConfig",
    "ExecutionError",
    "ExecutionSettings",
    "LLMInference",
    "MapReduce",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "Recurrence",
    "Refine",
    "ResourceConfig",
    "ResourceManager",
    "Rng",
    "Sequential",
    "TracingError",
    "Value",
    "ValueKind",
    "__version__",
    "chunk_text",
    "functional",
    "handlers",
    "knn_demos",
    "make_from_argv",
    "reset_usage",
    "run",
    "serve",
    "unwrap",
    "usage",
    "valueify",
]
