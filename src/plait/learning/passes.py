"""A training pass in this process, and the one training run of an example that a
pass makes wherever it runs.

The `Trainer` hands each pass (a minibatch in ``train()`` mode, or a validation pass)
to a backend's ``run_steps`` (`plait.execution.backends.TrainingBackend`) and reads
the rows back the same way whichever backend ran them: in eval mode a row is the
loss's output, in train mode it is plain data made by `train_row`, the loss's
``output``, the ``feedback`` its backward pass gave each parameter (named as the
step's ``state_dict()`` names it, with its rank) and the run's ``trace`` as
`BootstrapFewShot` learns from it.  A Ray worker makes its rows with `train_row`
too (`plait.ray.worker.PipelineWorker.train_batch`).

`LocalTrainingBackend` is the ``"local"`` backend with passes: its examples are
calls of the step in this process, under the caller's settings and handlers, so
each call draws its own seed and the trainer's call log, on the handler stack,
sees every call as it is made.  A pass sent elsewhere has to take both with it,
which is why a backend is given the log (``call_log``) at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from plait.execution.backends import PassLog
from plait.execution.runtime import LocalBackend
from plait.learning.backward import collect_feedback
from plait.learning.bootstrap import TraceLog, call_step, trace_rows
from plait.learning.step import TrainingStep
from plait.module import Module
from plait.values import ExecutionError, Value, ValueKind, kind_of

__all__ = ["LocalTrainingBackend", "parameter_names", "train_row"]


def parameter_names(step: Module) -> dict[int, str]:
    """Each parameter of ``step`` (by identity) and its ``state_dict()`` name."""
    return {id(param): name for name, param in step.named_parameters()}


async def train_row(
    step: Module,
    run: Callable[[], Awaitable[Value]],
    names: dict[int, str],
    *,
    feedback: bool = True,
) -> Value:
    """One example in ``train()`` mode: ``run()`` gives its loss `Value`; the row is that
    value when it is an error, else plain data (see the module doc).

    With ``feedback`` false there is no backward pass (an optimizer that learns from
    runs needs none) and the row's ``feedback`` is empty.
    """
    model = step.model if isinstance(step, TrainingStep) else None
    if model is None:
        value = await run()
        trace = None
    else:
        with TraceLog(model) as log:
            value = await run()
        trace = trace_rows(log)
    if value.kind is ValueKind.ERROR:
        return value
    received: list[tuple[str, str, float]] = []
    if feedback:
        for item in await collect_feedback(value):
            name = names.get(id(item.param))
            if name is None:
                raise RuntimeError(
                    f"the backward pass reached the parameter {item.param.qualified_name!r}, "
                    f"which {type(step).__name__} does not hold, so its feedback cannot be "
                    "named for the trainer; register it on a module of the pipeline"
                )
            received.append((name, item.text, item.rank))
    payload = {"output": value.payload, "feedback": received, "trace": trace}
    return Value(kind_of(payload), payload)


class LocalTrainingBackend(LocalBackend):
    """This process as a backend, with the `Trainer`'s passes (``run_steps``)."""

    async def run_steps(
        self,
        step: Any,
        examples: list[tuple[Any, Any]],
        opts: dict[str, Any],
        *,
        train: bool,
        call_log: PassLog | None = None,
        feedback: bool = True,
    ) -> list[Value]:
        """Each example as a call of ``step`` here, all at once, one `Value` per example
        in order (see `plait.execution.backends.TrainingBackend`).

        The calls run under the caller's settings and handlers, so ``opts`` and
        ``call_log`` (already on the handler stack) are what they are there.  Every
        example's run ends before a failure is reported: one failed call does not
        leave the others running unawaited behind the error.
        """
        if train:
            names = parameter_names(step)

            async def one(example: tuple[Any, Any]) -> Value:
                return await train_row(
                    step, lambda: _loss_value(step, example), names, feedback=feedback
                )

            return list(await asyncio.gather(*(one(example) for example in examples)))
        ended = await asyncio.gather(
            *(_loss_value(step, example) for example in examples), return_exceptions=True
        )
        rows: list[Value] = []
        for item in ended:
            if isinstance(item, BaseException):
                raise item
            rows.append(item)
        return rows


async def _loss_value(step: Module, example: tuple[Any, Any]) -> Value:
    """The step on one example, as a `Value`: its loss, or the ERROR of the call that
    failed (a traced run reports a failed call by raising it)."""
    try:
        out = await call_step(step, example)
    except ExecutionError as exc:
        return exc.value
    return out if isinstance(out, Value) else Value(kind_of(out), out)
