"""`RecipeSearch`: the learning recipe chosen per task by cross-validation, not by us.

Which recipe teaches a small model a task best (a fixed list of demonstrations or
a pool chosen per input, how many pairs, how a label call chooses its label, the
instruction) depends on the task: a recipe tuned on some tasks can lose on the
next to plain bootstrap.  And a choice made on a 10-example validation set is
mostly luck.  So `RecipeSearch` tries the recipes on the task itself and chooses
with evidence that a small validation set cannot give:

1. every labelled example (training and validation together) is run once with
   the values in place: each one's score, and its stages' pairs (the runs that
   passed and the labelled pairs, as `BootstrapFewShot` gathers them);
2. the examples are split into ``folds`` folds.  A recipe is scored on a fold
   with demonstrations drawn only from the *other* folds' pairs, so every example
   is scored by a recipe that never saw it: cross-validation.  Where the pipeline
   answers with labels, every mean below is balanced (each label's mean, averaged):
   on a few dozen examples the labels are rarely even, and answering the majority
   label to everything must not score as well as telling them apart;
3. the plain fixed list of ``max_demos`` pairs is searched, since which few pairs
   a list holds, and their order, can matter more than anything else about it:
   ``lists`` candidate lists are drawn (a label call's showing every label; half
   of them the others reversed) and halved over the folds as the recipes are
   (each scored only on examples it holds none of), and a fold is answered by the
   candidate best on the other folds among those holding none of its examples.
   The halving sees every fold, so that score leans a little high, towards the
   recipe `BootstrapFewShot` installs.  Variants of that list (another label
   method, an instruction) use the same candidate per fold;
4. the recipes (see `recipes`) are scored by successive halving over the folds
   (every recipe on the first fold, the better ``1/eta`` on more, and so on to
   all of them), within ``max_calls`` LLM requests; the values in place and a
   plain fixed list (what `BootstrapFewShot` installs) always go to the end;
5. among the recipes scored on every example, the best mean wins, *unless* the
   plain fixed list of ``max_demos`` pairs (what `BootstrapFewShot` installs, the
   recipe known to do well on most tasks) or a simpler recipe is not beaten by it
   with support (the paired-bootstrap interval of the best's gain over it, at
   ``confidence``, reaches 0): then the plain list is chosen if it is such a
   recipe, and otherwise the simplest one.  So a tie goes to the plain list, then
   to the simpler: a recipe other than the plain list is installed only on
   evidence that it does better on this task.  The default level, 68%, is the
   one-standard-error rule of choosing by cross-validation: a recipe must gain
   at least about one standard error of the paired difference;
6. the chosen recipe is installed: a pool holds every labelled pair; a fixed
   list is the one cross-validation scored best (for the plain list, of the
   candidates the halving scored to the end, the one best on the examples it
   holds none of; for another, the list of the
   fold whose held-out examples it answered best), since which pairs a list
   holds matters as much as how many.

The simplicity order (simplest first): the values in place; then recipes that
keep the instruction before those that change it; among those, a fixed list
before a pool ranked by BM25 before a pool ranked by embeddings; then the label
method in place before ``grammar``, ``logprob``, ``calibrated``; then fewer pairs.

Only the label methods every label call's provider runs are tried
(`plait.providers.base.LABEL_METHODS_BY_PROVIDER`): the embedded model and
OpenAI-compatible endpoints all three, Anthropic only ``grammar``.  The chosen
method is saved with the parameters (each label call's ``label_method``
`Parameter`), so ``plait eval/run/serve --parameters`` run with it.

The `Trainer`'s gate would judge the installed values on the validation set,
whose examples are now in the demonstrations; so `RecipeSearch` gives the gate
its verdict (`plait.learning.Judgement`): keep the recipe only if its mean over
the cross-validated examples beats the values in place's on the same examples,
so it never leaves the pipeline worse than it started on that evidence.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plait.demos import normalize_demos
from plait.inference import LLMInference
from plait.learning.bootstrap import (
    ExampleRun,
    TrainingBatch,
    _covering,
    _ordered_pairs,
    _root_of,
    check_positive,
    install,
    labels_of,
)
from plait.learning.failures import TrainerError
from plait.learning.history import Judgement
from plait.learning.search import (
    DemoSearch,
    _instruction_slot,
    grouped_mean,
    paired_interval,
)
from plait.learning.spend import phase
from plait.parameter import Parameter

__all__ = ["Recipe", "RecipeSearch"]

#: How a recipe's demonstrations are chosen, simplest first.
DEMO_KINDS = ("in place", "list", "bm25", "embeddings")
#: Label methods, simplest first (None: the method in place).
_METHOD_RANK = {None: 0, "grammar": 1, "logprob": 2, "calibrated": 3}
#: Where a stage's label method sits among a candidate's values.
LABEL_SLOT = "#label_method"


@dataclass(frozen=True, slots=True)
class Recipe:
    """One way to teach the pipeline its task, as `RecipeSearch` tries it.

    Attributes:
        demos: ``"in place"`` (the demonstrations as they are), ``"list"`` (a
            fixed list of ``k`` pairs), ``"bm25"`` or ``"embeddings"`` (a pool of
            which each call is shown the ``k`` pairs most like its input).
        k: Pairs per call (None for ``"in place"``).
        label_method: The method every label call uses (None: the one in place).
        instruction: Which proposed instruction replaces the one in place (None:
            the one in place).
    """

    demos: str = "in place"
    k: int | None = None
    label_method: str | None = None
    instruction: int | None = None

    @property
    def name(self) -> str:
        """A short name, as the history shows it (``"bm25 k=4 + calibrated"``)."""
        parts = [self.demos if self.k is None else f"{self.demos} k={self.k}"]
        if self.label_method is not None:
            parts.append(self.label_method)
        if self.instruction is not None:
            parts.append(f"instruction {self.instruction + 1}")
        return " + ".join(parts)

    def complexity(self) -> tuple[int, int, int, int]:
        """The recipe's place in the simplicity order: smaller is simpler."""
        return (
            int(self.instruction is not None),
            DEMO_KINDS.index(self.demos),
            _METHOD_RANK[self.label_method],
            self.k or 0,
        )

    def to_json(self) -> dict[str, Any]:
        """The recipe as JSON data (the history's form)."""
        return {
            "demos": self.demos,
            "k": self.k,
            "label_method": self.label_method,
            "instruction": self.instruction,
        }


