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
come first; labelled ones fill the remaining places.  A set for a call that
answers with labels shows every label the gathered pairs hold (while it has a place
to give): a model that answers one label to everything passes on exactly the
examples of that label, and a set made of those runs alone would teach it to go on.

It only sets demonstrations (`LLMInference(..., demos=[])` parameters); give the
`Trainer` a list, ``[BootstrapFewShot(...), SFAOptimizer(...)]``, to rewrite the
instructions in the same run, each update gated on validation on its own.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.demos import demo_answer, is_pool, normalize_demos
from plait.effects import Message
from plait.handlers.calls import CallLog, CallRecord
from plait.inference import LLMInference
from plait.labels import label_choices
from plait.module import Module
from plait.parameter import Parameter
from plait.values import Value

__all__ = [
    "BootstrapFewShot",
    "ExampleRun",
    "Trace",
    "TraceLog",
    "TrainingBatch",
    "Validated",
    "call_step",
    "demo_parameters",
    "model_values",
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
class ExampleRun:
    """One example run with the values of the moment, as a search judges a candidate.

    ``score`` and ``text`` are the loss's (`Feedback`); ``trace`` holds the pipeline's
    output and each stage's call (its input and reply), so a reflective optimizer can
    show a rewriter what a stage was given, what it answered and what the loss said;
    ``feedback`` is what the backward pass gave each parameter (by ``state_dict()``
    name) when the run was asked for it, else empty.
    """

    example: Example
    score: float
    text: str
    trace: Trace | None
    feedback: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Validated:
    """Every validation example's score for one set of the pipeline's values.

    The `Trainer` shows an optimizer its last pass over the whole validation set
    (`TrainingBatch.validated`), so an optimizer about to score the same values
    there (a search scoring the values it starts from) takes the scores instead of
    paying for the pass again.  The other way, an optimizer reports the score of
    the values it installed with a `Judgement`.

    Args:
        values: The pipeline's values that were scored (`model_values`).
        scores: Each validation example's score, in the validation set's order.
    """

    values: dict[str, Any]
    scores: list[float]

    @property
    def score(self) -> float:
        """The mean score, as `Trainer.evaluate` gives it."""
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


def model_values(model: Module) -> dict[str, Any]:
    """The values a validation score is a score of: every parameter of ``model`` by its
    ``state_dict()`` name, the states of its `Rng`s aside (running the pipeline
    advances them, so they are no part of what an update changes)."""
    from plait.sampling import rng_parameter_names

    drawn = rng_parameter_names(model)
    return {
        name: value
        for name, value in copy.deepcopy(model.state_dict()).items()
        if name not in drawn
    }


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
    #: Runs any examples (training or validation ones) with the values of the moment
    #: and returns each one's `ExampleRun`, in order; ``feedback=True`` also runs the
    #: backward pass.  What a search that chooses on more than the validation set
    #: (cross-validation) or that reads the loss's words (reflection) runs examples
    #: with: the same passes as the Trainer's own, so they run where its passes run
    #: (Ray workers included) and a resumed step is answered from its call log.
    run_examples: Callable[..., Awaitable[list[ExampleRun]]] | None = None
    #: The training examples (all of them, not only this minibatch).
    train_examples: list[Example] = field(default_factory=list)
    #: The validation examples (empty without a validation set).
    val_examples: list[Example] = field(default_factory=list)
    #: The Trainer's last pass over the whole validation set (None before one): an
    #: optimizer about to score these very values there takes the scores instead.
    validated: Validated | None = None


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
    """Learns demonstrations from the runs that passed, for models that learn best by example.

    It sets the demonstrations of every `LLMInference` built with ``demos=[]``
    (or ``demos=knn_demos(...)``): from each run whose loss passed it takes the
    input and output *each stage* saw, so every stage of a multi-stage pipeline
    gets its own.  While no run has passed yet it falls back to labelled pairs
    (the last stage's input with the example's target).  A set for a label call
    shows each of its labels the pairs hold.  Each step it proposes
    ``candidates`` sets, scores them on validation when there is one, and
    installs the best; the `Trainer`'s gate then keeps it only if validation
    improves.  Give the `Trainer` a list, ``[BootstrapFewShot(...),
    SFAOptimizer(...)]``, to rewrite the instructions in the same run.

    Args:
        params: The pipeline's parameters (``model.parameters()``); the optimizer
            holds those that are demonstrations.
        max_demos: Pairs per stage in a demonstration set.
        threshold: The loss score a run needs to count as passed.
        candidates: Demonstration sets tried per step.
        teacher: A module of the same structure whose runs supply the pairs.
        teacher_alias: Run a copy of the pipeline with every call on this alias
            instead (a stronger model).  Without a teacher, the Trainer's own
            minibatch runs are used.
        seed: Fixes the sampling of the sets.
        stage_targets: Labelled pairs for inner stages too: a stage's module path
            (``"extract"``) -> a function of an example's target returning what
            that stage should answer (``lambda target: target.split()[1]``).

    Raises:
        TypeError: ``params`` is a module (pass ``module.parameters()``),
            ``teacher`` is not a `Module`, or a ``stage_targets`` value is not a
            function.
        ValueError: No parameter is a demonstration, ``max_demos`` or
            ``candidates`` is not a positive integer, both ``teacher`` and
            ``teacher_alias`` are given, or ``stage_targets`` names no stage.

    Examples:
        ```python
        import plait
        from plait.handlers import mock
        from plait.learning import BootstrapFewShot, ExactMatch, Trainer
        from plait.providers import LLMRequest


        class Triage(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.classify = plait.LLMInference(
                    "fast", "Is the message about billing or shipping?", demos=[]
                )

            def forward(self, message: str) -> str:
                return self.classify(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model that answers as the last demonstration it was shown.
            answers = [m["content"] for m in request.messages if m["role"] == "assistant"]
            return answers[-1] if answers else "unsure"


        train = [("I was charged twice.", "billing"), ("My parcel is late.", "shipping")]
        val = [("Where is my parcel?", "shipping")]
        pipeline = Triage()
        optimizer = BootstrapFewShot(pipeline.parameters(), max_demos=2)
        trainer = Trainer(pipeline, ExactMatch(), optimizer, train, val)
        with mock({"fast": model}):
            history = trainer.fit_sync()
        print(history.initial_val_score, "->", history.best_val_score)
        print(pipeline.classify.demos.value)
        ```
    """

    needs_feedback = False
    """The Trainer skips the backward pass when no optimizer of a step needs feedback."""

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
        self.passed: dict[str, dict[str, Any]] = {}
        """Per stage (module path): bootstrapped pairs, input -> output, oldest first."""
        self.labelled: dict[str, dict[str, Any]] = {}
        """Per stage: labelled pairs (the stage's input -> the example's target)."""
        self.candidate_scores: list[float] = []
        """The validation score of each candidate tried at the last step."""
        self.rejected: list[Any] = []
        self._evaluate: Callable[[], Awaitable[float]] | None = None

    # -- the Trainer's protocol ------------------------------------------------------
    def zero_feedback(self) -> None:
        """Nothing to clear: demonstrations are learned from runs, not feedback."""

    async def observe(self, batch: TrainingBatch) -> None:
        """Gather the stages' pairs from the minibatch's runs, before the step.

        The `Trainer` calls it with each minibatch.  Runs that passed give each
        stage's (input, output) pair; every run with a target gives labelled pairs.

        Args:
            batch: The minibatch, its runs (or None, to run them here, on the
                teacher when there is one) and the validation scorer.
        """
        self._evaluate = batch.evaluate
        passed, labelled = await self._gather(batch)
        for mine, gathered in ((self.passed, passed), (self.labelled, labelled)):
            for path, pairs in gathered.items():
                mine.setdefault(path, {}).update(pairs)

    async def refit(self, batch: TrainingBatch) -> dict[str, Any]:
        """Grow every demonstration pool by the pairs of ``batch``, once training has ended.

        The `Trainer` calls this with every training and validation example
        (``Trainer(refit=True)``), so the final pipeline picks its demonstrations
        among every labelled example it was given.  Only pools chosen from per
        input (`knn_demos`) grow; fixed lists stay as validation chose them.  The
        pairs are not filed with the ones training gathered: a run continued
        afterwards must never propose candidates built from the examples that
        judge them.

        Args:
            batch: The examples to run and take pairs from.

        Returns:
            The grown pools, by qualified parameter name.
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
        return self._answers(passed), self._answers(labelled)

    def _answers(self, gathered: Mapping[str, Mapping[Any, Any]]) -> dict[str, dict[Any, Any]]:
        """``gathered`` (per stage, input -> output) with each output as the stage's
        demonstrations show it: a label call's outputs as its labels (`demo_answer`),
        a run's reply and an example's target alike, so that every candidate, pool and
        saved value holds one form of answer, the one a user writes."""
        labels = {path: labels_of(param.owner) for param, path in self._paths().items()}
        return {
            path: {inp: demo_answer(out, labels.get(path)) for inp, out in pairs.items()}
            for path, pairs in gathered.items()
        }

    async def step(self) -> dict[str, Any]:
        """Install the best of ``candidates`` demonstration sets.

        With a validation set each candidate is scored on it and the best one
        installed; without one, the first.

        Returns:
            The new values, by qualified parameter name (empty when nothing changed).
        """
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
            labels = labels_of(param.owner)
            if len(picked) < self.max_demos or labels is not None:
                # (Drawn only when needed: a call without labels whose passed pairs
                # fill its set draws the same sets as before labels were covered.)
                used = {inp for inp, _ in picked}
                labelled = [p for p in self.labelled.get(path, {}).items() if p[0] not in used]
                rng.shuffle(labelled)
                picked += labelled[: self.max_demos - len(picked)]
                if labels is not None:
                    spare = [*passed[self.max_demos :], *labelled]
                    picked = _covering(picked, spare, labels)
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
    def settings(self) -> dict[str, Any]:
        """The options that shape the optimizer's choices, as a checkpoint records them.

        A resumed run with other settings would continue choices made under the old
        ones, so the `Trainer` refuses it, naming the setting that changed.

        Returns:
            JSON-ready data: each option by name.
        """
        return {
            "max_demos": self.max_demos,
            "threshold": self.threshold,
            "candidates": self.candidates,
            "teacher_alias": self.teacher_alias,
            "seed": self.seed,
        }

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's own state, for a checkpoint.

        Returns:
            JSON-ready data: its type, settings, step count and the pairs gathered so far.
        """
        return {
            "type": type(self).__name__,
            "settings": self.settings(),
            "steps": self.steps,
            "passed": {path: list(pairs.items()) for path, pairs in self.passed.items()},
            "labelled": {path: list(pairs.items()) for path, pairs in self.labelled.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, to resume a run.

        Args:
            state: The saved state.

        Raises:
            ValueError: ``state`` comes from another type of optimizer.
        """
        kind = state.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict of a {kind} cannot be loaded into {type(self).__name__}")
        self.steps = int(state.get("steps", 0))
        # A checkpoint written before label answers were normalized holds raw replies.
        self.passed = self._answers(
            {p: dict(map(tuple, pairs)) for p, pairs in state.get("passed", {}).items()}
        )
        self.labelled = self._answers(
            {p: dict(map(tuple, pairs)) for p, pairs in state.get("labelled", {}).items()}
        )

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


def _covering(
    picked: list[tuple[Any, Any]], spare: Sequence[tuple[Any, Any]], labels: Sequence[str]
) -> list[tuple[Any, Any]]:
    """``picked`` with every label that ``spare`` can show and ``picked`` does not,
    each taking the place of a pair of the label shown most (while one is shown twice).

    A label call shown only some of its labels leans to those: a model that answers
    the majority label to everything passes on exactly those examples, and a list
    made of its passed runs alone would teach it to go on doing so.
    """
    picked = list(picked)
    shown = {label: sum(1 for _, out in picked if out == label) for label in labels}
    taken = {inp for inp, _ in picked}
    for label in labels:
        if shown[label]:
            continue
        most = max(labels, key=lambda name: shown[name])
        if shown[most] < 2:
            break  # no label can give up a place
        fill = next((pair for pair in spare if pair[1] == label and pair[0] not in taken), None)
        if fill is None:
            continue
        place = max(i for i, (_, out) in enumerate(picked) if out == most)
        picked[place] = fill
        taken.add(fill[0])
        shown[most] -= 1
        shown[label] += 1
    return picked


def _ordered_pairs(passed: Mapping[Any, Any], labelled: Mapping[Any, Any]) -> list[Example]:
    """Bootstrapped pairs first, then labelled ones whose input no bootstrapped pair has."""
    return [*passed.items(), *((i, o) for i, o in labelled.items() if i not in passed)]


def _path(call: CallRecord) -> str:
    module = call.module
    return module.qualified_path if isinstance(module, LLMInference) else ""


def _output_of(call: CallRecord) -> Any:
    """A call's reply as a demonstration shows it: the text the assistant wrote, or
    for a call that answers with labels, the label its reply was read as (the reply
    may be the schema's JSON, ``{"value": "billing"}``, or a sentence naming it)."""
    if labels_of(call.module) is not None and call.payload is not None:
        return call.payload
    return call.text


def labels_of(module: Any) -> tuple[str, ...] | None:
    """The labels ``module`` answers with, if it is an `LLMInference` that does (None
    for any other stage)."""
    if isinstance(module, LLMInference) and module.response_format is not None:
        return label_choices(module.response_format)
    return None


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
