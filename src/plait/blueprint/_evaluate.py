"""Making a plan's objects, leaves first, and reporting everything that went wrong at once.

Nothing is called while a plan is made (`plait.blueprint._plan`); here the calls
happen.  A constructor that raises does not stop the others: its failure is kept,
whatever needed its result is skipped, and `BlueprintError` lists every problem the
plan found with every failure, each under the dotted path it happened at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plait.blueprint._keys import join_path
from plait.blueprint._plan import ArgInfo, ConstNode, DictNode, Failure, Node, Plan
from plait.blueprint._types import object_text

__all__ = ["BlueprintError", "evaluate", "evaluate_plan"]


class BlueprintError(ValueError):
    """Everything wrong with a blueprint at once, so one run shows every fix to make.

    Args:
        problems: One message per problem, each naming its dotted path and layer.
        what: What could not be built, for the heading.
    """

    def __init__(self, problems: list[str], what: str = "the blueprint") -> None:
        self.problems = list(problems)
        count = len(self.problems)
        heading = f"cannot build {what}: " + ("1 problem" if count == 1 else f"{count} problems")
        super().__init__(heading + "".join(f"\n  - {p}" for p in self.problems))


#: Stands for a value that could not be made; anything built from it is skipped.
_FAILED: Any = object()


def evaluate(node: Node, failures: list[Failure]) -> Any:
    """Make ``node``'s value, noting each constructor that raises in ``failures``."""
    if isinstance(node, ConstNode):
        return node.value
    if isinstance(node, DictNode):
        items = {k: evaluate(v, failures) for k, v in node.items.items()}
        return _FAILED if any(v is _FAILED for v in items.values()) else items
    args = [evaluate(n, failures) for n in node.positional]
    kwargs = {k: evaluate(n, failures) for k, n in node.keywords.items()}
    if any(v is _FAILED for v in args) or any(v is _FAILED for v in kwargs.values()):
        return _FAILED
    try:
        return node.factory(*args, **kwargs)
    except Exception as exc:
        failures.append((node.path, node.factory, exc))
        return _FAILED


def _explain(
    path: str, name: str, factory: Any, exc: BaseException, infos: Mapping[str, ArgInfo]
) -> list[str]:
    """A constructor's failure; pydantic's per-field errors go back to the argument's path."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):
        lines = []
        for error in errors():
            loc = [str(part) for part in error.get("loc", ())]
            if not loc:
                continue
            info = infos.get(join_path(path, loc[0]))
            source = f" (from {info.layer})" if info is not None and info.layer else ""
            lines.append(f"{join_path(path, '.'.join(loc))}{source}: {error.get('msg', error)}")
        if lines:
            return lines
    return [f"{path or name}: {object_text(factory)}(...) raised {type(exc).__name__}: {exc}"]


def evaluate_plan(plan: Plan, name: str) -> Any:
    """The object ``plan`` describes, its knobs set; or one `BlueprintError` naming every
    problem of the plan and every constructor that raised (``name`` is the target's)."""
    failures = plan.failures or []
    result = plan.built
    if not plan.problems and plan.root is not None and plan.knobs is None and not failures:
        result = evaluate(plan.root, failures)
    problems = list(plan.problems)
    if failures:
        infos = {info.path: info for info in plan.infos}
        problems += [
            line
            for path, factory, exc in failures
            for line in _explain(path, name, factory, exc, infos)
        ]
    if problems or plan.root is None:
        cause = failures[0][2] if failures else None
        raise BlueprintError(problems or ["nothing to build"], name) from cause
    for knob, setting in plan.knobs or ():
        knob.set(setting)
    return result