@dataclass(slots=True)
class _Lists:
    """The candidate lists of the plain recipe and what scoring them found.

    Attributes:
        values: Each candidate's demonstrations, by stage.
        holds: The examples each candidate's pairs come from (never scored on them).
        scores: Each candidate's score on every example it does not hold.
        per_fold: The candidate chosen for each fold, among those holding none of its
            examples, by its mean on the other folds' examples.
        full: The candidates the halving scored on every example they hold none of.
        groups: Each example's label where every label weighs the same in a mean
            (see `_Search._groups`), else None.
    """

    values: list[dict[str, Any]]
    holds: list[set[int]]
    scores: list[dict[int, float]]
    per_fold: list[int]
    full: list[int]
    groups: list[str] | None

    def mean(self, j: int, leaving: set[int] | frozenset[int] = frozenset()) -> float:
        """Candidate ``j``'s mean over the examples it was scored on, but ``leaving``."""
        scored = [(i, s) for i, s in self.scores[j].items() if i not in leaving]
        return grouped_mean(scored, self.groups)

    @property
    def best(self) -> int:
        """Of the candidates scored to the end, the one with the best mean."""
        return max(self.full, key=lambda j: (self.mean(j), -j))


class RecipeSearch(DemoSearch):
    """Chooses the learning recipe for this task by cross-validation, within a call budget.

    It tries fixed demonstration lists against pools chosen per input (BM25, and
    embeddings with ``embed``), each ``k`` of ``k_choices``, every label method
    the label calls' providers run, and, with a ``rewriter``, new instructions.
    The plain fixed list of ``max_demos`` pairs is searched among ``lists``
    candidates, halved over the examples each holds none of.  Each recipe is
    scored by ``folds``-fold cross-validation over the training and validation
    examples together (a fold's demonstrations come only from the other folds'
    pairs), by successive halving within ``max_calls``.  The best recipe is
    installed only if it beats the plain fixed list of ``max_demos`` pairs with
    support (paired bootstrap at ``confidence``); otherwise the plain list is, or,
    where the best does not beat a simpler recipe either, the simplest such one
    (a pool of every labelled pair, or the fixed list that scored best in
    cross-validation).  It searches once, at the `Trainer`'s first step (later
    steps change nothing), so train it with ``max_steps=1``.  ``search_report``
    (the history's ``trials[].search``) holds every recipe tried, its score on
    every example, the candidate lists, the intervals, the calls used and why the
    winner won.

    The call budget counts the LLM requests the choice makes: every call of the
    pipeline's runs it scores (a ``calibrated`` label call counts twice, for the
    prior it may measure) and every instruction proposal.  The Trainer's
    validation passes are not in it; it runs no minibatch pass for this
    optimizer, whose step reports no batch score.  When it cannot pay for every
    recipe, the instruction proposals are left out first, then the label-method
    variants, then the other ``k``: every kind of demonstrations is tried.

    The search runs through the Trainer's passes (`TrainingBatch.run_examples`), so
    with a ``checkpoint_dir`` a run killed mid-search and started again is answered
    every call the killed one completed, and makes the same choice; a
    ``calibrated`` call's stored reply brings back the content-free prior it was
    divided by, so the prior is not measured again either.

    Args:
        params: The pipeline's parameters (``model.parameters()``).
        max_calls: The most LLM requests the choice may spend.
        folds: Cross-validation folds (at least 2).
        k_choices: The numbers of pairs per call tried, for lists and pools.
        max_demos: The pairs in the plain fixed list always scored to the end
            (what `BootstrapFewShot` installs).
        lists: Candidate lists of ``max_demos`` pairs searched for the plain
            list (see above; 0 scores one random list per fold instead).  Half
            of them (while each fold keeps a drawn list that holds none of its
            examples) are the others in reverse order: a small model reads a
            list's order as much as its pairs.  They are halved over the folds
            (``1/eta`` go on at each rung) within half the budget left after the
            first runs: fewer are drawn where it pays for fewer, and fewer than
            ``folds`` are not searched.
        balance_labels: Where the pipeline answers with labels (every target is a
            label of one of its label calls), compare recipes by balanced accuracy
            (the mean of each label's mean), so that answering the majority label
            of a few dozen examples to everything does not score as well as telling
            the labels apart.  False compares by plain accuracy, for data whose
            labels are truly that uneven and where accuracy is what counts.
        embed: An alias whose embeddings rank a pool: pools ranked by embeddings
            are tried too.
        label_methods: The label methods to try (default: every one the label
            calls' providers run; ``()`` keeps the method in place).
        rewriter: An alias that proposes new instructions (none without it).
        instructions: Instructions proposed per learnable system prompt.
        confidence: The level of the paired-bootstrap interval that must lie
            above 0 for a more complex recipe to beat a simpler one (0.68: about
            one standard error; 0.9 or 0.95 prefer the simpler more strongly).
        eta: ``1/eta`` of the recipes go on at each rung of the halving.
        threshold: The loss score a run needs to count as passed.
        seed: Fixes the folds and every draw of demonstrations.
        stage_targets: Labelled pairs for inner stages (see `BootstrapFewShot`).
        rewriter_temperature: The instruction proposals' temperature.

    Raises:
        ValueError: ``max_calls``, ``instructions`` or ``max_demos`` is not a
            positive integer, ``folds`` is below 2, ``confidence`` is not between
            0 and 1, a label method is unknown, ``embed`` is empty, or as
            `DemoSearch`.
        TypeError: As `DemoSearch`.

    Examples:
        ```python
        from typing import Literal

        import plait
        from plait.handlers import mock
        from plait.learning import ExactMatch, RecipeSearch, Trainer
        from plait.providers import LLMRequest


        class Triage(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.classify = plait.LLMInference(
                    "fast",
                    "Is the message about billing or shipping?",
                    demos=[],
                    response_format=Literal["billing", "shipping"],
                )

            def forward(self, message: str) -> str:
                return self.classify(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model that answers as the demonstration next to the input.
            answers = [m["content"] for m in request.messages if m["role"] == "assistant"]
            return answers[-1] if answers else "billing"


        words = ["charged", "refund", "invoice", "parcel", "tracking", "courier"]
        data = [
            (f"A question about my {w} {i}.", "billing" if w in words[:3] else "shipping")
            for i in range(2)
            for w in words
        ]
        pipeline = Triage()
        search = RecipeSearch(pipeline.parameters(), max_calls=300, folds=3, label_methods=())
        trainer = Trainer(pipeline, ExactMatch(), search, data[:8], data[8:], max_steps=1)
        with mock({"fast": model}):
            history = trainer.fit_sync()
        report = history.steps[0].trials[0]["search"]
        print(report["chosen"], "|", report["budget"]["used"] <= 300)
        ```
    """

    runs_minibatch = True
    """The search scores its own runs of every labelled example, so the Trainer's
    minibatch pass would be paid for and never read (the step reports no batch score)."""
    minibatch_score: float | None = None

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        max_calls: int = 600,
        folds: int = 5,
        k_choices: Sequence[int] = (2, 4, 8),
        max_demos: int = 4,
        lists: int = 16,
        balance_labels: bool = True,
        embed: str | None = None,
        label_methods: Sequence[str] | None = None,
        rewriter: str | None = None,
        instructions: int = 2,
        confidence: float = 0.68,
        eta: int = 2,
        threshold: float = 1.0,
        seed: int = 0,
        stage_targets: Mapping[str, Callable[[Any], Any]] | None = None,
        rewriter_temperature: float | None = 0.9,
    ) -> None:
        given = list(params) if not isinstance(params, Parameter) else params
        super().__init__(
            given,
            candidates=1,
            max_demos=max_demos,
            eta=eta,
            min_examples=1,
            k_choices=k_choices,
            threshold=threshold,
            seed=seed,
            stage_targets=stage_targets,
            rewriter=rewriter,
            instructions=instructions,
            rewriter_temperature=rewriter_temperature,
        )
        check_positive(max_calls=max_calls)
        if isinstance(lists, bool) or not isinstance(lists, int) or lists < 0:
            raise ValueError(
                f"lists must be a whole number of candidate lists (0 for none), got {lists!r}"
            )
        if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
            raise ValueError(f"folds must be an integer of at least 2, got {folds!r}")
        if (
            isinstance(confidence, bool)
            or not isinstance(confidence, int | float)
            or not 0 < confidence < 1
        ):
            raise ValueError(f"confidence must be a number between 0 and 1, got {confidence!r}")
        if embed is not None and (not isinstance(embed, str) or not embed.strip()):
            raise ValueError(f"embed must be an alias (a non-empty string), got {embed!r}")
        methods = None if label_methods is None else tuple(label_methods)
        for method in methods or ():
            if method not in _METHOD_RANK or method is None:
                raise ValueError(
                    f"label_methods holds {method!r}; the label methods are grammar, logprob "
                    "and calibrated"
                )
        self.max_calls = max_calls
        self.folds = folds
        self.lists = lists
        self.balance_labels = bool(balance_labels)
        self.embed = embed
        self.label_methods = methods
        self.confidence = float(confidence)
        self.used = 0
        """LLM requests the choice has spent so far (see the budget above)."""
        self.chosen: dict[str, Any] | None = None
        """The recipe installed, once the search has run (JSON data)."""
        self.judgement: Judgement | None = None
        """The verdict the `Trainer`'s gate follows: keep the installed recipe only
        if it beat the values in place on the same cross-validated examples."""

    def settings(self) -> dict[str, Any]:
        """What a resumed run must be given again to make the same choice.

        The budget, the folds and what is tried: a checkpoint written with other
        settings is refused, naming each that changed.

        Returns:
            JSON-ready data: each option by name.
        """
        return {
            **super().settings(),
            "max_calls": self.max_calls,
            "folds": self.folds,
            "lists": self.lists,
            "balance_labels": self.balance_labels,
            "embed": self.embed,
            "label_methods": None if self.label_methods is None else list(self.label_methods),
            "confidence": self.confidence,
        }

    async def observe(self, batch: TrainingBatch) -> None:
        """Keep the Trainer's passes for `step`.

        The search gathers its pairs from its own runs of every labelled example,
        so the minibatch is not run here.

        Args:
            batch: The minibatch and the Trainer's passes.
        """
        self._evaluate = batch.evaluate
        self._batch = batch

    async def step(self) -> dict[str, Any]:
        """Choose the recipe by cross-validation and install it (at the first step only).

        Returns:
            The new values, by qualified parameter name (empty when the values in
                place won, and at every later step).

        Raises:
            TrainerError: ``max_calls`` cannot pay even for one run of every
                labelled example.
        """
        batch = self._batch
        if self.chosen is not None or batch is None or batch.run_examples is None:
            self.search_report = (
                {"note": f"the recipe was chosen at an earlier step: {self.chosen['name']}"}
                if self.chosen is not None
                else {"note": "no trainer to run examples with"}
            )
            self.steps += 1
            return {}
        self.steps += 1
        return await _Search(self, batch).run()

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state, for a checkpoint.

        As `BootstrapFewShot`'s, with the settings, the calls spent and the recipe chosen.

        Returns:
            JSON-ready data.
        """
        state = super().state_dict()
        state.update(used=self.used, chosen=self.chosen)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, to resume a run.

        Args:
            state: The saved state.

        Raises:
            ValueError: ``state`` comes from another type of optimizer.
        """
        super().load_state_dict(state)
        self.used = int(state.get("used", 0))
        chosen = state.get("chosen")
        self.chosen = dict(chosen) if isinstance(chosen, dict) else None

    def __repr__(self) -> str:
        return (
            f"RecipeSearch(max_calls={self.max_calls}, folds={self.folds}, "
            f"k_choices={list(self.k_choices)}, steps={self.steps})"
        )


