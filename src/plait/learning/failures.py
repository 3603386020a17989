"""How training fails: the trainer's errors, and the words for a call that failed.

`TrainerError` is every refusal to start or continue (bad data, a missing alias,
a checkpoint from another run); `TrainingCallFailed` is the one kind that is not
the user's setup but an endpoint failing mid-run.  A failed call is reported as
one line naming the call, its alias and the cause, because the alternative, a
failed call scored like any other output, would roll back a good prompt as bad.
"""

from __future__ import annotations

from typing import Any

from plait._secrets import scrub
from plait.module import Module
from plait.values import Value

__all__ = [
    "TrainerError",
    "TrainingCallFailed",
    "optimizer_call_failure",
    "training_call_failure",
]


class TrainerError(Exception):
    """Training cannot start or continue; the message says what to change.

    Raised for bad data (an empty set, a record with no input), an alias the
    resources lack, a checkpoint of another run, and a loss that returns no score.
    """


class TrainingCallFailed(TrainerError):
    """A call of the pipeline or the loss failed (an endpoint down, a refused key):
    the run stops, since a broken endpoint would score as a bad prompt."""


def training_call_failure(value: Value, step: Module | None) -> TrainingCallFailed:
    """The error for a failed run, naming the call (and its alias) and the cause."""
    from plait.values import ExecutionError

    # A module whose own forward awaited a call (a judge loss) fails with that call's
    # ExecutionError: name the call that failed, not the module around it.
    while isinstance(value.payload, ExecutionError) and value.payload.value is not value:
        value = value.payload.value
    meta = value.meta
    path = meta.get("skipped_module_path") if meta.get("short_circuited") else None
    path = meta.get("module_path") or path or ""
    where = f" in {path}" if path else ""
    module = dict(step.named_modules()).get(path) if step is not None and path else None
    alias = getattr(module, "alias", None)
    why = "a broken endpoint does not score as a bad prompt"
    if isinstance(alias, str):
        where += f" (alias {alias!r})"
    else:  # the loss's own code (a metric function that raised): no endpoint to blame
        why = "an example that could not be scored does not count as a bad prompt"
    return TrainingCallFailed(
        f"a training call failed{where}: {meta.get('error_type', 'error')}: "
        f"{meta.get('message', value.payload)}; the run stops so {why} (fix it, then re-run "
        "the same command: the run resumes from its checkpoint)"
    )


def optimizer_call_failure(optimizer: Any, exc: BaseException) -> TrainingCallFailed | None:
    """A failed call of an optimizer's step (a rewrite, a bootstrap teacher run) as one
    error naming the optimizer, the call, its alias and the cause; None for any other
    exception (a bug, an interrupt), which goes on as it is."""
    from plait.learning.optimizers import OptimizerStepError
    from plait.values import ExecutionError

    causes: list[BaseException] = []
    if isinstance(exc, OptimizerStepError):
        causes = list(exc.failures.values())
    elif isinstance(exc, ExecutionError):
        causes = [exc]
    if not causes:
        return None
    alias = getattr(optimizer, "alias", None) or getattr(optimizer, "teacher_alias", None)
    on = f" (alias {alias!r})" if isinstance(alias, str) else ""
    cause = causes[0]
    if isinstance(cause, ExecutionError):
        meta = cause.value.meta
        where = f"{meta['module_path']}: " if meta.get("module_path") else ""
        text = f"{where}{meta.get('error_type', 'error')}: {meta.get('message')}"
    else:
        text = f"{type(cause).__name__}: {cause}"
    return TrainingCallFailed(
        scrub(
            f"a call of the optimizer {type(optimizer).__name__}{on} failed: {text}; the run "
            "stops (fix it, then re-run the same command: the run resumes from its "
            "checkpoint)"
        )
    )
