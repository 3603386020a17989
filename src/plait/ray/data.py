"""`Pipeline`: a plait pipeline as a callable class for Ray Data's ``map_batches``.

```python
ds = ray.data.read_json("/data/docs.jsonl")  # paths Ray's workers can see
ds = ds.map_batches(
    plait.ray.Pipeline,
    fn_constructor_args=("review.py:Review",),
    fn_constructor_kwargs={"resources": "resources.toml", "input_column": "text"},
    concurrency=4,  # Ray Data's actors: each builds the pipeline once
    num_cpus=0.5,  # they mostly wait on the network; reads and writes need CPUs
    batch_size=64,
)
ds.write_parquet("/data/out")
```

Each actor builds the pipeline once and runs every row of a batch concurrently,
like ``run_sync`` on a list.  A row that fails gets its error in ``error_column``
(type and message) and None in ``output_column``: a failed row never fails the
job.  Every actor's endpoints lease their capacity from the cluster's broker
(`plait.ray.broker`), so ``max_concurrent``, ``requests_per_minute`` and
``tokens_per_minute`` hold for the whole dataset, however many actors run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plait.values import Value

__all__ = ["Pipeline"]


def _build_module(target: Any, arguments: Sequence[str]) -> Any:
    from plait.module import Module

    if isinstance(target, str):
        from plait.target import Target

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
    """An output as plain data Arrow can type: models and dataclasses become dicts
    (at any depth), tuples and sets lists, numpy scalars Python numbers."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in value]
    if isinstance(value, str | bytes | bool | int | float) or value is None:
        return value
    return _plain(value)


