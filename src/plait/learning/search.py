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

`search_report` (saved in the history, ``trials[].search``) holds every
candidate's score at every rung, the finalists and the comparison.  Without a
validation set there is nothing to search with, and it behaves as
`BootstrapFewShot`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from plait.demos import is_pool, label_of, normalize_demos
from plait.inference import LLMInference
from plait.labels import label_choices
from plait.learning.bootstrap import BootstrapFewShot, TrainingBatch, check_positive, install
from plait.module import Module
from plait.parameter import Parameter

__all__ = ["DemoSearch", "paired_interval"]

#: Resamples of the paired bootstrap interval.
RESAMPLES = 2000


class DemoSearch(BootstrapFewShot):
    """Searches demonstration sets by successive halving (see the module doc).

    ``candidates``: values proposed per step (the incumbent comes on top).
    ``max_demos``: pairs per stage in a proposed set.  ``eta``: the share of
    candidates that go on at each rung is ``1/eta``.  ``min_examples``: the fewest
    validation examples a rung scores.  ``k_choices``: the ``k`` tried for a pool
    chosen from per input.  ``require_confidence``: install only a winner whose
    95% interval of improvement is above 0.  ``threshold``, ``teacher``,
    ``teacher_alias``, ``seed`` and ``stage_targets`` are `BootstrapFewShot`'s.
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
    ) -> None:
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
        #: The last step's account: rungs, every candidate's scores, the comparison.
        self.search_report: dict[str, Any] = {}
        self._batch: TrainingBatch | None = None

    async def observe(self, batch: TrainingBatch) -> None:
        await super().observe(batch)
        self._batch = batch

    async def step(self) -> dict[str, Any]:
        """Search this step's candidates and install the winner; new values by name."""
        batch = self._batch
        if batch is None or batch.score_examples is None or batch.val_size == 0:
            self.search_report = {}
            return await super().step()
        rng = random.Random(f"search:{self.seed}:{self.steps}")
        self.steps += 1
        stages = {path: param for param, path in self._paths().items()}
        incumbent = {path: param.value for path, param in stages.items()}
        values = [incumbent, *self._proposals(stages, incumbent, rng)]
        self.candidate_scores = []
        if len(values) == 1:
            self.search_report = {"candidates": 1, "note": "no pairs to propose yet"}
            return {}
        order = rng.sample(range(batch.val_size), batch.val_size)
        scores = await self._halve(values, stages, order, batch)
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
        self, stages: dict[str, Parameter], incumbent: dict[str, Any], rng: random.Random
    ) -> list[dict[str, Any]]:
        """Up to ``candidates`` distinct values, none the incumbent: per stage, a pool's
        ``k`` choices or a random or label-balanced set, combined across stages."""
        options = {path: self._stage_options(path, param, rng) for path, param in stages.items()}
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
        owner = param.owner
        labels = (
            label_choices(owner.response_format)
            if isinstance(owner, LLMInference) and owner.response_format is not None
            else None
        )
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


def paired_interval(diffs: Sequence[float], rng: random.Random) -> tuple[float, float]:
    """The 95% paired-bootstrap interval of the mean of ``diffs`` (per-example score
    differences between two candidates on the same examples)."""
    n = len(diffs)
    if n == 0:
        return (0.0, 0.0)
    means = sorted(_mean([diffs[rng.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES))
    return (means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1])


def _one_per_label(pairs: list[tuple[Any, Any]], labels: Sequence[str]) -> list[tuple[Any, Any]]:
    """The first pair of each label among ``pairs``, in the labels' order."""
    by_label: dict[str, tuple[Any, Any]] = {}
    for pair in pairs:
        label = label_of(pair[1], labels)
        if label is not None:
            by_label.setdefault(label, pair)
    return [by_label[label] for label in labels if label in by_label]


def _key(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _describe(value: dict[str, Any]) -> dict[str, Any]:
    """A candidate as the history shows it: per stage, its pairs' inputs (or pool and k)."""
    shown: dict[str, Any] = {}
    for path, demos in value.items():
        if is_pool(demos):
            shown[path] = {"pool": len(demos["pool"]), "k": demos["k"]}
        else:
            shown[path] = [str(pair["input"])[:60] for pair in demos]
    return shown


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
