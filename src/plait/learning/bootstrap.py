"""`BootstrapFewShot`: learn demonstrations from the pipeline's own successful runs.

A small model follows examples far better than instructions, so the most
reliable way to teach it a task is to show it the task done right.  The traced
graph gives plait what that takes for free: in every run, each `LLMInference`
stage's own input and output.  So the optimizer

1. runs the pipeline over training examples (the `Trainer`'s minibatch, or a
   *teacher*: another module of the same structure, or the same pipeline on
   another alias, e.g. a stronger model) with a `CallLog`;
2. keeps the runs whose loss passed (score >= ``threshold``) and, from them, each
   stage's (input, output) pair, filed under the stage's module path, so a
   multi-stage pipeline gets demonstrations for every stage;
3. proposes ``candidates`` demonstration sets, each of up to ``max_demos`` pairs
   per stage; with a validation set the `Trainer` lets it score every candidate
   and it installs the best (the Trainer's gate then keeps it only if it beats
   the best values so far).

When no run has passed yet (a start near 0% is the usual case), it falls back to
*labelled* demonstrations: for the stage whose output is the pipeline's output,
the stage's recorded input paired with the example's target.  Bootstrapped pairs
come first; labelled ones fill the remaining places.

It only sets demonstrations (`LLMInference(..., demos=[])` parameters); give the
`Trainer` a list, ``[BootstrapFewShot(...), SFAOptimizer(...)]``, to rewrite the
instructions in the same run, each update gated on validation on its own.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.demos import is_pool, normalize_demos
from plait.effects import Message
from plait.handlers.calls import CallLog, CallRecord
from plait.inference import LLMInference
from plait.labels import label_choices
from plait.module import Module
from plait.parameter import Parameter
from plait.values import Value

__all__ = [
    "BootstrapFewShot",
    "Trace",
    "TraceLog",
    "TrainingBatch",
    "call_step",
    "demo_parameters",
    "run_traced",
    "trace_from_rows",
    "trace_rows",
]

Example = tuple[Any, Any]


@dataclass(slots=True)
class Trace:
    """One example run through the pipeline: its loss score, output and LLM calls."""

    example: Example
    score: float
    #: The pipeline's output (None when the run failed).
    output: Any
    calls: list[CallRecord] = field(default_factory=list)
    failed: bool = False


@dataclass(slots=True)
class TrainingBatch:
    """What the `Trainer` shows an optimizer before its step (`Optimizer.observe`).

    ``traces`` are the minibatch's runs with the current values (on Ray workers, as
    the workers logged them: the calls are paid once; None when no trace came back);
    ``evaluate`` scores the validation set with the values of the moment (None
    without one).
    """

    examples: list[Example]
    traces: list[Trace] | None
    loss_fn: Module
    evaluate: Callable[[], Awaitable[float]] | None = None
    #: Each validation example's score, for the examples at the given positions, with
    #: the values of the moment (None without a validation set): what a search scores
    #: candidates with, a few examples at a time.
    score_examples: Callable[[Sequence[int]], Awaitable[list[float]]] | None = None
    #: How many validation examples there are (0 without a validation set).
    val_size: int = 0


def demo_parameters(params: Iterable[Parameter]) -> list[Parameter]:
    """The parameters among ``params`` that are some `LLMInference`'s ``demos``."""
    found: list[Parameter] = []
    for param in params:
        owner = param.owner
        if isinstance(owner, LLMInference) and owner.demos is param:
            found.append(param)
    return found


async def run_traced(model: Module, loss_fn: Module, example: Example) -> Trace:
    """Run ``example`` through ``model`` and ``loss_fn`` (eval mode) with a `CallLog`.

    A run that fails scores 0 and is marked ``failed``: it teaches nothing, and
    one bad example does not stop the others.  A run whose endpoint failed (down, a
    refused key) is not a bad example: that error goes on, for the caller to report
    (`Trainer` stops the run naming the alias and the cause), instead of every run
    of the step "failing" and bootstrap silently learning nothing.
    """
    from plait.learning.feedback import Feedback
    from plait.learning.step import TrainingStep

    step = TrainingStep(model, loss_fn).eval()
    with TraceLog(model) as log:
        try:
            result = await call_step(step, example)
        except Exception as exc:
            if endpoint_failed(exc):
                raise
            return log.trace(example, 0.0, failed=True)
    payload = result.payload if isinstance(result, Value) else result
    score = payload.score if isinstance(payload, Feedback) else 0.0
    return log.trace(example, float(score))