class Pipeline:
    """Runs a plait pipeline over a Ray Dataset: the class to give ``map_batches``.

    Each Ray Data actor builds the pipeline once and runs every row of a batch
    concurrently, like ``run_sync`` on a list.  A row that fails gets its error in
    ``error_column`` (type and message) and None in ``output_column``: a failed row
    never fails the job.  Every actor's endpoints lease their capacity from the
    cluster's broker, so ``max_concurrent``, ``requests_per_minute`` and
    ``tokens_per_minute`` hold for the whole dataset, however many actors run.

    Each batch comes back as an Arrow table: the batch's columns, then
    ``output_column`` (structured outputs as plain dicts and lists) and
    ``error_column`` (a string, null when the row succeeded).  Needs
    ``pip install 'plait[ray]'``.

    Args:
        target: ``"file.py:Name"`` or ``"package.module:Name"``, a Module class or
            factory, or a Module.  Relative paths (of a target file or a resource
            file) are read on each actor, from its working directory.
        resources: A `ResourceConfig`, a mapping of aliases, or the path of a
            TOML/YAML resource file (read on each actor; keys come from the
            actor's environment).
        input_column: The column passed as ``forward``'s one argument.
        input_columns: Columns passed as keyword arguments of ``forward`` instead.
        output_column: The column the outputs go to.
        error_column: The column the errors go to.
        output_type: A ``pyarrow.DataType`` (``pa.string()``) every batch's output
            column is written with.  Without it the type is inferred per batch, so
            a batch in which every row failed has a null-typed one; Parquet files
            read together as one table need the same type.  A row whose output
            does not fit it gets that as its error.
        arguments: ``key=value`` settings for a target string, as ``plait run``
            takes them.
        max_concurrent: A cap on each actor's LLM calls in flight.

    Raises:
        ValueError: ``output_column`` and ``error_column`` are the same, or
            ``arguments`` come with a target that is not a string.
        TypeError: ``target`` is none of the accepted kinds, or a factory
            returned no Module.
        ConfigurationError: The resource file or mapping is invalid.

    Examples:
        ```python
        import ray

        import plait
        import plait.ray


        class Review(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference("fast", "Review this text.")

            def forward(self, text: str) -> str:
                return self.llm(text)


        resources = {"fast": {"model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}}

        ray.init(include_dashboard=False)  # a local Ray, started for the example
        ds = ray.data.from_items([{"text": "Fast shipping."}, {"text": "Broke in a week."}])
        ds = ds.map_batches(
            plait.ray.Pipeline,
            fn_constructor_args=(Review,),
            fn_constructor_kwargs={"resources": resources, "input_column": "text"},
            concurrency=1,
            batch_size=16,
        )
        for row in ds.take_all():
            print(row["output"], row["error"])
        ray.shutdown()
        ```
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
        output_type: Any = None,
        arguments: Sequence[str] = (),
        max_concurrent: int | None = None,
    ) -> None:
        from plait.resources.config import ResourceConfig
        from plait.resources.manager import ResourceManager

        if output_column == error_column:
            raise ValueError(f"output_column and error_column are both {output_column!r}")
        if isinstance(resources, str | os.PathLike):
            resources = ResourceConfig.load(Path(resources))
        self.module = _build_module(target, arguments)
        self.resources = ResourceManager.coerce(resources)
        self.input_column = input_column
        self.input_columns = list(input_columns) if input_columns else None
        self.output_column = output_column
        self.error_column = error_column
        self.output_type = output_type
        self.max_concurrent = max_concurrent
        #: This Pipeline's leases from the broker (made on its first batch).
        self._scope: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Leases belong to the process that took them (their lease tasks, its Ray).
        return {**self.__dict__, "_scope": None}

    def _inputs(self, rows: Mapping[str, Any], count: int) -> list[Any]:
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
        """Run the pipeline on every row of one batch, as ``map_batches`` calls it.

        Args:
            batch: A dict of numpy arrays or a pandas DataFrame.

        Returns:
            The batch as an Arrow table, with the output and error columns added.

        Raises:
            KeyError: The batch lacks an input column.
        """
        import pandas as pd

        if isinstance(batch, pd.DataFrame):
            rows: Mapping[str, Any] = {c: list(batch[c]) for c in batch.columns}
            count = len(batch)
        else:
            rows = batch
            count = len(next(iter(rows.values()))) if rows else 0
        inputs = self._inputs(rows, count)
        options: dict[str, Any] = {"resources": self.resources}
        if self.max_concurrent is not None:
            options["max_concurrent"] = self.max_concurrent
        results: list[Any] = []
        if inputs:
            with self._leases():
                try:
                    if self.input_columns:
                        results = self._run_kwargs(inputs, options)
                    else:
                        results = self.module.run_sync(inputs, **options)
                finally:
                    self._release_leases()
        outputs: list[Any] = []
        errors: list[str | None] = []
        for result in results:
            if isinstance(result, Value) and result.is_error:
                errors.append(_error_text(result))
                outputs.append(None)
            else:
                output = _jsonable(result)
                problem = _unstorable(output)
                errors.append(problem)
                outputs.append(None if problem else output)
        return self._table(batch, outputs, errors)

    def _table(self, batch: Any, outputs: list[Any], errors: list[str | None]) -> Any:
        """The batch as an Arrow table with the output and error columns added."""
        import pyarrow as pa
        from ray.data.block import BlockAccessor, BlockType

        column = _arrow_column(outputs, errors, self.output_type)
        table = BlockAccessor.batch_to_block(batch, block_type=BlockType.ARROW)
        if not isinstance(table, pa.Table):  # the input columns do not fit Arrow: stay pandas
            import pandas as pd

            frame = BlockAccessor.for_block(table).to_pandas().copy()
            frame[self.output_column] = column.to_pylist()
            frame[self.error_column] = pd.Series(errors, dtype="string")
            return frame
        table = table.drop_columns(
            [c for c in (self.output_column, self.error_column) if c in table.column_names]
        )
        table = table.append_column(self.output_column, column)
        return table.append_column(self.error_column, pa.array(errors, type=pa.string()))

    def _leases(self) -> contextlib.AbstractContextManager[None]:
        """Make this Pipeline's own calls lease their limits from the cluster's broker.

        Only its own calls, in the context they run in: called in a driver (to try a
        map function locally), it must leave the driver's other runs on their local
        limits, which must not depend on a broker that goes with its Ray.  Where the
        whole process leases already (a pipeline worker), it uses those leases.
        """
        from plait.resources import manager

        if manager.leasing() and self._scope is None:
            return contextlib.nullcontext()
        with _leasing_lock:
            if self._scope is None:
                self._scope = manager.GovernorScope(_leased_governors())
        scope: manager.GovernorScope = self._scope
        return scope.active()

    def _release_leases(self) -> None:
        """Give the broker back every slot and unspent request this actor holds.

        Ray Data may end an actor as soon as its last batch is done, before its lease
        task's next report: the slots it held would stay counted against the endpoint
        until the broker takes the actor for dead (`LEASE_TTL_S`), starving the next
        dataset.  So each batch ends with one report from an idle worker, which holds
        nothing afterwards; the next batch leases again.
        """
        from plait.execution.loop import run_blocking
        from plait.ray.governor import LeasedGovernor
        from plait.resources import manager

        registry = manager._governors if self._scope is None else self._scope.governors
        governors = [
            g
            for g in list(registry.values())
            if isinstance(g, LeasedGovernor) and g._task is not None
        ]
        if governors:
            run_blocking(_report_idle(governors))

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


def _leased_governors() -> Callable[[Any], Any]:
    """A factory of governors that lease their limits from the cluster's broker, as
    one worker of it."""
    from plait.ray.cluster import broker
    from plait.ray.governor import LeasedGovernor

    limits = broker()
    worker = f"data:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def governor(config: Any) -> Any:
        return LeasedGovernor(config, limits, worker)

    return governor


_leasing_lock = threading.Lock()


async def _report_idle(governors: list[Any]) -> None:
    import asyncio
    import contextlib

    async def one(governor: Any) -> None:
        with contextlib.suppress(Exception):  # a broker out of reach: its TTL frees them
            await asyncio.wait_for(governor._next_grant(), 10.0)

    await asyncio.gather(*(one(g) for g in governors))


def _unstorable(output: Any) -> str | None:
    """The error of a row whose output cannot be kept in a block, or None.

    Arrow keeps what it cannot type as pickled Python objects, so an output that does
    not survive pickling (a lock, a connection) would fail the whole batch, and the
    job: it is that row's error instead (the same test as outputs of Ray workers).
    """
    from plait.ray.worker import pickling_problem

    problem = pickling_problem(output)
    if problem is None:
        return None
    return (
        f"Unsendable: the output (a {type(output).__name__}) cannot be stored in the "
        f"dataset: {problem}. Return plain data from forward (text, numbers, lists, "
        "dicts, dataclasses), not live objects such as locks, connections or open files"
    )


def _error_text(result: Value) -> str:
    """``"Type: message"`` for a row's ERROR value."""
    meta = result.meta
    kind = meta.get("error_type") or type(result.payload).__name__
    message = meta.get("message")
    return f"{kind}: {message if message is not None else result.payload}"


def _arrow_column(outputs: list[Any], errors: list[str | None], output_type: Any) -> Any:
    """The outputs as one Arrow array; with ``output_type``, a row that does not fit
    it becomes that row's error (``errors`` is updated) instead of failing the batch."""
    import pyarrow as pa

    conversion_errors = (pa.ArrowException, TypeError, ValueError, OverflowError)
    try:
        return pa.array(outputs, type=output_type)
    except conversion_errors:
        if output_type is None:
            # Rows of different shapes (a str here, a dict there): Arrow has no one type
            # for them, so they are kept as Python objects (Ray's own fallback).
            from ray.data.extensions import ArrowPythonObjectArray

            return ArrowPythonObjectArray.from_objects(outputs)
    fitted: list[Any] = []
    for index, output in enumerate(outputs):
        try:
            pa.array([output], type=output_type)
        except conversion_errors as exc:
            errors[index] = (
                f"TypeError: the output does not fit output_type {output_type} "
                f"({type(exc).__name__}: {exc})"
            )
            output = None
        fitted.append(output)
    return pa.array(fitted, type=output_type)


def _plain(value: Any) -> Any:
    """A cell as Python data (numpy scalars and arrays become their Python forms)."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    return value
