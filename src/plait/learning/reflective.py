"""`ReflectiveSearch`: instructions rewritten from what went wrong, kept as a Pareto frontier.

A rewrite from a batch's averaged feedback forgets *which* examples failed and
why; a search that keeps only the best-on-average candidate throws away one that
is the only one right on some examples, and with it the lead it had.  So the
search keeps a pool of candidates (each a full set of the pipeline's learnable
instructions, with where it came from) and each candidate's score on every
validation example, and each iteration (one `Trainer` step):

1. chooses a parent from the **Pareto frontier** (every candidate that is best
   on at least one validation example, a tie counting for every tied
   candidate), with probability in proportion to the examples it is best on;
2. picks one learnable instruction, the stages taking turns;
3. runs the parent on the step's minibatch of training examples, with the
   backward pass, and shows a **rewriter** alias the stage's instruction, what
   it is for, and each example the parent failed: what the stage was given,
   what it answered, the expected answer, the loss's words and the feedback that
   reached the instruction; the proposal is checked as every rewrite is
   (`check_rewrite`);
4. runs the child on the same minibatch, and only if it scores better there
   scores it on every validation example and adds it to the pool.

Now and then, in a pipeline of several stages, two frontier candidates that
descend from a common ancestor and changed different stages are **merged** stage
by stage (each stage from the one that changed it), scored on validation, and
added unless a candidate of the pool dominates it.

The budget, ``max_metric_calls``, counts every example a candidate is scored on
(minibatch and validation alike, the starting values' validation scores included,
taken from the Trainer's own first pass) and is never exceeded: an iteration is
started only when what is left pays for its most (the parent and the child on the
minibatch, the child on validation), and once it no longer can, the search ends
the run (``history.stopped == "budget"``).  After each step the
candidate with the best mean validation score is installed; its score is
handed to the Trainer's gate (`Judgement`), which then pays for no pass of its
own.

The pool, the budget used and the turn of the stages are the optimizer's state
(`state_dict`), and every random choice is drawn from the seed and the step, so
a run killed at any point resumes with the same candidates and frontier, its
calls answered from the Trainer's call log.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Self

from plait.inference import LLMInference
from plait.learning.bootstrap import (
    ExampleRun,
    TrainingBatch,
    _root_of,
    check_positive,
    install,
    model_values,
)
from plait.learning.history import Judgement
from plait.learning.optimizers import (
    Rejection,
    Rewrite,
    _Call,
    _show,
    ask_rewrite,
    check_rewrite,
    meta_markers,
)
from plait.learning.spend import phase
from plait.module import Module
from plait.parameter import Parameter

if TYPE_CHECKING:
    from plait.resources.config import ResourceConfig
    from plait.resources.manager import ResourceManager

__all__ = ["Candidate", "ReflectiveSearch", "choose_parent", "pareto_frontier"]


@dataclass(slots=True)
class Candidate:
    """One candidate of the pool: a value for every learnable instruction, and its lineage.

    Attributes:
        id: Its place in the pool, from 0 (the values the run started with).
        values: Each stage's instruction, by the stage's module path.
        scores: Its score on each validation example, in the validation set's order.
        origin: ``"seed"``, ``"reflection"`` or ``"merge"``.
        parents: The candidates it was made from (one for a reflection, two for a merge).
        step: The optimizer step that found it (0 for the seed).
        stage: The stage a reflection rewrote (None otherwise).
        ancestor: The common ancestor a merge started from (None otherwise).
    """

    id: int
    values: dict[str, str]
    scores: list[float]
    origin: str
    parents: list[int] = field(default_factory=list)
    step: int = 0
    stage: str | None = None
    ancestor: int | None = None

    @property
    def mean(self) -> float:
        """The mean validation score."""
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    def to_json(self) -> dict[str, Any]:
        """The candidate as plain data, as the report and the checkpoint hold it.

        Returns:
            Its fields by name, and its mean validation score.
        """
        return {**asdict(self), "mean": self.mean}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Candidate:
        """Read what `to_json` wrote.

        Args:
            data: A candidate as plain data.

        Returns:
            The candidate.
        """
        return cls(
            id=int(data["id"]),
            values={str(k): str(v) for k, v in data["values"].items()},
            scores=[float(s) for s in data["scores"]],
            origin=str(data["origin"]),
            parents=[int(p) for p in data.get("parents", [])],
            step=int(data.get("step", 0)),
            stage=data.get("stage"),
            ancestor=data.get("ancestor"),
        )


def pareto_frontier(scores: Sequence[Sequence[float]]) -> dict[int, int]:
    """The candidates that are best on at least one example, and on how many.

    A tie counts for every tied candidate: each of them is best on that example.

    Args:
        scores: Each candidate's score per example (all of the same length).

    Returns:
        Candidate index -> the examples it is best on, for the candidates on the
            frontier, in index order.

    Raises:
        ValueError: The candidates were not scored on the same number of examples.

    Examples:
        >>> from plait.learning.reflective import pareto_frontier
        >>> pareto_frontier([[1, 0, 0], [0, 1, 0], [0, 0, 0]])
        {0: 2, 1: 2, 2: 1}
    """
    if not scores:
        return {}
    size = len(scores[0])
    if any(len(row) != size for row in scores):
        raise ValueError("every candidate must be scored on the same examples")
    wins: dict[int, int] = {}
    for example in range(size):
        best = max(row[example] for row in scores)
        for index, row in enumerate(scores):
            if row[example] == best:
                wins[index] = wins.get(index, 0) + 1
    return dict(sorted(wins.items()))


def choose_parent(wins: dict[int, int], rng: random.Random) -> int:
    """One frontier candidate, drawn with probability in proportion to the examples it wins.

    Args:
        wins: Candidate -> examples it is best on (`pareto_frontier`).
        rng: The random stream (seeded, so a resumed run draws the same).

    Returns:
        The chosen candidate.

    Raises:
        ValueError: ``wins`` is empty.
    """
    if not wins:
        raise ValueError("the frontier is empty: there is no candidate to choose")
    ids = sorted(wins)
    return rng.choices(ids, weights=[wins[i] for i in ids])[0]


class ReflectiveSearch:
    """Evolves the pipeline's instructions by reflecting on failures, keeping a Pareto frontier.

    Each `Trainer` step is one iteration: a parent is drawn from the candidates
    that are best on at least one validation example (in proportion to how many),
    one of its instructions (the stages take turns) is rewritten by the
    ``rewriter`` alias from the examples of the step's minibatch it failed (each
    with the stage's input and answer, the expected answer, the loss's words and
    the feedback that reached the instruction), and the child joins the pool only
    if it beats its parent on that minibatch and is then scored on every
    validation example.  Every ``merge_every`` steps, in a pipeline of several
    stages, two frontier candidates that changed different stages since a common
    ancestor are merged stage by stage instead.  The candidate with the best mean
    validation score is installed after each step.  ``search_report`` (saved in
    the history as ``trials[].search``) holds the pool, the frontier, the parent
    and why, the proposal and its minibatch scores, merges and the metric calls
    used and left.

    It needs a validation set, and changes only instructions: give the
    `LLMInference` calls ``system_prompt=plait.Parameter("...", description=...)``.
    Use it as the run's only optimizer: its pool's scores hold for the values
    the other parameters had when they were measured.

    Args:
        params: The pipeline's parameters (``model.parameters()``); the learnable
            instructions among them are searched.
        rewriter: The alias of the model that proposes new instructions; its calls
            run as the root module ``"reflection"``, so ``mock({"reflection":
            ...})`` answers them in tests.
        max_metric_calls: The budget: examples a candidate may be scored on in
            all (minibatch and validation); None for no budget.
        seed: Fixes every random choice (parents, merges).
        merge_every: Try a merge every this many steps (None: never).
        threshold: The loss score below which a minibatch example counts as failed.
        rewriter_temperature: The proposals' temperature.

    Raises:
        TypeError: ``params`` is a module (pass ``module.parameters()``) or
            ``rewriter`` is not a string.
        ValueError: No parameter is a learnable instruction, or
            ``max_metric_calls`` or ``merge_every`` is not a positive integer.

    Examples:
        ```python
        import plait
        from plait.handlers import mock
        from plait.learning import ExactMatch, ReflectiveSearch, Trainer
        from plait.providers import LLMRequest


        class Exclaim(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference(
                    "fast", plait.Parameter("Repeat the word.", description="what to do")
                )

            def forward(self, word: str) -> str:
                return self.llm(word)


        def model(request: LLMRequest) -> str:
            # A stand-in model: it adds "!" once its instruction says so.
            word = request.messages[-1]["content"]
            return word + "!" if "exclamation" in request.messages[0]["content"] else word


        def reflection(request: LLMRequest) -> str:
            # A stand-in rewriter: it reads the failures it is shown.
            shown_failures = "expected" in request.prompt_text
            return "Repeat the word with an exclamation mark." if shown_failures else "?"


        train = [("cat", "cat!"), ("dog", "dog!")]
        val = [("sun", "sun!"), ("sea", "sea!")]
        pipeline = Exclaim()
        search = ReflectiveSearch(pipeline.parameters(), rewriter="smart", max_metric_calls=14)
        trainer = Trainer(pipeline, ExactMatch(), search, train, val, batch_size=2, epochs=10)
        with mock({"fast": model, "reflection": reflection}):
            history = trainer.fit_sync()
        print(history.initial_val_score, "->", history.best_val_score, f"({history.stopped})")
        print(pipeline.llm.system_prompt.value)
        print(history.steps[-1].trials[0]["search"]["metric_calls"])
        ```
    """

    needs_feedback = False
    """The Trainer's own pass needs no backward pass: the search runs its own."""
    runs_minibatch = True
    """The search runs each step's minibatch itself, with the parent it chose."""

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        rewriter: str = "optimizer",
        max_metric_calls: int | None = None,
        seed: int = 0,
        merge_every: int | None = 4,
        threshold: float = 1.0,
        rewriter_temperature: float | None = 0.7,
    ) -> None:
        if isinstance(params, Module):
            raise TypeError("ReflectiveSearch() takes parameters, not a module: .parameters()")
        if not isinstance(rewriter, str):
            raise TypeError(f"rewriter must be an alias (a string), got {type(rewriter).__name__}")
        if max_metric_calls is not None:
            check_positive(max_metric_calls=max_metric_calls)
        if merge_every is not None:
            check_positive(merge_every=merge_every)
        given = list(params)
        self.stages: dict[str, Parameter] = instruction_stages(given)
        """The learnable instructions, by their stage's module path."""
        if not self.stages:
            raise ValueError(
                "ReflectiveSearch rewrites instructions, and none of the parameters is a "
                "learnable one: give the LLMInference calls system_prompt=plait.Parameter("
                "'...', description='...') and pass model.parameters()"
            )
        self.params = list(self.stages.values())
        self.rewriter = rewriter
        self.max_metric_calls = max_metric_calls
        self.seed = seed
        self.merge_every = merge_every
        self.threshold = float(threshold)
        self._call = _Call("reflection", rewriter, _REFLECT_SYSTEM, rewriter_temperature, Rewrite)
        self.steps = 0
        self.pool: list[Candidate] = []
        """Every candidate found so far, the seed first."""
        self.used = 0
        """Metric calls spent so far (examples scored, minibatch and validation)."""
        self.turn = 0
        """How many reflections were made: the next one rewrites stage ``turn % stages``."""
        self.merged: list[list[int]] = []
        """The pairs of candidates a merge was tried for (each is tried once)."""
        self.exhausted = False
        """Whether the budget can no longer pay for an iteration."""
        self.base: str | None = None
        """What the pipeline's other parameters held when the seed was scored."""
        self.rejected: list[Rejection] = []
        """Every proposal refused by `check_rewrite`, oldest first."""
        self.search_report: dict[str, Any] = {}
        """The last step's account (see the class doc)."""
        self.judgement: Judgement | None = None
        """The installed values' validation score, for the Trainer's gate, when this
        step measured exactly them on every validation example."""
        self.minibatch_score: float | None = None
        """The parent's mean score on this step's minibatch (None when none ran)."""
        self._batch: TrainingBatch | None = None
        self._measured: dict[int, dict[str, Any]] = {}

    # -- configuration -----------------------------------------------------------------
    def bind(self, resources: ResourceConfig | ResourceManager | Any) -> Self:
        """Send the rewriter's calls to ``resources``.

        Without a binding, the `Trainer`'s resources serve them.

        Args:
            resources: A `ResourceConfig`, a `ResourceManager`, or a mapping of aliases.

        Returns:
            The optimizer itself, for chaining.
        """
        self._call.bind(resources=resources)
        return self

    @property
    def reflection(self) -> LLMInference:
        """The LLM call that proposes instructions: set its ``max_tokens`` here."""
        return self._call.llm

    def _modules(self) -> list[Module]:
        return [self._call]

    def settings(self) -> dict[str, Any]:
        """The settings a resumed run must be given again.

        The checkpoint's state means something only under them: the budget used is a
        share of the budget, and the pool was found with this rewriter and seed.

        Returns:
            The settings, by name.
        """
        return {
            "rewriter": self.rewriter,
            "max_metric_calls": self.max_metric_calls,
            "seed": self.seed,
            "merge_every": self.merge_every,
            "threshold": self.threshold,
            "stages": sorted(self.stages),
        }

    @property
    def left(self) -> int | None:
        """Metric calls left in the budget (None without one)."""
        return None if self.max_metric_calls is None else self.max_metric_calls - self.used

    @property
    def stop_reason(self) -> str | None:
        """``"budget"`` once the budget cannot pay for another iteration, else None."""
        return "budget" if self.exhausted else None

    # -- the Trainer's protocol --------------------------------------------------------
    def zero_feedback(self) -> None:
        """Clear the instructions' feedback: the search reads feedback from its own runs."""
        for param in self.params:
            param.zero_feedback()

    async def observe(self, batch: TrainingBatch) -> None:
        """Keep the step's minibatch and the Trainer's runners for `step`.

        Args:
            batch: The minibatch, the validation scorer and the example runner.
        """
        self._batch = batch

    async def step(self) -> dict[str, Any]:
        """One iteration: a reflection (or a merge) and the best candidate installed.

        Returns:
            The new values, by qualified parameter name (empty when the best
                candidate is the one in place).

        Raises:
            ValueError: The Trainer has no validation set, or the pipeline's other
                parameters changed since the pool was scored.
        """
        batch = self._batch
        if batch is None or batch.score_examples is None or batch.run_examples is None:
            raise ValueError(
                "ReflectiveSearch scores its candidates on validation examples: give the "
                "Trainer val_data (plait train: --val FILE)"
            )
        self.judgement, self.minibatch_score = None, None
        self._measured = {}
        report: dict[str, Any] = {"step": self.steps + 1}
        rng = random.Random(f"reflective:{self.seed}:{self.steps}")
        before = {path: param.value for path, param in self.stages.items()}
        try:
            self._check_base()
            if not self.pool:
                await self._seed(batch, report)
            if self.pool and not self.exhausted and not await self._merge(batch, rng, report):
                await self._reflect(batch, rng, report)
        finally:
            for path, value in before.items():
                self.stages[path].value = value
            self.steps += 1
        if not self._afford(self._iteration_cost(batch)):
            self.exhausted = True  # what is left cannot pay for another iteration
        if not self.pool:
            self.search_report = {**report, **self._account()}
            return {}
        best = self.best()
        installed = install(self.stages, best.values)
        if self._measured.get(best.id) == model_values(_root_of(self.params)):
            self.judgement = Judgement(val_score=best.mean)
        self.search_report = {
            **report,
            "installed": best.id,
            **self._account(),
            "frontier": {str(k): v for k, v in self.frontier().items()},
            "pool": [candidate.to_json() for candidate in self.pool],
        }
        return installed

    # -- the pool ----------------------------------------------------------------------
    def frontier(self) -> dict[int, int]:
        """The pool's Pareto frontier: candidate id -> validation examples it is best on.

        Returns:
            The frontier (`pareto_frontier` of the pool), by candidate id.
        """
        return pareto_frontier([c.scores for c in self.pool])

    def best(self) -> Candidate:
        """The candidate with the best mean validation score (a tie: the earlier).

        Returns:
            The candidate.

        Raises:
            ValueError: The pool is empty (before the first step).
        """
        if not self.pool:
            raise ValueError("the pool is empty: no step has run yet")
        return min(self.pool, key=lambda c: (-c.mean, c.id))

    def _account(self) -> dict[str, Any]:
        return {
            "metric_calls": {
                "used": self.used,
                "left": self.left,
                "budget": self.max_metric_calls,
            }
        }

    @staticmethod
    def _iteration_cost(batch: TrainingBatch) -> int:
        """The most an iteration can spend: its parent and its child on the minibatch,
        and the child on every validation example."""
        return 2 * len(batch.examples) + batch.val_size

    def _afford(self, calls: int) -> bool:
        return self.max_metric_calls is None or self.used + calls <= self.max_metric_calls

    def _check_base(self) -> None:
        """Refuse to go on if the pipeline's other parameters changed since the seed
        was scored: every score of the pool was measured with their old values."""
        root = _root_of(self.params)
        held = {id(param) for param in self.params}
        mine = {name for name, param in root.named_parameters() if id(param) in held}
        others = {name: value for name, value in model_values(root).items() if name not in mine}
        base = json.dumps(others, sort_keys=True, ensure_ascii=False, default=str)
        if self.base is None:
            self.base = base
        elif self.base != base:
            raise ValueError(
                "the pipeline's other parameters (not its instructions) changed since "
                "ReflectiveSearch scored its candidates, so their scores no longer hold: "
                "use ReflectiveSearch as the run's only optimizer"
            )

    async def _score_val(self, batch: TrainingBatch, values: dict[str, str]) -> list[float]:
        """Every validation example's score for ``values`` (the budget already checked)."""
        assert batch.score_examples is not None
        for path, value in values.items():
            self.stages[path].value = value
        with phase("evaluating"):
            scores = await batch.score_examples(range(batch.val_size))
        self.used += batch.val_size
        return list(scores)

    async def _run(
        self, batch: TrainingBatch, values: dict[str, str], feedback: bool
    ) -> list[ExampleRun]:
        """The minibatch run with ``values`` (the budget already checked)."""
        assert batch.run_examples is not None
        for path, value in values.items():
            self.stages[path].value = value
        with phase("evaluating"):
            runs = await batch.run_examples(batch.examples, feedback=feedback)
        self.used += len(batch.examples)
        return list(runs)

    def _add(self, candidate: Candidate) -> None:
        self.pool.append(candidate)
        self._measured[candidate.id] = model_values(_root_of(self.params))

    async def _seed(self, batch: TrainingBatch, report: dict[str, Any]) -> None:
        """The values in place become candidate 0, scored on every validation example
        (taken from the Trainer's own pass over them when it scored these values)."""
        values = {path: str(param.value) for path, param in self.stages.items()}
        if not self._afford(batch.val_size):
            self.exhausted = True
            report["seed"] = "the budget cannot pay for scoring the values in place"
            return
        known = batch.validated
        if (
            known is not None
            and known.values == model_values(_root_of(self.params))
            and len(known.scores) == batch.val_size
        ):
            scores = list(known.scores)
            self.used += batch.val_size
        else:
            scores = await self._score_val(batch, values)
        self._add(Candidate(0, values, scores, "seed"))

    # -- reflection --------------------------------------------------------------------
    async def _reflect(
        self, batch: TrainingBatch, rng: random.Random, report: dict[str, Any]
    ) -> None:
        if not self._afford(self._iteration_cost(batch)):
            self.exhausted = True
            report["proposal"] = {"skipped": "the budget cannot pay for an iteration"}
            return
        wins = self.frontier()
        parent = self.pool[choose_parent(wins, rng)]
        total = sum(wins.values())
        report["parent"] = {
            "id": parent.id,
            "wins": wins[parent.id],
            "probability": wins[parent.id] / total,
            "why": (
                f"best on {wins[parent.id]} of the frontier's {total} wins "
                f"(ties counted for each tied candidate)"
            ),
        }
        paths = list(self.stages)
        path = paths[self.turn % len(paths)]
        self.turn += 1
        param = self.stages[path]
        runs = await self._run(batch, parent.values, feedback=True)
        parent_scores = [run.score for run in runs]
        self.minibatch_score = sum(parent_scores) / len(parent_scores)
        proposal: dict[str, Any] = {"stage": path, "parent_minibatch": parent_scores}
        report["proposal"] = proposal
        failed = [run for run in runs if run.score < self.threshold]
        if not failed:
            proposal["skipped"] = "the parent passed every example of the minibatch"
            return
        prompt = reflection_prompt(param, path, parent.values[path], failed)
        name = param.qualified_name
        with phase("proposing"):
            value, refused = await ask_rewrite(self._call, prompt, param, name)
        reason = refused or check_rewrite(parent.values[path], value, meta_markers(prompt))
        if reason is None and value == parent.values[path]:
            reason = "the same as the current instruction"
        proposal["instruction"] = value
        if reason is not None:
            self.rejected.append(Rejection(self.steps, name, value, reason))
            proposal["rejected"] = reason
            return
        child = {**parent.values, path: str(value)}
        if any(c.values == child for c in self.pool):
            proposal["skipped"] = "the pool already holds these values"
            return
        child_runs = await self._run(batch, child, feedback=False)
        child_scores = [run.score for run in child_runs]
        proposal["child_minibatch"] = child_scores
        if sum(child_scores) <= sum(parent_scores):
            proposal["accepted"] = False
            proposal["why"] = "it did not beat its parent on the minibatch"
            return
        scores = await self._score_val(batch, child)
        candidate = Candidate(
            len(self.pool), child, scores, "reflection", [parent.id], self.steps + 1, path
        )
        self._add(candidate)
        proposal["accepted"] = True
        proposal["candidate"] = candidate.id

    # -- merges ------------------------------------------------------------------------
    async def _merge(
        self, batch: TrainingBatch, rng: random.Random, report: dict[str, Any]
    ) -> bool:
        """A merge, when one is due and possible: True if it was made (scored)."""
        due = (
            self.merge_every is not None
            and len(self.stages) > 1
            and (self.steps + 1) % self.merge_every == 0
        )
        if not due or not self._afford(batch.val_size):
            return False
        options = self._merge_options()
        if not options:
            return False
        a, b, ancestor, values = options[rng.randrange(len(options))]
        self.merged.append([a, b])
        scores = await self._score_val(batch, values)
        dominated = [
            c.id
            for c in self.pool
            if all(x >= y for x, y in zip(c.scores, scores, strict=True)) and c.scores != scores
        ]
        merge: dict[str, Any] = {
            "parents": [a, b],
            "ancestor": ancestor,
            "values": values,
            "scores": scores,
        }
        report["merge"] = merge
        if dominated:
            merge["added"] = False
            merge["why"] = f"candidate {dominated[0]} scores at least as well on every example"
            return True
        candidate = Candidate(
            len(self.pool), values, scores, "merge", [a, b], self.steps + 1, None, ancestor
        )
        self._add(candidate)
        merge["added"] = True
        merge["candidate"] = candidate.id
        return True

    def _merge_options(self) -> list[tuple[int, int, int, dict[str, str]]]:
        """Every pair of frontier candidates not merged yet that changed different
        stages since their latest common ancestor, with that ancestor and the merge."""
        frontier = sorted(self.frontier())
        tried = {tuple(pair) for pair in self.merged}
        known = [c.values for c in self.pool]
        found: list[tuple[int, int, int, dict[str, str]]] = []
        for i, a in enumerate(frontier):
            for b in frontier[i + 1 :]:
                if (a, b) in tried:
                    continue
                above_a, above_b = self._ancestors(a), self._ancestors(b)
                common = above_a & above_b
                if a in above_b or b in above_a or not common:
                    continue
                base = self.pool[max(common)].values
                va, vb = self.pool[a].values, self.pool[b].values
                changed_a = {s for s in base if va[s] != base[s]}
                changed_b = {s for s in base if vb[s] != base[s]}
                if not changed_a or not changed_b or changed_a & changed_b:
                    continue
                merged = {
                    s: va[s] if s in changed_a else vb[s] if s in changed_b else base[s]
                    for s in base
                }
                if merged not in known:
                    found.append((a, b, max(common), merged))
        return found

    def _ancestors(self, index: int) -> set[int]:
        seen: set[int] = set()
        waiting = list(self.pool[index].parents)
        while waiting:
            parent = waiting.pop()
            if parent not in seen:
                seen.add(parent)
                waiting.extend(self.pool[parent].parents)
        return seen

    # -- persistence -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The search's state, for a checkpoint: enough to make the next choices the same.

        Returns:
            JSON-ready data: its type and settings, the step count, the pool (values,
                lineage, scores), the frontier, the budget used, the stages' turn and
                the merges tried.
        """
        return {
            "type": type(self).__name__,
            "settings": self.settings(),
            "steps": self.steps,
            "used": self.used,
            "turn": self.turn,
            "exhausted": self.exhausted,
            "base": self.base,
            "merged": [list(pair) for pair in self.merged],
            "pool": [candidate.to_json() for candidate in self.pool],
            "frontier": {str(k): v for k, v in self.frontier().items()},
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
        self.used = int(state.get("used", 0))
        self.turn = int(state.get("turn", 0))
        self.exhausted = bool(state.get("exhausted", False))
        self.base = state.get("base")
        self.merged = [[int(a), int(b)] for a, b in state.get("merged", [])]
        self.pool = [Candidate.from_json(c) for c in state.get("pool", [])]

    def __repr__(self) -> str:
        return (
            f"ReflectiveSearch({len(self.stages)} instruction(s), pool={len(self.pool)}, "
            f"metric calls {self.used}/{self.max_metric_calls}, steps={self.steps})"
        )


def instruction_stages(params: Iterable[Parameter]) -> dict[str, Parameter]:
    """The learnable instructions among ``params``, by the path of the `LLMInference`
    that uses each as its system prompt (wherever the parameter was assigned: on the
    call, or on a module above it that hands it down).

    Args:
        params: The pipeline's parameters.

    Returns:
        Stage path -> its instruction, for the learnable text system prompts.
    """
    wanted = {
        id(param): param for param in params if param.requires_grad and isinstance(param.value, str)
    }
    found: dict[str, Parameter] = {}
    roots: dict[int, Module] = {}
    for param in wanted.values():
        node = param.owner
        while isinstance(node, Module) and node._parent_module() is not None:
            node = node._parent_module()
        if isinstance(node, Module):
            roots[id(node)] = node
    for root in roots.values():
        for module in root.modules():
            prompt = getattr(module, "system_prompt", None)
            if isinstance(module, LLMInference) and id(prompt) in wanted:
                assert isinstance(prompt, Parameter)
                found.setdefault(module.qualified_path, prompt)
    return found


_REFLECT_SYSTEM = (
    "You improve the instruction (system prompt) of one step of an LLM pipeline by reading "
    "the examples it got wrong and what was said about each. Reply with a JSON object whose "
    "only field, new_value, holds ONLY the new instruction: no preamble, no explanation, no "
    "headings or delimiters of the request."
)


def reflection_prompt(
    param: Parameter, path: str, current: str, failed: Sequence[ExampleRun]
) -> str:
    """What the rewriter is shown: the step's purpose, its instruction and every failure.

    Args:
        param: The instruction's parameter (its ``description`` is shown).
        path: The stage's module path.
        current: The instruction in place (the parent's).
        failed: The minibatch runs the parent failed.

    Returns:
        The prompt.
    """
    shown = [_failure(number, run, param, path) for number, run in enumerate(failed, start=1)]
    return "\n\n".join(
        [
            f"Improve the instruction (system prompt) of the step `{path}` of an LLM pipeline.",
            f"## What the instruction is for\n{param.description or 'the step’s task'}",
            f"## The instruction in place\n{_show(current, param.qualified_name)}",
            "## Examples the pipeline got wrong with it\n" + "\n\n".join(shown),
            "Work out what the examples have in common and what the step should do "
            "differently, then write one clear instruction that keeps to what it is for and "
            "would get such examples right. Reply with ONLY the new instruction (as text), in "
            "the field new_value.",
        ]
    )


def _failure(number: int, run: ExampleRun, param: Parameter, path: str) -> str:
    """One failed example as the reflection prompt shows it."""
    lines = [f"Example {number} (score {run.score:.2f})"]
    trace = run.trace
    calls = [c for c in (trace.calls if trace else []) if _path_of(c) == path]
    if calls:
        call = calls[-1]
        lines += [f"The step was given:\n{_text(call.input)}", f"It answered:\n{_text(call.text)}"]
        final = trace is not None and trace.calls and trace.calls[-1] is call
        target = run.example[1]
        if target is not None:
            label = "The expected answer" if final else "The pipeline's expected final output"
            lines.append(f"{label}:\n{_text(target)}")
    else:
        lines.append(f"The pipeline was given:\n{_text(run.example[0])}")
        if run.example[1] is not None:
            lines.append(f"The expected output:\n{_text(run.example[1])}")
        lines.append("(the step was not called in this run)")
    if run.text:
        lines.append(f"What the loss said:\n{run.text}")
    reached = [
        text
        for name, texts in run.feedback.items()
        if name == param.qualified_name or name.endswith("." + param.qualified_name)
        for text in texts
    ]
    if reached:
        lines.append("The feedback that reached this instruction:\n" + "\n".join(reached))
    return "\n".join(lines)


def _path_of(call: Any) -> str | None:
    return getattr(call.module, "qualified_path", None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
