"""`DemoSearch`: many demonstration sets tried cheaply, the best few judged on all of validation.

`BootstrapFewShot` scores a handful of candidate sets on the whole validation
set, and with 20 examples a lucky candidate wins.  On small models *which*
examples are shown matters more than how the instruction is worded, so the way
forward is to try many more sets without paying a full validation pass for each:

1. gather pairs as `BootstrapFewShot` does (the runs that passed, and labelled
   pairs), and propose ``candidates`` distinct values per step: random sets of up
   to ``max_demos`` pairs per stage, sets with one pair per label for a stage
   that answers with labels, and for a pool chosen from per input (`knn_demos`)
   the whole pool with each ``k`` of ``k_choices``; the values in place (the
   incumbent) are always among them;
2. **successive halving**: every candidate is scored on the first few examples of
   a seeded shuffle of the validation set, the best ``1/eta`` of them go on to
   twice as many, and so on until the last few are scored on all of it (a
   candidate's earlier scores are reused, never paid twice);
3. **paired comparison**: the best finalist is compared with the incumbent on the
   same examples, the mean difference with a 95% paired-bootstrap interval; it is
   installed only when it scores better (and, with ``require_confidence``, only
   when the interval's lower end is above 0).  The `Trainer`'s gate then judges it
   as it judges every update: never a worse pipeline.

With a ``rewriter`` (an alias), instructions are searched too: at each step the
rewriter proposes ``instructions`` new system prompts per learnable instruction
(each shown the parameter's description, the current instruction and a different
sample of the stage's labelled pairs), each checked as every rewrite is
(`check_rewrite`), and the candidates combine them with the demonstration sets:
a candidate may change either, or both, and is judged the same way.

`search_report` (saved in the history, ``trials[].search``) holds every
candidate's score at every rung, the finalists and the comparison.  Without a
validation set there is nothing to search with, and it behaves as
`BootstrapFewShot`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from plait.demos import is_pool, label_of, normalize_demos
from plait.inference import LLMInference
from plait.learning.bootstrap import (
    BootstrapFewShot,
    TrainingBatch,
    check_positive,
    install,
    labels_of,
)
from plait.learning.optimizers import (
    Rejection,
    Rewrite,
    _Call,
    _show,
    ask_rewrite,
    check_rewrite,
    meta_markers,
)
from plait.module import Module
from plait.parameter import Parameter

if TYPE_CHECKING:
    from plait.resources.config import ResourceConfig
    from plait.resources.manager import ResourceManager

__all__ = ["DemoSearch", "paired_interval"]

#: Resamples of the paired bootstrap interval.
RESAMPLES = 2000


class DemoSearch(BootstrapFewShot):
    """Tries many demonstration sets cheaply and installs one only when it scores better.

    On small models *which* examples are shown matters more than how the
    instruction is worded, so it tries many more sets than `BootstrapFewShot`
    without paying a full validation pass for each.  It gathers pairs as
    `BootstrapFewShot` does and proposes ``candidates`` values per step (random
    sets, sets with one pair per label for a call that answers with labels, each
    ``k`` of ``k_choices`` for a pool chosen per input; the values in place are
    always among them).  Successive halving scores every candidate on a few
    validation examples, the best ``1/eta`` go on to more, and so on to all of
    them.  The best finalist is compared with the values in place, example by
    example, with a 95% paired-bootstrap interval of the gain, and installed only
    when it scores better.  ``search_report`` (saved in the history as
    ``trials[].search``) records every candidate's scores.  Without a validation
    set it behaves as `BootstrapFewShot`.

    Args:
        params: The pipeline's parameters (``model.parameters()``).
        candidates: Values proposed per step (the values in place come on top).
        max_demos: Pairs per stage in a proposed set.
        eta: ``1/eta`` of the candidates go on at each rung.
        min_examples: The fewest validation examples a rung scores.
        k_choices: The ``k`` tried for a pool chosen from per input.
        require_confidence: Install only a winner whose 95% interval of
            improvement lies above 0.
        threshold: The loss score a run needs to count as passed.
        teacher: A module of the same structure whose runs supply the pairs.
        teacher_alias: Run a copy of the pipeline on this alias for the pairs.
        seed: Fixes every random choice of the search.
        stage_targets: Labelled pairs for inner stages (see `BootstrapFewShot`).
        rewriter: An alias whose model also proposes new instructions for every
            learnable system prompt (none without it); its calls run as the root
            module ``"instructions"``, so ``mock({"instructions": ...})`` answers
            them in tests.
        instructions: New instructions proposed per learnable system prompt per step.
        rewriter_temperature: The instruction proposals' temperature.

    Raises:
        ValueError: ``eta`` is below 2, ``min_examples`` or ``instructions`` is
            not a positive integer, ``k_choices`` holds something other than
            positive integers, ``rewriter`` is given and no system prompt is
            learnable, or as `BootstrapFewShot`.
        TypeError: ``rewriter`` is not a string, or as `BootstrapFewShot`.

    Examples:
        ```python
        import plait
        from plait.handlers import mock
        from plait.learning import DemoSearch, ExactMatch, Trainer
        from plait.providers import LLMRequest


        class Triage(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.classify = plait.LLMInference(
                    "fast", "Is the message about billing or shipping?", demos=plait.knn_demos(k=2)
                )

            def forward(self, message: str) -> str:
                return self.classify(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model that answers as the demonstration next to the input.
            answers = [m["content"] for m in request.messages if m["role"] == "assistant"]
            return answers[-1] if answers else "unsure"


        train = [
            ("I was charged twice.", "billing"),
            ("My parcel is late.", "shipping"),
            ("Why is there a second payment on my card?", "billing"),
            ("The tracking page has not changed.", "shipping"),
        ]
        val = [
            ("My card was charged twice.", "billing"),
            ("Where is my parcel?", "shipping"),
            ("A second payment appeared.", "billing"),
            ("Tracking has not changed in a week.", "shipping"),
        ]
        pipeline = Triage()
        search = DemoSearch(pipeline.parameters(), candidates=8, k_choices=(1, 2))
        trainer = Trainer(pipeline, ExactMatch(), search, train, val, batch_size=4)
        with mock({"fast": model}):
            history = trainer.fit_sync()
        print(history.initial_val_score, "->", history.best_val_score)
        print(history.steps[0].trials[0]["search"]["comparison"]["wins"])
        ```
    """

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        candidates: int = 16,
        max_demos: int = 4,
        eta: int = 2,
        min_examples: int = 4,
        k_choices: Sequence[int] = (2, 4, 8),
        require_confidence: bool = False,
        threshold: float = 1.0,
        teacher: Module | None = None,
        teacher_alias: str | None = None,
        seed: int = 0,
        stage_targets: Mapping[str, Callable[[Any], Any]] | None = None,
        rewriter: str | None = None,
        instructions: int = 4,
        rewriter_temperature: float | None = 0.9,
    ) -> None:
        params = list(params) if not isinstance(params, Module | Parameter) else params
        super().__init__(
            params,
            max_demos=max_demos,
            threshold=threshold,
            candidates=candidates,
            teacher=teacher,
            teacher_alias=teacher_alias,
            seed=seed,
            stage_targets=stage_targets,
        )
        check_positive(eta=eta, min_examples=min_examples)
        if eta < 2:
            raise ValueError(
                f"eta must be at least 2 (the share kept per rung is 1/eta), got {eta}"
            )
        ks = [k for k in k_choices if isinstance(k, int) and not isinstance(k, bool) and k >= 1]
        if not ks or len(ks) != len(k_choices):
            raise ValueError(f"k_choices must be positive integers, got {list(k_choices)!r}")
        self.eta = eta
        self.min_examples = min_examples
        self.k_choices = tuple(ks)
        self.require_confidence = require_confidence
        check_positive(instructions=instructions)
        if rewriter is not None and not isinstance(rewriter, str):
            raise TypeError(f"rewriter must be an alias (a string), got {type(rewriter).__name__}")
        self.rewriter = rewriter
        self.instructions = instructions
        self.instruction_params: dict[str, Parameter] = {}
        """The learnable instructions searched with a rewriter, by stage path."""
        self._instruction_call: _Call | None = None
        if rewriter is not None:
            assert not isinstance(params, Module | Parameter)
            self.instruction_params = _instructions_of(params)
            if not self.instruction_params:
                raise ValueError(
                    "rewriter= searches instructions, and none of the parameters is a learnable "
                    "instruction: give the LLMInference calls system_prompt=plait.Parameter("
                    "'...', description='...') and pass model.parameters()"
                )
            self._instruction_call = _Call(
                "instructions",
                rewriter,
                _PROPOSE_SYSTEM,
                rewriter_temperature,
                Rewrite,
            )
        self.search_report: dict[str, Any] = {}
        """The last step's account: rungs, every candidate's scores, the comparison."""
        self._batch: TrainingBatch | None = None

    def settings(self) -> dict[str, Any]:
        """The options that shape the search's choices, as a checkpoint records them.

        Returns:
            JSON-ready data: each option by name (`BootstrapFewShot.settings` and the
                search's own).
        """
        return {
            **super().settings(),
            "eta": self.eta,
            "min_examples": self.min_examples,
            "k_choices": list(self.k_choices),
            "require_confidence": self.require_confidence,
            "rewriter": self.rewriter,
            "instructions": self.instructions if self.rewriter is not None else None,
        }

    def bind(self, resources: ResourceConfig | ResourceManager | Any) -> Self:
        """Send the instruction rewriter's calls to ``resources``.

        Without a binding, the `Trainer`'s resources serve them.

        Args:
            resources: A `ResourceConfig`, a `ResourceManager`, or a mapping of aliases.

        Returns:
            The optimizer itself, for chaining.
        """
        if self._instruction_call is not None:
            self._instruction_call.bind(resources=resources)
        return self

    async def observe(self, batch: TrainingBatch) -> None:
        """Gather the minibatch's pairs and keep its validation scorer for `step`.

        Args:
            batch: The minibatch, its runs and the validation scorer.
        """
        await super().observe(batch)
        self._batch = batch

    async def step(self) -> dict[str, Any]:
        """Search this step's candidates and install the winner if it scores better.

        Returns:
            The new values, by qualified parameter name (empty when the values in
                place won).
        """
        batch = self._batch
        if batch is None or batch.score_examples is None or batch.val_size == 0:
            self.search_report = {}
            return await super().step()
        rng = random.Random(f"search:{self.seed}:{self.steps}")
        written = await self._propose_instructions(
            random.Random(f"instructions:{self.seed}:{self.steps}")
        )
        self.steps += 1
        stages = {path: param for param, path in self._paths().items()}
        for path, param in self.instruction_params.items():
            stages[_instruction_slot(path)] = param
        incumbent = {path: param.value for path, param in stages.items()}
        values = [incumbent, *self._proposals(stages, incumbent, rng, written)]
        self.candidate_scores = []
        if len(values) == 1:
            self.search_report = {"candidates": 1, "note": "no pairs to propose yet"}
            return {}
        order = rng.sample(range(batch.val_size), batch.val_size)
        scores = await self._halve(values, stages, order, batch)
        if written:
            self.search_report["instructions"] = written
        finalists = [c for c in range(len(values)) if len(scores[c]) == len(order)]
        means = {c: _mean([scores[c][i] for i in order]) for c in finalists}
        winner = min(finalists, key=lambda c: (-means[c], c))  # ties: the incumbent (0)
        diffs = [scores[winner][i] - scores[0][i] for i in order]
        low, high = paired_interval(diffs, random.Random(f"ci:{self.seed}:{self.steps}"))
        gain = _mean(diffs)
        accepted = winner != 0 and gain > 0 and (low > 0 or not self.require_confidence)
        self.candidate_scores = [means[c] for c in finalists]
        self.search_report["comparison"] = {
            "winner": winner,
            "incumbent_score": means[0],
            "winner_score": means[winner],
            "mean_difference": gain,
            "interval_95": [low, high],
            "examples": len(order),
            "wins": sum(d > 0 for d in diffs),
            "losses": sum(d < 0 for d in diffs),
            "accepted": accepted,
        }
        if not accepted:
            return {}
        return install(stages, values[winner])

    # -- successive halving ----------------------------------------------------------
    async def _halve(
        self,
        values: list[dict[str, Any]],
        stages: dict[str, Parameter],
        order: list[int],
        batch: TrainingBatch,
    ) -> list[dict[int, float]]:
        """Each candidate's score per validation position, as far as it got."""
        assert batch.score_examples is not None
        scores: list[dict[int, float]] = [{} for _ in values]
        alive = list(range(len(values)))
        rungs: list[dict[str, Any]] = []
        before = {path: param.value for path, param in stages.items()}
        try:
            for size in self._rung_sizes(len(values), len(order)):
                wanted = order[:size]
                for c in alive:
                    missing = [i for i in wanted if i not in scores[c]]
                    if not missing:
                        continue
                    for path, value in values[c].items():
                        stages[path].value = value
                    for i, score in zip(missing, await batch.score_examples(missing), strict=True):
                        scores[c][i] = score
                means = {c: _mean([scores[c][i] for i in wanted]) for c in alive}
                rungs.append({"examples": size, "scores": {str(c): means[c] for c in alive}})
                if size == len(order):
                    break
                keep = max(1, math.ceil(len(alive) / self.eta))
                ranked = sorted(alive, key=lambda c: (-means[c], c))
                alive = sorted(set(ranked[:keep]) | {0})  # the incumbent is the baseline
        finally:
            for path, value in before.items():
                stages[path].value = value
        self.search_report = {
            "candidates": len(values),
            "rungs": rungs,
            "values": [_describe(v) for v in values],
        }
        return scores

    # -- instructions ----------------------------------------------------------------
    async def _propose_instructions(self, rng: random.Random) -> dict[str, list[str]]:
        """Per instruction slot, the rewriter's proposals this step that passed
        `check_rewrite` (refused ones go to ``rejected``); empty without a rewriter."""
        if self._instruction_call is None:
            return {}
        jobs: list[tuple[str, Parameter, str]] = []
        for path, param in self.instruction_params.items():
            pairs = self._pairs(path)
            for variant in range(self.instructions):
                sample = rng.sample(pairs, min(4, len(pairs))) if pairs else []
                prompt = instruction_prompt(param, path, sample, variant)
                jobs.append((_instruction_slot(path), param, prompt))
        call = self._instruction_call
        assert call is not None
        replies = await asyncio.gather(
            *(ask_rewrite(call, prompt, param, param.qualified_name) for _, param, prompt in jobs)
        )
        written: dict[str, list[str]] = {}
        for (slot, param, prompt), (value, refused) in zip(jobs, replies, strict=True):
            name = param.qualified_name
            reason = refused or check_rewrite(param.value, value, meta_markers(prompt))
            if reason is None and value == param.value:
                reason = "the same as the current instruction"
            if reason is not None:
                self.rejected.append(Rejection(self.steps, name, value, reason))
                continue
            if value not in written.setdefault(slot, []):
                written[slot].append(value)
        return written

    def _rung_sizes(self, candidates: int, examples: int) -> list[int]:
        """Examples scored at each rung: ``eta`` times more each time, all at the end."""
        rungs = max(1, math.ceil(math.log(candidates, self.eta)))
        sizes = [
            min(examples, max(self.min_examples, math.ceil(examples / self.eta ** (rungs - r))))
            for r in range(rungs)
        ]
        return sorted({*sizes, examples})

    # -- proposals -------------------------------------------------------------------
    def _proposals(
        self,
        stages: dict[str, Parameter],
        incumbent: dict[str, Any],
        rng: random.Random,
        written: Mapping[str, list[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """Up to ``candidates`` distinct values, none the incumbent: per stage, a pool's
        ``k`` choices or a random or label-balanced set, and per instruction the one in
        place or one ``written`` this step, combined across stages."""
        options: dict[str, list[Any]] = {}
        for path, param in stages.items():
            if _is_instruction_slot(path):
                new = (written or {}).get(path, [])
                options[path] = [param.value, *new] if new else []
            else:
                options[path] = self._stage_options(path, param, rng)
        seen = {_key(incumbent)}
        found: list[dict[str, Any]] = []
        for _ in range(self.candidates * 8):
            if len(found) >= self.candidates:
                break
            value = {
                path: rng.choice(choices) if choices else incumbent[path]
                for path, choices in options.items()
            }
            key = _key(value)
            if key not in seen:
                seen.add(key)
                found.append(value)
        return found

    def _stage_options(self, path: str, param: Parameter, rng: random.Random) -> list[Any]:
        """The values proposed for one stage this step."""
        pairs = self._pairs(path)
        if not pairs:
            return []
        where = f"the demonstrations for {path}"
        if is_pool(param.value):
            pool = normalize_demos(pairs, where)
            return [{**param.value, "pool": pool, "k": k} for k in self.k_choices]
        labels = labels_of(param.owner)
        options: list[Any] = []
        for draw in range(self.candidates * 2):
            shuffled = list(pairs)
            rng.shuffle(shuffled)
            if labels and draw % 2 == 0:  # every other set shows each label once
                first = _one_per_label(shuffled, labels)
                shuffled = first + [pair for pair in shuffled if pair not in first]
            options.append(normalize_demos(shuffled[: self.max_demos], where))
        return options

    def __repr__(self) -> str:
        return (
            f"DemoSearch({len(self.params)} demonstration parameter(s), "
            f"candidates={self.candidates}, max_demos={self.max_demos}, eta={self.eta}, "
            f"steps={self.steps})"
        )


def paired_interval(
    diffs: Sequence[float],
    rng: random.Random,
    level: float = 0.95,
    groups: Sequence[str] | None = None,
) -> tuple[float, float]:
    """The paired-bootstrap interval of the mean of ``diffs`` (per-example score
    differences between two candidates on the same examples), two-sided at ``level``
    (0.95: the 2.5th and 97.5th percentiles of the resampled means).  With ``groups``
    (each example's group, its label say) a resample's mean is `grouped_mean`'s."""
    n = len(diffs)
    if n == 0:
        return (0.0, 0.0)
    if groups is None:
        means = sorted(_mean([diffs[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES))
    else:
        means = sorted(
            grouped_mean([(i, diffs[i]) for i in [rng.randrange(n) for _ in range(n)]], groups)
            for _ in range(RESAMPLES)
        )
    tail = (1.0 - level) / 2
    return (means[int(tail * RESAMPLES)], means[int((1.0 - tail) * RESAMPLES) - 1])


def _one_per_label(pairs: list[tuple[Any, Any]], labels: Sequence[str]) -> list[tuple[Any, Any]]:
    """The first pair of each label among ``pairs``, in the labels' order."""
    by_label: dict[str, tuple[Any, Any]] = {}
    for pair in pairs:
        label = label_of(pair[1], labels)
        if label is not None:
            by_label.setdefault(label, pair)
    return [by_label[label] for label in labels if label in by_label]


_PROPOSE_SYSTEM = (
    "You write instructions (system prompts) for one step of an LLM pipeline, from what "
    "the step is for and examples of what it is given and should answer. Reply with a JSON "
    "object whose only field, new_value, holds ONLY the instruction: no preamble, no "
    "explanation, no headings or delimiters of the request."
)

#: How an instruction's place in a candidate is named: its stage's path, then this.
INSTRUCTION_SLOT = "#instruction"


def _instruction_slot(path: str) -> str:
    return f"{path}{INSTRUCTION_SLOT}"


def _is_instruction_slot(key: str) -> bool:
    return key.endswith(INSTRUCTION_SLOT)


def _instructions_of(params: Iterable[Parameter]) -> dict[str, Parameter]:
    """The learnable text instructions among ``params``: LLMInference system prompts,
    by their stage's path."""
    found: dict[str, Parameter] = {}
    for param in params:
        owner = param.owner
        if (
            isinstance(owner, LLMInference)
            and owner.system_prompt is param
            and param.requires_grad
            and isinstance(param.value, str)
        ):
            found.setdefault(owner.qualified_path, param)
    return found


def instruction_prompt(
    param: Parameter, path: str, pairs: Sequence[tuple[Any, Any]], variant: int
) -> str:
    """What the rewriter is asked for one proposal: the instruction's purpose, the one
    in place, and some inputs with the answers the stage should give."""
    shown = (
        "\n\n".join(f"Input:\n{_text(inp)}\nAnswer:\n{_text(out)}" for inp, out in pairs)
        or "(no examples gathered yet)"
    )
    purpose = param.description or "the step's task"
    return "\n\n".join(
        [
            f"Write a new instruction (system prompt) for the step `{path}` of an LLM "
            f"pipeline (proposal {variant + 1}).",
            f"## What the instruction is for\n{purpose}",
            f"## The instruction in place\n{_show(param.value, param.qualified_name)}",
            f"## Inputs the step is given and the answers it should give\n{shown}",
            "Write one clear, short instruction, different from the one in place, that "
            "would lead a model to give such answers to such inputs. Reply with ONLY the "
            "new instruction (as text), in the field new_value.",
        ]
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _key(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _describe(value: dict[str, Any]) -> dict[str, Any]:
    """A candidate as the history shows it: per stage, its pairs' inputs (or pool and k)."""
    shown: dict[str, Any] = {}
    for path, demos in value.items():
        if is_pool(demos):
            shown[path] = {"pool": len(demos["pool"]), "k": demos["k"]}
        elif isinstance(demos, str):  # an instruction, whole: the history shows what won
            shown[path] = demos
        else:
            shown[path] = [str(pair["input"])[:60] for pair in demos]
    return shown


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def grouped_mean(scored: Sequence[tuple[int, float]], groups: Sequence[str] | None) -> float:
    """The mean of the ``(example, score)`` pairs: plain, or with ``groups`` the mean of
    each group's mean (each example's group is ``groups[example]``)."""
    if groups is None:
        return _mean([score for _, score in scored])
    by_group: dict[str, list[float]] = {}
    for i, score in scored:
        by_group.setdefault(groups[i], []).append(score)
    return _mean([_mean(values) for values in by_group.values()])
