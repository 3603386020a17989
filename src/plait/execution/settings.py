"""`ExecutionSettings`: run options for every call inside a ``with`` block.

Precedence, highest first: per-call keyword arguments, `Module.bind()`, the
innermost `ExecutionSettings` (which inherits whatever it does not set from the
ones around it), then `plait.options.DEFAULTS`.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

from plait._entries import leave
from plait.options import DEFAULTS, SETTING_NAMES, check_setting_names

__all__ = [
    "DEFAULTS",
    "SETTING_NAMES",
    "ExecutionSettings",
    "check_setting_names",
    "get_execution_settings",
    "resolve_options",
]

#: The blocks open in this context, innermost last: (the block, its merged settings).
#: One `ExecutionSettings` may be entered by several tasks at once (see `plait._entries`).
_blocks: ContextVar[tuple[tuple[ExecutionSettings, ExecutionSettings], ...]] = ContextVar(
    "plait_settings", default=()
)


def _current() -> ExecutionSettings | None:
    blocks = _blocks.get()
    return blocks[-1][1] if blocks else None


class ExecutionSettings:
    """Options shared by every plait call made inside the block (sync or async ``with``).

    Blocks nest: an inner block inherits what it does not set from the blocks
    around it.  Per-call options and `Module.bind` rank above these.  An option
    left at None is not set here.

    Args:
        resources: Aliases to endpoints: a `ResourceConfig`, a `ResourceManager` or
            a mapping.
        max_concurrent: LLM calls in flight for one run, across its whole batch
            (default 100).
        checkpoint_dir: A directory that makes batches resumable: a rerun skips the
            inputs (and calls) already done.
        streaming: Batch calls yield `BatchResult`s as they complete.
        preserve_order: Streaming yields in input order.
        max_inputs_in_flight: How many batch inputs are traced and running at once
            (default ``max(64, 2 * max_concurrent)``).
        workers: Run batches on this many Ray worker processes, with every
            endpoint's limits held cluster-wide (`plait.ray`).
        ray_address: Join this Ray cluster (``"auto"`` for the local one) instead of
            starting Ray for the run.
        seed: The run seed: every LLM call sends a seed derived from it, so a
            sampled run repeats exactly (`plait.sampling`).
        backend: Where batches run, by the name it is registered under:
            ``"local"``, ``"ray"``, ``"batch"`` (a provider's batch API) or one of
            your own; by default Ray when ``workers`` or ``ray_address`` is set,
            else this process.

    Raises:
        ValueError: When a count is not a positive integer or ``backend`` is not a
            name.
        plait.sampling.SeedError: When ``seed`` is not a non-negative integer.

    Examples:
        ```python
        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.")
        with plait.ExecutionSettings(resources=resources, max_concurrent=8, seed=42):
            print(summarize.run_sync(["First text.", "Second text."]))
        ```
    """

    def __init__(
        self,
        resources: Any = None,
        max_concurrent: int | None = None,
        checkpoint_dir: str | Path | None = None,
        streaming: bool | None = None,
        preserve_order: bool | None = None,
        max_inputs_in_flight: int | None = None,
        workers: int | None = None,
        ray_address: str | None = None,
        seed: int | None = None,
        backend: str | None = None,
    ) -> None:
        self.resources = resources
        self.max_concurrent = max_concurrent
        self.checkpoint_dir = checkpoint_dir
        self.streaming = streaming
        self.preserve_order = preserve_order
        self.max_inputs_in_flight = max_inputs_in_flight
        self.workers = workers
        self.ray_address = ray_address
        self.seed = seed
        self.backend = backend
        _validate(self.explicit())
        from plait.sampling import CallCounts

        #: Seeded functional calls made in this block outside any run: the same
        #: request twice gets two seeds.
        self.calls = CallCounts()

    def explicit(self) -> dict[str, Any]:
        """The options this block sets itself.

        Returns:
            Option names to values, for the options that are not None.
        """
        return {name: getattr(self, name) for name in DEFAULTS if getattr(self, name) is not None}

    def __enter__(self) -> ExecutionSettings:
        parent = _current()
        merged = ExecutionSettings(**(parent.explicit() if parent else {}))
        for name, value in self.explicit().items():
            setattr(merged, name, value)
        _blocks.set((*_blocks.get(), (self, merged)))
        return self

    def __exit__(self, *exc: object) -> None:
        leave(_blocks, self, lambda block: block[0])

    async def __aenter__(self) -> ExecutionSettings:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.explicit().items())
        return f"ExecutionSettings({inner})"


def get_execution_settings() -> ExecutionSettings | None:
    """The settings in force here (already merged with the enclosing blocks), if any.

    Returns:
        The innermost block's merged settings, or None outside any block.
    """
    return _current()


def _validate(options: dict[str, Any]) -> None:
    for name in ("max_concurrent", "max_inputs_in_flight", "workers"):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    backend = options.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ValueError(
            f"backend must be the name of a registered backend (e.g. 'local', 'ray'), "
            f"got {backend!r}"
        )
    if options.get("seed") is not None:
        from plait.sampling import check_seed

        check_seed(options["seed"], "seed")


def resolve_options(
    call: dict[str, Any], bound: dict[str, Any], bound_resources: Any
) -> dict[str, Any]:
    """Merge the layers: call > bind() > ExecutionSettings > defaults."""
    merged = dict(DEFAULTS)
    settings = _current()
    if settings is not None:
        merged.update(settings.explicit())
    if bound_resources is not None:
        merged["resources"] = bound_resources
    merged.update({k: v for k, v in bound.items() if v is not None})
    merged.update({k: v for k, v in call.items() if v is not None})
    _validate(merged)
    return merged
