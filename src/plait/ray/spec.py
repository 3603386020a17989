"""What a driver sends its workers: the pipeline by value, the resources by reference."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from plait.execution.checkpoint import Checkpoint, pipeline_name, producer_identity
from plait.ray.worker import PipelineSpec
from plait.resources.manager import ResourceManager

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["make_spec"]


def _user_modules(module: Module) -> list[Any]:
    """The Python modules defining the pipeline's classes, and the functions its modules
    hold (a loss's metric), that workers may not import by name (a ``file.py:Name``
    target, a ``--metric file.py:function``, a script, a notebook): sent by value."""
    import inspect
    import sysconfig

    libraries = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    found = {}
    for part in module.modules():
        names = [cls.__module__ for cls in type(part).__mro__]
        names += [f.__module__ for f in vars(part).values() if inspect.isfunction(f)]
        for name in names:
            if name == "builtins" or name.split(".")[0] == "plait" or name in found:
                continue
            source = sys.modules.get(name)
            path = getattr(source, "__file__", None) or ""
            if source is not None and not any(path.startswith(lib) for lib in libraries):
                found[name] = source
    return list(found.values())


#: How many specs being made at this moment send each module by value.  cloudpickle
#: keeps one process-wide set of such modules: two passes made at once from two threads
#: (a training run's) would otherwise take the module out of it under each other, and
#: the second would fail, or pickle the pipeline by reference.
_by_value_users: dict[str, int] = {}
_by_value_lock = threading.Lock()


@contextlib.contextmanager
def _by_value(sources: list[Any]) -> Iterator[None]:
    """Have cloudpickle send ``sources`` by value inside the block, counted."""
    from ray import cloudpickle

    names = []
    with _by_value_lock:
        theirs = set(cloudpickle.list_registry_pickle_by_value()) - set(_by_value_users)
        for source in sources:
            name = source.__name__
            if name in theirs:  # registered by the user: theirs to keep
                continue
            if name not in _by_value_users:
                try:
                    cloudpickle.register_pickle_by_value(source)
                except ValueError:  # not importable by name as it stands: pickled as is
                    continue
                _by_value_users[name] = 0
            _by_value_users[name] += 1
            names.append((name, source))
    try:
        yield
    finally:
        with _by_value_lock:
            for name, source in names:
                _by_value_users[name] -= 1
                if not _by_value_users[name]:
                    del _by_value_users[name]
                    cloudpickle.unregister_pickle_by_value(source)


def make_spec(
    module: Module,
    resources: Any,
    options: dict[str, Any],
    checkpoint: Checkpoint | None = None,
) -> PipelineSpec:
    """What a driver sends its Ray workers to run ``module``: the pipeline, resources and keys.

    The module is pickled here, once, with cloudpickle (the Python modules that
    define its classes, when workers cannot import them by name, go by value);
    the resources go as their configuration, not live endpoints.  Keys given by
    reference (``api_key_env``) travel as secrets, never printed; each worker
    exports them into its own environment.

    Args:
        module: The pipeline.
        resources: What ``ResourceManager.coerce`` accepts.
        options: The run's options; ``max_concurrent``, ``max_inputs_in_flight``
            and ``seed`` are kept.
        checkpoint: The run's checkpoint, which workers write their calls to.

    Returns:
        The spec a `PipelineWorker` is built from.

    Raises:
        TypeError: The pipeline cannot be pickled; the message says what to keep
            out of its attributes.
    """
    from ray import cloudpickle

    manager = ResourceManager.coerce(resources)
    config = manager.config if manager.config else None
    bound = (module._bound_resources, module._bound_config)
    try:
        with _by_value(_user_modules(module)):
            object.__setattr__(module, "_bound_resources", config)
            object.__setattr__(module, "_bound_config", {})
            data = cloudpickle.dumps(module)
    except Exception as exc:
        raise TypeError(
            f"the pipeline {type(module).__name__} cannot be sent to Ray workers: pickling it "
            f"failed ({type(exc).__name__}: {exc}); keep live objects (connections, open "
            "files, locks) out of its attributes, or build them in forward"
        ) from exc
    finally:
        object.__setattr__(module, "_bound_resources", bound[0])
        object.__setattr__(module, "_bound_config", bound[1])
    keep = {
        k: v for k, v in options.items() if k in ("max_concurrent", "max_inputs_in_flight", "seed")
    }
    from pydantic import SecretStr

    secrets = {}
    for alias in config or {}:
        name = config[alias].api_key_env if config is not None else None
        if name and os.environ.get(name):
            secrets[name] = SecretStr(os.environ[name])
    return PipelineSpec(
        module_bytes=data,
        resources=config,
        options=keep,
        pipeline=pipeline_name(module),
        producer=producer_identity(module, manager, options.get("seed")),
        # Absolute: a worker of a cluster the run joined has its own working directory.
        checkpoint_dir=str(checkpoint.directory.resolve()) if checkpoint is not None else None,
        secrets=secrets,
    )
