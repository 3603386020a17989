"""`Pipeline`: a plait pipeline as a callable class for Ray Data's ``map_batches``.

    ds = ray.data.read_json("docs.jsonl")
    ds = ds.map_batches(
        plait.ray.Pipeline,
        fn_constructor_args=("review.py:Review",),
        fn_constructor_kwargs={"resources": "resources.toml", "input_column": "text"},
        concurrency=4,          # Ray Data's actors: each builds the pipeline once
        batch_size=64,
    )
    ds.write_parquet("out/")

Each actor builds the pipeline once and runs every row of a batch concurrently,
like ``run_sync`` on a list.  A row that fails gets its error in ``error_column``
(type and message) and None in ``output_column``: a failed row never fails the
job.  Every actor's endpoints lease their capacity from the cluster's broker
(`plait.ray.broker`), so ``max_concurrent``, ``requests_per_minute`` and
``tokens_per_minute`` hold for the whole dataset, however many actors run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plait.values import Value

__all__ = ["Pipeline"]


def _build_module(target: Any, arguments: Sequence[str]) -> Any:
    from plait.module import Module

    if isinstance(target, str):
        from plait.cli.target import Target

        return Target(target, list(arguments)).make()
    if arguments:
        raise ValueError("arguments (key=value) apply to a TARGET string only")
    if isinstance(target, Module):
        return target
    if callable(target):
        built = target()
        if not isinstance(built, Module):
            raise TypeError(
                f"the pipeline factory {target!r} returned a {type(built).__name__}, not a "
                "plait.Module"
            )
        return built
    raise TypeError(
        "Pipeline takes a TARGET ('file.py:Name' or 'package.module:Name'), a Module class "
        f"or factory, or a Module; got {type(target).__name__}"
    )


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, tuple):
        return list(value)
    return value


class Pipeline:
    """Runs a plait pipeline over each batch of a Ray Dataset (see the module docstring).

    ``target``: ``"file.py:Name"`` / ``"package.module:Name"`` (with ``arguments``,
    the ``key=value`` settings of ``plait run``), a Module class or factory, or a
    Module.  ``resources``: a `ResourceConfig`, a mapping, or the path of a TOML/YAML
    resource file (read on each actor; keys come from the actor's environment).
    ``input_column`` is passed as the one argument of ``forward``; with
    ``input_columns``, those columns are passed as keyword arguments instead.
    """

    def __init__(
        self,
        target: str | Callable[[], Any] | Any,
        *,
        resources: Any = None,
        input_column: str = "text",
        input_columns: Sequence[str] | None = None,
        output_column: str = "output",
        error_column: str = "error",
        arguments: Sequence[str] = (),
        max_concurrent: int | None = None,
    ) -> None:
        from plait.ray.cluster import broker
        from plait.ray.governor import LeasedGovernor
        from plait.resources.config import ResourceConfig
        from plait.resources.manager import ResourceManager, use_governors

        limits = broker()
        worker = f"data:{os.getpid()}:{id(self):x}"

        def governor(config: Any) -> Any:
            return LeasedGovernor(config, limits, worker)

        use_governors(governor)
        if isinstance(resources, str | os.PathLike):
            resources = ResourceConfig.load(Path(resources))
        self.module = _build_module(target, arguments)
        self.resources = ResourceManager.coerce(resources)
        self.input_column = input_column
        self.input_columns = list(input_columns) if input_columns else None
        self.output_column = output_column
        self.error_column = error_column
        self.max_concurrent = max_concurrent

    def _inputs(self, rows: dict[str, Any], count: int) -> list[Any]:
        if self.input_columns:
            missing = [c for c in self.input_columns if c not in rows]
            if missing:
                raise KeyError(
                    f"the batch has no column(s) {missing} (it has {sorted(rows)}); set "
                    "input_columns to columns of the dataset"
                )
            return [{c: _plain(rows[c][i]) for c in self.input_columns} for i in range(count)]
        if self.input_column not in rows:
            raise KeyError(
                f"the batch has no column {self.input_column!r} (it has {sorted(rows)}); set "
                "input_column to the column that holds the pipeline's input"
            )
        return [_plain(v) for v in rows[self.input_column]]

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        frame = batch if isinstance(batch, pd.DataFrame) else None
        rows = {c: list(frame[c]) for c in frame.columns} if frame is not None else dict(batch)
        count = len(next(iter(rows.values()))) if rows else 0
        inputs = self._inputs(rows, count)
        options: dict[str, Any] = {"resources": self.resources}
        if self.max_concurrent is not None:
            options["max_concurrent"] = self.max_concurrent
        if self.input_columns:
            results = self._run_kwargs(inputs, options)
        else:
            results = self.module.run_sync(inputs, **options) if inputs else []
        outputs: list[Any] = []
        errors: list[str | None] = []
        for result in results:
            if isinstance(result, Value) and result.is_error:
                meta = result.meta
                kind = meta.get("error_type") or type(result.payload).__name__
                errors.append(f"{kind}: {meta.get('message', result.payload)}")
                outputs.append(None)
            else:
                errors.append(None)
                outputs.append(_jsonable(result))
        if frame is not None:
            out = frame.copy()
            out[self.output_column] = outputs
            out[self.error_column] = errors
            return out
        import numpy as np

        result_batch = dict(batch)
        result_batch[self.output_column] = np.array(outputs, dtype=object)
        result_batch[self.error_column] = np.array(errors, dtype=object)
        return result_batch

    def _run_kwargs(self, inputs: list[dict[str, Any]], options: dict[str, Any]) -> list[Any]:
        """Rows as keyword arguments: one concurrent batch through a small wrapper."""
        from plait.execution.loop import run_blocking

        module = self.module

        async def all_rows() -> list[Any]:
            import asyncio

            from plait.values import error_value

            async def one(kwargs: dict[str, Any]) -> Any:
                try:
                    return await module(**kwargs, **options)
                except Exception as exc:
                    failed = getattr(exc, "value", None)
                    return failed if isinstance(failed, Value) else error_value(exc)

            return await asyncio.gather(*(one(kw) for kw in inputs))

        return run_blocking(all_rows())


def _plain(value: Any) -> Any:
    """A cell as Python data (numpy scalars and arrays become their Python forms)."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return value