class _Search:
    """One search: the examples' pairs, the recipes, the halving, the choice."""

    def __init__(self, owner: RecipeSearch, batch: TrainingBatch) -> None:
        self.owner = owner
        self.batch = batch
        self.examples = [*batch.train_examples, *batch.val_examples]
        self.stages = {path: param for param, path in owner._paths().items()}
        self.label_calls = _label_calls(owner)
        self.lists: _Lists | None = None
        self.groups, self.statistic = self._groups()
        self.report: dict[str, Any] = {}

    # -- the whole search ------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        owner = self.owner
        n = len(self.examples)
        if n < owner.folds:
            owner.search_report = {
                "note": f"{n} labelled example(s), fewer than the {owner.folds} folds: "
                "nothing to cross-validate; the values in place are kept"
            }
            owner.chosen = {"name": Recipe().name, "recipe": Recipe().to_json()}
            return {}
        methods, in_place, providers = self._methods()
        with phase("evaluating"):
            first = await self._run_all()
        base_cost = sum(self._cost(run, self._calibrated(None, in_place)) for run in first)
        if base_cost > owner.max_calls - owner.used:
            raise TrainerError(
                f"RecipeSearch(max_calls={owner.max_calls}) cannot pay for one run of the "
                f"{n} labelled examples ({base_cost} calls), let alone compare recipes: raise "
                "max_calls (plait train --max-calls) to several times that"
            )
        owner.used += base_cost
        per_example = base_cost / n
        pairs = await self._pairs(first)
        written = await self._instructions(pairs)
        recipes = self._recipes(methods, written)
        folds = self._folds()
        scores: dict[Recipe, dict[int, float]] = {recipe: {} for recipe in recipes}
        scores[recipes[0]] = {i: run.score for i, run in enumerate(first)}
        lists_report = await self._search_lists(folds, pairs, per_example, in_place)
        if self.lists is not None and self._plain in scores:
            scores[self._plain] = self._nested_scores(folds)
        recipes, dropped = self._fit_budget(recipes, folds, per_example, in_place, scores)
        rungs = await self._halve(recipes, folds, pairs, scores, per_example, in_place, written)
        finalists = [r for r in recipes if len(scores[r]) == n]
        chosen, comparisons, best = self._choose(finalists, scores)
        owner.search_report = {
            "method": f"{owner.folds}-fold cross-validation over the training and "
            "validation examples",
            "examples": n,
            "statistic": self.statistic,
            "folds": [sorted(fold) for fold in folds],
            "confidence": owner.confidence,
            "label_methods": {"tried": [m for m in methods if m], "providers": providers},
            "budget": {
                "max_calls": owner.max_calls,
                "used": owner.used,
                "counted": "LLM requests of the runs the search scored (a calibrated label "
                "call counted twice, for its prior) and instruction proposals",
            },
            "recipes": [
                {
                    "name": r.name,
                    "recipe": r.to_json(),
                    "simplicity": i,
                    "scores": [scores[r].get(j) for j in range(n)],
                    "fold_means": [
                        self._mean(scores[r], fold) if all(j in scores[r] for j in fold) else None
                        for fold in folds
                    ],
                    "mean": self._mean(scores[r]) if scores[r] else None,
                    "finalist": r in finalists,
                }
                for i, r in enumerate(recipes)
            ],
            "not_tried": [{"name": r.name, "reason": why} for r, why in dropped],
            "lists": lists_report,
            "rungs": rungs,
            "best": best.name,
            "comparisons": comparisons,
            **({"instructions": written} if written else {}),
        }
        return self._install(chosen, best, scores, folds, pairs, written)

    # -- the statistic ---------------------------------------------------------------
    def _groups(self) -> tuple[list[str] | None, str]:
        """What every mean the search takes is: each example's label, where labels weigh
        the same, and the statistic's name.

        Where the pipeline answers with labels (every example's target is a label of
        one of its label calls), a mean is the mean of each label's mean over its
        examples: balanced accuracy, for a score of 0 or 1.  On a few dozen examples
        the labels are rarely as even as the data they come from, and a recipe that
        answers the majority label to everything then scores as well as one that
        tells the labels apart (60% on 40 reviews of which 24 are positive, for
        both), while held out it is the worse by far.  Otherwise every example
        weighs the same (None).
        """
        targets = [example[1] for example in self.examples]
        for call in self.label_calls.values() if self.owner.balance_labels else ():
            labels = labels_of(call)
            if not labels or not all(isinstance(t, str) and t in labels for t in targets):
                continue
            if len(set(targets)) < 2:
                break
            return list(targets), "balanced accuracy: the mean of each label's mean"
        return None, "mean: every example weighs the same"

    def _mean(self, scores: Mapping[int, float], indices: Iterable[int] | None = None) -> float:
        """The search's mean of ``scores`` (by example) over ``indices``, or all of them."""
        chosen = scores.items() if indices is None else ((i, scores[i]) for i in indices)
        return grouped_mean(list(chosen), self.groups)

    # -- label methods ---------------------------------------------------------------
    def _methods(self) -> tuple[list[str | None], dict[str, str], dict[str, str]]:
        """The label methods to try (None: the one in place, always first), the method
        each label call runs now, and each label call's alias and provider."""
        if not self.label_calls:
            return [None], {}, {}
        from plait.execution.settings import get_execution_settings
        from plait.providers.base import DEFAULT_LABEL_METHOD, LABEL_METHODS_BY_PROVIDER
        from plait.resources.manager import ResourceManager

        settings = get_execution_settings()
        manager = ResourceManager.coerce(settings.resources if settings is not None else None)
        runs: set[str] | None = None
        in_place: dict[str, str] = {}
        providers: dict[str, str] = {}
        for path, call in self.label_calls.items():
            provider = manager.config_for(call.alias).provider
            providers[path] = f"{call.alias} ({provider})"
            methods = set(LABEL_METHODS_BY_PROVIDER.get(provider, ("grammar",)))
            runs = methods if runs is None else runs & methods
            in_place[path] = call.label_method or DEFAULT_LABEL_METHOD.get(provider, "grammar")
        wanted = self.owner.label_methods
        offered = [
            m
            for m in ("grammar", "logprob", "calibrated")
            if m in (runs or set()) and (wanted is None or m in wanted)
        ]
        # A method every call already runs is the recipe "in place", not another one.
        tried: list[str | None] = [None]
        tried += [m for m in offered if any(in_place[p] != m for p in in_place)]
        return tried, in_place, providers

    def _example_cost(
        self, recipe: Recipe, per_example: float, in_place: Mapping[str, str]
    ) -> float:
        """The requests scoring ``recipe`` on one example is expected to make: the
        calls of a run with the values in place, and a prior per calibrated call."""
        return per_example + self._calibrated(recipe.label_method, in_place)

    def _calibrated(self, method: str | None, in_place: Mapping[str, str]) -> int:
        """How many label calls run ``"calibrated"`` under ``method`` (None: in place)."""
        return sum(1 for path in self.label_calls if (method or in_place.get(path)) == "calibrated")

    # -- runs ------------------------------------------------------------------------
    async def _run_all(self) -> list[ExampleRun]:
        assert self.batch.run_examples is not None
        runs = await self.batch.run_examples(self.examples)
        return list(runs)

    def _cost(self, run: ExampleRun, calibrated: int) -> int:
        """The requests one run made: its calls, and a prior per calibrated label call."""
        calls = len(run.trace.calls) if run.trace is not None else 1
        return calls + (calibrated if run.trace is not None else 0)

    async def _pairs(self, runs: list[ExampleRun]) -> list[dict[str, list[tuple[Any, Any]]]]:
        """Per example, per stage: the pairs its run gave (bootstrapped, then labelled)."""
        owner = self.owner
        found: list[dict[str, list[tuple[Any, Any]]]] = []
        everything: dict[str, dict[str, dict[Any, Any]]] = {"passed": {}, "labelled": {}}
        for run in runs:
            if run.trace is None:
                found.append({})
                continue
            one = TrainingBatch([run.example], [run.trace], self.batch.loss_fn)
            passed, labelled = await owner._gather(one)
            for kind, gathered in (("passed", passed), ("labelled", labelled)):
                for path, pairs in gathered.items():
                    everything[kind].setdefault(path, {}).update(pairs)
            found.append(
                {
                    path: _ordered_pairs(passed.get(path, {}), labelled.get(path, {}))
                    for path in {*passed, *labelled}
                }
            )
        # The instruction proposals are shown pairs the way DemoSearch shows them.
        owner.passed, owner.labelled = everything["passed"], everything["labelled"]
        return found

    async def _instructions(
        self, pairs: list[dict[str, list[tuple[Any, Any]]]]
    ) -> dict[str, list[str]]:
        owner = self.owner
        if owner._instruction_call is None:
            return {}
        cost = len(owner.instruction_params) * owner.instructions
        if owner.used + cost > owner.max_calls:
            return {}
        owner.used += cost
        with phase("proposing"):
            return await owner._propose_instructions(
                random.Random(f"instructions:{owner.seed}:{owner.steps}")
            )

    # -- recipes ---------------------------------------------------------------------
    def _recipes(self, methods: list[str | None], written: Mapping[str, list[str]]) -> list[Recipe]:
        """Every recipe to try, simplest first (the values in place first)."""
        owner = self.owner
        kinds = ["list", "bm25"] + (["embeddings"] if owner.embed is not None else [])
        proposals = max((len(v) for v in written.values()), default=0)
        found = {Recipe()}
        for instruction in [None, *range(proposals)]:
            for method in methods:
                if instruction is not None or method is not None:
                    found.add(Recipe("in place", None, method, instruction))
                if not self.stages:
                    continue
                for kind in kinds:
                    for k in sorted({*owner.k_choices, owner.max_demos}):
                        if kind == "list" or k in owner.k_choices:
                            found.add(Recipe(kind, k, method, instruction))
        return sorted(found, key=lambda r: (r.complexity(), r.name))

    @property
    def _plain(self) -> Recipe:
        """The plain fixed list of ``max_demos`` pairs: what `BootstrapFewShot` installs,
        scored to the end and the recipe to beat."""
        return Recipe("list", self.owner.max_demos)

    def _protected(self, recipe: Recipe) -> bool:
        """The baselines always scored to the end: the values in place, the plain list."""
        return recipe == Recipe() or recipe == self._plain

    def _folds(self) -> list[list[int]]:
        order = list(range(len(self.examples)))
        random.Random(f"folds:{self.owner.seed}").shuffle(order)
        return [sorted(order[f :: self.owner.folds]) for f in range(self.owner.folds)]

    def _fit_budget(
        self,
        recipes: list[Recipe],
        folds: list[list[int]],
        per_example: float,
        in_place: Mapping[str, str],
        scores: Mapping[Recipe, Mapping[int, float]],
    ) -> tuple[list[Recipe], list[tuple[Recipe, str]]]:
        """The recipes whose halving fits in what is left of the budget, counting the
        dearest survivors at every rung.  They are left out breadth first: instruction
        proposals, then label-method variants, then other ``k``, so every kind of
        demonstrations (a list, each kind of pool) at the method in place is tried
        before a variant of one kind; left out simplest-last in the simplicity order,
        a small budget would drop every pool before any method variant of a list."""
        kept = list(recipes)
        dropped: list[tuple[Recipe, str]] = []
        while self._planned(kept, folds, per_example, in_place, scores) > (
            self.owner.max_calls - self.owner.used
        ):
            removable = sorted((r for r in kept if not self._protected(r)), key=self._trim_order)
            if not removable:
                break
            last = removable[-1]
            kept.remove(last)
            dropped.append((last, "over the call budget"))
        return kept, dropped

    def _trim_order(self, recipe: Recipe) -> tuple[int, int, int, int, int, str]:
        """Where a recipe stands when the budget leaves some out: the last goes first."""
        return (
            int(recipe.instruction is not None),
            _METHOD_RANK[recipe.label_method],
            int(recipe.k not in (None, self.owner.max_demos)),
            DEMO_KINDS.index(recipe.demos),
            recipe.k or 0,
            recipe.name,
        )

    def _planned(
        self,
        recipes: list[Recipe],
        folds: list[list[int]],
        per_example: float,
        in_place: Mapping[str, str],
        scores: Mapping[Recipe, Mapping[int, float]],
    ) -> float:
        # The values in place (the first run of every example) and the searched plain
        # list are scored on every example already.
        n = len(self.examples)
        cost = {
            r: 0.0 if len(scores.get(r, {})) == n else self._example_cost(r, per_example, in_place)
            for r in recipes
        }
        total, alive, done = 0.0, list(recipes), 0
        for size in self._rungs(len(recipes)):
            new = sum(len(folds[f]) for f in range(done, size))
            total += new * sum(cost[r] for r in alive)
            done = size
            keep = max(1, math.ceil(len(alive) / self.owner.eta))
            dearest = sorted(alive, key=lambda r: -cost[r])
            alive = list(
                dict.fromkeys([*dearest[:keep], *(r for r in alive if self._protected(r))])
            )
        return total

    def _rungs(self, candidates: int) -> list[int]:
        """Folds scored at each rung: ``eta`` times more each time, all at the end."""
        return self.owner._rung_sizes(max(candidates, 1), self.owner.folds)

    # -- halving ---------------------------------------------------------------------
    async def _halve(
        self,
        recipes: list[Recipe],
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        scores: dict[Recipe, dict[int, float]],
        per_example: float,
        in_place: Mapping[str, str],
        written: Mapping[str, list[str]],
    ) -> list[dict[str, Any]]:
        owner = self.owner
        alive = list(recipes)
        rungs: list[dict[str, Any]] = []
        for size in self._rungs(len(recipes)):
            # The baselines first: where recipes tied at a cut outrun the plan, the
            # budget runs out on one of them, never on the recipes to beat.
            for recipe in sorted(alive, key=lambda r: not self._protected(r)):
                for f in range(size):
                    if all(i in scores[recipe] for i in folds[f]):
                        continue
                    estimate = len(folds[f]) * self._example_cost(recipe, per_example, in_place)
                    if owner.used + estimate > owner.max_calls:
                        continue  # left unscored: it cannot be a finalist
                    await self._score(recipe, f, folds, pairs, scores, in_place, written)
            scored = [r for r in alive if all(i in scores[r] for f in folds[:size] for i in f)]
            means = {r: self._mean(scores[r], [i for f in folds[:size] for i in f]) for r in scored}
            rungs.append({"folds": size, "means": {r.name: means[r] for r in scored}})
            if size == len(folds):
                break
            keep = max(1, math.ceil(len(scored) / owner.eta))
            ranked = sorted(scored, key=lambda r: (-means[r], r.complexity()))
            # A recipe tied with the last one kept goes on too: a few examples that
            # cannot tell them apart must not cut the more complex one for its
            # complexity alone (the choice prefers the simpler on the evidence of all).
            cut = means[ranked[keep - 1]] if ranked else 0.0
            survivors = {
                *ranked[:keep],
                *(r for r in scored if means[r] >= cut or self._protected(r)),
            }
            alive = [r for r in alive if r in survivors]
        return rungs

    async def _score(
        self,
        recipe: Recipe,
        fold: int,
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        scores: dict[Recipe, dict[int, float]],
        in_place: Mapping[str, str],
        written: Mapping[str, list[str]],
    ) -> None:
        """Score ``recipe`` on one fold, its demonstrations drawn from the other folds."""
        values = self._fold_values(recipe, fold, folds, pairs, written)
        calibrated = self._calibrated(recipe.label_method, in_place)
        scores[recipe].update(await self._run_with(values, folds[fold], calibrated))

    async def _run_with(
        self, values: Mapping[str, Any], indices: Sequence[int], calibrated: int
    ) -> dict[int, float]:
        """Run the examples at ``indices`` with ``values`` set (and put back after),
        counting their requests: each one's score."""
        assert self.batch.run_examples is not None
        slots = self._slots()
        before = {key: param.value for key, param in slots.items()}
        try:
            for key, value in values.items():
                slots[key].value = value
            with phase("evaluating"):
                runs = await self.batch.run_examples([self.examples[i] for i in indices])
        finally:
            for key, value in before.items():
                slots[key].value = value
        found: dict[int, float] = {}
        for i, run in zip(indices, runs, strict=True):
            found[i] = run.score
            self.owner.used += self._cost(run, calibrated)
        return found

    # -- the plain list, searched --------------------------------------------------------
    async def _search_lists(
        self,
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        per_example: float,
        in_place: Mapping[str, str],
    ) -> dict[str, Any]:
        """Draw candidate lists for the plain recipe and halve them over the folds'
        examples (at the label methods in place), each scored only on examples it
        holds none of.

        Which pairs a short list holds can matter more than anything else about it:
        on a small model one list of four teaches a verdict and another, as good on
        paper, teaches it to answer one label to everything; the same four pairs in
        reverse order can do either.  One random list per fold cannot tell them
        apart, and the best of a few lists on a fold of eight examples is mostly
        luck.  So many lists are drawn and halved as the recipes are: every list on
        the first two folds' examples, the better ``1/eta`` on more folds, and the
        last few on every example they hold none of; a bad list is found on a few
        examples, and the budget goes to telling good ones apart.  Candidate ``j``
        is drawn from the pairs outside fold ``j mod folds``, so every fold has
        candidates that hold none of its examples (see `_nested_scores`).
        """
        owner = self.owner
        k = owner.max_demos
        report: dict[str, Any] = {"k": k, "wanted": owner.lists}
        if owner.lists == 0 or not self.stages:
            report["searched"] = False
            report["why"] = "lists=0" if owner.lists == 0 else "no demonstrations to choose"
            return report
        calibrated = self._calibrated(None, in_place)
        per_call = per_example + calibrated
        budget = (owner.max_calls - owner.used) / 2
        count = owner.lists
        while count >= len(folds) and self._lists_planned(count, folds) * per_call > budget:
            count -= 1
        if count < len(folds):
            report["searched"] = False
            report["why"] = (
                f"half the budget left ({budget:.0f} calls) does not pay for halving "
                f"{len(folds)} lists (about {self._lists_planned(len(folds), folds) * per_call:.0f}"
                " calls), one per fold: one random list per fold is scored instead"
            )
            return report
        values: list[dict[str, Any]] = []
        holds: list[set[int]] = []
        # Half the candidates are the others in reverse order (while every fold keeps
        # a drawn list that holds none of its examples): a small model reads a list's
        # order as much as its pairs, and the same four reviews that make it answer
        # one label to everything when the list ends on that label teach it both
        # when the list ends on the other.
        drawn_sets = max(len(folds), math.ceil(count / 2))
        for j in range(count):
            if j < drawn_sets:
                drawn, held = self._draw_list(j, set(folds[j % len(folds)]), pairs)
            else:
                source = j - drawn_sets
                drawn = {path: demos[::-1] for path, demos in values[source].items()}
                held = holds[source]
            values.append(drawn)
            holds.append(held)
        lists = _Lists(values, holds, [{} for _ in values], [], [], groups=self.groups)
        alive, rungs = list(range(count)), []
        for size in self._list_rungs(count):
            wanted = [i for fold in folds[:size] for i in fold]
            for j in alive:
                missing = [i for i in wanted if i not in holds[j] and i not in lists.scores[j]]
                lists.scores[j].update(await self._run_with(values[j], missing, calibrated))
            means = {j: lists.mean(j) for j in alive}
            rungs.append({"folds": size, "means": {str(j): means[j] for j in alive}})
            if size == len(folds):
                break
            keep = max(1, math.ceil(len(alive) / owner.eta))
            alive = sorted(sorted(alive, key=lambda j: (-means[j], j))[:keep])
        lists.full = alive
        for fold in folds:
            lists.per_fold.append(await self._fold_candidate(lists, fold, calibrated))
        self.lists = lists
        report.update(
            searched=True,
            candidates=count,
            reversed=[[j, j - drawn_sets] for j in range(drawn_sets, count)],
            rungs=rungs,
            means=[lists.mean(j) for j in range(count)],
            scored=[len(found) for found in lists.scores],
            holds=[sorted(h) for h in holds],
            chosen_per_fold=lists.per_fold,
            best=lists.best,
        )
        return report

    def _list_rungs(self, count: int) -> list[int]:
        """Folds scored at each rung of the lists' halving: as the recipes' (`_rungs`),
        but never fewer than two at the first.  On one fold of a few examples a list
        that teaches both labels and one that answers a single label can score the
        same (on sentiment, a list 0.70 on the 36 reviews it does not hold scored
        0.33 on its first eight, and was cut)."""
        return sorted({max(min(2, self.owner.folds), size) for size in self._rungs(count)})

    def _lists_planned(self, count: int, folds: list[list[int]]) -> int:
        """The runs halving ``count`` candidate lists makes (at most: an example a
        list holds is not run), and each fold's candidate completed on its fold."""
        total, alive, done = 0, count, 0
        for size in self._list_rungs(count):
            total += alive * sum(len(folds[f]) for f in range(done, size))
            done = size
            alive = max(1, math.ceil(alive / self.owner.eta))
        return total + len(self.examples)

    async def _fold_candidate(self, lists: _Lists, fold: list[int], calibrated: int) -> int:
        """The candidate that answers ``fold``: among those holding none of its
        examples, the best on the other folds' examples, first among the lists the
        halving scored to the end; scored on the fold's examples it has not run."""
        leaving = set(fold)
        eligible = [j for j in range(len(lists.values)) if not lists.holds[j] & leaving]
        finished = [j for j in eligible if j in lists.full]
        outside = {j: sum(i not in leaving for i in lists.scores[j]) for j in eligible}
        pool = finished or [j for j in eligible if outside[j] == max(outside.values())]
        chosen = max(pool, key=lambda j: (lists.mean(j, leaving), -j))
        missing = [i for i in fold if i not in lists.scores[chosen]]
        lists.scores[chosen].update(await self._run_with(lists.values[chosen], missing, calibrated))
        return chosen

    def _draw_list(
        self, j: int, avoid: set[int], pairs: list[dict[str, list[tuple[Any, Any]]]]
    ) -> tuple[dict[str, Any], set[int]]:
        """Candidate ``j``: per stage, a list drawn from the pairs of the examples
        outside ``avoid``, and the examples its pairs come from."""
        values: dict[str, Any] = {}
        held: set[int] = set()
        for path in self.stages:
            source: dict[Any, tuple[Any, Any, int]] = {}
            for i, example in enumerate(pairs):
                if i not in avoid:
                    for inp, out in example.get(path, []):
                        source.setdefault(_key(inp), (inp, out, i))
            found = [(inp, out) for inp, out, _ in source.values()]
            if not found:
                continue
            rng = random.Random(f"candidate list:{self.owner.seed}:{j}:{path}")
            picked = self._list_of(path, found, self.owner.max_demos, rng)
            values[path] = normalize_demos(picked, f"the demonstrations for {path}")
            held |= {source[_key(inp)][2] for inp, _ in picked}
        return values, held

    def _list_of(
        self, path: str, found: list[tuple[Any, Any]], k: int, rng: random.Random
    ) -> list[tuple[Any, Any]]:
        """A random list of ``k`` of ``found`` for the stage at ``path``, showing every
        label a label call's pairs hold (as `BootstrapFewShot`'s lists do)."""
        shuffled = list(found)
        rng.shuffle(shuffled)
        picked = shuffled[:k]
        labels = labels_of(self.stages[path].owner)
        if labels is not None:
            picked = _covering(picked, shuffled[k:], labels)
        return picked

    def _nested_scores(self, folds: list[list[int]]) -> dict[int, float]:
        """The searched plain list's cross-validated score on every example: a fold's
        examples are answered by the candidate chosen without them (one that holds
        none of them, best on the other folds), so the choice among candidates is
        itself cross-validated, as every other recipe's draw is."""
        assert self.lists is not None
        found: dict[int, float] = {}
        for fold, j in zip(folds, self.lists.per_fold, strict=True):
            for i in fold:
                found[i] = self.lists.scores[j][i]
        return found

    # -- values ----------------------------------------------------------------------
    def _fold_values(
        self,
        recipe: Recipe,
        fold: int,
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        written: Mapping[str, list[str]],
    ) -> dict[str, Any]:
        """What ``recipe`` sets to be scored on ``fold``: demonstrations drawn only
        from the other folds' pairs (the same draw every time it is asked)."""
        held = set(folds[fold])
        training = [pairs[i] for i in range(len(pairs)) if i not in held]
        searched = None
        if self.lists is not None and self._searched(recipe):
            searched = self.lists.values[self.lists.per_fold[fold]]
        return self._values(recipe, training, f"fold:{fold}", written, searched)

    def _searched(self, recipe: Recipe) -> bool:
        """Whether ``recipe``'s list is the searched one (a list of ``max_demos``)."""
        return recipe.demos == "list" and recipe.k == self.owner.max_demos

    def _slots(self) -> dict[str, Parameter]:
        """Every value a recipe may set: demonstrations by stage, label methods and
        instructions by their slots."""
        slots: dict[str, Parameter] = dict(self.stages)
        for path, call in self.label_calls.items():
            param = call.label_method_parameter
            assert param is not None
            slots[f"{path}{LABEL_SLOT}"] = param
        for path, param in self.owner.instruction_params.items():
            slots[_instruction_slot(path)] = param
        return slots

    def _values(
        self,
        recipe: Recipe,
        training: list[dict[str, list[tuple[Any, Any]]]],
        draw: str,
        written: Mapping[str, list[str]],
        searched: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What ``recipe`` sets, its demonstrations made from ``training``'s pairs (a
        list's are ``searched``'s, where the list was searched)."""
        values: dict[str, Any] = {}
        if searched is not None:
            values.update(searched)
        elif recipe.demos != "in place":
            assert recipe.k is not None
            for path in self.stages:
                gathered: dict[Any, Any] = {}
                for example in training:  # bootstrapped pairs first, then labelled ones
                    for inp, out in example.get(path, []):
                        gathered.setdefault(_key(inp), (inp, out))
                found = list(gathered.values())
                if not found:
                    continue
                where = f"the demonstrations for {path}"
                if recipe.demos == "list":
                    rng = random.Random(f"list:{self.owner.seed}:{draw}:{path}")
                    values[path] = normalize_demos(self._list_of(path, found, recipe.k, rng), where)
                    continue
                pool: dict[str, Any] = {
                    "pool": normalize_demos(found, where),
                    "k": recipe.k,
                    "cover_labels": False,
                }
                if recipe.demos == "embeddings":
                    pool["embed"] = self.owner.embed
                values[path] = pool
        if recipe.label_method is not None:
            for path in self.label_calls:
                values[f"{path}{LABEL_SLOT}"] = recipe.label_method
        if recipe.instruction is not None:
            for slot, proposals in written.items():
                if proposals:
                    values[slot] = proposals[min(recipe.instruction, len(proposals) - 1)]
        return values

    # -- the choice ------------------------------------------------------------------
    def _choose(
        self, finalists: list[Recipe], scores: dict[Recipe, dict[int, float]]
    ) -> tuple[Recipe, list[dict[str, Any]], Recipe]:
        """The finalist to install: the best, unless it does not beat with support the
        plain list (chosen then) or a simpler recipe (the simplest such one then)."""
        owner = self.owner
        n = len(self.examples)
        means = {r: self._mean(scores[r]) for r in finalists}
        best = min(finalists, key=lambda r: (-means[r], r.complexity()))
        comparisons: list[dict[str, Any]] = []
        tied: list[Recipe] = []  # the finalists the best does not beat with support
        for recipe in finalists:  # simplest first
            diffs = [scores[best][i] - scores[recipe][i] for i in range(n)]
            # The same resamples for every comparison: the same differences get the
            # same interval, whichever recipe they belong to.
            rng = random.Random(f"ci:{owner.seed}")
            low, high = paired_interval(diffs, rng, owner.confidence, self.groups)
            supported = recipe != best and low > 0
            comparisons.append(
                {
                    "recipe": recipe.name,
                    "mean": means[recipe],
                    "best_minus_this": grouped_mean(list(enumerate(diffs)), self.groups),
                    "interval": [low, high],
                    "best_wins": sum(d > 0 for d in diffs),
                    "best_losses": sum(d < 0 for d in diffs),
                    "beaten_with_support": supported,
                }
            )
            if not supported:
                tied.append(recipe)
        # The plain list is the recipe to beat: a tie goes to it, then to the simpler.
        plain = self._plain
        chosen = plain if plain in tied else tied[0]  # the best is always tied with itself
        return chosen, comparisons, best

    def _install(
        self,
        chosen: Recipe,
        best: Recipe,
        scores: dict[Recipe, dict[int, float]],
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        written: Mapping[str, list[str]],
    ) -> dict[str, Any]:
        owner = self.owner
        n = len(self.examples)
        incumbent = Recipe()
        before = self._mean(scores[incumbent])
        after = self._mean(scores[chosen])
        plain = self._plain
        if chosen != incumbent and after <= before:
            why = (
                f"{chosen.name} was the recipe {best.name} does not beat with support, "
                f"but it scores no better than the values in place ({after:.3f} <= "
                f"{before:.3f}): the values in place are kept"
            )
            chosen, after = incumbent, before
        elif chosen == plain:
            why = (
                f"the plain {plain.name}, what BootstrapFewShot installs, scored best ({after:.3f})"
                if best == plain
                else f"{best.name} scored best ({self._mean(scores[best]):.3f}) "
                f"but its gain over the plain {plain.name} ({after:.3f}) is not supported at "
                f"{owner.confidence:.0%} (the interval reaches 0): the tie goes to the plain "
                "list, what BootstrapFewShot installs"
            )
        elif chosen == best:
            against = f"the plain {plain.name} and " if len(scores.get(plain, {})) == n else ""
            why = (
                f"{best.name} scored best ({after:.3f}) and beats with support {against}every "
                f"simpler recipe (the {owner.confidence:.0%} interval of its gain lies above 0)"
            )
        else:
            why = (
                f"{best.name} scored best ({self._mean(scores[best]):.3f}) "
                f"but its gain over the simpler {chosen.name} ({after:.3f}) is not supported "
                f"at {owner.confidence:.0%} (the interval reaches 0): the tie goes to the "
                "simpler recipe"
            )
        owner.search_report["chosen"] = chosen.name
        owner.search_report["why"] = why
        owner.search_report["budget"]["used"] = owner.used
        owner.chosen = {"name": chosen.name, "recipe": chosen.to_json(), "why": why}
        owner.candidate_scores = [self._mean(scores[r]) for r in scores if len(scores[r]) == n]
        if chosen == incumbent:
            return {}
        owner.search_report["gate"] = {"values in place": before, "chosen": after}
        owner.judgement = Judgement(
            keep=after > before,
            evidence=f"{owner.search_report['method']}: {after:.3f} against {before:.3f} for "
            f"the values in place, on the same {n} examples",
        )
        values = self._final_values(chosen, scores, folds, pairs, written)
        return install(self._slots(), values)

    def _final_values(
        self,
        chosen: Recipe,
        scores: dict[Recipe, dict[int, float]],
        folds: list[list[int]],
        pairs: list[dict[str, list[tuple[Any, Any]]]],
        written: Mapping[str, list[str]],
    ) -> dict[str, Any]:
        """The values ``chosen`` installs, fitted on every labelled pair.

        A fixed list is the exception: which ``k`` pairs it holds matters as much as
        ``k``, and cross-validation has already scored one list per fold on examples
        it never saw.  The list of the fold that scored best is installed (what
        `BootstrapFewShot` does with its candidates), not a new draw no call has
        scored.
        """
        if chosen.demos != "list":
            return self._values(chosen, pairs, "final", written)
        if self.lists is not None and self._searched(chosen):
            best = self.lists.best
            self.owner.search_report["installed"] = (
                f"candidate list {best + 1} of {len(self.lists.values)}, which of the "
                f"{len(self.lists.full)} scored to the end scored best on the examples it "
                f"holds none of ({self.lists.mean(best):.3f})"
            )
            return self._values(chosen, pairs, "final", written, self.lists.values[best])
        means = [self._mean(scores[chosen], fold) for fold in folds]
        fold = max(range(len(folds)), key=lambda f: (means[f], -f))
        self.owner.search_report["installed"] = (
            f"the list of fold {fold + 1}, which scored best on its held-out examples "
            f"({means[fold]:.3f}; the folds' lists: " + ", ".join(f"{m:.3f}" for m in means) + ")"
        )
        return self._fold_values(chosen, fold, folds, pairs, written)


def _label_calls(owner: RecipeSearch) -> dict[str, LLMInference]:
    """The pipeline's calls that answer with labels, by module path."""
    if not owner.params:
        return {}
    root = _root_of(owner.params)
    return {
        module.qualified_path: module
        for module in root.modules()
        if isinstance(module, LLMInference) and module.label_method_parameter is not None
    }


def _key(value: Any) -> Any:
    """A demonstration input as a dict key (inputs may be JSON data)."""
    if isinstance(value, str):
        return value
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