def endpoint_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a run's failure to reach its endpoint (or the endpoint's
    refusal), rather than a failure of the run itself (its code, a reply the model
    got wrong)."""
    from plait.providers.base import ProviderError, ReplyFormatError
    from plait.values import ExecutionError

    cause = exc.value.payload if isinstance(exc, ExecutionError) else exc
    if isinstance(cause, ReplyFormatError):
        return False
    return isinstance(cause, ProviderError | OSError | TimeoutError)


def call_step(step: Module, example: Example) -> Any:
    """``step(input, target=target)`` as one call: an input that is a list (a sequence
    for a scan) is one input, not a batch of them."""
    from plait.execution.runtime import call_single

    return call_single(step, (example[0],), {"target": example[1]})


class TraceLog(CallLog):
    """A `CallLog` that also keeps the output of one module (the pipeline's), so a
    run can be turned into a `Trace`."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module
        self.output: Any = None

    def postprocess_module(self, msg: Message) -> None:
        self._keep_output(msg)

    def postprocess_llm(self, msg: Message) -> None:
        self._keep_output(msg)  # a pipeline that is one LLMInference
        super().postprocess_llm(msg)

    def _keep_output(self, msg: Message) -> None:
        if msg.module is self.module and msg.error is None:
            value = msg.value
            self.output = getattr(value, "payload", value)

    def trace(self, example: Example, score: float, failed: bool = False) -> Trace:
        return Trace(example, score, None if failed else self.output, list(self.calls), failed)


def trace_rows(log: TraceLog) -> dict[str, Any]:
    """What a `TraceLog` saw, as plain data that can travel from a Ray worker: the
    pipeline's output and each LLM call as (stage path, input, text, payload); see
    `trace_from_rows`."""
    calls = [(_path(call), call.input, call.text, call.payload) for call in log.calls]
    return {"output": log.output, "calls": calls}


def trace_from_rows(rows: dict[str, Any], model: Module, example: Example, score: float) -> Trace:
    """The `Trace` of a run made elsewhere (`trace_rows`), its calls pointing at the
    stages of ``model`` (this process's copy of the pipeline) by their paths."""
    stages = {
        module.qualified_path: module
        for module in model.modules()
        if isinstance(module, LLMInference)
    }
    calls = [
        CallRecord(path=path, module=stages.get(path), input=text_in, text=text, payload=payload)
        for path, text_in, text, payload in rows["calls"]
    ]
    return Trace(example, score, rows["output"], calls)


class BootstrapFewShot:
    """Sets each `LLMInference`'s demonstrations from runs that passed (see the module doc).

    ``params``: the pipeline's parameters (``model.parameters()``); the optimizer
    holds those that are demonstrations and refuses a set without any.
    ``max_demos``: pairs per stage.  ``threshold``: the loss score a run needs to
    count as passed.  ``candidates``: demonstration sets tried per step (scored on
    validation when there is one).  ``teacher``: a module of the same structure
    whose runs supply the traces; ``teacher_alias``: run a copy of the pipeline
    with every call on this alias instead (a stronger model).  Without either,
    the Trainer's own minibatch runs are used.  ``seed`` fixes the sampling.
    ``stage_targets`` gives inner stages labelled pairs too: a stage's module path
    (``"extract"``) -> a function of an example's target returning what that stage
    should answer (``lambda target: target.split()[1]``); each run then pairs the
    stage's recorded input with it, as the last stage's input is paired with the
    target itself.
    """

    #: The Trainer skips the backward pass when no optimizer of a step needs feedback.
    needs_feedback = False

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        max_demos: int = 4,
        threshold: float = 1.0,
        candidates: int = 4,
        teacher: Module | None = None,
        teacher_alias: str | None = None,
        seed: int = 0,
        stage_targets: Mapping[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        if isinstance(params, Module):
            raise TypeError(
                f"{type(self).__name__}() takes parameters, not a module: module.parameters()"
            )
        given = list(params)
        held = demo_parameters(given)
        if not held:
            raise ValueError(
                f"{type(self).__name__} found no demonstrations to learn among "
                f"{len(given)} parameter(s): give the LLMInference calls that should learn "
                "from examples demos=[] (LLMInference(alias, system_prompt, demos=[]))"
            )
        check_positive(max_demos=max_demos, candidates=candidates)
        if teacher is not None and teacher_alias is not None:
            raise ValueError("give a teacher module or a teacher_alias, not both")
        if teacher is not None and not isinstance(teacher, Module):
            raise TypeError(f"teacher must be a plait Module, got {type(teacher).__name__}")
        self.params: list[Parameter] = list({id(p): p for p in held}.values())
        self.stage_targets = dict(stage_targets or {})
        known = sorted(self._paths().values())
        unknown = [path for path in self.stage_targets if path not in known]
        if unknown:
            raise ValueError(
                f"stage_targets names {', '.join(map(repr, unknown))}, which is no stage with "
                f"demonstrations; the stages are {', '.join(map(repr, known))}"
            )
        bad = [path for path, fn in self.stage_targets.items() if not callable(fn)]
        if bad:
            raise TypeError(f"stage_targets[{bad[0]!r}] must be a function of an example's target")
        self.max_demos = max_demos
        self.threshold = float(threshold)
        self.candidates = candidates
        self.teacher = teacher
        self.teacher_alias = teacher_alias
        self.seed = seed
        self.steps = 0
        #: Per stage (module path): bootstrapped pairs, input -> output, oldest first.
        self.passed: dict[str, dict[str, Any]] = {}
        #: Per stage: labelled pairs (the stage's input -> the example's target).
        self.labelled: dict[str, dict[str, Any]] = {}
        #: The validation score of each candidate tried at the last step.
        self.candidate_scores: list[float] = []
        self.rejected: list[Any] = []
        self._evaluate: Callable[[], Awaitable[float]] | None = None

    # -- the Trainer's protocol ------------------------------------------------------
    def zero_feedback(self) -> None:
        """Nothing to clear: demonstrations are learned from traces, not feedback."""

    async def observe(self, batch: TrainingBatch) -> None:
        """File the stages' pairs of the batch's runs that passed (see the module doc)."""
        self._evaluate = batch.evaluate
        passed, labelled = await self._gather(batch)
        for mine, gathered in ((self.passed, passed), (self.labelled, labelled)):
            for path, pairs in gathered.items():
                mine.setdefault(path, {}).update(pairs)

    async def refit(self, batch: TrainingBatch) -> dict[str, Any]:
        """Grow every pool chosen from per input (`knn_demos`) by the pairs of
        ``batch``'s runs, gathered as training gathers them; fixed lists stay as
        validation chose them.  New values by name.

        The `Trainer` calls this once training has ended, with every training and
        validation example (``Trainer(refit=True)``), so the final pipeline draws on
        every labelled example it was given.  The pairs are not filed with the ones
        training gathered: a run continued afterwards must never propose candidates
        built from the examples that judge them.
        """
        passed, labelled = await self._gather(batch)
        stages = {path: param for param, path in self._paths().items()}
        grown: dict[str, Any] = {}
        for path, param in stages.items():
            if not is_pool(param.value):
                continue
            pool = list(param.value["pool"])
            known = [pair["input"] for pair in pool]
            extra = [
                pair
                for pair in _ordered_pairs(passed.get(path, {}), labelled.get(path, {}))
                if pair[0] not in known
            ]
            if extra:
                where = f"the demonstrations for {path}"
                grown[path] = {**param.value, "pool": [*pool, *normalize_demos(extra, where)]}
        return install(stages, grown)

    async def _gather(
        self, batch: TrainingBatch
    ) -> tuple[dict[str, dict[Any, Any]], dict[str, dict[Any, Any]]]:
        """Per stage, the batch's bootstrapped pairs (runs that passed) and labelled
        pairs (the stage's input and the example's target), input -> output."""
        traces = batch.traces
        if traces is None or self.teacher is not None or self.teacher_alias is not None:
            teacher = self._teacher(batch)
            runs = await asyncio.gather(
                *(run_traced(teacher, batch.loss_fn, example) for example in batch.examples),
                return_exceptions=True,
            )
            for run in runs:  # reported once every run has ended
                if isinstance(run, BaseException):
                    raise run
            traces = [run for run in runs if not isinstance(run, BaseException)]
        stages = set(self._paths().values())
        passed: dict[str, dict[Any, Any]] = {}
        labelled: dict[str, dict[Any, Any]] = {}
        for trace in traces:
            if trace.failed:
                continue
            mine = [(_path(call), call) for call in trace.calls if _path(call) in stages]
            if trace.score >= self.threshold:
                for path, call in mine:
                    passed.setdefault(path, {})[call.input] = _output_of(call)
            target = trace.example[1]
            if target is None:
                continue
            final = _final_call(mine, trace.output)
            if final is not None:
                labelled.setdefault(final[0], {})[final[1].input] = target
            for path, call in mine:
                if path in self.stage_targets:
                    labelled.setdefault(path, {})[call.input] = self._stage_target(path, target)
        return passed, labelled

    async def step(self) -> dict[str, Any]:
        """Install the best of ``candidates`` demonstration sets; new values by name."""
        rng = random.Random(f"{self.seed}:{self.steps}")
        stages = {path: param for param, path in self._paths().items()}
        sets = [self._candidate(stages, rng) for _ in range(self.candidates)]
        sets = [s for i, s in enumerate(sets) if s and s not in sets[:i]]
        self.candidate_scores = []
        self.steps += 1
        if not sets:
            return {}
        best = sets[0]
        if len(sets) > 1 and self._evaluate is not None:
            before = {path: param.value for path, param in stages.items()}
            best_score = -1.0
            for candidate in sets:
                for path, demos in candidate.items():
                    stages[path].value = demos
                score = await self._evaluate()
                self.candidate_scores.append(score)
                if score > best_score:
                    best, best_score = candidate, score
            for path, value in before.items():
                stages[path].value = value
        return install(stages, best)

    # -- helpers -------------------------------------------------------------------------
    def _paths(self) -> dict[Parameter, str]:
        """Each held parameter's stage: its LLMInference's module path."""
        paths: dict[Parameter, str] = {}
        for param in self.params:
            owner = param.owner
            assert isinstance(owner, LLMInference)
            paths[param] = owner.qualified_path
        return paths

    def _candidate(self, stages: dict[str, Parameter], rng: random.Random) -> dict[str, Any]:
        """One demonstration set per stage: bootstrapped pairs first, labelled ones after."""
        chosen: dict[str, Any] = {}
        for path, param in stages.items():
            if is_pool(param.value):  # chosen from per input: every pair is a candidate
                pairs = self._pairs(path)
                if pairs:
                    where = f"the demonstrations for {path}"
                    chosen[path] = {**param.value, "pool": normalize_demos(pairs, where)}
                continue
            passed = list(self.passed.get(path, {}).items())
            rng.shuffle(passed)
            picked = passed[: self.max_demos]
            if len(picked) < self.max_demos:
                used = {inp for inp, _ in picked}
                labelled = [p for p in self.labelled.get(path, {}).items() if p[0] not in used]
                rng.shuffle(labelled)
                picked += labelled[: self.max_demos - len(picked)]
            if picked:
                chosen[path] = normalize_demos(picked, f"the demonstrations for {path}")
        return chosen

    def _stage_target(self, path: str, target: Any) -> Any:
        try:
            return self.stage_targets[path](target)
        except Exception as exc:
            raise ValueError(
                f"stage_targets[{path!r}] failed on the target {target!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _pairs(self, path: str) -> list[tuple[Any, Any]]:
        """Every pair gathered for the stage at ``path``: bootstrapped ones first (oldest
        first), then labelled ones whose input no bootstrapped pair has."""
        return _ordered_pairs(self.passed.get(path, {}), self.labelled.get(path, {}))

    def _teacher(self, batch: TrainingBatch) -> Module:
        """The module whose runs supply traces: the teacher, or the pipeline itself
        (on ``teacher_alias`` if given) with its parameters' current values."""
        if self.teacher is not None:
            return self.teacher
        model = _root_of(self.params)
        if self.teacher_alias is None:
            return model
        try:
            twin = copy.deepcopy(model)
        except Exception as exc:
            raise TypeError(
                f"teacher_alias needs a copy of the pipeline, and {type(model).__name__} cannot "
                f"be copied ({type(exc).__name__}: {exc}); pass teacher=<a module built the "
                "same way on the teacher's alias> instead"
            ) from None
        for module in twin.modules():
            if isinstance(module, LLMInference):
                module.alias = self.teacher_alias
        return twin

    # -- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "steps": self.steps,
            "passed": {path: list(pairs.items()) for path, pairs in self.passed.items()},
            "labelled": {path: list(pairs.items()) for path, pairs in self.labelled.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind = state.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict of a {kind} cannot be loaded into {type(self).__name__}")
        self.steps = int(state.get("steps", 0))
        self.passed = {p: dict(map(tuple, pairs)) for p, pairs in state.get("passed", {}).items()}
        self.labelled = {
            p: dict(map(tuple, pairs)) for p, pairs in state.get("labelled", {}).items()
        }

    def __repr__(self) -> str:
        return (
            f"BootstrapFewShot({len(self.params)} demonstration parameter(s), "
            f"max_demos={self.max_demos}, steps={self.steps})"
        )


def check_positive(**values: Any) -> None:
    """Each of ``values`` a positive integer, or a `ValueError` naming the first that is not."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def install(stages: Mapping[str, Parameter], value: Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``value`` (stage path -> demonstrations) to the stages' parameters; the
    new values by parameter name, the unchanged ones left out."""
    applied: dict[str, Any] = {}
    for path, demos in value.items():
        param = stages[path]
        if param.value != demos:
            param.apply_update(demos)
            applied[param.qualified_name] = demos
    return applied


def _ordered_pairs(passed: Mapping[Any, Any], labelled: Mapping[Any, Any]) -> list[Example]:
    """Bootstrapped pairs first, then labelled ones whose input no bootstrapped pair has."""
    return [*passed.items(), *((i, o) for i, o in labelled.items() if i not in passed)]


def _path(call: CallRecord) -> str:
    module = call.module
    return module.qualified_path if isinstance(module, LLMInference) else ""


def _output_of(call: CallRecord) -> Any:
    """A call's reply as a demonstration shows it: the text the assistant wrote, or for
    a call that answers with labels the label itself, as a labelled pair shows it (an
    endpoint with structured outputs writes ``{"value": "billing"}``)."""
    module = call.module
    if isinstance(module, LLMInference) and label_choices(module.response_format) is not None:
        payload = call.payload
        return payload.value if isinstance(payload, enum.Enum) else payload
    return call.text


def _final_call(
    calls: Sequence[tuple[str, CallRecord]], output: Any
) -> tuple[str, CallRecord] | None:
    """The stage whose reply is the pipeline's output as it is, if exactly one is.

    Only that stage's input can be paired with the example's target: any other
    stage's right answer is not what the target says.
    """
    if output is None:
        return None
    found = [(path, call) for path, call in calls if _same(call.payload, output)]
    return found[-1] if len(found) == 1 else None


def _same(payload: Any, output: Any) -> bool:
    try:
        return bool(payload == output)
    except Exception:
        return False


def _root_of(params: Sequence[Parameter]) -> Module:
    """The root module that owns the held parameters (the pipeline being trained)."""
    roots: dict[int, Module] = {}
    for param in params:
        node = param.owner
        assert isinstance(node, Module)
        seen: set[int] = set()
        while node._parent_module() is not None and id(node) not in seen:
            seen.add(id(node))
            parent = node._parent_module()
            assert parent is not None
            node = parent
        roots[id(node)] = node
    if len(roots) != 1:
        raise ValueError(
            "BootstrapFewShot's demonstrations belong to several pipelines: give it the "
            "parameters of one root module"
        )
    return next(iter(roots.values()))
